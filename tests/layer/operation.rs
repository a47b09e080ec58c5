//! Outside HTTP (`Operation`): a loop's backoff, the function wrapper and a tower service
//! under `tower::retry`, on real SQLite files with deterministic contention (a held
//! `BEGIN IMMEDIATE`, released once the victim has failed: no timing involved), real sqlx
//! errors, the tracing events, the counters, and cancellation at every await of the wrapper.

use crate::common;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use common::TestDb;
use sqlx::SqlitePool;
use tokio::sync::mpsc;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_sqlite_retry::classify::RetryDriverErrors;
use tower_sqlite_retry::metrics::{MetricsSnapshot, Outcome};
use tower_sqlite_retry::{Jitter, Operation, RetryPolicy, Retryable};

/// Retries that come at once (1 to 5 ms), many of them, within a long deadline: the tests'
/// orderings come from the held lock and channels, never from these delays.
fn policy() -> RetryPolicy {
    common::fast_policy(1_000).deadline(Duration::from_secs(60))
}

/// Inserts `name` in one deferred transaction that reads, then writes (the shape that fails
/// with `SQLITE_BUSY` at once while another connection holds the write lock).
async fn insert(db: &SqlitePool, name: &str) -> Result<i64, sqlx::Error> {
    let mut tx = db.begin().await?;
    let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
        .bind(next)
        .bind(name)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(next)
}

async fn rows(db: &SqlitePool, name: &str) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE name = ?")
        .bind(name)
        .fetch_one(db)
        .await
        .unwrap()
}

fn assert_adds_up(snap: &MetricsSnapshot) {
    assert_eq!(snap.requests, snap.finished(), "{snap:?}");
}

/// A dispatcher loop with the crate's backoff: while another connection holds the write lock
/// its claims fail `SQLITE_BUSY`, each is waited on (never above the cap), and once the lock
/// goes the item is written exactly once; the counters say one success after retries.
#[tokio::test]
async fn a_loop_backs_off_while_locked_then_writes_once() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::ZERO).await;
    let lock = db.hold_write_lock().await;
    let op = Operation::new("claim", policy());
    let (failed_tx, mut failed) = mpsc::unbounded_channel();
    let worker = {
        let (pool, op) = (pool.clone(), op.clone());
        tokio::spawn(async move {
            let mut backoff = op.backoff();
            loop {
                match insert(&pool, "loop").await {
                    Ok(_) => {
                        backoff.reset();
                        return;
                    }
                    Err(e) => {
                        let delay = backoff.next_delay(&e).expect("retryable: {e}");
                        assert!(delay <= Duration::from_millis(5));
                        let _ = failed_tx.send(backoff.reason().cloned());
                        tokio::time::sleep(delay).await;
                    }
                }
            }
        })
    };
    for _ in 0..3 {
        let reason = failed.recv().await.unwrap().unwrap();
        assert_eq!((reason.code(), reason.name()), ("5", "SQLITE_BUSY"));
    }
    lock.release().await;
    worker.await.unwrap();
    assert_eq!(rows(&pool, "loop").await, 1);
    let snap = op.metrics().snapshot();
    assert_eq!(snap.succeeded_after_retry, 1, "{snap:?}");
    assert!(snap.retries >= 3, "{snap:?}");
    assert_adds_up(&snap);
}

