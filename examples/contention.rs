//! The demonstration: the example app (`examples/app.rs`) under write contention, once without
//! `SqliteRetryLayer` and once with `RetryPolicy::default()` (see `--instances` for the write
//! route's attempts when there are several instances), each on a fresh database.
//!
//! ```text
//! cargo run --release --example contention
//! cargo run --release --example contention -- --clients 128 --requests 8000 --write-ratio 0.9
//! cargo run --release --example contention -- --json > contention.json
//! cargo run --release --features postgres --example contention -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --instances 3
//! cargo run --release --features mysql --example contention -- \
//!     --database-url mysql://root@127.0.0.1:3306/test --instances 3
//! ```
//!
//! The app serves on real loopback sockets (`127.0.0.1:0`); `--clients` HTTP/1.1 clients with
//! keep-alive send `--requests` requests in all, `--write-ratio` of them `POST /items` (a
//! read-then-write transaction) and the rest `GET /items`. Then the table compares the two
//! runs, and each run's database is checked against the answers: every `201 Created` has its
//! row, no row lacks one, nothing was inserted twice, no `seq` repeats.
//!
//! With `--instances N` each run starts N copies of the app, as a scaled-out deployment would:
//! N servers, each with its own pool of `--pool-size` connections and its own retry layers,
//! all on the same database; client `c` talks to instance `c mod N`. The report adds a table
//! per instance. Everything a layer keeps is **per instance**: its counters, its replay gate
//! (one replay at a time per instance, so N at a time in all) and any retry budget (each
//! instance's budget only sees its own traffic). `max_attempts` and the deadline are per
//! request, wherever it lands. So N instances mean N times the writers and N replays at once
//! on the same rows, and a request needs more attempts to win: with several instances the
//! write route (`POST /items`) gets `max_attempts` 16 × N unless `--max-attempts` says
//! otherwise: no single layer can queue the collisions between instances, and this margin
//! keeps them from exhausting a request's attempts. Everything else keeps
//! `RetryPolicy::default()`; its deadline still bounds every request.
//!
//! The database is a SQLite file by default. `--database-url` names another: `sqlite:PATH`,
//! `postgres://...` (build with `--features postgres`) or `mysql://...` (MySQL or MariaDB,
//! `--features mysql`). On a URL the runs use the tables `tsr_demo_without_layer` and
//! `tsr_demo_with_layer`, dropped and created afresh at the start of a run and dropped at its
//! end; nothing else in that database is touched. What `POST /items` meets there:
//! PostgreSQL `40001` (the transaction is `SERIALIZABLE`), MySQL/MariaDB `1213` (deadlock;
//! `SERIALIZABLE` too); see `examples/common/app_lib.rs`.
//!
//! A run that could demonstrate nothing is refused: `--requests 0`, `--write-ratio 0` (no
//! writes: nothing contends) and `--clients 1` (one request at a time: no concurrency).
//!
//! Exits with status 0 on PASS (the run without the layer failed requests; with it none
//! failed, and nothing was lost or doubled); 1 if the run with the layer failed any request,
//! if either run lost or doubled anything, or if no write was sent; 2 on bad flags or a setup
//! error (a URL whose backend this build lacks says which feature to add); 3 when nothing
//! failed without the layer either: no contention was shown, and the verdict says so.
//!
//! Flags (`--help` explains each): `--clients N` (64, at least 2), `--requests N` (4000, at
//! least 1), `--write-ratio F` (0.7, above 0), `--pool-size N`
//! (8, per instance), `--busy-timeout-ms N` (5000, sqlx's default; SQLite only),
//! `--instances N` (1), `--max-attempts N` (the write route's, in the run with the layer:
//! `RetryPolicy::default()`'s with one instance, 16 × N with N), `--database-url URL` (default: SQLite files), `--db PATH` (SQLite
//! files; default: files in a temporary directory, removed at the end; with `--db items.db`
//! the runs use `items.without-layer.db` and `items.with-layer.db`, replaced if they exist,
//! and kept), `--json` (machine-readable report on stdout, no progress bar). `RUST_LOG` sets
//! the log filter (default `error,tower_sqlite_retry=off`: the table already counts the
//! retries).

#[allow(dead_code)] // the configurations of examples/app.rs
#[path = "common/app_lib.rs"]
mod app_lib;
#[path = "common/cli.rs"]
mod cli;
#[path = "common/driver.rs"]
mod driver;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use indicatif::{ProgressBar, ProgressStyle};
use tower_sqlite_retry::{Admission, RetryPolicy};

use app_lib::{Backend, RetryPolicies, redact};
use driver::{BoxError, Report, Scenario, Target, Verdict};

