//! The demonstration: the example app (`examples/app.rs`) under write contention, each run on a
//! fresh database: without `SqliteRetryLayer`, with it (`RetryPolicy::default()`; see
//! `--instances` for the write route's attempts when there are several instances), with the
//! one-word fix a user would otherwise reach for (`BEGIN IMMEDIATE`, no layer), with the
//! write path (the layer and a `WritePool`), and with the writer thread (the layer and a
//! rusqlite `WriteThread`), side by side.
//!
//! ```text
//! cargo run --release --example contention
//! cargo run --release --example contention -- --clients 128 --requests 8000 --write-ratio 0.9
//! cargo run --release --example contention -- --prep-us 500
//! cargo run --release --example contention -- --json > contention.json
//! cargo run --release --features postgres --example contention -- \
//!     --database-url postgres://postgres@127.0.0.1:5432/test --instances 3
//! cargo run --release --features mysql --example contention -- \
//!     --database-url mysql://root@127.0.0.1:3306/test --instances 3
//! ```
//!
//! The app serves on real loopback sockets (`127.0.0.1:0`); `--clients` HTTP/1.1 clients with
//! keep-alive send `--requests` requests in all, `--write-ratio` of them `POST /items` and the
//! rest `GET /items`. `POST /items` is a handler with work before and after its transaction:
//! about `--prep-us` µs of CPU (hashing, standing for parsing and authentication), then a
//! read-then-write transaction (`MAX(seq) + 1`, then an insert), then a read after the commit
//! (`SELECT COUNT(*)`), the same in every run. The runs (the columns of the table):
//!
//! | column | the app's `--config` | layer | `POST /items`' transaction |
//! |---|---|---|---|
//! | `without layer` | `bare` | none | deferred `BEGIN` on the pool: concurrent writers fail with `503` |
//! | `with layer` | `layer` | `RetryPolicy::default()` | the same, replayed by the layer |
//! | `BEGIN IMMEDIATE` | `immediate` | none | `BEGIN IMMEDIATE` on the pool: writers wait in SQLite's busy handler, each holding a pool connection |
//! | `write path` | `layer-write` | `RetryPolicy::default()` | `WritePool::begin()`: its turn in the process, then `BEGIN IMMEDIATE` on the `WritePool`'s writer connection; reads stay on the pool |
//! | `writer thread` | `layer-thread` | `RetryPolicy::default()` | the same transaction as a closure given to a rusqlite `WriteThread`: its turn in the process, then `BEGIN IMMEDIATE` … `COMMIT` around it on the thread that owns the writer connection; reads stay on the pool |
//!
//! The table gives, per run: the answers, throughput, reads/s and writes/s (`GET` and `POST`
//! answered 2xx per second of the run), latency percentiles, the slowest request and the
//! slowest write, the layer's replays, the write path's turn (the share of the run a write
//! transaction held it), and the integrity check: each run's database is checked against the
//! answers (every `201 Created` has its row, no row lacks one, nothing was inserted twice, no
//! `seq` repeats). Every figure comes from the run itself; two lines compare the write path
//! and the writer thread with `BEGIN IMMEDIATE`.
//!
//! `BEGIN IMMEDIATE`, the write path and the writer thread are SQLite's, and the write path's
//! queue is per
//! process: with `--database-url` for PostgreSQL or MySQL, or with `--instances` above 1, the
//! demonstration runs the first two columns only, and says so.
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
//! `tsr_demo_with_layer` (and, on `sqlite:`, `tsr_demo_immediate`, `tsr_demo_write_path` and
//! `tsr_demo_writer_thread`),
//! dropped and created afresh at the start of a run and dropped at its end; nothing else in
//! that database is touched. What `POST /items` meets there: PostgreSQL `40001` (the
//! transaction is `SERIALIZABLE`), MySQL/MariaDB `1213` (deadlock; `SERIALIZABLE` too); see
//! `examples/common/app_lib.rs`.
//!
//! A run that could demonstrate nothing is refused: `--requests 0`, `--write-ratio 0` (no
//! writes: nothing contends) and `--clients 1` (one request at a time: no concurrency).
//!
//! Exits with status 0 on PASS (the run without the layer failed requests; with the layer,
//! with `BEGIN IMMEDIATE`, with the write path and with the writer thread none failed, and no
//! run lost or doubled anything); 1 if the run with the layer, with `BEGIN IMMEDIATE`, with
//! the write path or with the writer thread failed any request, if any run lost or doubled anything, or if no write was sent; 2 on bad
//! flags or a setup error (a URL whose backend this build lacks says which feature to add); 3
//! when nothing failed without the layer either: no contention was shown, and the verdict
//! says so. Which run was faster is shown, never judged: timings on a shared machine vary.
//!
//! Flags (`--help` explains each): `--clients N` (64, at least 2), `--requests N` (per run, at
//! least 1; 2500 with the five runs, 4000 with two: a few seconds in all either way), `--write-ratio F` (0.7, above 0), `--prep-us N` (200 µs of CPU
//! before the transaction, and the read after the commit; 0: neither), `--pool-size N` (8, per
//! instance), `--busy-timeout-ms N` (5000, sqlx's default; SQLite only), `--instances N` (1),
//! `--max-attempts N` (the write route's, in the runs with the layer: `RetryPolicy::default()`'s
//! with one instance, 16 × N with N), `--admission MODE` (adaptive), `--database-url URL`
//! (default: SQLite files), `--db PATH` (SQLite files; default: files in a temporary
//! directory, removed at the end; with `--db items.db` the runs use `items.without-layer.db`,
//! `items.with-layer.db`, `items.immediate.db`, `items.write-path.db` and
//! `items.writer-thread.db`, replaced if they
//! exist, and kept), `--json` (machine-readable report on stdout, no progress bar).
//! `RUST_LOG` sets the log filter (default `error,tower_sqlite_retry=off`: the table already
//! counts the retries).

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
use tower_sqlite_retry::RetryPolicy;
use tower_sqlite_retry::policy::Admission;

