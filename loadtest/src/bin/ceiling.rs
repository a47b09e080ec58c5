//! The write path against its ceiling: the same write transaction, back to back, in one
//! process and with no HTTP, on `rusqlite` (SQLite's own speed: the statements run on the
//! caller's thread), on one sqlx connection, through `WritePool` and through `WriteThread`
//! (rusqlite on the writer thread), alone and with many writers.
//!
//! ```text
//! cargo run --release -p tower-sqlite-retry-loadtest --bin ceiling                      # all (≈ 2.5 min)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin ceiling -- --quick           # smoke (≈ 20 s)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin ceiling -- --json > ceiling.json
//! ```
//!
//! **Why.** `writepath` measures the write path from a real client over HTTP, where the
//! handler, hyper and the client share the cores with the transaction: it says what a service
//! gets, not what the write turn itself costs. This binary takes everything else away. What is
//! left is the write turn's cost (the queue, the hand-offs to sqlx's connection thread, the
//! `IMMEDIATE` begin, the commit and its fence, group commit's shared fsync) next to what
//! SQLite itself does on this machine and disk, so that a `writepath` figure can be read as a
//! share of what SQLite could do at all, and a change to the write path as a change of its
//! distance to that ceiling.
//!
//! **The transaction** is `writepath`'s (`put_object`), its SQL copied: read the collection's
//! sync token, upsert an object of `--object-bytes` (1024) bytes under a name no transaction
//! used before, bump the token, log the change; four statements, begun `IMMEDIATE`. No CPU
//! work around it (`writepath`'s `--prep-us` stands for the handler's, which is not the write
//! path's). The file: `writepath`'s schema, 16 collections of `--seed` (200) objects, WAL,
//! `busy_timeout` 5 s, `foreign_keys` on (sqlx's default, set on the rusqlite connection too),
//! `wal_autocheckpoint` SQLite's 1000 pages; a fresh file in a fresh temporary directory for
//! every cell. `--dir` chooses where: on tmpfs an fsync costs nothing, and the run says so.
//!
//! **Columns**, each at `synchronous = FULL` (an fsync of the WAL at every commit: durable
//! commits) and `NORMAL` (WAL's usual: fsyncs at checkpoints only):
//!
//! | column | what |
//! |---|---|
//! | `rusqlite` | one `rusqlite::Connection` on the main thread, `transaction_with_behavior(Immediate)`, `prepare_cached`: **the ceiling** |
//! | `sqlx` | one `SqliteConnection`, `begin_with("BEGIN IMMEDIATE")`, one task: what sqlx adds (its connection's worker thread, the async hand-offs) |
//! | `sqlx, fused` | `sqlx, one query` with each `COMMIT` sent together with the next transaction's `BEGIN IMMEDIATE` (`raw_sql`): two round trips a transaction; what fusing one writer's `COMMIT` with the next writer's `BEGIN` would give |
//! | `sqlx, one query` | the same, the three writes in one `query` (sqlx binds each statement's arguments in turn; the token read-then-write done in SQL): three round trips to the connection's thread instead of six |
//! | `write path` | `WritePool::new(pool)` as an application makes it (its own writer connection, group commit on), `begin()`, `commit()`, one task: the turn's cost with nobody waiting |
//! | `write path ×N` | the same with `--tasks` (64) tasks, each in a loop: the turn handed from writer to writer; at `FULL`, group commit shares the fsync (`tx/fsync`) |
//! | `thread` | `WriteThread::open_with` (rusqlite's write path: each transaction a closure run on the writer thread, in the file's turn, group commit on), one task |
//! | `thread ×N` | the same with `--tasks` tasks: closures queue for the writer thread, which runs them back to back; at `FULL` they share the fsync |
//!
//! The async columns run in tasks on tokio's multi-thread runtime (a worker per core, as
//! `writepath`'s servers have); `rusqlite` runs outside it, on the main thread. rusqlite and
//! sqlx link the same SQLite library (one `libsqlite3-sys` in the build; the run checks that
//! both report the same version).
//!
//! **A cell** is one column at one level: a fresh file, `WARMUP` (20) transactions (connections
//! opened, statements prepared, the write path's file known), then transactions back to back
//! for `--seconds` (3); a transaction under way when the time is up finishes and counts, and
//! the window runs to its end. Per cell: transactions per second, and the process's CPU time
//! (user + system, every thread's, from `/proc/self/stat`) per transaction. CPU is steadier
//! than throughput on a small machine with other work on it, and it is what the write path
//! costs a server; `/proc`'s clock ticks are 10 ms, so a cell should run a second or more.
//! Then the file is checked: one object and one change per committed transaction, each
//! collection's token equal to its changes, no token given twice, `PRAGMA quick_check` says
//! `ok`. Any difference fails the run (a message, exit status 1).
//!
//! **Rounds** (`--rounds`, 5): every round runs every cell once, in an order rotated by one
//! cell per round, so that a slow moment of the machine falls on different cells. The table
//! gives each cell's median over the rounds (and their range), and each column's ratios to
//! `rusqlite` at the same level: throughput (below 1: slower than the ceiling) and CPU per
//! transaction (above 1: costlier), each the median of the per-round ratios. `--json` prints
//! the report (every cell of every round, and the summary) on stdout, and the table on
//! stderr. `--quick`: 1 s cells, 2 rounds. For investigations, `--levels full,normal` and
//! `--columns rusqlite,sqlx,write-path,write-path-tasks` run fewer cells (the ratios need
//! `rusqlite`). `RUST_LOG` sets the log filter (default `warn`).

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use rusqlite::TransactionBehavior;
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{ConnectOptions, Connection, SqliteConnection, SqlitePool};
use tokio::runtime::Runtime;
use tower_sqlite_retry::WritePool;
use tower_sqlite_retry::write::{WriteThread, WriteThreadOptions};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The file's collections, as `writepath`'s.
const COLLECTIONS: i64 = 16;

