//! The example service, shared by `examples/app.rs`, `examples/contention.rs`, `tests/app.rs`
//! and `benches/realclient.rs` (each includes this file with `#[path = "..."] mod app_lib;`).
//!
//! An item list in one database: a SQLite file by default, or a PostgreSQL or MySQL/MariaDB
//! server named by a database URL (with the crate's `postgres` or `mysql` feature).
//! `POST /items` is the read-then-write transaction that meets each backend's retryable error
//! under concurrent writers: it reads the next sequence number (`MAX(seq) + 1`), then inserts.
//! Only a re-run of the whole transaction (here: of the whole request) can succeed.
//!
//! | backend | transaction | what concurrent writers get |
//! |---|---|---|
//! | SQLite | deferred (`BEGIN`) | `SQLITE_BUSY_SNAPSHOT` (517) at once, whatever `busy_timeout` says |
//! | PostgreSQL | `SERIALIZABLE` | `40001` serialization_failure (at the insert or the commit) |
//! | MySQL/MariaDB | `SERIALIZABLE` (the read takes shared next-key locks) | `1213` deadlock: both readers then want to insert into the gap the other one has locked |
//!
//! In every case the isolation level is what keeps `seq` honest: two transactions that read
//! the same `MAX(seq)` can never both commit. (At PostgreSQL's default `READ COMMITTED` or
//! InnoDB's default `REPEATABLE READ` the second insert would instead meet the `UNIQUE` index:
//! a duplicate-key error, `409`, which no replay is made for.)
//!
//! With SQLite the transaction can also begin `IMMEDIATE` (`Db::begin_immediate`: the write
//! lock first, concurrent writers wait in SQLite's busy handler) or go through the write path
//! (`Db::with_write_path`: a `WritePool` beside the pool queues the write transactions in the
//! process, then begins them `IMMEDIATE` on its writer connection), or run on the writer
//! thread (`Db::with_write_thread`: a rusqlite `WriteThread` runs the transaction, a closure,
//! on the thread that owns the file's writer connection). [`Work`] gives the handler
//! work before and after its transaction (CPU first, a read after the commit), the shape of a
//! real handler, the same in every configuration.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AssertSqlSafe, SqlitePool};
use tower::ServiceBuilder;
use tower::limit::ConcurrencyLimitLayer;
use tower_sqlite_retry::metrics::MetricsSnapshot;
use tower_sqlite_retry::policy::Admission;
use tower_sqlite_retry::policy::AdmissionLimit;
use tower_sqlite_retry::write::{WriteStats, WriteThread};
use tower_sqlite_retry::{
    Attempt, DbError, RetryMetrics, RetryPolicy, SqliteRetryLayer, WritePool,
};

/// `GET /items` page size when `limit` is not given, and the largest one allowed.
pub(crate) const DEFAULT_LIMIT: i64 = 50;
pub(crate) const MAX_LIMIT: i64 = 500;

/// The table the app uses unless told otherwise.
pub(crate) const DEFAULT_TABLE: &str = "items";

/// The write path's utilization gauge the app adds to `/metrics` (`--config layer-write`).
pub(crate) const WRITE_UTILIZATION: &str = "tower_sqlite_retry_write_utilization";

pub(crate) type OpenError = Box<dyn std::error::Error + Send + Sync>;

/// Opens (creating it if missing) the SQLite file at `path` as a pool of `pool_size`
/// connections, in WAL mode with `synchronous = NORMAL` and the given `busy_timeout`, and
/// creates the schema (table `items`).
pub(crate) async fn open_pool(
    path: &Path,
    pool_size: u32,
    busy_timeout: Duration,
) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new().filename(path);
    let pool = sqlite_pool(options, pool_size, busy_timeout).await?;
    Db::from(&pool).create_schema().await?;
    Ok(pool)
}

async fn sqlite_pool(
    options: SqliteConnectOptions,
    pool_size: u32,
    busy_timeout: Duration,
) -> Result<SqlitePool, sqlx::Error> {
    let options = options
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(busy_timeout);
    SqlitePoolOptions::new()
        .max_connections(pool_size)
        .connect_with(options)
        .await
}

/// The backend a database URL names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Postgres,
    MySql,
}

impl Backend {
    /// `sqlite:`, `postgres://` (or `postgresql://`), `mysql://` (or `mariadb://`).
    pub(crate) fn of_url(url: &str) -> Option<Self> {
        let scheme = url.split_once(':')?.0.to_ascii_lowercase();
        match scheme.as_str() {
            "sqlite" => Some(Self::Sqlite),
            "postgres" | "postgresql" => Some(Self::Postgres),
            "mysql" | "mariadb" => Some(Self::MySql),
            _ => None,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Sqlite => "SQLite",
            Self::Postgres => "PostgreSQL",
            Self::MySql => "MySQL/MariaDB",
        }
    }

    /// The crate feature this backend needs (`sqlite` is on by default).
    pub(crate) fn feature(self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::MySql => "mysql",
        }
    }

    /// Whether this build can talk to this backend.
    pub(crate) fn compiled_in(self) -> bool {
        match self {
            Self::Sqlite => true,
            Self::Postgres => cfg!(feature = "postgres"),
            Self::MySql => cfg!(feature = "mysql"),
        }
    }
}

/// `url` with any password replaced by `***`, for logs and reports.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let (authority, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            format!("{scheme}://{user}:***@{host}{tail}")
        }
        _ => url.to_string(),
    }
}

