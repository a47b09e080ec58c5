//! [`Shared`]: what every clone of one layer and the services it builds share.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;

use crate::admission::Admissions;
use crate::metrics::{RetryMetrics, Stats};
use crate::policy::{ReadLimit, RetryPolicy};

/// State shared by every clone of one layer and the services it builds.
pub(crate) struct Shared {
    pub(crate) policy: RetryPolicy,
    /// The counters, the bytes held in request-body copies (against
    /// `policy.max_buffered_bytes`) and the admission limits.
    pub(crate) stats: Arc<Stats>,
    /// The replay gate's permits (`RetryPolicy::replay_gate`).
    pub(crate) gate: Option<Arc<Semaphore>>,
    /// The read limit's places (`SqliteRetryLayer::limit_reads_while_writers_wait`), and the
    /// longest a read waits for one.
    pub(crate) reads: Option<Arc<Semaphore>>,
    pub(crate) read_wait: Duration,
}

impl Shared {
    /// A new layer's state, for a policy already validated.
    pub(crate) fn new(policy: RetryPolicy) -> Self {
        let gate = policy.replay_gate.map(|n| Arc::new(Semaphore::new(n)));
        let limit = ReadLimit::default();
        Self {
            stats: Arc::new(Stats::new(Admissions::new(policy.admission))),
            reads: Some(Arc::new(Semaphore::new(limit.reads().get()))),
            read_wait: limit.wait(),
            policy,
            gate,
        }
    }

    /// The same state (counters, buffer account, replay gate, admission shared with this
    /// one), with a read limit of its own (`None`: none).
    pub(crate) fn with_read_limit(&self, limit: Option<ReadLimit>) -> Self {
        Self {
            policy: self.policy.clone(),
            stats: self.stats.clone(),
            gate: self.gate.clone(),
            reads: limit.map(|limit| Arc::new(Semaphore::new(limit.reads().get()))),
            read_wait: limit.map_or(self.read_wait, |limit| limit.wait()),
        }
    }

    /// A handle on the counters.
    pub(crate) fn metrics(&self) -> RetryMetrics {
        self.stats.handle()
    }
}
