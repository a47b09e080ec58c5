//! Classification fed by real sqlx errors, made on real SQLite files: `SQLITE_BUSY` (a write
//! while another connection holds `BEGIN IMMEDIATE`, busy timeout 0), `SQLITE_BUSY_SNAPSHOT`
//! (a deferred transaction reads, another connection commits a write, the first then writes),
//! constraint violations, pool time-outs and other errors that are not retryable.

use crate::common;

use std::time::Duration;

use axum::response::IntoResponse;
use http::StatusCode;
use http_body_util::BodyExt;
use sqlx::sqlite::SqlitePoolOptions;
use tower_sqlite_retry::{DbError, DriverError, Retryable};

use common::{TestDb, assert_no_db_detail};

fn code_of(err: &sqlx::Error) -> String {
    err.as_database_error()
        .and_then(|d| d.code())
        .map(|c| c.into_owned())
        .unwrap_or_default()
}

async fn body_text(res: axum::response::Response) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// A write while another connection holds `BEGIN IMMEDIATE`, busy timeout 0: SQLITE_BUSY (5).
async fn real_busy(db: &TestDb) -> sqlx::Error {
    let _pool = db.pool(1, Duration::ZERO).await; // creates the schema
    // The victim connects first: connecting runs pragmas that must not meet the held lock.
    let mut conn = db.connection().await;
    let lock = db.hold_write_lock().await;
    let err = sqlx::query("INSERT INTO items (seq, name) VALUES (1, 'x')")
        .execute(&mut conn)
        .await
        .unwrap_err();
    lock.release().await;
    err
}

/// A deferred transaction reads (takes a WAL snapshot), another connection commits a write,
/// then the first one writes: SQLITE_BUSY_SNAPSHOT (517), at once, whatever the timeout.
async fn real_busy_snapshot(db: &TestDb) -> sqlx::Error {
    let pool = db.pool(2, Duration::from_secs(5)).await;
    let mut a = pool.begin().await.unwrap();
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&mut *a)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (100, 'other')")
        .execute(&pool)
        .await
        .unwrap();
    let err = sqlx::query("INSERT INTO items (seq, name) VALUES (101, 'mine')")
        .execute(&mut *a)
        .await
        .unwrap_err();
    a.rollback().await.unwrap();
    err
}

/// A real UNIQUE violation (SQLite's extended code 2067): `seq` inserted twice (once more, when
/// it is already there).
async fn unique_violation(pool: &sqlx::SqlitePool, seq: i64) -> sqlx::Error {
    sqlx::query("INSERT OR IGNORE INTO items (seq, name) VALUES (?, 'a')")
        .bind(seq)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'a')")
        .bind(seq)
        .execute(pool)
        .await
        .unwrap_err()
}

#[tokio::test]
async fn busy_is_retryable() {
    let db = TestDb::new();
    let err = real_busy(&db).await;
    assert_eq!(code_of(&err), "5");
    let r = err.retryable().expect("SQLITE_BUSY is retryable");
    assert_eq!((r.code(), r.name()), ("5", "SQLITE_BUSY"));
}

#[tokio::test]
async fn busy_snapshot_is_retryable() {
    let db = TestDb::new();
    let err = real_busy_snapshot(&db).await;
    assert_eq!(code_of(&err), "517");
    let r = err.retryable().expect("SQLITE_BUSY_SNAPSHOT is retryable");
    assert_eq!(r.name(), "SQLITE_BUSY_SNAPSHOT");
}

#[tokio::test]
async fn constraint_violation_is_not_retryable() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    let err = unique_violation(&pool, 1).await;
    assert_eq!(code_of(&err), "2067");
    assert!(err.retryable().is_none());
    assert!(err.is_constraint_violation());

    let err = sqlx::query("INSERT INTO items (seq, name) VALUES (2, NULL)")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), "1299");
    assert!(err.retryable().is_none());
    assert!(err.is_constraint_violation());
}

