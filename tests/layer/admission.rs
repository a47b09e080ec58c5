//! Writer admission: a route is queued only once it has met contention, first come first
//! served, within the deadline; routes that never fail retryably are never queued.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{Request, StatusCode};
use tower::{ServiceBuilder, ServiceExt};
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::policy::Admission;
use tower_sqlite_retry::{Attempt, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

fn busy() -> Response {
    let mut res = StatusCode::SERVICE_UNAVAILABLE.into_response();
    res.extensions_mut()
        .insert(Retryable::new("517", "SQLITE_BUSY_SNAPSHOT"));
    res
}

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(5)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(1))
        .jitter(Jitter::None)
}

#[derive(Clone, Default)]
struct Probe {
    /// Fail the next attempt retryably.
    fail_next: Arc<AtomicBool>,
    in_flight: Arc<AtomicU32>,
    max_in_flight: Arc<AtomicU32>,
    order: Arc<Mutex<Vec<String>>>,
}

impl Probe {
    async fn work(&self, name: String) -> Response {
        if self.fail_next.swap(false, Ordering::SeqCst) {
            return busy();
        }
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        self.order.lock().unwrap().push(name);
        tokio::time::sleep(Duration::from_millis(10)).await;
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        StatusCode::OK.into_response()
    }

    fn take_max(&self) -> u32 {
        self.max_in_flight.swap(0, Ordering::SeqCst)
    }
}

fn app(layer: SqliteRetryLayer, probe: Probe) -> Router {
    Router::new()
        .route(
            "/w/{id}",
            post(|State(p): State<Probe>, axum::extract::Path(id): axum::extract::Path<String>| async move {
                p.work(id).await
            }),
        )
        .route(
            "/r/{id}",
            get(|State(p): State<Probe>, axum::extract::Path(id): axum::extract::Path<String>| async move {
                p.work(id).await
            }),
        )
        .layer(layer)
        .with_state(probe)
}

/// `handler` at the route template `/{name}`, under `layer` (and a second clone of it when
/// `nested`): writer admission limits only routes the router names.
fn routed<H, T>(layer: &SqliteRetryLayer, nested: bool, handler: H) -> Router
where
    H: axum::handler::Handler<T, ()>,
    T: 'static,
{
    let router = Router::new()
        .route("/{name}", post(handler))
        .layer(layer.clone());
    if nested {
        router.layer(layer.clone())
    } else {
        router
    }
}