/// Transactions each cell runs before its clock starts: they open the connections, prepare
/// the statements and have the write path ask SQLite which file it writes (its first `begin`),
/// none of which a server does per request. Checked with the rest, not counted in the figures.
const WARMUP: u64 = 20;

/// The pool under the write path (`writepath`'s `--pool-size`). Its connections would serve
/// reads, and there are none here: write transactions take the write path's own connection.
const POOL_SIZE: u32 = 8;

/// `busy_timeout` on every connection, as `writepath`'s servers set it (and sqlx by default).
/// Nothing should wait on it: one connection writes at a time.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// `writepath`'s schema (its `seed`).
const SCHEMA: &str = "CREATE TABLE collections (id INTEGER PRIMARY KEY, token INTEGER NOT NULL);
         CREATE TABLE objects (collection INTEGER NOT NULL, name TEXT NOT NULL,
             etag INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (collection, name));
         CREATE TABLE changes (id INTEGER PRIMARY KEY, collection INTEGER NOT NULL,
             name TEXT NOT NULL, token INTEGER NOT NULL);";

// The transaction: `writepath`'s `put_object`, statement by statement, its SQL text copied
// (every column runs these four strings).

/// Reads the collection's sync token.
const READ_TOKEN: &str = "SELECT token FROM collections WHERE id = ?";
/// Writes the object (a new name every time here, so an insert, through the upsert a `PUT`
/// runs).
const UPSERT: &str = "INSERT INTO objects (collection, name, etag, data) VALUES (?, ?, ?, ?)
         ON CONFLICT (collection, name) DO UPDATE SET etag = excluded.etag, data = excluded.data";
/// Bumps the token to the one read plus one: the read-then-write that only a transaction
/// begun `IMMEDIATE` (or serialized) keeps from losing an update.
const BUMP_TOKEN: &str = "UPDATE collections SET token = ? WHERE id = ?";
/// Logs the change under the new token.
const LOG_CHANGE: &str = "INSERT INTO changes (collection, name, token) VALUES (?, ?, ?)";
/// The same three writes in one `query` (sqlx binds each statement's arguments in turn): the
/// read-then-write done in SQL (`token + 1`, and the change logged with the token the row now
/// has), so that the transaction is one round trip to sqlx's connection thread between its
/// `BEGIN` and its `COMMIT` instead of four.
const ONE_QUERY: &str = "INSERT INTO objects (collection, name, etag, data) VALUES (?, ?, ?, ?)
         ON CONFLICT (collection, name) DO UPDATE SET etag = excluded.etag, data = excluded.data;
     UPDATE collections SET token = token + 1 WHERE id = ?;
     INSERT INTO changes (collection, name, token) SELECT ?, ?, token FROM collections WHERE id = ?";

#[derive(Debug, Parser)]
#[command(name = "ceiling")]
struct Args {
    /// Each cell's window, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Rounds (every cell once per round; the table gives medians).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Writer tasks of the `write path ×N` column.
    #[arg(long, default_value_t = 64)]
    tasks: usize,
    /// A smoke run: 1 s cells, 2 rounds (instead of --seconds and --rounds).
    #[arg(long)]
    quick: bool,
    /// The report as JSON on stdout (the table then goes to stderr).
    #[arg(long)]
    json: bool,
    /// The size of each object's data, in bytes.
    #[arg(long, default_value_t = 1024)]
    object_bytes: usize,
    /// Objects seeded in each collection before a cell.
    #[arg(long, default_value_t = 200)]
    seed: u32,
    /// Where the cells' temporary directories go [default: the system's temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The columns to run [default: all] (the ratios need `rusqlite`).
    #[arg(long, value_enum, value_delimiter = ',')]
    columns: Vec<Column>,
    /// The `synchronous` levels to run [default: both].
    #[arg(long, value_enum, value_delimiter = ',')]
    levels: Vec<Level>,
}

/// A `synchronous` level.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "UPPERCASE")]
enum Level {
    Full,
    Normal,
}

impl Level {
    const ALL: [Level; 2] = [Level::Full, Level::Normal];

    fn pragma(self) -> &'static str {
        match self {
            Level::Full => "FULL",
            Level::Normal => "NORMAL",
        }
    }

    fn sqlx(self) -> SqliteSynchronous {
        match self {
            Level::Full => SqliteSynchronous::Full,
            Level::Normal => SqliteSynchronous::Normal,
        }
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.pragma())
    }
}