#[tokio::test]
async fn pool_timeout_is_retryable_pool_closed_is_not() {
    let db = TestDb::new();
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        // The second acquire waits this long; opening the first connection on a busy machine
        // must not meet it.
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(db.options(Duration::ZERO))
        .await
        .unwrap();
    let held = pool.acquire().await.unwrap();
    let err = pool.acquire().await.unwrap_err();
    assert!(matches!(err, sqlx::Error::PoolTimedOut), "{err:?}");
    assert_eq!(err.retryable().unwrap().name(), "POOL_TIMED_OUT");
    drop(held);

    pool.close().await;
    let err = pool.acquire().await.unwrap_err();
    assert!(matches!(err, sqlx::Error::PoolClosed), "{err:?}");
    assert!(err.retryable().is_none());
}

#[tokio::test]
async fn other_errors_are_not_retryable() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    let err = sqlx::query("SELECT * FROM no_such_table")
        .execute(&pool)
        .await
        .unwrap_err();
    assert_eq!(code_of(&err), "1");
    assert!(err.retryable().is_none());
    assert!(!err.is_constraint_violation());
    assert!((sqlx::Error::RowNotFound).retryable().is_none());
    assert!((sqlx::Error::WorkerCrashed).retryable().is_none());
    assert!(
        (sqlx::Error::Io(std::io::Error::other("x")))
            .retryable()
            .is_none()
    );
}

#[tokio::test]
async fn db_error_responses_carry_no_database_detail() {
    let db = TestDb::new();

    let res = DbError::from(real_busy(&db).await).into_response();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The layer, not DbError, decides whether to invite a retry (never after a fence).
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(res.extensions().get::<Retryable>().unwrap().code(), "5");
    assert_eq!(body_text(res).await, "service busy, retry later");

    let db2 = TestDb::new();
    let res = DbError::from(real_busy_snapshot(&db2).await).into_response();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.extensions().get::<Retryable>().unwrap().code(), "517");

    let pool = db.pool(1, Duration::ZERO).await;
    sqlx::query("INSERT INTO items (seq, name) VALUES (7, 'a')")
        .execute(&pool)
        .await
        .unwrap();
    let err = sqlx::query("INSERT INTO items (seq, name) VALUES (7, 'a')")
        .execute(&pool)
        .await
        .unwrap_err();
    let res = DbError::from(err).into_response();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert!(res.extensions().get::<Retryable>().is_none());
    assert!(res.headers().get("retry-after").is_none());
    assert_eq!(body_text(res).await, "conflict");

    let err = sqlx::query("SELECT secret FROM no_such_table")
        .execute(&pool)
        .await
        .unwrap_err();
    let res = DbError::from(err).into_response();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(res.extensions().get::<Retryable>().is_none());
    assert_eq!(body_text(res).await, "internal error");
}

/// A `DatabaseError` of a driver that is not SQLite's (a third-party or custom one) with
/// numeric codes.
#[derive(Debug)]
struct OtherDriverError {
    code: &'static str,
}

impl std::fmt::Display for OtherDriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "other driver error {}", self.code)
    }
}

impl std::error::Error for OtherDriverError {}

impl sqlx::error::DatabaseError for OtherDriverError {
    fn message(&self) -> &str {
        "other driver error"
    }
    fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
        Some(self.code.into())
    }
    fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
        self
    }
    fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
        self
    }
    fn kind(&self) -> sqlx::error::ErrorKind {
        sqlx::error::ErrorKind::Other
    }
}