/// `METHOD route: limit` for each limited route.
fn limits(layer: &SqliteRetryLayer) -> Vec<String> {
    layer
        .metrics()
        .admission_limits()
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Sends `n` requests, each one only once the one before is queued (or running), so that
/// their arrival order is known; returns their answers.
async fn burst(app: &Router, method: &str, prefix: &str, n: usize) -> Vec<Response> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let req = Request::builder()
            .method(method)
            .uri(format!("{prefix}/{i}"))
            .body(Body::empty())
            .unwrap();
        tasks.push(tokio::spawn(app.clone().oneshot(req)));
        // Let it reach the handler or the queue before the next one comes.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap().unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn a_route_is_queued_only_after_it_collides() {
    let layer = SqliteRetryLayer::new(policy());
    let probe = Probe::default();
    let app = app(layer.clone(), probe.clone());

    // No contention yet: writes and reads run side by side, nobody waits.
    burst(&app, "POST", "/w", 5).await;
    assert_eq!(probe.take_max(), 5);
    assert!(layer.metrics().admission_limits().is_empty());
    assert_eq!(layer.metrics().snapshot().queued, 0);

    // One write meets contention: its route gets a limit of one attempt in flight.
    probe.fail_next.store(true, Ordering::SeqCst);
    let res = app
        .clone()
        .oneshot(Request::post("/w/x").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.extensions().get::<RetryOutcome>().unwrap().outcome(),
        Outcome::SucceededAfterRetry
    );
    assert_eq!(limits(&layer), ["POST /w/{id}: 1"]);
    let route = &layer.metrics().admission_limits()[0];
    assert_eq!(
        (route.method(), route.route(), route.limit(), route.held()),
        (Some(&http::Method::POST), "/w/{id}", 1, 0)
    );
    probe.take_max();
    probe.order.lock().unwrap().clear();

    // Now writes take turns, first come first served; the wait is counted.
    let answers = burst(&app, "POST", "/w", 5).await;
    assert!(answers.iter().all(|r| r.status() == StatusCode::OK));
    assert_eq!(probe.take_max(), 1, "one write at a time");
    assert_eq!(
        *probe.order.lock().unwrap(),
        ["0", "1", "2", "3", "4"],
        "in arrival order"
    );
    assert_eq!(layer.metrics().snapshot().queued, 4);

    // Reads never met contention: never queued.
    burst(&app, "GET", "/r", 5).await;
    assert_eq!(probe.take_max(), 5);
    assert_eq!(layer.metrics().snapshot().queued, 4);
    assert_eq!(layer.metrics().admission_limits().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn admission_off_never_queues() {
    let layer = SqliteRetryLayer::new(policy().admission(Admission::Off));
    let probe = Probe::default();
    let app = app(layer.clone(), probe.clone());
    probe.fail_next.store(true, Ordering::SeqCst);
    burst(&app, "POST", "/w", 5).await;
    burst(&app, "POST", "/w", 5).await;
    assert_eq!(probe.take_max(), 5);
    assert!(layer.metrics().admission_limits().is_empty());
    assert_eq!(layer.metrics().snapshot().queued, 0);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait_for_a_slot() {
    let ms = Duration::from_millis;
    let layer = SqliteRetryLayer::new(policy().deadline(ms(1000)));
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = routed(&layer, false, move |req: Request<Body>| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                return busy();
            }
            if req.uri().path() == "/slow" {
                tokio::time::sleep(ms(5000)).await;
            }
            StatusCode::OK.into_response()
        }
    });
    // The first request meets contention, and so limits the route.
    let first = svc
        .clone()
        .oneshot(Request::post("/x").body(Body::empty()).unwrap());
    assert_eq!(first.await.unwrap().status(), StatusCode::OK);
    // A slow one holds the slot for 5 s; the next gives up waiting at its deadline.
    let slow = tokio::spawn(
        svc.clone()
            .oneshot(Request::post("/slow").body(Body::empty()).unwrap()),
    );
    tokio::task::yield_now().await;
    let start = tokio::time::Instant::now();
    let res = svc
        .clone()
        .oneshot(Request::post("/x").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(start.elapsed(), ms(1000));
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(res.headers().contains_key(http::header::RETRY_AFTER));
    let o = *res.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!((o.outcome(), o.attempts()), (Outcome::Deadline, 0));
    assert_eq!(slow.await.unwrap().unwrap().status(), StatusCode::OK);
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the one that gave up never ran"
    );
}

#[tokio::test(start_paused = true)]
async fn a_layer_nested_in_itself_never_waits_for_its_own_slot() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let layer = SqliteRetryLayer::new(policy());
    let svc = routed(&layer, true, move || {
        let n = c.fetch_add(1, Ordering::SeqCst);
        async move {
            if n == 0 {
                Err(tower_sqlite_retry::DbError::from(sqlx::Error::PoolTimedOut))
            } else {
                Ok(StatusCode::OK)
            }
        }
    });
    for _ in 0..3 {
        let res = tokio::time::timeout(
            Duration::from_secs(60),
            svc.clone()
                .oneshot(Request::post("/x").body(Body::empty()).unwrap()),
        )
        .await
        .expect("no deadlock on the route's one slot");
        assert_eq!(res.unwrap().status(), StatusCode::OK);
    }
    assert_eq!(limits(&layer), ["POST /{name}: 1"]);
}

