//! The sqlx 0.9 stack (feature `sqlx`): the README's handler on a real SQLite file, served over
//! real HTTP behind the layer. A write while another connection holds `BEGIN IMMEDIATE` (busy
//! timeout 0) meets `SQLITE_BUSY`, is replayed once the lock is gone, and succeeds on attempt
//! 2; a unique violation is answered `409` and not replayed. The scenario is
//! `tests/stacks/sqlx_stack.rs`, which the sqlx 0.8 package runs too; rusqlite and libsql run
//! the same checks through `tests/stacks/harness.rs`.

#[path = "../stacks/harness.rs"]
mod harness;
#[path = "../stacks/sqlx_stack.rs"]
mod sqlx_stack;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use http::StatusCode;
use sqlx::SqlitePool;
use tower_http::classify::ServerErrorsFailureClass;
use tower_http::trace::TraceLayer;

use harness::Attempts;

/// An application's own error, as real applications write it: a sqlx variant, a not-found, and
/// an anyhow variant for store code that adds context. Its `IntoResponse` tags retryable
/// failures in one line, wherever the sqlx error sits in the chain.
#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("database error")]
    Db(#[from] sqlx::Error),
    #[error("no such item")]
    NotFound,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let mut res = ().into_response();
        // The layer replays the request if the chain holds a retryable database error.
        let retryable = tower_sqlite_retry::tag_retryable(&mut res, &self);
        *res.status_mut() = match &self {
            AppError::NotFound => StatusCode::NOT_FOUND,
            _ if retryable => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        res
    }
}

/// Store code below the handler: anyhow, with context, around sqlx.
async fn store_item(db: &SqlitePool, name: String) -> anyhow::Result<()> {
    use anyhow::Context;
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(db)
        .await
        .context("storing the item")?;
    Ok(())
}

async fn add_via_store(State(db): State<SqlitePool>, name: String) -> Result<StatusCode, AppError> {
    store_item(&db, name).await?;
    Ok(StatusCode::CREATED)
}

/// An application error type (anyhow inside thiserror) tagged with `tag_retryable`: the held
/// lock's `SQLITE_BUSY` is found in the chain, the request replayed, and it succeeds.
#[tokio::test]
async fn application_error_types_are_tagged_through_their_chain() {
    let (_dir, options) = sqlx_stack::database();
    let pool = sqlx_stack::pool(&options).await;
    let release = sqlx_stack::hold_write_lock(&options).await;
    let attempts = Attempts::default();
    let routes = Router::new()
        .route("/items", post(add_via_store))
        .with_state(pool.clone());
    let server = harness::serve(harness::app(routes, attempts.clone(), release)).await;
    harness::assert_busy_replayed_and_created(&server, &attempts).await;
    let _ = AppError::NotFound; // the variant the example shows
}

/// The statuses a `TraceLayer` reported, as `(on_response status, failed)`.
#[derive(Clone, Default)]
struct Traced(Arc<Mutex<Vec<(u16, bool)>>>);

impl Traced {
    // The type of a `TraceLayer` with two closures of its own, spelled out once.
    #[allow(clippy::type_complexity)]
    fn layer(
        &self,
    ) -> TraceLayer<
        tower_http::classify::SharedClassifier<tower_http::classify::ServerErrorsAsFailures>,
        tower_http::trace::DefaultMakeSpan,
        tower_http::trace::DefaultOnRequest,
        impl Fn(&Response, std::time::Duration, &tracing::Span) + Clone + use<>,
        tower_http::trace::DefaultOnBodyChunk,
        tower_http::trace::DefaultOnEos,
        impl Fn(ServerErrorsFailureClass, std::time::Duration, &tracing::Span) + Clone + use<>,
    > {
        let responses = self.0.clone();
        let failures = self.0.clone();
        TraceLayer::new_for_http()
            .on_response(
                move |res: &Response, _: std::time::Duration, _: &tracing::Span| {
                    responses
                        .lock()
                        .unwrap()
                        .push((res.status().as_u16(), false));
                },
            )
            .on_failure(
                move |_: ServerErrorsFailureClass, _: std::time::Duration, _: &tracing::Span| {
                    failures.lock().unwrap().push((0, true));
                },
            )
    }

    fn take(&self) -> Vec<(u16, bool)> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

/// Logs that do not cry wolf: a `TraceLayer` *outside* the retry layer sees only what the
/// client got (one `201`, no failure) for a request whose first attempt met `SQLITE_BUSY` and
/// was replayed; one *inside* sees every attempt, the replayed `503` as a failure. So the
/// recommended stack puts tower-http's `TraceLayer` (and any logging of errors by status)
/// outside `SqliteRetryLayer`.
#[tokio::test]
async fn a_trace_layer_outside_sees_only_the_final_answer() {
    let (_dir, options) = sqlx_stack::database();
    let pool = sqlx_stack::pool(&options).await;
    let release = sqlx_stack::hold_write_lock(&options).await;
    let attempts = Attempts::default();
    let (outside, inside) = (Traced::default(), Traced::default());
    let routes = Router::new()
        .route("/items", post(add_via_store))
        .with_state(pool.clone())
        .layer(inside.layer());
    let app = harness::app(routes, attempts.clone(), release).layer(outside.layer());
    let server = harness::serve(app).await;

    let (status, _) = harness::post(&server, "/items", "plum").await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(
        outside.take(),
        [(201, false)],
        "outside: the final answer only"
    );
    assert_eq!(
        inside.take(),
        [(503, false), (0, true), (201, false)],
        "inside: every attempt, the replayed one as a failure"
    );
    assert_eq!(attempts.take().len(), 2);
}