/// The database behind the app: a pool of one of the compiled-in backends, the table the app
/// uses in it, and the statements for that backend.
#[derive(Clone, Debug)]
pub(crate) struct Db {
    pool: Pool,
    sql: Arc<Sql>,
    /// SQLite: the pool `POST /items` writes through, when not `pool` (the two-pool setup).
    writer: Option<SqlitePool>,
    /// SQLite: start the write transaction with `BEGIN IMMEDIATE` (take the write lock before
    /// reading) instead of a deferred `BEGIN`.
    begin_immediate: bool,
    /// SQLite: `POST /items`'s transaction goes through the write path (`WritePool::begin`):
    /// its turn in the process, then `BEGIN IMMEDIATE` on the `WritePool`'s writer connection.
    write_path: Option<WritePath>,
    /// What `POST /items` does besides its transaction.
    work: Work,
}

/// What `POST /items` does before and after its transaction: about `prep_us` µs of CPU first
/// (hashing the name, standing for parsing, authentication, rendering), and, when `prep_us` is
/// not 0, a read after the commit (`SELECT COUNT(*)` on the pool). The default: neither.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Work {
    /// The CPU work asked for, in µs (0: none, and no read after the commit).
    pub(crate) prep_us: u64,
    /// Hashing rounds that take about `prep_us` µs on this machine ([`calibrate`]).
    pub(crate) prep_rounds: u64,
}

impl Work {
    /// About `prep_us` µs of CPU before the transaction and a read after its commit (neither
    /// when 0); calibrated here, once.
    pub(crate) fn new(prep_us: u64) -> Self {
        Self {
            prep_us,
            prep_rounds: if prep_us == 0 { 0 } else { calibrate(prep_us) },
        }
    }

    /// Whether the handler reads after its commit.
    pub(crate) fn read_after_commit(self) -> bool {
        self.prep_us > 0
    }
}

/// CPU work standing for what a handler does before its transaction (parsing, checking a
/// signature): `rounds` rounds of hashing `body` (as `benches/writepath.rs` does).
pub(crate) fn prepare(body: &[u8], rounds: u64) -> u64 {
    let mut h = DefaultHasher::new();
    for i in 0..rounds {
        i.hash(&mut h);
        body.hash(&mut h);
    }
    h.finish()
}

/// Hashing rounds of [`prepare`] (on a 256-byte body) that take about `us` µs on this machine:
/// the fastest of seven timed tries (the least disturbed).
pub(crate) fn calibrate(us: u64) -> u64 {
    let body = [7u8; 256];
    let rounds = 20_000;
    let per_round = (0..7)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(prepare(std::hint::black_box(&body), rounds));
            start.elapsed().as_secs_f64() / rounds as f64
        })
        .fold(f64::INFINITY, f64::min);
    ((us as f64 / 1e6) / per_round.max(1e-12)).max(1.0) as u64
}

/// The write path of a `Db`: the `WritePool` or the `WriteThread`, and the reading of its turn
/// the last `/metrics` scrape took (for the utilization between two scrapes).
#[derive(Clone, Debug)]
struct WritePath {
    writes: Writes,
    /// The `database` label: the SQLite file's name.
    database: Arc<str>,
    /// When the app was built: the first scrape's utilization is since then.
    started: Instant,
    /// The previous scrape's reading of the turn (`None`: no scrape saw a write yet).
    scraped: Arc<Mutex<Option<WriteStats>>>,
}

/// What `POST /items`' transaction goes through on the write path.
#[derive(Clone, Debug)]
enum Writes {
    /// sqlx: `WritePool::begin()`.
    Pool(WritePool),
    /// rusqlite: `WriteThread::transaction(closure)`.
    Thread(WriteThread),
}

impl Writes {
    fn stats(&self) -> Option<WriteStats> {
        match self {
            Self::Pool(pool) => pool.stats(),
            Self::Thread(thread) => Some(thread.stats()),
        }
    }
}

/// A database's write turn as `/stats` shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TurnFigures {
    /// Write transactions waiting for the turn now.
    pub(crate) waiting: usize,
    /// Whether a write transaction holds the turn now.
    pub(crate) held: bool,
    /// Write transactions that held the turn and gave it back.
    pub(crate) transactions: u64,
    /// Time the turn was held in all, in seconds.
    pub(crate) busy_seconds: f64,
}

impl TurnFigures {
    fn of(stats: Option<&WriteStats>) -> Self {
        stats.map_or(
            Self {
                waiting: 0,
                held: false,
                transactions: 0,
                busy_seconds: 0.0,
            },
            |s| Self {
                waiting: s.waiting,
                held: s.held,
                transactions: s.transactions,
                busy_seconds: s.busy.as_secs_f64(),
            },
        )
    }
}

#[derive(Clone, Debug)]
enum Pool {
    Sqlite(SqlitePool),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "mysql")]
    MySql(sqlx::MySqlPool),
}

/// Runs `$body` with `$pool` bound to the concrete pool, whatever the backend.
macro_rules! on_pool {
    ($db:expr, |$pool:ident| $body:expr) => {
        match &$db.pool {
            Pool::Sqlite($pool) => $body,
            #[cfg(feature = "postgres")]
            Pool::Postgres($pool) => $body,
            #[cfg(feature = "mysql")]
            Pool::MySql($pool) => $body,
        }
    };
}