/// The function wrapper: tries that fail `SQLITE_BUSY` are run again, the value comes back,
/// the row is there once, and each retry is a `retrying operation` event named by the
/// operation, with the code and its name.
#[tokio::test]
async fn the_wrapper_retries_a_busy_transaction_and_returns_its_value() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::ZERO).await;
    let lock = db.hold_write_lock().await;
    let (capture, _guard) = common::capture_events();
    let op = Operation::new("insert", policy());
    let (failed_tx, mut failed) = mpsc::unbounded_channel();
    let tries = Arc::new(AtomicU32::new(0));
    let call = {
        let (pool, op, tries) = (pool.clone(), op.clone(), tries.clone());
        async move {
            op.run(|attempt| {
                let (pool, failed_tx, tries) = (pool.clone(), failed_tx.clone(), tries.clone());
                async move {
                    assert_eq!(tries.fetch_add(1, Ordering::SeqCst) + 1, attempt);
                    let result = insert(&pool, "wrapped").await;
                    if result.is_err() {
                        let _ = failed_tx.send(attempt);
                    }
                    result
                }
            })
            .await
        }
    };
    let (result, ()) = tokio::join!(call, async {
        assert_eq!(failed.recv().await, Some(1));
        assert_eq!(failed.recv().await, Some(2));
        lock.release().await;
    });
    assert_eq!(result.unwrap(), 1);
    assert_eq!(rows(&pool, "wrapped").await, 1);
    let tries = tries.load(Ordering::SeqCst);
    assert!(tries >= 3);
    let retries = capture.with_message("retrying operation");
    assert_eq!(retries.len() as u32, tries - 1, "{retries:?}");
    for (i, event) in retries.iter().enumerate() {
        assert_eq!(event["retry.operation"], "insert");
        assert_eq!(event["retry.attempt"], (i + 2).to_string());
        assert_eq!(event["db.response.status_code"], "5");
        assert_eq!(event["error.type"], "SQLITE_BUSY");
    }
    assert!(capture.with_message("retries exhausted").is_empty());
    let snap = op.metrics().snapshot();
    assert_eq!(
        (snap.succeeded_after_retry, snap.retries),
        (1, u64::from(tries - 1))
    );
    assert_adds_up(&snap);
}

/// An error a retry cannot cure (a unique violation) is returned at once, after one try, with
/// no event; a success costs the counters one `first_try`.
#[tokio::test]
async fn the_wrapper_never_retries_what_a_retry_cannot_cure() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::from_secs(5)).await;
    let (capture, _guard) = common::capture_events();
    let op = Operation::new("insert", policy());
    let put = |attempt: u32| {
        let pool = pool.clone();
        async move {
            assert_eq!(attempt, 1);
            sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'once')")
                .execute(&pool)
                .await
        }
    };
    op.run(put).await.unwrap();
    let err = op.run(put).await.unwrap_err();
    assert_eq!(err.attempts(), 1);
    // an error is never counted as a success, even on a first try
    assert_eq!(err.outcome(), Outcome::NonRetryable);
    let db_error = err.error().unwrap().as_database_error().unwrap();
    assert!(db_error.is_unique_violation(), "{err}");
    // a call's error goes back to its caller: no event
    assert!(capture.events.lock().unwrap().is_empty());
    let snap = op.metrics().snapshot();
    assert_eq!(
        (
            snap.first_try,
            snap.non_retryable,
            snap.retries,
            snap.requests
        ),
        (1, 1, 0, 2)
    );
}

/// While the lock is never released, the wrapper gives up at its attempts: the last error
/// (still `SQLITE_BUSY`), the tries made, one ERROR event; nothing was written.
#[tokio::test]
async fn the_wrapper_gives_up_at_its_attempts_with_the_last_error() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::ZERO).await;
    let lock = db.hold_write_lock().await;
    let (capture, _guard) = common::capture_events();
    let op = Operation::new("insert", common::fast_policy(4));
    let err = op
        .run(|_| insert(&pool, "never"))
        .await
        .expect_err("locked all along");
    assert_eq!(err.attempts(), 4);
    assert_eq!(err.outcome(), Outcome::Exhausted);
    assert!(tower_sqlite_retry::DriverError::retryable(err.error().unwrap()).is_some());
    // its source is the error: the layer still finds it in a handler's error
    assert!(tower_sqlite_retry::classify_error_chain(&err).is_some());
    assert!(err.to_string().contains("after 4 attempts"), "{err}");
    let exhausted = capture.with_message("retries exhausted");
    assert_eq!(exhausted.len(), 1);
    assert_eq!(exhausted[0]["retry.attempts"], "4");
    assert_eq!(exhausted[0]["retry.outcome"], "exhausted");
    assert_eq!(exhausted[0]["retry.operation"], "insert");
    lock.release().await;
    assert_eq!(rows(&pool, "never").await, 0);
    let snap = op.metrics().snapshot();
    assert_eq!((snap.exhausted, snap.retries), (1, 3));
}

