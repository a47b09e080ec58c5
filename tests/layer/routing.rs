//! Per-route caps through axum's three tools, and nested layers that never multiply attempts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::body::Body;
use axum::routing::{get, post};
use axum::{Extension, Router};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer};

fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::ZERO)
        .max_delay(Duration::from_millis(1))
        .jitter(Jitter::None)
}

type Calls = Arc<AtomicU32>;

/// Always fails with a (real) retryable sqlx error; records the attempt's max.
async fn always_busy(Extension(calls): Extension<Calls>, attempt: Attempt) -> Result<(), DbError> {
    calls.fetch_add(1, Ordering::SeqCst);
    assert!(attempt.number() <= attempt.max());
    Err(sqlx::Error::PoolTimedOut.into())
}

async fn call(app: &Router, method: &str, uri: &str) -> (StatusCode, Option<RetryOutcome>) {
    let res = app
        .clone()
        .oneshot(
            Request::builder()
                .method(method)
                .uri(uri)
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .unwrap();
    (
        res.status(),
        res.extensions().get::<RetryOutcome>().copied(),
    )
}

fn count(calls: &Calls) -> u32 {
    calls.swap(0, Ordering::SeqCst)
}

#[tokio::test]
async fn method_router_layer_caps_one_method() {
    let calls = Calls::default();
    let app = Router::new()
        .route(
            "/orders",
            post(always_busy)
                .layer(SqliteRetryLayer::new(policy(6)))
                .get(always_busy),
        )
        .layer(Extension(calls.clone()));
    let (status, outcome) = call(&app, "POST", "/orders").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(count(&calls), 6);
    let outcome = outcome.unwrap();
    assert_eq!(
        (outcome.attempts(), outcome.outcome()),
        (6, Outcome::Exhausted)
    );
    // `MethodRouter::layer` wraps only the methods added before it.
    let (_, outcome) = call(&app, "GET", "/orders").await;
    assert_eq!(count(&calls), 1);
    assert!(outcome.is_none());
}

#[tokio::test]
async fn route_layer_caps_matched_routes_only() {
    let calls = Calls::default();
    let app = Router::new()
        .route("/a", get(always_busy))
        .route_layer(SqliteRetryLayer::new(policy(3)))
        .layer(Extension(calls.clone()));
    call(&app, "GET", "/a").await;
    assert_eq!(count(&calls), 3);
    // Unmatched paths do not reach the layer: a plain 404, not retried or buffered.
    let (status, outcome) = call(&app, "GET", "/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(outcome.is_none());
}

#[tokio::test]
async fn router_layer_caps_every_route() {
    let calls = Calls::default();
    let app = Router::new()
        .route("/a", get(always_busy))
        .route("/b", post(always_busy))
        .layer(SqliteRetryLayer::new(policy(4)))
        .layer(Extension(calls.clone()));
    call(&app, "GET", "/a").await;
    assert_eq!(count(&calls), 4);
    call(&app, "POST", "/b").await;
    assert_eq!(count(&calls), 4);
}

#[tokio::test]
async fn nested_layers_never_multiply_attempts() {
    let calls = Calls::default();
    let outer = SqliteRetryLayer::new(policy(4));
    let outer_metrics = outer.metrics();
    let app = Router::new()
        .route(
            "/orders",
            post(always_busy).layer(SqliteRetryLayer::new(policy(8))),
        )
        .route("/other", post(always_busy))
        .layer(outer)
        .layer(Extension(calls.clone()));
    // The inner (per-route) cap wins: 8, not 8 × 4 = 32.
    let (status, outcome) = call(&app, "POST", "/orders").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(count(&calls), 8);
    assert_eq!(outcome.unwrap().attempts(), 8);
    assert_eq!(
        outer_metrics.snapshot().retries,
        0,
        "the outer layer never replayed"
    );
    // Routes without an inner layer get the outer cap.
    call(&app, "POST", "/other").await;
    assert_eq!(count(&calls), 4);

    // A smaller inner cap also wins over a larger outer one.
    let app = Router::new()
        .route(
            "/orders",
            post(always_busy).layer(SqliteRetryLayer::new(policy(2))),
        )
        .layer(SqliteRetryLayer::new(policy(10)))
        .layer(Extension(calls.clone()));
    call(&app, "POST", "/orders").await;
    assert_eq!(count(&calls), 2);
}

#[tokio::test]
async fn one_attempt_never_retries() {
    let calls = Calls::default();
    let app = Router::new()
        .route("/a", post(always_busy))
        .layer(SqliteRetryLayer::new(
            RetryPolicy::default().max_attempts(1),
        ))
        .layer(Extension(calls.clone()));
    let (status, outcome) = call(&app, "POST", "/a").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(count(&calls), 1);
    assert_eq!(outcome.unwrap().outcome(), Outcome::Exhausted);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limit_inside_queues_write_handlers() {
    use tower::ServiceBuilder;
    use tower::limit::ConcurrencyLimitLayer;

    let running = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let (r, m) = (running.clone(), most.clone());
    let app = Router::new()
        .route(
            "/orders",
            post(move || {
                let (r, m) = (r.clone(), m.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    m.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    StatusCode::CREATED
                }
            })
            .layer(
                ServiceBuilder::new()
                    .layer(SqliteRetryLayer::new(RetryPolicy::default()))
                    .layer(ConcurrencyLimitLayer::new(1)),
            ),
        )
        // NOTE: `with_state` builds each route's service once; without it axum rebuilds the
        // handler's layers per request, and a new `ConcurrencyLimit` per request limits nothing.
        .with_state(());
    let calls = (0..8).map(|_| call(&app, "POST", "/orders"));
    let results = futures::future::join_all(calls).await;
    assert!(results.iter().all(|(s, _)| *s == StatusCode::CREATED));
    assert_eq!(
        most.load(Ordering::SeqCst),
        1,
        "one write handler at a time"
    );
}
