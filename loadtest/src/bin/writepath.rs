//! The write path against `BEGIN IMMEDIATE`, on a handler of the real shape, measured from a
//! real client over loopback HTTP/1.1.
//!
//! ```text
//! cargo run --release -p tower-sqlite-retry-loadtest --bin writepath                          # all (≈ 12 min)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin writepath -- --quick               # smoke (≈ 50 s)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin writepath -- --rounds 5 --out benches/results/writepath
//! cargo run --release -p tower-sqlite-retry-loadtest --bin writepath -- --replot benches/results/writepath  # the chart again
//! ```
//!
//! **The handler** is shaped like a CalDAV `PUT`: about `--prep-us` (300) µs of CPU first
//! (hashing the body, as parsing and authentication would), then one read-then-write
//! transaction of four statements (read the collection's sync token, upsert the object, bump
//! the token, log the change), then a read after commit (the collection's object count).
//! Reads (`GET`) fetch one object by name.
//!
//! **Configurations** (`--configs`), each server in its own process (this binary re-executed
//! with a hidden `--serve`), on a fresh SQLite file (WAL, `synchronous = NORMAL`, or `FULL` with
//! `--synchronous full`,
//! `busy_timeout` 5 s), pool of `--pool-size` (8):
//!
//! | config | what |
//! |---|---|
//! | `deferred` | no layer, `pool.begin()` (deferred) |
//! | `immediate` | no layer, `begin_with("BEGIN IMMEDIATE")`: **the reference** |
//! | `two-pool` | no layer, `BEGIN IMMEDIATE` on a writer pool of 1, reads on the pool |
//! | `layer` | `SqliteRetryLayer` (default policy), the handler unchanged (deferred) |
//! | `layer-write` | `SqliteRetryLayer` (default policy) and the write path (`WritePool`, its writer connection) without group commit (`group_commit(false)`) |
//! | `layer-write-shared` | the same with `writer(WriterConnection::FromPool)`: writes take the pool's connections (the write path before it had a writer connection) |
//! | `layer-write-group` | the write path as `WritePool::new` makes it: group commit on (the default) |
//! | `layer-write-read-limit` | `layer-write` (no groups) with the layer's default read limit (`ReadLimit::default()`: a read per core but one) while writers wait |
//! | `layer-write-group-read-limit` | `layer-write-group` with the same read limit |
//! | `layer-thread` | `SqliteRetryLayer` and rusqlite's write path (`WriteThread`, group commit on): the transaction a closure run on the writer thread; reads on the sqlx pool |
//! | `layer-thread-read-limit` | `layer-thread` with the layer's default read limit while writers wait (closures waiting for the writer thread count) |
//!
//! **Client**: a closed loop (like `wrk`) of `--connections` keep-alive HTTP/1.1 connections in
//! this process, each sending its next request when the previous answer is read; `--warmup`
//! seconds, then a window of `--duration` seconds. Loads: `writes` (only `PUT`s) at each of
//! `--connections`, and `mixed` (`--write-ratio` 0.3 writes, the rest reads) at each of
//! `--mixed-connections`, and `split` (`--split` 64+16: 64 connections that only write and 16 that
//! only read, the trial where `BEGIN IMMEDIATE` starved its readers). Every cell is checked afterwards: every `2xx` write has exactly one
//! object and one change-log row, nothing else is there.
//!
//! **Rounds**: every round runs every cell once, the configurations' order rotated per round.
//! The table gives medians over rounds and the median of per-round ratios to `immediate`.
//! With `--out DIR` it writes `writepath.{md,json}` and `writepath.svg` (writes/s and p99 of
//! the `writes` load against the connection count); `--replot DIR` draws the SVG again from
//! the JSON.
//!
//! With `--smoke` it does a tiny run that checks the harness and writes nothing.
//!
//! For investigations: `--turn-stats FILE` (each `layer-write` server appends its write turn's
//! transactions and mean time held when it stops), `--global-queue-interval N` (the servers'
//! tokio setting), `--server-cpus LIST` (each server under `taskset -c LIST`; run the bench
//! itself under `taskset -c` another CPU, and client and server share no core), and the
//! environment variables `WRITEPATH_AUTOCHECKPOINT` (every connection's `wal_autocheckpoint`,
//! which the write path's checkpointer follows; 1,000 pages, SQLite's default, unless set),
//! `WRITEPATH_WRITE_LIMIT` (the layered configurations' `PUT`s at most that many at once,
//! through tower's `ConcurrencyLimitLayer`; reads unlimited),
//! `WRITEPATH_READ_LIMIT` and `WRITEPATH_READ_WAIT_MS` (the `-read-limit` configurations'
//! reads at once and longest wait, instead of the layer's defaults: a read per core but one,
//! 10 ms).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, State};
use axum::http::StatusCode;
use axum::routing::put;
use axum::{Json, Router};
use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqliteConnection, SqlitePool, Transaction};
use tokio::net::TcpStream;
use tower_sqlite_retry::write::{WriteThread, WriteThreadOptions};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool, WriteTransaction};