/// The deadline bounds a call (on the paused clock: the delays are skipped, not slept): no
/// backoff that would end past it is started.
#[tokio::test(start_paused = true)]
async fn the_wrapper_stops_at_its_deadline() {
    let policy = RetryPolicy::default()
        .max_attempts(1_000)
        .base_delay(Duration::from_millis(40))
        .max_delay(Duration::from_millis(40))
        .jitter(Jitter::None)
        .deadline(Duration::from_millis(100));
    let op = Operation::new("pool", policy);
    let err = op
        .run(|_| async { Err::<(), _>(sqlx::Error::PoolTimedOut) })
        .await
        .unwrap_err();
    // tries at 0, 40 and 80 ms; a fourth would start at 120 ms
    assert_eq!(err.attempts(), 3);
    assert_eq!(err.outcome(), Outcome::Deadline);
    assert_eq!(err.elapsed(), Duration::from_millis(80));
}

/// A waker that does nothing: the test polls by hand.
fn noop_context() -> Context<'static> {
    Context::from_waker(std::task::Waker::noop())
}

/// Cancelling the wrapper at each of its awaits (the first try, the backoff sleep, a later
/// try): the future is dropped, nothing more runs, and the call is counted `cancelled`, once.
#[tokio::test(start_paused = true)]
async fn the_wrapper_can_be_cancelled_at_every_await() {
    // where to drop it: 0 = in the first try, 1 = in the sleep, 2 = in the second try
    for point in 0..3 {
        let op = Operation::new("cancel", common::fast_policy(10));
        let tries = Arc::new(AtomicU32::new(0));
        let (_never_tx, never) = tokio::sync::watch::channel(());
        let call = op.run(|attempt| {
            let tries = tries.clone();
            let mut never = never.clone();
            async move {
                tries.fetch_add(1, Ordering::SeqCst);
                let fail_now = point == 1 || (point == 2 && attempt == 1);
                if !fail_now {
                    // pending until cancelled: the sender is never used
                    let _ = never.changed().await;
                }
                Err::<(), _>(sqlx::Error::PoolTimedOut)
            }
        });
        let mut call = Box::pin(call);
        let mut cx = noop_context();
        assert!(call.as_mut().poll(&mut cx).is_pending());
        if point == 2 {
            // past the sleep (at most the 5 ms cap), into the second try
            tokio::time::advance(Duration::from_millis(5)).await;
            assert!(call.as_mut().poll(&mut cx).is_pending());
        }
        let expected_tries = if point == 2 { 2 } else { 1 };
        assert_eq!(
            tries.load(Ordering::SeqCst),
            expected_tries,
            "point {point}"
        );
        let snap = op.metrics().snapshot();
        assert_eq!(snap.requests, 0, "point {point}: still running");
        drop(call);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(
            tries.load(Ordering::SeqCst),
            expected_tries,
            "point {point}"
        );
        let snap = op.metrics().snapshot();
        assert_eq!(
            (snap.requests, snap.cancelled),
            (1, 1),
            "point {point}: {snap:?}"
        );
    }
}

/// A sqlx transaction cancelled inside the wrapper is rolled back: the write lock it held
/// goes, and another writer begins.
#[tokio::test]
async fn a_cancelled_try_leaves_no_transaction_behind() {
    let db = TestDb::new();
    let pool = db.pool(2, Duration::ZERO).await;
    let op = Operation::new("cancel", policy());
    let (inside_tx, mut inside) = mpsc::unbounded_channel();
    let call = op.run(|_| {
        let (pool, inside_tx) = (pool.clone(), inside_tx.clone());
        async move {
            let mut tx = pool.begin().await?;
            sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'cancelled')")
                .execute(&mut *tx)
                .await?;
            let _ = inside_tx.send(());
            std::future::pending::<()>().await;
            tx.commit().await
        }
    });
    tokio::select! {
        _ = call => unreachable!("never finishes"),
        _ = inside.recv() => {}
    }
    // the write lock went with the rollback: a writer with busy timeout 0 gets it
    common::poll_until("the cancelled transaction rolled back", async || {
        let mut conn = db.connection().await;
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut conn)
            .await
            .is_ok()
    })
    .await;
    assert_eq!(rows(&pool, "cancelled").await, 0);
    assert_eq!(op.metrics().snapshot().cancelled, 1);
}

