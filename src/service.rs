//! [`SqliteRetryLayer`] and the [`SqliteRetry`] service it builds (one module, as tower-http
//! keeps a middleware's layer and service together).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Buf;
use http::{Request, Response};
use http_body::Body;
use tower_layer::Layer;
use tower_service::Service;

use crate::body::ReplayBody;
use crate::classify::{ClassifyError, NeverRetryErrors};
use crate::future::ResponseFuture;
use crate::metrics::RetryMetrics;
use crate::policy::{InvalidPolicy, ReadLimit, RetryPolicy};
use crate::shared::Shared;

/// A tower [`Layer`] that replays requests whose response carries the
/// [`Retryable`](crate::Retryable) marker (or whose error the classifier tags), as its
/// [`RetryPolicy`] allows.
///
/// Every clone shares the same counters, replay gate, in-flight buffer cap and budget.
///
/// ```
/// use axum::{routing::{get, post}, Router};
/// use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
///
/// # async fn create() {} async fn list() {}
/// let app: Router = Router::new()
///     // a larger cap on the write route...
///     .route("/orders", post(create)
///         .layer(SqliteRetryLayer::new(RetryPolicy::default().max_attempts(40))))
///     // ...than on the reads (`default()` is `new(RetryPolicy::default())`)
///     .route("/orders/list", get(list))
///     .layer(SqliteRetryLayer::default());
/// ```
///
/// Nested layers never multiply attempts: the innermost one retries. It claims the request on
/// the way in (an outer layer's attempt carries that layer's [`Attempt`](crate::Attempt)), and
/// the outer ones then pass its answer through, a response or a service error alike, and
/// record its outcome. Two clones of one layer nested this way share one replay gate without
/// waiting on each other: the outer one never replays, so it never holds a gate permit.
pub struct SqliteRetryLayer<C = NeverRetryErrors> {
    shared: Arc<Shared>,
    classifier: C,
}

impl SqliteRetryLayer {
    /// A layer with this policy.
    ///
    /// # Panics
    ///
    /// If the policy is invalid, with the reason ([`RetryPolicy::validate`]). Use
    /// [`try_new`](Self::try_new) to handle that as an error.
    ///
    /// ```should_panic
    /// # use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
    /// // panics: "invalid retry policy: max_attempts is 0: ..."
    /// SqliteRetryLayer::new(RetryPolicy::default().max_attempts(0));
    /// ```
    pub fn new(policy: RetryPolicy) -> Self {
        match Self::try_new(policy) {
            Ok(layer) => layer,
            Err(e) => panic!("{e}"),
        }
    }

    /// A layer with this policy, or why the policy cannot work.
    ///
    /// ```
    /// # use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
    /// assert!(SqliteRetryLayer::try_new(RetryPolicy::default()).is_ok());
    /// assert!(SqliteRetryLayer::try_new(RetryPolicy::default().max_attempts(0)).is_err());
    /// ```
    pub fn try_new(policy: RetryPolicy) -> Result<Self, InvalidPolicy> {
        policy.validate()?;
        crate::recorder::describe();
        Ok(Self {
            shared: Arc::new(Shared::new(policy)),
            classifier: NeverRetryErrors,
        })
    }
}

