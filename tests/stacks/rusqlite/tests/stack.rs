//! The rusqlite stack (feature `rusqlite`, rusqlite 0.43 with its bundled SQLite): the README's
//! handler on a real SQLite file, served over real HTTP behind the layer. A write while another
//! connection holds `BEGIN IMMEDIATE` (busy timeout 0) meets `SQLITE_BUSY`, is replayed once
//! the lock is gone, and succeeds on attempt 2; a unique violation is answered `409` and not
//! replayed. The same scenario as the main package's `tests/layer/stack_sqlx.rs`: see
//! `../../harness.rs`. Besides, the `SQLITE_BUSY` that the connection causes itself (a `COMMIT`,
//! `SAVEPOINT` or `RELEASE` while its own `INSERT ... RETURNING` is still in progress), made
//! for real: sqlx never lets two statements run at once on one connection, rusqlite does.

#[path = "../../harness.rs"]
mod harness;

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use http::StatusCode;
use rusqlite::Connection;
use tower_sqlite_retry::{DbError, DriverError};

use harness::{Attempts, Release};

// The README's handler ("Supported stacks", rusqlite).
async fn add(
    State(db): State<Arc<Mutex<Connection>>>,
    name: String,
) -> Result<StatusCode, DbError> {
    db.lock()
        .unwrap()
        .execute("INSERT INTO items (name) VALUES (?1)", [name])?;
    Ok(StatusCode::CREATED)
}

/// The app's connection to a SQLite file in a directory of its own: WAL, busy timeout 0, the
/// schema created, all before any lock is taken.
fn database() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let conn = Connection::open(dir.path().join("stack.db")).unwrap();
    conn.pragma_update(None, "journal_mode", "wal").unwrap();
    conn.busy_timeout(Duration::ZERO).unwrap();
    conn.execute_batch(harness::SCHEMA).unwrap();
    (dir, conn)
}

/// Takes the write lock on a connection of its own; the release rolls it back.
fn hold_write_lock(path: &Path) -> Release {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(5)).unwrap();
    conn.execute_batch("BEGIN IMMEDIATE").unwrap();
    let holder = Arc::new(Mutex::new(Some(conn)));
    Arc::new(move || {
        if let Some(conn) = holder.lock().unwrap().take() {
            conn.execute_batch("ROLLBACK").unwrap();
        }
        Box::pin(async {})
    })
}

fn routes(conn: Connection) -> Router {
    Router::new()
        .route("/items", post(add))
        .with_state(Arc::new(Mutex::new(conn)))
}

#[tokio::test]
async fn busy_is_replayed_and_succeeds_on_attempt_2() {
    let (dir, conn) = database();
    let release = hold_write_lock(&dir.path().join("stack.db"));
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(routes(conn), attempts.clone(), release)).await;

    harness::assert_busy_replayed_and_created(&server, &attempts).await;
    let check = Connection::open(dir.path().join("stack.db")).unwrap();
    let rows: i64 = check
        .query_row("SELECT COUNT(*) FROM items WHERE name = 'apple'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(rows, 1);
}

#[tokio::test]
async fn constraint_violation_is_409_and_not_replayed() {
    let (_dir, conn) = database();
    let attempts = Attempts::default();
    let server = harness::serve(harness::app(
        routes(conn),
        attempts.clone(),
        harness::no_lock(),
    ))
    .await;

    harness::assert_conflict_not_replayed(&server, &attempts).await;
}

/// Starts `INSERT ... RETURNING` on `conn` and reads its first row, so that the write statement
/// is still in progress, then runs `then` on the same connection: SQLite refuses it with plain
/// `SQLITE_BUSY` and a message of its own. `before` runs first (`BEGIN`, `SAVEPOINT a`).
fn busy_by_own_statement(conn: &Connection, before: &str, then: &str) -> rusqlite::Error {
    conn.execute_batch(before).unwrap();
    let mut insert = conn
        .prepare("INSERT INTO items (name) VALUES ('mine') RETURNING id")
        .unwrap();
    let mut rows = insert.query([]).unwrap();
    rows.next().unwrap().expect("the inserted row");
    let err = conn.execute_batch(then).unwrap_err();
    drop(rows);
    drop(insert);
    conn.execute_batch("ROLLBACK").unwrap();
    err
}

#[test]
fn same_connection_busy_is_not_retryable() {
    let (_dir, conn) = database();
    for (before, then, message) in [
        (
            "BEGIN",
            "COMMIT",
            "cannot commit transaction - SQL statements in progress",
        ),
        (
            "SAVEPOINT a",
            "RELEASE a",
            "cannot release savepoint - SQL statements in progress",
        ),
        (
            "BEGIN",
            "SAVEPOINT b",
            "cannot open savepoint - SQL statements in progress",
        ),
    ] {
        let err = busy_by_own_statement(&conn, before, then);
        let rusqlite::Error::SqliteFailure(failure, Some(text)) = &err else {
            panic!("{then}: {err:?}");
        };
        assert_eq!(
            (failure.extended_code, text.as_str()),
            (5, message),
            "{then}"
        );
        assert_eq!(err.retryable(), None, "{then}: not contention");
        assert_eq!(
            DbError::from(err).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}

// A handler that commits while its own INSERT ... RETURNING is still in progress.
async fn commit_too_early(State(db): State<Arc<Mutex<Connection>>>) -> Result<StatusCode, DbError> {
    let conn = db.lock().unwrap();
    conn.execute_batch("BEGIN")?;
    let result = (|| {
        let mut insert = conn.prepare("INSERT INTO items (name) VALUES ('early') RETURNING id")?;
        let mut rows = insert.query([])?;
        rows.next()?;
        conn.execute_batch("COMMIT")
    })();
    if result.is_err() {
        conn.execute_batch("ROLLBACK")?;
    }
    result?;
    Ok(StatusCode::CREATED)
}

/// Over HTTP behind the layer: the handler's own `SQLITE_BUSY` is answered once, `500`, never
/// replayed (it used to get up to 29 futile replays, each teaching admission that the route
/// collides).
#[tokio::test]
async fn same_connection_busy_is_answered_once_not_replayed() {
    let (_dir, conn) = database();
    let attempts = Attempts::default();
    let routes = Router::new()
        .route("/early", post(commit_too_early))
        .with_state(Arc::new(Mutex::new(conn)));
    let server = harness::serve(harness::app(routes, attempts.clone(), harness::no_lock())).await;
    let (status, body) = harness::post(&server, "/early", "").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::INTERNAL_SERVER_ERROR, "internal error")
    );
    assert_eq!(
        attempts.take(),
        [(1, StatusCode::INTERNAL_SERVER_ERROR, None)]
    );
}