/// SQLite's table is for SQLite's errors only: another driver's `1285` (low byte 5, read as
/// `SQLITE_BUSY` by a rule on digits alone) is not retryable, and its `4371` (low byte 19, as
/// a `SQLITE_CONSTRAINT_*`) is no constraint violation.
#[test]
fn numeric_codes_of_other_drivers_are_not_sqlite_codes() {
    for (code, low_byte) in [("1285", 5), ("4371", 19), ("5", 5), ("2067", 19)] {
        assert_eq!(code.parse::<i32>().unwrap() & 0xff, low_byte);
        let err = sqlx::Error::Database(Box::new(OtherDriverError { code }));
        assert_eq!(err.retryable(), None, "{code}");
        assert!(!err.is_constraint_violation(), "{code}");
        assert_eq!(
            DbError::from(err).status(),
            StatusCode::INTERNAL_SERVER_ERROR,
            "{code}"
        );
    }
}

/// How sqlx's SQLite errors are recognised without naming their type (see the `sqlite`
/// table's documentation): their derived `Debug` begins with the type's name. Pinned here on a
/// real error, so that a sqlx release that changes it fails this test rather than the tables.
#[tokio::test]
async fn sqlx_sqlite_errors_debug_as_sqlite_error() {
    let db = TestDb::new();
    let err = real_busy(&db).await;
    let debug = format!("{:?}", err.as_database_error().unwrap());
    assert!(debug.starts_with("SqliteError { "), "{debug}");
}

/// Every kind of SQLite constraint, real errors on a real file, answered per kind: `409` for
/// a conflict with other rows (UNIQUE, PRIMARY KEY, FOREIGN KEY), `422` for the request's own
/// content (NOT NULL, CHECK), `500` for a STRICT table's DATATYPE (the server's binding).
/// Never retryable, always a constraint violation, never any database detail in the body.
#[tokio::test]
async fn constraints_are_answered_per_kind() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    sqlx::raw_sql(
        "CREATE TABLE parent (id INTEGER PRIMARY KEY);
         INSERT INTO parent (id) VALUES (1);
         CREATE TABLE child (
             id INTEGER PRIMARY KEY,
             code TEXT NOT NULL UNIQUE,
             qty INTEGER NOT NULL CHECK (qty >= 0),
             parent INTEGER REFERENCES parent (id)
         ) STRICT;
         INSERT INTO child (id, code, qty, parent) VALUES (1, 'a', 1, 1);",
    )
    .execute(&pool)
    .await
    .unwrap();
    for (statement, code, status, body) in [
        (
            "INSERT INTO child (id, code, qty) VALUES (2, 'a', 1)",
            "2067",
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "INSERT INTO child (id, code, qty) VALUES (1, 'b', 1)",
            "1555",
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "INSERT INTO child (id, code, qty, parent) VALUES (3, 'c', 1, 99)",
            "787",
            StatusCode::CONFLICT,
            "conflict",
        ),
        (
            "INSERT INTO child (id, code, qty) VALUES (4, NULL, 1)",
            "1299",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid input",
        ),
        (
            "INSERT INTO child (id, code, qty) VALUES (5, 'e', -1)",
            "275",
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid input",
        ),
        (
            "INSERT INTO child (id, code, qty) VALUES (6, 'f', 'many')",
            "3091",
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal error",
        ),
    ] {
        let err = sqlx::query(statement).execute(&pool).await.unwrap_err();
        assert_eq!(code_of(&err), code, "{statement}");
        assert!(err.retryable().is_none(), "{statement}");
        assert!(err.is_constraint_violation(), "{statement}");
        let res = DbError::from(err).into_response();
        assert_eq!(res.status(), status, "{statement}");
        assert!(res.extensions().get::<Retryable>().is_none());
        assert_eq!(body_text(res).await, body, "{statement}");
    }
}

/// Every event of this crate's targets (`tower_sqlite_retry` and below), with its level.
#[derive(Clone, Default)]
struct AllEvents(
    std::sync::Arc<std::sync::Mutex<Vec<(String, tracing::Level, common::EventFields)>>>,
);

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AllEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Visitor<'a>(&'a mut common::EventFields);
        impl tracing::field::Visit for Visitor<'_> {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0.insert(field.name().to_owned(), format!("{value:?}"));
            }
            fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
                self.0.insert(field.name().to_owned(), value.to_owned());
            }
        }
        let meta = event.metadata();
        if !meta.target().starts_with("tower_sqlite_retry") {
            return;
        }
        let mut fields = common::EventFields::new();
        event.record(&mut Visitor(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((meta.target().to_owned(), *meta.level(), fields));
    }
}