#[path = "../chart.rs"]
mod chart;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const COLLECTIONS: u32 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Config {
    Deferred,
    Immediate,
    TwoPool,
    Layer,
    LayerWrite,
    /// The write path with no writer connection of its own (`writer(WriterConnection::FromPool)`): write
    /// transactions take the application pool's connections (the write path before it had a
    /// writer connection).
    LayerWriteShared,
    /// The write path with group commit (`group_commit(true)`, the default).
    LayerWriteGroup,
    /// `layer-write` with the layer's default read limit while writers wait
    /// (`SqliteRetryLayer::limit_reads_while_writers_wait`).
    LayerWriteReadLimit,
    /// `layer-write-group` with the read limit.
    LayerWriteGroupReadLimit,
    /// The layer and rusqlite's write path (`WriteThread`): the transaction a closure on the
    /// writer thread, group commit on; reads on the sqlx pool.
    LayerThread,
    /// `layer-thread` with the layer's default read limit while writers wait (closures waiting
    /// for the writer thread count as writers waiting).
    LayerThreadReadLimit,
}

impl Config {
    fn key(self) -> &'static str {
        match self {
            Config::Deferred => "deferred",
            Config::Immediate => "immediate",
            Config::TwoPool => "two-pool",
            Config::Layer => "layer",
            Config::LayerWrite => "layer-write",
            Config::LayerWriteShared => "layer-write-shared",
            Config::LayerWriteGroup => "layer-write-group",
            Config::LayerWriteReadLimit => "layer-write-read-limit",
            Config::LayerWriteGroupReadLimit => "layer-write-group-read-limit",
            Config::LayerThread => "layer-thread",
            Config::LayerThreadReadLimit => "layer-thread-read-limit",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Load {
    Writes,
    Mixed,
    /// Writer connections and reader connections apart (`--split`).
    Split,
}

#[derive(Debug, Parser)]
#[command(name = "writepath")]
struct Args {
    /// A tiny run that checks the harness end to end and writes nothing (CI's
    /// `cargo run -p tower-sqlite-retry-loadtest --bin ... -- --smoke`).
    #[arg(long)]
    smoke: bool,
    /// Internal: serve this configuration.
    #[arg(long, hide = true)]
    serve: Option<Config>,
    /// Internal, with --serve: the SQLite file.
    #[arg(long, hide = true)]
    db: Option<PathBuf>,
    /// A smoke run: one round, 64 connections, 1 s cells.
    #[arg(long)]
    quick: bool,
    /// The configurations [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    configs: Vec<Config>,
    /// Connection counts of the `writes` load.
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024")]
    connections: Vec<usize>,
    /// Connection counts of the `mixed` load (empty: none).
    #[arg(long, value_delimiter = ',', default_value = "64,256")]
    mixed_connections: Vec<usize>,
    /// The `split` load: this many writer connections + this many reader connections
    /// (e.g. `64+16`, the shape of the trial where `BEGIN IMMEDIATE` starved its readers).
    #[arg(long, value_delimiter = ',', default_value = "64+16")]
    split: Vec<String>,
    /// The loads to run [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    loads: Vec<Load>,
    /// The share of writes in the `mixed` load.
    #[arg(long, default_value_t = 0.3)]
    write_ratio: f64,
    /// The measured window of every cell, in seconds.
    #[arg(long, default_value_t = 4.0)]
    duration: f64,
    /// Seconds of load before the window.
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The servers' pool size.
    #[arg(long, default_value_t = 8)]
    pool_size: u32,
    /// CPU work of each write before its transaction, in µs.
    #[arg(long, default_value_t = 300)]
    prep_us: u64,
    /// The same work as a number of hashing rounds. By default measured once, in this
    /// process before the first cell (the fastest of several tries), and handed to every
    /// server, so that every configuration does exactly the same work per write: a server
    /// that measured it for itself at start-up, on a machine still busy with the previous
    /// cell, would do less.
    #[arg(long)]
    prep_rounds: Option<u64>,
    /// Print the hashing rounds that take about `--prep-us` here, and exit (for scripts that
    /// start the servers themselves: `loadtest/scripts/wrk-group.sh`, `PREP_US`).
    #[arg(long)]
    calibrate: bool,
    /// Objects seeded per collection (reads pick one).
    #[arg(long, default_value_t = 200)]
    seed: u32,
    /// The client's tokio worker threads.
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
    /// Where to write writepath.{json,md,svg} (default: print only).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Draw DIR/writepath.svg again from DIR/writepath.json, and do nothing else.
    #[arg(long)]
    replot: Option<PathBuf>,
    /// The servers' tokio `global_queue_interval` (tokio's default when absent): how often a
    /// worker looks at the queue that tasks woken from outside the runtime (by sqlx's worker
    /// threads) go to.
    #[arg(long)]
    global_queue_interval: Option<u32>,
    /// Each `layer-write` server appends a line to FILE when it stops: its write turn's
    /// transactions, time held in all and mean time held.
    #[arg(long, value_name = "FILE")]
    turn_stats: Option<PathBuf>,
    /// Run each server on these CPUs only (`taskset -c LIST`), e.g. `1` with this process
    /// under `taskset -c 0`: the server then shares no core with the client.
    #[arg(long, value_name = "LIST")]
    server_cpus: Option<String>,
    /// The servers' `synchronous` setting: `normal` (the default, WAL's usual) or `full` (an
    /// fsync per commit: durable commits).
    #[arg(long, default_value = "normal", value_parser = ["normal", "full"])]
    synchronous: String,
}

// ---------------------------------------------------------------------------------------------
// The server

#[derive(Clone)]
enum Db {
    /// One pool; `immediate`: writes begin `IMMEDIATE`.
    Plain { pool: SqlitePool, immediate: bool },
    /// Reads on `read`, writes `IMMEDIATE` on `write` (one connection).
    TwoPool { read: SqlitePool, write: SqlitePool },
    /// The write path.
    Write(WritePool),
    /// rusqlite's write path; reads on `reads`.
    Thread {
        writes: WriteThread,
        reads: SqlitePool,
    },
}

enum Tx {
    Sqlx(Transaction<'static, Sqlite>),
    Write(WriteTransaction),
}

impl Tx {
    fn conn(&mut self) -> &mut SqliteConnection {
        match self {
            Tx::Sqlx(tx) => tx,
            Tx::Write(tx) => tx,
        }
    }

    async fn commit(self) -> Result<(), sqlx::Error> {
        match self {
            Tx::Sqlx(tx) => tx.commit().await,
            Tx::Write(tx) => tx.commit().await,
        }
    }
}

impl Db {
    fn reads(&self) -> &SqlitePool {
        match self {
            Db::Plain { pool, .. } => pool,
            Db::TwoPool { read, .. } => read,
            Db::Write(w) => w.pool(),
            Db::Thread { reads, .. } => reads,
        }
    }

    async fn begin(&self) -> Result<Tx, sqlx::Error> {
        Ok(match self {
            Db::Plain {
                pool,
                immediate: false,
            } => Tx::Sqlx(pool.begin().await?),
            Db::Plain {
                pool,
                immediate: true,
            } => Tx::Sqlx(pool.begin_with("BEGIN IMMEDIATE").await?),
            Db::TwoPool { write, .. } => Tx::Sqlx(write.begin_with("BEGIN IMMEDIATE").await?),
            Db::Write(w) => Tx::Write(w.begin().await?),
            Db::Thread { .. } => unreachable!("the writer thread takes a closure"),
        })
    }
}

#[derive(Clone)]
struct App {
    db: Db,
    /// Hash rounds that take about `--prep-us` of CPU.
    prep_rounds: u64,
}

#[derive(Deserialize)]
struct Object {
    data: String,
}

/// CPU work standing for parsing and authentication.
fn prepare(body: &[u8], rounds: u64) -> u64 {
    let mut h = DefaultHasher::new();
    for i in 0..rounds {
        i.hash(&mut h);
        body.hash(&mut h);
    }
    h.finish()
}

async fn put_object(
    State(app): State<App>,
    UrlPath((collection, name)): UrlPath<(u32, String)>,
    body: Bytes,
) -> Result<(StatusCode, Json<(i64, i64)>), DbError> {
    let etag = prepare(&body, app.prep_rounds) as i64;
    let object: Object = serde_json::from_slice(&body).map_err(DbError::internal)?;
    if let Db::Thread { writes, reads } = &app.db {
        let stored = name.clone();
        let token = writes
            .transaction(move |tx| {
                let token: i64 = tx
                    .prepare_cached("SELECT token FROM collections WHERE id = ?")?
                    .query_row([collection], |row| row.get(0))?;
                tx.prepare_cached(
                    "INSERT INTO objects (collection, name, etag, data) VALUES (?, ?, ?, ?)
                     ON CONFLICT (collection, name) DO UPDATE SET etag = excluded.etag, data = excluded.data",
                )?
                .execute(rusqlite::params![collection, stored, etag, object.data])?;
                tx.prepare_cached("UPDATE collections SET token = ? WHERE id = ?")?
                    .execute(rusqlite::params![token + 1, collection])?;
                tx.prepare_cached("INSERT INTO changes (collection, name, token) VALUES (?, ?, ?)")?
                    .execute(rusqlite::params![collection, stored, token + 1])?;
                Ok::<_, rusqlite::Error>(token)
            })
            .await?;
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM objects WHERE collection = ?")
            .bind(collection)
            .fetch_one(reads)
            .await?;
        return Ok((StatusCode::CREATED, Json((token + 1, count))));
    }
    let mut tx = app.db.begin().await?;
    let token: i64 = sqlx::query_scalar("SELECT token FROM collections WHERE id = ?")
        .bind(collection)
        .fetch_one(tx.conn())
        .await?;
    sqlx::query(
        "INSERT INTO objects (collection, name, etag, data) VALUES (?, ?, ?, ?)
         ON CONFLICT (collection, name) DO UPDATE SET etag = excluded.etag, data = excluded.data",
    )
    .bind(collection)
    .bind(&name)
    .bind(etag)
    .bind(&object.data)
    .execute(tx.conn())
    .await?;
    sqlx::query("UPDATE collections SET token = ? WHERE id = ?")
        .bind(token + 1)
        .bind(collection)
        .execute(tx.conn())
        .await?;
    sqlx::query("INSERT INTO changes (collection, name, token) VALUES (?, ?, ?)")
        .bind(collection)
        .bind(&name)
        .bind(token + 1)
        .execute(tx.conn())
        .await?;
    tx.commit().await?;
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM objects WHERE collection = ?")
        .bind(collection)
        .fetch_one(app.db.reads())
        .await?;
    Ok((StatusCode::CREATED, Json((token + 1, count))))
}

async fn get_object(
    State(app): State<App>,
    UrlPath((collection, name)): UrlPath<(u32, String)>,
) -> Result<Json<i64>, DbError> {
    let etag: Option<i64> =
        sqlx::query_scalar("SELECT etag FROM objects WHERE collection = ? AND name = ?")
            .bind(collection)
            .bind(&name)
            .fetch_optional(app.db.reads())
            .await?;
    etag.map(Json)
        .ok_or_else(|| DbError::internal(std::io::Error::other("no such object")))
}

/// `synchronous = FULL` for the servers, when set (`--synchronous full`).
static FULL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn options(path: &Path) -> SqliteConnectOptions {
    let synchronous = if FULL.load(std::sync::atomic::Ordering::Relaxed) {
        SqliteSynchronous::Full
    } else {
        SqliteSynchronous::Normal
    };
    SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))
        .expect("url")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(synchronous)
        .busy_timeout(Duration::from_secs(5))
        .pragma(
            "wal_autocheckpoint",
            std::env::var("WRITEPATH_AUTOCHECKPOINT").unwrap_or_else(|_| "1000".to_owned()),
        )
}

async fn open_pool(path: &Path, size: u32) -> Result<SqlitePool, sqlx::Error> {
    SqlitePoolOptions::new()
        .max_connections(size)
        .connect_with(options(path))
        .await
}

/// Creates the schema and seeds `seed` objects in each collection.
async fn seed(path: &Path, seed: u32) -> Result<(), BoxError> {
    let pool = open_pool(path, 1).await?;
    sqlx::raw_sql(
        "CREATE TABLE collections (id INTEGER PRIMARY KEY, token INTEGER NOT NULL);
         CREATE TABLE objects (collection INTEGER NOT NULL, name TEXT NOT NULL,
             etag INTEGER NOT NULL, data TEXT NOT NULL, PRIMARY KEY (collection, name));
         CREATE TABLE changes (id INTEGER PRIMARY KEY, collection INTEGER NOT NULL,
             name TEXT NOT NULL, token INTEGER NOT NULL);",
    )
    .execute(&pool)
    .await?;
    let mut tx = pool.begin().await?;
    for c in 0..COLLECTIONS {
        sqlx::query("INSERT INTO collections (id, token) VALUES (?, 0)")
            .bind(c)
            .execute(&mut *tx)
            .await?;
        for i in 0..seed {
            sqlx::query("INSERT INTO objects VALUES (?, ?, 0, 'seed')")
                .bind(c)
                .bind(format!("seed-{i}"))
                .execute(&mut *tx)
                .await?;
        }
    }
    tx.commit().await?;
    pool.close().await;
    Ok(())
}

/// Hash rounds per `us` microseconds of CPU on this machine.
/// Hashing rounds that take `us` µs: the fastest of seven tries (the least disturbed).
fn calibrate(us: u64) -> u64 {
    let body = [7u8; 256];
    let rounds = 20_000;
    let per_round = (0..7)
        .map(|_| {
            let start = Instant::now();
            std::hint::black_box(prepare(&body, rounds));
            start.elapsed().as_secs_f64() / rounds as f64
        })
        .fold(f64::INFINITY, f64::min);
    ((us as f64 / 1e6) / per_round).max(1.0) as u64
}

fn serve(config: Config, path: &Path, args: &Args, prep_rounds: u64) -> ExitCode {
    let pool_size = args.pool_size;
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(interval) = args.global_queue_interval {
        builder.global_queue_interval(interval);
    }
    let rt = builder.enable_all().build().expect("runtime");
    let turn_stats = args.turn_stats.clone();
    // As production runs: an INFO `fmt()` subscriber (to the server's log).
    // `TSR_BENCH_FILTER` (an `EnvFilter`, e.g. `info,tower_sqlite_retry=debug`) instead, to
    // read the write path's DEBUG events (the checkpoints, the shared fsyncs) in a run.
    let filter = std::env::var("TSR_BENCH_FILTER").unwrap_or_else(|_| "info".to_owned());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
    let seed_count = args.seed;
    let served = rt.block_on(async move {
        // A server started on its own (`loadtest/scripts/wrk-group.sh`) seeds its file.
        if !path.exists() {
            seed(path, seed_count).await?;
        }
        let db = match config {
            Config::Deferred | Config::Layer => Db::Plain {
                pool: open_pool(path, pool_size).await?,
                immediate: false,
            },
            Config::Immediate => Db::Plain {
                pool: open_pool(path, pool_size).await?,
                immediate: true,
            },
            Config::TwoPool => Db::TwoPool {
                read: open_pool(path, pool_size).await?,
                write: open_pool(path, 1).await?,
            },
            Config::LayerWrite | Config::LayerWriteReadLimit => {
                Db::Write(WritePool::new(open_pool(path, pool_size).await?).group_commit(false))
            }
            Config::LayerWriteGroup | Config::LayerWriteGroupReadLimit => {
                Db::Write(WritePool::new(open_pool(path, pool_size).await?).group_commit(true))
            }
            Config::LayerThread | Config::LayerThreadReadLimit => {
                let options = WriteThreadOptions::default();
                let options = if FULL.load(std::sync::atomic::Ordering::Relaxed) {
                    options
                } else {
                    options.synchronous_normal()
                };
                let checkpoint =
                    std::env::var("WRITEPATH_AUTOCHECKPOINT").unwrap_or_else(|_| "1000".to_owned());
                Db::Thread {
                    writes: WriteThread::open_with(path, options, |conn| {
                        conn.execute_batch(&format!(
                            "PRAGMA foreign_keys = ON; PRAGMA wal_autocheckpoint = {checkpoint}"
                        ))
                    })?,
                    reads: open_pool(path, pool_size).await?,
                }
            }
            Config::LayerWriteShared => Db::Write(
                WritePool::new(open_pool(path, pool_size).await?)
                    .writer(tower_sqlite_retry::write::WriterConnection::FromPool)
                    .group_commit(false),
            ),
        };
        let writes = match &db {
            Db::Write(writes) => Some(writes.clone()),
            _ => None,
        };
        let app = App { db, prep_rounds };
        // For investigations: `WRITEPATH_WRITE_LIMIT` (writes in flight at once, through
        // tower's `ConcurrencyLimitLayer` on the `PUT`s alone; reads are not limited), for
        // the layered configurations (the baselines run as they are).
        let write_limit = std::env::var("WRITEPATH_WRITE_LIMIT")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .filter(|_| {
                !matches!(
                    config,
                    Config::Deferred | Config::Immediate | Config::TwoPool
                )
            });
        let writes_route = match write_limit {
            Some(limit) => put(put_object).layer(tower::limit::ConcurrencyLimitLayer::new(limit)),
            None => put(put_object),
        };
        let mut router = Router::new()
            .route("/objects/{collection}/{name}", writes_route.get(get_object))
            .with_state(app);
        if matches!(
            config,
            Config::Layer
                | Config::LayerWrite
                | Config::LayerWriteShared
                | Config::LayerWriteGroup
                | Config::LayerWriteReadLimit
                | Config::LayerWriteGroupReadLimit
                | Config::LayerThread
                | Config::LayerThreadReadLimit
        ) {
            // The read limit is the layer's default: the configurations without one turn it
            // off, those with one set the default (a read per core but one).
            let mut layer = SqliteRetryLayer::new(RetryPolicy::default()).no_read_limit();
            if matches!(
                config,
                Config::LayerWriteReadLimit
                    | Config::LayerWriteGroupReadLimit
                    | Config::LayerThreadReadLimit
            ) {
                // For investigations: `WRITEPATH_READ_LIMIT` (reads at once) and
                // `WRITEPATH_READ_WAIT_MS` (a held-back read's longest wait) instead of the
                // layer's defaults.
                let mut limit = match std::env::var("WRITEPATH_READ_LIMIT")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    Some(reads) => tower_sqlite_retry::policy::ReadLimit::new(reads),
                    None => tower_sqlite_retry::policy::ReadLimit::default(),
                };
                if let Some(ms) = std::env::var("WRITEPATH_READ_WAIT_MS")
                    .ok()
                    .and_then(|v| v.parse().ok())
                {
                    limit = limit.max_wait(Duration::from_millis(ms));
                }
                layer = layer.limit_reads_while_writers_wait(limit);
            }
            router = router.layer(layer);
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = tokio::task::spawn_blocking(|| {
                    let _ = std::io::stdin().read_to_end(&mut Vec::new());
                })
                .await;
            })
            .await?;
        if let (Some(file), Some(stats)) = (turn_stats, writes.and_then(|w| w.stats())) {
            use std::io::Write as _;
            let mean = stats.busy.as_secs_f64() / stats.transactions.max(1) as f64;
            let mut out = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(file)?;
            writeln!(
                out,
                "{} transactions {} held {:.3} s mean {:.1} us syncs {} synced {}",
                config.key(),
                stats.transactions,
                stats.busy.as_secs_f64(),
                mean * 1e6,
                stats.syncs,
                stats.synced
            )?;
        }
        Ok::<(), BoxError>(())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writepath --serve {}: {e}", config.key());
            ExitCode::FAILURE
        }
    }
}

