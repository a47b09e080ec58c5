//! The Diesel stack (feature `diesel`, Diesel 2.3 with its bundled SQLite): the handlers of
//! `docs/stacks.md` (this package's library) on a real SQLite file, served over real HTTP
//! behind the layer, for synchronous Diesel (a `Mutex<SqliteConnection>`), r2d2, deadpool-diesel
//! and diesel-async's `SyncConnectionWrapper`. Each under the contention of `../harness.rs`: a
//! write while another connection holds `BEGIN IMMEDIATE` (WAL, busy timeout 0) meets
//! `SQLITE_BUSY`, which Diesel reports as `DatabaseError(Unknown, "database is locked")`; the
//! lock is released once an attempt was answered with the marker (no sleep). With the layer the
//! request is replayed and succeeds on attempt 2; without it the client gets the `503`. A unique
//! violation is answered `409` and not replayed. Then the write path (`WriteQueue`, `WriteTurn`)
//! with Diesel, synchronous and in deadpool-diesel's `interact`; what diesel-async's
//! `SyncConnectionWrapper` does on a busy error; and what the pools' errors expose.

#[path = "../../harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::post;
use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, CustomizeConnection};
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use diesel_async::{AsyncConnection, SimpleAsyncConnection};
use http::StatusCode;
use tower_sqlite_retry::write::WriteQueue;
use tower_sqlite_retry::{DbError, DriverError, classify_error_chain};
use tsr_stack_diesel::schema::items;
use tsr_stack_diesel::{handler_async, handler_pooled, handler_sync, write_path};

use harness::{Attempts, Release};

type R2d2Pool = diesel::r2d2::Pool<ConnectionManager<SqliteConnection>>;

/// A SQLite file in a directory of its own: WAL, the schema created, before any lock is taken.
fn database() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stack.db");
    let mut conn = connect(&path);
    conn.batch_execute("PRAGMA journal_mode = WAL").unwrap();
    conn.batch_execute(harness::SCHEMA).unwrap();
    (dir, path)
}

fn url(path: &Path) -> String {
    path.to_str().unwrap().to_owned()
}

/// A victim's connection: busy timeout 0 (SQLite's default, which Diesel keeps; said here so
/// that the test does not depend on it), so that a held lock is `SQLITE_BUSY` at once.
fn connect(path: &Path) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(&url(path)).unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 0").unwrap();
    conn
}

/// Takes the write lock on a connection of its own; the release rolls it back (once).
fn hold_write_lock(path: &Path) -> Release {
    let mut conn = SqliteConnection::establish(&url(path)).unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 5000; BEGIN IMMEDIATE")
        .unwrap();
    let holder = Arc::new(Mutex::new(Some(conn)));
    Arc::new(move || {
        if let Some(mut conn) = holder.lock().unwrap().take() {
            conn.batch_execute("ROLLBACK").unwrap();
        }
        Box::pin(async {})
    })
}

/// The names in the table, in order.
fn names(path: &Path) -> Vec<String> {
    items::table
        .select(items::name)
        .order(items::name)
        .load(&mut connect(path))
        .unwrap()
}

// The r2d2 handler (not in the docs: the synchronous handler with `pool.get()`).
async fn add_r2d2(State(pool): State<R2d2Pool>, name: String) -> Result<StatusCode, DbError> {
    let mut conn = pool.get().map_err(DbError::internal)?;
    diesel::insert_into(items::table)
        .values(items::name.eq(name))
        .execute(&mut conn)?;
    Ok(StatusCode::CREATED)
}

/// The stacks the scenario runs on.
#[derive(Clone, Copy, Debug)]
enum Stack {
    /// Synchronous Diesel, one connection behind a mutex.
    Sync,
    /// r2d2's pool (`diesel::r2d2`).
    R2d2,
    /// deadpool-diesel, the query in `interact`.
    Deadpool,
    /// diesel-async's `SyncConnectionWrapper<SqliteConnection>`.
    Async,
}

