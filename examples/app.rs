//! The example service: an item list in a SQLite file (or a PostgreSQL or MySQL/MariaDB
//! database), with `SqliteRetryLayer` replaying the requests that meet `SQLITE_BUSY` /
//! `SQLITE_BUSY_SNAPSHOT` (PostgreSQL `40001` / `40P01`, MySQL `1213` / `1205`).
//!
//! ```text
//! cargo run --example app
//! cargo run --example app -- --db ./items.db --addr 127.0.0.1:3000
//! ITEMS_DB=/tmp/items.db cargo run --example app
//! cargo run --features postgres --example app -- --database-url postgres://postgres@127.0.0.1:5432/test
//! cargo run --features mysql --example app -- --database-url mysql://root@127.0.0.1:3306/test
//!
//! curl -i -X POST http://127.0.0.1:3000/items -H 'content-type: application/json' -d '{"name": "apple"}'
//! curl -s 'http://127.0.0.1:3000/items?limit=10&after=0'
//! curl -i http://127.0.0.1:3000/items/1
//! curl -s http://127.0.0.1:3000/stats
//! curl -s http://127.0.0.1:3000/metrics    # with --features metrics
//! ```
//!
//! Routes:
//!
//! - `POST /items` `{"name": "..."}`: `201 Created` with `{"id", "seq", "name"}`. A
//!   transaction reads `MAX(seq) + 1`, then inserts: the read-then-write shape that SQLite
//!   refuses with `SQLITE_BUSY_SNAPSHOT` under concurrent writers (deferred transaction),
//!   PostgreSQL with `40001` (`SERIALIZABLE`) and MySQL/MariaDB with `1213` (`SERIALIZABLE`).
//!   With the layer (`--config layer`, the default): up to `RetryPolicy::default()`'s attempts.
//!   With `--prep-us N` the handler has work before and after its transaction: about N µs of
//!   CPU first (hashing the name, standing for parsing and authentication; a replay does it
//!   again), and a `SELECT COUNT(*)` on the pool after the commit (answered in the
//!   `x-item-count` header).
//! - `GET /items?limit=&after=`: a page of items with `id > after` (default limit 50, at most
//!   500) and `next`, the `after` of the next page.
//! - `GET /items/{id}`: the item, or `404`.
//! - `GET /stats`: the retry layers' counters; with `--config layer-write` or `layer-thread`,
//!   `write_turn` too: the database's write turn now (`waiting`, `held`) and since start
//!   (`transactions`, `busy_seconds`), from `WritePool::stats()` (`WriteThread::stats()`).
//! - `GET /metrics`: the layers' metrics in Prometheus' text format (run with
//!   `--features metrics`; see the crate's `metrics::recorder` module: the write path's
//!   `tower_sqlite_retry_write_wait_seconds`, `_write_held_seconds` and `_write_waiting`
//!   among them). With `--config layer-write` or `layer-thread` the app adds, with or without the feature, the
//!   gauge `tower_sqlite_retry_write_utilization{database="<file name>"}`: the share of the
//!   time since the previous scrape during which a write transaction held the database's
//!   turn (1: the database at its write limit), computed at each scrape from two
//!   `WritePool::stats()` readings (`utilization_since`); the first scrape gives the share
//!   since the app started, and 0 before the first write transaction. (Meant for one
//!   scraper: two would each see the time since the other's last scrape.)
//!
//! Flags (`--help` explains each):
//!
//! - `--db PATH` (env `ITEMS_DB`, default `./items.db`; created if missing);
//! - `--database-url URL` (env `DATABASE_URL`; `sqlite:PATH`, `postgres://...` with the crate's
//!   `postgres` feature, `mysql://...` with `mysql`; used instead of `--db`, table `items`,
//!   created if missing; `--db` after it wins);
//! - `--addr HOST:PORT` (default `127.0.0.1:3000`; port 0 picks a free one, and the log says
//!   which);
//! - `--config NAME` (default `layer`): the retry layer, or what an expert would configure
//!   instead of it, the handler unchanged:
//!
//!   | `--config` | layer | pools | `POST /items` begins with |
//!   |---|---|---|---|
//!   | `bare` | none | `--pool-size` | `BEGIN` (deferred): concurrent writers get 503 |
//!   | `one-writer` | none | 1 connection for everything | `BEGIN IMMEDIATE` |
//!   | `two-pool` | none | `--pool-size` readers + 1 writer | `BEGIN IMMEDIATE` |
//!   | `layer` | `RetryPolicy::default()` (writer admission included) on the write route and router-wide | `--pool-size` | `BEGIN` |
//!   | `layer-no-admission` | `layer` with `Admission::Off` (the first release's default) | `--pool-size` | `BEGIN` |
//!   | `layer-queue` | `layer-no-admission`, plus `ConcurrencyLimitLayer::new(1)` inside it on the write route | `--pool-size` | `BEGIN` |
//!   | `layer-two-pool` | `layer` | `--pool-size` readers + 1 writer | `BEGIN` |
//!   | `immediate` | none | `--pool-size` | `BEGIN IMMEDIATE` (the one-word fix: writers wait in SQLite's busy handler, each holding a pool connection) |
//!   | `layer-write` | `layer`'s | `--pool-size` for reads, the write path's writer connection for writes | `WritePool::begin()`: its turn in the process, then `BEGIN IMMEDIATE` |
//!   | `layer-thread` | `layer`'s | `--pool-size` for reads, a rusqlite `WriteThread`'s connection for writes | the transaction a closure on the writer thread: its turn, then `BEGIN IMMEDIATE` … `COMMIT` around it there |
//!
//!   `one-writer`, `two-pool`, `immediate`, `layer-two-pool`, `layer-write` and `layer-thread`
//!   need a SQLite file (`--db`);
//! - `--pool-size N` (default 8);
//! - `--prep-us N` (default 0): about N µs of CPU before `POST /items`' transaction and a
//!   read after its commit (0: neither), calibrated at start-up;
//! - `--busy-timeout-ms N` (default 5000, sqlx's default; SQLite only).
//!
//! `RUST_LOG` sets the log filter (default `info,tower_sqlite_retry=warn`: a line when the
//! layer gives up on a request; replays are logged at DEBUG, so
//! `RUST_LOG=info,tower_sqlite_retry=debug` shows one line per replay). Any other path answers
//! `404` with a short text body. Ctrl-C stops it gracefully.
//!
//! To see replays, put it under load: `cargo run --release --example contention` runs this
//! same app against 64 concurrent clients as `bare`, `layer`, `immediate` and `layer-write`;
//! `cargo bench --bench realclient` measures every `--config` side by side from an outside
//! client (see BENCHMARKS.md).

