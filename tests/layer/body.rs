//! Replay bodies: byte-identical on every attempt, pristine heads, over-cap and streamed bodies
//! passed through whole and never replayed, the in-flight cap.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, on, post};
use futures::stream;
use http::{HeaderValue, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tower::ServiceExt;
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer};

type Heads = Arc<Mutex<Vec<(Vec<String>, Option<&'static str>)>>>;

#[derive(Clone, Default)]
struct Seen {
    bodies: Arc<Mutex<Vec<Bytes>>>,
    heads: Heads,
}

#[derive(Clone)]
struct Marker(&'static str);

fn policy() -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(3)
        .base_delay(Duration::ZERO)
        .max_delay(Duration::from_millis(1))
        .jitter(Jitter::None)
        .max_body_bytes(1024)
        .max_buffered_bytes(4096)
}

/// Records the body and head it saw, scribbles on the request's extensions, and fails
/// retryably (a real sqlx error) until the last attempt.
fn app(seen: Seen, policy: RetryPolicy) -> Router {
    Router::new()
        .route(
            "/upload",
            on(
                MethodFilter::POST.or(MethodFilter::CONNECT),
                move |attempt: Attempt, mut req: Request| {
                    let seen = seen.clone();
                    async move {
                        let headers = req
                            .headers()
                            .get_all("x-dup")
                            .iter()
                            .map(|v| v.to_str().unwrap().to_owned())
                            .collect();
                        let marker = req.extensions().get::<Marker>().map(|m| m.0);
                        // An attempt's changes must never leak into the next one.
                        req.extensions_mut().insert(Marker("dirty"));
                        req.headers_mut()
                            .append("x-dup", HeaderValue::from_static("dirty"));
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        seen.bodies.lock().unwrap().push(body);
                        seen.heads.lock().unwrap().push((headers, marker));
                        if attempt.number() < attempt.max() {
                            Err(DbError::from(sqlx::Error::PoolTimedOut))
                        } else {
                            Ok(StatusCode::OK)
                        }
                    }
                },
            ),
        )
        .layer(SqliteRetryLayer::new(policy))
}

fn request(body: Body) -> Request {
    let mut req = http::Request::post("/upload")
        .header("x-dup", "first")
        .header("x-dup", "second")
        .body(body)
        .unwrap();
    req.extensions_mut().insert(Marker("pristine"));
    req
}

fn chunked(chunks: Vec<Bytes>) -> Body {
    Body::new(StreamBody::new(stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, Infallible>(Frame::data(c))),
    )))
}

fn outcome(res: &Response) -> RetryOutcome {
    *res.extensions().get::<RetryOutcome>().unwrap()
}

#[tokio::test]
async fn body_and_head_are_identical_on_every_attempt() {
    let seen = Seen::default();
    let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    let chunks = payload.chunks(97).map(Bytes::copy_from_slice).collect();
    let res = app(seen.clone(), policy())
        .oneshot(request(chunked(chunks)))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome(&res).attempts(), 3);
    let bodies = seen.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 3);
    assert!(bodies.iter().all(|b| b[..] == payload[..]));
    let heads = seen.heads.lock().unwrap().clone();
    for (headers, marker) in heads {
        assert_eq!(
            headers,
            ["first", "second"],
            "duplicate headers kept in order"
        );
        assert_eq!(marker, Some("pristine"));
    }
}

#[tokio::test]
async fn declared_over_cap_body_passes_through_once() {
    let seen = Seen::default();
    let payload = Bytes::from(vec![b'x'; 5000]);
    let mut req = request(Body::from(payload.clone()));
    req.headers_mut()
        .insert("content-length", HeaderValue::from_static("5000"));
    let res = app(seen.clone(), policy()).oneshot(req).await.unwrap();
    // Not rejected: the handler answered (503 here, its own response), once.
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable);
    assert_eq!(seen.bodies.lock().unwrap().clone(), vec![payload]);
}

#[tokio::test]
async fn streamed_body_crossing_the_cap_reaches_the_handler_whole() {
    let seen = Seen::default();
    let payload: Vec<u8> = (0..3000u32).map(|i| (i % 256) as u8).collect();
    let chunks = payload.chunks(100).map(Bytes::copy_from_slice).collect();
    let layer_policy = policy();
    let res = app(seen.clone(), layer_policy)
        .oneshot(request(chunked(chunks)))
        .await
        .unwrap();
    assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable);
    assert_eq!(outcome(&res).attempts(), 1);
    let bodies = seen.bodies.lock().unwrap().clone();
    assert_eq!(bodies.len(), 1);
    assert_eq!(bodies[0][..], payload[..]);
}