impl<C> SqliteRetryLayer<C> {
    /// Replays requests whose *service error* the classifier tags, for plain tower services
    /// whose `Error` is not `Infallible`; `classifier` implements
    /// [`ClassifyError`](crate::ClassifyError) for the service's error type (axum handlers answer with a response and use the
    /// [`Retryable`](crate::Retryable) marker instead).
    ///
    #[cfg_attr(feature = "sqlx", doc = "```")]
    #[cfg_attr(not(feature = "sqlx"), doc = "```ignore")]
    /// use tower_sqlite_retry::classify::RetryDriverErrors;
    /// use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
    ///
    /// // errors that are (or box, anywhere in their source chain) a driver's error:
    /// let layer = SqliteRetryLayer::new(RetryPolicy::default()).classify_errors(RetryDriverErrors);
    /// // or any closure `Fn(&E) -> Option<Retryable>`:
    /// use tower_sqlite_retry::Retryable;
    /// let layer = SqliteRetryLayer::new(RetryPolicy::default()).classify_errors(
    ///     |e: &std::io::Error| -> Option<Retryable> {
    ///         (e.kind() == std::io::ErrorKind::WouldBlock).then(|| Retryable::new("EAGAIN", "WOULD_BLOCK"))
    ///     },
    /// );
    /// ```
    pub fn classify_errors<D>(self, classifier: D) -> SqliteRetryLayer<D> {
        SqliteRetryLayer {
            shared: self.shared,
            classifier,
        }
    }

    /// The same layer, holding `GET` and `HEAD` requests back while writers wait for a
    /// database's turn, so that the writer's transaction gets the CPU: at most the limit's
    /// reads at once, each waiting at most its [`max_wait`](ReadLimit::max_wait) for its
    /// place (see [`ReadLimit`] for when it pays
    /// and what it trades). On by default with [`ReadLimit::default`] (a read per core but
    /// one, at least one);
    /// this sets another, [`no_read_limit`](Self::no_read_limit) none. The returned
    /// layer keeps this one's counters, replay gate and admission, and has a read limit of its
    /// own.
    ///
    /// # Panics
    ///
    /// If the limit is invalid, with the reason ([`ReadLimit::validate`]).
    ///
    /// ```
    /// use std::num::NonZeroUsize;
    /// use tower_sqlite_retry::policy::ReadLimit;
    /// use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
    ///
    /// // two reads at a time while writers queue for the turn
    /// let layer = SqliteRetryLayer::new(RetryPolicy::default())
    ///     .limit_reads_while_writers_wait(ReadLimit::new(NonZeroUsize::new(2).unwrap()));
    /// # let _ = layer;
    /// ```
    pub fn limit_reads_while_writers_wait(self, limit: ReadLimit) -> Self {
        if let Err(e) = limit.validate() {
            panic!("{e}");
        }
        Self {
            shared: Arc::new(self.shared.with_read_limit(Some(limit))),
            classifier: self.classifier,
        }
    }

    /// The same layer with no read limit: `GET` and `HEAD` requests are never held back, even
    /// while writers wait for a database's turn (the read limit is on by default, see
    /// [`ReadLimit`]). The returned layer keeps this one's counters, replay gate and
    /// admission.
    ///
    /// ```
    /// use tower_sqlite_retry::SqliteRetryLayer;
    ///
    /// let layer = SqliteRetryLayer::default().no_read_limit();
    /// # let _ = layer;
    /// ```
    pub fn no_read_limit(self) -> Self {
        Self {
            shared: Arc::new(self.shared.with_read_limit(None)),
            classifier: self.classifier,
        }
    }

    /// The layer's counters (shared with its clones and services).
    pub fn metrics(&self) -> RetryMetrics {
        self.shared.metrics()
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.shared.policy
    }
}

impl Default for SqliteRetryLayer {
    /// A layer with [`RetryPolicy::default()`].
    fn default() -> Self {
        Self::new(RetryPolicy::default())
    }
}

impl<C: Clone> Clone for SqliteRetryLayer<C> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<C> fmt::Debug for SqliteRetryLayer<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRetryLayer")
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

impl<S, C: Clone> Layer<S> for SqliteRetryLayer<C> {
    type Service = SqliteRetry<S, C>;

    fn layer(&self, inner: S) -> Self::Service {
        SqliteRetry::from_shared(inner, self.shared.clone(), self.classifier.clone())
    }
}

