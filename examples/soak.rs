//! The soak: the example app, with its retry layers, under the contention demonstration's load
//! for a long time, sampling the process's resident memory and the layers' counters every few
//! seconds. A leak (buffers, permits, spans, tasks) shows as RSS that keeps climbing.
//!
//! ```text
//! cargo run --release --example soak                        # 10 minutes, a sample every 10 s
//! cargo run --release --example soak -- --minutes 1 --every 5 --clients 64
//! ```
//!
//! It serves the app on `127.0.0.1:0` over a fresh SQLite file in a temporary directory and
//! drives `--clients` concurrent HTTP clients (70 % `POST /items`, 30 % `GET /items`) until the
//! time is up. At the end it checks integrity (committed rows == `201` answers, no duplicate
//! sequence numbers) and prints the RSS samples, their first and last values and the growth
//! over the second half of the run. Exits non-zero if a request failed or integrity broke.
//! Linux only for RSS (it reads `/proc/self/status`).

#[allow(dead_code)]
#[path = "common/app_lib.rs"]
mod app_lib;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tower_sqlite_retry::RetryPolicy;

use app_lib::{Db, RetryPolicies, open_pool, router};

/// The soak: the example app with its retry layers under the contention demonstration's load
/// for a long time, sampling resident memory and the layers' counters; a leak shows as RSS
/// that keeps climbing.
#[derive(Debug, Parser)]
#[command(
    name = "soak",
    after_help = "Exits 1 if a request failed or integrity broke. Linux only (RSS from \
    /proc/self/status)."
)]
struct Args {
    /// How long to run, in minutes (fractions allowed).
    #[arg(long, value_name = "M", default_value_t = 10.0, value_parser = positive_f64)]
    minutes: f64,
    /// Seconds between two samples.
    #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    every: u64,
    /// Concurrent HTTP clients (70 % POST /items, 30 % GET /items).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    clients: u64,
}

fn positive_f64(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(m) if m > 0.0 && m.is_finite() => Ok(m),
        Ok(_) => Err("must be positive".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

#[derive(Default)]
struct Counts {
    created: AtomicU64,
    reads_ok: AtomicU64,
    failed: AtomicU64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = open_pool(&dir.path().join("soak.db"), 8, Duration::from_secs(5))
        .await
        .expect("open the database");
    let db = Db::from(&pool);
    let policies = RetryPolicies {
        write: RetryPolicy::default().max_attempts(32),
        read: RetryPolicy::default().max_attempts(4),
    };
    let (app, metrics) = router(db.clone(), Some(policies));
    let metrics = metrics.expect("layers");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Counts::default());
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut tasks = Vec::new();
    for c in 0..args.clients {
        let (stop, counts, client, base) =
            (stop.clone(), counts.clone(), client.clone(), base.clone());
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let write = (i * 7 + c) % 10 < 7;
                let req = if write {
                    Request::builder()
                        .method(Method::POST)
                        .uri(format!("{base}/items"))
                        .header("content-type", "application/json")
                        .body(Full::new(Bytes::from(format!("{{\"name\":\"c{c}-{i}\"}}"))))
                } else {
                    Request::builder()
                        .uri(format!("{base}/items?limit=20"))
                        .body(Full::new(Bytes::new()))
                }
                .expect("request");
                let status = match client.request(req).await {
                    Ok(res) => {
                        let status = res.status();
                        let _ = res.into_body().collect().await;
                        Some(status)
                    }
                    Err(_) => None,
                };
                match status {
                    Some(StatusCode::CREATED) => counts.created.fetch_add(1, Ordering::Relaxed),
                    Some(StatusCode::OK) => counts.reads_ok.fetch_add(1, Ordering::Relaxed),
                    _ => counts.failed.fetch_add(1, Ordering::Relaxed),
                };
            }
        }));
    }

    let total = Duration::from_secs_f64(args.minutes * 60.0);
    let start = Instant::now();
    println!(
        "soak: {} clients for {:.1} min, a sample every {} s (RSS of the whole process: app + clients)",
        args.clients, args.minutes, args.every
    );
    println!(
        "{:>7} {:>10} {:>10} {:>8} {:>9} {:>8} {:>9}",
        "t (s)", "RSS (KiB)", "requests", "failed", "retries", "buffered", "req/s"
    );
    let mut samples = Vec::new();
    let mut last = (Instant::now(), 0u64);
    loop {
        let now = start.elapsed();
        let done = counts.created.load(Ordering::Relaxed)
            + counts.reads_ok.load(Ordering::Relaxed)
            + counts.failed.load(Ordering::Relaxed);
        let snap = metrics.snapshot();
        let rate = (done - last.1) as f64 / last.0.elapsed().as_secs_f64().max(1e-9);
        last = (Instant::now(), done);
        let rss = rss_kib();
        samples.push((now.as_secs(), rss));
        println!(
            "{:>7} {:>10} {:>10} {:>8} {:>9} {:>8} {:>9.0}",
            now.as_secs(),
            rss,
            done,
            counts.failed.load(Ordering::Relaxed),
            snap.retries(),
            snap.read.buffered_bytes + snap.write.buffered_bytes,
            rate
        );
        if now >= total {
            break;
        }
        tokio::time::sleep(Duration::from_secs(args.every).min(total - now)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = t.await;
    }

    let rows = db.all_items().await.expect("read back");
    let created = counts.created.load(Ordering::Relaxed);
    let mut seqs: Vec<i64> = rows.iter().map(|r| r.seq).collect();
    seqs.sort_unstable();
    seqs.dedup();
    let failed = counts.failed.load(Ordering::Relaxed);
    let first = samples.first().map_or(0, |s| s.1);
    let last_rss = samples.last().map_or(0, |s| s.1);
    let half = samples.len() / 2;
    let mid = samples.get(half).map_or(0, |s| s.1);
    let max = samples.iter().map(|s| s.1).max().unwrap_or(0);
    println!(
        "RSS: first {first} KiB, max {max} KiB, last {last_rss} KiB; second half: {mid} -> {last_rss} KiB ({:+.1} %)",
        (last_rss as f64 - mid as f64) / mid.max(1) as f64 * 100.0
    );
    let intact = rows.len() as u64 == created && seqs.len() == rows.len();
    println!(
        "requests: {} created, {} reads, {failed} failed; integrity: {} ({} rows, {} answered 201, {} distinct seq)",
        created,
        counts.reads_ok.load(Ordering::Relaxed),
        if intact { "OK" } else { "BROKEN" },
        rows.len(),
        created,
        seqs.len()
    );
    if failed == 0 && intact {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