/// The statements, written once per backend and table.
#[derive(Debug)]
struct Sql {
    schema: Arc<str>,
    drop: Arc<str>,
    next_seq: Arc<str>,
    insert: Arc<str>,
    list: Arc<str>,
    get: Arc<str>,
    all: Arc<str>,
    count: Arc<str>,
}

impl Sql {
    fn new(backend: Backend, table: &str) -> Self {
        let t = table;
        let (schema, insert, p1, p2) = match backend {
            Backend::Sqlite => (
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        id   INTEGER PRIMARY KEY,
                        seq  INTEGER NOT NULL UNIQUE,
                        name TEXT    NOT NULL
                    )"
                ),
                format!("INSERT INTO {t} (seq, name) VALUES (?, ?) RETURNING id"),
                "?",
                "?",
            ),
            Backend::Postgres => (
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        id   BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                        seq  BIGINT NOT NULL UNIQUE,
                        name TEXT   NOT NULL
                    )"
                ),
                format!("INSERT INTO {t} (seq, name) VALUES ($1, $2) RETURNING id"),
                "$1",
                "$2",
            ),
            Backend::MySql => (
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (
                        id   BIGINT       NOT NULL AUTO_INCREMENT PRIMARY KEY,
                        seq  BIGINT       NOT NULL UNIQUE,
                        name VARCHAR(255) NOT NULL
                    ) ENGINE = InnoDB"
                ),
                // MySQL has no `RETURNING`: the id comes from the insert's result.
                format!("INSERT INTO {t} (seq, name) VALUES (?, ?)"),
                "?",
                "?",
            ),
        };
        Self {
            schema: schema.into(),
            drop: format!("DROP TABLE IF EXISTS {t}").into(),
            next_seq: format!("SELECT COALESCE(MAX(seq), 0) + 1 FROM {t}").into(),
            insert: insert.into(),
            list: format!("SELECT id, seq, name FROM {t} WHERE id > {p1} ORDER BY id LIMIT {p2}")
                .into(),
            get: format!("SELECT id, seq, name FROM {t} WHERE id = {p1}").into(),
            all: format!("SELECT id, seq, name FROM {t} ORDER BY id").into(),
            count: format!("SELECT COUNT(*) FROM {t}").into(),
        }
    }
}

/// A statement as sqlx takes it (the text is ours, never the client's).
fn q(text: &Arc<str>) -> AssertSqlSafe<Arc<str>> {
    AssertSqlSafe(text.clone())
}

impl From<SqlitePool> for Db {
    /// The app on a SQLite pool, table `items`.
    fn from(pool: SqlitePool) -> Self {
        Self {
            pool: Pool::Sqlite(pool),
            sql: Arc::new(Sql::new(Backend::Sqlite, DEFAULT_TABLE)),
            writer: None,
            begin_immediate: false,
            write_path: None,
            work: Work::default(),
        }
    }
}

impl From<&SqlitePool> for Db {
    fn from(pool: &SqlitePool) -> Self {
        Self::from(pool.clone())
    }
}