#[tokio::test]
async fn in_flight_cap_passes_through_and_gauge_returns_to_zero() {
    // Per-request cap 1024, in flight 1024: two 800-byte bodies cannot both be buffered.
    let policy = policy().max_body_bytes(1024).max_buffered_bytes(1024);
    let layer = SqliteRetryLayer::new(policy);
    let metrics = layer.metrics();
    let (release, released) = tokio::sync::watch::channel(false);
    let second_calls = Arc::new(Mutex::new(Vec::new()));
    let calls = second_calls.clone();
    let app = Router::new()
        .route(
            "/hold",
            post(move |body: Bytes| {
                let mut released = released.clone();
                let calls = calls.clone();
                async move {
                    if body[0] == 1 {
                        released.wait_for(|r| *r).await.unwrap();
                        return Ok(body.len().to_string());
                    }
                    // The second request fails retryably: a buffered body would be replayed.
                    calls.lock().unwrap().push(body.len());
                    Err(DbError::from(sqlx::Error::PoolTimedOut))
                }
            }),
        )
        .layer(layer);
    let first = tokio::spawn(
        app.clone().oneshot(
            http::Request::post("/hold")
                .body(Body::from(vec![1u8; 800]))
                .unwrap(),
        ),
    );
    tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while metrics.snapshot().buffered_bytes == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the first body was buffered");
    assert_eq!(metrics.snapshot().buffered_bytes, 800);
    let second = app
        .clone()
        .oneshot(
            http::Request::post("/hold")
                .body(Body::from(vec![2u8; 800]))
                .unwrap(),
        )
        .await
        .unwrap();
    // Passed through: its retryable failure is not replayed (a buffered body would have been,
    // twice more), and the outcome says why.
    assert_eq!(outcome(&second).outcome(), Outcome::NotReplayable);
    assert_eq!(outcome(&second).attempts(), 1);
    assert_eq!(
        *second_calls.lock().unwrap(),
        [800],
        "one attempt, the body whole"
    );
    assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
    release.send(true).unwrap();
    let first = first.await.unwrap().unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    let snap = metrics.snapshot();
    assert_eq!(snap.buffered_bytes, 0, "permits released");
    assert_eq!(snap.peak_buffered_bytes, 800);
}

#[tokio::test]
async fn upgrade_and_connect_pass_through() {
    let seen = Seen::default();
    let mut upgrade = request(Body::from("hello"));
    upgrade
        .headers_mut()
        .insert("upgrade", HeaderValue::from_static("websocket"));
    let mut connect = request(Body::from("hello"));
    *connect.method_mut() = http::Method::CONNECT;
    for (i, req) in [upgrade, connect].into_iter().enumerate() {
        let method = req.method().clone();
        let res = app(seen.clone(), policy()).oneshot(req).await.unwrap();
        assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable, "{method}");
        assert_eq!(
            seen.bodies.lock().unwrap().len(),
            i + 1,
            "{method}: one attempt"
        );
    }
}

#[tokio::test]
async fn single_attempt_policy_never_buffers() {
    let layer = SqliteRetryLayer::new(RetryPolicy::default().max_attempts(1));
    let metrics = layer.metrics();
    let app = Router::new()
        .route(
            "/x",
            post(|body: Bytes| async move { body.len().to_string().into_response() }),
        )
        .layer(layer);
    let res = app
        .oneshot(
            http::Request::post("/x")
                .body(Body::from(vec![0u8; 5000]))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(metrics.snapshot().peak_buffered_bytes, 0);
}

// --- The recorded path (`Expect: 100-continue`), driven frame by frame ---------------------
//
// The client body is a channel the test writes frames into, so that every read, and every
// frame that is not there yet, happens where the test says.

type FrameTx = futures::channel::mpsc::UnboundedSender<Result<Frame<Bytes>, std::io::Error>>;
type Handler = Arc<
    dyn Fn(u32, ReplayBody<Body>) -> futures::future::BoxFuture<'static, Response> + Send + Sync,
>;

/// A client body whose frames the test sends; `size_hint` is exact when `len` is given (as
/// hyper's is for a declared `Content-Length`), counting down as frames are read.
struct Client {
    rx: futures::channel::mpsc::UnboundedReceiver<Result<Frame<Bytes>, std::io::Error>>,
    left: Option<u64>,
}

impl http_body::Body for Client {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        use futures::StreamExt;
        let frame = std::task::ready!(self.rx.poll_next_unpin(cx));
        if let (Some(Ok(f)), Some(left)) = (&frame, self.left.as_mut()) {
            *left -= f.data_ref().map_or(0, |d| d.len() as u64);
        }
        std::task::Poll::Ready(frame)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.left
            .map_or_else(http_body::SizeHint::new, http_body::SizeHint::with_exact)
    }
}

