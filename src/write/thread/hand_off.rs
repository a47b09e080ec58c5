//! The hand-off between a caller's task and the writer thread, when a closure comes alone.
//!
//! A closure crosses two threads: the caller's task sends it to the writer thread, and the
//! writer thread sends the answer back. When both sides are busy (closures queued, tasks
//! running) neither crossing costs anything: the writer thread finds the next closure
//! waiting, the runtime's worker is awake. When a single task writes in a loop (a job worker,
//! a dispatcher, one request at a time), each side has gone to sleep by the time the other
//! hands over, and each crossing is a wake-up of a sleeping thread: on the 2-core machine of
//! BENCHMARKS.md (run C5), two of them cost more than SQLite's whole transaction at `NORMAL`
//! (about 45 µs against 30).
//!
//! Two short waits without sleeping remove them, and only where they pay:
//! - **The caller** whose closure was sent with nothing ahead of it, when closures sent alone
//!   have lately been answered within [`ANSWER_POLL`] (the measure is the callers' own: the
//!   time from send to answer, a moving average), polls for its answer for at most that long,
//!   yielding to the runtime between polls ([`tokio::task::yield_now`]): other tasks run as
//!   before, but the worker does not park, so the answer needs no wake-up. At `FULL`, where a
//!   closure alone syncs the WAL itself (hundreds of µs), the average is above the bound and
//!   the caller parks at once, as before.
//! - **The writer thread**, once a closure ended in under [`NEXT_SPIN`] and the previous one
//!   came within [`NEXT_SPIN`] of the thread going idle (closures are arriving back to back),
//!   spins for the next for at most that long before it sleeps. A service that goes idle spins
//!   once, after its last closure; closures that come further apart than that stop the
//!   spinning (the last came late); and a busy service finds the next closure queued.
//!
//! What it costs: a worker that would have slept polls for at most 150 µs per closure, and the
//! writer thread spins for at most 50 µs after a closure, in both cases only while a caller
//! writes in a loop. Nothing here decides an answer: the average and the flag are hints,
//! read and written without ordering, and a wrong one only means a sleep or a poll too many.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a caller alone polls for its answer before it parks, and the bound on the recent
/// answer times for it to poll at all.
pub(super) const ANSWER_POLL: Duration = Duration::from_micros(150);

/// How long the writer thread spins for the next closure of a caller writing in a loop.
pub(super) const NEXT_SPIN: Duration = Duration::from_micros(50);

/// How quickly closures sent alone have lately been answered, as their callers saw it.
#[derive(Debug)]
pub(super) struct Pace {
    /// A moving average (one eighth per answer) of the send-to-answer time, in nanoseconds;
    /// zero until the first.
    answered_ns: AtomicU64,
}

impl Pace {
    pub(super) fn new() -> Self {
        Self {
            answered_ns: AtomicU64::new(0),
        }
    }

    fn quick(&self) -> bool {
        self.answered_ns.load(Ordering::Relaxed) <= nanos(ANSWER_POLL)
    }