/// What runs the transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Column {
    /// rusqlite on the main thread: the ceiling.
    Rusqlite,
    /// One sqlx connection, one task.
    Sqlx,
    /// One sqlx connection, one task, the statements in one `query`.
    SqlxOneQuery,
    /// The same, each `COMMIT` sent with the next transaction's `BEGIN IMMEDIATE`.
    SqlxFused,
    /// `WritePool`, one task.
    WritePath,
    /// `WritePool`, `--tasks` tasks.
    WritePathTasks,
    /// `WriteThread` (rusqlite on the writer thread), one task.
    Thread,
    /// `WriteThread`, `--tasks` tasks.
    ThreadTasks,
}

impl Column {
    const ALL: [Column; 8] = [
        Column::Rusqlite,
        Column::Sqlx,
        Column::SqlxOneQuery,
        Column::SqlxFused,
        Column::WritePath,
        Column::WritePathTasks,
        Column::Thread,
        Column::ThreadTasks,
    ];

    fn label(self, tasks: usize) -> String {
        match self {
            Column::Rusqlite => "rusqlite".to_owned(),
            Column::Sqlx => "sqlx".to_owned(),
            Column::SqlxOneQuery => "sqlx, one query".to_owned(),
            Column::SqlxFused => "sqlx, fused".to_owned(),
            Column::WritePath => "write path".to_owned(),
            Column::WritePathTasks => format!("write path ×{tasks}"),
            Column::Thread => "thread".to_owned(),
            Column::ThreadTasks => format!("thread ×{tasks}"),
        }
    }