use app_lib::{Backend, RetryPolicies, Work, redact};
use driver::{Begin, BoxError, Report, Scenario, Target, Verdict};

/// Requests per run by default with the five runs (4000 with two).
const REQUESTS_ALL_RUNS: usize = 2500;

/// The CPU work before `POST /items`' transaction, in µs, unless `--prep-us` says otherwise.
///
/// 200 µs: measured on a 2-core machine against 100, 150 and 300 µs, every one showed the
/// same (the write path's slowest write a fraction of `BEGIN IMMEDIATE`'s, more reads per
/// second); this is a handler's plausible parsing and authentication, and keeps the
/// demonstration to a few seconds.
const DEFAULT_PREP_US: u64 = 200;

/// The demonstration: the example app under write contention, without SqliteRetryLayer, with
/// it, with BEGIN IMMEDIATE, with the write path and with the writer thread, each on a fresh
/// database; checks that
/// nothing was lost or doubled.
#[derive(Debug, Parser)]
#[command(
    name = "contention",
    after_help = "Exits 0 on PASS; 1 if the run with the layer, with BEGIN IMMEDIATE, with \
    the write path or with the writer thread failed a request, any run lost or doubled rows, or no write was sent; 2 on \
    bad flags or a setup error; 3 if nothing failed without the layer either (no contention \
    shown). Which run was faster is shown, not judged. RUST_LOG sets the log filter \
    (default: error,tower_sqlite_retry=off)."
)]
struct Args {
    /// Concurrent HTTP/1.1 clients (keep-alive), spread round-robin over the instances; at
    /// least 2 (one client sends one request at a time: nothing contends).
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = concurrent_clients)]
    clients: usize,
    /// Requests in all, per run [default: 2500 with the five SQLite runs, 4000 with the two
    /// runs of --database-url postgres:// or mysql://, or of --instances above 1].
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    requests: Option<usize>,
    /// The share of requests that are POST /items (the rest are GET /items), above 0 and at
    /// most 1 (without writes nothing contends).
    #[arg(long, value_name = "0..1", default_value_t = 0.7, value_parser = ratio)]
    write_ratio: f64,
    /// CPU work (hashing) before POST /items' transaction, in µs, and a read (SELECT COUNT(*))
    /// after its commit: a handler with work before and after its transaction, the same in
    /// every run. 0: neither (the bare read-then-write).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_PREP_US)]
    prep_us: u64,
    /// Connections in each instance's pool.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: u32,
    /// SQLite's busy_timeout, in milliseconds (sqlx's default; SQLite only).
    #[arg(long, value_name = "N", default_value_t = 5000)]
    busy_timeout_ms: u64,
    /// Copies of the app on the same database, each with its own pool and its own layers, as a
    /// scaled-out deployment would run; client c talks to instance c mod N. Above 1, only the
    /// runs without and with the layer (the write path's queue is per process).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = at_least_one)]
    instances: usize,
    /// The write route's max_attempts in the runs with the layer [default:
    /// RetryPolicy::default()'s with one instance, 16 × N with N instances].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_attempts: Option<u32>,
    /// Writer admission in the runs with the layer: adaptive (the default: a learned limit on
    /// the attempts in flight of each route that meets contention) or off (every attempt at
    /// once, the first release's behaviour).
    #[arg(long, value_name = "MODE", default_value = "adaptive", value_parser = ["adaptive", "off"])]
    admission: String,
    /// Run on this database instead of SQLite files: sqlite:PATH, postgres://... (build with
    /// --features postgres) or mysql://... (--features mysql); tables tsr_demo_without_layer
    /// and tsr_demo_with_layer (and on sqlite: tsr_demo_immediate, tsr_demo_write_path and
    /// tsr_demo_writer_thread),
    /// dropped and created afresh, dropped at the end. PostgreSQL and MySQL: only the runs
    /// without and with the layer (BEGIN IMMEDIATE, the write path and the writer thread are
    /// SQLite's).
    #[arg(long, value_name = "URL", conflicts_with = "db")]
    database_url: Option<String>,
    /// SQLite files: with --db items.db the runs use items.without-layer.db,
    /// items.with-layer.db, items.immediate.db, items.write-path.db and items.writer-thread.db,
    /// replaced if they
    /// exist, and kept [default: files in a temporary directory, removed at the end].
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
    /// Requests per run: `--requests`, else 2500 with the five runs and 4000 with two (a few
    /// seconds in all either way).
    fn requests(&self, all_runs: bool) -> usize {
        self.requests
            .unwrap_or(if all_runs { REQUESTS_ALL_RUNS } else { 4000 })
    }

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

