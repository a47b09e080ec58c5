//! An operation's admission from the caller's side: the [`Slot`] a try holds, why a try got
//! none ([`AdmitError`]), whose call chain a slot belongs to, and the wait of a thread.

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crate::admission::{Admitted, RouteLimit};

/// The longest a try waits for an admission slot when its policy has no deadline
/// (`deadline(Duration::MAX)`, as pollers use): 30 seconds. A slot is held for one try and
/// its backoff, so a wait this long means a slot is held and never given back (a [`Slot`]
/// kept while the item is processed, a task that holds one waiting for another task that
/// needs one); the wait then ends with [`AdmitError::TimedOut`] instead of never.
pub const MAX_ADMISSION_WAIT: Duration = Duration::from_secs(30);

/// A try's admission slot ([`Backoff::admit`](super::Backoff::admit),
/// [`Backoff::admit_blocking`](super::Backoff::admit_blocking)): while this value lives, the
/// try, and its backoff if it fails, hold one of the operation's slots. Dropping it gives the
/// slot back, to the first try queued.
///
/// Keep it for the try and its backoff; drop it before the work that follows a success
/// (processing a claimed item), so that the next claim does not wait for that work.
///
/// Without a limit (the operation never met contention, or its limit went away after a quiet
/// time, or `Admission::Off`), or when the task or thread already holds a slot of the same
/// operation (a retried function called from a retried caller: it runs under its caller's
/// slot), it holds nothing.
#[must_use = "the slot goes back when this is dropped: keep it for the try and its backoff"]
pub struct Slot {
    admitted: Option<(Admitted, Arc<RouteLimit>)>,
    /// The streak's place: where the slot waits for the streak's next try when this value is
    /// dropped between a retry's decision and that try.
    place: Option<Arc<Place>>,
}

/// A streak's place in its operation's admission: the slot of a try that failed retryably,
/// dropped before the retry's `admit()`, kept for that retry (a retry never goes to the back
/// of the queue, as the layer's replays keep their slot). Given back by the streak's end: a
/// success's `reset()`, a `None`, a deadline, the backoff's drop.
#[derive(Default)]
pub(super) struct Place {
    /// Set while the backoff has said "retry after a delay" and the retry has not begun.
    retrying: std::sync::atomic::AtomicBool,
    kept: std::sync::Mutex<Option<(Admitted, Arc<RouteLimit>)>>,
}

impl Place {
    fn kept(&self) -> std::sync::MutexGuard<'_, Option<(Admitted, Arc<RouteLimit>)>> {
        self.kept.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The backoff said retry: a slot dropped from now on waits for the retry.
    pub(super) fn retrying(&self) {
        self.retrying
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// The retry takes its kept slot, if any (and no slot is kept from now on until the next
    /// retry's decision).
    pub(super) fn take(&self) -> Option<(Admitted, Arc<RouteLimit>)> {
        self.retrying
            .store(false, std::sync::atomic::Ordering::Release);
        self.kept().take()
    }

    /// The streak ended: a kept slot goes back.
    pub(super) fn give_back(&self) {
        drop(self.take());
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let (Some(place), Some(admitted)) = (&self.place, self.admitted.take())
            && place.retrying.load(std::sync::atomic::Ordering::Acquire)
        {
            let mut kept = place.kept();
            // checked again under the lock: the streak may have ended meanwhile
            if place.retrying.load(std::sync::atomic::Ordering::Acquire) {
                *kept = Some(admitted);
                return;
            }
            drop(kept);
            drop(admitted);
        }
    }
}

impl Slot {
    pub(super) fn none() -> Self {
        Self {
            admitted: None,
            place: None,
        }
    }

    pub(super) fn held(admitted: Admitted, limit: Arc<RouteLimit>) -> Self {
        Self {
            admitted: Some((admitted, limit)),
            place: None,
        }
    }

    /// A loop's slot, kept for its streak's retry when dropped before it.
    pub(super) fn in_place(mut self, place: &Arc<Place>) -> Self {
        self.place = Some(Arc::clone(place));
        self
    }

    /// Whether this value holds a slot (it holds none while the operation has no limit, and
    /// under a slot its task or thread already holds).
    pub fn is_held(&self) -> bool {
        self.admitted.is_some()
    }

