//! The layer on plain tower services: readiness, error classifiers, backoff and deadline under
//! tokio's paused clock and the side-effect fence.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use http::{Request, Response, StatusCode};
use proptest::prelude::*;
use tokio::time::Instant;
use tower::{Service, ServiceBuilder, ServiceExt};
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::classify::RetryDriverErrors;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::{Attempt, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

fn busy() -> Response<Body> {
    let mut res = Response::new(Body::empty());
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

fn ok() -> Response<Body> {
    Response::new(Body::empty())
}

fn req() -> Request<Body> {
    Request::post("/").body(Body::from("x")).unwrap()
}

/// A service that is ready only every other poll, and panics if called when not ready. Fails
/// retryably `fail` times. A clone starts not ready, as a real service's clone would (a
/// `ConcurrencyLimit` clone holds no permit): calling a clone that was never polled panics.
struct Reluctant {
    ready: bool,
    polls: Arc<AtomicU32>,
    calls: Arc<AtomicU32>,
    fail: u32,
}

impl Clone for Reluctant {
    fn clone(&self) -> Self {
        Self {
            ready: false,
            polls: self.polls.clone(),
            calls: self.calls.clone(),
            fail: self.fail,
        }
    }
}

impl Service<Request<ReplayBody<Body>>> for Reluctant {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        let n = self.polls.fetch_add(1, Ordering::SeqCst);
        if n.is_multiple_of(2) {
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<ReplayBody<Body>>) -> Self::Future {
        assert!(std::mem::take(&mut self.ready), "called without poll_ready");
        let n = self.calls.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(if n < self.fail { busy() } else { ok() }))
    }
}

fn fast() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(5)
        .base_delay(Duration::ZERO)
        .max_delay(Duration::from_millis(1))
}

#[tokio::test]
async fn readiness_is_honoured_before_every_attempt() {
    let inner = Reluctant {
        ready: false,
        polls: Arc::default(),
        calls: Arc::default(),
        fail: 3,
    };
    let calls = inner.calls.clone();
    let polls = inner.polls.clone();
    let mut svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(fast()))
        .service(inner);
    let ready = ServiceExt::<Request<Body>>::ready(&mut svc).await.unwrap();
    // The layer reserves nothing in the inner service before it has the body.
    assert_eq!(polls.load(Ordering::SeqCst), 0);
    let res = ready.call(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
    // Every attempt: one pending poll, one ready poll, then the call, on the same instance.
    assert_eq!(polls.load(Ordering::SeqCst), 8, "two polls per attempt");
}

#[tokio::test]
async fn service_errors_use_the_error_classifier() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |_: Request<ReplayBody<Body>>| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n < 2 {
                Err(sqlx::Error::PoolTimedOut)
            } else {
                Ok(ok())
            }
        }
    });
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(fast()).classify_errors(RetryDriverErrors))
        .service(inner.clone());
    let res = svc.oneshot(req()).await.unwrap();
    assert_eq!(
        res.extensions().get::<RetryOutcome>().unwrap().attempts(),
        3
    );

    // The default classifier never replays errors.
    calls.store(0, Ordering::SeqCst);
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(fast()))
        .service(inner.clone());
    assert!(svc.oneshot(req()).await.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    // A non-retryable error is returned at once.
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(fast()).classify_errors(RetryDriverErrors))
        .service(tower::service_fn(|_: Request<ReplayBody<Body>>| async {
            Err::<Response<Body>, _>(sqlx::Error::RowNotFound)
        }));
    assert!(matches!(
        svc.oneshot(req()).await,
        Err(sqlx::Error::RowNotFound)
    ));
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Infallible>> + Send>>;

/// Always retryable after `handler` of (virtual) time.
fn slow_busy(
    handler: Duration,
    calls: Arc<AtomicU32>,
) -> impl Service<
    Request<ReplayBody<Body>>,
    Response = Response<Body>,
    Error = Infallible,
    Future = BoxFuture,
> + Clone {
    tower::service_fn(move |_: Request<ReplayBody<Body>>| {
        calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(handler).await;
            Ok(busy())
        }) as BoxFuture
    })
}

