//! Reliability and safety: the retry budget's bound, cancellation over real HTTP, memory
//! bounds under 200 concurrent uploads, panics, bad input, extremes.

use crate::common;

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::routing::{any, post};
use axum::{Json, Router};
use futures::future::join_all;
use futures::stream;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::StreamBody;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tower::retry::budget::TpsBudget;
use tower::{ServiceBuilder, ServiceExt};
use tower_http::catch_panic::CatchPanicLayer;
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

use common::{HttpClient, serve};

fn busy() -> Response<Body> {
    let mut res = Response::new(Body::from("busy"));
    *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::ZERO)
        .max_delay(Duration::from_micros(100))
}

/// Sends `requests` requests through a layer with `budget` to a service whose every attempt
/// fails retryably, each answered by its own 503; returns the counters and the handler calls.
async fn under_total_failure(
    budget: TpsBudget,
    attempts: u32,
    requests: u64,
) -> (tower_sqlite_retry::metrics::MetricsSnapshot, u64) {
    let layer = SqliteRetryLayer::new(quick(attempts).budget(Arc::new(budget)));
    let metrics = layer.metrics();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(tower::service_fn(move |_: Request<ReplayBody<Body>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(busy()) }
        }));
    for _ in 0..requests {
        let res = svc
            .clone()
            .oneshot(Request::get("/").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    (metrics.snapshot(), u64::from(calls.load(Ordering::SeqCst)))
}

#[tokio::test]
async fn budget_bounds_retries_under_total_failure() {
    // tower's TpsBudget: 20% of requests plus 10 per second over its 10 s window.
    let requests = 500u64;
    let budget = TpsBudget::new(Duration::from_secs(10), 10, 0.2);
    let (snap, calls) = under_total_failure(budget, 10, requests).await;
    let bound = requests / 5 + 10 * 10;
    eprintln!(
        "budget: {} requests, {} retries (bound {bound}; without a budget: {})",
        requests,
        snap.retries,
        requests * 9
    );
    assert!(snap.retries <= bound, "{snap:?}");
    assert!(
        snap.retries >= bound / 2,
        "the budget allows its share: {snap:?}"
    );
    assert_eq!(
        snap.budget_exhausted + snap.exhausted,
        requests,
        "every request ends with its own 503"
    );
    assert_eq!(calls, requests + snap.retries);
}

#[tokio::test]
async fn budget_bounds_retries() {
    // 0% of traffic, 1 retry per second over tower's 10 s window: a reserve of 10 retries.
    let budget = TpsBudget::new(Duration::from_secs(10), 1, 0.0);
    let (snap, calls) = under_total_failure(budget, 5, 100).await;
    assert!(snap.retries <= 10, "{snap:?}");
    assert!(snap.retries > 0, "{snap:?}");
    assert!(snap.budget_exhausted >= 90, "{snap:?}");
    assert_eq!(calls, 100 + snap.retries);
}

#[tokio::test]
async fn a_budget_is_shared_by_clones_and_by_layers_given_the_same_one() {
    let budget = Arc::new(TpsBudget::new(Duration::from_secs(10), 1, 0.0)); // 10 retries
    let a = SqliteRetryLayer::new(quick(3).budget(budget.clone()));
    let b = SqliteRetryLayer::new(quick(3).budget(budget));
    let (ma, mb) = (a.metrics(), b.metrics());
    let app = Router::new()
        .route("/a", any(|| async { busy() }).layer(a.clone()))
        .route("/b", any(|| async { busy() }).layer(b));
    for i in 0..40 {
        let uri = if i % 2 == 0 { "/a" } else { "/b" };
        app.clone()
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
    }
    let total = ma.snapshot().retries + mb.snapshot().retries;
    assert!(total <= 10, "one budget for both layers: {total}");
    assert!(ma.snapshot().retries > 0 && mb.snapshot().retries > 0);
}

#[tokio::test]
async fn client_disconnect_during_backoff_stops_further_attempts() {
    let calls = Arc::new(AtomicU32::new(0));
    let (failed_tx, mut failed_rx) = tokio::sync::mpsc::unbounded_channel();
    let c = calls.clone();
    // A backoff far longer than the test: the disconnect falls inside it on any machine.
    let slow = RetryPolicy::default()
        .max_attempts(10)
        .base_delay(Duration::from_secs(600))
        .max_delay(Duration::from_secs(600))
        .deadline(Duration::from_secs(7200))
        .jitter(Jitter::None);
    let layer = SqliteRetryLayer::new(slow);
    let metrics = layer.metrics();
    let handler = move || {
        let c = c.clone();
        let failed_tx = failed_tx.clone();
        async move {
            c.fetch_add(1, Ordering::SeqCst);
            let _ = failed_tx.send(());
            busy()
        }
    };
    let app = Router::new()
        .route("/slow", post(handler.clone()).layer(layer))
        .route(
            "/quick",
            post(handler).layer(SqliteRetryLayer::new(quick(10))),
        );
    let server = serve(app).await;

    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(b"POST /slow HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\nhi")
        .await
        .unwrap();
    failed_rx.recv().await.unwrap();
    drop(stream); // the client leaves during the first backoff

    // The server notices, drops the layer's future, and the layer counts it cancelled.
    tokio::time::timeout(Duration::from_secs(20), async {
        while metrics.snapshot().cancelled == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("the request was cancelled");
    let snap = metrics.snapshot();
    assert_eq!(snap.retries, 0, "no replay started after the disconnect");
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "no attempt after the disconnect"
    );

    // Control: a client that stays gets every attempt.
    let mut stream = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    stream
        .write_all(
            b"POST /quick HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\nconnection: close\r\n\r\nhi",
        )
        .await
        .unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    assert!(reply.starts_with(b"HTTP/1.1 503"));
    assert_eq!(calls.load(Ordering::SeqCst), 11);
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_uploads_stay_under_the_in_flight_cap() {
    const MIB: usize = 1024 * 1024;
    let policy = RetryPolicy::default(); // 1 MiB per request, 16 MiB in flight
    let layer = SqliteRetryLayer::new(policy);
    let metrics = layer.metrics();
    let max_seen = Arc::new(AtomicUsize::new(0));
    let m = metrics.clone();
    let seen = max_seen.clone();
    let app = Router::new()
        .route(
            "/upload/{seed}",
            post(
                move |axum::extract::Path(seed): axum::extract::Path<u8>, body: Bytes| {
                    let m = m.clone();
                    let seen = seen.clone();
                    async move {
                        seen.fetch_max(m.snapshot().buffered_bytes, Ordering::SeqCst);
                        // Keep requests in flight together.
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        if body[..] == pattern(seed, MIB)[..] {
                            StatusCode::OK
                        } else {
                            StatusCode::UNPROCESSABLE_ENTITY
                        }
                    }
                },
            ),
        )
        .layer(layer);
    let server = serve(app).await;
    let uploads = (0..200u32).map(|i| {
        let client = HttpClient::new(server.addr);
        async move {
            let seed = (i % 251) as u8;
            client
                .send(
                    Request::post(format!("/upload/{seed}"))
                        .body(Body::from(pattern(seed, MIB)))
                        .unwrap(),
                )
                .await
                .status
        }
    });
    let statuses = join_all(uploads).await;
    assert_eq!(statuses.len(), 200);
    assert!(
        statuses.iter().all(|s| *s == StatusCode::OK),
        "every upload answered, every body intact: {statuses:?}"
    );
    let snap = metrics.snapshot();
    eprintln!(
        "uploads: peak buffered {} bytes (cap {}), max seen by handlers {}, buffered now {}, peak RSS {:?} KiB",
        snap.peak_buffered_bytes,
        16 * MIB,
        max_seen.load(Ordering::SeqCst),
        snap.buffered_bytes,
        peak_rss_kib()
    );
    assert!(snap.peak_buffered_bytes <= 16 * MIB);
    assert!(max_seen.load(Ordering::SeqCst) <= 16 * MIB);
    assert!(snap.peak_buffered_bytes > 0, "some uploads were buffered");
    assert_eq!(snap.buffered_bytes, 0, "all released");
}

#[tokio::test]
async fn a_panicking_handler_leaves_the_accounting_intact() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let policy = quick(3).replay_gate(1);
    let layer = SqliteRetryLayer::new(policy);
    let metrics = layer.metrics();
    let app = Router::new()
        .route(
            "/p",
            post(move |attempt: Attempt, body: Bytes| {
                let c = c.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    if attempt.number() == 1 {
                        return busy();
                    }
                    if &body[..] == b"panic" {
                        panic!("handler panicked on a replay, holding the replay gate");
                    }
                    Response::new(Body::from("ok"))
                }
            }),
        )
        .layer(layer)
        .layer(CatchPanicLayer::new());
    let res = app
        .clone()
        .oneshot(Request::post("/p").body(Body::from("panic")).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        metrics.snapshot().buffered_bytes,
        0,
        "buffer released on unwind"
    );
    // The gate permit was released too: another request's replay passes it.
    let res = tokio::time::timeout(
        Duration::from_secs(10),
        app.oneshot(Request::post("/p").body(Body::from("fine")).unwrap()),
    )
    .await
    .expect("the replay gate was not leaked")
    .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let snap = metrics.snapshot();
    assert_eq!(snap.requests, 2);
    assert_eq!(snap.retries, 2);
    assert_eq!(snap.succeeded_after_retry, 1);
    assert_eq!(snap.buffered_bytes, 0);
}

#[derive(serde::Deserialize)]
struct NewItem {
    #[allow(dead_code)]
    name: String,
}

#[tokio::test]
async fn malformed_json_is_a_4xx_and_never_retried() {
    let calls = Arc::new(AtomicU32::new(0));
    let layer = SqliteRetryLayer::new(quick(5));
    let metrics = layer.metrics();
    let app = Router::new()
        .route(
            "/items",
            post(
                |State(calls): State<Arc<AtomicU32>>, Json(_): Json<NewItem>| async move {
                    calls.fetch_add(1, Ordering::SeqCst);
                    Err::<(), _>(DbError::from(sqlx::Error::PoolTimedOut))
                },
            ),
        )
        .layer(layer)
        .with_state(calls.clone());
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    for body in ["{", "[]", "{\"name\": 5}", "\u{0}"] {
        let reply = client.post("/items", body).await;
        assert!(reply.status.is_client_error(), "{body:?}: {}", reply.status);
    }
    let reply = client
        .send(
            Request::post("/items")
                .header("content-type", "text/plain")
                .body(Body::from("{\"name\":\"x\"}"))
                .unwrap(),
        )
        .await;
    assert_eq!(reply.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert_eq!(metrics.snapshot().retries, 0);
}

#[tokio::test]
async fn head_options_connect_and_upgrade_behave() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let app = Router::new()
        .route(
            "/x",
            any(move |attempt: Attempt| {
                let c = c.clone();
                async move {
                    c.fetch_add(1, Ordering::SeqCst);
                    if attempt.number() == 1 {
                        busy()
                    } else {
                        Response::new(Body::from("ok"))
                    }
                }
            }),
        )
        .layer(SqliteRetryLayer::new(quick(3)));
    let call = |method: Method, upgrade: bool| {
        let app = app.clone();
        async move {
            let mut req = Request::builder().method(method).uri("/x");
            if upgrade {
                req = req
                    .header("connection", "upgrade")
                    .header("upgrade", "websocket");
            }
            let res = app.oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
            (
                res.status(),
                *res.extensions().get::<RetryOutcome>().unwrap(),
            )
        }
    };
    for method in [Method::HEAD, Method::OPTIONS, Method::GET, Method::DELETE] {
        let (status, o) = call(method.clone(), false).await;
        assert_eq!(status, StatusCode::OK, "{method}");
        assert_eq!(o.outcome(), Outcome::SucceededAfterRetry, "{method}");
    }
    for (method, upgrade) in [(Method::CONNECT, false), (Method::GET, true)] {
        let (status, o) = call(method.clone(), upgrade).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{method}");
        assert_eq!(o.outcome(), Outcome::NotReplayable, "{method}");
        assert_eq!(o.attempts(), 1);
    }
}

#[test]
fn invalid_policies_are_refused_with_reasons() {
    let cases = [
        (RetryPolicy::default().max_attempts(0), "max_attempts is 0"),
        (
            RetryPolicy::default()
                .base_delay(Duration::from_secs(1))
                .max_delay(Duration::from_millis(1)),
            "base_delay",
        ),
        (
            RetryPolicy::default().deadline(Duration::ZERO),
            "deadline is zero",
        ),
        (
            RetryPolicy::default().max_buffered_bytes(10),
            "max_body_bytes",
        ),
        (RetryPolicy::default().replay_gate(0), "replay_gate"),
    ];
    for (policy, why) in cases {
        let err = SqliteRetryLayer::try_new(policy).unwrap_err().to_string();
        assert!(err.starts_with("invalid retry policy: "), "{err}");
        assert!(err.contains(why), "{err}");
    }
    let panic = std::panic::catch_unwind(|| {
        SqliteRetryLayer::new(RetryPolicy::default().max_attempts(0));
    })
    .unwrap_err();
    let msg = panic.downcast_ref::<String>().unwrap();
    assert!(msg.contains("max_attempts is 0"), "{msg}");
}

#[tokio::test(start_paused = true)]
async fn extreme_policies_neither_overflow_nor_panic() {
    let policy = RetryPolicy::default()
        .max_attempts(u32::MAX)
        .base_delay(Duration::MAX)
        .max_delay(Duration::MAX)
        .deadline(Duration::MAX);
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(policy))
        .service(tower::service_fn(move |_: Request<ReplayBody<Body>>| {
            let n = c.fetch_add(1, Ordering::SeqCst);
            async move {
                Ok::<_, Infallible>(if n < 3 {
                    busy()
                } else {
                    Response::new(Body::empty())
                })
            }
        }));
    let res = svc
        .oneshot(Request::post("/").body(Body::from("x")).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(calls.load(Ordering::SeqCst), 4);
}

fn chunked(chunks: Vec<Vec<u8>>) -> Body {
    Body::new(StreamBody::new(stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(Bytes::from(c)))),
    )))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Bodies around the cap, cut at arbitrary boundaries: the handler receives exactly the
    /// bytes sent, on every attempt; bodies over the cap are not replayed.
    #[test]
    fn any_chunking_reaches_the_handler_intact(
        len in 0usize..3000,
        cuts in proptest::collection::vec(0usize..3000, 0..12),
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let payload = pattern(7, len);
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|c| *c < len).collect();
            cuts.sort_unstable();
            cuts.dedup();
            let mut chunks = Vec::new();
            let mut start = 0;
            for c in cuts.into_iter().chain([len]) {
                chunks.push(payload[start..c].to_vec());
                start = c;
            }
            let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
            let s = seen.clone();
            let app = Router::new()
                .route("/u", post(move |attempt: Attempt, body: Bytes| {
                    let s = s.clone();
                    async move {
                        s.lock().unwrap().push(body);
                        if attempt.number() < attempt.max() { busy() } else { Response::new(Body::empty()) }
                    }
                }))
                .layer(SqliteRetryLayer::new(quick(2).max_body_bytes(1024).max_buffered_bytes(1024)));
            let res = app.oneshot(Request::post("/u").body(chunked(chunks)).unwrap()).await.unwrap();
            let outcome = *res.extensions().get::<RetryOutcome>().unwrap();
            let seen = seen.lock().unwrap().clone();
            for body in &seen {
                prop_assert_eq!(&body[..], &payload[..]);
            }
            if len > 1024 {
                prop_assert_eq!(seen.len(), 1);
                prop_assert_eq!(outcome.outcome(), Outcome::NotReplayable);
            } else {
                prop_assert_eq!(seen.len(), 2);
                prop_assert_eq!(outcome.outcome(), Outcome::SucceededAfterRetry);
            }
            Ok(())
        })?;
    }
}