/// The service built by [`SqliteRetryLayer`](crate::SqliteRetryLayer).
///
/// It accepts any request body and hands the inner service a [`ReplayBody`]: the buffered
/// bytes, fresh for every attempt; the client's body recorded as it is read
/// (`Expect: 100-continue`); or the client's body itself, when the request is passed through
/// without retries. The body keeps the client body's size hint, and its errors as the handler
/// would see them without the layer.
///
/// # Readiness
///
/// `poll_ready` is always ready and reserves nothing in the inner service: a request's body is
/// read whole *first*, and the inner service's readiness is polled in the response future,
/// before every attempt, on the instance that is then called (tower's rule for a service used
/// more than once). So a slow or stalled upload never holds a concurrency limit, a queue slot
/// or a buffer permit of the inner service while it trickles in. Waiting for readiness counts
/// against the policy's deadline.
pub struct SqliteRetry<S, C = NeverRetryErrors> {
    inner: S,
    shared: Arc<Shared>,
    classifier: C,
}

impl<S> SqliteRetry<S> {
    /// Wraps `inner` with this policy: the same as
    /// `SqliteRetryLayer::new(policy).layer(inner)`, with a layer of its own (its own counters,
    /// replay gate, buffer cap and admission limits).
    ///
    /// # Panics
    ///
    /// If the policy is invalid, with the reason ([`RetryPolicy::validate`]); build the layer
    /// with [`SqliteRetryLayer::try_new`] to handle that as an error.
    ///
    /// ```
    /// use tower::service_fn;
    /// use tower_sqlite_retry::{RetryPolicy, SqliteRetry};
    ///
    /// let inner = service_fn(|_req: http::Request<tower_sqlite_retry::body::ReplayBody<String>>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
    /// });
    /// let mut service = SqliteRetry::new(inner, RetryPolicy::default());
    /// let _: &mut _ = service.get_mut();
    /// let inner = service.into_inner();
    ///
    /// // the same, through the layer
    /// use tower::Layer;
    /// let service = SqliteRetry::layer(RetryPolicy::default()).layer(inner);
    /// # let _ = service;
    /// ```
    pub fn new(inner: S, policy: RetryPolicy) -> Self {
        SqliteRetryLayer::new(policy).layer(inner)
    }
}

// `layer` takes no service, so it lives on one concrete type: `SqliteRetry::layer(policy)`
// then needs no type annotation.
impl SqliteRetry<()> {
    /// A layer that wraps services in `SqliteRetry` with this policy:
    /// [`SqliteRetryLayer::new`].
    ///
    /// # Panics
    ///
    /// If the policy is invalid, as [`SqliteRetryLayer::new`].
    pub fn layer(policy: RetryPolicy) -> SqliteRetryLayer {
        SqliteRetryLayer::new(policy)
    }
}

impl<S, C> SqliteRetry<S, C> {
    pub(crate) fn from_shared(inner: S, shared: Arc<Shared>, classifier: C) -> Self {
        Self {
            inner,
            shared,
            classifier,
        }
    }

    /// The counters of the layer this service came from.
    pub fn metrics(&self) -> RetryMetrics {
        self.shared.metrics()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// The wrapped service, unwrapped.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, C: Clone> Clone for SqliteRetry<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for SqliteRetry<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRetry")
            .field("inner", &self.inner)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

impl<S, C, B, ResBody> Service<Request<B>> for SqliteRetry<S, C>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>> + Clone,
    C: ClassifyError<S::Error> + Clone,
    B: Body,
    B::Data: Buf,
    ResBody: Default,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, C, B>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // NOTE: nothing is reserved here: the response future polls the readiness of its own
        // clone of the inner service once the body is read, before every attempt.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // NOTE: tower's "be careful when cloning inner services" is about a clone that was
        // never polled ready being called. This clone is polled ready by the future before
        // each of its calls, and `self.inner` was never reserved, so nothing is lost here.
        ResponseFuture::new(
            self.inner.clone(),
            self.classifier.clone(),
            self.shared.clone(),
            req,
        )
    }
}