    /// The limit whose slot this is.
    pub(super) fn limit(&self) -> Option<&Arc<RouteLimit>> {
        self.admitted.as_ref().map(|(_, limit)| limit)
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("held", &self.is_held())
            .finish()
    }
}

/// Why [`Backoff::admit`](super::Backoff::admit) gave no slot: the try must not run.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdmitError {
    /// The wait reached the streak's deadline (the policy's deadline from the wait's start
    /// for a first try; [`MAX_ADMISSION_WAIT`] without one): counted and logged as the
    /// streak's end (`deadline`), as a call's deadline is.
    TimedOut {
        /// The operation's name.
        operation: String,
        /// How long the try waited.
        waited: Duration,
    },
    /// `admit()` was called outside a tokio runtime, whose timer bounds its wait: refused at
    /// once, whether or not the operation has a limit. Outside tokio, use
    /// [`admit_blocking`](super::Backoff::admit_blocking) on a thread.
    NoRuntime {
        /// The operation's name.
        operation: String,
    },
}

impl fmt::Display for AdmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TimedOut { operation, waited } => write!(
                f,
                "operation `{operation}`: no admission slot within its deadline (waited {waited:?})"
            ),
            Self::NoRuntime { operation } => write!(
                f,
                "operation `{operation}`: Backoff::admit needs a tokio runtime (its timer bounds \
                 the wait); outside tokio, call Backoff::admit_blocking on a thread"
            ),
        }
    }
}

impl Error for AdmitError {}

tokio::task_local! {
    /// The call chain of the `Operation::run` whose try is being polled (and of every
    /// future it awaits): a nested `run` or `admit` finds its caller's slot by it.
    static CHAIN: Option<u64>;
}

thread_local! {
    /// The same for `Operation::run_blocking`, while its closure runs on this thread.
    static BLOCKING_CHAIN: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// The call chain asking for a slot now: the `run` (or `run_blocking`) whose try this is, or
/// else the tokio task, or else the thread. Tries of one chain share the slot it holds; two
/// calls of `run` side by side in one task (`join!`) are two chains.
pub(super) fn owner() -> u64 {
    if let Ok(Some(chain)) = CHAIN.try_with(|c| *c) {
        return chain;
    }
    if let Some(chain) = BLOCKING_CHAIN.with(|c| c.get()) {
        return chain;
    }
    task_or_thread()
}

/// The tokio task, or the thread outside one.
pub(super) fn task_or_thread() -> u64 {
    let hasher = BuildHasherDefault::<DefaultHasher>::default();
    match tokio::task::try_id() {
        Some(task) => hasher.hash_one((1u8, task)),
        None => hasher.hash_one((2u8, std::thread::current().id())),
    }
}

/// A chain for a new call of `run`: its caller's, when it is called inside another call's
/// try, or a new one.
pub(super) fn new_chain() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    if let Ok(Some(chain)) = CHAIN.try_with(|c| *c) {
        return chain;
    }
    if let Some(chain) = BLOCKING_CHAIN.with(|c| c.get()) {
        return chain;
    }
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    BuildHasherDefault::<DefaultHasher>::default().hash_one((0u8, n))
}

/// Polls `future` as part of `chain` (a call of `run`'s try).
pub(super) fn in_chain<F: Future>(
    chain: Option<u64>,
    future: F,
) -> tokio::task::futures::TaskLocalFuture<Option<u64>, F> {
    CHAIN.scope(chain, future)
}

/// Runs `f` as part of `chain` on this thread (a call of `run_blocking`'s try).
pub(super) fn in_blocking_chain<T>(chain: Option<u64>, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            BLOCKING_CHAIN.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(BLOCKING_CHAIN.with(|c| c.replace(chain.or(c.get()))));
    f()
}

/// Wakes a parked thread.
struct Unpark(std::thread::Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Waits on this thread for `future` (one that a wake ends, no timer inside) for at most
/// `most`: `None` past it.
pub(super) fn block_on_for<F: Future + Unpin>(mut future: F, most: Duration) -> Option<F::Output> {
    let start = std::time::Instant::now();
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(out) = Pin::new(&mut future).poll(&mut cx) {
            return Some(out);
        }
        let left = most.saturating_sub(start.elapsed());
        if left.is_zero() {
            return None;
        }
        std::thread::park_timeout(left);
    }
}