#[tokio::test(start_paused = true)]
async fn backoff_doubles_to_the_cap_and_stops_at_the_deadline() {
    let ms = Duration::from_millis;
    let policy = RetryPolicy::default()
        .max_attempts(100)
        .base_delay(ms(100))
        .max_delay(ms(400))
        .jitter(Jitter::None)
        .deadline(ms(1000))
        .no_replay_gate();
    let calls = Arc::new(AtomicU32::new(0));
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(policy))
        .service(slow_busy(ms(50), calls.clone()));
    let start = Instant::now();
    let res = svc.oneshot(req()).await.unwrap();
    // attempts at 0, 150, 400, 850 (each 50 ms); the next delay (400) would end at 1300.
    assert_eq!(start.elapsed(), ms(900));
    let o = *res.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!(o.outcome(), Outcome::Deadline);
    assert_eq!(o.attempts(), 4);
    assert_eq!(o.total_delay(), ms(100 + 200 + 400));
    // The handler's marked 503 had no Retry-After; the layer adds one when it gives up.
    let after: u32 = res.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&after), "{after}");
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_future_stops_further_attempts() {
    // A request dropped during its replay holds everything a request can hold: the route's
    // slot (its first attempt collided; writer admission needs the route template, so this
    // one runs in a router), the gate's one permit (a replay is running) and its buffered
    // body. `hang` requests fail once, then hang in their replay.
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let layer = SqliteRetryLayer::new(fast());
    let metrics = layer.metrics();
    let handler = move |attempt: Attempt, headers: http::HeaderMap| {
        let hang = headers.contains_key("hang");
        if hang {
            c.fetch_add(1, Ordering::SeqCst);
            // A task of the handler's keeps its `Attempt` (and so the request's state) alive
            // past the request: the slot must come back all the same.
            let kept = attempt.clone();
            tokio::spawn(async move {
                let _kept = kept;
                std::future::pending::<()>().await;
            });
        }
        async move {
            if !attempt.is_replay() {
                return busy();
            }
            if hang {
                std::future::pending::<()>().await;
            }
            ok()
        }
    };
    let app = axum::Router::new()
        .route("/", axum::routing::post(handler))
        .layer(layer);
    let hanging = Request::post("/")
        .header("hang", "1")
        .body(Body::from("x"))
        .unwrap();
    let mut fut = Box::pin(app.clone().oneshot(hanging));
    for _ in 0..3 {
        assert!(futures::poll!(&mut fut).is_pending());
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2, "in its replay");
    assert_eq!(metrics.snapshot().buffered_bytes, 1);
    drop(fut);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(calls.load(Ordering::SeqCst), 2, "no attempt after the drop");
    let m = metrics.snapshot();
    assert_eq!((m.cancelled, m.finished()), (1, 1), "counted, as cancelled");
    assert_eq!(m.buffered_bytes, 0, "its buffered bytes given back");
    // The slot and the gate permit came back: the next request passes both at once (were
    // either kept, it would wait out its deadline: 503), and its replay too.
    let res = app.oneshot(req()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let o = res.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!(
        (o.outcome(), o.attempts()),
        (Outcome::SucceededAfterRetry, 2)
    );
    assert_eq!(metrics.snapshot().queued, 0, "never queued for the slot");
}

#[tokio::test]
async fn fence_stops_replays() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let inner = tower::service_fn(move |req: Request<ReplayBody<Body>>| {
        c.fetch_add(1, Ordering::SeqCst);
        let attempt = req.extensions().get::<Attempt>().unwrap().clone();
        async move {
            attempt.fence(); // "committed": a replay is unsafe now
            Ok::<_, Infallible>(busy())
        }
    });
    let layer = SqliteRetryLayer::new(fast());
    let metrics = layer.metrics();
    let res = ServiceBuilder::new()
        .layer(layer)
        .service(inner)
        .oneshot(req())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        res.extensions().get::<RetryOutcome>().unwrap().outcome(),
        Outcome::Fenced
    );
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(metrics.snapshot().fenced, 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Over arbitrary policies and handler times: attempts ≤ max, no sleep ends past the
    /// deadline (so the request ends by deadline + one handler time), every delay ≤ cap.
    #[test]
    fn deadline_and_attempts_are_never_overrun(
        attempts in 1u32..20,
        base_ms in 0u64..200,
        extra_ms in 0u64..2000,
        deadline_ms in 1u64..5000,
        handler_ms in 0u64..300,
        jitter in prop_oneof![Just(Jitter::None), Just(Jitter::Full), Just(Jitter::Equal), Just(Jitter::Decorrelated)],
    ) {
        let ms = Duration::from_millis;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let policy = RetryPolicy::default()
                .max_attempts(attempts)
                .base_delay(ms(base_ms))
                .max_delay(ms(base_ms + extra_ms))
                .jitter(jitter)
                .deadline(ms(deadline_ms));
            let calls = Arc::new(AtomicU32::new(0));
            let svc = ServiceBuilder::new()
                .layer(SqliteRetryLayer::new(policy))
                .service(slow_busy(ms(handler_ms), calls.clone()));
            let start = Instant::now();
            let res = svc.oneshot(req()).await.unwrap();
            let elapsed = start.elapsed();
            let o = *res.extensions().get::<RetryOutcome>().unwrap();
            prop_assert!(o.attempts() <= attempts);
            prop_assert_eq!(o.attempts(), calls.load(Ordering::SeqCst));
            prop_assert!(elapsed <= ms(deadline_ms + handler_ms), "{:?} > deadline", elapsed);
            prop_assert!(o.total_delay() <= ms(deadline_ms));
            prop_assert!(o.total_delay() <= ms(base_ms + extra_ms) * (o.attempts() - 1).max(1));
            Ok(())
        })?;
    }
}