fn client(len: Option<u64>) -> (FrameTx, Body) {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    (tx, Body::new(Client { rx, left: len }))
}

fn data(tx: &FrameTx, bytes: &[u8]) {
    tx.unbounded_send(Ok(Frame::data(Bytes::copy_from_slice(bytes))))
        .unwrap();
}

fn trailers(pairs: &[(&'static str, &'static str)]) -> http::HeaderMap {
    pairs
        .iter()
        .map(|(n, v)| {
            (
                http::HeaderName::from_static(n),
                HeaderValue::from_static(v),
            )
        })
        .collect()
}

fn busy() -> Response {
    let mut res = (StatusCode::SERVICE_UNAVAILABLE, "busy").into_response();
    res.extensions_mut()
        .insert(tower_sqlite_retry::Retryable::new("5", "SQLITE_BUSY"));
    res
}

/// A layer over a handler that gets the attempt's number and body.
fn service(
    policy: RetryPolicy,
    handler: Handler,
) -> (
    impl tower::Service<
        http::Request<Body>,
        Response = Response,
        Error = Infallible,
        Future = impl Send,
    > + Clone,
    tower_sqlite_retry::RetryMetrics,
) {
    let layer = SqliteRetryLayer::new(policy);
    let metrics = layer.metrics();
    let svc = tower::ServiceBuilder::new().layer(layer).service_fn(
        move |req: http::Request<ReplayBody<Body>>| {
            let n = req.extensions().get::<Attempt>().unwrap().number();
            let res = handler(n, req.into_body());
            async move { Ok::<_, Infallible>(res.await) }
        },
    );
    (svc, metrics)
}

fn upload(body: Body, expect: bool) -> http::Request<Body> {
    let mut req = http::Request::post("/upload");
    if expect {
        req = req.header("expect", "100-continue");
    }
    req.body(body).unwrap()
}

/// How a read ended.
#[derive(Debug, Clone, PartialEq)]
enum End {
    /// A clean end of stream.
    Clean,
    /// An error frame (its message).
    Error(String),
    /// The reader stopped before the end.
    Stopped,
}

/// What one reader saw.
#[derive(Debug, Clone, PartialEq)]
struct Read {
    bytes: Vec<u8>,
    trailers: Option<http::HeaderMap>,
    end: End,
}

/// Reads up to `frames` frames (all of them for `usize::MAX`).
async fn read<B>(body: &mut B, frames: usize) -> Read
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut out = Read {
        bytes: Vec::new(),
        trailers: None,
        end: End::Stopped,
    };
    for _ in 0..frames {
        match body.frame().await {
            None => {
                out.end = End::Clean;
                break;
            }
            Some(Err(e)) => {
                out.end = End::Error(e.to_string());
                break;
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(d) => out.bytes.extend_from_slice(&d),
                Err(frame) => {
                    let t = frame.into_trailers().unwrap();
                    out.trailers.get_or_insert_with(Default::default).extend(t);
                }
            },
        }
    }
    out
}

fn quick_policy() -> RetryPolicy {
    policy().max_body_bytes(4096).max_buffered_bytes(64 * 1024)
}