    fn record(&self, took: Duration) {
        let took = nanos(took);
        let was = self.answered_ns.load(Ordering::Relaxed);
        let now = if was == 0 {
            took
        } else {
            was - was / 8 + took / 8
        };
        self.answered_ns.store(now, Ordering::Relaxed);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The answer to a closure sent at `sent` (`None`: the writer thread dropped it unanswered);
/// `alone`: nothing was ahead of it on the channel. Cancel-safe as the receiver is: dropped,
/// the closure's caller is gone.
pub(super) async fn answer<R>(
    answered: oneshot::Receiver<R>,
    pace: &Pace,
    sent: Instant,
    alone: bool,
) -> Option<R> {
    answer_within(answered, pace, sent, alone, ANSWER_POLL).await
}

/// [`answer`], polling for at most `poll` (the tests' seam).
async fn answer_within<R>(
    mut answered: oneshot::Receiver<R>,
    pace: &Pace,
    sent: Instant,
    alone: bool,
    poll: Duration,
) -> Option<R> {
    if !alone {
        return answered.await.ok();
    }
    if pace.quick() {
        loop {
            match answered.try_recv() {
                Ok(answer) => {
                    pace.record(sent.elapsed());
                    return Some(answer);
                }
                // (The receiver is spent: it must not be awaited after this.)
                Err(oneshot::error::TryRecvError::Closed) => return None,
                Err(oneshot::error::TryRecvError::Empty) if sent.elapsed() < poll => {
                    tokio::task::yield_now().await;
                }
                Err(oneshot::error::TryRecvError::Empty) => break,
            }
        }
    }
    let answer = answered.await.ok();
    pace.record(sent.elapsed());
    answer
}

/// The writer thread's wait for its next closure: whether to spin for it, and for how long,
/// before it sleeps (`Inbox::take` does the waiting).
#[derive(Debug)]
pub(super) struct Next {
    /// The last closure came within `spin` of the thread going idle and ran for less.
    hot: bool,
    /// At most how long to spin ([`NEXT_SPIN`]; the tests' seam).
    spin: Duration,
}

impl Default for Next {
    fn default() -> Self {
        Self::with_spin(NEXT_SPIN)
    }
}

impl Next {
    pub(super) fn with_spin(spin: Duration) -> Self {
        Self { hot: false, spin }
    }

    /// How long to spin for the next closure before sleeping, if at all: only while closures
    /// come back to back and are short. `ran`: how long the last one took on the writer
    /// thread (zero before the first).
    pub(super) fn spin_for(&self, ran: Duration) -> Option<Duration> {
        (self.hot && ran < self.spin).then_some(self.spin)
    }

    /// A closure came, the thread having gone idle at `idle`.
    pub(super) fn came(&mut self, idle: Instant) {
        self.hot = idle.elapsed() < self.spin;
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll, Wake, Waker};

    use super::*;

    /// Counts its wake-ups.
    struct Wakes(AtomicUsize);

    impl Wake for Wakes {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    const LONG: Duration = Duration::from_secs(3600);

    /// Polls an answer's future once (outside any runtime, where a yield wakes its task at
    /// once); `(ready, wake-ups so far)`, and the sender for more.
    fn first_poll(pace: &Pace, alone: bool) -> (bool, usize, oneshot::Sender<u32>) {
        let (tx, rx) = oneshot::channel::<u32>();
        let wakes = Arc::new(Wakes(AtomicUsize::new(0)));
        let waker = Waker::from(Arc::clone(&wakes));
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(answer_within(rx, pace, Instant::now(), alone, LONG));
        let ready = matches!(fut.as_mut().poll(&mut cx), Poll::Ready(_));
        (ready, wakes.0.load(Ordering::SeqCst), tx)
    }

    #[test]
    fn a_caller_alone_at_a_quick_pace_yields_instead_of_sleeping() {
        let pace = Pace::new();
        let (ready, wakes, tx) = first_poll(&pace, true);
        assert!(!ready);
        assert_eq!(
            wakes, 1,
            "it yielded: its task is to be polled again, not parked"
        );
        // Dropped mid-poll: the writer thread sees its caller gone.
        assert!(tx.is_closed(), "the receiver went with the future");
    }

    #[test]
    fn a_caller_behind_others_or_at_a_slow_pace_sleeps_until_answered() {
        let (ready, wakes, _tx) = first_poll(&Pace::new(), false);
        assert_eq!(
            (ready, wakes),
            (false, 0),
            "a closure with others ahead parks"
        );
        let slow = Pace::new();
        slow.record(ANSWER_POLL * 4);
        let (ready, wakes, _tx) = first_poll(&slow, true);
        assert_eq!(
            (ready, wakes),
            (false, 0),
            "answers lately slower than the poll: parks"
        );
    }

    #[test]
    fn a_polled_answer_is_returned_and_timed() {
        let pace = Pace::new();
        let (tx, rx) = oneshot::channel::<u32>();
        tx.send(7).unwrap();
        let waker = Waker::from(Arc::new(Wakes(AtomicUsize::new(0))));
        let mut cx = Context::from_waker(&waker);
        let mut fut = pin!(answer_within(rx, &pace, Instant::now(), true, LONG));
        assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(Some(7))));
        assert!(
            pace.answered_ns.load(Ordering::Relaxed) > 0,
            "the answer's time is recorded"
        );
        // A gone writer thread is an error, not a poll until the bound.
        let (tx, rx) = oneshot::channel::<u32>();
        drop(tx);
        let mut fut = pin!(answer_within(rx, &pace, Instant::now(), true, LONG));
        assert!(matches!(fut.as_mut().poll(&mut cx), Poll::Ready(None)));
    }

    #[test]
    fn the_pace_is_a_moving_average() {
        let pace = Pace::new();
        pace.record(Duration::from_micros(80));
        assert!(pace.quick());
        for _ in 0..3 {
            pace.record(Duration::from_millis(1));
        }
        assert!(!pace.quick(), "three slow answers in a row make it slow");
        for _ in 0..40 {
            pace.record(Duration::from_micros(30));
        }
        assert!(pace.quick(), "and quick answers bring it back");
    }

    #[test]
    fn the_writer_spins_only_for_closures_that_come_back_to_back() {
        let mut next = Next::with_spin(LONG);
        assert_eq!(next.spin_for(Duration::ZERO), None, "cold: sleeps at once");
        // Came at once (within the window): hot, and spins after a short closure.
        next.came(Instant::now());
        assert_eq!(next.spin_for(Duration::ZERO), Some(LONG));
        assert_eq!(next.spin_for(LONG), None, "not after a long one");
        // Late (past a zero window): cold.
        let mut late = Next::with_spin(Duration::ZERO);
        late.came(Instant::now());
        assert_eq!(late.spin_for(Duration::ZERO), None);
    }
}