// Shared with `examples/contention.rs` and `tests/app.rs`, which use the metrics helpers this
// binary does not.
#[allow(dead_code)]
#[path = "common/app_lib.rs"]
mod app_lib;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/prometheus.rs"]
mod prometheus;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};

use app_lib::{Config, DEFAULT_TABLE, Db, Work, redact};

/// The example service: an item list in SQLite (or PostgreSQL, MySQL/MariaDB), with the
/// retry layer or an expert's configuration instead. See the routes at the top of
/// examples/app.rs.
#[derive(Debug, Parser)]
#[command(
    name = "app",
    after_help = "RUST_LOG sets the log filter \
    (default: info,tower_sqlite_retry=warn). Ctrl-C stops the server gracefully."
)]
struct Args {
    /// The SQLite file (created if missing, table `items`).
    #[arg(
        long,
        value_name = "PATH",
        env = "ITEMS_DB",
        default_value = "./items.db"
    )]
    db: PathBuf,
    /// A database URL instead of --db: sqlite:PATH, postgres://... (build with
    /// --features postgres) or mysql://... (--features mysql); table `items`, created if
    /// missing. A --db given after it wins.
    #[arg(long, value_name = "URL", env = "DATABASE_URL")]
    database_url: Option<String>,
    /// The address to listen on (port 0: a free one, logged at start).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// The retry layer, or the configuration an expert would use instead of it.
    #[arg(long, value_enum, default_value = "layer")]
    config: Config,
    /// Connections in the pool (the readers' pool with two-pool, layer-write and
    /// layer-thread; one-writer has 1).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: u32,
    /// CPU work before POST /items' transaction, in µs (hashing, calibrated at start-up), and
    /// a read (SELECT COUNT(*)) after its commit: a handler with work before and after its
    /// transaction. 0: neither.
    #[arg(long, value_name = "N", default_value_t = 0)]
    prep_us: u64,
    /// SQLite's busy_timeout, in milliseconds (SQLite only).
    #[arg(long, value_name = "N", default_value_t = 5000)]
    busy_timeout_ms: u64,
}

