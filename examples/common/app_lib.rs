//! The example service, shared by `examples/app.rs`, `examples/contention.rs` and
//! `tests/app.rs` (each includes this file with `#[path = "..."] mod app_lib;`).
//!
//! An item list in one SQLite file. `POST /items` is the pattern that meets
//! `SQLITE_BUSY_SNAPSHOT`: a deferred transaction (`pool.begin()`, a plain `BEGIN`) that first
//! reads the next sequence number, then inserts. Under concurrent writers SQLite refuses the
//! write at once, whatever `busy_timeout` says, and only a re-run of the whole transaction
//! (here: of the whole request) can succeed.

use std::path::Path;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::{
    Attempt, DbError, MetricsSnapshot, RetryMetrics, RetryPolicy, SqliteRetryLayer,
};

/// The schema, created at start if missing. `seq` is UNIQUE: two transactions that read the
/// same `MAX(seq)` can never both commit.
const SCHEMA: &str = "CREATE TABLE IF NOT EXISTS items (
    id   INTEGER PRIMARY KEY,
    seq  INTEGER NOT NULL UNIQUE,
    name TEXT    NOT NULL
)";

/// `GET /items` page size when `limit` is not given, and the largest one allowed.
pub(crate) const DEFAULT_LIMIT: i64 = 50;
pub(crate) const MAX_LIMIT: i64 = 500;

/// Opens (creating it if missing) the SQLite file at `path` as a pool of `pool_size`
/// connections, in WAL mode with `synchronous = NORMAL` and the given `busy_timeout`, and
/// creates the schema.
pub(crate) async fn open_pool(
    path: &Path,
    pool_size: u32,
    busy_timeout: Duration,
) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(busy_timeout);
    let pool = SqlitePoolOptions::new()
        .max_connections(pool_size)
        .connect_with(options)
        .await?;
    sqlx::query(SCHEMA).execute(&pool).await?;
    Ok(pool)
}

/// The retry policies of the service: one for the write route (`POST /items`), one for
/// everything else (a router-wide layer).
#[derive(Clone, Debug)]
pub(crate) struct RetryPolicies {
    pub(crate) write: RetryPolicy,
    pub(crate) read: RetryPolicy,
}

impl RetryPolicies {
    /// The same policy on both layers.
    pub(crate) fn both(policy: RetryPolicy) -> Self {
        Self {
            write: policy.clone(),
            read: policy,
        }
    }
}

/// The counters of the two layers.
#[derive(Clone, Debug)]
pub(crate) struct AppMetrics {
    /// The route layer on `POST /items`: counts the write requests and their replays.
    pub(crate) write: RetryMetrics,
    /// The router-wide layer. It sees **every** request: the writes too, which it passes
    /// through without retrying (the inner layer already did; its histogram and outcomes
    /// carry the inner layer's attempts), so its histogram covers the whole service.
    pub(crate) read: RetryMetrics,
}

/// A total over both layers, taken once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AppSnapshot {
    pub(crate) write: MetricsSnapshot,
    pub(crate) read: MetricsSnapshot,
}

impl AppMetrics {
    pub(crate) fn snapshot(&self) -> AppSnapshot {
        AppSnapshot {
            write: self.write.snapshot(),
            read: self.read.snapshot(),
        }
    }
}

impl AppSnapshot {
    /// Replays made by both layers. (The router-wide layer never replays a write: the route
    /// layer's `RetryOutcome` tells it not to, so nothing is counted twice.)
    pub(crate) fn retries(&self) -> u64 {
        self.write.retries + self.read.retries
    }

    /// Requests by attempts made (index 0 = one attempt), over the whole service.
    pub(crate) fn attempts_histogram(&self) -> Vec<u64> {
        self.read.attempts_histogram.to_vec()
    }

    /// Requests that ended `exhausted` or `deadline` (answered 503 after retrying).
    pub(crate) fn gave_up(&self) -> u64 {
        self.read.exhausted + self.read.deadline + self.read.budget_exhausted
    }

    pub(crate) fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "retries": self.retries(),
            "write_layer": snapshot_json(&self.write),
            "router_layer": snapshot_json(&self.read),
        })
    }
}

fn snapshot_json(s: &MetricsSnapshot) -> serde_json::Value {
    serde_json::json!({
        "requests": s.requests,
        "retries": s.retries,
        "outcomes": {
            "first_try": s.first_try,
            "succeeded_after_retry": s.succeeded_after_retry,
            "exhausted": s.exhausted,
            "deadline": s.deadline,
            "budget_exhausted": s.budget_exhausted,
            "not_replayable": s.not_replayable,
            "fenced": s.fenced,
            "non_retryable": s.non_retryable,
        },
        "attempts_histogram": s.attempts_histogram,
        "buffered_bytes": s.buffered_bytes,
        "peak_buffered_bytes": s.peak_buffered_bytes,
    })
}

#[derive(Clone, Debug)]
struct AppState {
    pool: SqlitePool,
    metrics: Option<AppMetrics>,
}