/// The handler of the fence tests. Its first call fails retryably (the route gets one slot).
/// `/a` fences (its transaction committed), says so, then runs on (its response, say) until
/// the test sends `finish`. `/w` counts how many run at once.
#[derive(Clone)]
struct Fencing {
    calls: Arc<AtomicU32>,
    fenced: Arc<tokio::sync::Notify>,
    finish: Arc<Mutex<Option<tokio::sync::oneshot::Receiver<()>>>>,
    in_flight: Arc<AtomicU32>,
    max_in_flight: Arc<AtomicU32>,
}

impl Fencing {
    fn new() -> (Self, tokio::sync::oneshot::Sender<()>) {
        let (finish_tx, finish_rx) = tokio::sync::oneshot::channel();
        let fencing = Self {
            calls: Arc::default(),
            fenced: Arc::default(),
            finish: Arc::new(Mutex::new(Some(finish_rx))),
            in_flight: Arc::default(),
            max_in_flight: Arc::default(),
        };
        (fencing, finish_tx)
    }

    /// Answers one attempt (the request's path and its `Attempt`).
    async fn handle(self, path: String, attempt: Attempt) -> Result<Response, Infallible> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Ok(busy());
        }
        if path == "/a" {
            attempt.fence();
            self.fenced.notify_one();
            let finish = self.finish.lock().unwrap().take().unwrap();
            finish.await.unwrap();
        }
        if path == "/w" {
            let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_in_flight.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(10)).await;
            self.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        Ok(StatusCode::OK.into_response())
    }

    /// Limits the route, then has `/a` fence and hold on while `/b` comes: `/b` must get the
    /// slot at once. Were it still held by `/a`, `/b` would wait out its deadline (the paused
    /// clock gets there as soon as nothing else can run) and answer 503.
    async fn fence_lets_the_next_one_in<S>(
        &self,
        svc: &S,
        layer: &SqliteRetryLayer,
        finish: tokio::sync::oneshot::Sender<()>,
    ) where
        S: tower::Service<Request<Body>, Response = Response, Error = Infallible>
            + Clone
            + Send
            + 'static,
        S::Future: Send,
    {
        let post = |path: &str| Request::post(path).body(Body::empty()).unwrap();
        assert_eq!(
            svc.clone().oneshot(post("/x")).await.unwrap().status(),
            StatusCode::OK
        );
        assert_eq!(limits(layer), ["POST /{name}: 1"]);
        let a = tokio::spawn(svc.clone().oneshot(post("/a")));
        self.fenced.notified().await;
        let b = svc.clone().oneshot(post("/b")).await.unwrap();
        assert_eq!(b.status(), StatusCode::OK, "/b got the slot /a fenced");
        assert!(b.extensions().get::<RetryOutcome>().is_none(), "first try");
        assert!(!a.is_finished());
        finish.send(()).unwrap();
        assert_eq!(a.await.unwrap().unwrap().status(), StatusCode::OK);
    }
}

fn path_and_attempt(req: &Request<Body>) -> (String, Attempt) {
    let attempt = req.extensions().get::<Attempt>().cloned().unwrap();
    (req.uri().path().to_owned(), attempt)
}