/// A job: cloneable, as `tower::retry` needs.
#[derive(Clone, Debug)]
struct Job(String);

/// A tower service that is no HTTP service (a job processor) under `tower::retry` with the
/// operation's policy: its jobs that meet the held lock are retried and done once; a job that
/// fails for good is returned; the counters count one request per job.
#[tokio::test]
async fn a_tower_service_is_retried_by_tower_retry_with_the_policy() {
    let db = TestDb::new();
    let pool = db.pool(4, Duration::ZERO).await;
    let lock = db.hold_write_lock().await;
    let op = Operation::new("job", policy());
    let (failed_tx, mut failed) = mpsc::unbounded_channel();
    let worker = ServiceBuilder::new()
        .layer(op.layer())
        .service_fn(move |job: Job| {
            let (pool, failed_tx) = (pool.clone(), failed_tx.clone());
            async move {
                let result = insert(&pool, &job.0).await;
                if result.is_err() {
                    let _ = failed_tx.send(job.0.clone());
                }
                result
            }
        });
    let jobs = ["a", "b", "c"].map(|name| {
        let worker = worker.clone();
        tokio::spawn(worker.oneshot(Job(name.to_owned())))
    });
    // every job failed at least once before the lock goes
    let mut seen = std::collections::BTreeSet::new();
    while seen.len() < 3 {
        seen.insert(failed.recv().await.unwrap());
    }
    lock.release().await;
    for job in jobs {
        job.await.unwrap().unwrap();
    }
    let db_pool = db.pool(1, Duration::from_secs(5)).await;
    for name in ["a", "b", "c"] {
        assert_eq!(rows(&db_pool, name).await, 1, "{name}");
    }
    let snap = op.metrics().snapshot();
    assert_eq!(
        (snap.requests, snap.succeeded_after_retry),
        (3, 3),
        "{snap:?}"
    );
    assert!(snap.retries >= 3);
    assert_adds_up(&snap);
    // the service's own policy is no request: dropping the service counts nothing
    drop(worker);
    assert_eq!(op.metrics().snapshot().requests, 3);
}

/// A job service whose error is a `BoxError` (as job runners' are), classified by
/// `RetryDriverErrors`: a retryable driver error inside is retried, another is not; a job
/// whose future is dropped mid-retry is counted `cancelled`.
#[tokio::test(start_paused = true)]
async fn a_boxed_error_service_and_a_dropped_job() {
    let op = Operation::new("boxed", common::fast_policy(10)).classify_with(RetryDriverErrors);
    let calls = Arc::new(AtomicU32::new(0));
    let mut svc = ServiceBuilder::new().layer(op.layer()).service_fn({
        let calls = calls.clone();
        move |job: Job| {
            let n = calls.fetch_add(1, Ordering::SeqCst);
            async move {
                match job.0.as_str() {
                    "busy-once" if n == 0 => Err::<(), BoxError>(sqlx::Error::PoolTimedOut.into()),
                    "busy-once" => Ok(()),
                    "broken" => Err(sqlx::Error::RowNotFound.into()),
                    _ => Err(sqlx::Error::PoolTimedOut.into()),
                }
            }
        }
    });
    svc.ready()
        .await
        .unwrap()
        .call(Job("busy-once".into()))
        .await
        .unwrap();
    assert_eq!(calls.swap(0, Ordering::SeqCst), 2);
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(Job("broken".into()))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("no rows"), "{err}");
    assert_eq!(calls.swap(0, Ordering::SeqCst), 1);
    // always busy: dropped while it backs off
    let fut = svc.ready().await.unwrap().call(Job("always".into()));
    let mut fut = Box::pin(fut);
    assert!(matches!(
        fut.as_mut().poll(&mut noop_context()),
        Poll::Pending
    ));
    drop(fut);
    let snap = op.metrics().snapshot();
    assert_eq!(
        (
            snap.succeeded_after_retry,
            snap.non_retryable,
            snap.cancelled,
            snap.requests
        ),
        (1, 1, 1, 3),
        "{snap:?}"
    );
}