struct Server {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Server {
    fn start(args: &Args, config: Config, db: &Path, dir: &Path) -> Result<Self, BoxError> {
        let log = dir.join("server.log");
        let mut command = match &args.server_cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus]).arg(std::env::current_exe()?);
                c
            }
            None => Command::new(std::env::current_exe()?),
        };
        let mut child = command
            .args(["--serve", config.key(), "--db"])
            .arg(db)
            .args(["--pool-size", &args.pool_size.to_string()])
            .args(["--synchronous", &args.synchronous])
            .args(
                args.global_queue_interval
                    .map(|n| vec!["--global-queue-interval".to_owned(), n.to_string()])
                    .unwrap_or_default(),
            )
            .args(
                args.turn_stats
                    .as_ref()
                    .map(|f| vec!["--turn-stats".to_owned(), f.display().to_string()])
                    .unwrap_or_default(),
            )
            .args([
                "--prep-rounds",
                &args.prep_rounds.expect("calibrated").to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the {} server did not start: {}",
                config.key(),
                std::fs::read_to_string(&log).unwrap_or_default()
            )
            .into());
        };
        Ok(Self {
            addr: addr.to_owned(),
            child,
            log,
        })
    }

    fn stop(mut self) -> Result<(), BoxError> {
        drop(self.child.stdin.take());
        let status = self.child.wait()?;
        if !status.success() {
            return Err(format!(
                "server exited with {status}: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            )
            .into());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The client

async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[derive(Default)]
struct ConnReport {
    /// (write, ok, latency µs) of requests answered inside the window.
    samples: Vec<(bool, bool, u32)>,
    /// Names of the writes answered 2xx (any time).
    created: Vec<String>,
    failures: u64,
}

async fn drive(
    conn: usize,
    addr: Arc<str>,
    write_ratio: f64,
    seed: u32,
    start: Instant,
    end: Instant,
) -> ConnReport {
    let mut report = ConnReport::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (conn as u64 + 1).wrapping_mul(0x1000_0000_01B3));
    let mut sender = match connect(&addr).await {
        Ok(s) => s,
        Err(_) => {
            report.failures += 1;
            return report;
        }
    };
    let mut n = 0u64;
    while Instant::now() < end {
        n += 1;
        let collection = rng.next() % u64::from(COLLECTIONS);
        let write = (rng.next() >> 11) as f64 / (1u64 << 53) as f64 <= write_ratio;
        let (name, req) = if write {
            let name = format!("c{conn}-{n}");
            let body = format!(
                "{{\"data\":\"BEGIN:VCALENDAR {name} {}\"}}",
                "x".repeat(400)
            );
            let req = Request::builder()
                .method(Method::PUT)
                .uri(format!("/objects/{collection}/{name}"))
                .header(hyper::header::HOST, &*addr)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)));
            (Some(name), req)
        } else {
            let id = rng.next() % u64::from(seed.max(1));
            let req = Request::builder()
                .uri(format!("/objects/{collection}/seed-{id}"))
                .header(hyper::header::HOST, &*addr)
                .body(Full::new(Bytes::new()));
            (None, req)
        };
        let sent = Instant::now();
        let ok = match sender.ready().await {
            Err(_) => None,
            Ok(()) => match sender.send_request(req.expect("request")).await {
                Err(_) => None,
                Ok(res) => {
                    let status = res.status();
                    res.into_body()
                        .collect()
                        .await
                        .ok()
                        .map(|_| status.is_success())
                }
            },
        };
        let now = Instant::now();
        let ok = match ok {
            Some(ok) => ok,
            None => {
                match connect(&addr).await {
                    Ok(s) => sender = s,
                    Err(_) => return report,
                }
                false
            }
        };
        if ok && let Some(name) = name.clone() {
            report.created.push(format!("{collection}/{name}"));
        }
        if !ok {
            report.failures += 1;
        }
        if now >= start && now < end {
            let us = now
                .duration_since(sent)
                .as_micros()
                .min(u128::from(u32::MAX)) as u32;
            report.samples.push((write, ok, us));
        }
    }
    report
}

