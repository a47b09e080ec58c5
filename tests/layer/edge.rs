//! The edge contract: with the layer in place, a client sees nothing different but the
//! replays. Each case runs with and without the layer in the same test, over real TCP (a raw
//! HTTP/1.1 client where the exact bytes on the wire matter), or on tokio's paused clock where
//! time is the subject.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request as AxumRequest, State};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::{Request, StatusCode, header};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tower::limit::ConcurrencyLimitLayer;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};
use tower_http::timeout::RequestBodyDeadlineLayer;
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::classify::RetryDriverErrors;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::policy::Admission;
use tower_sqlite_retry::{Attempt, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

use common::serve;

/// A guard against hangs only: never an assertion about speed.
const GUARD: Duration = Duration::from_secs(20);

fn busy() -> Response {
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    res.extensions_mut()
        .insert(Retryable::new("5", "SQLITE_BUSY"));
    res
}

fn quick(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(1))
        .jitter(Jitter::None)
}

/// A response as a raw HTTP/1.1 client reads it.
#[derive(Debug)]
struct RawResponse {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl RawResponse {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// An HTTP/1.1 client that writes exactly the bytes it is given.
struct Raw {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Raw {
    async fn connect(addr: SocketAddr) -> Self {
        Self {
            stream: TcpStream::connect(addr).await.expect("connect"),
            buf: Vec::new(),
        }
    }

    async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("write");
    }

    /// The next response (an interim `100 Continue` counts as one).
    async fn response(&mut self) -> RawResponse {
        tokio::time::timeout(GUARD, self.read_response())
            .await
            .expect("a response (guard against a hang)")
    }

    async fn read_response(&mut self) -> RawResponse {
        let end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            self.fill().await;
        };
        let head = String::from_utf8(self.buf.drain(..end).collect()).expect("utf-8 head");
        let mut lines = head.split("\r\n");
        let status = lines.next().unwrap().split(' ').nth(1).unwrap();
        let status: u16 = status.parse().unwrap();
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (n, v) = l.split_once(':').unwrap();
                (n.trim().to_owned(), v.trim().to_owned())
            })
            .collect();
        let mut res = RawResponse {
            status,
            headers,
            body: Vec::new(),
        };
        let len: usize = res
            .header("content-length")
            .map_or(0, |v| v.parse().unwrap());
        while self.buf.len() < len {
            self.fill().await;
        }
        res.body = self.buf.drain(..len).collect();
        res
    }

    async fn fill(&mut self) {
        let mut chunk = [0u8; 4096];
        let n = self.stream.read(&mut chunk).await.expect("read");
        assert!(n > 0, "connection closed; read so far: {:?}", self.buf);
        self.buf.extend_from_slice(&chunk[..n]);
    }
}

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

// --- 2. Expect: 100-continue ---------------------------------------------------------------

/// Refuses from the headers alone, before asking for the body; else reads it and, on attempt
/// 1 when told to, fails retryably.
async fn guarded_upload(State(seen): State<Seen>, req: AxumRequest) -> Response {
    if !req.headers().contains_key(header::AUTHORIZATION) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    // Without the layer there is no `Attempt`: every request is attempt 1 of 1.
    let first = req
        .extensions()
        .get::<Attempt>()
        .is_none_or(|a| a.number() == 1);
    let fail_unread = req.headers().contains_key("x-fail-unread");
    if fail_unread && first {
        seen.0.lock().unwrap().push(Vec::new());
        return busy();
    }
    let body = axum::body::to_bytes(req.into_body(), usize::MAX)
        .await
        .expect("body");
    seen.0.lock().unwrap().push(body.to_vec());
    if first {
        return busy();
    }
    (StatusCode::OK, body.len().to_string()).into_response()
}

#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<Vec<u8>>>>);

fn upload_app(layer: Option<SqliteRetryLayer>, seen: Seen) -> Router {
    let router = Router::new().route("/upload", post(guarded_upload));
    match layer {
        Some(layer) => router.layer(layer),
        None => router,
    }
    .with_state(seen)
}