/// A custom classifier (here, a closure over an application's own error) and
/// `NeverRetryErrors` are the layer's: the closure's verdict is the only one.
#[tokio::test(start_paused = true)]
async fn custom_classifiers_decide() {
    #[derive(Debug)]
    struct Flaky;
    let op = Operation::new("custom", common::fast_policy(3))
        .classify_with(|_: &Flaky| Some(Retryable::new("flaky", "FLAKY")));
    let err = op.run(|_| async { Err::<(), _>(Flaky) }).await.unwrap_err();
    assert_eq!((err.attempts(), err.outcome()), (3, Outcome::Exhausted));
    let never = Operation::new("never", common::fast_policy(3))
        .classify_with(tower_sqlite_retry::NeverRetryErrors);
    let err = never
        .run(|_| async { Err::<(), _>(sqlx::Error::PoolTimedOut) })
        .await
        .unwrap_err();
    assert_eq!((err.attempts(), err.outcome()), (1, Outcome::NonRetryable));
}

/// Admission: once an operation met a retryable error, its tries take turns. A call that
/// holds the slot (retrying, then in a try the test holds) keeps a second call's try from
/// starting until it has succeeded; with `Admission::Off` the second runs at once.
#[tokio::test(start_paused = true)]
async fn contended_tries_take_turns() {
    use tower_sqlite_retry::policy::Admission;
    for admission in [Admission::Adaptive, Admission::Off] {
        let op = Operation::new("turns", common::fast_policy(10).admission(admission));
        let (go_tx, go) = tokio::sync::watch::channel(false);
        let a_tries = Arc::new(AtomicU32::new(0));
        let a = op.run(|attempt| {
            let (tries, mut go) = (a_tries.clone(), go.clone());
            async move {
                tries.fetch_add(1, Ordering::SeqCst);
                if attempt == 1 {
                    return Err(sqlx::Error::PoolTimedOut);
                }
                let _ = go.wait_for(|go| *go).await;
                Ok(())
            }
        });
        let mut a = Box::pin(a);
        let mut cx = noop_context();
        assert!(a.as_mut().poll(&mut cx).is_pending()); // failed once, backing off
        tokio::time::advance(Duration::from_millis(5)).await;
        assert!(a.as_mut().poll(&mut cx).is_pending()); // its second try, held
        assert_eq!(a_tries.load(Ordering::SeqCst), 2);

        let b_tries = Arc::new(AtomicU32::new(0));
        let b = op.run(|_| {
            let tries = b_tries.clone();
            async move {
                tries.fetch_add(1, Ordering::SeqCst);
                Ok::<_, sqlx::Error>(())
            }
        });
        let mut b = Box::pin(b);
        match admission {
            Admission::Off => {
                assert!(b.as_mut().poll(&mut cx).is_ready(), "no queue");
                assert_eq!(b_tries.load(Ordering::SeqCst), 1);
            }
            _ => {
                assert!(b.as_mut().poll(&mut cx).is_pending(), "queued behind a");
                assert_eq!(
                    b_tries.load(Ordering::SeqCst),
                    0,
                    "b's try waits for the slot"
                );
                go_tx.send(true).unwrap();
                assert!(a.as_mut().poll(&mut cx).is_ready());
                assert!(b.as_mut().poll(&mut cx).is_ready(), "a's slot went to b");
                assert_eq!(b_tries.load(Ordering::SeqCst), 1);
                assert_eq!(op.metrics().snapshot().queued, 1);
            }
        }
        drop((a, b));
    }
}