impl Db {
    /// Connects to `url` (`sqlite:PATH`, `postgres://...`, `mysql://...`) with a pool of
    /// `pool_size` connections, to use `table`; `busy_timeout` applies to SQLite only. Does not
    /// create the table: see [`Db::create_schema`].
    pub(crate) async fn connect(
        url: &str,
        table: &str,
        pool_size: u32,
        busy_timeout: Duration,
    ) -> Result<Self, OpenError> {
        let Some(backend) = Backend::of_url(url) else {
            return Err(format!(
                "{}: not a database URL this app knows (sqlite:, postgres://, mysql://)",
                redact(url)
            )
            .into());
        };
        if !backend.compiled_in() {
            return Err(format!(
                "{} needs the crate's `{}` feature, which this build lacks: rebuild with \
                 `--features {}` (for example `cargo run --release --features {} --example \
                 contention -- --database-url {}`)",
                backend.name(),
                backend.feature(),
                backend.feature(),
                backend.feature(),
                redact(url)
            )
            .into());
        }
        let sql = Arc::new(Sql::new(backend, table));
        let pool = match backend {
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)?;
                Pool::Sqlite(sqlite_pool(options, pool_size, busy_timeout).await?)
            }
            #[cfg(feature = "postgres")]
            Backend::Postgres => Pool::Postgres(
                sqlx::postgres::PgPoolOptions::new()
                    .max_connections(pool_size)
                    .connect(url)
                    .await?,
            ),
            #[cfg(feature = "mysql")]
            Backend::MySql => Pool::MySql(
                sqlx::mysql::MySqlPoolOptions::new()
                    .max_connections(pool_size)
                    .connect(url)
                    .await?,
            ),
            #[allow(unreachable_patterns)]
            _ => unreachable!("checked by compiled_in"),
        };
        Ok(Self {
            pool,
            sql,
            writer: None,
            begin_immediate: false,
            write_path: None,
            work: Work::default(),
        })
    }

    /// SQLite: `POST /items` writes through `writer` (typically one connection); everything
    /// else keeps using this pool.
    pub(crate) fn with_writer(mut self, writer: SqlitePool) -> Self {
        self.writer = Some(writer);
        self
    }

    /// SQLite: `POST /items` starts its transaction with `BEGIN IMMEDIATE`, taking the write
    /// lock before its read: concurrent writers then wait (`busy_timeout`) instead of meeting
    /// `SQLITE_BUSY_SNAPSHOT`.
    pub(crate) fn begin_immediate(mut self) -> Self {
        self.begin_immediate = true;
        self
    }

    /// SQLite: `POST /items`'s transaction goes through the write path, a
    /// `WritePool::new(pool.clone())` beside the pool (reads stay on the pool): it waits for
    /// the database's turn in this process, then begins `IMMEDIATE` on the `WritePool`'s writer
    /// connection. `database` names the file in `/metrics` and `/stats`. Fails on another
    /// backend.
    pub(crate) fn with_write_path(mut self, database: &str) -> Result<Self, OpenError> {
        let pool = match &self.pool {
            Pool::Sqlite(pool) => pool.clone(),
            #[allow(unreachable_patterns)]
            _ => return Err("the write path (WritePool) is SQLite's only".into()),
        };
        self.write_path = Some(WritePath {
            writes: Writes::Pool(WritePool::new(pool)),
            database: database.into(),
            started: Instant::now(),
            scraped: Arc::new(Mutex::new(None)),
        });
        Ok(self)
    }

    /// SQLite: `POST /items`' transaction runs on the writer thread, a rusqlite `WriteThread`
    /// on the pool's file (reads stay on the pool): the closure waits for the database's turn
    /// in this process, then runs in `BEGIN IMMEDIATE` … `COMMIT` on the thread that owns the
    /// writer connection, at `synchronous = NORMAL` as the app's pool. `database`
    /// names the file in `/metrics` and `/stats`. Fails on another backend or in memory.
    pub(crate) fn with_write_thread(mut self, database: &str) -> Result<Self, OpenError> {
        let pool = match &self.pool {
            Pool::Sqlite(pool) => pool.clone(),
            #[allow(unreachable_patterns)]
            _ => return Err("the writer thread (WriteThread) is SQLite's only".into()),
        };
        let path = pool.connect_options().get_filename().to_owned();
        // At the level of the app's pool (`synchronous = NORMAL`, `open_pool`), as the
        // `WritePool` of `layer-write` is; SQLite's `busy_timeout` the writer's default, 5 s.
        let thread = tower_sqlite_retry::write::WriteThreadOptions::default().synchronous_normal();
        let writes = WriteThread::open_with(path, thread, |_| Ok(()))?;
        self.write_path = Some(WritePath {
            writes: Writes::Thread(writes),
            database: database.into(),
            started: Instant::now(),
            scraped: Arc::new(Mutex::new(None)),
        });
        Ok(self)
    }

    /// `POST /items` does `work` before and after its transaction.
    pub(crate) fn with_work(mut self, work: Work) -> Self {
        self.work = work;
        self
    }

    /// What `POST /items` does besides its transaction.
    pub(crate) fn work(&self) -> Work {
        self.work
    }

    /// The write path's turn now (`None` without the write path, or before its first write
    /// transaction).
    pub(crate) fn write_stats(&self) -> Option<WriteStats> {
        self.write_path.as_ref()?.writes.stats()
    }

    /// Whether `POST /items` goes through the write path.
    pub(crate) fn has_write_path(&self) -> bool {
        self.write_path.is_some()
    }

    /// The write turn's figures for `/stats` (`None` without the write path).
    pub(crate) fn turn_figures(&self) -> Option<(Arc<str>, TurnFigures)> {
        let w = self.write_path.as_ref()?;
        Some((
            w.database.clone(),
            TurnFigures::of(w.writes.stats().as_ref()),
        ))
    }

    /// The write path's gauge for `/metrics`, in Prometheus' text format (empty without the
    /// write path): `tower_sqlite_retry_write_utilization{database="..."}`, the share of the
    /// time since the previous call during which a write transaction held the turn (the first
    /// call: since the app was built; 0 until the first write transaction). Each call takes
    /// the reading the next one is measured from.
    pub(crate) fn write_utilization_metrics(&self) -> String {
        let Some(w) = &self.write_path else {
            return String::new();
        };
        let now = w.writes.stats();
        let utilization = {
            let mut scraped = w.scraped.lock().unwrap_or_else(|e| e.into_inner());
            let u = match (&now, &*scraped) {
                (None, _) => 0.0,
                (Some(now), Some(before)) => now.utilization_since(before),
                // The turn's time held counts from its first write transaction, after the app
                // was built: nothing was held before.
                (Some(now), None) => {
                    let wall = now.at.saturating_duration_since(w.started).as_secs_f64();
                    if wall > 0.0 {
                        now.busy.as_secs_f64() / wall
                    } else {
                        0.0
                    }
                }
            };
            if now.is_some() {
                *scraped = now;
            }
            u
        };
        let database = w.database.replace('\\', "\\\\").replace('"', "\\\"");
        format!(
            "# HELP {WRITE_UTILIZATION} The share of the time since the previous scrape (the \
             first: since the app started) during which a write transaction held the database's \
             write turn (1: the database at its write limit). The example app's, from \
             WritePool::stats().\n\
             # TYPE {WRITE_UTILIZATION} gauge\n\
             {WRITE_UTILIZATION}{{database=\"{database}\"}} {utilization}\n"
        )
    }

    /// Creates the table if it is missing.
    pub(crate) async fn create_schema(&self) -> Result<(), sqlx::Error> {
        on_pool!(self, |pool| sqlx::query(q(&self.sql.schema))
            .execute(pool)
            .await
            .map(drop))
    }

    /// Drops the table if it exists.
    pub(crate) async fn drop_table(&self) -> Result<(), sqlx::Error> {
        on_pool!(self, |pool| sqlx::query(q(&self.sql.drop))
            .execute(pool)
            .await
            .map(drop))
    }

    pub(crate) async fn close(&self) {
        if let Some(writer) = &self.writer {
            writer.close().await;
        }
        if let Some(WritePath {
            writes: Writes::Pool(pool),
            ..
        }) = &self.write_path
        {
            // The pool, then the writer connection.
            pool.close().await;
        }
        on_pool!(self, |pool| pool.close().await)
    }

    /// The read-then-write transaction of `POST /items`: reads `MAX(seq) + 1`, inserts the item
    /// with it, commits. Returns `(id, seq)`. See the module docs for the error each backend
    /// answers concurrent writers with.
    pub(crate) async fn create_item(&self, name: &str) -> Result<(i64, i64), DbError> {
        let sql = &*self.sql;
        // Where the insert returns the id (SQLite, PostgreSQL): next seq, insert, commit.
        macro_rules! insert_returning_id {
            ($tx:expr) => {{
                let mut tx = $tx;
                let seq: i64 = sqlx::query_scalar(q(&sql.next_seq))
                    .fetch_one(&mut *tx)
                    .await?;
                let id: i64 = sqlx::query_scalar(q(&sql.insert))
                    .bind(seq)
                    .bind(name)
                    .fetch_one(&mut *tx)
                    .await?;
                tx.commit().await?;
                Ok((id, seq))
            }};
        }
        match &self.pool {
            Pool::Sqlite(pool) => {
                let pool = self.writer.as_ref().unwrap_or(pool);
                if let Some(WritePath {
                    writes: Writes::Thread(thread),
                    ..
                }) = &self.write_path
                {
                    // `layer-thread`: the same transaction as a closure, run on the writer
                    // thread in the file's turn (`BEGIN IMMEDIATE` … `COMMIT` around it).
                    let (next_seq, insert) = (sql.next_seq.clone(), sql.insert.clone());
                    let name = name.to_owned();
                    Ok(thread
                        .transaction(move |tx| {
                            // Prepared each time: the crate builds rusqlite without its
                            // statement cache (`cache`, a default feature it turns off).
                            let seq: i64 = tx.query_row(&next_seq, [], |r| r.get(0))?;
                            let id: i64 =
                                tx.query_row(&insert, rusqlite::params![seq, name], |r| r.get(0))?;
                            Ok::<_, rusqlite::Error>((id, seq))
                        })
                        .await?)
                } else if let Some(WritePath {
                    writes: Writes::Pool(w),
                    ..
                }) = &self.write_path
                {
                    // `layer-write`: the turn (a FIFO queue in the process), then
                    // `BEGIN IMMEDIATE` on the write path's writer connection.
                    insert_returning_id!(w.begin().await?)
                } else if self.begin_immediate {
                    // `immediate` and the expert configurations (`one-writer`, `two-pool`): the
                    // write lock first, so no other writer can commit between our read and our
                    // write.
                    insert_returning_id!(pool.begin_with("BEGIN IMMEDIATE").await?)
                } else {
                    // A deferred transaction: `BEGIN`, not `BEGIN IMMEDIATE` (which would avoid
                    // most of the contention: this example shows what the layer does without it).
                    insert_returning_id!(pool.begin().await?)
                }
            }
            #[cfg(feature = "postgres")]
            Pool::Postgres(pool) => {
                insert_returning_id!(
                    pool.begin_with("BEGIN ISOLATION LEVEL SERIALIZABLE")
                        .await?
                )
            }
            #[cfg(feature = "mysql")]
            Pool::MySql(pool) => {
                let mut tx = pool
                    .begin_with("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE; START TRANSACTION")
                    .await?;
                let seq: i64 = sqlx::query_scalar(q(&sql.next_seq))
                    .fetch_one(&mut *tx)
                    .await?;
                let done = sqlx::query(q(&sql.insert))
                    .bind(seq)
                    .bind(name)
                    .execute(&mut *tx)
                    .await?;
                tx.commit().await?;
                let id = i64::try_from(done.last_insert_id())
                    .map_err(|e| sqlx::Error::Decode(Box::new(e)))?;
                Ok((id, seq))
            }
        }
    }

    /// Items with `id > after`, in id order, at most `limit`.
    pub(crate) async fn list(&self, after: i64, limit: i64) -> Result<Vec<Item>, sqlx::Error> {
        let rows: Vec<(i64, i64, String)> =
            on_pool!(self, |pool| sqlx::query_as(q(&self.sql.list))
                .bind(after)
                .bind(limit)
                .fetch_all(pool)
                .await?);
        Ok(rows.into_iter().map(Item::from).collect())
    }

    pub(crate) async fn get(&self, id: i64) -> Result<Option<Item>, sqlx::Error> {
        let row: Option<(i64, i64, String)> =
            on_pool!(self, |pool| sqlx::query_as(q(&self.sql.get))
                .bind(id)
                .fetch_optional(pool)
                .await?);
        Ok(row.map(Item::from))
    }

    /// The number of items (the read after `POST /items`' commit, with [`Work`]).
    pub(crate) async fn count(&self) -> Result<i64, sqlx::Error> {
        on_pool!(self, |pool| sqlx::query_scalar(q(&self.sql.count))
            .fetch_one(pool)
            .await)
    }

    /// Every row, in id order (for the integrity check).
    pub(crate) async fn all_items(&self) -> Result<Vec<Item>, sqlx::Error> {
        let rows: Vec<(i64, i64, String)> = on_pool!(self, |pool| sqlx::query_as(q(&self.sql.all))
            .fetch_all(pool)
            .await?);
        Ok(rows.into_iter().map(Item::from).collect())
    }
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