#[tokio::test]
async fn expect_continue_lets_the_handler_refuse_before_the_upload() {
    for with_layer in [false, true] {
        let layer = with_layer.then(|| SqliteRetryLayer::new(quick(3)));
        let server = serve(upload_app(layer, Seen::default())).await;
        let mut client = Raw::connect(server.addr).await;
        client
            .send(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\nexpect: 100-continue\r\n\r\n")
            .await;
        // The client sent only the headers: the first thing it hears must be the refusal, not
        // a `100 Continue` asking for the upload.
        let res = client.response().await;
        assert_eq!(res.status, 401, "with layer: {with_layer}: {res:?}");
    }
}

#[tokio::test]
async fn expect_continue_upload_is_recorded_and_replayed() {
    for with_layer in [false, true] {
        let seen = Seen::default();
        let layer = with_layer.then(|| SqliteRetryLayer::new(quick(3)));
        let server = serve(upload_app(layer, seen.clone())).await;
        let payload = pattern(100_000);
        let mut client = Raw::connect(server.addr).await;
        client
            .send(
                format!(
                    "POST /upload HTTP/1.1\r\nhost: x\r\nauthorization: t\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
                    payload.len()
                )
                .as_bytes(),
            )
            .await;
        let go = client.response().await;
        assert_eq!(go.status, 100, "with layer: {with_layer}");
        client.send(&payload).await;
        let res = client.response().await;
        let seen = seen.0.lock().unwrap().clone();
        if with_layer {
            // Attempt 1 read the client's body and failed; attempt 2 got the recorded bytes.
            assert_eq!(res.status, 200, "{res:?}");
            assert_eq!(res.body, payload.len().to_string().as_bytes());
            assert_eq!(seen.len(), 2);
        } else {
            // Without the layer the retryable failure is the answer.
            assert_eq!(res.status, 503);
            assert_eq!(seen.len(), 1);
        }
        assert!(seen.iter().all(|b| b[..] == payload[..]), "byte-identical");
    }
}

#[tokio::test]
async fn expect_continue_body_left_unread_by_attempt_one_goes_to_attempt_two() {
    let seen = Seen::default();
    let server = serve(upload_app(
        Some(SqliteRetryLayer::new(quick(3))),
        seen.clone(),
    ))
    .await;
    let payload = pattern(5000);
    let mut client = Raw::connect(server.addr).await;
    client
        .send(
            format!(
                "POST /upload HTTP/1.1\r\nhost: x\r\nauthorization: t\r\nx-fail-unread: 1\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
                payload.len()
            )
            .as_bytes(),
        )
        .await;
    // Attempt 1 failed without reading; only attempt 2's read asks for the upload.
    assert_eq!(client.response().await.status, 100);
    client.send(&payload).await;
    let res = client.response().await;
    assert_eq!(res.status, 200, "{res:?}");
    let seen = seen.0.lock().unwrap().clone();
    // Attempt 1 pushed its marker (it read nothing); attempt 2 read the whole upload. What
    // can fail here is attempt 2's body, and that the upload was asked for only once.
    assert_eq!(seen, [Vec::new(), payload]);
    assert_eq!(
        client.buf.len(),
        0,
        "nothing after the answer (no second `100 Continue`)"
    );
}

// --- 2b. The last attempt keeps reading from the client after the request ends ------------

/// Reads the first frame (which asks the client for the upload), then answers at once with a
/// body that streams the rest of the request body back: an echo (a transform, a proxy).
async fn echo(req: AxumRequest) -> Response {
    use http_body_util::BodyExt;
    let len = req.headers()[header::CONTENT_LENGTH].clone();
    let mut body = req.into_body();
    let first = body
        .frame()
        .await
        .expect("a first frame")
        .expect("no error");
    let first = first.into_data().expect("data");
    let rest = body.into_data_stream();
    let stream = futures::StreamExt::chain(
        futures::stream::once(async move { Ok::<_, axum::Error>(first) }),
        rest,
    );
    ([(header::CONTENT_LENGTH, len)], Body::from_stream(stream)).into_response()
}

#[tokio::test]
async fn expect_continue_echo_streams_the_whole_upload_back() {
    for with_layer in [false, true] {
        let router = Router::new().route("/echo", post(echo));
        let app = if with_layer {
            router.layer(SqliteRetryLayer::new(quick(3)))
        } else {
            router
        };
        let server = serve(app).await;
        let payload = pattern(20_000);
        let mut client = Raw::connect(server.addr).await;
        client
            .send(
                format!(
                    "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\nexpect: 100-continue\r\n\r\n",
                    payload.len()
                )
                .as_bytes(),
            )
            .await;
        assert_eq!(client.response().await.status, 100);
        // The first half, then the rest once the answer's head is out: the handler's future
        // has resolved (the request is over for the layer) while the body still streams.
        client.send(&payload[..1000]).await;
        let head_seen = tokio::time::timeout(GUARD, async {
            while !client.buf.windows(4).any(|w| w == b"\r\n\r\n") {
                client.fill().await;
            }
        })
        .await;
        assert!(
            head_seen.is_ok(),
            "the answer's head (with layer: {with_layer})"
        );
        client.send(&payload[1000..]).await;
        let res = client.response().await;
        assert_eq!(res.status, 200, "with layer: {with_layer}");
        assert!(
            res.body == payload,
            "with layer: {with_layer}: echoed {} of {} bytes",
            res.body.len(),
            payload.len()
        );
    }
}

/// Reads frames up to the trailers (not the end of stream) and answers with what it got; on a
/// first attempt under the layer it fails retryably after that read.
async fn trailers_upload(req: AxumRequest) -> Response {
    use http_body_util::BodyExt;
    let replayable_first = req
        .extensions()
        .get::<Attempt>()
        .is_some_and(|a| a.number() == 1);
    let mut body = req.into_body();
    let mut len = 0;
    let mut sum = String::from("none");
    while let Some(frame) = body.frame().await {
        let frame = frame.expect("no error");
        match frame.into_data() {
            Ok(data) => len += data.len(),
            Err(frame) => {
                let trailers = frame.into_trailers().expect("trailers");
                sum = trailers
                    .get("x-sum")
                    .map_or("missing".into(), |v| v.to_str().unwrap().to_owned());
                break;
            }
        }
    }
    if replayable_first {
        return busy();
    }
    (StatusCode::OK, format!("{len} {sum}")).into_response()
}

#[tokio::test]
async fn trailers_reach_the_replay_over_http() {
    for (with_layer, expect) in [(false, true), (true, true), (true, false)] {
        let router = Router::new().route("/t", post(trailers_upload));
        let app = if with_layer {
            router.layer(SqliteRetryLayer::new(quick(3)))
        } else {
            router
        };
        let server = serve(app).await;
        let mut client = Raw::connect(server.addr).await;
        let expect_header = if expect {
            "expect: 100-continue\r\n"
        } else {
            ""
        };
        client
            .send(
                format!(
                    "POST /t HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntrailer: x-sum\r\n{expect_header}\r\n"
                )
                .as_bytes(),
            )
            .await;
        if expect {
            assert_eq!(client.response().await.status, 100);
        }
        client
            .send(b"5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 42\r\n\r\n")
            .await;
        let res = client.response().await;
        assert_eq!(
            (res.status, String::from_utf8_lossy(&res.body).into_owned()),
            (200, "11 42".to_owned()),
            "with layer: {with_layer}, expect: {expect}"
        );
    }
}

// --- Body errors keep their types; size hints are kept -------------------------------------

#[tokio::test]
async fn the_handler_sees_the_same_size_hint() {
    let hint = |layer: Option<SqliteRetryLayer>| async move {
        let router = Router::new().route(
            "/h",
            post(|req: AxumRequest| async move {
                use http_body::Body as _;
                let h = req.body().size_hint();
                format!("{}..{:?}", h.lower(), h.upper())
            }),
        );
        let app = match layer {
            Some(l) => router.layer(l),
            None => router,
        };
        let server = serve(app).await;
        let mut out = Vec::new();
        // Declared length, a body within the cap and one over it (passed through).
        for len in [1234usize, 5000] {
            let mut c = Raw::connect(server.addr).await;
            let mut req = format!("POST /h HTTP/1.1\r\nhost: x\r\ncontent-length: {len}\r\n\r\n")
                .into_bytes();
            req.extend(pattern(len));
            c.send(&req).await;
            out.push(String::from_utf8(c.response().await.body).unwrap());
        }
        out
    };
    let bare = hint(None).await;
    let layered = hint(Some(SqliteRetryLayer::new(quick(3).max_body_bytes(4096)))).await;
    assert_eq!(bare, ["1234..Some(1234)", "5000..Some(5000)"]);
    assert_eq!(layered, bare);
}

// --- 3. The deadline bounds every wait ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait_at_the_replay_gate() {
    // A fails once; its replay (holding the gate, one permit) takes 4 s. B fails once 300 ms
    // later and waits for the gate: it is answered at its deadline, 1 s after it came in.
    let ms = Duration::from_millis;
    // Writer admission off: this is about the replay gate alone (with it, B would wait for the
    // route's slot instead; see tests/layer/admission.rs).
    let policy = quick(5).deadline(ms(1000)).admission(Admission::Off);
    let svc = ServiceBuilder::new()
        .layer(SqliteRetryLayer::new(policy))
        .service_fn(move |req: Request<ReplayBody<Body>>| async move {
            let attempt = req.extensions().get::<Attempt>().unwrap().number();
            if attempt == 1 {
                return Ok::<_, Infallible>(busy());
            }
            if req.uri().path() == "/a" {
                tokio::time::sleep(ms(4000)).await;
            }
            Ok(StatusCode::OK.into_response())
        });
    let start = Instant::now();
    let a = tokio::spawn(
        svc.clone()
            .oneshot(Request::post("/a").body(Body::from("a")).unwrap()),
    );
    tokio::time::sleep(ms(300)).await;
    let b_start = Instant::now();
    let b = svc
        .clone()
        .oneshot(Request::post("/b").body(Body::from("b")).unwrap())
        .await
        .unwrap();
    assert_eq!(b_start.elapsed(), ms(1000), "B is answered at its deadline");
    assert_eq!(b.status(), StatusCode::SERVICE_UNAVAILABLE);
    let o = *b.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!((o.outcome(), o.attempts()), (Outcome::Deadline, 1));
    assert!(b.headers().contains_key(header::RETRY_AFTER));

    // A's replay was running: it is never cut short (it may have committed).
    let a = a.await.unwrap().unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    assert_eq!(
        a.extensions().get::<RetryOutcome>().unwrap().outcome(),
        Outcome::SucceededAfterRetry
    );
    assert_eq!(start.elapsed(), ms(1 + 4000));
}