/// The conflict's event names the code and its kind, never the database's message (which can
/// quote the client's values); the message is in an event of its own, at TRACE, under the
/// target `tower_sqlite_retry::db_message`, for an application that turns it on.
#[tokio::test]
async fn conflict_events_carry_codes_and_the_message_only_at_trace() {
    use tracing_subscriber::layer::SubscriberExt;
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    let err = unique_violation(&pool, 7).await;
    let message = err.as_database_error().unwrap().message().to_owned();
    assert_eq!(message, "UNIQUE constraint failed: items.seq");

    let events = AllEvents::default();
    let guard = common::capture_tracing(tracing_subscriber::registry().with(events.clone()));
    let res = DbError::from(err).into_response();
    drop(guard);
    assert_eq!(res.status(), StatusCode::CONFLICT);

    let events = events.0.lock().unwrap().clone();
    let conflict: Vec<_> = events
        .iter()
        .filter(|(_, _, f)| f.get("message").map(String::as_str) == Some("db error (conflict)"))
        .collect();
    assert_eq!(conflict.len(), 1, "{events:?}");
    let (target, level, fields) = conflict[0];
    assert_eq!(
        (target.as_str(), *level),
        ("tower_sqlite_retry", tracing::Level::INFO)
    );
    assert_eq!(fields["db.response.status_code"], "2067");
    assert_eq!(fields["db.error.name"], "SQLITE_CONSTRAINT_UNIQUE");
    for (_, _, fields) in events.iter().filter(|(t, _, _)| t == "tower_sqlite_retry") {
        for value in fields.values() {
            assert!(!value.contains("items.seq"), "message logged: {fields:?}");
        }
    }
    let opted_in: Vec<_> = events
        .iter()
        .filter(|(t, _, _)| t == "tower_sqlite_retry::db_message")
        .collect();
    assert_eq!(opted_in.len(), 1, "{events:?}");
    assert_eq!(opted_in[0].1, tracing::Level::TRACE);
    assert_eq!(opted_in[0].2["error.message"], message);
}

/// The leak check catches the realistic leak, SQLite's constraint message as the body (the old
/// check, a list of forbidden words, let it through).
#[test]
#[should_panic(expected = "may leak database detail")]
fn leak_check_catches_a_constraint_message() {
    assert_no_db_detail("UNIQUE constraint failed: items.seq");
}

#[test]
fn leak_check_accepts_db_error_bodies() {
    for body in common::DB_ERROR_BODIES {
        assert_no_db_detail(body);
    }
}

// ---------------------------------------------------------------------------------------------
// The source-chain classifier, on an application's own error types wrapping real sqlx errors.