/// How the app is served: with the retry layer, or as an expert would configure SQLite
/// instead of it. The handler is the same in every one (`POST /items` reads `MAX(seq) + 1`,
/// then inserts, with the same [`Work`] around it); what changes is the pools, how its
/// transaction begins, and the layers. SQLite only for `one-writer`, `two-pool`, `immediate`,
/// `layer-two-pool` and `layer-write`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, clap::ValueEnum)]
pub(crate) enum Config {
    /// No layer; a pool of --pool-size connections; deferred read-then-write (`BEGIN`):
    /// concurrent writers fail with 503 (SQLITE_BUSY_SNAPSHOT).
    Bare,
    /// No layer; one connection for everything; the write transaction starts with
    /// `BEGIN IMMEDIATE` (the single-writer setup Rails 8 and Django 5.1 steer users to).
    OneWriter,
    /// No layer; --pool-size reader connections for the GETs and one writer connection with
    /// `BEGIN IMMEDIATE` for POST /items (the usual production setup).
    TwoPool,
    /// No layer; a pool of --pool-size connections; the write transaction starts with
    /// `BEGIN IMMEDIATE` (the one-word fix): writers wait in SQLite's busy handler, each
    /// holding a pool connection while it waits.
    Immediate,
    /// The retry layer, `RetryPolicy::default()` (writer admission included) on the write
    /// route and router-wide; a pool of --pool-size; deferred read-then-write (the handler
    /// unchanged).
    Layer,
    /// `layer` without writer admission (`Admission::Off`): the first release's default.
    LayerNoAdmission,
    /// `layer-no-admission`, plus tower's `ConcurrencyLimitLayer::new(1)` inside the retry
    /// layer on the write route (the first release's "queue the writers" recipe).
    LayerQueue,
    /// `layer` on the expert's pools: --pool-size readers and one writer connection, the
    /// handler unchanged (deferred `BEGIN`): what the layer costs on top of `two-pool`.
    LayerTwoPool,
    /// `layer`'s policies and the write path: POST /items' transaction through
    /// `WritePool::begin()` (its turn in the process, then `BEGIN IMMEDIATE` on the
    /// `WritePool`'s writer connection); reads on the pool of --pool-size. `/stats` and
    /// `/metrics` show the write turn (`/metrics`: its utilization).
    LayerWrite,
    /// `layer`'s policies and the writer thread: POST /items' transaction a closure on a
    /// rusqlite `WriteThread` (its turn in the process, then `BEGIN IMMEDIATE` … `COMMIT` on
    /// the thread that owns the writer connection; group commit at `FULL`); reads on the pool
    /// of --pool-size. `/stats` and `/metrics` show the write turn.
    LayerThread,
}

