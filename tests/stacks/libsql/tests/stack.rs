//! The libSQL stack (feature `libsql`, libsql 0.10, a local database): the README's handler on
//! a real file, served over real HTTP behind the layer. A write while another connection holds
//! `BEGIN IMMEDIATE` (busy timeout 0) meets `SQLITE_BUSY`, is replayed once the lock is gone,
//! and succeeds on attempt 2; a unique violation is answered `409` and not replayed. The same
//! scenario as the main package's `tests/layer/stack_sqlx.rs`: see `../../harness.rs`.

#[path = "../../harness.rs"]
mod harness;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::StatusCode;
use libsql::Connection;
use tower_sqlite_retry::{DbError, DriverError};

use harness::{Attempts, Release};

// The README's handler ("Supported stacks", libSQL).
async fn add(State(db): State<Connection>, name: String) -> Result<StatusCode, DbError> {
    db.execute("INSERT INTO items (name) VALUES (?1)", [name])
        .await?;
    Ok(StatusCode::CREATED)
}

/// A local database in a directory of its own, and the app's connection to it: WAL, busy
/// timeout 0, the schema created, all before any lock is taken.
async fn database() -> (tempfile::TempDir, libsql::Database, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let db = libsql::Builder::new_local(dir.path().join("stack.db"))
        .build()
        .await
        .unwrap();
    let conn = db.connect().unwrap();
    conn.query("PRAGMA journal_mode = WAL", ()).await.unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    conn.execute(harness::SCHEMA, ()).await.unwrap();
    (dir, db, conn)
}

/// Takes the write lock on a connection of its own; the release rolls it back.
async fn hold_write_lock(db: &libsql::Database) -> Release {
    let conn = db.connect().unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute("BEGIN IMMEDIATE", ()).await.unwrap();
    let holder = Arc::new(tokio::sync::Mutex::new(Some(conn)));
    Arc::new(move || {
        let holder = holder.clone();
        Box::pin(async move {
            if let Some(conn) = holder.lock().await.take() {
                conn.execute("ROLLBACK", ()).await.unwrap();
            }
        })
    })
}

fn routes(conn: Connection) -> Router {
    Router::new().route("/items", post(add)).with_state(conn)
}

#[tokio::test]
async fn busy_is_replayed_and_succeeds_on_attempt_2() {
    let (_dir, db, conn) = database().await;
    let release = hold_write_lock(&db).await;
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(
        routes(conn.clone()),
        attempts.clone(),
        release,
    ))
    .await;

    harness::assert_busy_replayed_and_created(&server, &attempts).await;
    let mut rows = conn
        .query("SELECT COUNT(*) FROM items WHERE name = 'apple'", ())
        .await
        .unwrap();
    let count: i64 = rows.next().await.unwrap().unwrap().get(0).unwrap();
    assert_eq!(count, 1);
}

#[tokio::test]
async fn constraint_violation_is_409_and_not_replayed() {
    let (_dir, _db, conn) = database().await;
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(
        routes(conn),
        attempts.clone(),
        harness::no_lock(),
    ))
    .await;

    harness::assert_conflict_not_replayed(&server, &attempts).await;
}

/// The `SQLITE_BUSY` that the connection causes itself, made for real: `COMMIT` while its own
/// `INSERT ... RETURNING` has rows left to read. SQLite answers plain `5` with a message of its
/// own; a replay would meet it again, so it is not retryable and answers `500`.
#[tokio::test]
async fn same_connection_busy_is_not_retryable() {
    let (_dir, _db, conn) = database().await;
    conn.execute("BEGIN", ()).await.unwrap();
    let mut rows = conn
        .query("INSERT INTO items (name) VALUES ('mine') RETURNING id", ())
        .await
        .unwrap();
    rows.next().await.unwrap().expect("the inserted row");
    let err = conn.execute("COMMIT", ()).await.unwrap_err();
    drop(rows);
    conn.execute("ROLLBACK", ()).await.unwrap();
    let libsql::Error::SqliteFailure(code, message) = &err else {
        panic!("{err:?}");
    };
    assert_eq!(
        (*code, message.as_str()),
        (5, "cannot commit transaction - SQL statements in progress")
    );
    assert_eq!(err.retryable(), None);
    assert_eq!(
        DbError::from(err).status(),
        StatusCode::INTERNAL_SERVER_ERROR
    );
}
