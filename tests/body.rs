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
use tower_sqlite_retry::{
    Attempt, DbError, Jitter, Outcome, RetryOutcome, RetryPolicy, SqliteRetryLayer,
};

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
    let app = Router::new()
        .route(
            "/hold",
            post(move |body: Bytes| {
                let mut released = released.clone();
                async move {
                    if body[0] == 1 {
                        released.wait_for(|r| *r).await.unwrap();
                    }
                    body.len().to_string()
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
    // Passed through and answered by its one attempt, untouched.
    assert!(second.extensions().get::<RetryOutcome>().is_none());
    let text = second.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&text[..], b"800", "passed through whole");
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
