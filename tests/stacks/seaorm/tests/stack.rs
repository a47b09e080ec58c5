//! The SeaORM stack (SeaORM 1.x on sqlx 0.8, feature `sqlx-0_8`): the handlers of
//! `docs/stacks.md` (this package's library) on a real SQLite file, served over real HTTP
//! behind the layer, under the contention of `../harness.rs`: a write while another connection
//! holds `BEGIN IMMEDIATE` (WAL, busy timeout 0 for the app's pool) meets `SQLITE_BUSY`, which
//! SeaORM returns as `DbErr::Exec`/`Query(RuntimeErr::SqlxError(e))`; the lock is released once
//! an attempt was answered with the marker (no sleep). With the layer the request is replayed
//! and succeeds on attempt 2; without it the client gets the `503`; sixteen writers at once are
//! each written exactly once. Then what SeaORM's wrappers show of sqlx's error.

#[path = "../../harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use http::StatusCode;
use sea_orm::sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sea_orm::sqlx::{self, Connection as _, SqliteConnection, SqlitePool};
use sea_orm::{
    ConnAcquireErr, DatabaseConnection, DbErr, EntityTrait, QueryOrder, SqlxSqliteConnector,
    TransactionError, TransactionTrait,
};
use tokio::sync::Mutex;
use tower_sqlite_retry::classify_error_chain;
use tsr_stack_seaorm::{handler, item};

use harness::{Attempts, Release};

/// A SQLite file in a directory of its own, WAL, the schema created; the app's pool on it
/// (busy timeout 0: sqlx's default is 5 s) and that pool as SeaORM's connection.
async fn database(max: u32) -> (tempfile::TempDir, SqliteConnectOptions, SqlitePool) {
    let dir = tempfile::tempdir().unwrap();
    let options = SqliteConnectOptions::new()
        .filename(dir.path().join("stack.db"))
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::ZERO);
    let pool = SqlitePoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(5))
        .connect_with(options.clone())
        .await
        .unwrap();
    sqlx::query(harness::SCHEMA).execute(&pool).await.unwrap();
    (dir, options, pool)
}

fn seaorm(pool: &SqlitePool) -> DatabaseConnection {
    SqlxSqliteConnector::from_sqlx_sqlite_pool(pool.clone())
}

/// Takes the write lock on a connection of its own; the release rolls it back (once).
async fn hold_write_lock(options: &SqliteConnectOptions) -> Release {
    let mut conn =
        SqliteConnection::connect_with(&options.clone().busy_timeout(Duration::from_secs(5)))
            .await
            .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut conn)
        .await
        .unwrap();
    let holder = Arc::new(Mutex::new(Some(conn)));
    Arc::new(move || {
        let holder = holder.clone();
        Box::pin(async move {
            if let Some(mut conn) = holder.lock().await.take() {
                sqlx::query("ROLLBACK").execute(&mut conn).await.unwrap();
            }
        })
    })
}

async fn names(db: &DatabaseConnection) -> Vec<String> {
    item::Entity::find()
        .order_by_asc(item::Column::Name)
        .all(db)
        .await
        .unwrap()
        .into_iter()
        .map(|m| m.name)
        .collect()
}

/// The route `/items`: the plain handler, or the one in a transaction.
fn routes(db: &DatabaseConnection, in_transaction: bool) -> Router {
    let handler = if in_transaction {
        post(handler::add_in_transaction)
    } else {
        post(handler::add)
    };
    Router::new()
        .route("/items", handler)
        .with_state(db.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_is_replayed_and_succeeds_on_attempt_2() {
    for in_transaction in [false, true] {
        let (_dir, options, pool) = database(4).await;
        let db = seaorm(&pool);
        let release = hold_write_lock(&options).await;
        let attempts = Attempts::default();
        let app = harness::app(routes(&db, in_transaction), attempts.clone(), release);
        let server = harness::serve(app).await;

        harness::assert_busy_replayed_and_created(&server, &attempts).await;
        assert_eq!(names(&db).await, ["apple"], "tx: {in_transaction}");
    }
}

/// The same contention without the layer: the client gets the `503`, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_busy_reaches_the_client() {
    for in_transaction in [false, true] {
        let (_dir, options, pool) = database(4).await;
        let db = seaorm(&pool);
        let release = hold_write_lock(&options).await;
        let server = harness::serve(routes(&db, in_transaction)).await;

        let (status, body) = harness::post(&server, "/items", "apple").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "service busy, retry later"),
            "tx: {in_transaction}"
        );
        release().await;
        assert!(names(&db).await.is_empty(), "tx: {in_transaction}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraint_violation_is_409_and_not_replayed() {
    for in_transaction in [false, true] {
        let (_dir, _options, pool) = database(4).await;
        let db = seaorm(&pool);
        let attempts = Attempts::default();
        let app = harness::app(
            routes(&db, in_transaction),
            attempts.clone(),
            harness::no_lock(),
        );
        let server = harness::serve(app).await;

        harness::assert_conflict_not_replayed(&server, &attempts).await;
    }
}

/// Sixteen writers at once on a pool of four connections while the lock is held (which also
/// collide with each other at busy timeout 0), half in a transaction: the held lock is met,
/// every writer is answered `201`, and each is written exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_under_contention_nothing_lost_or_doubled() {
    let (_dir, options, pool) = database(4).await;
    let db = seaorm(&pool);
    let release = hold_write_lock(&options).await;
    let attempts = Attempts::default();
    let routes = Router::new()
        .route("/items", post(handler::add))
        .route("/tx/items", post(handler::add_in_transaction))
        .with_state(db.clone());
    let app = harness::app(routes, attempts.clone(), release);
    let server = Arc::new(harness::serve(app).await);

    const NAMES: [&str; 16] = [
        "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p",
    ];
    let requests: Vec<_> = NAMES
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let server = server.clone();
            // Half through the plain handler, half in a transaction.
            let path = if i % 2 == 0 { "/items" } else { "/tx/items" };
            tokio::spawn(async move { harness::post(&server, path, name).await.0 })
        })
        .collect();
    for request in requests {
        assert_eq!(request.await.unwrap(), StatusCode::CREATED);
    }
    assert_eq!(names(&db).await, NAMES, "each exactly once");
    let seen = attempts.take();
    assert!(
        seen.iter().any(
            |(_, status, marker)| *status == StatusCode::SERVICE_UNAVAILABLE
                && marker.as_deref() == Some("5")
        ),
        "the held lock was met: {seen:?}"
    );
    let created = seen.iter().filter(|(_, s, _)| *s == StatusCode::CREATED);
    assert_eq!(created.count(), NAMES.len());
}

