//! Outside HTTP, issue 59: what a user of `Operation` sees when a loop meets a permanent
//! error, when tries of one call chain nest, when a queued try reaches its deadline, when an
//! operation has been quiet, on a thread without a runtime, and under a tower service whose
//! readiness fails. Real SQLite files and real driver errors (sqlx, rusqlite); orderings from
//! held locks, channels and tokio's paused clock, never from timing.

use crate::common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use common::TestDb;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::operation::{AdmitError, Slot};
use tower_sqlite_retry::{Operation, RetryPolicy};

fn noop_context() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

/// An operation that met contention once (a pool time-out, retried): it has a limit of one.
async fn contended(op: &Operation) {
    let failed = AtomicU32::new(0);
    op.run(|_| async {
        if failed.fetch_add(1, Ordering::SeqCst) == 0 {
            Err(sqlx::Error::PoolTimedOut)
        } else {
            Ok(())
        }
    })
    .await
    .unwrap();
    assert_eq!(op.metrics().admission_limits().len(), 1);
}

/// A dispatcher loop whose claim meets a permanent error (the table is missing: a real
/// sqlx "no such table"): `next_delay` says `None`, the give-up is a WARN `not retried` with
/// the error's type, once in its interval (the next ones are counted, not logged), and each
/// is counted `non_retryable`, never `first_try`, the counter a success uses.
#[tokio::test]
async fn a_permanent_error_in_a_loop_is_warned_and_counted_apart_from_successes() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::from_secs(5)).await;
    let (capture, _guard) = common::capture_events();
    let op = Operation::new("claim", RetryPolicy::default());
    let mut backoff = op.backoff();
    for _ in 0..3 {
        let err = sqlx::query("UPDATE no_such_table SET x = 1")
            .execute(&pool)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no such table"), "{err}");
        assert_eq!(backoff.next_delay(&err), None);
        assert_eq!(backoff.stopped(), Some(Outcome::NonRetryable));
    }
    let warned = capture.with_message("not retried");
    assert_eq!(warned.len(), 1, "{warned:?}");
    assert_eq!(warned[0]["retry.outcome"], "non_retryable");
    assert_eq!(warned[0]["retry.operation"], "claim");
    assert!(warned[0]["error.type"].contains("sqlx"), "{warned:?}");
    let snap = op.metrics().snapshot();
    assert_eq!((snap.non_retryable, snap.first_try), (3, 0), "{snap:?}");
    assert_eq!(snap.requests, snap.finished());
}

/// The rate limit lets the next WARN through after its interval, with the give-ups it did not
/// log.
#[tokio::test(start_paused = true)]
async fn the_next_warn_says_how_many_were_not_logged() {
    let (capture, _guard) = common::capture_events();
    let op = Operation::new("claim", RetryPolicy::default());
    let mut backoff = op.backoff();
    for _ in 0..3 {
        assert_eq!(backoff.next_delay(&sqlx::Error::RowNotFound), None);
    }
    tokio::time::advance(tower_sqlite_retry::operation::NOT_RETRIED_WARN_EVERY).await;
    assert_eq!(backoff.next_delay(&sqlx::Error::RowNotFound), None);
    let warned = capture.with_message("not retried");
    assert_eq!(warned.len(), 2, "{warned:?}");
    assert_eq!(warned[0]["retry.suppressed"], "0");
    assert_eq!(warned[1]["retry.suppressed"], "2");
}

/// A retried helper called from a retried caller: once the operation met contention, the
/// caller's call holds its slot, and the helper's `run` of the same operation runs under it
/// at once (on the paused clock: no time passes), instead of waiting its whole deadline for
/// the slot its own caller holds.
#[tokio::test(start_paused = true)]
async fn a_nested_run_never_waits_for_its_callers_slot() {
    let op = Operation::new(
        "nested",
        common::fast_policy(10).deadline(Duration::from_secs(3)),
    );
    contended(&op).await;
    let start = tokio::time::Instant::now();
    let value = op
        .run(|_| async {
            let inner = op.run(|_| async { Ok::<_, sqlx::Error>(41) }).await;
            inner.map(|v| v + 1).map_err(|e| e.into_inner().unwrap())
        })
        .await
        .unwrap();
    assert_eq!(value, 42);
    assert_eq!(start.elapsed(), Duration::ZERO, "the inner call waited");
    assert_eq!(op.metrics().snapshot().deadline, 0);

    // the same from a loop's slot: a `run` inside the try that holds it
    let mut backoff = op.backoff();
    let slot = backoff.admit().await.unwrap();
    assert!(slot.is_held());
    op.run(|_| async { Ok::<_, sqlx::Error>(()) })
        .await
        .unwrap();
    // and a second backoff of the same operation driven by the same task
    let mut other = op.backoff();
    let inner: Slot = other.admit().await.unwrap();
    assert!(!inner.is_held(), "runs under the task's slot");
    assert_eq!(start.elapsed(), Duration::ZERO);
    drop((slot, inner));
}