    /// The writer tasks (or threads) it runs.
    fn tasks(self, tasks: usize) -> usize {
        match self {
            Column::WritePathTasks | Column::ThreadTasks => tasks,
            _ => 1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The transaction, on each driver

/// What one transaction writes.
struct Put<'a> {
    collection: i64,
    name: String,
    etag: i64,
    data: &'a str,
}

impl<'a> Put<'a> {
    /// Writer `task`'s `n`th transaction: a name no other transaction has (so the upsert
    /// inserts, and the check can count), the collections in turn.
    fn new(task: usize, n: u64, data: &'a str) -> Self {
        Put {
            collection: ((task as u64 + n) % COLLECTIONS as u64) as i64,
            name: format!("t{task}-{n}"),
            etag: n as i64,
            data,
        }
    }
}

/// The transaction on rusqlite, on the calling thread: begun `IMMEDIATE`, its statements from
/// the connection's cache.
fn put_rusqlite(conn: &mut rusqlite::Connection, put: &Put<'_>) -> rusqlite::Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let token: i64 = tx
        .prepare_cached(READ_TOKEN)?
        .query_row([put.collection], |row| row.get(0))?;
    tx.prepare_cached(UPSERT)?.execute(rusqlite::params![
        put.collection,
        put.name,
        put.etag,
        put.data
    ])?;
    tx.prepare_cached(BUMP_TOKEN)?
        .execute(rusqlite::params![token + 1, put.collection])?;
    tx.prepare_cached(LOG_CHANGE)?.execute(rusqlite::params![
        put.collection,
        put.name,
        token + 1
    ])?;
    tx.commit()
}

/// The four statements on a sqlx connection in a transaction (sqlx's own or the write
/// path's): `writepath`'s `put_object` without the HTTP around it. sqlx prepares and caches
/// them (`persistent`, its default), as rusqlite's `prepare_cached` does.
async fn put_sqlx(conn: &mut SqliteConnection, put: &Put<'_>) -> Result<(), sqlx::Error> {
    let token: i64 = sqlx::query_scalar(READ_TOKEN)
        .bind(put.collection)
        .fetch_one(&mut *conn)
        .await?;
    sqlx::query(UPSERT)
        .bind(put.collection)
        .bind(&put.name)
        .bind(put.etag)
        .bind(put.data)
        .execute(&mut *conn)
        .await?;
    sqlx::query(BUMP_TOKEN)
        .bind(token + 1)
        .bind(put.collection)
        .execute(&mut *conn)
        .await?;
    sqlx::query(LOG_CHANGE)
        .bind(put.collection)
        .bind(&put.name)
        .bind(token + 1)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// The transaction on one sqlx connection, begun `IMMEDIATE` as `writepath`'s `immediate`
/// configuration begins it.
async fn put_sqlx_tx(conn: &mut SqliteConnection, put: &Put<'_>) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    put_sqlx(&mut tx, put).await?;
    tx.commit().await
}

/// The transaction on one sqlx connection in three round trips: `BEGIN IMMEDIATE`, the
/// statements in one `query`, `COMMIT`.
async fn put_sqlx_one_query(conn: &mut SqliteConnection, put: &Put<'_>) -> Result<(), sqlx::Error> {
    let mut tx = conn.begin_with("BEGIN IMMEDIATE").await?;
    sqlx::query(ONE_QUERY)
        .bind(put.collection)
        .bind(&put.name)
        .bind(put.etag)
        .bind(put.data)
        .bind(put.collection)
        .bind(put.collection)
        .bind(&put.name)
        .bind(put.collection)
        .execute(&mut *tx)
        .await?;
    tx.commit().await
}

/// The statements of [`put_sqlx_one_query`] in the transaction already begun on `conn`, then
/// its `COMMIT` and the next transaction's `BEGIN IMMEDIATE` in one round trip: two round trips
/// a transaction. What fusing a writer's `COMMIT` with the next writer's `BEGIN` would give.
async fn put_sqlx_fused(conn: &mut SqliteConnection, put: &Put<'_>) -> Result<(), sqlx::Error> {
    sqlx::query(ONE_QUERY)
        .bind(put.collection)
        .bind(&put.name)
        .bind(put.etag)
        .bind(put.data)
        .bind(put.collection)
        .bind(put.collection)
        .bind(&put.name)
        .bind(put.collection)
        .execute(&mut *conn)
        .await?;
    sqlx::raw_sql("COMMIT; BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .map(drop)
}

/// The transaction on the write path: its turn, `BEGIN IMMEDIATE` on its writer connection,
/// and the commit that gives the turn back (once durable, at `FULL` with group commit).
async fn put_write_path(writes: &WritePool, put: &Put<'_>) -> Result<(), sqlx::Error> {
    let mut tx = writes.begin().await?;
    put_sqlx(&mut tx, put).await?;
    tx.commit().await
}

/// The transaction on the writer thread (`WriteThread`): the same statements as rusqlite's,
/// from the writer connection's cache, in a closure the writer thread runs in its turn; `Ok`
/// once committed and (at `FULL`, group commit) durable.
async fn put_thread(
    writes: &WriteThread,
    task: usize,
    n: u64,
    data: Arc<str>,
) -> Result<(), rusqlite::Error> {
    writes
        .transaction(move |tx| {
            let put = Put::new(task, n, &data);
            let token: i64 = tx
                .prepare_cached(READ_TOKEN)?
                .query_row([put.collection], |row| row.get(0))?;
            tx.prepare_cached(UPSERT)?.execute(rusqlite::params![
                put.collection,
                put.name,
                put.etag,
                put.data
            ])?;
            tx.prepare_cached(BUMP_TOKEN)?
                .execute(rusqlite::params![token + 1, put.collection])?;
            tx.prepare_cached(LOG_CHANGE)?.execute(rusqlite::params![
                put.collection,
                put.name,
                token + 1
            ])?;
            Ok(())
        })
        .await
}

// ---------------------------------------------------------------------------------------------
// The file

/// A rusqlite connection set as sqlx's are here (WAL, `level`, `busy_timeout`,
/// `foreign_keys`), with SQLite's open flags as both use them (read-write, no mutex).
fn open_rusqlite(path: &Path, level: Level) -> Result<rusqlite::Connection, BoxError> {
    let conn = rusqlite::Connection::open(path)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(format!("journal_mode is {mode}, not wal").into());
    }
    conn.pragma_update(None, "synchronous", level.pragma())?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    Ok(conn)
}

/// sqlx's options for the same file: WAL, `level`, `busy_timeout` (and sqlx's defaults, among
/// them `foreign_keys` on).
fn options(path: &Path, level: Level) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(level.sqlx())
        .busy_timeout(BUSY_TIMEOUT)
}

async fn open_pool(path: &Path, level: Level) -> Result<SqlitePool, sqlx::Error> {
    SqlitePoolOptions::new()
        .max_connections(POOL_SIZE)
        .connect_with(options(path, level))
        .await
}

/// Creates the file: the schema, and `seed` objects in each collection (as `writepath`
/// seeds), in WAL mode (which the file keeps).
fn create(path: &Path, seed: u32) -> Result<(), BoxError> {
    let mut conn = open_rusqlite(path, Level::Normal)?;
    conn.execute_batch(SCHEMA)?;
    let tx = conn.transaction()?;
    {
        let mut collection = tx.prepare("INSERT INTO collections (id, token) VALUES (?, 0)")?;
        let mut object = tx.prepare("INSERT INTO objects VALUES (?, ?, 0, 'seed')")?;
        for c in 0..COLLECTIONS {
            collection.execute([c])?;
            for i in 0..seed {
                object.execute(rusqlite::params![c, format!("seed-{i}")])?;
            }
        }
    }
    tx.commit()?;
    conn.close().map_err(|(_, e)| e)?;
    Ok(())
}

/// Checks the file after a cell of `committed` transactions (its connections closed): one
/// object and one change each, every collection's token its count of changes (a lost update
/// would leave it lower) and no token logged twice, and SQLite's `quick_check`.
fn check(path: &Path, seed: u32, committed: u64) -> Result<(), BoxError> {
    let conn = rusqlite::Connection::open(path)?;
    let count = |sql: &str| conn.query_row(sql, [], |row| row.get::<_, i64>(0));
    let objects = count("SELECT COUNT(*) FROM objects")?;
    let changes = count("SELECT COUNT(*) FROM changes")?;
    let tokens = count("SELECT COALESCE(SUM(token), 0) FROM collections")?;
    let wrong = count(
        "SELECT COUNT(*) FROM collections c LEFT JOIN (
             SELECT collection, COUNT(*) AS n, COUNT(DISTINCT token) AS d, MAX(token) AS m
             FROM changes GROUP BY collection) ch ON ch.collection = c.id
         WHERE COALESCE(ch.n, 0) != c.token OR COALESCE(ch.d, 0) != c.token
             OR COALESCE(ch.m, 0) != c.token",
    )?;
    let quick: String = conn.query_row("PRAGMA quick_check", [], |row| row.get(0))?;
    let committed = committed as i64;
    let seeded = i64::from(seed) * COLLECTIONS;
    let mut problems = Vec::new();
    if objects != seeded + committed {
        problems.push(format!(
            "{objects} objects, expected {seeded} seeded + {committed} committed"
        ));
    }
    if changes != committed {
        problems.push(format!("{changes} changes, expected {committed}"));
    }
    if tokens != committed {
        problems.push(format!("the tokens sum to {tokens}, expected {committed}"));
    }
    if wrong != 0 {
        problems.push(format!(
            "{wrong} collections whose token is not their count of distinct changes"
        ));
    }
    if quick != "ok" {
        problems.push(format!("quick_check: {quick}"));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("; ").into())
    }
}

