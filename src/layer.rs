//! [`SqliteRetryLayer`]: the tower `Layer`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tower_layer::Layer;

use crate::admission::{AdmissionLimit, Admissions};
use crate::classify::NeverRetryErrors;
use crate::metrics::{Counters, RetryMetrics};
use crate::policy::{InvalidPolicy, ReadLimit, RetryPolicy};
use crate::service::SqliteRetry;

/// State shared by every clone of one layer and the services it builds.
pub(crate) struct Shared {
    pub(crate) policy: RetryPolicy,
    pub(crate) counters: Arc<Counters>,
    pub(crate) gate: Option<Arc<Semaphore>>,
    /// The read limit's places ([`SqliteRetryLayer::limit_reads_while_writers_wait`]), and the
    /// longest a read waits for one.
    pub(crate) reads: Option<Arc<Semaphore>>,
    pub(crate) read_wait: Duration,
    pub(crate) admissions: Arc<Admissions>,
}

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
        let gate = policy.replay_gate.map(|n| Arc::new(Semaphore::new(n)));
        let reads = policy.read_limit.map(|n| Arc::new(Semaphore::new(n.get())));
        Ok(Self {
            shared: Arc::new(Shared {
                admissions: Arc::new(Admissions::new(policy.admission)),
                read_wait: policy.read_wait,
                policy,
                counters: Arc::default(),
                gate,
                reads,
            }),
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
    /// use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer, SqlxErrors};
    ///
    /// // errors that are (or box) a sqlx::Error, classified with `classify`:
    /// let layer = SqliteRetryLayer::new(RetryPolicy::default()).classify_errors(SqlxErrors);
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
    /// database's turn, so that the writer's transaction gets the CPU: at most
    /// [`limit.reads()`](ReadLimit::reads) at once, each waiting at most
    /// [`limit.wait()`](ReadLimit::wait) for its place (see [`ReadLimit`] for when it pays
    /// and what it trades). Off by default. The returned layer keeps this one's counters,
    /// replay gate and admission, and has a read limit of its own.
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
        let shared = &self.shared;
        Self {
            shared: Arc::new(Shared {
                policy: shared.policy.clone(),
                counters: shared.counters.clone(),
                gate: shared.gate.clone(),
                reads: Some(Arc::new(Semaphore::new(limit.reads().get()))),
                read_wait: limit.wait(),
                admissions: shared.admissions.clone(),
            }),
            classifier: self.classifier,
        }
    }

    /// The layer's counters (shared with its clones and services).
    pub fn metrics(&self) -> RetryMetrics {
        RetryMetrics {
            shared: self.shared.clone(),
        }
    }

    /// The policy.
    pub fn policy(&self) -> &RetryPolicy {
        &self.shared.policy
    }

    /// The routes writer admission has limited so far: deprecated, the same as
    /// [`RetryMetrics::admission_limits`] (`layer.metrics().admission_limits()`), the one
    /// place the layer's readings are.
    #[deprecated(
        since = "0.1.0",
        note = "use `layer.metrics().admission_limits()`: the layer's readings are all on `RetryMetrics`"
    )]
    pub fn admission_limits(&self) -> Vec<AdmissionLimit> {
        self.shared.admissions.limits()
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
