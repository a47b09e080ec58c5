//! The sqlx scenario, shared by the sqlx 0.9 stack (`tests/layer/stack_sqlx.rs`, main package) and
//! the sqlx 0.8 stack (`tests/stacks/sqlx-0_8`): the same source, compiled against whichever
//! sqlx the including package calls `sqlx`. The including test declares `mod harness` next to
//! this module.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::StatusCode;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tower_sqlite_retry::DbError;

use super::harness::{self, Attempts, Release};

// The README's handler ("Supported stacks"): the same code on sqlx 0.9 and 0.8.
async fn add(State(db): State<SqlitePool>, name: String) -> Result<StatusCode, DbError> {
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(&db)
        .await?;
    Ok(StatusCode::CREATED)
}

/// A SQLite file in a directory of its own, and its options (WAL, busy timeout 0).
pub(crate) fn database() -> (tempfile::TempDir, SqliteConnectOptions) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("stack.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::ZERO);
    (dir, options)
}

/// The app's pool: one connection, opened (and the schema created) before any lock is taken.
pub(crate) async fn pool(options: &SqliteConnectOptions) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options.clone())
        .await
        .unwrap();
    sqlx::query(harness::SCHEMA).execute(&pool).await.unwrap();
    pool
}

/// Takes the write lock on a connection of its own; the release rolls it back.
pub(crate) async fn hold_write_lock(options: &SqliteConnectOptions) -> Release {
    let options = options.clone().busy_timeout(Duration::from_secs(5));
    let mut conn = SqliteConnection::connect_with(&options).await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .unwrap();
    let holder = Arc::new(tokio::sync::Mutex::new(Some(conn)));
    Arc::new(move || {
        let holder = holder.clone();
        Box::pin(async move {
            if let Some(mut conn) = holder.lock().await.take() {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
                conn.close().await.unwrap();
            }
        })
    })
}

fn routes(pool: SqlitePool) -> Router {
    Router::new().route("/items", post(add)).with_state(pool)
}

#[tokio::test]
async fn busy_is_replayed_and_succeeds_on_attempt_2() {
    let (_dir, options) = database();
    let pool = pool(&options).await;
    let release = hold_write_lock(&options).await;
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(
        routes(pool.clone()),
        attempts.clone(),
        release,
    ))
    .await;

    harness::assert_busy_replayed_and_created(&server, &attempts).await;
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE name = 'apple'")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn constraint_violation_is_409_and_not_replayed() {
    let (_dir, options) = database();
    let pool = pool(&options).await;
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(
        routes(pool),
        attempts.clone(),
        harness::no_lock(),
    ))
    .await;

    harness::assert_conflict_not_replayed(&server, &attempts).await;
}

/// The crate recognises sqlx's SQLite errors without naming their type, by the name their
/// derived `Debug` begins with (see the `sqlite` table's documentation): pinned on a real
/// error of this sqlx version, beside the answer it leads to.
#[tokio::test]
async fn sqlite_errors_are_recognised_as_sqlite_errors() {
    let (_dir, options) = database();
    let pool = pool(&options).await;
    sqlx::query("INSERT INTO items (name) VALUES ('fig')")
        .execute(&pool)
        .await
        .unwrap();
    let err = sqlx::query("INSERT INTO items (name) VALUES ('fig')")
        .execute(&pool)
        .await
        .unwrap_err();
    let debug = format!("{:?}", err.as_database_error().unwrap());
    assert!(debug.starts_with("SqliteError { "), "{debug}");
    assert_eq!(DbError::from(err).status(), StatusCode::CONFLICT);
}