#[tokio::test(start_paused = true)]
async fn the_deadline_bounds_the_wait_for_the_inner_services_readiness() {
    let ms = Duration::from_millis;
    let layer = SqliteRetryLayer::new(quick(5).deadline(ms(1000)));
    let metrics = layer.metrics();
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(ConcurrencyLimitLayer::new(1))
        .service_fn(move |_: Request<ReplayBody<Body>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async move {
                tokio::time::sleep(ms(5000)).await;
                Ok::<_, Infallible>(StatusCode::OK.into_response())
            }
        });
    // C holds the only permit for 5 s.
    let c_req = tokio::spawn(
        svc.clone()
            .oneshot(Request::post("/").body(Body::from("c")).unwrap()),
    );
    tokio::time::sleep(ms(100)).await;
    let d_start = Instant::now();
    let d = svc
        .clone()
        .oneshot(Request::post("/").body(Body::from("d")).unwrap())
        .await
        .unwrap();
    assert_eq!(
        d_start.elapsed(),
        ms(1000),
        "D gives up waiting at its deadline"
    );
    assert_eq!(d.status(), StatusCode::SERVICE_UNAVAILABLE);
    let after: u32 = d.headers()[header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&after));
    let o = *d.extensions().get::<RetryOutcome>().unwrap();
    assert_eq!((o.outcome(), o.attempts()), (Outcome::Deadline, 0));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        1,
        "D never reached the handler"
    );
    assert_eq!(c_req.await.unwrap().unwrap().status(), StatusCode::OK);
    let snap = metrics.snapshot();
    assert_eq!((snap.deadline, snap.first_try), (1, 1));
    assert_eq!(
        snap.attempts_histogram[0], 1,
        "D made no attempt: not in the histogram"
    );
}