/// Two calls side by side in one task (`join!`) are two call chains: the second queues
/// behind the first's slot (sharing a task is not nesting).
#[tokio::test(start_paused = true)]
async fn calls_side_by_side_in_one_task_still_take_turns() {
    let op = Operation::new("side", common::fast_policy(10));
    contended(&op).await;
    let (go_tx, go) = tokio::sync::watch::channel(false);
    let in_b = AtomicU32::new(0);
    let a = op.run(|_| {
        let mut go = go.clone();
        async move {
            let _ = go.wait_for(|go| *go).await;
            Ok::<_, sqlx::Error>(())
        }
    });
    let b = op.run(|_| async {
        in_b.fetch_add(1, Ordering::SeqCst);
        Ok::<_, sqlx::Error>(())
    });
    let (mut a, mut b) = (Box::pin(a), Box::pin(b));
    let mut cx = noop_context();
    assert!(a.as_mut().poll(&mut cx).is_pending());
    assert!(b.as_mut().poll(&mut cx).is_pending(), "b queues behind a");
    assert_eq!(in_b.load(Ordering::SeqCst), 0);
    go_tx.send(true).unwrap();
    assert!(a.as_mut().poll(&mut cx).is_ready());
    assert!(b.as_mut().poll(&mut cx).is_ready());
    assert_eq!(in_b.load(Ordering::SeqCst), 1);
}

/// A queued call whose wait reaches its deadline makes no try: it fails with no error, no
/// attempt, outcome `deadline`, as the layer answers a request whose deadline passed in the
/// queue; nothing runs without a slot.
#[tokio::test(start_paused = true)]
async fn a_queued_call_makes_no_try_past_its_deadline() {
    let op = Operation::new(
        "late",
        common::fast_policy(10).deadline(Duration::from_millis(100)),
    );
    contended(&op).await;
    let (_never_tx, never) = tokio::sync::watch::channel(());
    let holder = op.run(|_| {
        let mut never = never.clone();
        async move {
            let _ = never.changed().await;
            Ok::<_, sqlx::Error>(())
        }
    });
    let mut holder = Box::pin(holder);
    assert!(holder.as_mut().poll(&mut noop_context()).is_pending());
    let tries = AtomicU32::new(0);
    let err = op
        .run(|_| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Ok::<_, sqlx::Error>(())
        })
        .await
        .unwrap_err();
    assert_eq!(tries.load(Ordering::SeqCst), 0, "no try without a slot");
    assert!(err.error().is_none());
    assert_eq!((err.attempts(), err.outcome()), (0, Outcome::Deadline));
    assert_eq!(err.elapsed(), Duration::from_millis(100));
    drop(holder);
}

/// A loop's streak that gave up: its next try waits in the queue like any first try (its wait
/// timed from now, not from the ended streak's start), and gets the slot when it comes back.
#[tokio::test(start_paused = true)]
async fn after_a_give_up_the_next_try_waits_its_turn() {
    let op = Operation::new(
        "loop",
        common::fast_policy(2).deadline(Duration::from_secs(2)),
    );
    contended(&op).await;
    let mut backoff = op.backoff();
    // a streak that runs out of attempts, then time passes
    assert!(backoff.next_delay(&sqlx::Error::PoolTimedOut).is_some());
    assert!(backoff.next_delay(&sqlx::Error::PoolTimedOut).is_none());
    // longer than the deadline: a wait timed from the ended streak's start would be over
    tokio::time::advance(Duration::from_secs(3)).await;
    // another task's try collides (the operation keeps its limit) and holds the slot
    let mut other = op.backoff();
    assert!(other.next_delay(&sqlx::Error::PoolTimedOut).is_some());
    let held = tokio::spawn(async move {
        let slot = other.admit().await.unwrap();
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(slot);
    });
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    let slot = backoff
        .admit()
        .await
        .expect("its turn, within its deadline");
    assert!(slot.is_held());
    assert_eq!(start.elapsed(), Duration::from_millis(200));
    held.await.unwrap();
}