#[tokio::test(start_paused = true)]
async fn the_fence_gives_the_slot_back_before_the_handler_ends() {
    let layer = SqliteRetryLayer::new(policy());
    let (fencing, finish) = Fencing::new();
    let f = fencing.clone();
    let svc = routed(&layer, false, move |req: Request<Body>| {
        let (path, attempt) = path_and_attempt(&req);
        f.clone().handle(path, attempt)
    });
    fencing
        .fence_lets_the_next_one_in(&svc, &layer, finish)
        .await;

    // The slot came back once, not twice: the route still runs one request at a time.
    let waves: Vec<_> = (0..5)
        .map(|_| {
            let req = Request::post("/w").body(Body::empty()).unwrap();
            tokio::spawn(svc.clone().oneshot(req))
        })
        .collect();
    for w in waves {
        assert_eq!(w.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(fencing.max_in_flight.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_holding_a_slot_alone_backs_off_as_any_other() {
    // Fails its first five attempts, then answers: delays without jitter, 2 ms doubling to
    // 100 ms; a request that holds a slot backs off at most 4 × 2 ms.
    async fn total_delay(admission: Admission) -> Duration {
        let calls = Arc::new(AtomicU32::new(0));
        let c = calls.clone();
        let policy = RetryPolicy::default()
            .max_attempts(10)
            .base_delay(Duration::from_millis(2))
            .max_delay(Duration::from_millis(100))
            .jitter(Jitter::None)
            .admission(admission);
        let svc = routed(&SqliteRetryLayer::new(policy), false, move || {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 5 {
                    busy()
                } else {
                    StatusCode::OK.into_response()
                }
            }
        });
        let res = svc
            .oneshot(Request::post("/x").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let o = *res.extensions().get::<RetryOutcome>().unwrap();
        assert_eq!(o.attempts(), 6);
        o.total_delay()
    }
    let ms = Duration::from_millis;
    // The first failure limits the route; the request holds a slot from its second attempt,
    // but nobody queues behind it: its backoff grows as any request's does (the short one,
    // while others wait, is tested in tests/layer/waiting_out.rs).
    assert_eq!(
        total_delay(Admission::Adaptive).await,
        ms(2) + ms(4) + ms(8) + ms(16) + ms(32)
    );
    assert_eq!(
        total_delay(Admission::Off).await,
        ms(2) + ms(4) + ms(8) + ms(16) + ms(32)
    );
}

#[tokio::test(start_paused = true)]
async fn an_attempt_kept_by_a_spawned_task_does_not_keep_the_slot() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = routed(
        &SqliteRetryLayer::new(policy()),
        false,
        move |req: Request<Body>| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            // The handler hands its `Attempt` to a task that outlives the request.
            let attempt = req.extensions().get::<Attempt>().cloned().unwrap();
            tokio::spawn(async move {
                let _kept = attempt;
                std::future::pending::<()>().await
            });
            let hang = req.uri().path() == "/hang";
            async move {
                if hang {
                    std::future::pending::<()>().await;
                }
                Ok::<_, Infallible>(if n == 0 {
                    busy()
                } else {
                    StatusCode::OK.into_response()
                })
            }
        },
    );
    // The first request limits the route; each later one takes the slot and ends (or is
    // dropped, by a timeout outside). Were the slot still held by the tasks' `Attempt`s, the
    // next request would wait out its deadline.
    let hung = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone()
            .oneshot(Request::post("/x").body(Body::empty()).unwrap()),
    );
    assert_eq!(hung.await.unwrap().unwrap().status(), StatusCode::OK);
    let hung = tokio::time::timeout(
        Duration::from_secs(1),
        svc.clone()
            .oneshot(Request::post("/hang").body(Body::empty()).unwrap()),
    );
    assert!(hung.await.is_err(), "dropped by the timeout");
    for _ in 0..3 {
        let res = svc
            .clone()
            .oneshot(Request::post("/x").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 6);
}

#[tokio::test(start_paused = true)]
async fn in_a_layer_nested_in_itself_the_fence_gives_the_outer_slot_back() {
    // The outer clone takes `/a`'s slot (the inner one then skips its own); the handler's
    // fence reaches the inner clone's request state, and through it the outer's slot.
    let layer = SqliteRetryLayer::new(policy());
    let (fencing, finish) = Fencing::new();
    let f = fencing.clone();
    let svc = routed(&layer, true, move |req: Request<Body>| {
        let (path, attempt) = path_and_attempt(&req);
        f.clone().handle(path, attempt)
    });
    fencing
        .fence_lets_the_next_one_in(&svc, &layer, finish)
        .await;
}

#[tokio::test(start_paused = true)]
async fn a_fence_during_the_backoff_stops_the_replay() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let policy = policy()
        .base_delay(Duration::from_millis(100))
        .max_delay(Duration::from_millis(100));
    let layer = SqliteRetryLayer::new(policy);
    let svc = ServiceBuilder::new().layer(layer.clone()).service_fn(
        move |req: Request<ReplayBody<Body>>| {
            c.fetch_add(1, Ordering::SeqCst);
            // The handler's side effect completes in a task of its own, 1 ms after the
            // handler answered (retryably): inside the 100 ms backoff.
            let attempt = req.extensions().get::<Attempt>().cloned().unwrap();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(1)).await;
                attempt.fence();
            });
            async move { Ok::<_, Infallible>(busy()) }
        },
    );
    let res = svc
        .oneshot(Request::post("/").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!res.headers().contains_key(http::header::RETRY_AFTER));
    let o = *res.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!((o.outcome(), o.attempts()), (Outcome::Fenced, 1));
    assert_eq!(calls.load(Ordering::SeqCst), 1, "no replay after the fence");
    assert_eq!(layer.metrics().snapshot().fenced, 1);
}