// ---------------------------------------------------------------------------------------------
// Cells, rounds, summary

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cell {
    round: usize,
    config: Config,
    load: Load,
    connections: usize,
    writes_per_s: f64,
    reads_per_s: f64,
    p99_ms: f64,
    write_p99_ms: f64,
    read_p99_ms: f64,
    max_ms: f64,
    /// Non-2xx answers and transport errors over the whole cell.
    failures: u64,
    /// Integrity: 2xx writes without exactly one object and one change, and extra rows.
    integrity_errors: u64,
    /// The server process's CPU time (user + system) over the window per answered request.
    #[serde(default)]
    server_cpu_us_per_request: f64,
}

/// User + system CPU seconds of process `pid` so far (`/proc/PID/stat`; NaN where there is
/// none). Clock ticks are 100 per second on Linux.
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
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

fn percentile(us: &mut [u32], p: f64) -> f64 {
    if us.is_empty() {
        return 0.0;
    }
    us.sort_unstable();
    let rank = ((p * us.len() as f64).ceil() as usize).clamp(1, us.len());
    f64::from(us[rank - 1]) / 1000.0
}

async fn integrity(db: &Path, created: &[String], seed: u32) -> Result<u64, BoxError> {
    let pool = open_pool(db, 1).await?;
    let objects: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM objects")
        .fetch_one(&pool)
        .await?;
    let changes: Vec<(i64, String)> = sqlx::query_as("SELECT collection, name FROM changes")
        .fetch_all(&pool)
        .await?;
    pool.close().await;
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    for (c, n) in changes {
        *seen.entry(format!("{c}/{n}")).or_default() += 1;
    }
    let mut errors = 0u64;
    for name in created {
        if seen.remove(name) != Some(1) {
            errors += 1;
        }
    }
    // Changes no 2xx answered for (a request in flight at the end is answered, so none).
    errors += seen.len() as u64;
    let expected = i64::from(seed) * i64::from(COLLECTIONS) + created.len() as i64;
    errors += (objects - expected).unsigned_abs();
    Ok(errors)
}

