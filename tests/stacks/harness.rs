//! The scenario every stack test runs, whatever the driver (sqlx 0.9 in `tests/layer/stack_sqlx.rs`,
//! sqlx 0.8 and rusqlite in the packages beside this file): the stack's handler served by axum
//! over real HTTP on loopback, behind `SqliteRetryLayer`, with a middleware between the two
//! that records what every attempt answered and, once an attempt was answered with the
//! `Retryable` marker, releases the write lock the test holds on another connection. So the
//! first attempt meets `SQLITE_BUSY` for certain, and the replay for certain does not: no
//! timing, no sleep.
//!
//! Each test includes this file with `#[path = ...] mod harness;`; it needs only axum, hyper,
//! tokio and this crate.
#![allow(dead_code, unreachable_pub)]

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::middleware::{self, Next};
use http::StatusCode;
use http_body_util::BodyExt;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_sqlite_retry::{Attempt, RetryPolicy, Retryable, SqliteRetryLayer};

/// What to do once an attempt was answered with the marker: let go of the lock. Called after
/// every such attempt; it must do nothing once the lock is gone.
pub type Release = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// A release for tests that hold no lock.
pub fn no_lock() -> Release {
    Arc::new(|| Box::pin(async {}))
}

/// One attempt as the middleware saw it: its number, its status, and the marker's code.
pub type Seen = (u32, StatusCode, Option<String>);

/// The attempts of the requests so far.
#[derive(Clone, Default)]
pub struct Attempts(Arc<Mutex<Vec<Seen>>>);

impl Attempts {
    /// The attempts recorded since the last call.
    pub fn take(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// `routes` (the stack's handler, its state already given) behind the recording and
/// releasing middleware, behind the layer with its default policy.
pub fn app(routes: Router, attempts: Attempts, release: Release) -> Router {
    let record = move |req: Request, next: Next| {
        let attempts = attempts.clone();
        let release = release.clone();
        async move {
            let number = req
                .extensions()
                .get::<Attempt>()
                .expect("the layer gives every attempt its Attempt")
                .number();
            let res = next.run(req).await;
            let marker = res
                .extensions()
                .get::<Retryable>()
                .map(|r| r.code().to_owned());
            let retryable = marker.is_some();
            attempts
                .0
                .lock()
                .unwrap()
                .push((number, res.status(), marker));
            if retryable {
                release().await;
            }
            res
        }
    };
    routes
        .layer(middleware::from_fn(record))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()))
}

#[path = "../common/server.rs"]
mod server;
pub use server::{Server, serve};

/// Posts `body` to `path` over a real HTTP/1 connection; the status and the body as text.
pub async fn post(server: &Server, path: &str, body: &'static str) -> (StatusCode, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Body>();
    let req = http::Request::post(format!("http://{}{path}", server.addr))
        .body(Body::from(body))
        .unwrap();
    let res = client.request(req).await.expect("request");
    let status = res.status();
    let bytes = res.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// The lock held: the first attempt meets `SQLITE_BUSY` (5), answers `503` with the marker,
/// the lock is released, the replay answers `201`, and so does the server.
pub async fn assert_busy_replayed_and_created(server: &Server, attempts: &Attempts) {
    let (status, body) = post(server, "/items", "apple").await;
    assert_eq!(status, StatusCode::CREATED, "body: {body:?}");
    assert_eq!(
        attempts.take(),
        [
            (1, StatusCode::SERVICE_UNAVAILABLE, Some("5".to_owned())),
            (2, StatusCode::CREATED, None),
        ],
        "attempt 1 met SQLITE_BUSY and was replayed; attempt 2 succeeded"
    );
}

/// No lock: the first insert answers `201`, the same name again `409` (a unique constraint),
/// once, without replay and without database detail in the body.
pub async fn assert_conflict_not_replayed(server: &Server, attempts: &Attempts) {
    let (status, _) = post(server, "/items", "pear").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(attempts.take(), [(1, StatusCode::CREATED, None)]);
    let (status, body) = post(server, "/items", "pear").await;
    assert_eq!(status, StatusCode::CONFLICT, "body: {body:?}");
    assert_eq!(body, "conflict", "no database detail in the body");
    assert_eq!(
        attempts.take(),
        [(1, StatusCode::CONFLICT, None)],
        "a constraint violation is answered once, never replayed"
    );
}

/// The schema every stack test uses.
pub const SCHEMA: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL UNIQUE)";