/// Finding: without a route template (a plain tower or hyper service, a layer outside the
/// `Router`, the fallback) every request of a method shared one limit, so one collision on
/// one path queued every `POST` of the service. Now such requests are replayed, never queued.
#[tokio::test(start_paused = true)]
async fn without_a_route_template_requests_are_replayed_but_never_queued() {
    let layer = SqliteRetryLayer::new(policy());
    let probe = Probe::default();
    let p = probe.clone();
    let svc = ServiceBuilder::new().layer(layer.clone()).service_fn(
        move |req: Request<ReplayBody<Body>>| {
            let p = p.clone();
            async move { Ok::<_, Infallible>(p.work(req.uri().path().to_owned()).await) }
        },
    );
    // One request on one path meets contention, and is replayed.
    probe.fail_next.store(true, Ordering::SeqCst);
    let res = svc
        .clone()
        .oneshot(Request::post("/orders").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<RetryOutcome>().unwrap().outcome(),
        Outcome::SucceededAfterRetry
    );
    probe.take_max();
    // Writes to another path run side by side.
    let tasks: Vec<_> = (0..5)
        .map(|i| {
            let req = Request::post(format!("/receipts/{i}"))
                .body(Body::empty())
                .unwrap();
            tokio::spawn(svc.clone().oneshot(req))
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap().status(), StatusCode::OK);
    }
    assert_eq!(probe.take_max(), 5, "nobody was queued behind /orders");
    assert_eq!(layer.metrics().snapshot().queued, 0);
    assert!(limits(&layer).is_empty(), "{:?}", limits(&layer));
}

/// Finding: the limits were keyed by any method, so on an `any()` route each method a client
/// invented that met one retryable failure added an entry for good. Now only the nine
/// standard methods get a limit; the others are still replayed.
#[tokio::test(start_paused = true)]
async fn invented_methods_never_grow_the_admission_map() {
    let layer = SqliteRetryLayer::new(policy());
    // Every request's first attempt collides.
    let app = Router::new()
        .route(
            "/any",
            axum::routing::any(|attempt: Attempt| async move {
                if attempt.number() == 1 {
                    busy()
                } else {
                    StatusCode::OK.into_response()
                }
            }),
        )
        .layer(layer.clone());
    let mut methods: Vec<_> = (0..50).map(|i| format!("M{i}")).collect();
    methods.push("POST".to_owned());
    for method in &methods {
        let req = Request::builder()
            .method(method.as_str())
            .uri("/any")
            .body(Body::empty())
            .unwrap();
        let res = app.clone().oneshot(req).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{method}");
        assert_eq!(
            res.extensions().get::<RetryOutcome>().unwrap().outcome(),
            Outcome::SucceededAfterRetry,
            "{method} is replayed"
        );
    }
    assert_eq!(limits(&layer), ["POST /any: 1"]);
}