struct Window {
    warmup: Duration,
    duration: Duration,
}

async fn run_cell(
    args: &Args,
    round: usize,
    config: Config,
    load: Load,
    (connections, writers): (usize, usize),
    window: &Window,
) -> Result<Cell, BoxError> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("bench.db");
    seed(&db, args.seed).await?;
    let server = Server::start(args, config, &db, dir.path())?;
    let addr: Arc<str> = server.addr.clone().into();
    // Each connection's share of writes.
    let ratio = |c: usize| match load {
        Load::Writes => 1.0,
        Load::Mixed => args.write_ratio,
        Load::Split if c < writers => 1.0,
        Load::Split => 0.0,
    };
    let start = Instant::now() + window.warmup;
    let end = start + window.duration;
    let tasks: Vec<_> = (0..connections)
        .map(|c| tokio::spawn(drive(c, addr.clone(), ratio(c), args.seed, start, end)))
        .collect();
    // The server's CPU time over the window (user + system, from /proc; NaN elsewhere).
    let pid = server.child.id();
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        let before = cpu_seconds(pid);
        tokio::time::sleep_until(end.into()).await;
        cpu_seconds(pid) - before
    });
    let mut reports = Vec::new();
    for t in tasks {
        reports.push(t.await?);
    }
    let server_cpu_s = cpu.await?;
    server.stop()?;
    let secs = window.duration.as_secs_f64();
    let mut all = Vec::new();
    let (mut w, mut r) = (Vec::new(), Vec::new());
    let (mut writes_ok, mut reads_ok, mut failures) = (0u64, 0u64, 0u64);
    let mut created = Vec::new();
    for rep in reports {
        failures += rep.failures;
        created.extend(rep.created);
        for (write, ok, us) in rep.samples {
            all.push(us);
            match (write, ok) {
                (true, true) => writes_ok += 1,
                (false, true) => reads_ok += 1,
                _ => {}
            }
            if write { w.push(us) } else { r.push(us) }
        }
    }
    let max_ms = all
        .iter()
        .copied()
        .max()
        .map_or(0.0, |m| f64::from(m) / 1000.0);
    let answered = (writes_ok + reads_ok).max(1) as f64;
    Ok(Cell {
        server_cpu_us_per_request: server_cpu_s * 1e6 / answered,
        round,
        config,
        load,
        connections,
        writes_per_s: writes_ok as f64 / secs,
        reads_per_s: reads_ok as f64 / secs,
        p99_ms: percentile(&mut all, 0.99),
        write_p99_ms: percentile(&mut w, 0.99),
        read_p99_ms: percentile(&mut r, 0.99),
        max_ms,
        failures,
        integrity_errors: integrity(&db, &created, args.seed).await?,
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

fn markdown(cells: &[Cell], configs: &[Config], meta: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# writepath\n\n{meta}\n");
    let _ = writeln!(
        out,
        "Medians over rounds; ratios are medians of per-round ratios to `immediate` \
         (writes/s, reads/s, p99, max).\n"
    );
    let _ = writeln!(
        out,
        "| load | conns | config | writes/s | reads/s | p99 ms | write p99 | read p99 | max ms | failures | integrity | server CPU µs/req | × writes | × reads | × p99 | × max |"
    );
    let _ = writeln!(
        out,
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut groups: Vec<(Load, usize)> = cells.iter().map(|c| (c.load, c.connections)).collect();
    groups.sort();
    groups.dedup();
    for (load, conns) in groups {
        for &config in configs {
            let mine: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.load == load && c.connections == conns && c.config == config)
                .collect();
            if mine.is_empty() {
                continue;
            }
            let m = |f: fn(&Cell) -> f64| median(mine.iter().map(|c| f(c)).collect());
            let ratio = |f: fn(&Cell) -> f64| {
                median(
                    mine.iter()
                        .filter_map(|c| {
                            let reference = cells.iter().find(|r| {
                                r.round == c.round
                                    && r.load == load
                                    && r.connections == conns
                                    && r.config == Config::Immediate
                            })?;
                            let d = f(reference);
                            (d > 0.0).then(|| f(c) / d)
                        })
                        .collect(),
                )
            };
            let failures: u64 = mine.iter().map(|c| c.failures).sum();
            let integrity: u64 = mine.iter().map(|c| c.integrity_errors).sum();
            let _ = writeln!(
                out,
                "| {load:?} | {conns} | `{}` | {:.0} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {failures} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.2} |",
                config.key(),
                m(|c| c.writes_per_s),
                m(|c| c.reads_per_s),
                m(|c| c.p99_ms),
                m(|c| c.write_p99_ms),
                m(|c| c.read_p99_ms),
                m(|c| c.max_ms),
                if integrity == 0 {
                    "ok".to_owned()
                } else {
                    format!("{integrity} errors")
                },
                m(|c| c.server_cpu_us_per_request),
                ratio(|c| c.writes_per_s),
                ratio(|c| c.reads_per_s),
                ratio(|c| c.p99_ms),
                ratio(|c| c.max_ms),
            );
        }
    }
    out
}

/// Draws writes/s and p99 of the `writes` load against the connection count, one line per
/// configuration (medians over rounds).
fn draw(cells: &[Cell], configs: &[Config], path: &Path, meta: &str) -> Result<(), BoxError> {
    use plotters::style::{BLACK, Color, Palette, Palette99, RGBColor};

    let lines: Vec<chart::Line> = configs
        .iter()
        .enumerate()
        .filter_map(|(i, &config)| {
            let mine: Vec<&Cell> = cells
                .iter()
                .filter(|c| c.load == Load::Writes && c.config == config)
                .collect();
            let mut conns: Vec<usize> = mine.iter().map(|c| c.connections).collect();
            conns.sort_unstable();
            conns.dedup();
            if conns.is_empty() {
                return None;
            }
            let medians = |f: fn(&Cell) -> f64| -> Vec<(f64, f64)> {
                conns
                    .iter()
                    .map(|&n| {
                        let at_n = mine.iter().filter(|c| c.connections == n).map(|c| f(c));
                        (n as f64, median(at_n.collect()))
                    })
                    .collect()
            };
            let style = match config {
                Config::Immediate => BLACK.stroke_width(3),
                Config::LayerWrite => RGBColor(220, 80, 0).stroke_width(3),
                Config::LayerWriteShared => RGBColor(150, 150, 150).stroke_width(2),
                Config::LayerWriteGroup => RGBColor(0, 120, 200).stroke_width(3),
                _ => Palette99::pick(i).stroke_width(2),
            };
            Some(chart::Line::new(
                config.key().to_owned(),
                style,
                medians(|c| c.writes_per_s),
                medians(|c| c.p99_ms),
            ))
        })
        .collect();
    let title = format!("writepath, writes only: {meta}");
    let labels = chart::Labels {
        title: &title,
        clients: "client connections (keep-alive, closed loop)",
        goodput_caption: "writes/s (median over rounds)",
    };
    chart::goodput_and_p99(path, &labels, &lines)
}

/// `--replot DIR`.
fn replot(dir: &Path) -> Result<(), BoxError> {
    let cells: Vec<Cell> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("writepath.json"))?)?;
    let mut configs: Vec<Config> = cells.iter().map(|c| c.config).collect();
    configs.sort_unstable();
    configs.dedup();
    let rounds = cells.iter().map(|c| c.round + 1).max().unwrap_or(0);
    let meta = format!("{rounds} rounds, pool 8, prep 300 µs");
    draw(&cells, &configs, &dir.join("writepath.svg"), &meta)
}