/// The demonstration: the example app under write contention, without and with
/// SqliteRetryLayer, each on a fresh database; checks that nothing was lost or doubled.
#[derive(Debug, Parser)]
#[command(
    name = "contention",
    after_help = "Exits 0 on PASS; 1 if the run with the layer failed a request, either run \
    lost or doubled rows, or no write was sent; 2 on bad flags or a setup error; 3 if nothing \
    failed without the layer either (no contention shown). RUST_LOG sets the log filter \
    (default: error,tower_sqlite_retry=off)."
)]
struct Args {
    /// Concurrent HTTP/1.1 clients (keep-alive), spread round-robin over the instances; at
    /// least 2 (one client sends one request at a time: nothing contends).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = concurrent_clients)]
    clients: usize,
    /// Requests in all, per run.
    #[arg(long, value_name = "N", default_value_t = 4000, value_parser = at_least_one)]
    requests: usize,
    /// The share of requests that are POST /items (the rest are GET /items), above 0 and at
    /// most 1 (without writes nothing contends).
    #[arg(long, value_name = "0..1", default_value_t = 0.7, value_parser = ratio)]
    write_ratio: f64,
    /// Connections in each instance's pool.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: u32,
    /// SQLite's busy_timeout, in milliseconds (sqlx's default; SQLite only).
    #[arg(long, value_name = "N", default_value_t = 5000)]
    busy_timeout_ms: u64,
    /// Copies of the app on the same database, each with its own pool and its own layers, as a
    /// scaled-out deployment would run; client c talks to instance c mod N.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    instances: usize,
    /// The write route's max_attempts in the run with the layer [default:
    /// RetryPolicy::default()'s with one instance, 16 × N with N instances].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Writer admission in the run with the layer: adaptive (the default: a learned limit on
    /// the attempts in flight of each route that meets contention) or off (every attempt at
    /// once, the first release's behaviour).
    #[arg(long, value_name = "MODE", default_value = "adaptive", value_parser = ["adaptive", "off"])]
    admission: String,
    /// Run on this database instead of SQLite files: sqlite:PATH, postgres://... (build with
    /// --features postgres) or mysql://... (--features mysql); tables tsr_demo_without_layer
    /// and tsr_demo_with_layer, dropped and created afresh, dropped at the end.
    #[arg(long, value_name = "URL", conflicts_with = "db")]
    database_url: Option<String>,
    /// SQLite files: with --db items.db the runs use items.without-layer.db and
    /// items.with-layer.db, replaced if they exist, and kept [default: files in a temporary
    /// directory, removed at the end].
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
    /// A machine-readable report on stdout, and no progress bar.
    #[arg(long)]
    json: bool,
}