/// One run of the demonstration: a column of the table.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The column's name (and the report's label).
    label: &'static str,
    /// The file name's tag (`items.<tag>.db`), and the table's (`tsr_demo_<tag>`, with `_`).
    tag: &'static str,
    /// With the retry layers.
    layer: bool,
    begin: Begin,
}

/// The runs, in column order: without the layer, with it, `BEGIN IMMEDIATE`, the write path,
/// the writer thread.
const RUNS: [Run; 5] = [
    Run {
        label: "without layer",
        tag: "without-layer",
        layer: false,
        begin: Begin::Deferred,
    },
    Run {
        label: "with layer",
        tag: "with-layer",
        layer: true,
        begin: Begin::Deferred,
    },
    Run {
        label: "BEGIN IMMEDIATE",
        tag: "immediate",
        layer: false,
        begin: Begin::Immediate,
    },
    Run {
        label: "write path",
        tag: "write-path",
        layer: true,
        begin: Begin::WritePath,
    },
    Run {
        label: "writer thread",
        tag: "writer-thread",
        layer: true,
        begin: Begin::WriteThread,
    },
];

/// Why only the runs without and with the layer are made (`None`: all five are).
fn only_two_runs(backend: Backend, instances: usize) -> Option<String> {
    if backend != Backend::Sqlite {
        Some(format!(
            "BEGIN IMMEDIATE, the write path (WritePool) and the writer thread (WriteThread) \
             are SQLite's: not run on {}",
            backend.name()
        ))
    } else if instances > 1 {
        Some(format!(
            "BEGIN IMMEDIATE, the write path and the writer thread: not run with {instances} \
             instances (they would share this process, and with it the write path's queue, \
             which the separate \
             processes of a real deployment do not)"
        ))
    } else {
        None
    }
}