/// The stack's route `/items` on the file at `path` (its handler, its state given).
async fn routes(stack: Stack, path: &Path) -> Router {
    match stack {
        Stack::Sync => Router::new()
            .route("/items", post(handler_sync::add))
            .with_state(Arc::new(Mutex::new(connect(path)))),
        Stack::R2d2 => Router::new()
            .route("/items", post(add_r2d2))
            .with_state(r2d2_pool(path, Duration::from_secs(5))),
        Stack::Deadpool => Router::new()
            .route("/items", post(handler_pooled::add))
            .with_state(deadpool(path)),
        Stack::Async => Router::new()
            .route("/items", post(handler_async::add))
            .with_state(Arc::new(tokio::sync::Mutex::new(wrapper(path).await))),
    }
}

fn r2d2_pool(path: &Path, timeout: Duration) -> R2d2Pool {
    diesel::r2d2::Pool::builder()
        .max_size(4)
        .min_idle(Some(0))
        .connection_timeout(timeout)
        .build_unchecked(ConnectionManager::new(url(path)))
}

fn deadpool(path: &Path) -> deadpool_diesel::sqlite::Pool {
    let manager =
        deadpool_diesel::sqlite::Manager::new(url(path), deadpool_diesel::Runtime::Tokio1);
    deadpool_diesel::sqlite::Pool::builder(manager)
        .max_size(4)
        .build()
        .unwrap()
}

async fn wrapper(path: &Path) -> SyncConnectionWrapper<SqliteConnection> {
    let mut conn = SyncConnectionWrapper::<SqliteConnection>::establish(&url(path))
        .await
        .unwrap();
    conn.batch_execute("PRAGMA busy_timeout = 0").await.unwrap();
    conn
}

const STACKS: [Stack; 4] = [Stack::Sync, Stack::R2d2, Stack::Deadpool, Stack::Async];

// --- The scenario on every stack ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_is_replayed_and_succeeds_on_attempt_2() {
    for stack in STACKS {
        let (_dir, path) = database();
        let release = hold_write_lock(&path);
        let attempts = Attempts::default();
        let app = harness::app(routes(stack, &path).await, attempts.clone(), release);
        let server = harness::serve(app).await;

        harness::assert_busy_replayed_and_created(&server, &attempts).await;
        assert_eq!(names(&path), ["apple"], "{stack:?}: written once");
    }
}

/// The same contention without the layer: the client gets the `503` (the handler's answer),
/// nothing is written; once the lock is gone the same request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_layer_busy_reaches_the_client() {
    for stack in STACKS {
        let (_dir, path) = database();
        let release = hold_write_lock(&path);
        let server = harness::serve(routes(stack, &path).await).await;

        let (status, body) = harness::post(&server, "/items", "apple").await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "service busy, retry later"),
            "{stack:?}"
        );
        release().await;
        assert!(names(&path).is_empty(), "{stack:?}: nothing written");
        let (status, _) = harness::post(&server, "/items", "apple").await;
        assert_eq!(status, StatusCode::CREATED, "{stack:?}");
        assert_eq!(names(&path), ["apple"], "{stack:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constraint_violation_is_409_and_not_replayed() {
    for stack in STACKS {
        let (_dir, path) = database();
        let attempts = Attempts::default();
        let app = harness::app(
            routes(stack, &path).await,
            attempts.clone(),
            harness::no_lock(),
        );
        let server = harness::serve(app).await;

        harness::assert_conflict_not_replayed(&server, &attempts).await;
    }
}