#[derive(Debug, thiserror::Error)]
enum AppError {
    #[error("database error")]
    Db(#[from] sqlx::Error),
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// thiserror's `transparent` forwards `source()` past the wrapped error: the chain shows the
/// sqlx error's database error, not the `sqlx::Error`.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
struct Transparent(#[from] sqlx::Error);

#[tokio::test]
async fn error_chain_finds_retryable_errors_in_application_errors() {
    let db = TestDb::new();
    let code = |e: &(dyn std::error::Error + 'static)| {
        tower_sqlite_retry::classify_error_chain(e).map(|r| r.code().to_owned())
    };
    // A variant with a message of its own: the sqlx error is the first source.
    let err = AppError::from(real_busy(&db).await);
    assert_eq!(code(&err).as_deref(), Some("5"));
    // Behind `transparent`: SQLite's own error, read from the chain.
    let err = Transparent::from(real_busy(&TestDb::new()).await);
    assert_eq!(code(&err).as_deref(), Some("5"));
    let err = Transparent::from(real_busy_snapshot(&TestDb::new()).await);
    assert_eq!(code(&err).as_deref(), Some("517"));
    // anyhow, with context, as store code returns it; then inside the app's enum.
    let report = anyhow::Error::from(real_busy(&TestDb::new()).await).context("saving the item");
    assert_eq!(code(&*report).as_deref(), Some("5"));
    let err = AppError::from(report);
    assert_eq!(code(&err).as_deref(), Some("5"));
    // A DbError somewhere in the chain answers with its own marker.
    let report = anyhow::Error::from(DbError::from(sqlx::Error::PoolTimedOut)).context("outer");
    assert_eq!(code(&*report).as_deref(), Some("pool_timed_out"));
    let with_context = anyhow::Error::from(real_busy_snapshot(&TestDb::new()).await).context("x");
    assert_eq!(code(&*with_context).as_deref(), Some("517"));
}

#[tokio::test]
async fn error_chain_leaves_other_errors_alone() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    let unique = || unique_violation(&pool, 1);
    let chain = tower_sqlite_retry::classify_error_chain;
    assert!(chain(&AppError::from(unique().await)).is_none());
    assert!(chain(&Transparent::from(unique().await)).is_none());
    assert!(chain(&*anyhow::Error::from(unique().await).context("x")).is_none());
    assert!(chain(&AppError::NotFound).is_none());
    assert!(chain(&AppError::from(sqlx::Error::RowNotFound)).is_none());
    assert!(chain(&*anyhow::anyhow!("database is locked")).is_none());
    assert!(chain(&std::io::Error::other("SqliteError { code: 5 }")).is_none());
}

/// `DbError`'s `Display` leaves its source's text to `source()`: anyhow's `{:#}` (which prints
/// the chain) shows the database's message once, not twice.
#[tokio::test]
async fn db_error_display_leaves_the_source_to_the_chain() {
    let db = TestDb::new();
    let pool = db.pool(1, Duration::ZERO).await;
    let unique = || unique_violation(&pool, 1);
    let err = DbError::from(unique().await);
    assert_eq!(err.to_string(), "constraint violation");
    assert!(std::error::Error::source(&err).is_some());
    // The chain printed through DbError is the sqlx error's chain after DbError's own words:
    // DbError adds no copy of it.
    let chained = format!("{:#}", anyhow::Error::from(err));
    let sqlx_chain = format!("{:#}", anyhow::Error::from(unique().await));
    assert_eq!(chained, format!("constraint violation: {sqlx_chain}"));

    let busy = DbError::from(real_busy(&db).await);
    assert_eq!(busy.to_string(), "retryable database error SQLITE_BUSY (5)");
    let internal = DbError::internal(std::io::Error::other("disk on fire"));
    assert_eq!(internal.to_string(), "database error");
    assert_eq!(
        format!("{:#}", anyhow::Error::from(internal)),
        "database error: disk on fire"
    );
}

/// An error that is its own `source()` (or a loop further down): the walk ends, the request is
/// answered. The walk runs on a thread of its own, so that a loop fails the test instead of
/// hanging it.
#[test]
fn error_chain_ends_on_a_cycle() {
    #[derive(Debug)]
    struct Looped(Option<&'static Looped>);
    impl std::fmt::Display for Looped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("looped")
        }
    }
    impl std::error::Error for Looped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            // Its own source, or the next, which points back.
            Some(self.0.unwrap_or(self))
        }
    }
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let itself: &'static Looped = Box::leak(Box::new(Looped(None)));
        let a: &'static Looped = Box::leak(Box::new(Looped(Some(itself))));
        let _ = done.send((
            tower_sqlite_retry::classify_error_chain(itself).is_none(),
            tower_sqlite_retry::classify_error_chain(a).is_none(),
        ));
    });
    let verdicts = finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the walk of a looped chain ends");
    assert_eq!(verdicts, (true, true));
}