/// Runs the scenarios, reports, and says what they showed.
async fn run(args: &Args) -> Result<Verdict, BoxError> {
    let backend = args
        .database_url
        .as_deref()
        .and_then(Backend::of_url)
        .unwrap_or(Backend::Sqlite);
    let skipped = only_two_runs(backend, args.instances);
    let runs: &[Run] = if skipped.is_some() { &RUNS[..2] } else { &RUNS };
    let requests = args.requests(skipped.is_none());

    // Kept alive to the end: dropping it removes the files.
    let mut _tempdir = None;
    let targets: Vec<Target> = match (&args.database_url, &args.db) {
        (Some(url), _) => runs
            .iter()
            .map(|r| Target::Url {
                url: url.clone(),
                table: format!("tsr_demo_{}", r.tag.replace('-', "_")),
            })
            .collect(),
        (None, Some(path)) => {
            let mut targets = Vec::new();
            for r in runs {
                let file = derived(path, r.tag);
                remove_db(&file)?;
                targets.push(Target::SqliteFile(file));
            }
            targets
        }
        (None, None) => {
            let dir = tempfile::tempdir()?;
            let targets = runs
                .iter()
                .map(|r| Target::SqliteFile(dir.path().join(format!("{}.db", r.tag))))
                .collect();
            _tempdir = Some(dir);
            targets
        }
    };
    // Calibrated once, before any run: every run does the same work per write.
    let work = Work::new(args.prep_us);

    if !args.json {
        let timeout = if backend == Backend::Sqlite {
            format!(", busy_timeout {} ms", args.busy_timeout_ms)
        } else {
            String::new()
        };
        println!(
            "contention: {} clients, {} requests per run ({:.0}% POST /items, {:.0}% GET /items), \
             {} {} connections{timeout}, {} cores{}",
            args.clients,
            requests,
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
            "database: {}: {}",
            backend.name(),
            describe_targets(&targets)
        );
        println!(
            "POST /items: {}",
            if work.read_after_commit() {
                format!(
                    "~{} µs of CPU, then its read-then-write transaction, then a SELECT \
                     COUNT(*) (--prep-us)",
                    work.prep_us
                )
            } else {
                "the read-then-write transaction alone (--prep-us 0)".to_string()
            }
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
        if skipped.is_none() {
            let pool = args.pool_size;
            println!(
                "  without layer    pool {pool}, deferred BEGIN: a writer that collides fails (503)"
            );
            println!("  with layer       the same, and the layer replays the request");
            println!(
                "  BEGIN IMMEDIATE  no layer, pool {pool}: writers wait in SQLite, each holding a connection"
            );
            println!(
                "  write path       the layer and WritePool: writers queue in the process, then BEGIN"
            );
            println!(
                "                   IMMEDIATE on its own connection; reads keep the pool of {pool}"
            );
            println!(
                "  writer thread    the layer and WriteThread (rusqlite): the same turn, the \
                 transaction a"
            );
            println!(
                "                   closure run on the thread that owns the writer connection"
            );
        }
    }

    // The policies of the runs with the layer: printed and reported as they are used.
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

    let mut reports = Vec::with_capacity(runs.len());
    for (run, target) in runs.iter().zip(targets) {
        let progress = progress_bar(args, run.label, requests);
        let report = driver::run(Scenario {
            label: run.label.to_string(),
            target,
            instances: args.instances,
            clients: args.clients,
            requests,
            write_ratio: args.write_ratio,
            pool_size: args.pool_size,
            busy_timeout: Duration::from_millis(args.busy_timeout_ms),
            retry: run.layer.then(|| policies.clone()),
            begin: run.begin,
            work,
            progress: progress.clone(),
        })
        .await;
        progress.finish_and_clear();
        let report = report?;
        if !args.json {
            eprintln!(
                "{:>15}: {} requests in {:.2} s",
                report.label, report.requests, report.elapsed_s
            );
        }
        reports.push(report);
    }
    let (without, with) = (&reports[0], &reports[1]);
    let also: Vec<&Report> = reports[2..].iter().collect();
    let verdict = driver::verdict_with(without, with, &also);

    if args.json {
        let out = serde_json::json!({
            "config": {
                "clients": args.clients,
                "requests": requests,
                "write_ratio": args.write_ratio,
                "prep_us": work.prep_us,
                "prep_rounds": work.prep_rounds,
                "read_after_commit": work.read_after_commit(),
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
            "runs": reports,
            "not_run": skipped,
            "pass": verdict == Verdict::Pass,
            "verdict": verdict,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let all: Vec<&Report> = reports.iter().collect();
        print_table(&all);
        if args.instances > 1 {
            for r in &reports {
                print_instances(r);
            }
        }
        println!();
        for r in &reports {
            println!("{}", integrity_line(r));
        }
        match (&skipped, also.as_slice()) {
            (Some(why), _) => println!("{why}"),
            (None, [immediate, write_path, thread]) => {
                println!("{}", comparison_line(immediate, write_path));
                println!("{}", comparison_line(immediate, thread));
            }
            (None, _) => {}
        }
        println!("{}", verdict_line(without, with, &also, &verdict));
    }
    Ok(verdict)
}

/// The runs' databases, for the header: `DIR: a.db, b.db` when they are files of one
/// directory.
fn describe_targets(targets: &[Target]) -> String {
    let files: Option<Vec<&Path>> = targets
        .iter()
        .map(|t| match t {
            Target::SqliteFile(path) => Some(path.as_path()),
            Target::Url { .. } => None,
        })
        .collect();
    if let Some(files) = files {
        let dirs: Vec<Option<&Path>> = files.iter().map(|f| f.parent()).collect();
        if let (Some(Some(dir)), true) = (dirs.first(), dirs.windows(2).all(|w| w[0] == w[1])) {
            let names: Vec<String> = files
                .iter()
                .map(|f| {
                    f.file_name()
                        .unwrap_or_default()
                        .to_string_lossy()
                        .into_owned()
                })
                .collect();
            return format!(
                "a fresh file per run in {}: {}",
                dir.display(),
                names.join(", ")
            );
        }
    }
    let urls: Option<Vec<(&str, &str)>> = targets
        .iter()
        .map(|t| match t {
            Target::Url { url, table } => Some((url.as_str(), table.as_str())),
            Target::SqliteFile(_) => None,
        })
        .collect();
    if let Some(urls) = urls
        && let Some((url, _)) = urls.first()
        && urls.iter().all(|(u, _)| u == url)
    {
        let tables: Vec<&str> = urls.iter().map(|(_, t)| *t).collect();
        return format!("{} (tables {})", redact(url), tables.join(", "));
    }
    targets
        .iter()
        .map(Target::describe)
        .collect::<Vec<_>>()
        .join(" / ")
}

fn progress_bar(args: &Args, label: &str, requests: usize) -> ProgressBar {
    if args.json {
        return ProgressBar::hidden();
    }
    let style = ProgressStyle::with_template(
        "{msg:>15} [{bar:40.cyan/blue}] {pos}/{len} {per_sec:>12} eta {eta}",
    )
    .expect("valid template")
    .progress_chars("=> ");
    let bar = ProgressBar::new(requests as u64).with_style(style);
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
    let each = |f: &dyn Fn(&Report) -> String| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
    let ms = |v: f64| format!("{v:.1} ms");
    let mut rows: Vec<(&str, Vec<String>)> = vec![
        ("", each(&|r| r.label.clone())),
        ("requests", each(&|r| r.requests.to_string())),
        (
            "  POST / GET",
            each(&|r| format!("{} / {}", r.writes, r.reads)),
        ),
        ("2xx", each(&|r| r.status_2xx.to_string())),
        ("5xx", each(&|r| r.status_5xx.to_string())),
        ("other (4xx, transport)", each(&|r| r.other.to_string())),
        ("success", each(&|r| format!("{:.1} %", r.success_pct()))),
        (
            "throughput",
            each(&|r| format!("{:.0} req/s", r.throughput_rps)),
        ),
        (
            "reads/s (GET 2xx)",
            each(&|r| format!("{:.0}/s", r.reads_per_s)),
        ),
        (
            "writes/s (POST 2xx)",
            each(&|r| format!("{:.0}/s", r.writes_per_s)),
        ),
        ("latency p50", each(&|r| ms(r.latency_ms.p50))),
        ("latency p95", each(&|r| ms(r.latency_ms.p95))),
        ("latency p99", each(&|r| ms(r.latency_ms.p99))),
        ("latency max", each(&|r| ms(r.latency_ms.max))),
        ("slowest write", each(&|r| ms(r.write_latency_ms.max))),
        ("read latency p99", each(&|r| ms(r.read_latency_ms.p99))),
        (
            "retries performed",
            each(&|r| layer(r, &|l| l.retries.to_string())),
        ),
        (
            "queued (admission)",
            each(&|r| layer(r, &|l| l.queued.to_string())),
        ),
        (
            "gave up after retrying",
            each(&|r| layer(r, &|l| l.gave_up.to_string())),
        ),
        (
            "write turn utilization",
            each(&|r| {
                r.write_turn
                    .as_ref()
                    .map_or_else(dash, |t| format!("{:.0} %", t.utilization * 100.0))
            }),
        ),
        ("rows committed", each(&|r| r.integrity.rows.to_string())),
        (
            "201 Created answered",
            each(&|r| r.integrity.acknowledged.to_string()),
        ),
        (
            "integrity",
            each(&|r| if r.integrity.ok { "OK" } else { "BROKEN" }.to_string()),
        ),
    ];
    if runs.iter().all(|r| r.write_turn.is_none()) {
        rows.retain(|(name, _)| *name != "write turn utilization");
    }
    let name_width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
    let widths: Vec<usize> = (0..runs.len())
        .map(|c| {
            rows.iter()
                .map(|(_, vals)| vals[c].len())
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    println!();
    for (name, vals) in &rows {
        let mut line = format!("{name:<name_width$}");
        for (v, width) in vals.iter().zip(&widths) {
            line.push_str(&format!("{v:>width$}"));
        }
        println!("{}", line.trim_end());
    }
    for r in runs {
        if let Some(l) = &r.layer {
            println!(
                "{:<name_width$}{}: {}",
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

/// The write path (or the writer thread) against `BEGIN IMMEDIATE`, in this run's figures:
/// shown, never judged.
fn comparison_line(immediate: &Report, write_path: &Report) -> String {
    let ratio = |a: f64, b: f64| {
        if b > 0.0 {
            format!("{:.2}×", a / b)
        } else {
            "-".to_string()
        }
    };
    format!(
        "{} vs BEGIN IMMEDIATE (this run): slowest write {:.0} ms vs {:.0} ms ({}), \
         p99 {}, reads/s {}, writes/s {}",
        write_path.label,
        write_path.write_latency_ms.max,
        immediate.write_latency_ms.max,
        ratio(
            write_path.write_latency_ms.max,
            immediate.write_latency_ms.max
        ),
        ratio(write_path.latency_ms.p99, immediate.latency_ms.p99),
        ratio(write_path.reads_per_s, immediate.reads_per_s),
        ratio(write_path.writes_per_s, immediate.writes_per_s),
    )
}

fn verdict_line(without: &Report, with: &Report, also: &[&Report], verdict: &Verdict) -> String {
    let before = format!(
        "without it {} of {} requests failed ({:.1} %)",
        without.failures(),
        without.requests,
        100.0 - without.success_pct()
    );
    let others = match also {
        [] => String::new(),
        runs => format!(
            "; {} runs: no failures either, nothing lost or doubled",
            runs.iter()
                .map(|r| r.label.as_str())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
    };
    match verdict {
        Verdict::Pass => format!(
            "verdict: PASS: with the layer all {} requests succeeded and nothing was lost or \
             doubled; {before}{others}",
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
