//! The example app's routes with nothing around them, with `SqliteRetryLayer`, or with
//! `tower::retry` made to replay axum requests (the benches' competitor), each put on the
//! router the same way (`Router::layer`), for `loadtest/scripts/wrk-overhead.sh`: what a
//! request that needs no retry costs under each, measured from an outside client.
//!
//! ```text
//! cargo build --release -p tower-sqlite-retry-loadtest --bin overhead
//! B=target/release/overhead
//! PIN=1 CONTENDERS="bare=$B:bare layer=$B:layer tower-retry=$B:tower-retry" \
//!   bash loadtest/scripts/wrk-overhead.sh OUT
//! ```
//!
//! The flags are the example app's where they overlap (`--config`, `--db`, `--addr`), and so is
//! the log: an INFO `fmt()` subscriber (`RUST_LOG` sets the filter). The pool is the app's
//! (8 connections, sqlx's default busy timeout); `POST /items` begins a deferred transaction.
#[path = "../../../examples/common/app_lib.rs"]
#[allow(dead_code)]
mod app_lib;
#[path = "../../../benches/common/mod.rs"]
mod competitor;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tower_sqlite_retry::SqliteRetryLayer;

use app_lib::{Db, open_pool, router};
use competitor::{BufferedRetryLayer, ReplayPolicy};

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Wrap {
    /// The routes alone.
    Bare,
    /// `Router::layer(SqliteRetryLayer::default())`.
    Layer,
    /// `Router::layer` of `tower::retry::Retry`, the head copied and the body buffered as a
    /// careful user would (`benches/common/mod.rs`).
    TowerRetry,
}

#[derive(Debug, Parser)]
struct Args {
    /// What is around the routes.
    #[arg(long, value_enum, default_value = "layer")]
    config: Wrap,
    /// The SQLite file (created if missing, table `items`).
    #[arg(long)]
    db: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_sqlite_retry=warn".into()),
        )
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
    let pool = open_pool(&args.db, 8, Duration::from_secs(5)).await?;
    let (app, _) = router(Db::from(&pool), None);
    let app = match args.config {
        Wrap::Bare => app,
        Wrap::Layer => app.layer(SqliteRetryLayer::default()),
        Wrap::TowerRetry => app.layer(BufferedRetryLayer::new(ReplayPolicy::new(
            Duration::from_millis(10),
            Duration::from_secs(1),
            0.5,
            10,
        ))),
    };
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    tracing::info!(addr = %listener.local_addr()?, config = ?args.config, "listening");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    pool.close().await;
    Ok(())
}