// --- What SeaORM's wrappers show of sqlx's error -----------------------------------------------

/// `DbErr`'s `source()` chain reaches sqlx's error (`DbErr` → `RuntimeErr` → `sqlx::Error`):
/// `classify_error_chain` and `tag_retryable` find it. `TransactionError` has no `source()`, and
/// SeaORM's pool time-out (`ConnAcquireErr::Timeout`) keeps nothing of sqlx's `PoolTimedOut`:
/// neither is found in a chain; `handler::db_error` reads both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_seaorms_errors_show() {
    let (_dir, options, pool) = database(1).await;
    let db = seaorm(&pool);
    let release = hold_write_lock(&options).await;

    let insert = |name: &str| item::ActiveModel {
        name: sea_orm::Set(name.to_owned()),
        ..Default::default()
    };
    use sea_orm::ActiveModelTrait;
    let err = insert("x").insert(&db).await.unwrap_err();
    assert!(
        matches!(
            &err,
            DbErr::Exec(sea_orm::RuntimeErr::SqlxError(_))
                | DbErr::Query(sea_orm::RuntimeErr::SqlxError(_))
        ),
        "{err:?}"
    );
    let marker = classify_error_chain(&err).expect("DbErr's chain reaches sqlx's error");
    assert_eq!((marker.code(), marker.name()), ("5", "SQLITE_BUSY"));
    assert_eq!(handler::db_error(err).retryable(), Some(&marker));

    let err = db
        .transaction::<_, _, DbErr>(|txn| Box::pin(async move { insert("y").insert(txn).await }))
        .await
        .unwrap_err();
    assert!(matches!(err, TransactionError::Transaction(_)), "{err:?}");
    assert_eq!(classify_error_chain(&err), None, "no source(): hidden");
    let TransactionError::Transaction(inner) = err else {
        unreachable!()
    };
    assert_eq!(handler::db_error(inner).retryable(), Some(&marker));
    release().await;

    // The pool's one connection held: SeaORM's own time-out error.
    let db = seaorm(
        &SqlitePoolOptions::new()
            .max_connections(1)
            // The query below waits this long; opening the first connection on a busy
            // machine must not meet it.
            .acquire_timeout(Duration::from_secs(1))
            .connect_with(options.clone())
            .await
            .unwrap(),
    );
    let held = db.get_sqlite_connection_pool().acquire().await.unwrap();
    let err = item::Entity::find().all(&db).await.unwrap_err();
    assert!(
        matches!(err, DbErr::ConnectionAcquire(ConnAcquireErr::Timeout)),
        "{err:?}"
    );
    assert_eq!(
        classify_error_chain(&err),
        None,
        "sqlx's PoolTimedOut is gone"
    );
    assert_eq!(
        handler::db_error(err)
            .retryable()
            .map(|m| m.name().to_owned()),
        Some("POOL_TIMED_OUT".to_owned())
    );
    drop(held);
}

// --- docs/stacks.md shows this package's code ----------------------------------------------------

/// The library's `handler` module is a block of `docs/stacks.md`, word for word.
#[test]
fn the_docs_show_the_compiled_example() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("../../../docs/stacks.md")).unwrap();
    let blocks: BTreeSet<&str> = docs
        .split("```rust,ignore\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    let code = std::fs::read_to_string(root.join("src/handler.rs")).unwrap();
    assert!(
        blocks.contains(code.as_str()),
        "docs/stacks.md has no block that is src/handler.rs, word for word"
    );
}