/// The limit decays: after a quiet time with no collision, the operation's tries run at once
/// again (no slot taken), it is no longer listed in `admission_limits()`, and the next
/// retryable error starts a fresh limit.
#[tokio::test(start_paused = true)]
async fn a_quiet_operation_stops_queueing() {
    let op = Operation::new(
        "quiet",
        common::fast_policy(10).deadline(Duration::from_secs(5)),
    );
    // its quiet time is the deadline, 5 s; the collision is at `t0`
    let t0 = tokio::time::Instant::now();
    contended(&op).await;
    let limits = op.metrics().admission_limits();
    assert_eq!(limits[0].to_string(), "quiet: 1");
    assert_eq!((limits[0].method(), limits[0].route()), (None, "quiet"));
    let mut backoff = op.backoff();
    let held = backoff.admit().await.unwrap();
    assert!(held.is_held());
    // another task's try queues behind it (a worker busy with something else holds it)
    let mut other = op.backoff();
    let queued = tokio::spawn(async move { other.admit().await.map(|s| s.is_held()) });
    tokio::task::yield_now().await;
    assert_eq!(op.metrics().admission_limits()[0].waiting(), 1);
    // quiet for the policy's deadline (less than the queued try's): the limit goes at the
    // next look, and the try queued for it is let go
    tokio::time::advance(Duration::from_secs(5) - t0.elapsed()).await;
    let mut third = op.backoff();
    assert!(!third.admit().await.unwrap().is_held());
    assert!(op.metrics().admission_limits().is_empty());
    tokio::task::yield_now().await;
    assert!(queued.is_finished(), "the queued try was let go");
    assert_eq!(queued.await.unwrap(), Ok(true));
    drop(held);
    backoff.reset();
    contended(&op).await;
}

/// Outside any runtime, `admit()` refuses at once, with or without contention, with a message
/// that names the way out; `admit_blocking` works on the thread.
#[test]
fn admit_outside_tokio_refuses_at_once_and_the_thread_has_admit_blocking() {
    let op = Operation::new("thread", common::fast_policy(10));
    let mut backoff = op.backoff();
    let refused = futures::executor::block_on(backoff.admit()).unwrap_err();
    assert!(matches!(refused, AdmitError::NoRuntime { .. }));
    assert!(refused.to_string().contains("admit_blocking"), "{refused}");
    // contended: still refused at once, never a panic
    assert!(backoff.next_delay(&sqlx::Error::PoolTimedOut).is_some());
    let holder = op.backoff().admit_blocking().unwrap();
    assert!(holder.is_held());
    let refused = futures::executor::block_on(backoff.admit()).unwrap_err();
    assert!(matches!(refused, AdmitError::NoRuntime { .. }));
    // another thread's blocking try waits for the slot, and gets it when it comes back
    let (waiting_tx, waiting) = std::sync::mpsc::channel();
    let op2 = op.clone();
    let worker = std::thread::spawn(move || {
        let mut backoff = op2.backoff();
        waiting_tx.send(()).unwrap();
        backoff.admit_blocking().map(|slot| slot.is_held())
    });
    waiting.recv().unwrap();
    while op.metrics().admission_limits()[0].waiting() != 1 {
        std::thread::yield_now();
    }
    drop(holder);
    assert_eq!(worker.join().unwrap(), Ok(true));
}