#[tokio::test]
async fn a_task_reading_the_upload_after_202_reads_every_byte() {
    // The handler answers `202 Accepted` once the upload is under way and reads the rest in a
    // task of its own: the request is over for the layer, the upload is not.
    for with_layer in [false, true] {
        let (read_tx, mut read_rx) = tokio::sync::mpsc::unbounded_channel();
        let handler = move |mut body: ReplayBody<Body>| {
            let read_tx = read_tx.clone();
            async move {
                let first = read(&mut body, 1).await;
                tokio::spawn(async move {
                    let mut rest = read(&mut body, usize::MAX).await;
                    rest.bytes.splice(0..0, first.bytes);
                    read_tx.send(rest).unwrap();
                });
                StatusCode::ACCEPTED.into_response()
            }
        };
        let (tx, body) = client(None);
        data(&tx, b"first ");
        let res = if with_layer {
            let handler: Handler = Arc::new(move |_, body| Box::pin(handler(body)));
            let (svc, _) = service(quick_policy(), handler);
            svc.oneshot(upload(body, true)).await.unwrap()
        } else {
            // Without the layer the handler gets the client's body itself.
            let (svc, _) = service(RetryPolicy::default().max_attempts(1), {
                let h: Handler = Arc::new(move |_, body| Box::pin(handler(body)));
                h
            });
            svc.oneshot(upload(body, true)).await.unwrap()
        };
        assert_eq!(res.status(), StatusCode::ACCEPTED);
        data(&tx, b"and the rest");
        drop(tx);
        let read = tokio::time::timeout(Duration::from_secs(20), read_rx.recv())
            .await
            .expect("the task read to an end (guard against a hang)")
            .unwrap();
        assert_eq!(
            (String::from_utf8_lossy(&read.bytes), read.end),
            ("first and the rest".into(), End::Clean),
            "with layer: {with_layer}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_replay_never_starts_after_the_recording_was_lost() {
    // Attempt 1 reads the first frame, hands the body to a task and fails retryably. During
    // the backoff the task reads on, past `max_body_bytes`: the recording is given up, and no
    // attempt may start on what is left.
    let (ran, mut ran_rx) = tokio::sync::mpsc::unbounded_channel();
    let (task_done_tx, mut task_done) = tokio::sync::mpsc::unbounded_channel();
    let handler: Handler = Arc::new(move |n, mut body| {
        let (ran, task_done_tx) = (ran.clone(), task_done_tx.clone());
        Box::pin(async move {
            let first = read(&mut body, 1).await;
            ran.send((n, first.clone())).unwrap();
            if n == 1 {
                tokio::spawn(async move {
                    task_done_tx
                        .send(read(&mut body, usize::MAX).await)
                        .unwrap();
                });
                return busy();
            }
            let rest = read(&mut body, usize::MAX).await;
            (
                StatusCode::OK,
                format!("{}", first.bytes.len() + rest.bytes.len()),
            )
                .into_response()
        })
    });
    let policy = quick_policy()
        .base_delay(Duration::from_secs(1))
        .max_delay(Duration::from_secs(1));
    let (svc, metrics) = service(policy, handler);
    let (tx, body) = client(None);
    data(&tx, &[1; 100]);
    let request = tokio::spawn(svc.oneshot(upload(body, true)));
    assert_eq!(ran_rx.recv().await.unwrap().0, 1);
    // In the backoff now (the clock is paused): the client sends more than the cap.
    data(&tx, &[2; 5000]);
    drop(tx);
    let task_read = task_done.recv().await.unwrap();
    assert_eq!((task_read.bytes.len(), task_read.end), (5000, End::Clean));
    let res = request.await.unwrap().unwrap();
    assert!(
        ran_rx.try_recv().is_err(),
        "no attempt after the recording was lost"
    );
    assert_eq!(
        res.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "attempt 1's answer"
    );
    assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable);
    assert_eq!(outcome(&res).attempts(), 1);
    let snap = metrics.snapshot();
    assert_eq!((snap.retries, snap.not_replayable), (0, 1));
    assert_eq!(snap.buffered_bytes, 0);
}

#[tokio::test]
async fn a_reader_left_from_an_older_attempt_gets_an_error_never_an_end() {
    // Attempt 1 gives its body to a task that waits for the client (which has sent nothing
    // yet) and fails; attempt 2 gives its body to a task that reads only later; attempt 3
    // reads the whole upload. Both tasks' bodies went to a newer attempt: each must hear an
    // error (the parked one woken, not left pending), never a clean end of a shorter body.
    let (task_tx, mut task_rx) = tokio::sync::mpsc::unbounded_channel();
    let (late_tx, mut late_rx) = tokio::sync::mpsc::unbounded_channel();
    let (third_tx, mut third) = tokio::sync::mpsc::unbounded_channel();
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let handler: Handler = Arc::new(move |n, mut body| {
        let (task_tx, late_tx, third_tx, mut go_rx) = (
            task_tx.clone(),
            late_tx.clone(),
            third_tx.clone(),
            go_rx.clone(),
        );
        Box::pin(async move {
            match n {
                1 => {
                    tokio::spawn(async move { task_tx.send(read(&mut body, usize::MAX).await) });
                    // Let the task start waiting for the client's first frame.
                    tokio::task::yield_now().await;
                    busy()
                }
                2 => {
                    tokio::spawn(async move {
                        go_rx.wait_for(|go| *go).await.unwrap();
                        late_tx.send(read(&mut body, usize::MAX).await)
                    });
                    busy()
                }
                _ => {
                    third_tx.send(()).unwrap();
                    let all = read(&mut body, usize::MAX).await;
                    (StatusCode::OK, all.bytes).into_response()
                }
            }
        })
    });
    let (svc, _) = service(quick_policy(), handler);
    let (tx, body) = client(None);
    let request = tokio::spawn(svc.oneshot(upload(body, true)));
    // The client sends its upload only once attempt 3 has the body.
    third.recv().await.unwrap();
    data(&tx, b"the upload");
    drop(tx);
    let res = tokio::time::timeout(Duration::from_secs(20), request)
        .await
        .expect("answered")
        .unwrap()
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome(&res).attempts(), 3);
    go_tx.send(true).unwrap();
    for (who, rx) in [("parked", &mut task_rx), ("late", &mut late_rx)] {
        let seen = tokio::time::timeout(Duration::from_secs(20), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("the {who} reader was never woken"))
            .unwrap();
        assert!(
            matches!(&seen.end, End::Error(e) if e.contains("newer attempt")),
            "the {who} reader of an older attempt: {seen:?}"
        );
    }
}