/// Sixteen writers at once while the lock is held (deadpool-diesel: four connections, which
/// also collide with each other at busy timeout 0; diesel-async: one wrapper): the held lock is
/// met, every writer is answered `201`, and each is written exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_under_contention_nothing_lost_or_doubled() {
    for stack in [Stack::Deadpool, Stack::Async] {
        let (_dir, path) = database();
        let release = hold_write_lock(&path);
        let attempts = Attempts::default();
        let app = harness::app(routes(stack, &path).await, attempts.clone(), release);
        let server = Arc::new(harness::serve(app).await);

        const NAMES: [&str; 16] = [
            "a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p",
        ];
        let requests: Vec<_> = NAMES
            .into_iter()
            .map(|name| {
                let server = server.clone();
                tokio::spawn(async move { harness::post(&server, "/items", name).await.0 })
            })
            .collect();
        for request in requests {
            assert_eq!(request.await.unwrap(), StatusCode::CREATED, "{stack:?}");
        }
        assert_eq!(names(&path), NAMES, "{stack:?}: each exactly once");
        let seen = attempts.take();
        assert!(
            seen.iter().any(
                |(_, status, marker)| *status == StatusCode::SERVICE_UNAVAILABLE
                    && marker.as_deref() == Some("5")
            ),
            "{stack:?}: the held lock was met: {seen:?}"
        );
        let created = seen.iter().filter(|(_, s, _)| *s == StatusCode::CREATED);
        assert_eq!(created.count(), NAMES.len(), "{stack:?}");
    }
}

// --- What Diesel's busy error is -------------------------------------------------------------

/// The error itself, on a real file: `DatabaseError(Unknown, "database is locked")` for a
/// write, `BEGIN IMMEDIATE`, a query that reads rows back (`RETURNING`), and an uncached
/// `sql_query` (whose statement is finalized after the failed step: no panic in its `Drop`).
#[test]
fn busy_is_unknown_with_sqlites_fixed_message() {
    let (_dir, path) = database();
    let release = hold_write_lock(&path);
    let mut conn = connect(&path);
    let insert =
        |name: &'static str| diesel::insert_into(items::table).values(items::name.eq(name));
    let errors = [
        insert("w").execute(&mut conn).unwrap_err(),
        conn.batch_execute("BEGIN IMMEDIATE").unwrap_err(),
        insert("r")
            .returning(items::id)
            .get_result::<i32>(&mut conn)
            .unwrap_err(),
        diesel::sql_query("INSERT INTO items (name) VALUES ('q')")
            .execute(&mut conn)
            .unwrap_err(),
        conn.immediate_transaction(|conn| insert("t").execute(conn))
            .unwrap_err(),
    ];
    for err in errors {
        let DieselError::DatabaseError(DatabaseErrorKind::Unknown, info) = &err else {
            panic!("{err:?}");
        };
        assert_eq!(info.message(), "database is locked");
        let marker = err.retryable().expect("retryable");
        assert_eq!((marker.code(), marker.name()), ("5", "SQLITE_BUSY"));
        assert_eq!(DbError::from(err).status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    release_now(&release);
    // The connection is fine afterwards.
    insert("after").execute(&mut conn).unwrap();
    assert_eq!(names(&path), ["after"]);
}

fn release_now(release: &Release) {
    // The release is synchronous underneath (a ROLLBACK); its future is ready at once.
    drop(release());
}

/// A unique violation through Diesel: its kind, answered `409`.
#[test]
fn unique_violation_is_a_conflict() {
    let (_dir, path) = database();
    let mut conn = connect(&path);
    let insert = || diesel::insert_into(items::table).values(items::name.eq("same"));
    insert().execute(&mut conn).unwrap();
    let err = insert().execute(&mut conn).unwrap_err();
    assert!(matches!(
        err,
        DieselError::DatabaseError(DatabaseErrorKind::UniqueViolation, _)
    ));
    assert!(err.is_constraint_violation());
    assert_eq!(err.retryable(), None);
    assert_eq!(DbError::from(err).status(), StatusCode::CONFLICT);
}

// --- diesel-async's SyncConnectionWrapper on a busy error --------------------------------------

mod sync_connection_wrapper {
    use diesel_async::RunQueryDsl;

    use super::*;

    /// diesel_async#160 reported a panic on `SQLITE_BUSY` in a query that reads rows, which
    /// poisoned the wrapper's mutex, so that every later use panicked too. With diesel-async 0.9 and
    /// Diesel 2.3: a plain error for a write, a `RETURNING` query and a transaction, each
    /// retryable; and the same wrapper serves the next queries once the lock is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sync_connection_wrapper_returns_busy_and_stays_usable() {
        let (_dir, path) = database();
        let release = hold_write_lock(&path);
        let mut conn = wrapper(&path).await;
        let insert =
            |name: &'static str| diesel::insert_into(items::table).values(items::name.eq(name));

        let errors = [
            insert("w").execute(&mut conn).await.unwrap_err(),
            insert("r")
                .returning(items::id)
                .get_result::<i32>(&mut conn)
                .await
                .unwrap_err(),
            conn.transaction::<_, DieselError, _>(async |conn| {
                // A read first (a deferred transaction), then the write that needs the lock.
                items::table.count().get_result::<i64>(conn).await?;
                insert("t").execute(conn).await
            })
            .await
            .unwrap_err(),
        ];
        for err in errors {
            assert_eq!(
                err.retryable().map(|m| m.code().to_owned()).as_deref(),
                Some("5"),
                "{err:?}"
            );
        }

        release().await;
        insert("w").execute(&mut conn).await.unwrap();
        let id: i32 = insert("r")
            .returning(items::id)
            .get_result(&mut conn)
            .await
            .unwrap();
        assert!(id > 0);
        conn.transaction::<_, DieselError, _>(async |conn| insert("t").execute(conn).await)
            .await
            .unwrap();
        assert_eq!(names(&path), ["r", "t", "w"]);
    }
}

// --- What the pools' errors expose -------------------------------------------------------------

/// A connection setup that meets the lock (`BEGIN IMMEDIATE`, as a `journal_mode` change or a
/// migration at connect would): what r2d2 and deadpool-diesel hand back.
#[derive(Debug)]
struct SetupTakesTheLock;

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for SetupTakesTheLock {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        conn.batch_execute("BEGIN IMMEDIATE; ROLLBACK")
            .map_err(diesel::r2d2::Error::QueryError)
    }
}