/// `run_blocking` with rusqlite on a real file: while another connection holds
/// `BEGIN IMMEDIATE`, the thread's write fails `SQLITE_BUSY` (busy timeout 0) and is retried;
/// once the lock goes it writes once. The counters and events are `run`'s. A nested
/// `run_blocking` of the same operation runs under its caller's slot.
#[test]
fn run_blocking_retries_a_rusqlite_write_and_nests() {
    let db = TestDb::new();
    let setup = rusqlite::Connection::open(&db.path).unwrap();
    setup
        .execute_batch("PRAGMA journal_mode = WAL; CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        .unwrap();
    setup.execute_batch("BEGIN IMMEDIATE").unwrap();
    let op = Operation::new(
        "blocking",
        common::fast_policy(1_000).deadline(Duration::from_secs(60)),
    );
    let (failed_tx, failed) = std::sync::mpsc::channel();
    let writer = {
        let (op, path) = (op.clone(), db.path.clone());
        std::thread::spawn(move || {
            let mut conn = rusqlite::Connection::open(path).unwrap();
            conn.busy_timeout(Duration::ZERO).unwrap();
            op.run_blocking(|attempt| {
                let tx = conn.transaction()?;
                let r = tx.execute("INSERT INTO t VALUES (1)", ());
                if r.is_err() {
                    let _ = failed_tx.send(attempt);
                }
                r?;
                tx.commit()
            })
        })
    };
    assert_eq!(failed.recv().unwrap(), 1);
    setup.execute_batch("COMMIT").unwrap();
    writer.join().unwrap().unwrap();
    let rows: i64 = setup
        .query_row("SELECT COUNT(*) FROM t", (), |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1);
    let snap = op.metrics().snapshot();
    assert_eq!(snap.succeeded_after_retry, 1, "{snap:?}");
    // the operation met contention: a nested call runs under its caller's slot, at once
    let value = op
        .run_blocking(|_| {
            op.run_blocking(|_| Ok::<_, rusqlite::Error>(1))
                .map_err(|e| e.into_inner().unwrap())
        })
        .unwrap();
    assert_eq!(value, 1);
    assert_eq!(op.metrics().snapshot().deadline, 0);
}

/// `tower::retry` with the operation's layer: a job that failed retryably, whose inner
/// service then fails `poll_ready` before the retry, is counted `non_retryable`, as the
/// layer counts a readiness error (not `cancelled`).
#[tokio::test(start_paused = true)]
async fn a_readiness_error_under_the_tower_policy_is_not_a_cancel() {
    #[derive(Clone)]
    struct Flaky {
        calls: Arc<AtomicU32>,
    }
    impl Service<u32> for Flaky {
        type Response = ();
        type Error = sqlx::Error;
        type Future = std::future::Ready<Result<(), sqlx::Error>>;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), sqlx::Error>> {
            match self.calls.load(Ordering::SeqCst) {
                0 => Poll::Ready(Ok(())),
                _ => Poll::Ready(Err(sqlx::Error::PoolClosed)),
            }
        }
        fn call(&mut self, _: u32) -> Self::Future {
            self.calls.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Err(sqlx::Error::PoolTimedOut))
        }
    }
    let op = Operation::new("ready", common::fast_policy(10));
    let svc = ServiceBuilder::new().layer(op.layer()).service(Flaky {
        calls: Arc::default(),
    });
    let err = svc.oneshot(1).await.unwrap_err();
    assert!(matches!(err, sqlx::Error::PoolClosed), "{err}");
    let snap = op.metrics().snapshot();
    assert_eq!((snap.non_retryable, snap.cancelled), (1, 0), "{snap:?}");
}