#[tokio::test]
async fn trailers_survive_a_replay_on_every_path() {
    let sent = trailers(&[("x-checksum", "abc"), ("x-more", "1")]);
    // (expect, max_body_bytes, frames attempt 1 reads): recorded with attempt 1 reading the
    // trailers frame but not the end; recorded and read whole; buffered; passed through.
    for (case, expect, cap, first_reads) in [
        ("recorded, trailers read, end not", true, 4096, 3),
        ("recorded, read whole", true, 4096, usize::MAX),
        ("recorded, read in part", true, 4096, 1),
        ("buffered", false, 4096, usize::MAX),
        ("passed through", false, 4, usize::MAX),
    ] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let handler: Handler = Arc::new(move |n, mut body| {
            let s = s.clone();
            Box::pin(async move {
                let frames = if n == 1 { first_reads } else { usize::MAX };
                let r = read(&mut body, frames).await;
                s.lock().unwrap().push(r);
                if n == 1 {
                    busy()
                } else {
                    StatusCode::OK.into_response()
                }
            })
        });
        let (svc, _) = service(quick_policy().max_body_bytes(cap), handler);
        let (tx, body) = client(None);
        data(&tx, b"hello ");
        data(&tx, b"world");
        tx.unbounded_send(Ok(Frame::trailers(sent.clone())))
            .unwrap();
        drop(tx);
        let response = svc.oneshot(upload(body, expect)).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        let whole = Read {
            bytes: b"hello world".to_vec(),
            trailers: Some(sent.clone()),
            end: End::Clean,
        };
        // every path but the one over the cap replays: two attempts, the second answers
        let replayed = case != "passed through";
        let (status, attempts) = match replayed {
            true => (StatusCode::OK, 2),
            false => (StatusCode::SERVICE_UNAVAILABLE, 1),
        };
        assert_eq!(response.status(), status, "{case}");
        assert_eq!(seen.len(), attempts, "{case}: attempts");
        for (i, read) in seen.iter().enumerate() {
            if read.end == End::Clean {
                assert_eq!(read, &whole, "{case}: attempt {}", i + 1);
            }
        }
        assert_eq!(seen.last().unwrap(), &whole, "{case}: the last attempt");
    }
}

#[tokio::test]
async fn recording_with_partial_reads_replays_the_whole_upload() {
    // Each attempt reads a different number of frames before failing; the last reads all.
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    let handler: Handler = Arc::new(move |n, mut body| {
        let s = s.clone();
        Box::pin(async move {
            let frames = [2, 0, 5, usize::MAX][n as usize - 1];
            let r = read(&mut body, frames).await;
            s.lock().unwrap().push(r);
            if n < 4 {
                busy()
            } else {
                StatusCode::OK.into_response()
            }
        })
    });
    let (svc, metrics) = service(quick_policy().max_attempts(4), handler);
    let (tx, body) = client(None);
    let payload: Vec<u8> = (0..=255).collect();
    for chunk in payload.chunks(37) {
        data(&tx, chunk);
    }
    drop(tx);
    let res = svc.oneshot(upload(body, true)).await.unwrap();
    assert_eq!(outcome(&res).outcome(), Outcome::SucceededAfterRetry);
    let seen = seen.lock().unwrap().clone();
    let prefix = |n: usize| payload[..(37 * n).min(payload.len())].to_vec();
    assert_eq!(seen[0].bytes, prefix(2));
    assert_eq!(seen[1].bytes, prefix(0));
    // Attempt 3: 2 recorded frames (one segment), then 3 from the client: the frames differ,
    // the bytes are the client's.
    assert_eq!(seen[2].bytes, &payload[..seen[2].bytes.len()]);
    assert!(seen[2].bytes.len() >= 37 * 3);
    assert_eq!((&seen[3].bytes, &seen[3].end), (&payload, &End::Clean));
    assert_eq!(metrics.snapshot().buffered_bytes, 0);
}