/// r2d2 keeps only the text of the last error (`r2d2::Error(Option<String>)`, no `source()`;
/// `diesel::r2d2::Error` has none either): the busy setup is not found in its chain.
#[test]
fn r2d2_pool_errors_hide_the_diesel_error() {
    let (_dir, path) = database();
    let release = hold_write_lock(&path);
    let pool: R2d2Pool = diesel::r2d2::Pool::builder()
        .max_size(1)
        .min_idle(Some(0))
        .connection_timeout(Duration::from_millis(200))
        .connection_customizer(Box::new(SetupTakesTheLock))
        .build_unchecked(ConnectionManager::new(url(&path)));
    let Err(err) = pool.get() else {
        panic!("a connection while the setup meets the lock");
    };
    assert_eq!(
        err.to_string(),
        "timed out waiting for connection: database is locked"
    );
    assert!(std::error::Error::source(&err).is_none());
    assert_eq!(classify_error_chain(&err), None, "only text is left");
    // And diesel's own manager error has no `source()` either.
    let manager_error = diesel::r2d2::Error::QueryError(DieselError::NotFound);
    assert!(std::error::Error::source(&manager_error).is_none());
    release_now(&release);
    pool.get().expect("a connection once the lock is gone");
}

/// deadpool-diesel's pool errors hold the diesel error as their `source()`: a `post_create`
/// hook that meets the lock (`PoolError::PostCreateHook(HookError::Backend(Error::Ping(e)))`)
/// is found by the chain classifier. `interact`'s own `InteractError` never holds one (it is a
/// panic of the closure, or its cancellation; the query's error is the closure's result).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadpool_errors_keep_the_diesel_error_in_their_chain() {
    use deadpool_diesel::sqlite::{Hook, HookError, Manager, Pool};

    let (_dir, path) = database();
    let release = hold_write_lock(&path);
    let manager = Manager::new(url(&path), deadpool_diesel::Runtime::Tokio1);
    let pool = Pool::builder(manager)
        .max_size(1)
        .post_create(Hook::async_fn(|conn, _| {
            Box::pin(async move {
                conn.interact(|conn| conn.batch_execute("BEGIN IMMEDIATE; ROLLBACK"))
                    .await
                    .map_err(|e| HookError::message(e.to_string()))?
                    .map_err(|e| HookError::Backend(e.into()))
            })
        }))
        .build()
        .unwrap();
    let Err(err) = pool.get().await else {
        panic!("a connection while the hook meets the lock");
    };
    let marker = classify_error_chain(&err).expect("found through PoolError's source()");
    assert_eq!((marker.code(), marker.name()), ("5", "SQLITE_BUSY"));
    release().await;

    let conn = pool.get().await.unwrap();
    let interact = conn
        .interact(|_| -> QueryResult<()> { panic!("the closure panics") })
        .await
        .unwrap_err();
    assert!(matches!(interact, deadpool_diesel::InteractError::Panic(_)));
    assert!(std::error::Error::source(&interact).is_none());
    assert_eq!(classify_error_chain(&interact), None);
}

