//! The tower-http stack people really run, over real TCP on loopback. Every case runs the same
//! request against the same stack with and without `SqliteRetryLayer`, in one test, and the
//! client must see the same thing (status, headers, body) apart from the replays.
//!
//! # Where each layer sits, and why
//!
//! Outside the retry layer (they wrap it: `Router::layer` calls after the retry layer's),
//! outermost first:
//!
//! - `TraceLayer`: one span and one response log per HTTP request; the layer's replays are
//!   events inside that span. Inside, it would log one request per attempt.
//! - `TimeoutLayer`: bounds the request as the client sees it, every attempt and backoff
//!   together; when it fires, the layer's future is dropped (outcome `cancelled`) and no
//!   further attempt starts. Inside, it would bound each attempt alone, and its answer carries
//!   no replay marker, so it would end the retries instead.
//! - `CorsLayer`: preflights are answered before the layer (nothing buffered, not counted as
//!   requests); the CORS headers go once on the final answer.
//! - `CompressionLayer`: compresses the final answer once, never a failed attempt's that is
//!   thrown away.
//! - `RequestDecompressionLayer`: the layer buffers what the handler reads, so its caps count
//!   decompressed bytes (a gzip bomb never makes it hold more than `max_body_bytes`), and the
//!   body is decompressed once, not once per attempt.
//! - `RequestBodyLimitLayer` (inside the decompression, so it limits decompressed bytes too):
//!   the layer never reads past the limit, and the limit's `413` reaches the client as it
//!   would without the layer.
//!
//! Inside the retry layer: what must run again on every attempt (a per-request transaction,
//! authentication that opens a database session), a `ConcurrencyLimitLayer` on the write route
//! (its readiness is taken per attempt, after the body is read), and `CatchPanicLayer`, so
//! that a panicking handler is an answer the layer sees and counts (never replayed: a panic
//! carries no replay marker) rather than a dropped future counted `cancelled`. Either place
//! gives the client the same `500`.

use crate::common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http::{HeaderValue, Method, Request, StatusCode, header};
use http_body_util::BodyExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::CompressionLayer;
use tower_http::cors::CorsLayer;
use tower_http::decompression::RequestDecompressionLayer;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tower_sqlite_retry::metrics::MetricsSnapshot;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

use common::{HttpClient, Reply, TestDb, WriteLock, serve};

/// A guard that only turns a hang into a failure.
const HANG: Duration = Duration::from_secs(60);

/// What a handler answers for a retryable database error: `503` with the replay marker.
fn busy() -> Response {
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, "service busy, retry later").into_response();
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

/// Whether this attempt fails retryably: the first one, when a replay can follow. Without the
/// layer `Attempt` reads as 1 of 1 and the handler never fails, so the client must see exactly
/// what it sees with the layer: the hidden replay is the only difference.
fn fails_once(attempt: &Attempt) -> bool {
    attempt.number() == 1 && attempt.max() > 1
}

/// Quick replays; a deadline far enough that a loaded machine never reaches it.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(4)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .deadline(Duration::from_secs(60))
}

/// The router with the retry layer around its routes, or without it.
fn with(router: Router, retry: Option<&SqliteRetryLayer>) -> Router {
    match retry {
        Some(layer) => router.layer(layer.clone()),
        None => router,
    }
}

/// Serves `app` and sends it one request.
async fn send(app: Router, req: Request<Body>) -> Reply {
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);
    tokio::time::timeout(HANG, client.send(req))
        .await
        .expect("answered")
}

/// The headers as the client saw them, but `date` (the clock's, not the app's).
fn headers(reply: &Reply) -> Vec<(String, String)> {
    let mut all: Vec<_> = reply
        .headers
        .iter()
        .filter(|(name, _)| *name != header::DATE)
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("<bytes>").to_owned(),
            )
        })
        .collect();
    all.sort();
    all
}