impl Args {
    /// The arguments; `--database-url` (or `DATABASE_URL`) is dropped when a `--db` on the
    /// command line comes after it (the last of the two wins; `--db` beats the environment).
    fn parse_last_db_wins() -> Self {
        let matches = Self::command().get_matches();
        let mut args = Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let on_command_line =
            |id| matches.value_source(id) == Some(clap::parser::ValueSource::CommandLine);
        if on_command_line("db")
            && (!on_command_line("database_url")
                || matches.index_of("db") > matches.index_of("database_url"))
        {
            args.database_url = None;
        }
        args.database_url = args.database_url.filter(|u| !u.is_empty());
        args
    }

    fn url(&self) -> Option<&str> {
        self.database_url.as_deref()
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse_last_db_wins();
    tracing_subscriber::fmt()
        .with_env_filter(cli::env_filter("info,tower_sqlite_retry=warn"))
        .init();

    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let busy_timeout = Duration::from_millis(args.busy_timeout_ms);
    // `bare` and the layers: 8 connections, sqlx's default busy_timeout (5 s). Neither saves
    // a deferred read-then-write transaction from SQLITE_BUSY_SNAPSHOT: the layer does.
    let (db, shown) = match args.url() {
        None => {
            let db = args
                .config
                .open(&args.db, args.pool_size, busy_timeout)
                .await
                .map_err(|e| format!("opening {}: {e}", args.db.display()))?;
            (db, args.db.display().to_string())
        }
        Some(url) => {
            let shown = redact(url);
            if args.config.needs_sqlite_file() {
                return Err(format!(
                    "--config {} needs a SQLite file: use --db PATH instead of --database-url",
                    args.config.key()
                )
                .into());
            }
            let db = Db::connect(url, DEFAULT_TABLE, args.pool_size, busy_timeout)
                .await
                .map_err(|e| format!("opening {shown}: {e}"))?;
            db.create_schema()
                .await
                .map_err(|e| format!("creating table {DEFAULT_TABLE} in {shown}: {e}"))?;
            (db, shown)
        }
    };
    let db = db.with_work(Work::new(args.prep_us));
    // Installed before the layers are built: they describe their metrics to it.
    let prometheus = prometheus::install()?;
    let (app, _metrics) = args.config.router(db.clone());
    // With the write path: its utilization, computed at each scrape.
    let scraped = db.clone();
    let app = prometheus::route(app, prometheus, move || scraped.write_utilization_metrics());

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| format!("binding {}: {e}", args.addr))?;
    tracing::info!(
        addr = %listener.local_addr()?,
        db = %shown,
        config = args.config.key(),
        setup = %args.config.describe(args.pool_size),
        prep_us = args.prep_us,
        "listening; Ctrl-C to stop"
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
            tracing::info!("shutting down");
        })
        .await?;
    tracing::info!("server stopped; closing the database");
    db.close().await;
    Ok(())
}