/// The object's data: `bytes` bytes of ASCII text, shaped like the start of a calendar entry.
fn object_data(bytes: usize) -> Arc<str> {
    let mut data = String::from("BEGIN:VCALENDAR\r\nVERSION:2.0\r\nDESCRIPTION:");
    while data.len() < bytes {
        data.push('x');
    }
    data.truncate(bytes);
    data.into()
}

// ---------------------------------------------------------------------------------------------
// The columns

/// One cell's window.
struct Measured {
    /// Transactions committed in the window.
    transactions: u64,
    /// The window: from the clock's start to the last transaction's commit.
    seconds: f64,
    /// The process's CPU seconds (user + system) over the window.
    cpu_seconds: f64,
    /// The write path's group commit over the window: fsyncs run, transactions they made
    /// durable.
    syncs: Option<(u64, u64)>,
}

/// The start of a window: wall clock and the process's CPU time.
struct Clock {
    start: Instant,
    cpu: f64,
}

impl Clock {
    fn start() -> Self {
        Clock {
            cpu: cpu_seconds(),
            start: Instant::now(),
        }
    }

    fn stop(self, transactions: u64) -> Measured {
        let seconds = self.start.elapsed().as_secs_f64();
        Measured {
            transactions,
            seconds,
            cpu_seconds: cpu_seconds() - self.cpu,
            syncs: None,
        }
    }
}

/// User + system CPU seconds of this process so far, every thread's (`/proc/self/stat`; NaN
/// where there is none). Clock ticks are 100 per second on Linux.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // The fields after the command's closing parenthesis: state is the 3rd field, utime the
    // 14th, stime the 15th.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    match (tick(11), tick(12)) {
        (Some(user), Some(system)) => (user + system) / 100.0,
        _ => f64::NAN,
    }
}

/// `rusqlite`: one connection, on this thread, outside the runtime.
fn rusqlite_column(
    path: &Path,
    level: Level,
    window: Duration,
    data: &str,
) -> Result<Measured, BoxError> {
    let mut conn = open_rusqlite(path, level)?;
    for n in 0..WARMUP {
        put_rusqlite(&mut conn, &Put::new(0, n, data))?;
    }
    let clock = Clock::start();
    let end = clock.start + window;
    let mut n = WARMUP;
    while Instant::now() < end {
        put_rusqlite(&mut conn, &Put::new(0, n, data))?;
        n += 1;
    }
    let measured = clock.stop(n - WARMUP);
    conn.close().map_err(|(_, e)| e)?;
    Ok(measured)
}

/// `sqlx`: one connection, in one task on the runtime (as a handler runs).
async fn sqlx_column(
    path: &Path,
    level: Level,
    window: Duration,
    data: Arc<str>,
    column: Column,
) -> Result<Measured, BoxError> {
    let mut conn = options(path, level).connect().await?;
    for n in 0..WARMUP {
        put_sqlx_tx(&mut conn, &Put::new(0, n, &data)).await?;
    }
    if column == Column::SqlxFused {
        sqlx::raw_sql("BEGIN IMMEDIATE").execute(&mut conn).await?;
    }
    let clock = Clock::start();
    let end = clock.start + window;
    let (conn, n) = tokio::spawn(async move {
        let mut n = WARMUP;
        while Instant::now() < end {
            let put = Put::new(0, n, &data);
            match column {
                Column::SqlxOneQuery => put_sqlx_one_query(&mut conn, &put).await?,
                Column::SqlxFused => put_sqlx_fused(&mut conn, &put).await?,
                _ => put_sqlx_tx(&mut conn, &put).await?,
            }
            n += 1;
        }
        if column == Column::SqlxFused {
            // The transaction the last fused `COMMIT` began: empty.
            sqlx::raw_sql("COMMIT").execute(&mut conn).await?;
        }
        Ok::<_, sqlx::Error>((conn, n))
    })
    .await??;
    let measured = clock.stop(n - WARMUP);
    conn.close().await?;
    Ok(measured)
}