impl Config {
    /// Every configuration, in the order reports list them.
    pub(crate) const ALL: [Self; 10] = [
        Self::Bare,
        Self::OneWriter,
        Self::TwoPool,
        Self::Immediate,
        Self::Layer,
        Self::LayerNoAdmission,
        Self::LayerQueue,
        Self::LayerTwoPool,
        Self::LayerWrite,
        Self::LayerThread,
    ];

    /// The name on the command line (`one-writer`, ...).
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::Bare => "bare",
            Self::OneWriter => "one-writer",
            Self::TwoPool => "two-pool",
            Self::Immediate => "immediate",
            Self::Layer => "layer",
            Self::LayerNoAdmission => "layer-no-admission",
            Self::LayerQueue => "layer-queue",
            Self::LayerTwoPool => "layer-two-pool",
            Self::LayerWrite => "layer-write",
            Self::LayerThread => "layer-thread",
        }
    }

    /// One line for reports and logs.
    pub(crate) fn describe(self, pool_size: u32) -> String {
        match self {
            Self::Bare => format!("no layer, pool {pool_size}, deferred BEGIN"),
            Self::OneWriter => "no layer, pool 1, BEGIN IMMEDIATE".to_string(),
            Self::TwoPool => {
                format!("no layer, {pool_size} readers + 1 writer, BEGIN IMMEDIATE")
            }
            Self::Immediate => format!("no layer, pool {pool_size}, BEGIN IMMEDIATE"),
            Self::Layer => format!(
                "RetryPolicy::default() (writer admission), pool {pool_size}, deferred BEGIN"
            ),
            Self::LayerNoAdmission => {
                format!("RetryPolicy::default().admission(Off), pool {pool_size}, deferred BEGIN")
            }
            Self::LayerQueue => format!(
                "admission off + ConcurrencyLimitLayer(1) inside on POST, pool {pool_size}, \
                 deferred BEGIN"
            ),
            Self::LayerTwoPool => {
                format!("RetryPolicy::default(), {pool_size} readers + 1 writer, deferred BEGIN")
            }
            Self::LayerWrite => format!(
                "RetryPolicy::default() and the write path (WritePool: the turn, then BEGIN \
                 IMMEDIATE on its writer connection), reads on pool {pool_size}"
            ),
            Self::LayerThread => format!(
                "RetryPolicy::default() and the writer thread (WriteThread, rusqlite: the turn, \
                 then the transaction on the writer's thread), reads on pool {pool_size}"
            ),
        }
    }

    /// Whether it needs a SQLite file of its own making (`--db`, not `--database-url`).
    pub(crate) fn needs_sqlite_file(self) -> bool {
        matches!(
            self,
            Self::OneWriter
                | Self::TwoPool
                | Self::Immediate
                | Self::LayerTwoPool
                | Self::LayerWrite
                | Self::LayerThread
        )
    }

    /// The retry layers' policies; `None` for the configurations without the layer.
    pub(crate) fn policies(self) -> Option<RetryPolicies> {
        match self {
            Self::Bare | Self::OneWriter | Self::TwoPool | Self::Immediate => None,
            Self::Layer | Self::LayerTwoPool | Self::LayerWrite | Self::LayerThread => {
                Some(RetryPolicies::both(RetryPolicy::default()))
            }
            Self::LayerNoAdmission | Self::LayerQueue => Some(RetryPolicies::both(
                RetryPolicy::default().admission(Admission::Off),
            )),
        }
    }

    /// Opens the SQLite file at `path` (created if missing, schema included) with this
    /// configuration's pools; `pool_size` is the pool of `bare`, `immediate` and the layers,
    /// and the readers' pool of `two-pool`.
    pub(crate) async fn open(
        self,
        path: &Path,
        pool_size: u32,
        busy_timeout: Duration,
    ) -> Result<Db, sqlx::Error> {
        Ok(match self {
            Self::OneWriter => Db::from(open_pool(path, 1, busy_timeout).await?).begin_immediate(),
            Self::TwoPool => {
                let readers = open_pool(path, pool_size, busy_timeout).await?;
                let writer = open_pool(path, 1, busy_timeout).await?;
                Db::from(readers).with_writer(writer).begin_immediate()
            }
            Self::Immediate => {
                Db::from(open_pool(path, pool_size, busy_timeout).await?).begin_immediate()
            }
            Self::LayerTwoPool => {
                let readers = open_pool(path, pool_size, busy_timeout).await?;
                let writer = open_pool(path, 1, busy_timeout).await?;
                Db::from(readers).with_writer(writer)
            }
            Self::LayerWrite => {
                let name = path
                    .file_name()
                    .map_or_else(|| "items.db".into(), |n| n.to_string_lossy());
                Db::from(open_pool(path, pool_size, busy_timeout).await?)
                    .with_write_path(&name)
                    .expect("a SQLite pool")
            }
            Self::LayerThread => {
                let name = path
                    .file_name()
                    .map_or_else(|| "items.db".into(), |n| n.to_string_lossy());
                Db::from(open_pool(path, pool_size, busy_timeout).await?)
                    .with_write_thread(&name)
                    .map_err(sqlx::Error::Configuration)?
            }
            _ => Db::from(open_pool(path, pool_size, busy_timeout).await?),
        })
    }

    /// The service in this configuration, and the layers' counters (`None` without them).
    pub(crate) fn router(self, db: Db) -> (Router, Option<AppMetrics>) {
        let write_limit = (self == Self::LayerQueue).then_some(1);
        router_with(db, self.policies(), write_limit)
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
#[derive(Clone, Debug)]
pub(crate) struct AppSnapshot {
    pub(crate) write: MetricsSnapshot,
    pub(crate) read: MetricsSnapshot,
    /// Writer admission's limits on the write route's layer.
    pub(crate) write_limits: Vec<AdmissionLimit>,
}

impl AppMetrics {
    pub(crate) fn snapshot(&self) -> AppSnapshot {
        AppSnapshot {
            write: self.write.snapshot(),
            read: self.read.snapshot(),
            write_limits: self.write.admission_limits(),
        }
    }
}

impl AppSnapshot {
    /// Replays made by both layers. (The router-wide layer never replays a write: the route
    /// layer's `RetryOutcome` tells it not to, so nothing is counted twice.)
    pub(crate) fn retries(&self) -> u64 {
        self.write.retries + self.read.retries
    }

    /// Requests that waited for a writer-admission slot, both layers together.
    pub(crate) fn queued(&self) -> u64 {
        self.write.queued + self.read.queued
    }

    /// Requests by attempts made (index 0 = one attempt), over the whole service.
    pub(crate) fn attempts_histogram(&self) -> Vec<u64> {
        self.read.attempts_histogram.to_vec()
    }

    /// Requests that ended `exhausted` or `deadline` (answered 503 after retrying).
    pub(crate) fn gave_up(&self) -> u64 {
        self.read.exhausted + self.read.deadline + self.read.budget_exhausted
    }

    pub(crate) fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "retries": self.retries(),
            "write_layer": snapshot_json(&self.write),
            "router_layer": snapshot_json(&self.read),
            "admission_limits": self
                .write_limits
                .iter()
                .map(|l| serde_json::json!({
                    "method": l.method().map(|m| m.as_str()),
                    "route": l.route(),
                    "limit": l.limit(),
                    "held": l.held(),
                    "waiting": l.waiting(),
                }))
                .collect::<Vec<_>>(),
        })
    }
}

