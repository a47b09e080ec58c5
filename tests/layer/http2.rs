//! HTTP/2 over real TCP on loopback (h2c with prior knowledge, one connection per test):
//! many concurrent streams replayed without cross-talk, a body in one-byte DATA frames
//! replayed byte-identical without inflating the buffer count, and a stream reset during a
//! backoff.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::future::join_all;
use http::{HeaderMap, Request, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tower_sqlite_retry::{Attempt, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

use common::{capture_events, poll_until, serve};

/// A guard that only turns a hang into a failure.
const HANG: Duration = Duration::from_secs(60);

fn busy() -> Response {
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, "service busy, retry later").into_response();
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

/// Quick replays; a deadline far enough that a loaded machine never reaches it.
fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(4)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .deadline(Duration::from_secs(60))
}

/// One HTTP/2 connection (h2c, prior knowledge); every request of the test goes over it.
struct H2 {
    send: SendRequest<Body>,
    base: String,
    connection: tokio::task::JoinHandle<hyper::Result<()>>,
}

impl H2 {
    async fn connect(addr: SocketAddr) -> Self {
        let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
        let (send, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tcp))
                .await
                .expect("h2 handshake");
        Self {
            send,
            base: format!("http://{addr}"),
            connection: tokio::spawn(connection),
        }
    }

    /// Sends a request on a new stream of the connection; the answer's status, headers and
    /// whole body.
    fn request(
        &self,
        path: &str,
        headers: &[(&'static str, String)],
        body: Body,
    ) -> impl Future<Output = (StatusCode, HeaderMap, Bytes)> + Send + use<> {
        let mut send = self.send.clone();
        let mut req = Request::post(format!("{}{path}", self.base));
        for (name, value) in headers {
            req = req.header(*name, value);
        }
        let req = req.body(body).unwrap();
        async move {
            let res = send.send_request(req).await.expect("response");
            assert_eq!(res.version(), http::Version::HTTP_2);
            let (parts, body) = res.into_parts();
            let body = body.collect().await.expect("body").to_bytes();
            (parts.status, parts.headers, body)
        }
    }

    /// The connection is still up: it never failed and is not closed.
    fn assert_alive(&self) {
        assert!(!self.send.is_closed(), "connection closed");
        assert!(!self.connection.is_finished(), "connection task ended");
    }
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_concurrent_streams_are_each_replayed_with_their_own_body() {
    // hyper's server allows 200 concurrent streams per connection by default.
    const STREAMS: usize = 200;
    // Every first attempt waits here until all 200 are in their handlers at once: the streams
    // really are concurrent on the one connection (a hang, caught by the guard, otherwise).
    let barrier = Arc::new(tokio::sync::Barrier::new(STREAMS));
    let calls = Arc::new(AtomicU32::new(0));
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();
    let app = {
        let calls = calls.clone();
        Router::new()
            .route(
                "/echo",
                post(move |attempt: Attempt, headers: HeaderMap, body: Bytes| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    let barrier = barrier.clone();
                    async move {
                        if attempt.number() == 1 {
                            barrier.wait().await;
                            return busy();
                        }
                        let stream = headers["x-stream"].clone();
                        let attempt = http::HeaderValue::from(attempt.number());
                        ([("x-stream", stream), ("x-attempt", attempt)], body).into_response()
                    }
                }),
            )
            .layer(layer)
    };
    let server = serve(app).await;
    let h2 = H2::connect(server.addr).await;

    // Bodies of different lengths and contents, none a prefix of another.
    let body_of = |i: usize| -> Bytes {
        let mut body = format!("stream {i}:").into_bytes();
        body.extend((0..(i * 37) % 5000).map(|j| (i * 7 + j) as u8));
        body.into()
    };
    let requests = (0..STREAMS).map(|i| {
        h2.request(
            "/echo",
            &[("x-stream", i.to_string())],
            Body::from(body_of(i)),
        )
    });
    let answers = tokio::time::timeout(HANG, join_all(requests))
        .await
        .expect("every stream answered");

    for (i, (status, headers, body)) in answers.into_iter().enumerate() {
        assert_eq!(status, StatusCode::OK, "stream {i}");
        assert_eq!(headers["x-stream"], i.to_string().as_str(), "stream {i}");
        assert_eq!(headers["x-attempt"], "2", "stream {i}: replayed once");
        assert_eq!(body, body_of(i), "stream {i}: its own body, whole");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 2 * STREAMS as u32);
    h2.assert_alive();
    let n = STREAMS as u64;
    poll_until("every request finished", async || {
        metrics.snapshot().finished() == n
    })
    .await;
    let snap = metrics.snapshot();
    assert_eq!(snap.requests, n, "{snap:?}");
    assert_eq!(snap.succeeded_after_retry, n, "{snap:?}");
    assert_eq!(snap.retries, n, "{snap:?}");
    assert_eq!(snap.buffered_bytes, 0, "{snap:?}");
}

// ---------------------------------------------------------------------------------------------

/// A body sent as one DATA frame per byte.
fn one_byte_frames(payload: &Bytes) -> Body {
    let frames: Vec<Result<Frame<Bytes>, Infallible>> = (0..payload.len())
        .map(|i| Ok(Frame::data(payload.slice(i..i + 1))))
        .collect();
    Body::new(StreamBody::new(futures::stream::iter(frames)))
}

#[tokio::test]
async fn a_body_in_one_byte_data_frames_is_replayed_byte_identical() {
    // NOTE: h2 (0.4.20) charges every small DATA frame still buffered in the connection
    // against a budget of half the connection window (hyper: 1 MiB) and answers a flood with
    // GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames", with or without the layer: ~2000
    // one-byte frames in flight at once. 1024 stay well inside it.
    const LEN: usize = 1024;
    let payload: Bytes = (0..LEN)
        .map(|i| (i * 31 + 7) as u8)
        .collect::<Vec<_>>()
        .into();
    // Frames as they come off the connection, counted before the layer.
    let frames_in = Arc::new(AtomicUsize::new(0));
    let app = |retry: Option<SqliteRetryLayer>| {
        let router = Router::new().route(
            "/frames",
            post(|attempt: Attempt, body: Body| async move {
                if attempt.number() == 1 && attempt.max() > 1 {
                    return busy();
                }
                // The handler reads frame by frame: how many it got, and the bytes.
                let mut body = body;
                let (mut frames, mut bytes) = (0usize, Vec::new());
                while let Some(frame) = body.frame().await {
                    if let Ok(data) = frame.expect("body").into_data()
                        && !data.is_empty()
                    {
                        frames += 1;
                        bytes.extend_from_slice(&data);
                    }
                }
                ([("x-frames", frames.to_string())], bytes).into_response()
            }),
        );
        let router = match retry {
            Some(layer) => router.layer(layer),
            None => router,
        };
        let frames_in = frames_in.clone();
        router.layer(tower::util::MapRequestLayer::new(
            move |req: Request<Body>| {
                let frames_in = frames_in.clone();
                req.map(|body| {
                    Body::new(body.map_frame(move |frame| {
                        // (hyper's client ends the stream with an empty DATA frame)
                        if frame.data_ref().is_some_and(|d| !d.is_empty()) {
                            frames_in.fetch_add(1, Ordering::SeqCst);
                        }
                        frame
                    }))
                })
            },
        ))
    };

    // Without the layer: the handler reads the client's frames as they came.
    let server = serve(app(None)).await;
    let h2 = H2::connect(server.addr).await;
    let (status, headers, body) =
        tokio::time::timeout(HANG, h2.request("/frames", &[], one_byte_frames(&payload)))
            .await
            .expect("answered");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, payload);
    let frames = frames_in.swap(0, Ordering::SeqCst);
    // h2 splits DATA frames, never merges them: every byte came in a frame of its own.
    assert_eq!(frames, LEN, "the client sent one-byte DATA frames");
    assert_eq!(headers["x-frames"], LEN.to_string().as_str());

    // With the layer: the first attempt fails, the replay gets the same bytes.
    let layer = SqliteRetryLayer::new(policy());
    let metrics = layer.metrics();
    let server = serve(app(Some(layer))).await;
    let h2 = H2::connect(server.addr).await;
    let (status, headers, body) =
        tokio::time::timeout(HANG, h2.request("/frames", &[], one_byte_frames(&payload)))
            .await
            .expect("answered");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, payload, "replayed byte-identical");
    assert_eq!(frames_in.load(Ordering::SeqCst), LEN);
    assert_eq!(
        headers["x-frames"], "1",
        "the replay reads one buffer, not a handle per frame"
    );

    poll_until("the request finished", async || {
        metrics.snapshot().finished() == 1
    })
    .await;
    let snap = metrics.snapshot();
    assert_eq!(
        (snap.succeeded_after_retry, snap.retries),
        (1, 1),
        "{snap:?}"
    );
    // The memory counted is one growing buffer, not a `Bytes` handle per frame.
    assert!(
        (LEN..=2 * LEN).contains(&snap.peak_buffered_bytes),
        "peak {} for a {LEN}-byte body: {snap:?}",
        snap.peak_buffered_bytes
    );
    assert_eq!(snap.buffered_bytes, 0, "{snap:?}");
}