/// `write path` (`tasks` 1) and `write path ×N`: `WritePool::new` over a pool, `tasks`
/// tasks on the runtime, each writing in a loop.
async fn write_path_column(
    path: &Path,
    level: Level,
    window: Duration,
    data: Arc<str>,
    tasks: usize,
) -> Result<Measured, BoxError> {
    let writes = WritePool::new(open_pool(path, level).await?);
    for n in 0..WARMUP {
        put_write_path(&writes, &Put::new(0, n, &data)).await?;
    }
    let before = writes.stats();
    let clock = Clock::start();
    let end = clock.start + window;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (writes, data) = (writes.clone(), data.clone());
        set.spawn(async move {
            // Task 0 goes on after the warm-up's names.
            let first = if task == 0 { WARMUP } else { 0 };
            let mut n = first;
            while Instant::now() < end {
                put_write_path(&writes, &Put::new(task, n, &data)).await?;
                n += 1;
            }
            Ok::<_, sqlx::Error>(n - first)
        });
    }
    let mut transactions = 0;
    while let Some(done) = set.join_next().await {
        transactions += done??;
    }
    let mut measured = clock.stop(transactions);
    if let (Some(before), Some(after)) = (before, writes.stats()) {
        if after.sync_errors != before.sync_errors {
            return Err(format!(
                "{} failed syncs of the WAL",
                after.sync_errors - before.sync_errors
            )
            .into());
        }
        measured.syncs = Some((after.syncs - before.syncs, after.synced - before.synced));
    }
    writes.close().await;
    Ok(measured)
}

/// `thread` (`tasks` 1) and `thread ×N`: `WriteThread::open_with` at `level` (group commit
/// on, its default; `foreign_keys` on, as the others have it), `tasks` tasks on the runtime,
/// each writing in a loop.
async fn thread_column(
    path: &Path,
    level: Level,
    window: Duration,
    data: Arc<str>,
    tasks: usize,
) -> Result<Measured, BoxError> {
    let options = WriteThreadOptions::default().busy_timeout(BUSY_TIMEOUT);
    let options = match level {
        Level::Full => options,
        Level::Normal => options.synchronous_normal(),
    };
    let writes = WriteThread::open_with(path, options, |conn| {
        conn.execute_batch("PRAGMA foreign_keys = ON")
    })?;
    for n in 0..WARMUP {
        put_thread(&writes, 0, n, data.clone()).await?;
    }
    let before = writes.stats();
    let clock = Clock::start();
    let end = clock.start + window;
    let mut set = tokio::task::JoinSet::new();
    for task in 0..tasks {
        let (writes, data) = (writes.clone(), data.clone());
        set.spawn(async move {
            let first = if task == 0 { WARMUP } else { 0 };
            let mut n = first;
            while Instant::now() < end {
                put_thread(&writes, task, n, data.clone()).await?;
                n += 1;
            }
            Ok::<_, rusqlite::Error>(n - first)
        });
    }
    let mut transactions = 0;
    while let Some(done) = set.join_next().await {
        transactions += done??;
    }
    let mut measured = clock.stop(transactions);
    let after = writes.stats();
    if after.sync_errors != before.sync_errors {
        return Err(format!(
            "{} failed syncs of the WAL",
            after.sync_errors - before.sync_errors
        )
        .into());
    }
    if after.syncs > before.syncs {
        measured.syncs = Some((after.syncs - before.syncs, after.synced - before.synced));
    }
    drop(writes);
    Ok(measured)
}

// ---------------------------------------------------------------------------------------------
// Cells, rounds, summary

/// One cell of one round.
#[derive(Debug, Clone, Serialize)]
struct Cell {
    round: usize,
    synchronous: Level,
    column: Column,
    tasks: usize,
    /// Transactions committed in the window (the warm-up's not counted).
    transactions: u64,
    seconds: f64,
    tx_per_s: f64,
    /// The process's CPU time over the window per transaction, in µs.
    cpu_us_per_tx: f64,
    /// The write path's group commit: transactions made durable per fsync it ran (none when
    /// it ran none: one task, or `NORMAL`).
    tx_per_fsync: Option<f64>,
}

/// The run's settings, flags resolved.
struct Settings {
    seconds: f64,
    rounds: usize,
    tasks: usize,
    object_bytes: usize,
    seed: u32,
    dir: Option<PathBuf>,
}