/// The service. With `retry`, `POST /items` gets its own layer (a larger cap, written on the
/// route) and a router-wide layer covers the reads; without, the same routes run bare, for
/// comparison. Returns the layers' counters alongside.
pub(crate) fn router(
    pool: SqlitePool,
    retry: Option<RetryPolicies>,
) -> (Router, Option<AppMetrics>) {
    let Some(policies) = retry else {
        let app = Router::new()
            .route("/items", post(create_item).get(list_items))
            .route("/items/{id}", get(get_item))
            .route("/stats", get(stats))
            .with_state(AppState {
                pool,
                metrics: None,
            });
        return (app, None);
    };

    let write_layer = SqliteRetryLayer::new(policies.write);
    let read_layer = SqliteRetryLayer::new(policies.read);
    let metrics = AppMetrics {
        write: write_layer.metrics(),
        read: read_layer.metrics(),
    };
    let app = Router::new()
        // The write route: read-then-write transactions, the most contended; the larger cap.
        .route("/items", post(create_item).layer(write_layer))
        .route("/items", get(list_items))
        .route("/items/{id}", get(get_item))
        .route("/stats", get(stats))
        // Everything else (and, passing through, the write route too).
        .layer(read_layer)
        .with_state(AppState {
            pool,
            metrics: Some(metrics.clone()),
        });
    (app, Some(metrics))
}

/// An item, as stored and as answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Item {
    pub(crate) id: i64,
    pub(crate) seq: i64,
    pub(crate) name: String,
}

impl From<(i64, i64, String)> for Item {
    fn from((id, seq, name): (i64, i64, String)) -> Self {
        Self { id, seq, name }
    }
}

#[derive(Debug, Deserialize)]
struct NewItem {
    name: String,
}

/// `POST /items {"name": "..."}`: 201 with the item.
///
/// The read-then-write transaction is deliberate: it is the shape that meets
/// `SQLITE_BUSY_SNAPSHOT` (517) when another writer commits between our read and our write.
/// `?` turns that error into a `DbError`, whose response carries the marker that makes the
/// layer replay the whole request. (`pool.begin_with("BEGIN IMMEDIATE")` would avoid most of
/// it: this example shows what the layer does when it is not used.)
async fn create_item(
    State(state): State<AppState>,
    attempt: Attempt,
    Json(new): Json<NewItem>,
) -> Result<Response, DbError> {
    if new.name.is_empty() || new.name.len() > 200 {
        return Ok((
            StatusCode::UNPROCESSABLE_ENTITY,
            "name must be 1 to 200 bytes",
        )
            .into_response());
    }
    if attempt.is_replay() {
        tracing::debug!(
            attempt = attempt.number(),
            max = attempt.max(),
            "replaying POST /items"
        );
    }
    let mut tx = state.pool.begin().await?;
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
        .fetch_one(&mut *tx)
        .await?;
    let id: i64 = sqlx::query_scalar("INSERT INTO items (seq, name) VALUES (?, ?) RETURNING id")
        .bind(seq)
        .bind(&new.name)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    // Committed: from here on a replay would insert the item twice.
    attempt.fence();
    let item = Item {
        id,
        seq,
        name: new.name,
    };
    Ok((StatusCode::CREATED, Json(item)).into_response())
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    limit: Option<i64>,
    after: Option<i64>,
}

/// A page of `GET /items`: items with `id > after`, in id order, and the `after` to pass for
/// the next page (`null` on the last one).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Page {
    pub(crate) items: Vec<Item>,
    pub(crate) next: Option<i64>,
}

/// `GET /items?limit=&after=`: a page of items, in id order.
async fn list_items(
    State(state): State<AppState>,
    Query(q): Query<ListQuery>,
) -> Result<Json<Page>, DbError> {
    let limit = q.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let after = q.after.unwrap_or(0);
    let rows: Vec<(i64, i64, String)> =
        sqlx::query_as("SELECT id, seq, name FROM items WHERE id > ? ORDER BY id LIMIT ?")
            .bind(after)
            .bind(limit)
            .fetch_all(&state.pool)
            .await?;
    let items: Vec<Item> = rows.into_iter().map(Item::from).collect();
    let next = match items.last() {
        Some(last) if items.len() as i64 == limit => Some(last.id),
        _ => None,
    };
    Ok(Json(Page { items, next }))
}

/// `GET /items/{id}`: 200 with the item, or 404.
async fn get_item(
    State(state): State<AppState>,
    UrlPath(id): UrlPath<i64>,
) -> Result<Response, DbError> {
    let row: Option<(i64, i64, String)> =
        sqlx::query_as("SELECT id, seq, name FROM items WHERE id = ?")
            .bind(id)
            .fetch_optional(&state.pool)
            .await?;
    Ok(match row {
        Some(row) => Json(Item::from(row)).into_response(),
        None => (StatusCode::NOT_FOUND, "no such item").into_response(),
    })
}

/// `GET /stats`: the layers' counters (`{"retry": false}` when the service runs without them).
async fn stats(State(state): State<AppState>) -> Json<serde_json::Value> {
    Json(match &state.metrics {
        Some(m) => {
            let mut v = m.snapshot().to_json();
            v["retry"] = true.into();
            v
        }
        None => serde_json::json!({ "retry": false }),
    })
}