// ---------------------------------------------------------------------------------------------

// NOTE: the default `#[tokio::test]` runtime runs everything on the test's thread, so the
// thread-local event capture sees the layer's events, and when the test task runs, the
// server's tasks are between polls.
#[tokio::test]
async fn a_stream_reset_during_the_backoff_cancels_only_that_request() {
    let (events, _guard) = capture_events();
    // A backoff far longer than the test: once the first attempt has failed, the request sits
    // in its backoff until the client resets the stream.
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(3)
            .base_delay(Duration::from_secs(3600))
            .max_delay(Duration::from_secs(3600))
            .jitter(Jitter::None)
            .deadline(Duration::from_secs(3 * 3600)),
    );
    let metrics = layer.metrics();
    let (attempts_tx, mut attempts) = tokio::sync::mpsc::unbounded_channel::<u32>();
    let backoff_calls = Arc::new(AtomicU32::new(0));
    let app = {
        let backoff_calls = backoff_calls.clone();
        Router::new()
            .route(
                "/backoff",
                post(move |attempt: Attempt| {
                    backoff_calls.fetch_add(1, Ordering::SeqCst);
                    attempts_tx.send(attempt.number()).unwrap();
                    async { busy() }
                }),
            )
            .route("/echo", post(|body: Bytes| async move { body }))
            .layer(layer)
    };
    let server = serve(app).await;
    let h2 = H2::connect(server.addr).await;

    // A stream still uploading while the other one is reset.
    let (upload_tx, upload_rx) = futures::channel::mpsc::unbounded::<Result<Bytes, Infallible>>();
    upload_tx
        .unbounded_send(Ok(Bytes::from_static(b"first half, ")))
        .unwrap();
    let uploading = tokio::spawn(h2.request("/echo", &[], Body::from_stream(upload_rx)));
    poll_until("the layer holds the upload's first half", async || {
        metrics.snapshot().buffered_bytes == 12
    })
    .await;

    // The request to reset: its first attempt fails, the layer backs off.
    let doomed = tokio::spawn(h2.request("/backoff", &[], Body::from("replay me")));
    let first = tokio::time::timeout(HANG, attempts.recv())
        .await
        .expect("attempt 1");
    assert_eq!(first, Some(1));
    poll_until("the layer is in its backoff", async || {
        !events.with_message("retrying request").is_empty()
    })
    .await;
    assert_eq!(
        metrics.snapshot().buffered_bytes,
        12 + 9,
        "the body is held for the replay"
    );

    // The client gives up on it: hyper resets the stream (RST_STREAM CANCEL) and the server
    // drops the request's future.
    doomed.abort();
    assert!(doomed.await.unwrap_err().is_cancelled());
    poll_until("the reset request counted cancelled", async || {
        metrics.snapshot().cancelled == 1
    })
    .await;
    let snap = metrics.snapshot();
    assert_eq!(snap.retries, 0, "no replay started: {snap:?}");
    assert_eq!(
        snap.buffered_bytes, 12,
        "its body was given back at once, the upload's is still held: {snap:?}"
    );
    let cancelled = events.with_message("request cancelled");
    assert_eq!(cancelled.len(), 1, "{cancelled:?}");
    assert_eq!(cancelled[0]["retry.attempts"], "1");

    // The other streams on the connection: the upload goes on and is answered whole, and a
    // new stream is served.
    upload_tx
        .unbounded_send(Ok(Bytes::from_static(b"second half")))
        .unwrap();
    drop(upload_tx);
    let (status, _, body) = tokio::time::timeout(HANG, uploading)
        .await
        .expect("answered")
        .unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "first half, second half");
    let (status, _, body) =
        tokio::time::timeout(HANG, h2.request("/echo", &[], Body::from("after")))
            .await
            .expect("answered");
    assert_eq!((status, &body[..]), (StatusCode::OK, &b"after"[..]));
    h2.assert_alive();

    // No attempt after the reset, even once the backoff would have ended: the paused clock
    // jumps past it (every socket is quiet now).
    tokio::time::pause();
    tokio::time::advance(Duration::from_secs(2 * 3600)).await;
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(attempts.try_recv().ok(), None, "no second attempt");
    assert_eq!(backoff_calls.load(Ordering::SeqCst), 1);
    let snap = metrics.snapshot();
    assert_eq!(snap.requests, 3, "{snap:?}");
    assert_eq!((snap.cancelled, snap.first_try), (1, 2), "{snap:?}");
    assert_eq!(snap.requests, snap.finished(), "{snap:?}");
    assert_eq!(snap.buffered_bytes, 0, "{snap:?}");
}