fn run_cell(
    rt: &Runtime,
    settings: &Settings,
    data: &Arc<str>,
    round: usize,
    (level, column): (Level, Column),
) -> Result<Cell, BoxError> {
    let dir = match &settings.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let path = dir.path().join("ceiling.db");
    create(&path, settings.seed)?;
    let window = Duration::from_secs_f64(settings.seconds);
    let tasks = column.tasks(settings.tasks);
    let measured = match column {
        Column::Rusqlite => rusqlite_column(&path, level, window, data)?,
        Column::Sqlx | Column::SqlxOneQuery | Column::SqlxFused => {
            rt.block_on(sqlx_column(&path, level, window, data.clone(), column))?
        }
        Column::WritePath | Column::WritePathTasks => {
            rt.block_on(write_path_column(&path, level, window, data.clone(), tasks))?
        }
        Column::Thread | Column::ThreadTasks => {
            rt.block_on(thread_column(&path, level, window, data.clone(), tasks))?
        }
    };
    check(&path, settings.seed, WARMUP + measured.transactions).map_err(|e| {
        format!(
            "round {round}, {level}, {}: the file does not match its {} committed \
             transactions: {e}",
            column.label(settings.tasks),
            WARMUP + measured.transactions
        )
    })?;
    let per_tx = measured.transactions.max(1) as f64;
    Ok(Cell {
        round,
        synchronous: level,
        column,
        tasks,
        transactions: measured.transactions,
        seconds: measured.seconds,
        tx_per_s: measured.transactions as f64 / measured.seconds,
        cpu_us_per_tx: measured.cpu_seconds * 1e6 / per_tx,
        tx_per_fsync: measured
            .syncs
            .filter(|&(syncs, _)| syncs > 0)
            .map(|(syncs, synced)| synced as f64 / syncs as f64),
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// One column at one level over the rounds.
#[derive(Debug, Serialize)]
struct Summary {
    synchronous: Level,
    column: Column,
    tasks: usize,
    /// Medians over the rounds.
    tx_per_s: f64,
    tx_per_s_min: f64,
    tx_per_s_max: f64,
    cpu_us_per_tx: f64,
    tx_per_fsync: Option<f64>,
    /// Throughput ÷ `rusqlite`'s at the same level, the median of the per-round ratios
    /// (none for `rusqlite` itself).
    tx_per_s_vs_rusqlite: Option<f64>,
    /// CPU per transaction ÷ `rusqlite`'s, the same way.
    cpu_vs_rusqlite: Option<f64>,
}

fn summarize(cells: &[Cell]) -> Vec<Summary> {
    let find = |level, column, round| {
        cells
            .iter()
            .find(|c| c.synchronous == level && c.column == column && c.round == round)
    };
    let mut out = Vec::new();
    for level in Level::ALL {
        for column in Column::ALL {
            let mine: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.synchronous == level && c.column == column)
                .collect();
            let Some(first) = mine.first() else {
                continue;
            };
            // None for rusqlite itself, and when it did not run.
            let ratio = |f: fn(&Cell) -> f64| {
                let ratios: Vec<f64> = mine
                    .iter()
                    .filter_map(|c| find(level, Column::Rusqlite, c.round).map(|r| f(c) / f(r)))
                    .collect();
                (column != Column::Rusqlite && !ratios.is_empty()).then(|| median(ratios))
            };
            let tx_per_s: Vec<f64> = mine.iter().map(|c| c.tx_per_s).collect();
            let fsync: Vec<f64> = mine.iter().filter_map(|c| c.tx_per_fsync).collect();
            out.push(Summary {
                synchronous: level,
                column,
                tasks: first.tasks,
                tx_per_s_min: tx_per_s.iter().copied().fold(f64::INFINITY, f64::min),
                tx_per_s_max: tx_per_s.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                tx_per_s: median(tx_per_s),
                cpu_us_per_tx: median(mine.iter().map(|c| c.cpu_us_per_tx).collect()),
                tx_per_fsync: (!fsync.is_empty()).then(|| median(fsync)),
                tx_per_s_vs_rusqlite: ratio(|c| c.tx_per_s),
                cpu_vs_rusqlite: ratio(|c| c.cpu_us_per_tx),
            });
        }
    }
    out
}

fn table(summary: &[Summary], tasks: usize, meta: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{meta}\n");
    let opt = |v: Option<f64>, digits: usize| match v {
        Some(v) => format!("{v:.digits$}"),
        None => "-".to_owned(),
    };
    for level in Level::ALL {
        let _ = writeln!(out, "synchronous = {level}");
        let _ = writeln!(
            out,
            "  {:<16} {:>9} {:>19} {:>11} {:>15} {:>14} {:>9}",
            "column",
            "tx/s",
            "(min–max)",
            "CPU µs/tx",
            "tx/s ÷ rusqlite",
            "CPU ÷ rusqlite",
            "tx/fsync"
        );
        for s in summary.iter().filter(|s| s.synchronous == level) {
            let range = format!("({:.0}–{:.0})", s.tx_per_s_min, s.tx_per_s_max);
            let _ = writeln!(
                out,
                "  {:<16} {:>9.0} {:>19} {:>11.1} {:>15} {:>14} {:>9}",
                s.column.label(tasks),
                s.tx_per_s,
                range,
                s.cpu_us_per_tx,
                opt(s.tx_per_s_vs_rusqlite, 2),
                opt(s.cpu_vs_rusqlite, 2),
                opt(s.tx_per_fsync, 1),
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(
        out,
        "Medians over the rounds. ÷ rusqlite: the column's figure over rusqlite's at the same level \
         (the median of the per-round ratios): tx/s below 1 is slower than the ceiling, CPU \
         above 1 costlier. CPU: the whole process's (every thread), from /proc/self/stat \
         (10 ms ticks). tx/fsync: transactions per fsync of group commit."
    );
    out
}

/// The file system of `dir` (from `/proc/self/mountinfo`: the longest mount point above it),
/// or `unknown`.
fn filesystem(dir: &Path) -> String {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return "unknown".to_owned();
    };
    info.lines()
        .filter_map(|line| {
            let (mount, fs) = line.split_once(" - ")?;
            let point = mount.split_whitespace().nth(4)?;
            let fs = fs.split_whitespace().next()?;
            dir.starts_with(point).then(|| (point.len(), fs.to_owned()))
        })
        .max_by_key(|&(len, _)| len)
        .map_or_else(|| "unknown".to_owned(), |(_, fs)| fs)
}

/// The SQLite library sqlx runs, and rusqlite's: the same one, or the comparison is not of
/// the drivers alone.
async fn sqlite_versions() -> Result<(String, String), BoxError> {
    let mut conn = SqliteConnectOptions::from_str("sqlite::memory:")?
        .connect()
        .await?;
    let sqlx: String = sqlx::query_scalar("SELECT sqlite_version()")
        .fetch_one(&mut conn)
        .await?;
    conn.close().await?;
    Ok((sqlx, rusqlite::version().to_owned()))
}

fn run(args: &Args) -> Result<(), BoxError> {
    let settings = Settings {
        seconds: if args.quick { 1.0 } else { args.seconds },
        rounds: if args.quick { 2 } else { args.rounds },
        tasks: args.tasks,
        object_bytes: args.object_bytes,
        seed: args.seed,
        dir: args.dir.clone(),
    };
    // (A NaN or infinite window is refused too.)
    if !settings.seconds.is_finite()
        || settings.seconds <= 0.0
        || settings.rounds == 0
        || settings.tasks == 0
    {
        return Err("--seconds (finite), --rounds and --tasks must be above 0".into());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (sqlx_sqlite, rusqlite_sqlite) = rt.block_on(sqlite_versions())?;
    if sqlx_sqlite != rusqlite_sqlite {
        return Err(format!(
            "sqlx runs SQLite {sqlx_sqlite} and rusqlite {rusqlite_sqlite}: not one library"
        )
        .into());
    }
    let temp = settings.dir.clone().unwrap_or_else(std::env::temp_dir);
    let fs = filesystem(&temp);
    if fs == "tmpfs" || fs == "ramfs" {
        eprintln!(
            "ceiling: {} is on {fs}: an fsync costs nothing there, FULL is NORMAL (--dir DIR \
             for a disk)",
            temp.display()
        );
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let data = object_data(settings.object_bytes);
    let order: Vec<(Level, Column)> = Level::ALL
        .into_iter()
        .filter(|l| args.levels.is_empty() || args.levels.contains(l))
        .flat_map(|level| {
            Column::ALL
                .into_iter()
                .filter(|c| args.columns.is_empty() || args.columns.contains(c))
                .map(move |column| (level, column))
        })
        .collect();
    let mut cells = Vec::new();
    for round in 1..=settings.rounds {
        // Rotated by one cell per round: a slow moment of the machine falls on a different
        // cell each round.
        let shift = (round - 1) % order.len();
        for &(level, column) in order[shift..].iter().chain(&order[..shift]) {
            let cell = run_cell(&rt, &settings, &data, round, (level, column))?;
            eprintln!(
                "round {round}/{} {:<6} {:<16} {:>8.0} tx/s {:>8.1} µs CPU/tx{}",
                settings.rounds,
                level.pragma(),
                column.label(settings.tasks),
                cell.tx_per_s,
                cell.cpu_us_per_tx,
                cell.tx_per_fsync
                    .map_or(String::new(), |g| format!(" {g:.1} tx/fsync")),
            );
            cells.push(cell);
        }
    }
    let summary = summarize(&cells);
    let meta = format!(
        "ceiling: the write transaction back to back, in process; SQLite {sqlx_sqlite} (rusqlite \
         and sqlx alike), WAL; {} s cells, {} rounds, {}-byte objects, {} CPUs, files in {} \
         ({fs})",
        settings.seconds,
        settings.rounds,
        settings.object_bytes,
        cpus,
        temp.display()
    );
    let table = table(&summary, settings.tasks, &meta);
    if args.json {
        eprint!("{table}");
        let report = serde_json::json!({
            "bench": "ceiling",
            "sqlite_version": sqlx_sqlite,
            "seconds": settings.seconds,
            "rounds": settings.rounds,
            "tasks": settings.tasks,
            "object_bytes": settings.object_bytes,
            "seed": settings.seed,
            "warmup": WARMUP,
            "pool_size": POOL_SIZE,
            "cpus": cpus,
            "dir": temp,
            "filesystem": fs,
            "summary": summary,
            "cells": cells,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{table}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ceiling: {e}");
            ExitCode::FAILURE
        }
    }
}