// --- 4. A stalled upload never holds the inner service -------------------------------------

/// Says when it is entered, then reads the body.
async fn write_handler(
    State(entered): State<mpsc::UnboundedSender<()>>,
    req: AxumRequest,
) -> Response {
    let _ = entered.send(());
    match axum::body::to_bytes(req.into_body(), usize::MAX).await {
        Ok(body) => body.len().to_string().into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
    }
}

fn queued_write_app(
    layer: Option<&SqliteRetryLayer>,
    entered: mpsc::UnboundedSender<()>,
) -> Router {
    // The one-writer recipe: one write handler at a time, the layer outside the limit.
    let route = match layer {
        Some(layer) => post(write_handler).layer(
            ServiceBuilder::new()
                .layer(layer.clone())
                .layer(ConcurrencyLimitLayer::new(1)),
        ),
        None => post(write_handler).layer(ConcurrencyLimitLayer::new(1)),
    };
    // Built once: without `with_state`, axum would build the limit anew for every request.
    Router::new().route("/w", route).with_state(entered)
}

#[tokio::test]
async fn a_stalled_upload_does_not_hold_the_queued_write_route() {
    for with_layer in [false, true] {
        let layer = SqliteRetryLayer::new(quick(3));
        let metrics = layer.metrics();
        let (entered_tx, mut entered) = mpsc::unbounded_channel();
        let app = queued_write_app(with_layer.then_some(&layer), entered_tx);
        let server = serve(app).await;

        // A announces 1,000 bytes, sends 10, and stalls.
        let mut a = Raw::connect(server.addr).await;
        a.send(b"POST /w HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n0123456789")
            .await;
        // Wait until A is inside the route: called by the layer (with it), or inside the
        // handler, holding the only permit (without it).
        tokio::time::timeout(GUARD, async {
            if with_layer {
                while metrics.snapshot().requests == 0 {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            } else {
                entered.recv().await.unwrap();
            }
        })
        .await
        .expect("A reached the route");

        // B is a whole, small write.
        let mut b = Raw::connect(server.addr).await;
        b.send(b"POST /w HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\nhello")
            .await;
        if with_layer {
            let res = b.response().await;
            assert_eq!((res.status, &res.body[..]), (200, &b"5"[..]));
        } else {
            // Bare, A holds the permit while its body trickles in: B cannot be answered
            // before A completes, however long we wait.
            let waited = tokio::time::timeout(Duration::from_millis(300), b.read_response()).await;
            assert!(waited.is_err(), "B answered while A held the permit");
        }
        // A completes; both are answered.
        a.send(&[b'x'; 990]).await;
        let res = a.response().await;
        assert_eq!((res.status, &res.body[..]), (200, &b"1000"[..]));
        if !with_layer {
            assert_eq!(b.response().await.status, 200);
        }
    }
}

#[tokio::test]
async fn a_body_deadline_outside_the_layer_bounds_a_stalled_upload() {
    // tower-http's `RequestBodyDeadlineLayer` (and `RequestBodyTimeoutLayer` for idle time)
    // outside the layer bounds how long the layer buffers: the stalled upload ends with the
    // same answer as without the layer, and its bytes are given back.
    let mut answers = Vec::new();
    for with_layer in [false, true] {
        let layer = SqliteRetryLayer::new(quick(3));
        let metrics = layer.metrics();
        let (entered_tx, _entered) = mpsc::unbounded_channel();
        let app = queued_write_app(with_layer.then_some(&layer), entered_tx)
            .layer(RequestBodyDeadlineLayer::new(Duration::from_millis(200)));
        let server = serve(app).await;
        let mut a = Raw::connect(server.addr).await;
        a.send(b"POST /w HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n0123456789")
            .await;
        let res = a.response().await;
        answers.push(res.status);
        if with_layer {
            let snap = metrics.snapshot();
            assert_eq!(
                snap.buffered_bytes, 0,
                "the stalled body's bytes are given back"
            );
            assert_eq!(snap.requests, snap.finished());
        }
    }
    assert_eq!(
        answers[0], answers[1],
        "the same answer with and without the layer"
    );
    assert!((400..500).contains(&answers[0]), "{answers:?}");
}

// --- Nested layers on the error path --------------------------------------------------------

fn busy_error() -> BoxError {
    Box::new(sqlx::Error::PoolTimedOut)
}

#[tokio::test(start_paused = true)]
async fn nested_layers_on_the_error_path_never_multiply_attempts() {
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let inner = SqliteRetryLayer::new(quick(3)).classify_errors(RetryDriverErrors);
    let outer = SqliteRetryLayer::new(quick(4)).classify_errors(RetryDriverErrors);
    let (inner_m, outer_m) = (inner.metrics(), outer.metrics());
    let svc = ServiceBuilder::new().layer(outer).layer(inner).service_fn(
        move |_: Request<ReplayBody<ReplayBody<Body>>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<Response, BoxError>(busy_error()) }
        },
    );
    let err = svc
        .oneshot(Request::post("/").body(Body::from("x")).unwrap())
        .await
        .unwrap_err();
    assert!(err.downcast_ref::<sqlx::Error>().is_some());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "the inner layer's 3, not 4 × 3"
    );
    let (i, o) = (inner_m.snapshot(), outer_m.snapshot());
    assert_eq!((i.exhausted, i.retries), (1, 2));
    assert_eq!(
        (o.exhausted, o.retries),
        (1, 0),
        "the outer one records, never replays"
    );
}