/// The chain reads sqlx's `SqliteError` (which this crate cannot name) by what it prints; a
/// type that prints only part of it, its `Debug` and not its `Display`, is not SQLite's.
#[tokio::test]
async fn error_chain_reads_no_lookalike_as_sqlite() {
    #[derive(Debug)]
    #[allow(dead_code)]
    struct SqliteError {
        code: i32,
        message: &'static str,
    }
    impl std::fmt::Display for SqliteError {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("my own error")
        }
    }
    impl std::error::Error for SqliteError {}
    #[derive(Debug)]
    struct Prefixed;
    impl std::fmt::Display for Prefixed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("(code: 5) database is locked")
        }
    }
    impl std::error::Error for Prefixed {}
    #[derive(Debug, thiserror::Error)]
    #[error("wrapped")]
    struct Wrapped(#[source] Box<dyn std::error::Error + Send + Sync>);

    let chain = tower_sqlite_retry::classify_error_chain;
    let lookalike = SqliteError {
        code: 5,
        message: "database is locked",
    };
    assert!(format!("{lookalike:?}").starts_with("SqliteError { code: 5"));
    assert!(chain(&lookalike).is_none(), "Debug alone");
    assert!(
        chain(&Wrapped(Box::new(lookalike))).is_none(),
        "Debug alone, as a source"
    );
    assert!(chain(&Prefixed).is_none(), "Display alone");
    // sqlx's own, behind a transparent wrapper, still is.
    let real = Transparent::from(real_busy(&TestDb::new()).await);
    assert_eq!(
        chain(&real).map(|r| r.code().to_owned()).as_deref(),
        Some("5")
    );
}

/// `DriverError` answers for a real error what the tables say, with the code and its name;
/// `RetryDriverErrors` finds it in a boxed error's chain, as plain tower services box their errors.
#[tokio::test]
async fn driver_error_answers_with_the_code_and_its_name() {
    use tower_sqlite_retry::ClassifyError;
    use tower_sqlite_retry::DriverError;
    use tower_sqlite_retry::classify::RetryDriverErrors;

    let db = TestDb::new();
    let busy = real_busy(&db).await;
    assert_eq!(busy.code().as_deref(), Some("5"));
    assert_eq!(busy.code_name(), Some("SQLITE_BUSY"));
    assert!(!busy.is_constraint_violation());
    assert_eq!(busy.retryable().unwrap().name(), "SQLITE_BUSY");

    // Connecting waits out what the busy case's connections may still hold as they close.
    let pool = db.pool(1, Duration::from_secs(5)).await;
    let unique = unique_violation(&pool, 7).await;
    assert_eq!(unique.code().as_deref(), Some("2067"));
    assert_eq!(unique.code_name(), Some("SQLITE_CONSTRAINT_UNIQUE"));
    assert!(unique.is_constraint_violation());
    assert_eq!(unique.retryable(), None);

    // Not a database's error: no code, but the pool time-out is still retryable.
    assert_eq!(sqlx::Error::PoolTimedOut.code(), None);
    assert_eq!(sqlx::Error::PoolTimedOut.code_name(), None);
    assert!(sqlx::Error::PoolTimedOut.retryable().is_some());

    // The one classifier for services: the error itself, or boxed, or boxed inside another.
    assert_eq!(RetryDriverErrors.classify_error(&busy).unwrap().code(), "5");
    #[derive(Debug)]
    struct Wrapped(sqlx::Error);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("store failed")
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }
    let boxed: tower::BoxError = Box::new(Wrapped(busy));
    assert_eq!(
        RetryDriverErrors.classify_error(&boxed).unwrap().name(),
        "SQLITE_BUSY"
    );
    let boxed: tower::BoxError = Box::new(Wrapped(unique));
    assert!(RetryDriverErrors.classify_error(&boxed).is_none());
}