fn snapshot_json(s: &MetricsSnapshot) -> serde_json::Value {
    serde_json::json!({
        "requests": s.requests,
        "retries": s.retries,
        "queued": s.queued,
        "outcomes": {
            "first_try": s.first_try,
            "succeeded_after_retry": s.succeeded_after_retry,
            "exhausted": s.exhausted,
            "deadline": s.deadline,
            "budget_exhausted": s.budget_exhausted,
            "not_replayable": s.not_replayable,
            "fenced": s.fenced,
            "non_retryable": s.non_retryable,
            "cancelled": s.cancelled,
        },
        "attempts_histogram": s.attempts_histogram,
        "buffered_bytes": s.buffered_bytes,
        "peak_buffered_bytes": s.peak_buffered_bytes,
    })
}

#[derive(Clone, Debug)]
struct AppState {
    db: Db,
    metrics: Option<AppMetrics>,
}

/// The service. With `retry`, `POST /items` gets its own layer (its own policy, `write`, on
/// the route: its own counters and admission; the demonstration raises its `max_attempts`
/// with several instances) and a router-wide layer covers the reads (`read`); without, the
/// same routes run bare, for comparison. An unknown path answers `404` with a short text
/// body. Returns the layers' counters alongside.
pub(crate) fn router(
    db: impl Into<Db>,
    retry: Option<RetryPolicies>,
) -> (Router, Option<AppMetrics>) {
    router_with(db.into(), retry, None)
}