fn at_least_one(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn concurrent_clients(v: &str) -> Result<usize, String> {
    match v.parse::<usize>() {
        Ok(n) if n < 2 => Err(
            "must be at least 2: one client sends one request at a time, so nothing contends \
             and the run could show nothing"
                .into(),
        ),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

fn ratio(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(r) if r > 0.0 && r <= 1.0 => Ok(r),
        Ok(_) => Err(
            "must be above 0 and at most 1: without writes nothing contends, and the run \
             could show nothing"
                .into(),
        ),
        Err(e) => Err(e.to_string()),
    }
}

impl Args {
    /// The write route's `max_attempts` in the run with the layer: `--max-attempts`, else
    /// `RetryPolicy::default()`'s with one instance and 16 per instance with several (every
    /// instance's writers contend for the same rows, and every instance's replay gate lets a
    /// replay through).
    fn write_attempts(&self) -> u32 {
        self.max_attempts.unwrap_or(if self.instances == 1 {
            default_max_attempts()
        } else {
            16 * u32::try_from(self.instances).unwrap_or(u32::MAX / 16)
        })
    }

    /// Parses the command line; a URL whose backend this build lacks is a usage error that
    /// says which feature to add.
    fn parse_checked() -> Self {
        let args = Self::parse();
        if let Some(url) = &args.database_url {
            let why = match Backend::of_url(url) {
                None => Some(format!(
                    "{} is not sqlite:, postgres:// or mysql://",
                    redact(url)
                )),
                Some(backend) if !backend.compiled_in() => Some(format!(
                    "{} needs the crate's `{}` feature, which this build lacks:\n  \
                     cargo run --release --features {} --example contention -- --database-url {}",
                    backend.name(),
                    backend.feature(),
                    backend.feature(),
                    redact(url)
                )),
                Some(_) => None,
            };
            if let Some(why) = why {
                Self::command()
                    .error(ErrorKind::ValueValidation, format!("--database-url: {why}"))
                    .exit();
            }
        }
        args
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse_checked();
    tracing_subscriber::fmt()
        .with_env_filter(cli::env_filter("error,tower_sqlite_retry=off"))
        .with_writer(std::io::stderr)
        .init();

    match run(&args).await {
        Ok(Verdict::Pass) => ExitCode::SUCCESS,
        Ok(Verdict::Fail(_)) => ExitCode::from(1),
        Ok(Verdict::NoContention) => ExitCode::from(3),
        Err(e) => {
            eprintln!("contention: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs both scenarios, reports, and says what they showed.
async fn run(args: &Args) -> Result<Verdict, BoxError> {
    // Kept alive to the end: dropping it removes the files.
    let mut _tempdir = None;
    let (without_db, with_db) = match (&args.database_url, &args.db) {
        (Some(url), _) => (
            Target::Url {
                url: url.clone(),
                table: "tsr_demo_without_layer".into(),
            },
            Target::Url {
                url: url.clone(),
                table: "tsr_demo_with_layer".into(),
            },
        ),
        (None, Some(path)) => {
            let pair = (derived(path, "without-layer"), derived(path, "with-layer"));
            remove_db(&pair.0)?;
            remove_db(&pair.1)?;
            (Target::SqliteFile(pair.0), Target::SqliteFile(pair.1))
        }
        (None, None) => {
            let dir = tempfile::tempdir()?;
            let pair = (
                dir.path().join("without-layer.db"),
                dir.path().join("with-layer.db"),
            );
            _tempdir = Some(dir);
            (Target::SqliteFile(pair.0), Target::SqliteFile(pair.1))
        }
    };
    let backend = args
        .database_url
        .as_deref()
        .and_then(Backend::of_url)
        .unwrap_or(Backend::Sqlite);

    if !args.json {
        let timeout = if backend == Backend::Sqlite {
            format!(", busy_timeout {} ms", args.busy_timeout_ms)
        } else {
            String::new()
        };
        println!(
            "contention: {} clients, {} requests ({:.0}% POST /items, {:.0}% GET /items), \
             {} {} connections{timeout}, {} cores{}",
            args.clients,
            args.requests,
            args.write_ratio * 100.0,
            (1.0 - args.write_ratio) * 100.0,
            if args.instances == 1 {
                "pool".to_string()
            } else {
                format!("{} instances, each with its own pool of", args.instances)
            },
            args.pool_size,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            if cfg!(debug_assertions) {
                " (debug build: use --release for representative numbers)"
            } else {
                ""
            }
        );
        println!(
            "database: {}: {} / {}",
            backend.name(),
            without_db.describe(),
            with_db.describe()
        );
        println!(
            "policy with the layer: RetryPolicy::default(), admission {}, POST /items max_attempts {}{}",
            args.admission,
            args.write_attempts(),
            match (args.max_attempts, args.instances) {
                (Some(_), _) => " (--max-attempts)".to_string(),
                (None, 1) => " (the default)".to_string(),
                (None, n) => format!(" (16 × {n} instances; --max-attempts to change)"),
            }
        );
    }

    // The policies of the run with the layer: printed and reported as they are used.
    let admission = if args.admission == "off" {
        Admission::Off
    } else {
        Admission::Adaptive
    };
    let policies = RetryPolicies {
        write: RetryPolicy::default()
            .max_attempts(args.write_attempts())
            .admission(admission),
        read: RetryPolicy::default().admission(admission),
    };

    let run_one = |label: &'static str, target: Target, retry: Option<RetryPolicies>| async move {
        let progress = progress_bar(args, label);
        let report = driver::run(Scenario {
            label: label.to_string(),
            target,
            instances: args.instances,
            clients: args.clients,
            requests: args.requests,
            write_ratio: args.write_ratio,
            pool_size: args.pool_size,
            busy_timeout: Duration::from_millis(args.busy_timeout_ms),
            retry,
            progress: progress.clone(),
        })
        .await;
        progress.finish_and_clear();
        if let (Ok(r), false) = (&report, args.json) {
            eprintln!(
                "{:>14}: {} requests in {:.2} s",
                r.label, r.requests, r.elapsed_s
            );
        }
        report
    };
    let without = run_one("without layer", without_db, None).await?;
    let with = run_one("with layer", with_db, Some(policies.clone())).await?;

    let verdict = driver::verdict(&without, &with);
    if args.json {
        let out = serde_json::json!({
            "config": {
                "clients": args.clients,
                "requests": args.requests,
                "write_ratio": args.write_ratio,
                "pool_size": args.pool_size,
                "busy_timeout_ms": args.busy_timeout_ms,
                "instances": args.instances,
                "write_max_attempts": args.write_attempts(),
                "database": backend.name(),
                "admission": format!("{admission:?}"),
                "write_policy": format!("{:?}", policies.write),
                "read_policy": format!("{:?}", policies.read),
                "release": !cfg!(debug_assertions),
            },
            "runs": [without, with],
            "pass": verdict == Verdict::Pass,
            "verdict": verdict,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_table(&[&without, &with]);
        if args.instances > 1 {
            for r in [&without, &with] {
                print_instances(r);
            }
        }
        println!();
        for r in [&without, &with] {
            println!("{}", integrity_line(r));
        }
        println!("{}", verdict_line(&without, &with, &verdict));
    }
    Ok(verdict)
}

fn progress_bar(args: &Args, label: &str) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg:>14} [{bar:40.cyan/blue}] {pos}/{len} {per_sec:>12} eta {eta}",
    )
    .expect("valid template")
    .progress_chars("=> ");
    let bar = ProgressBar::new(args.requests as u64).with_style(style);
    bar.set_message(label.to_string());
    bar
}

/// `RetryPolicy::default()`'s `max_attempts`, read from its `Debug` output (the policy has
/// setters only; `Debug` shows every setting), so that this tool follows the crate's default.
fn default_max_attempts() -> u32 {
    let debug = format!("{:?}", RetryPolicy::default());
    debug
        .split("max_attempts: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .expect("RetryPolicy's Debug output shows max_attempts")
}

/// `dir/items.db` -> `dir/items.<tag>.db`.
fn derived(path: &Path, tag: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(|| "items".into(), |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(|| "db".into(), |e| e.to_string_lossy().into_owned());
    path.with_file_name(format!("{stem}.{tag}.{ext}"))
}

/// Removes a database file and its WAL companions, so a run starts empty.
fn remove_db(path: &Path) -> std::io::Result<()> {
    for suffix in ["", "-wal", "-shm"] {
        let mut p = path.as_os_str().to_owned();
        p.push(suffix);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

fn print_table(runs: &[&Report]) {
    let dash = || "-".to_string();
    let layer = |r: &Report, f: &dyn Fn(&driver::LayerReport) -> String| {
        r.layer.as_ref().map_or_else(dash, f)
    };
    let rows: Vec<(&str, Vec<String>)> = vec![
        ("", runs.iter().map(|r| r.label.clone()).collect()),
        (
            "requests (POST/GET)",
            runs.iter()
                .map(|r| format!("{} ({}/{})", r.requests, r.writes, r.reads))
                .collect(),
        ),
        (
            "2xx",
            runs.iter().map(|r| r.status_2xx.to_string()).collect(),
        ),
        (
            "5xx",
            runs.iter().map(|r| r.status_5xx.to_string()).collect(),
        ),
        (
            "other (4xx, transport)",
            runs.iter().map(|r| r.other.to_string()).collect(),
        ),
        (
            "success",
            runs.iter()
                .map(|r| format!("{:.1} %", r.success_pct()))
                .collect(),
        ),
        (
            "throughput",
            runs.iter()
                .map(|r| format!("{:.0} req/s", r.throughput_rps))
                .collect(),
        ),
        (
            "2xx per second",
            runs.iter()
                .map(|r| format!("{:.0} req/s", r.status_2xx as f64 / r.elapsed_s.max(1e-9)))
                .collect(),
        ),
        (
            "latency p50",
            runs.iter()
                .map(|r| format!("{:.1} ms", r.latency_ms.p50))
                .collect(),
        ),
        (
            "latency p95",
            runs.iter()
                .map(|r| format!("{:.1} ms", r.latency_ms.p95))
                .collect(),
        ),
        (
            "latency p99",
            runs.iter()
                .map(|r| format!("{:.1} ms", r.latency_ms.p99))
                .collect(),
        ),
        (
            "latency max",
            runs.iter()
                .map(|r| format!("{:.1} ms", r.latency_ms.max))
                .collect(),
        ),
        (
            "retries performed",
            runs.iter()
                .map(|r| layer(r, &|l| l.retries.to_string()))
                .collect(),
        ),
        (
            "queued (writer admission)",
            runs.iter()
                .map(|r| layer(r, &|l| l.queued.to_string()))
                .collect(),
        ),
        (
            "gave up after retrying",
            runs.iter()
                .map(|r| layer(r, &|l| l.gave_up.to_string()))
                .collect(),
        ),
        (
            "rows committed",
            runs.iter().map(|r| r.integrity.rows.to_string()).collect(),
        ),
        (
            "201 Created answered",
            runs.iter()
                .map(|r| r.integrity.acknowledged.to_string())
                .collect(),
        ),
        (
            "integrity",
            runs.iter()
                .map(|r| if r.integrity.ok { "OK" } else { "BROKEN" }.to_string())
                .collect(),
        ),
    ];
    let width = rows
        .iter()
        .flat_map(|(_, vals)| vals.iter().map(String::len))
        .max()
        .unwrap_or(0)
        + 2;
    println!();
    for (name, vals) in &rows {
        let mut line = format!("{name:<24}");
        for v in vals {
            line.push_str(&format!("{v:>width$}"));
        }
        println!("{}", line.trim_end());
    }
    for r in runs {
        if let Some(l) = &r.layer {
            println!(
                "{:<24}{}: {}",
                "attempts histogram",
                r.label,
                histogram(&l.attempts_histogram)
            );
        }
    }
}

/// One line per instance, then the total: the clients' answers and the instance's own layers.
fn print_instances(r: &Report) {
    println!();
    println!("per instance, {}:", r.label);
    let header = [
        "instance", "clients", "requests", "2xx", "5xx", "other", "p99 ms", "retries", "gave up",
    ];
    let mut rows: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    let mut histograms = Vec::new();
    let dash = || "-".to_string();
    for i in &r.instances {
        rows.push(vec![
            i.instance.to_string(),
            i.clients.to_string(),
            i.requests.to_string(),
            i.status_2xx.to_string(),
            i.status_5xx.to_string(),
            i.other.to_string(),
            format!("{:.1}", i.latency_ms.p99),
            i.layer
                .as_ref()
                .map_or_else(dash, |l| l.retries.to_string()),
            i.layer
                .as_ref()
                .map_or_else(dash, |l| l.gave_up.to_string()),
        ]);
        if let Some(l) = &i.layer {
            histograms.push((
                format!("instance {}", i.instance),
                histogram(&l.attempts_histogram),
            ));
        }
    }
    rows.push(vec![
        "total".to_string(),
        r.clients.to_string(),
        r.requests.to_string(),
        r.status_2xx.to_string(),
        r.status_5xx.to_string(),
        r.other.to_string(),
        format!("{:.1}", r.latency_ms.p99),
        r.layer
            .as_ref()
            .map_or_else(dash, |l| l.retries.to_string()),
        r.layer
            .as_ref()
            .map_or_else(dash, |l| l.gave_up.to_string()),
    ]);
    if let Some(l) = &r.layer {
        histograms.push(("total".to_string(), histogram(&l.attempts_histogram)));
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| rows.iter().map(|row| row[c].len()).max().unwrap_or(0) + 2)
        .collect();
    for row in &rows {
        let line: String = row
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:>w$}"))
            .collect();
        println!("{}", line.trim_end());
    }
    for (name, h) in histograms {
        println!("  attempts histogram, {name}: {h}");
    }
}

/// `1×3712  2×201  3×57`: requests by attempts made; the last bucket reads `16+`.
fn histogram(h: &[u64]) -> String {
    let last = h.len();
    h.iter()
        .enumerate()
        .filter(|(_, n)| **n > 0)
        .map(|(i, n)| {
            let plus = if i + 1 == last { "+" } else { "" };
            format!("{}{plus}×{n}", i + 1)
        })
        .collect::<Vec<_>>()
        .join("  ")
}

fn integrity_line(r: &Report) -> String {
    let i = &r.integrity;
    let verdict = if i.ok { "OK" } else { "BROKEN" };
    format!(
        "integrity, {}: {verdict}: {} rows committed, {} answered 201 Created; \
         lost {}, unacknowledged {}, doubled {}, duplicate seq {}",
        r.label, i.rows, i.acknowledged, i.lost, i.unacknowledged, i.doubled, i.duplicate_seqs
    )
}

fn verdict_line(without: &Report, with: &Report, verdict: &Verdict) -> String {
    let before = format!(
        "without it {} of {} requests failed ({:.1} %)",
        without.failures(),
        without.requests,
        100.0 - without.success_pct()
    );
    match verdict {
        Verdict::Pass => format!(
            "verdict: PASS: with the layer all {} requests succeeded and nothing was lost or \
             doubled; {before}",
            with.requests
        ),
        Verdict::NoContention => format!(
            "verdict: NO CONTENTION SHOWN: the run without the layer had no failures either \
             ({before}), so this run shows nothing about the layer; more --clients or \
             --requests, or a higher --write-ratio, make writers collide"
        ),
        Verdict::Fail(why) => format!("verdict: FAIL: {}; {before}", why.join("; ")),
    }
}