#[tokio::test(start_paused = true)]
async fn one_layer_nested_in_itself_shares_its_gate_without_deadlock() {
    // The same layer (one replay gate of one permit) outside and inside: the inner one's
    // replays must never wait for a permit its outer attempt holds.
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let layer = SqliteRetryLayer::new(quick(3).deadline(Duration::from_secs(3600)))
        .classify_errors(RetryDriverErrors);
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(layer.clone())
        .service_fn(move |_: Request<ReplayBody<ReplayBody<Body>>>| {
            c.fetch_add(1, Ordering::SeqCst);
            async { Err::<Response, BoxError>(busy_error()) }
        });
    let res = tokio::time::timeout(
        Duration::from_secs(60),
        svc.oneshot(Request::post("/").body(Body::from("x")).unwrap()),
    )
    .await
    .expect("no deadlock on the shared gate");
    assert!(res.is_err());
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

// --- Retry-After only where a later try can succeed ------------------------------------------

#[tokio::test]
async fn retry_after_is_spread_and_never_sent_after_a_fence() {
    let app = Router::new()
        .route("/exhausted", post(|| async { busy() }))
        .route(
            "/fenced",
            post(|attempt: Attempt| async move {
                attempt.fence();
                busy()
            }),
        )
        .layer(SqliteRetryLayer::new(quick(2).max_body_bytes(4)));
    let call = |path: &'static str, body: &'static str| {
        let app = app.clone();
        async move {
            app.oneshot(Request::post(path).body(Body::from(body)).unwrap())
                .await
                .unwrap()
        }
    };
    let fenced = call("/fenced", "x").await;
    let o = fenced.extensions().get::<RetryOutcome>().unwrap().outcome();
    assert_eq!(o, Outcome::Fenced);
    assert!(
        !fenced.headers().contains_key(header::RETRY_AFTER),
        "the handler said a repeat would do it twice"
    );
    // Over the body cap: the layer could not replay, but nothing was committed (no fence),
    // so the client's own retry is as safe as the replay would have been.
    let over = call("/exhausted", "too long").await;
    let o = over.extensions().get::<RetryOutcome>().unwrap().outcome();
    assert_eq!(o, Outcome::NotReplayable);
    assert!(over.headers().contains_key(header::RETRY_AFTER));

    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let res = call("/exhausted", "x").await;
        let o = res.extensions().get::<RetryOutcome>().unwrap().outcome();
        assert_eq!(o, Outcome::Exhausted);
        let after: u32 = res.headers()[header::RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!((1..=3).contains(&after), "{after}");
        seen.insert(after);
    }
    // 200 draws from {1, 2, 3}: all three appear unless the spread is broken (the chance that
    // a fair draw misses one is below 1e-34).
    assert_eq!(seen.len(), 3, "spread, not lock step: {seen:?}");
}

// --- Accounting ----------------------------------------------------------------------------

/// A service that fails in `poll_ready` (once broken).
#[derive(Clone)]
struct Broken;

impl Service<Request<ReplayBody<Body>>> for Broken {
    type Response = Response;
    type Error = BoxError;
    type Future = std::future::Ready<Result<Response, BoxError>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), BoxError>> {
        std::task::Poll::Ready(Err("broken".into()))
    }

    fn call(&mut self, _: Request<ReplayBody<Body>>) -> Self::Future {
        panic!("called although poll_ready failed")
    }
}