#[tokio::test]
async fn recording_over_the_cap_or_a_client_error_stops_the_replays() {
    for case in ["over the cap", "client error"] {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let handler: Handler = Arc::new(move |_, mut body| {
            let s = s.clone();
            Box::pin(async move {
                let r = read(&mut body, usize::MAX).await;
                s.lock().unwrap().push(r);
                busy()
            })
        });
        let (svc, metrics) = service(quick_policy().max_body_bytes(100), handler);
        let (tx, body) = client(None);
        data(&tx, &[7; 60]);
        match case {
            "over the cap" => data(&tx, &[8; 60]),
            _ => tx
                .unbounded_send(Err(std::io::Error::other("client went away")))
                .unwrap(),
        }
        drop(tx);
        let res = svc.oneshot(upload(body, true)).await.unwrap();
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{case}: one attempt");
        match case {
            "over the cap" => {
                let mut whole = vec![7; 60];
                whole.extend([8; 60]);
                assert_eq!((&seen[0].bytes, &seen[0].end), (&whole, &End::Clean));
            }
            _ => assert_eq!(
                (seen[0].bytes.len(), &seen[0].end),
                (60, &End::Error("client went away".into()))
            ),
        }
        assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable, "{case}");
        assert_eq!(metrics.snapshot().buffered_bytes, 0, "{case}");
    }
}

#[tokio::test]
async fn the_recording_path_keeps_the_size_hint() {
    let hints = Arc::new(Mutex::new(Vec::new()));
    let h = hints.clone();
    let handler: Handler = Arc::new(move |n, mut body| {
        let h = h.clone();
        Box::pin(async move {
            use http_body::Body as _;
            let hint = body.size_hint();
            h.lock().unwrap().push((hint.lower(), hint.upper()));
            let _ = read(&mut body, if n == 1 { 1 } else { usize::MAX }).await;
            if n == 1 {
                busy()
            } else {
                StatusCode::OK.into_response()
            }
        })
    });
    let (svc, _) = service(quick_policy(), handler);
    let (tx, body) = client(Some(30));
    data(&tx, &[1; 10]);
    data(&tx, &[2; 20]);
    drop(tx);
    let _ = svc.oneshot(upload(body, true)).await.unwrap();
    // Attempt 2: 10 recorded bytes plus the 20 the client still has to send.
    assert_eq!(*hints.lock().unwrap(), [(30, Some(30)), (30, Some(30))]);
}

#[tokio::test]
async fn the_last_attempt_records_nothing_it_could_never_replay() {
    // Two attempts: the first reads nothing, the second (the last) reads the whole upload.
    let handler: Handler = Arc::new(move |n, mut body| {
        Box::pin(async move {
            if n == 1 {
                return busy();
            }
            let all = read(&mut body, usize::MAX).await;
            (StatusCode::OK, all.bytes).into_response()
        })
    });
    let (svc, metrics) = service(quick_policy().max_attempts(2), handler);
    let (tx, body) = client(None);
    data(&tx, &[3; 1000]);
    drop(tx);
    let res = svc.oneshot(upload(body, true)).await.unwrap();
    assert_eq!(outcome(&res).attempts(), 2);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 1000);
    assert_eq!(
        metrics.snapshot().peak_buffered_bytes,
        0,
        "nothing recorded"
    );
}

#[tokio::test]
async fn a_passed_through_prefix_stays_counted_while_held() {
    // Over the per-request cap: what was read stays held (for the handler) until it is read.
    let (go_tx, go_rx) = tokio::sync::watch::channel(false);
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let handler: Handler = Arc::new(move |_, mut body| {
        let (mut go_rx, entered_tx) = (go_rx.clone(), entered_tx.clone());
        Box::pin(async move {
            entered_tx.send(()).unwrap();
            go_rx.wait_for(|go| *go).await.unwrap();
            let all = read(&mut body, usize::MAX).await;
            (StatusCode::OK, all.bytes).into_response()
        })
    });
    let (svc, metrics) = service(quick_policy().max_body_bytes(1000), handler);
    let (tx, body) = client(None);
    data(&tx, &[1; 800]);
    data(&tx, &[2; 800]);
    drop(tx);
    let request = tokio::spawn(svc.oneshot(upload(body, false)));
    entered.recv().await.unwrap();
    assert!(
        metrics.snapshot().buffered_bytes >= 800,
        "the 800-byte prefix is held, counted {}",
        metrics.snapshot().buffered_bytes
    );
    go_tx.send(true).unwrap();
    let res = request.await.unwrap().unwrap();
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes().len(),
        1600
    );
    assert_eq!(metrics.snapshot().buffered_bytes, 0);
}

// --- Property: every attempt that reads to the end reads the client's body, or an error ---

mod props {
    use super::*;
    use proptest::prelude::*;

