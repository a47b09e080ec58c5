//! [`SqliteRetry`]: the service.

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
use crate::layer::{Shared, SqliteRetryLayer};
use crate::metrics::RetryMetrics;
use crate::policy::RetryPolicy;

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
    /// let inner = service_fn(|_req: http::Request<tower_sqlite_retry::ReplayBody<String>>| async {
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
        RetryMetrics {
            shared: self.shared.clone(),
        }
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
