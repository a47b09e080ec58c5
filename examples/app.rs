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
//!   Up to 32 attempts.
//! - `GET /items?limit=&after=`: a page of items with `id > after` (default limit 50, at most
//!   500) and `next`, the `after` of the next page. Up to 4 attempts, like every other route.
//! - `GET /items/{id}`: the item, or `404`.
//! - `GET /stats`: the retry layers' counters.
//! - `GET /metrics`: the layers' metrics in Prometheus' text format (run with
//!   `--features metrics`; see the crate's `recorder` module).
//!
//! Flags: `--db PATH` (env `ITEMS_DB`, default `./items.db`; created if missing),
//! `--database-url URL` (env `DATABASE_URL`; `sqlite:PATH`, `postgres://...` with the crate's
//! `postgres` feature, `mysql://...` with `mysql`; used instead of `--db`, table `items`,
//! created if missing), `--addr HOST:PORT` (default `127.0.0.1:3000`). `RUST_LOG` sets the log filter (default
//! `info,tower_sqlite_retry=warn`: one WARN line per replay). Ctrl-C stops it gracefully.
//!
//! To see replays, put it under load: `cargo run --release --example contention` runs this
//! same app against 64 concurrent clients, with and without the layer.

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

use tower_sqlite_retry::RetryPolicy;

use app_lib::{DEFAULT_TABLE, Db, RetryPolicies, open_pool, redact, router};

const USAGE: &str = "usage: app [--db PATH | --database-url URL] [--addr HOST:PORT]  \
(env ITEMS_DB sets the default --db, DATABASE_URL the default --database-url)";

#[derive(Debug)]
struct Args {
    db: PathBuf,
    database_url: Option<String>,
    addr: SocketAddr,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut args = Args {
        db: std::env::var_os("ITEMS_DB").map_or_else(|| "./items.db".into(), PathBuf::from),
        database_url: std::env::var("DATABASE_URL").ok().filter(|u| !u.is_empty()),
        addr: SocketAddr::from(([127, 0, 0, 1], 3000)),
    };
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--db" => {
                args.db = value()?.into();
                args.database_url = None;
            }
            "--database-url" => args.database_url = Some(value()?),
            "--addr" => {
                let v = value()?;
                args.addr = v
                    .parse()
                    .map_err(|_| format!("--addr: not a HOST:PORT address: {v:?}"))?;
            }
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(args))
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = match cli::args_or_exit("app", USAGE, parse_args(std::env::args().skip(1))) {
        Ok(args) => args,
        Err(code) => return code,
    };
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
    // 8 connections; sqlx's default busy_timeout (5 s). Neither saves a deferred
    // read-then-write transaction from SQLITE_BUSY_SNAPSHOT: the layer does.
    let (db, shown) = match &args.database_url {
        None => {
            let pool = open_pool(&args.db, 8, Duration::from_secs(5))
                .await
                .map_err(|e| format!("opening {}: {e}", args.db.display()))?;
            (Db::from(pool), args.db.display().to_string())
        }
        Some(url) => {
            let shown = redact(url);
            let db = Db::connect(url, DEFAULT_TABLE, 8, Duration::from_secs(5))
                .await
                .map_err(|e| format!("opening {shown}: {e}"))?;
            db.create_schema()
                .await
                .map_err(|e| format!("creating table {DEFAULT_TABLE} in {shown}: {e}"))?;
            (db, shown)
        }
    };
    let policies = RetryPolicies {
        // The write route: read-then-write transactions, contended; a larger cap.
        write: RetryPolicy::default().max_attempts(32),
        // Reads (router-wide): in WAL mode they rarely meet a busy database.
        read: RetryPolicy::default().max_attempts(4),
    };
    // Installed before the layers are built: they describe their metrics to it.
    let prometheus = prometheus::install()?;
    let (app, _metrics) = router(db.clone(), Some(policies));
    let app = prometheus::route(app, prometheus);

    let listener = tokio::net::TcpListener::bind(args.addr)
        .await
        .map_err(|e| format!("binding {}: {e}", args.addr))?;
    tracing::info!(
        addr = %listener.local_addr()?,
        db = %shown,
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