// --- The write path with Diesel ----------------------------------------------------------------

/// The write path's routes on the file at `path`: synchronous Diesel, or deadpool-diesel.
fn write_routes(pooled: bool, path: &Path, writes: WriteQueue) -> Router {
    if pooled {
        Router::new()
            .route("/items", post(write_path::add_pooled))
            .with_state((deadpool(path), writes))
    } else {
        Router::new()
            .route("/items", post(write_path::add))
            .with_state((Arc::new(Mutex::new(connect(path))), writes))
    }
}

/// A writer of this process holds the file's turn (and SQLite's lock, in its transaction):
/// the request waits for the turn without touching SQLite (no `SQLITE_BUSY`, no replay) and
/// writes on attempt 1 once the turn is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_waits_for_the_turn_not_for_sqlite() {
    for pooled in [false, true] {
        let (_dir, path) = database();
        let writes = WriteQueue::for_file(&path);
        let turn = writes.turn(Duration::from_secs(5)).await.unwrap();
        let release = hold_write_lock(&path);
        let attempts = Attempts::default();
        let app = harness::app(
            write_routes(pooled, &path, writes.clone()),
            attempts.clone(),
            harness::no_lock(),
        );
        let server = Arc::new(harness::serve(app).await);
        let request = tokio::spawn({
            let server = server.clone();
            async move { harness::post(&server, "/items", "apple").await }
        });
        // The request is in line for the turn.
        tokio::time::timeout(Duration::from_secs(10), async {
            while writes.stats().waiting == 0 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the request waits for the turn");
        release().await;
        drop(turn);
        let (status, body) = request.await.unwrap();
        assert_eq!(status, StatusCode::CREATED, "pooled: {pooled}: {body}");
        assert_eq!(
            attempts.take(),
            [(1, StatusCode::CREATED, None)],
            "pooled: {pooled}: no SQLITE_BUSY, no replay"
        );
        assert_eq!(names(&path), ["apple"]);
    }
}

/// Another process holds SQLite's lock (a connection outside the turn): the request's
/// `BEGIN IMMEDIATE` meets `SQLITE_BUSY`, the turn is given back before the error is read, and
/// the layer replays the request: attempt 2 writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_busy_from_another_process_is_replayed() {
    for pooled in [false, true] {
        let (_dir, path) = database();
        let writes = WriteQueue::for_file(&path);
        let release = hold_write_lock(&path);
        let attempts = Attempts::default();
        let app = harness::app(
            write_routes(pooled, &path, writes.clone()),
            attempts.clone(),
            release,
        );
        let server = harness::serve(app).await;

        harness::assert_busy_replayed_and_created(&server, &attempts).await;
        assert_eq!(names(&path), ["apple"], "pooled: {pooled}");
        let stats = writes.stats();
        assert_eq!(
            (stats.held, stats.transactions),
            (false, 2),
            "pooled: {pooled}"
        );
    }
}