/// [`router`], and with `write_limit` tower's `ConcurrencyLimitLayer` inside the write route's
/// retry layer (`--config layer-queue`, the writers queued by hand): at most that many
/// `POST /items` handlers run at once, replays included. Ignored without `retry`.
pub(crate) fn router_with(
    db: Db,
    retry: Option<RetryPolicies>,
    write_limit: Option<usize>,
) -> (Router, Option<AppMetrics>) {
    let Some(policies) = retry else {
        let app = Router::new()
            .route("/items", post(create_item).get(list_items))
            .route("/items/{id}", get(get_item))
            .route("/stats", get(stats))
            .fallback(not_found)
            .with_state(AppState { db, metrics: None });
        return (app, None);
    };

    let write_layer = SqliteRetryLayer::new(policies.write);
    let read_layer = SqliteRetryLayer::new(policies.read);
    let metrics = AppMetrics {
        write: write_layer.metrics(),
        read: read_layer.metrics(),
    };
    let write_route = match write_limit {
        None => post(create_item).layer(write_layer),
        // Outside: the replays; inside: one write handler at a time. Built once, by
        // `with_state` below (a fresh limit per request would limit nothing).
        Some(n) => post(create_item).layer(
            ServiceBuilder::new()
                .layer(write_layer)
                .layer(ConcurrencyLimitLayer::new(n)),
        ),
    };
    let app = Router::new()
        // The write route: read-then-write transactions, the most contended.
        .route("/items", write_route)
        .route("/items", get(list_items))
        .route("/items/{id}", get(get_item))
        .route("/stats", get(stats))
        // Everything else (and, passing through, the write route too).
        .layer(read_layer)
        // Unknown paths: outside the layers (nothing to replay, nothing to count).
        .fallback(not_found)
        .with_state(AppState {
            db,
            metrics: Some(metrics.clone()),
        });
    (app, Some(metrics))
}

/// Any path the app does not serve: `404` with a body that says so.
async fn not_found() -> (StatusCode, &'static str) {
    (StatusCode::NOT_FOUND, "no such route\n")
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
/// The read-then-write transaction is deliberate: it is the shape that meets each backend's
/// retryable error when another writer commits between our read and our write
/// (`SQLITE_BUSY_SNAPSHOT`, `40001`, `1213`: see the module docs). `?` turns that error into a
/// `DbError`, whose response carries the marker that makes the layer replay the whole request.
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
    let work = state.db.work();
    // The work before the transaction (parsing, authentication, ...): a replay does it again.
    std::hint::black_box(prepare(new.name.as_bytes(), work.prep_rounds));
    let (id, seq) = state.db.create_item(&new.name).await?;
    // Committed: from here on a replay would insert the item twice.
    attempt.fence();
    let item = Item {
        id,
        seq,
        name: new.name,
    };
    if work.read_after_commit() {
        // The work after the commit: a read on the pool (it takes no write turn).
        let count = state.db.count().await?;
        return Ok((
            StatusCode::CREATED,
            [("x-item-count", count.to_string())],
            Json(item),
        )
            .into_response());
    }
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
    let items = state.db.list(after, limit).await?;
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
    Ok(match state.db.get(id).await? {
        Some(item) => Json(item).into_response(),
        None => (StatusCode::NOT_FOUND, "no such item").into_response(),
    })
}

/// `GET /stats`: the layers' counters (`{"retry": false}` when the service runs without them),
/// and with the write path its turn's figures (`write_turn`).
async fn stats(State(state): State<AppState>) -> Json<serde_json::Value> {
    let mut v = match &state.metrics {
        Some(m) => {
            let mut v = m.snapshot().to_json();
            v["retry"] = true.into();
            v
        }
        None => serde_json::json!({ "retry": false }),
    };
    if let Some((database, t)) = state.db.turn_figures() {
        v["write_turn"] = serde_json::json!({
            "database": &*database,
            "waiting": t.waiting,
            "held": t.held,
            "transactions": t.transactions,
            "busy_seconds": t.busy_seconds,
        });
    }
    Json(v)
}