    /// One request: the client's frames, how each attempt reads, and the caps.
    #[derive(Debug, Clone)]
    struct Case {
        chunks: Vec<Vec<u8>>,
        trailers: bool,
        /// The client's stream fails after this many data frames (instead of ending).
        error_after: Option<usize>,
        expect: bool,
        max_body_bytes: usize,
        /// Per attempt: frames read in the handler (`None`: to the end), and whether a task of
        /// its own reads the rest after the answer.
        attempts: Vec<(Option<usize>, bool)>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (
            prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..6),
            any::<bool>(),
            prop::option::weighted(0.2, 0usize..6),
            any::<bool>(),
            prop::sample::select(vec![16usize, 64, 4096]),
            prop::collection::vec(
                (prop::option::weighted(0.6, 0usize..8), any::<bool>()),
                1..5,
            ),
        )
            .prop_map(
                |(chunks, trailers, error_after, expect, max_body_bytes, attempts)| Case {
                    error_after: error_after.filter(|k| *k <= chunks.len()),
                    chunks,
                    trailers,
                    expect,
                    max_body_bytes,
                    attempts,
                },
            )
    }

    fn run(case: Case, threads: bool) -> Result<(), TestCaseError> {
        // On two worker threads the background readers race the newer attempts for real.
        let rt = if threads {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        }
        .unwrap();
        rt.block_on(async move {
            let sent_trailers = trailers(&[("x-sum", "1")]);
            let reads: Arc<Mutex<Vec<(u32, Read)>>> = Arc::default();
            let tasks: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
            let max = case.attempts.len() as u32;
            let (r, t, plan) = (reads.clone(), tasks.clone(), case.attempts.clone());
            let handler: Handler = Arc::new(move |n, mut body| {
                let (reads, tasks) = (r.clone(), t.clone());
                let (frames, background) = plan[n as usize - 1];
                Box::pin(async move {
                    let mut seen = read(&mut body, frames.unwrap_or(usize::MAX)).await;
                    if background && seen.end == End::Stopped {
                        // Reads the rest after the answer (and after any newer attempt).
                        tasks.lock().unwrap().push(tokio::spawn(async move {
                            tokio::task::yield_now().await;
                            let rest = read(&mut body, usize::MAX).await;
                            seen.bytes.extend(rest.bytes);
                            if let Some(t) = rest.trailers {
                                seen.trailers.get_or_insert_with(Default::default).extend(t);
                            }
                            seen.end = rest.end;
                            reads.lock().unwrap().push((n, seen));
                        }));
                    } else {
                        reads.lock().unwrap().push((n, seen));
                    }
                    if n < max {
                        busy()
                    } else {
                        StatusCode::OK.into_response()
                    }
                })
            });
            let policy = quick_policy()
                .max_attempts(max)
                .max_body_bytes(case.max_body_bytes);
            let (svc, metrics) = service(policy, handler);
            let (tx, body) = client(None);
            let mut whole = Vec::new();
            for (i, chunk) in case.chunks.iter().enumerate() {
                if case.error_after == Some(i) {
                    break;
                }
                data(&tx, chunk);
                whole.extend_from_slice(chunk);
            }
            match case.error_after {
                Some(_) => tx
                    .unbounded_send(Err(std::io::Error::other("client failed")))
                    .unwrap(),
                None if case.trailers => tx
                    .unbounded_send(Ok(Frame::trailers(sent_trailers.clone())))
                    .unwrap(),
                None => {}
            }
            drop(tx);
            let res = svc.oneshot(upload(body, case.expect)).await.unwrap();
            let handles: Vec<_> = std::mem::take(&mut *tasks.lock().unwrap());
            for h in handles {
                h.await.unwrap();
            }
            let expected_trailers =
                (case.error_after.is_none() && case.trailers).then(|| sent_trailers.clone());
            let reads = reads.lock().unwrap().clone();
            prop_assert!(!reads.is_empty());
            for (n, seen) in &reads {
                match &seen.end {
                    End::Clean => {
                        prop_assert!(
                            case.error_after.is_none(),
                            "attempt {n}: a clean end although the client failed: {seen:?}"
                        );
                        prop_assert_eq!(&seen.bytes, &whole, "attempt {}: bytes", n);
                        prop_assert_eq!(&seen.trailers, &expected_trailers, "attempt {}", n);
                    }
                    End::Error(_) => {}
                    End::Stopped => {
                        // Only a reader told to stop early may stop early.
                        let (frames, background) = case.attempts[*n as usize - 1];
                        prop_assert!(frames.is_some() && !background, "attempt {n}: {seen:?}");
                        // What it read is a prefix of the client's bytes.
                        prop_assert!(whole.starts_with(&seen.bytes), "attempt {n}: {seen:?}");
                    }
                }
            }
            let attempts = res
                .extensions()
                .get::<RetryOutcome>()
                .map_or(1, RetryOutcome::attempts);
            prop_assert!(attempts <= max);
            prop_assert_eq!(metrics.snapshot().buffered_bytes, 0);
            Ok(())
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1500))]
        #[test]
        fn every_attempt_that_reads_to_the_end_reads_the_clients_body_or_an_error(
            c in case(),
            threads in any::<bool>(),
        ) {
            run(c, threads)?;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn trickling_uploads_do_not_switch_retries_off_for_everyone() {
    trickling_uploads(false).await;
}

#[tokio::test(start_paused = true)]
async fn trickling_recorded_uploads_do_not_switch_retries_off_for_everyone() {
    // The same with `Expect: 100-continue`: the handlers read the stalled uploads as they come
    // (recorded), and the recording stops at the deadline.
    trickling_uploads(true).await;
}

async fn trickling_uploads(expect: bool) {
    // Four clients send 1,000 bytes each and stall: together they hold the whole in-flight cap
    // (4 KiB). Within the deadline they wait to be buffered; past it they are passed through
    // to their handlers (which read on, from the client, as without the layer), and their
    // bytes are given back: a fifth, ordinary request is replayed as usual.
    let deadline = Duration::from_secs(10);
    let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel();
    let handler: Handler = Arc::new(move |n, mut body| {
        let entered_tx = entered_tx.clone();
        Box::pin(async move {
            let _ = entered_tx.send(());
            let all = read(&mut body, usize::MAX).await;
            if n == 1 {
                busy()
            } else {
                (StatusCode::OK, all.bytes).into_response()
            }
        })
    });
    let policy = quick_policy()
        .max_body_bytes(1024)
        .max_buffered_bytes(4096)
        .deadline(deadline);
    let (svc, metrics) = service(policy, handler);
    let mut stalled = Vec::new();
    for _ in 0..4 {
        let (tx, body) = client(None);
        data(&tx, &[9; 1000]);
        stalled.push((tx, tokio::spawn(svc.clone().oneshot(upload(body, expect)))));
    }
    while metrics.snapshot().buffered_bytes < 4000 {
        tokio::task::yield_now().await;
    }
    // The clock moves on (paused: it jumps) past the stalled uploads' deadline.
    tokio::time::sleep(deadline + Duration::from_millis(1)).await;
    tokio::task::yield_now().await;
    // The handlers hold the stalled bodies; none of their bytes is held for a replay.
    assert_eq!(
        metrics.snapshot().buffered_bytes,
        0,
        "stalled uploads still hold the in-flight cap (expect: {expect})"
    );
    for _ in 0..4 {
        entered
            .try_recv()
            .expect("each stalled upload reached its handler");
    }

    let res = svc
        .clone()
        .oneshot(upload(Body::from(vec![5u8; 500]), false))
        .await
        .unwrap();
    assert_eq!(outcome(&res).outcome(), Outcome::SucceededAfterRetry);
    assert_eq!(
        res.into_body().collect().await.unwrap().to_bytes(),
        vec![5u8; 500]
    );
    // The stalled clients finish; their handlers read every byte they sent (the handler's
    // first attempt then fails retryably, and the body is not replayable: not replayed).
    for (tx, request) in stalled {
        data(&tx, &[8; 10]);
        drop(tx);
        let res = request.await.unwrap().unwrap();
        assert_eq!(outcome(&res).outcome(), Outcome::NotReplayable);
        assert_eq!(outcome(&res).attempts(), 1);
    }
    assert_eq!(metrics.snapshot().buffered_bytes, 0);
}

#[tokio::test]
async fn a_plain_service_sees_the_client_bodys_own_error_type() {
    // No `Router` re-boxes the body here: the error must be the client body's own (an
    // `axum::Error`, as `axum::body::Body` gives it without the layer), not its insides.
    for expect in [false, true] {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let e = errors.clone();
        let handler: Handler = Arc::new(move |_, mut body| {
            let e = e.clone();
            Box::pin(async move {
                while let Some(frame) = body.frame().await {
                    if let Err(err) = frame {
                        let is_axum = err.downcast_ref::<axum::Error>().is_some();
                        e.lock().unwrap().push((is_axum, err.to_string()));
                        break;
                    }
                }
                StatusCode::OK.into_response()
            })
        });
        let (svc, _) = service(quick_policy(), handler);
        let (tx, body) = client(None);
        data(&tx, b"some");
        tx.unbounded_send(Err(std::io::Error::other("client went away")))
            .unwrap();
        drop(tx);
        let _ = svc.oneshot(upload(body, expect)).await.unwrap();
        // Without the layer: `Body::frame` yields an `axum::Error` wrapping the client's.
        assert_eq!(
            *errors.lock().unwrap(),
            [(true, "client went away".to_owned())],
            "expect: {expect}"
        );
    }
}