/// The client saw the same thing: status, every header but `date`, and the body (after
/// `decode`, for compressed bodies whose framing may differ).
fn assert_same(without: &Reply, with: &Reply, decode: impl Fn(&Bytes) -> Bytes, case: &str) {
    assert_eq!(
        without.status,
        with.status,
        "{case}: status (bodies: {:?} / {:?})",
        without.text(),
        with.text()
    );
    assert_eq!(headers(without), headers(with), "{case}: headers");
    assert_eq!(decode(&without.body), decode(&with.body), "{case}: body");
}

fn raw(b: &Bytes) -> Bytes {
    b.clone()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(data).unwrap();
    enc.finish().unwrap()
}

fn gunzip(data: &Bytes) -> Bytes {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(&data[..])
        .read_to_end(&mut out)
        .expect("a gzip body");
    out.into()
}

/// Every request has exactly one outcome and nothing stays buffered.
fn assert_consistent(snap: &MetricsSnapshot) {
    assert_eq!(snap.requests, snap.finished(), "one outcome each: {snap:?}");
    assert_eq!(snap.buffered_bytes, 0, "nothing left buffered: {snap:?}");
}

/// Counts handler calls.
#[derive(Clone, Default)]
struct Calls(Arc<AtomicU32>);

impl Calls {
    fn add(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }

    /// Calls since the last `take`.
    fn take(&self) -> u32 {
        self.0.swap(0, Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------------------------------
// TraceLayer

/// What a subscriber saw: tower-http's request spans, and every event with the names of the
/// spans it happened in (outermost first).
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<SeenInner>>);

#[derive(Default)]
struct SeenInner {
    request_spans: u32,
    events: Vec<(String, Vec<&'static str>)>,
}

impl Seen {
    fn take(&self) -> (u32, Vec<(String, Vec<&'static str>)>) {
        let mut inner = self.0.lock().unwrap();
        (
            std::mem::take(&mut inner.request_spans),
            std::mem::take(&mut inner.events),
        )
    }
}

impl<S> tracing_subscriber::Layer<S> for Seen
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        _: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let meta = attrs.metadata();
        if meta.name() == "request" && meta.target().starts_with("tower_http") {
            self.0.lock().unwrap().request_spans += 1;
        }
    }

    fn on_event(&self, event: &tracing::Event<'_>, ctx: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let scope = ctx
            .event_scope(event)
            .map(|scope| scope.from_root().map(|span| span.name()).collect())
            .unwrap_or_default();
        self.0.lock().unwrap().events.push((message.0, scope));
    }
}

/// How many times an event with this message was seen.
fn count(events: &[(String, Vec<&'static str>)], message: &str) -> usize {
    events.iter().filter(|(m, _)| m == message).count()
}

// NOTE: the default `#[tokio::test]` runtime runs on the test's thread, the server and its
// connections included, so the thread-local subscriber sees every span and event.
#[tokio::test]
async fn trace_layer_outside_logs_one_request_per_request() {
    use tracing_subscriber::layer::SubscriberExt;
    let seen = Seen::default();
    let _guard = common::capture_tracing(tracing_subscriber::registry().with(seen.clone()));

    let calls = Calls::default();
    let router = {
        let calls = calls.clone();
        Router::new().route(
            "/items",
            post(move |attempt: Attempt, body: Bytes| {
                calls.add();
                async move {
                    if fails_once(&attempt) {
                        return busy();
                    }
                    (StatusCode::CREATED, body).into_response()
                }
            }),
        )
    };
    let req = || {
        Request::post("/items")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"name":"traced"}"#))
            .unwrap()
    };
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();

    let without = send(
        with(router.clone(), None).layer(TraceLayer::new_for_http()),
        req(),
    )
    .await;
    let (spans, events) = seen.take();
    assert_eq!(calls.take(), 1);
    assert_eq!(spans, 1, "without the layer: one span");
    assert_eq!(count(&events, "finished processing request"), 1);

    let outside = send(
        with(router.clone(), Some(&layer)).layer(TraceLayer::new_for_http()),
        req(),
    )
    .await;
    let (spans, events) = seen.take();
    assert_eq!(calls.take(), 2, "one replay");
    assert_eq!(spans, 1, "TraceLayer outside: one span for two attempts");
    assert_eq!(count(&events, "started processing request"), 1);
    assert_eq!(count(&events, "finished processing request"), 1);
    // The replay is logged inside the request's own span, under the layer's span.
    let replay: Vec<_> = events
        .iter()
        .filter(|(m, _)| m == "retrying request")
        .collect();
    assert_eq!(replay.len(), 1, "{events:?}");
    assert_eq!(replay[0].1, ["request", "sqlite_retry"], "{events:?}");
    assert_same(&without, &outside, raw, "TraceLayer outside");
    assert_eq!(without.status, StatusCode::CREATED);

    // Why outside: inside the layer, TraceLayer sees every attempt as a request of its own.
    let inside = send(
        router
            .layer(TraceLayer::new_for_http())
            .layer(layer.clone()),
        req(),
    )
    .await;
    let (spans, events) = seen.take();
    assert_eq!(calls.take(), 2);
    assert_eq!(spans, 2, "TraceLayer inside: one span per attempt");
    assert_eq!(count(&events, "finished processing request"), 2);
    assert_same(&without, &inside, raw, "TraceLayer inside");

    let snap = metrics.snapshot();
    assert_eq!((snap.requests, snap.retries), (2, 2), "{snap:?}");
    assert_eq!(snap.succeeded_after_retry, 2, "{snap:?}");
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// TimeoutLayer

// NOTE: time is the subject: the paused clock makes it exact. Backoff 1 s flat, timeout 2.5 s:
// attempts start at 0, 1 s and 2 s, and the timeout fires during the third backoff. The
// requests have no body, so nothing waits on the socket while a timer is pending (the paused
// clock jumps to the next timer whenever the runtime is idle).
#[tokio::test(start_paused = true)]
async fn timeout_layer_outside_bounds_all_attempts_together() {
    let calls = Calls::default();
    let router = {
        let calls = calls.clone();
        Router::new()
            // Every attempt fails retryably.
            .route(
                "/always-busy",
                get(move || {
                    calls.add();
                    async { busy() }
                }),
            )
            // Never answers: what TimeoutLayer itself answers.
            .route("/hang", get(std::future::pending::<()>))
    };
    let timeout =
        || TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, Duration::from_millis(2500));
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(10)
            .base_delay(Duration::from_secs(1))
            .max_delay(Duration::from_secs(1))
            .jitter(Jitter::None)
            .deadline(Duration::from_secs(60)),
    );
    let metrics = layer.metrics();
    let get = |path: &str| Request::get(path).body(Body::empty()).unwrap();

    // Without the layer: the handler's own 503 at once (no replay is the difference), and
    // TimeoutLayer's answer for a request that outlasts it.
    let own = send(
        with(router.clone(), None).layer(timeout()),
        get("/always-busy"),
    )
    .await;
    assert_eq!(own.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(calls.take(), 1);
    let timed_out = send(with(router.clone(), None).layer(timeout()), get("/hang")).await;
    assert_eq!(timed_out.status, StatusCode::REQUEST_TIMEOUT);

    // With the layer: replays until the timeout fires, answered exactly as TimeoutLayer
    // answers (no Retry-After: the layer never answered).
    let start = tokio::time::Instant::now();
    let replayed = send(
        with(router, Some(&layer)).layer(timeout()),
        get("/always-busy"),
    )
    .await;
    assert_same(&timed_out, &replayed, raw, "TimeoutLayer outside");
    // (The paused clock: the timeout's 2.5 s, before the fourth attempt's 3 s.)
    let elapsed = start.elapsed();
    assert!(
        (Duration::from_millis(2500)..Duration::from_secs(3)).contains(&elapsed),
        "{elapsed:?}"
    );
    assert_eq!(
        calls.take(),
        3,
        "attempts at 0, 1 s, 2 s; none after the timeout"
    );

    // The layer's future was dropped by the timeout: `cancelled`, and the replays it started.
    let snap = metrics.snapshot();
    assert_eq!(snap.requests, 1, "{snap:?}");
    assert_eq!(snap.cancelled, 1, "{snap:?}");
    assert_eq!(snap.retries, 2, "{snap:?}");
    assert_eq!(snap.attempts_histogram[2], 1, "three attempts: {snap:?}");
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// CompressionLayer

#[tokio::test]
async fn compression_layer_outside_gzips_the_replayed_answer_intact() {
    let report: String = (0..2000).map(|i| format!("row {i}: ok\n")).collect();
    let calls = Calls::default();
    let router = {
        let (calls, report) = (calls.clone(), report.clone());
        Router::new().route(
            "/report",
            get(move |attempt: Attempt| {
                calls.add();
                async move {
                    if fails_once(&attempt) {
                        return busy();
                    }
                    ([(header::CONTENT_TYPE, "text/plain")], report).into_response()
                }
            }),
        )
    };
    let req = || {
        Request::get("/report")
            .header(header::ACCEPT_ENCODING, "gzip")
            .body(Body::empty())
            .unwrap()
    };
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();

    let without = send(
        with(router.clone(), None).layer(CompressionLayer::new()),
        req(),
    )
    .await;
    assert_eq!(calls.take(), 1);
    let replayed = send(
        with(router, Some(&layer)).layer(CompressionLayer::new()),
        req(),
    )
    .await;
    assert_eq!(calls.take(), 2, "one replay");

    assert_same(&without, &replayed, gunzip, "CompressionLayer outside");
    assert_eq!(replayed.status, StatusCode::OK);
    assert_eq!(replayed.headers[header::CONTENT_ENCODING], "gzip");
    assert!(replayed.body.len() < report.len() / 4, "really compressed");
    assert_eq!(gunzip(&replayed.body), report.as_bytes());
    let snap = metrics.snapshot();
    assert_eq!(snap.succeeded_after_retry, 1, "{snap:?}");
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// RequestDecompressionLayer

fn echo_router(calls: &Calls) -> Router {
    let calls = calls.clone();
    Router::new().route(
        "/echo",
        post(move |attempt: Attempt, body: Bytes| {
            calls.add();
            async move {
                if fails_once(&attempt) {
                    return busy();
                }
                body.into_response()
            }
        }),
    )
}

#[tokio::test]
async fn request_decompression_outside_hands_the_replay_the_decompressed_bytes() {
    let json: String = format!(
        "[{}]",
        (0..500)
            .map(|i| format!(r#"{{"id":{i},"name":"item"}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    let compressed = gzip(json.as_bytes());
    assert!(compressed.len() * 4 < json.len());
    let calls = Calls::default();
    let req = || {
        Request::post("/echo")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::from(compressed.clone()))
            .unwrap()
    };
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();

    let without = send(
        with(echo_router(&calls), None).layer(RequestDecompressionLayer::new()),
        req(),
    )
    .await;
    assert_eq!(calls.take(), 1);
    let replayed = send(
        with(echo_router(&calls), Some(&layer)).layer(RequestDecompressionLayer::new()),
        req(),
    )
    .await;
    assert_eq!(calls.take(), 2, "one replay");

    assert_same(
        &without,
        &replayed,
        raw,
        "RequestDecompressionLayer outside",
    );
    assert_eq!(replayed.status, StatusCode::OK);
    assert_eq!(
        replayed.body,
        json.as_bytes(),
        "the replay read the decompressed body"
    );
    let snap = metrics.snapshot();
    assert_eq!(snap.succeeded_after_retry, 1, "{snap:?}");
    // The layer held the decompressed bytes (what the handler reads), not the gzip stream.
    assert!(
        snap.peak_buffered_bytes >= json.len(),
        "counted decompressed bytes: {snap:?}"
    );
    assert_consistent(&snap);
}

#[tokio::test]
async fn a_gzip_bomb_never_buffers_past_the_cap() {
    const INFLATED: usize = 50 * 1024 * 1024;
    const CAP: usize = 256 * 1024;
    let bomb = gzip(&vec![0u8; INFLATED]);
    assert!(
        bomb.len() < 100 * 1024,
        "a small bomb: {} bytes",
        bomb.len()
    );

    let calls = Calls::default();
    let router = {
        let (c1, c2) = (calls.clone(), calls.clone());
        Router::new()
            // axum's default body limit (2 MiB) refuses it.
            .route(
                "/upload",
                post(move |body: Bytes| {
                    c1.add();
                    async move { format!("{} bytes", body.len()) }
                }),
            )
            // A handler that streams: every decompressed byte arrives, in order.
            .route(
                "/count",
                post(move |body: Body| {
                    c2.add();
                    async move {
                        let mut body = body;
                        let (mut total, mut nonzero) = (0usize, 0usize);
                        while let Some(frame) = body.frame().await {
                            if let Ok(data) = frame.expect("body").into_data() {
                                total += data.len();
                                nonzero += data.iter().filter(|b| **b != 0).count();
                            }
                        }
                        format!("{total} bytes, {nonzero} not zero")
                    }
                }),
            )
    };
    let req = |path: &str| {
        Request::post(path)
            .header(header::CONTENT_ENCODING, "gzip")
            .body(Body::from(bomb.clone()))
            .unwrap()
    };
    let layer = SqliteRetryLayer::new(policy().max_body_bytes(CAP));
    let metrics = layer.metrics();
    let app = |retry| with(router.clone(), retry).layer(RequestDecompressionLayer::new());

    // `/upload`: axum's default limit answers 413 (its extractor refuses the body before the
    // handler runs). `/count`: every inflated byte reaches the handler.
    let expected = [
        ("/upload", StatusCode::PAYLOAD_TOO_LARGE, 0),
        ("/count", StatusCode::OK, 2),
    ];
    for (path, status, handler_calls) in expected {
        let without = send(app(None), req(path)).await;
        let with_layer = send(app(Some(&layer)), req(path)).await;
        assert_eq!(without.status, status, "{path}: {}", without.text());
        assert_same(&without, &with_layer, raw, path);
        assert_eq!(
            calls.take(),
            handler_calls,
            "{path}: one call each, no replay"
        );
        if path == "/count" {
            assert_eq!(with_layer.text(), format!("{INFLATED} bytes, 0 not zero"));
        }
    }

    let snap = metrics.snapshot();
    assert!(
        snap.peak_buffered_bytes <= CAP,
        "the cap holds against decompressed bytes: {snap:?}"
    );
    assert!(snap.peak_buffered_bytes > 0, "the layer did try: {snap:?}");
    assert_eq!(snap.first_try, 2, "passed through, answered once: {snap:?}");
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// CatchPanicLayer

#[tokio::test]
async fn catch_panic_answers_the_same_500_inside_or_outside() {
    let calls = Calls::default();
    let router = {
        let calls = calls.clone();
        Router::new().route(
            "/panics",
            post(move |attempt: Attempt| {
                calls.add();
                async move {
                    if attempt.number() == 1 {
                        panic!("handler panicked on attempt 1 (expected by the test)");
                    }
                    "replayed"
                }
            }),
        )
    };
    let req = || Request::post("/panics").body(Body::from("x")).unwrap();

    let without = send(router.clone().layer(CatchPanicLayer::new()), req()).await;
    assert_eq!(without.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(calls.take(), 1);

    // Inside the layer (recommended): the panic is an answer the layer sees, with no replay
    // marker: not replayed, counted `first_try`.
    let inside = SqliteRetryLayer::new(policy());
    let reply = send(
        router
            .clone()
            .layer(CatchPanicLayer::new())
            .layer(inside.clone()),
        req(),
    )
    .await;
    assert_same(&without, &reply, raw, "CatchPanicLayer inside");
    assert_eq!(calls.take(), 1, "a panic is never replayed");
    let snap = inside.metrics().snapshot();
    assert_eq!(
        (snap.requests, snap.first_try, snap.retries),
        (1, 1, 0),
        "{snap:?}"
    );
    assert_consistent(&snap);

    // Outside: the panic unwinds through the layer, whose future is dropped: `cancelled`.
    let outside = SqliteRetryLayer::new(policy());
    let reply = send(
        router.layer(outside.clone()).layer(CatchPanicLayer::new()),
        req(),
    )
    .await;
    assert_same(&without, &reply, raw, "CatchPanicLayer outside");
    assert_eq!(calls.take(), 1, "no attempt after the unwind");
    let snap = outside.metrics().snapshot();
    assert_eq!(
        (snap.requests, snap.cancelled, snap.retries),
        (1, 1, 0),
        "{snap:?}"
    );
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// RequestBodyLimitLayer

/// A body sent chunked (no `Content-Length`), in 1 KiB chunks.
fn chunked(len: usize) -> Body {
    let chunks: Vec<Result<Bytes, std::convert::Infallible>> = vec![b'a'; len]
        .chunks(1024)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    Body::from_stream(futures::stream::iter(chunks))
}

// Issue 9, case 1, as the issue wrote it: answered `400 Failed to buffer the request body` on
// 9234f89, `413` without the layer.
#[tokio::test]
async fn body_limit_outside_answers_413_as_without_the_layer() {
    let calls = Calls::default();
    let router = {
        let calls = calls.clone();
        Router::new().route(
            "/upload",
            post(move |attempt: Attempt, body: Bytes| {
                calls.add();
                async move {
                    if fails_once(&attempt) {
                        return busy();
                    }
                    format!("{} bytes", body.len()).into_response()
                }
            }),
        )
    };
    let layer = SqliteRetryLayer::new(RetryPolicy::default());
    let metrics = layer.metrics();
    let app = |retry| with(router.clone(), retry).layer(RequestBodyLimitLayer::new(1024));
    let req = |len| {
        Request::post("/upload")
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(chunked(len))
            .unwrap()
    };

    let without = send(app(None), req(4096)).await;
    let with_layer = send(app(Some(&layer)), req(4096)).await;
    assert_eq!(
        without.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        without.text()
    );
    assert_same(
        &without,
        &with_layer,
        raw,
        "4 KiB chunked over a 1 KiB limit",
    );
    assert_eq!(
        calls.take(),
        0,
        "the extractor refuses the body before the handler runs"
    );

    // Under the limit: replayed as usual.
    let without = send(app(None), req(600)).await;
    let with_layer = send(app(Some(&layer)), req(600)).await;
    assert_eq!(without.text(), "600 bytes");
    assert_same(&without, &with_layer, raw, "600 bytes under the limit");
    assert_eq!(calls.take(), 3);

    let snap = metrics.snapshot();
    assert_eq!(snap.requests, 2, "{snap:?}");
    assert_eq!(snap.first_try, 1, "the 413: {snap:?}");
    assert_eq!(snap.succeeded_after_retry, 1, "{snap:?}");
    assert!(
        snap.peak_buffered_bytes <= 1024,
        "never read past the limit: {snap:?}"
    );
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// CorsLayer

#[tokio::test]
async fn cors_preflight_is_the_same_with_cors_outside_or_inside() {
    let cors = || {
        CorsLayer::new()
            .allow_origin(HeaderValue::from_static("https://app.example"))
            .allow_methods([Method::POST])
            .allow_headers([header::CONTENT_TYPE])
            .max_age(Duration::from_secs(600))
    };
    let calls = Calls::default();
    let router = {
        let calls = calls.clone();
        Router::new().route(
            "/items",
            post(move |attempt: Attempt| {
                calls.add();
                async move {
                    if fails_once(&attempt) {
                        return busy();
                    }
                    (StatusCode::CREATED, "created").into_response()
                }
            }),
        )
    };
    let preflight = || {
        Request::options("/items")
            .header(header::ORIGIN, "https://app.example")
            .header(header::ACCESS_CONTROL_REQUEST_METHOD, "POST")
            .header(header::ACCESS_CONTROL_REQUEST_HEADERS, "content-type")
            .body(Body::empty())
            .unwrap()
    };
    let actual = || {
        Request::post("/items")
            .header(header::ORIGIN, "https://app.example")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from("{}"))
            .unwrap()
    };
    let outside = SqliteRetryLayer::new(policy());
    let inside = SqliteRetryLayer::new(policy());
    let apps = |router: &Router| {
        [
            (
                "Cors outside the layer",
                router.clone().layer(outside.clone()).layer(cors()),
            ),
            (
                "Cors inside the layer",
                router.clone().layer(cors()).layer(inside.clone()),
            ),
        ]
    };

    let without = send(router.clone().layer(cors()), preflight()).await;
    assert_eq!(without.status, StatusCode::OK);
    assert_eq!(
        without.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );
    assert_eq!(
        without.headers[header::ACCESS_CONTROL_ALLOW_METHODS],
        "POST"
    );
    assert_eq!(without.headers[header::ACCESS_CONTROL_MAX_AGE], "600");
    for (case, app) in apps(&router) {
        let reply = send(app, preflight()).await;
        assert_same(&without, &reply, raw, case);
    }
    assert_eq!(calls.take(), 0, "a preflight never reaches the handler");

    // The request the preflight allowed, failing once: the same CORS headers on the answer.
    let without = send(router.clone().layer(cors()), actual()).await;
    assert_eq!(without.status, StatusCode::CREATED);
    assert_eq!(
        without.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );
    assert_eq!(calls.take(), 1);
    for (case, app) in apps(&router) {
        let reply = send(app, actual()).await;
        assert_same(&without, &reply, raw, case);
        assert_eq!(calls.take(), 2, "{case}: one replay");
    }

    // Outside, the preflight never reaches the layer; inside, it is a request of its own.
    let snap = outside.metrics().snapshot();
    assert_eq!(
        (snap.requests, snap.succeeded_after_retry),
        (1, 1),
        "{snap:?}"
    );
    assert_consistent(&snap);
    let snap = inside.metrics().snapshot();
    assert_eq!(snap.requests, 2, "{snap:?}");
    assert_eq!(
        (snap.first_try, snap.succeeded_after_retry),
        (1, 1),
        "{snap:?}"
    );
    assert_consistent(&snap);
}

// ---------------------------------------------------------------------------------------------
// All of it together, on a real SQLite file

#[derive(Clone)]
struct Db {
    pool: sqlx::SqlitePool,
    /// A write lock held by another connection, released by the first attempt that meets it.
    lock: Arc<tokio::sync::Mutex<Option<WriteLock>>>,
    calls: Calls,
}

#[derive(serde::Deserialize)]
struct NewItem {
    name: String,
}

#[derive(serde::Serialize)]
struct Created {
    seq: i64,
    name: String,
}

async fn create(
    State(db): State<Db>,
    Json(item): Json<NewItem>,
) -> Result<(StatusCode, Json<Created>), DbError> {
    db.calls.add();
    let inserted = sqlx::query_scalar::<_, i64>(
        "INSERT INTO items (seq, name) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM items), ?)
         RETURNING seq",
    )
    .bind(&item.name)
    .fetch_one(&db.pool)
    .await;
    match inserted {
        Ok(seq) => Ok((
            StatusCode::CREATED,
            Json(Created {
                seq,
                name: item.name,
            }),
        )),
        Err(e) => {
            // SQLITE_BUSY from the held lock (busy timeout 0): let the replay through.
            if let Some(lock) = db.lock.lock().await.take() {
                lock.release().await;
            }
            Err(e.into())
        }
    }
}

/// The recommended order, outermost first: trace, timeout, CORS, compression, decompression,
/// body limit, then the retry layer, then what must run per attempt (catch-panic), then the
/// handler. `Router::layer` wraps, so the calls read innermost first.
fn full_stack(router: Router, retry: Option<&SqliteRetryLayer>) -> Router {
    let router = router.layer(CatchPanicLayer::new());
    with(router, retry)
        .layer(RequestBodyLimitLayer::new(64 * 1024))
        .layer(RequestDecompressionLayer::new())
        .layer(CompressionLayer::new())
        .layer(
            CorsLayer::new()
                .allow_origin(HeaderValue::from_static("https://app.example"))
                .allow_methods([Method::POST]),
        )
        .layer(TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            Duration::from_secs(60),
        ))
        .layer(TraceLayer::new_for_http())
}

#[tokio::test]
async fn the_whole_stack_on_sqlite_replays_a_real_busy_write_once() {
    let test_db = TestDb::new();
    let pool = test_db.pool(4, Duration::ZERO).await;
    let db = Db {
        pool: pool.clone(),
        lock: Arc::default(),
        calls: Calls::default(),
    };
    let router = Router::new()
        .route("/items", post(create))
        .with_state(db.clone());
    let req = |name: &str| {
        let json = format!(r#"{{"name":"{name}"}}"#);
        Request::post("/items")
            .header(header::ORIGIN, "https://app.example")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::CONTENT_ENCODING, "gzip")
            .header(header::ACCEPT_ENCODING, "gzip")
            .body(Body::from(gzip(json.as_bytes())))
            .unwrap()
    };
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();

    let without = send(full_stack(router.clone(), None), req("the first item")).await;
    assert_eq!(db.calls.take(), 1);

    // With the layer, another connection holds the write lock: the first attempt meets a real
    // SQLITE_BUSY (and releases the lock), the replay commits.
    *db.lock.lock().await = Some(test_db.hold_write_lock().await);
    let replayed = send(
        full_stack(router.clone(), Some(&layer)),
        req("the second item"),
    )
    .await;
    assert_eq!(db.calls.take(), 2, "one replay");
    assert!(
        db.lock.lock().await.is_none(),
        "the first attempt met the lock"
    );

    let body = |reply: &Reply| -> serde_json::Value {
        serde_json::from_slice(&gunzip(&reply.body)).expect("gzip JSON")
    };
    assert_eq!(without.status, StatusCode::CREATED);
    assert_eq!(
        body(&without),
        serde_json::json!({"seq": 1, "name": "the first item"})
    );
    assert_eq!(
        body(&replayed),
        serde_json::json!({"seq": 2, "name": "the second item"})
    );
    assert_eq!(headers(&without), headers(&replayed));
    assert_eq!(replayed.status, without.status);
    assert_eq!(replayed.headers[header::CONTENT_ENCODING], "gzip");
    assert_eq!(
        replayed.headers[header::ACCESS_CONTROL_ALLOW_ORIGIN],
        "https://app.example"
    );

    // A body that inflates past the 64 KiB limit: the same 413 through the whole stack, with
    // and without the layer, and nothing inserted.
    let huge = "x".repeat(128 * 1024);
    let without = send(full_stack(router.clone(), None), req(&huge)).await;
    let with_layer = send(full_stack(router.clone(), Some(&layer)), req(&huge)).await;
    assert_eq!(
        without.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        without.text()
    );
    assert_same(
        &without,
        &with_layer,
        raw,
        "over the limit after decompression",
    );
    assert_eq!(db.calls.take(), 0, "refused before the handler");

    let rows: Vec<(i64, String)> = sqlx::query_as("SELECT seq, name FROM items ORDER BY seq")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        rows,
        [
            (1, "the first item".to_owned()),
            (2, "the second item".to_owned())
        ],
        "one row per request"
    );
    let snap = metrics.snapshot();
    assert_eq!(
        (snap.requests, snap.succeeded_after_retry, snap.first_try),
        (2, 1, 1),
        "the replayed write, and the 413: {snap:?}"
    );
    // The limit inside the decompression bounds what the layer reads, inflated bytes counted.
    assert!(snap.peak_buffered_bytes <= 64 * 1024, "{snap:?}");
    assert_consistent(&snap);
}