/// A `run` whose error type is not `Send` is still a `Send` future (it can be spawned) when
/// its closure's futures are: the error is never kept across a wait.
#[test]
fn a_non_send_error_keeps_the_run_future_send() {
    #[derive(Debug)]
    struct NotSend(#[allow(dead_code)] std::rc::Rc<()>);
    fn spawnable<F: Future + Send>(_: &F) {}
    let op = Operation::new("send", RetryPolicy::default()).classify_with(|_: &NotSend| None);
    let call = op.run(|_| async { Err::<(), _>(NotSend(std::rc::Rc::new(()))) });
    spawnable(&call);
}

/// A loop's retry keeps its place: the slot its failed try held, dropped at the end of the
/// loop's turn (as the documented loop drops it), waits for the streak's next `admit()`, while
/// another task queued meanwhile waits; after the streak's success the slot goes to that task.
#[tokio::test(start_paused = true)]
async fn a_loops_retry_keeps_its_place_in_the_queue() {
    let op = Operation::new("place", common::fast_policy(10));
    contended(&op).await;
    let mut backoff = op.backoff();
    let slot = backoff.admit().await.unwrap();
    assert!(slot.is_held());
    // the try fails retryably; another task queues behind it
    let delay = backoff.next_delay(&sqlx::Error::PoolTimedOut).unwrap();
    let mut other = op.backoff();
    let waiter = tokio::spawn(async move { other.admit().await.map(|s| s.is_held()) });
    tokio::task::yield_now().await;
    assert_eq!(op.metrics().admission_limits()[0].waiting(), 1);
    tokio::time::sleep(delay).await;
    drop(slot); // the end of the loop's turn
    tokio::task::yield_now().await;
    assert!(!waiter.is_finished(), "the slot waits for the retry");
    let retry = backoff.admit().await.unwrap();
    assert!(retry.is_held());
    backoff.reset();
    drop(retry);
    assert_eq!(waiter.await.unwrap(), Ok(true));
}

/// Many threads on one operation at once: calls of `run_blocking` (some nested, some failing
/// retryably, some for good) and loops with `admit_blocking`, while the limit is made, learnt
/// and tried from every side. None waits for its own slot (no call reaches its deadline),
/// every call and streak is counted once, and at the end no slot is held and none waits.
#[test]
fn many_threads_share_one_operations_admission() {
    let policy = RetryPolicy::default()
        .base_delay(Duration::from_micros(1))
        .max_delay(Duration::from_micros(20))
        .max_attempts(u32::MAX)
        .deadline(Duration::from_secs(60));
    let op = Operation::new("storm", policy);
    let threads: Vec<_> = (0..16u64)
        .map(|t| {
            let op = op.clone();
            std::thread::spawn(move || {
                let mut x = (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut next = move || {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x
                };
                let mut backoff = op.backoff();
                for _ in 0..500 {
                    let roll = next();
                    if t % 4 == 0 {
                        // a loop's try
                        let slot = backoff.admit_blocking().expect("a slot in time");
                        if roll % 3 == 0 {
                            let _ = backoff.next_delay(&sqlx::Error::PoolTimedOut);
                        } else {
                            backoff.reset();
                        }
                        drop(slot);
                        continue;
                    }
                    let fails = roll % 4;
                    let result = op.run_blocking(|attempt| {
                        if roll % 5 == 0 {
                            // a retried helper inside: never waits for its caller's slot
                            op.run_blocking(|_| Ok::<_, sqlx::Error>(()))
                                .map_err(|e| e.into_inner().unwrap())?;
                        }
                        match (fails, attempt) {
                            (3, _) => Err(sqlx::Error::RowNotFound),
                            (f, a) if u64::from(a) <= f => Err(sqlx::Error::PoolTimedOut),
                            _ => Ok(()),
                        }
                    });
                    match result {
                        Ok(()) => assert_ne!(fails, 3),
                        Err(e) => assert_eq!(e.outcome(), Outcome::NonRetryable, "{e}"),
                    }
                }
                drop(backoff);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let snap = op.metrics().snapshot();
    assert_eq!(snap.requests, snap.finished(), "{snap:?}");
    assert_eq!(snap.deadline, 0, "a try waited for its own slot: {snap:?}");
    for limit in op.metrics().admission_limits() {
        assert_eq!((limit.held(), limit.waiting()), (0, 0), "{limit}");
    }
}

/// A poller's policy without a deadline (`deadline(Duration::MAX)`): a try queued behind a
/// slot that is never given back waits `MAX_ADMISSION_WAIT`, not for ever, then must not run
/// (`AdmitError::TimedOut`), and the streak is counted `deadline` with no attempt.
#[tokio::test(start_paused = true)]
async fn without_a_deadline_the_wait_is_bounded_by_max_admission_wait() {
    use tower_sqlite_retry::operation::MAX_ADMISSION_WAIT;
    let op = Operation::new("poller", common::fast_policy(10).deadline(Duration::MAX));
    contended(&op).await;
    let mut holder = op.backoff();
    let held = holder.admit().await.unwrap();
    assert!(held.is_held());
    let mut other = op.backoff();
    let waiter = tokio::spawn(async move {
        let start = tokio::time::Instant::now();
        let result = other.admit().await.map(|s| s.is_held());
        (result, start.elapsed())
    });
    // (a bound here, on the paused clock, so that a wait without one fails instead of hanging)
    let (result, waited) = tokio::time::timeout(MAX_ADMISSION_WAIT * 2, waiter)
        .await
        .expect("the wait has a bound")
        .unwrap();
    assert!(
        matches!(result, Err(AdmitError::TimedOut { .. })),
        "{result:?}"
    );
    assert_eq!(waited, MAX_ADMISSION_WAIT);
    let snap = op.metrics().snapshot();
    assert_eq!(snap.deadline, 1, "{snap:?}");
    drop(held);
}