#[tokio::test(start_paused = true)]
async fn the_counters_add_up() {
    let ms = Duration::from_millis;
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(3)
            .base_delay(ms(100))
            .max_delay(ms(100))
            .jitter(Jitter::None),
    );
    let metrics = layer.metrics();
    let svc = ServiceBuilder::new().layer(layer.clone()).service_fn(
        |req: Request<ReplayBody<Body>>| async move {
            let attempt = req.extensions().get::<Attempt>().unwrap().number();
            Ok::<_, Infallible>(match req.uri().path() {
                "/ok" => StatusCode::OK.into_response(),
                "/second" if attempt == 2 => StatusCode::OK.into_response(),
                "/conflict" => StatusCode::CONFLICT.into_response(),
                _ => busy(),
            })
        },
    );
    let send = |path: &'static str| {
        svc.clone()
            .oneshot(Request::post(path).body(Body::from("x")).unwrap())
    };
    send("/ok").await.unwrap();
    send("/second").await.unwrap();
    send("/conflict").await.unwrap();
    send("/busy").await.unwrap();
    // Cancelled during its first backoff: one attempt, and no replay was started.
    let cancelled = tokio::time::timeout(ms(50), send("/busy")).await;
    assert!(cancelled.is_err());
    let snap = metrics.snapshot();
    assert_eq!(snap.cancelled, 1);
    assert_eq!(
        snap.retries,
        1 + 2,
        "/second's one and /busy's two; none for the cancelled"
    );

    // A service that fails in `poll_ready` before any attempt: non_retryable, no attempt.
    let broken = ServiceBuilder::new().layer(layer).service(Broken);
    let err = broken
        .oneshot(Request::post("/").body(Body::from("x")).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "broken");

    let snap = metrics.snapshot();
    assert_eq!(snap.requests, 6);
    assert_eq!(
        (snap.first_try, snap.succeeded_after_retry, snap.exhausted),
        (2, 1, 1)
    );
    assert_eq!((snap.cancelled, snap.non_retryable), (1, 1));
    assert_eq!(
        snap.requests,
        snap.finished(),
        "every request has one outcome"
    );
    assert_eq!(snap.in_flight(), 0);
    let histogram_total: u64 = snap.attempts_histogram.iter().sum();
    assert_eq!(histogram_total, 5, "every request that made an attempt");
    let attempts_beyond_first: u64 = snap
        .attempts_histogram
        .iter()
        .enumerate()
        .map(|(i, n)| i as u64 * n)
        .sum();
    assert_eq!(
        snap.retries, attempts_beyond_first,
        "retries = Σ (attempts − 1)"
    );
}