fn raise_open_files(need: u64) {
    if let Ok((soft, hard)) = rlimit::Resource::NOFILE.get()
        && soft < need
    {
        let _ = rlimit::Resource::NOFILE.set(need.min(hard), hard);
    }
}

fn main() -> ExitCode {
    let mut args = Args::parse();
    if let Some(dir) = &args.replot {
        return match replot(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("--replot {}: {e}", dir.display());
                ExitCode::FAILURE
            }
        };
    }
    FULL.store(
        args.synchronous == "full",
        std::sync::atomic::Ordering::Relaxed,
    );
    if args.calibrate {
        println!("{}", calibrate(args.prep_us));
        return ExitCode::SUCCESS;
    }
    if let Some(config) = args.serve {
        let db = args.db.clone().expect("--db with --serve");
        let rounds = args.prep_rounds.unwrap_or_else(|| calibrate(args.prep_us));
        return serve(config, &db, &args, rounds);
    }
    if args.prep_rounds.is_none() {
        args.prep_rounds = Some(calibrate(args.prep_us));
    }
    if args.configs.is_empty() {
        args.configs = vec![
            Config::Immediate,
            Config::Deferred,
            Config::TwoPool,
            Config::Layer,
            Config::LayerWrite,
            Config::LayerWriteShared,
        ];
    }
    let window = if args.smoke {
        // `--smoke`: check the harness only.
        args.connections = vec![4];
        args.mixed_connections = vec![4];
        args.split = vec!["2+2".to_owned()];
        args.rounds = 1;
        args.seed = 10;
        Window {
            warmup: Duration::from_millis(100),
            duration: Duration::from_millis(300),
        }
    } else if args.quick {
        args.connections = vec![64];
        args.mixed_connections = vec![64];
        args.rounds = 1;
        Window {
            warmup: Duration::from_millis(500),
            duration: Duration::from_secs(1),
        }
    } else {
        Window {
            warmup: Duration::from_secs_f64(args.warmup),
            duration: Duration::from_secs_f64(args.duration),
        }
    };
    let most = args
        .connections
        .iter()
        .chain(&args.mixed_connections)
        .copied()
        .max()
        .unwrap_or(1)
        .max(1024);
    raise_open_files(most as u64 * 2 + 256);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()
        .expect("runtime");
    let mut plan: Vec<(Load, usize, usize)> = args
        .connections
        .iter()
        .map(|&c| (Load::Writes, c, c))
        .collect();
    plan.extend(args.mixed_connections.iter().map(|&c| (Load::Mixed, c, 0)));
    for split in &args.split {
        let parsed = split.split_once('+').and_then(|(w, r)| {
            Some((
                w.trim().parse::<usize>().ok()?,
                r.trim().parse::<usize>().ok()?,
            ))
        });
        match parsed {
            Some((w, r)) => plan.push((Load::Split, w + r, w)),
            None => {
                eprintln!("--split {split}: expected WRITERS+READERS, e.g. 64+16");
                return ExitCode::FAILURE;
            }
        }
    }
    if !args.loads.is_empty() {
        plan.retain(|(load, _, _)| args.loads.contains(load));
    }
    let mut cells = Vec::new();
    let mut integrity_ok = true;
    for round in 0..args.rounds {
        for &(load, conns, writers) in &plan {
            let n = args.configs.len();
            for i in 0..n {
                let config = args.configs[(i + round) % n];
                let cell = match rt.block_on(run_cell(
                    &args,
                    round,
                    config,
                    load,
                    (conns, writers),
                    &window,
                )) {
                    Ok(cell) => cell,
                    Err(e) => {
                        eprintln!("{} {load:?} {conns}: {e}", config.key());
                        return ExitCode::FAILURE;
                    }
                };
                eprintln!(
                    "round {round} {load:?} {conns} {}: {:.0} writes/s, {:.0} reads/s, p99 {:.1} ms, max {:.1} ms, {} failures, {} integrity errors",
                    config.key(),
                    cell.writes_per_s,
                    cell.reads_per_s,
                    cell.p99_ms,
                    cell.max_ms,
                    cell.failures,
                    cell.integrity_errors
                );
                integrity_ok &= cell.integrity_errors == 0;
                cells.push(cell);
            }
        }
    }
    let meta = format!(
        "{} rounds, {:.1} s windows after {:.1} s warm-up, pool {}, prep {} µs ({} hashing rounds, the same in every server), {} client thread(s), write ratio of mixed {:.2}; {} cores",
        args.rounds,
        window.duration.as_secs_f64(),
        window.warmup.as_secs_f64(),
        args.pool_size,
        args.prep_us,
        args.prep_rounds.unwrap_or(0),
        args.client_threads,
        args.write_ratio,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let md = markdown(&cells, &args.configs, &meta);
    println!("{md}");
    if !args.smoke
        && let Some(out) = &args.out
    {
        let written = std::fs::create_dir_all(out)
            .and_then(|()| std::fs::write(out.join("writepath.md"), &md))
            .and_then(|()| {
                std::fs::write(
                    out.join("writepath.json"),
                    serde_json::to_string_pretty(&cells).expect("json"),
                )
            });
        if let Err(e) = written {
            eprintln!("writing {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
        let short = format!(
            "{} rounds, pool {}, prep {} µs",
            args.rounds, args.pool_size, args.prep_us
        );
        if let Err(e) = draw(&cells, &args.configs, &out.join("writepath.svg"), &short) {
            eprintln!("drawing {}: {e}", out.join("writepath.svg").display());
            return ExitCode::FAILURE;
        }
    }
    if integrity_ok {
        ExitCode::SUCCESS
    } else {
        eprintln!("integrity errors: see the table");
        ExitCode::FAILURE
    }
}