/// The rule every driver follows: a `SQLITE_BUSY` read while the request still holds its turn
/// is taken for its own lock (a write outside its transaction) and not replayed. (What
/// `give_back` avoids for the transaction's own `BEGIN IMMEDIATE`: this handler reads the error
/// with `?` before giving the turn back.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_busy_read_while_holding_the_turn_is_not_replayed() {
    async fn read_while_holding(
        State((db, writes)): State<(Arc<Mutex<SqliteConnection>>, WriteQueue)>,
        name: String,
    ) -> Result<StatusCode, DbError> {
        let turn = writes
            .turn(Duration::from_secs(5))
            .await
            .map_err(DbError::internal)?;
        let mut conn = db.lock().unwrap();
        conn.immediate_transaction(|conn| {
            diesel::insert_into(items::table)
                .values(items::name.eq(&name))
                .execute(conn)
        })?;
        turn.committed();
        Ok(StatusCode::CREATED)
    }

    let (_dir, path) = database();
    let release = hold_write_lock(&path);
    let attempts = Attempts::default();
    let routes = Router::new()
        .route("/items", post(read_while_holding))
        .with_state((
            Arc::new(Mutex::new(connect(&path))),
            WriteQueue::for_file(&path),
        ));
    let server = harness::serve(harness::app(routes, attempts.clone(), release.clone())).await;
    let (status, _) = harness::post(&server, "/items", "apple").await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        attempts.take(),
        [(1, StatusCode::INTERNAL_SERVER_ERROR, None)]
    );
    release().await;
    assert!(names(&path).is_empty());
}

/// The commit fences the request: a retryable failure after it (here a `SQLITE_BUSY` of a
/// later statement, made up) is answered as it is, never replayed: written once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_path_commit_fences_the_request() {
    #[derive(Clone)]
    struct S {
        pool: deadpool_diesel::sqlite::Pool,
        writes: WriteQueue,
        calls: Arc<AtomicU32>,
    }
    async fn commit_then_fail(State(s): State<S>, name: String) -> Result<StatusCode, DbError> {
        s.calls.fetch_add(1, Ordering::SeqCst);
        let turn = s
            .writes
            .turn(Duration::from_secs(5))
            .await
            .map_err(DbError::internal)?;
        let conn = s.pool.get().await.map_err(DbError::internal)?;
        conn.interact(move |conn| {
            let result = conn.immediate_transaction(|conn| {
                diesel::insert_into(items::table)
                    .values(items::name.eq(&name))
                    .execute(conn)
            });
            write_path::give_back(turn, result)
        })
        .await
        .map_err(|e| DbError::internal(e.to_string()))??;
        Err(DieselError::DatabaseError(
            DatabaseErrorKind::Unknown,
            Box::new("database is locked".to_owned()),
        )
        .into())
    }

    let (_dir, path) = database();
    let state = S {
        pool: deadpool(&path),
        writes: WriteQueue::for_file(&path),
        calls: Arc::default(),
    };
    let attempts = Attempts::default();
    let routes = Router::new()
        .route("/items", post(commit_then_fail))
        .with_state(state.clone());
    let server = harness::serve(harness::app(routes, attempts.clone(), harness::no_lock())).await;
    let (status, _) = harness::post(&server, "/items", "apple").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(state.calls.load(Ordering::SeqCst), 1, "not replayed");
    assert_eq!(
        attempts.take(),
        [(1, StatusCode::SERVICE_UNAVAILABLE, Some("5".to_owned()))]
    );
    assert_eq!(names(&path), ["apple"], "written once");
}

// --- docs/stacks.md shows this package's code ----------------------------------------------------

/// Each module of this package's library (but the schema) is a block of `docs/stacks.md`, word
/// for word: what the docs show is what is compiled and tested here.
#[test]
fn the_docs_show_the_compiled_examples() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let docs = std::fs::read_to_string(root.join("../../../docs/stacks.md")).unwrap();
    let blocks: BTreeSet<&str> = docs
        .split("```rust,ignore\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    for file in [
        "handler_sync.rs",
        "handler_pooled.rs",
        "handler_async.rs",
        "write_path.rs",
    ] {
        let code = std::fs::read_to_string(root.join("src").join(file)).unwrap();
        assert!(
            blocks.contains(code.as_str()),
            "docs/stacks.md has no block that is src/{file}, word for word"
        );
    }
}
