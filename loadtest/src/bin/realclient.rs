//! The example app against the configurations an expert would use instead of the layer,
//! measured from a real client over loopback HTTP/1.1.
//!
//! ```text
//! cargo run --release -p tower-sqlite-retry-loadtest --bin realclient                                   # everything (≈ 12 min)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin realclient -- --quick                        # a smoke run (≈ 1 min)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin realclient -- --loads writes --connections 256 --configs layer,one-writer
//! cargo run --release -p tower-sqlite-retry-loadtest --bin realclient -- --rounds 7 --out benches/results/realclient-baseline
//! ```
//!
//! **Servers.** Every cell (one configuration, one load, one connection count) runs the example
//! app (`examples/common/app_lib.rs`, the same router `cargo run --example app -- --config ..`
//! serves) in a **separate process**: this binary re-executes itself with a hidden `--serve`
//! flag, on a fresh SQLite file (WAL, `synchronous = NORMAL`, `busy_timeout` 5 s) in a
//! temporary directory, on a multi-threaded tokio runtime as `#[tokio::main]` builds it. Its
//! CPU time (user + system) is read from `/proc/<pid>/stat` at the start and the end of the
//! measured window. The configurations (`--configs`) are the app's `--config` values: `bare`,
//! `one-writer`, `two-pool`, `layer` (the default policy, writer admission included),
//! `layer-no-admission` (the first release's default), `layer-queue` (the first release's
//! recipe: admission off, `ConcurrencyLimitLayer(1)` inside on the write route) and
//! `layer-two-pool` (the default policy on the expert's pools: 8 readers, one writer, the
//! handler's deferred `BEGIN` unchanged). The app's `immediate` and `layer-write` are accepted
//! too, but run only when `--configs` names them (`loadtest/src/bin/writepath.rs` measures them).
//!
//! **Client.** A closed loop, like `wrk`: `--connections` HTTP/1.1 keep-alive connections
//! (hyper's client connection, one task each, all connected before the clock starts), each
//! sending its next request as soon as the previous answer is read. `--warmup` seconds first,
//! then the measured window of `--duration` seconds; requests are counted by the time their
//! answer arrived. Then every connection finishes its request in flight (nothing is cut off),
//! the server is stopped gracefully, and for the loads that write, the database is checked
//! against the answers: every `201` has its row (by its unique name), no row lacks one, none is
//! there twice. The client runs in this process on `--client-threads` tokio threads (1: the
//! machine has 2 cores for client and server); its own CPU time is reported too.
//!
//! **Loads** (`--loads`):
//!
//! | load | requests | connections | configurations | reference |
//! |---|---|---|---|---|
//! | `writes` | `POST /items` (a deferred read-then-write unless the configuration says `BEGIN IMMEDIATE`) | `--connections` (64, 256, 1024) | all | `one-writer` |
//! | `mixed` | `--write-ratio` (0.7) `POST /items`, the rest `GET /items/{id}` | `--mixed-connections` (256) | all | `two-pool` |
//! | `reads` | `GET /items/{id}` over `--seed-rows` items | `--reads-connections` (64) | `bare`, `bare` again (A/A control), the layer ones | `bare` |
//! | `insert1k` | `POST /items` with a 1 KiB body, one connection (no contention: what the layer costs per insert) | `--insert-connections` (1) | as `reads` | `bare` |
//!
//! **Rounds.** `--rounds` (5) rounds; every round runs every cell once, the configurations of
//! each load and connection count one after the other, their order rotated every round. Per
//! cell: goodput (2xx answers per second of the window), failures (non-2xx answers and
//! transport errors, over the whole cell), p50/p99/max latency over all requests answered in
//! the window (failed ones included; for `mixed` also writes' and reads' p99), server CPU per
//! request (µs of CPU / requests answered in the window), the client's CPU per request, and the
//! layer's replays (from `GET /stats`). The tables give the median over the rounds with the
//! min–max spread, and the ratios to the load's reference configuration as the **median of the
//! per-round ratios** (each ratio paired within its round).
//!
//! `--rate R` paces the `reads` and `insert1k` loads at R requests per second in all instead
//! of a closed loop: every configuration then serves the same rate, and its CPU per request is
//! not skewed by throughput (at a higher rate more requests share each thread wake-up, so a
//! closed loop's CPU per request follows whatever slowed a cell down).
//!
//! Other flags: `--pool-size N` (8), `--server-log FILTER` (the server's log filter, default
//! `info,tower_sqlite_retry=error`: the app's own default with the per-replay WARN lines off;
//! the server's log goes to a file in the cell's temporary directory), `--out DIR`
//! (`benches/results/realclient`; `realclient.json`, `realclient.md`, `realclient.svg`: goodput
//! and p99 of the `writes` load against connections), `--replot DIR` (only redraw the chart
//! from `DIR/realclient.json`). `--help` lists them all.
//!
//! Open files: the client needs one per connection, the server as many; the bench raises its
//! soft `RLIMIT_NOFILE` (inherited by the servers) to what the largest cell needs and stops
//! with a message if the hard limit is lower. Linux only (`/proc`).
//!
//! Run by `cargo test --benches` (no `--bench` flag), it does a tiny smoke run (4 connections,
//! a fraction of a second per cell) that checks the harness and integrity, and writes nothing.

#[allow(dead_code)]
#[path = "../../../examples/common/app_lib.rs"]
mod app_lib;
#[path = "../chart.rs"]
mod chart;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::{Deserialize, Serialize};
use tokio::net::TcpStream;

use app_lib::{Config, Db, open_pool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_SERVER_LOG: &str = "info,tower_sqlite_retry=error";

// ---------------------------------------------------------------------------------------------
// Command line

/// Real-client benchmark: the example app's configurations (the layer, and what an expert would
/// configure instead) side by side, each server in its own process, interleaved rounds.
#[derive(Debug, Parser)]
#[command(name = "realclient")]
struct Args {
    /// A tiny run that checks the harness end to end and writes nothing (CI's
    /// `cargo run -p tower-sqlite-retry-loadtest --bin ... -- --smoke`).
    #[arg(long)]
    smoke: bool,
    /// Internal: serve this configuration of the example app (the bench's server process).
    #[arg(long, hide = true, value_name = "CONFIG")]
    serve: Option<Config>,
    /// Internal, with --serve: the SQLite file.
    #[arg(long, hide = true, value_name = "PATH")]
    db: Option<PathBuf>,

    /// A smoke run: 1 round, 64 connections, 1 s cells (≈ 1 min), results to
    /// target/bench-results/realclient unless --out says otherwise.
    #[arg(long)]
    quick: bool,
    /// The configurations to compare (the example app's --config values) [default: all but
    /// immediate and layer-write].
    #[arg(long, value_enum, value_delimiter = ',', value_name = "LIST")]
    configs: Vec<Config>,
    /// The loads to run.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "writes,mixed,reads,insert1k"
    )]
    loads: Vec<Load>,
    /// Connection counts of the `writes` load.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "64,256,1024"
    )]
    connections: Vec<usize>,
    /// Connection counts of the `mixed` load.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "LIST",
        default_value = "256"
    )]
    mixed_connections: Vec<usize>,
    /// Connection counts of the `reads` load.
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "64")]
    reads_connections: Vec<usize>,
    /// Connection counts of the `insert1k` load (1: no contention, even without the layer).
    #[arg(long, value_delimiter = ',', value_name = "LIST", default_value = "1")]
    insert_connections: Vec<usize>,
    /// The `reads` and `insert1k` loads at this many requests per second in all (each
    /// connection paced at its share) instead of a closed loop: every configuration then
    /// serves the same rate, so its CPU per request is not skewed by how many requests share a
    /// wake-up. 0: closed loop. Latency is then measured from the send, not from the schedule.
    #[arg(long, value_name = "REQ/S", default_value_t = 0.0)]
    rate: f64,
    /// The share of POST /items in the `mixed` load (the rest: GET /items/{id}).
    #[arg(long, value_name = "0..1", default_value_t = 0.7)]
    write_ratio: f64,
    /// The measured window of every cell, in seconds.
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    duration: f64,
    /// Seconds of load before the window (not counted).
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    warmup: f64,
    /// Rounds: every round runs every cell once, the configurations' order rotated.
    #[arg(long, value_name = "N", default_value_t = 5)]
    rounds: usize,
    /// The servers' pool (the readers' pool of two-pool; one-writer has 1).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pool_size: u32,
    /// Items in the database before a `reads` or `mixed` cell starts (GETs pick one at random).
    #[arg(long, value_name = "N", default_value_t = 1000)]
    seed_rows: u32,
    /// The client's tokio worker threads.
    #[arg(long, value_name = "N", default_value_t = 1)]
    client_threads: usize,
    /// The servers' log filter (their log goes to a file in the cell's temporary directory).
    #[arg(long, value_name = "FILTER", default_value = DEFAULT_SERVER_LOG)]
    server_log: String,
    /// Where to write realclient.{json,md,svg} [default: benches/results/realclient].
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Only redraw DIR/realclient.svg from DIR/realclient.json.
    #[arg(long, value_name = "DIR")]
    replot: Option<PathBuf>,
}

/// What the clients send.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ValueEnum, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
enum Load {
    /// POST /items only (the read-then-write transaction), against one-writer.
    Writes,
    /// --write-ratio POST /items, the rest GET /items/{id}, against two-pool.
    Mixed,
    /// GET /items/{id} only, layer against bare and an A/A control (bare twice).
    Reads,
    /// POST /items with a 1 KiB body over --insert-connections (1), layer against bare.
    Insert1k,
}

impl Load {
    fn key(self) -> &'static str {
        match self {
            Self::Writes => "writes",
            Self::Mixed => "mixed",
            Self::Reads => "reads",
            Self::Insert1k => "insert1k",
        }
    }

    fn reference(self) -> &'static str {
        match self {
            Self::Writes => "one-writer",
            Self::Mixed => "two-pool",
            Self::Reads | Self::Insert1k => "bare",
        }
    }

    fn writes(self) -> bool {
        self != Self::Reads
    }

    fn seeded(self) -> bool {
        matches!(self, Self::Reads | Self::Mixed)
    }

    fn describe(self, write_ratio: f64) -> String {
        match self {
            Self::Writes => "POST /items only".into(),
            Self::Mixed => format!(
                "{:.0} % POST /items, {:.0} % GET /items/{{id}}",
                write_ratio * 100.0,
                (1.0 - write_ratio) * 100.0
            ),
            Self::Reads => "GET /items/{id} only".into(),
            Self::Insert1k => "POST /items with a 1 KiB body".into(),
        }
    }
}

/// One configuration in a cell: the app's `--config`, and a label (`bare-aa` is `bare` run a
/// second time, the A/A control).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Variant {
    label: String,
    config: Config,
}

impl Variant {
    fn of(config: Config) -> Self {
        Self {
            label: config.key().to_string(),
            config,
        }
    }
}

#[derive(Debug, Clone)]
struct Plan {
    configs: Vec<Config>,
    loads: Vec<Load>,
    connections: BTreeMap<Load, Vec<usize>>,
    write_ratio: f64,
    /// `--rate`, for `reads` and `insert1k`; `None`: closed loop.
    rate: Option<f64>,
    duration: Duration,
    warmup: Duration,
    rounds: usize,
    pool_size: u32,
    seed_rows: u32,
    client_threads: usize,
    server_log: String,
    out: Option<PathBuf>,
    smoke: bool,
}

impl Plan {
    fn from_args(a: &Args) -> Result<Self, String> {
        let configs = if a.configs.is_empty() {
            // The set BENCHMARKS.md's tables were measured on; `immediate` and `layer-write`
            // only when asked for.
            Config::ALL
                .into_iter()
                .filter(|c| !matches!(c, Config::Immediate | Config::LayerWrite))
                .collect()
        } else {
            let mut v = a.configs.clone();
            v.sort();
            v.dedup();
            v
        };
        if !(0.0..=1.0).contains(&a.write_ratio) {
            return Err("--write-ratio must be within 0..1".into());
        }
        if a.rounds == 0 || a.client_threads == 0 || a.pool_size == 0 {
            return Err("--rounds, --client-threads and --pool-size must be at least 1".into());
        }
        if !(a.rate >= 0.0 && a.rate.is_finite()) {
            return Err("--rate must be 0 (closed loop) or a positive rate".into());
        }
        if !(a.duration > 0.0 && a.warmup >= 0.0) {
            return Err("--duration must be positive and --warmup not negative".into());
        }
        let mut plan = Self {
            configs,
            loads: a.loads.clone(),
            connections: BTreeMap::from([
                (Load::Writes, a.connections.clone()),
                (Load::Mixed, a.mixed_connections.clone()),
                (Load::Reads, a.reads_connections.clone()),
                (Load::Insert1k, a.insert_connections.clone()),
            ]),
            write_ratio: a.write_ratio,
            rate: (a.rate > 0.0).then_some(a.rate),
            duration: Duration::from_secs_f64(a.duration),
            warmup: Duration::from_secs_f64(a.warmup),
            rounds: a.rounds,
            pool_size: a.pool_size,
            seed_rows: a.seed_rows.max(1),
            client_threads: a.client_threads,
            server_log: a.server_log.clone(),
            out: Some(
                a.out
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("benches/results/realclient")),
            ),
            smoke: false,
        };
        if a.quick {
            plan.rounds = 1;
            plan.duration = Duration::from_secs(1);
            plan.warmup = Duration::from_millis(300);
            plan.connections.insert(Load::Writes, vec![64]);
            plan.connections.insert(Load::Mixed, vec![64]);
            if a.out.is_none() {
                plan.out = Some(PathBuf::from("target/bench-results/realclient"));
            }
        }
        if a.smoke {
            // `--smoke`: checks the harness end to end, writes nothing.
            plan.configs = vec![Config::Bare, Config::OneWriter, Config::Layer];
            plan.loads = vec![Load::Writes, Load::Reads];
            plan.connections = BTreeMap::from([(Load::Writes, vec![4]), (Load::Reads, vec![4])]);
            plan.duration = Duration::from_millis(300);
            plan.warmup = Duration::from_millis(100);
            plan.rounds = 1;
            plan.seed_rows = 50;
            // The reads paced (the open-loop path), the writes in a closed loop.
            plan.rate = Some(400.0);
            plan.out = None;
            plan.smoke = true;
        }
        for load in &plan.loads {
            if plan
                .connections
                .get(load)
                .is_none_or(|c| c.is_empty() || c.contains(&0))
            {
                return Err(format!(
                    "{}: connection counts must be at least 1",
                    load.key()
                ));
            }
        }
        Ok(plan)
    }

    /// The configurations a load runs, in report order.
    fn variants(&self, load: Load) -> Vec<Variant> {
        match load {
            Load::Writes | Load::Mixed => self.configs.iter().copied().map(Variant::of).collect(),
            Load::Reads | Load::Insert1k => {
                let mut v = vec![
                    Variant::of(Config::Bare),
                    Variant {
                        label: "bare-aa".into(),
                        config: Config::Bare,
                    },
                ];
                v.extend(
                    self.configs
                        .iter()
                        .filter(|c| matches!(c, Config::Layer | Config::LayerNoAdmission))
                        .copied()
                        .map(Variant::of),
                );
                v
            }
        }
    }

    fn max_connections(&self) -> usize {
        self.loads
            .iter()
            .flat_map(|l| self.connections[l].iter().copied())
            .max()
            .unwrap_or(1)
    }
}

// ---------------------------------------------------------------------------------------------
// The server process

/// `--serve CONFIG --db PATH`: the example app in that configuration on `127.0.0.1:0`. Prints
/// `listening ADDR` on stdout, serves until its stdin closes, then stops gracefully.
fn serve(config: Config, db_path: &Path, pool_size: u32, log: &str) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(log))
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let served = rt.block_on(async move {
        let db = config.open(db_path, pool_size, BUSY_TIMEOUT).await?;
        let (app, _metrics) = config.router(db.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        println!("listening {}", listener.local_addr()?);
        tracing::info!(
            config = config.key(),
            setup = %config.describe(pool_size),
            "serving"
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                // The bench closes our stdin to stop us (and so does its exit).
                let _ = tokio::task::spawn_blocking(|| {
                    let mut sink = Vec::new();
                    let _ = std::io::stdin().read_to_end(&mut sink);
                })
                .await;
            })
            .await?;
        db.close().await;
        Ok::<(), BoxError>(())
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("realclient --serve {}: {e}", config.key());
            ExitCode::FAILURE
        }
    }
}

/// A server process of one cell.
struct Server {
    child: Child,
    addr: String,
    pid: u32,
    log: PathBuf,
}

impl Server {
    fn start(plan: &Plan, config: Config, db: &Path, dir: &Path) -> Result<Self, BoxError> {
        let log = dir.join("server.log");
        let mut child = Command::new(std::env::current_exe()?)
            .arg("--serve")
            .arg(config.key())
            .arg("--db")
            .arg(db)
            .arg("--pool-size")
            .arg(plan.pool_size.to_string())
            .arg("--server-log")
            .arg(&plan.server_log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let mut line = String::new();
        let stdout = child.stdout.take().expect("piped");
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(addr) = line.trim().strip_prefix("listening ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "the {} server did not start: {}",
                config.key(),
                std::fs::read_to_string(&log).unwrap_or_default().trim()
            )
            .into());
        };
        Ok(Self {
            pid: child.id(),
            addr: addr.to_string(),
            child,
            log,
        })
    }

    /// Closes its stdin (a graceful stop), waits up to 20 s, then kills it.
    fn stop(mut self) -> Result<(), BoxError> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    return Err(format!(
                        "server exited with {status}: {}",
                        std::fs::read_to_string(&self.log)
                            .unwrap_or_default()
                            .trim()
                    )
                    .into());
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err("server did not stop within 20 s; killed".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// CPU time (user + system) of a process so far, in clock ticks.
fn cpu_ticks(pid: &str) -> Result<u64, BoxError> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14,
    // stime 15.
    let rest = &stat[stat.rfind(')').ok_or("malformed /proc stat")? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11).ok_or("short /proc stat")?.parse()?;
    let stime: u64 = fields.get(12).ok_or("short /proc stat")?.parse()?;
    Ok(utime + stime)
}

fn clock_ticks_per_s() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// Makes sure this process (and the servers it starts) may open `need` files.
fn ensure_open_files(need: u64) -> Result<(), String> {
    let (soft, hard) = rlimit::Resource::NOFILE
        .get()
        .map_err(|e| format!("reading RLIMIT_NOFILE: {e}"))?;
    if soft >= need {
        return Ok(());
    }
    if hard < need {
        return Err(format!(
            "{need} open files needed (the largest cell's connections, client and server side, \
             plus room), but the hard limit is {hard}: raise it (`ulimit -Hn {need}` as root, or \
             `nofile` in /etc/security/limits.conf) or pass fewer --connections"
        ));
    }
    rlimit::Resource::NOFILE
        .set(need, hard)
        .map_err(|e| format!("raising RLIMIT_NOFILE from {soft} to {need}: {e}"))
}

// ---------------------------------------------------------------------------------------------
// The client

/// What one request ended with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Status(u16),
    Transport,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    /// When the answer came, since the start of the cell.
    done_us: u64,
    latency_us: u32,
    write: bool,
    outcome: Outcome,
}

/// What one connection's task measured.
#[derive(Default)]
struct ConnReport {
    samples: Vec<Sample>,
    /// `POST /items` answered 201: the request numbers (the item's name is `c{conn}-{n}`).
    created: Vec<u32>,
    /// Connections that had to be made again after a transport error.
    reconnects: u32,
}

struct Timing {
    start: Instant,
    end: Instant,
}

async fn connect(addr: &str) -> Result<SendRequest<Full<Bytes>>, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(sender)
}

/// xorshift64*: the client's choices (which item to read, write or read), cheap and seeded.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

struct Workload {
    load: Load,
    write_ratio: f64,
    seed_rows: u32,
    addr: String,
    /// Each connection's interval between two sends; `None`: closed loop.
    pace: Option<Duration>,
}

impl Workload {
    fn request(&self, conn: usize, n: u32, rng: &mut Rng) -> (bool, Request<Full<Bytes>>) {
        let write = match self.load {
            Load::Writes | Load::Insert1k => true,
            Load::Reads => false,
            Load::Mixed => rng.unit() < self.write_ratio,
        };
        let req = if write {
            let mut body = format!("{{\"name\":\"c{conn}-{n}\"");
            if self.load == Load::Insert1k {
                // Padding the handler ignores, to 1 KiB in all.
                let pad = 1024usize.saturating_sub(body.len() + 11);
                body.push_str(",\"pad\":\"");
                body.push_str(&"x".repeat(pad));
                body.push('"');
            }
            body.push('}');
            Request::builder()
                .method(Method::POST)
                .uri("/items")
                .header(hyper::header::HOST, &self.addr)
                .header(hyper::header::CONTENT_TYPE, "application/json")
                .body(Full::new(Bytes::from(body)))
        } else {
            let id = 1 + rng.next() % u64::from(self.seed_rows);
            Request::builder()
                .uri(format!("/items/{id}"))
                .header(hyper::header::HOST, &self.addr)
                .body(Full::new(Bytes::new()))
        };
        (write, req.expect("valid request"))
    }
}

/// One connection's closed loop until `timing.end`; the request in flight then is finished.
async fn drive(
    conn: usize,
    mut sender: SendRequest<Full<Bytes>>,
    work: std::sync::Arc<Workload>,
    timing: std::sync::Arc<Timing>,
) -> ConnReport {
    let mut report = ConnReport::default();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (conn as u64 + 1).wrapping_mul(0x1000_0000_01B3));
    let mut n = 0u32;
    let mut broken = false;
    // Paced: connection `conn` starts at its own offset within the interval, so the sends of
    // all connections spread evenly.
    let mut next = work.pace.map(|p| timing.start + p.mul_f64(rng.unit()));
    while Instant::now() < timing.end {
        if let (Some(at), Some(pace)) = (next.as_mut(), work.pace) {
            tokio::time::sleep_until((*at).into()).await;
            *at += pace;
            if Instant::now() >= timing.end {
                break;
            }
        }
        if broken {
            match connect(&work.addr).await {
                Ok(s) => {
                    sender = s;
                    broken = false;
                    report.reconnects += 1;
                }
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        n += 1;
        let (write, req) = work.request(conn, n, &mut rng);
        let sent = Instant::now();
        let outcome = match sender.ready().await {
            Err(_) => Outcome::Transport,
            Ok(()) => match sender.send_request(req).await {
                Err(_) => Outcome::Transport,
                Ok(res) => {
                    let status = res.status();
                    match res.into_body().collect().await {
                        Err(_) => Outcome::Transport,
                        Ok(_) if status.is_success() => Outcome::Ok,
                        Ok(_) => Outcome::Status(status.as_u16()),
                    }
                }
            },
        };
        let now = Instant::now();
        if outcome == Outcome::Transport {
            broken = true;
        }
        if write && outcome == Outcome::Ok {
            report.created.push(n);
        }
        report.samples.push(Sample {
            done_us: now.duration_since(timing.start).as_micros() as u64,
            latency_us: now
                .duration_since(sent)
                .as_micros()
                .min(u128::from(u32::MAX)) as u32,
            write,
            outcome,
        });
    }
    report
}

// ---------------------------------------------------------------------------------------------
// One cell

/// Latency percentiles (nearest rank) in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Latency {
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
}

impl Latency {
    fn of(mut us: Vec<u32>) -> Self {
        if us.is_empty() {
            return Self::default();
        }
        us.sort_unstable();
        let rank = |p: f64| {
            let i = ((p * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1;
            f64::from(us[i]) / 1000.0
        };
        Self {
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            max_ms: f64::from(*us.last().expect("non-empty")) / 1000.0,
        }
    }
}

/// The database against the answers.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Integrity {
    /// Items the run inserted (seed rows excluded).
    rows: u64,
    /// `201 Created` answers.
    acknowledged: u64,
    /// Answered 201, no row.
    lost: u64,
    /// A row, no 201 (a request that failed after its commit).
    unacknowledged: u64,
    /// Names present more than once.
    doubled: u64,
    ok: bool,
}

/// One cell of one round.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Cell {
    round: usize,
    /// Position within its group in this round (0 = first).
    order: usize,
    load: Load,
    connections: usize,
    config: String,
    window_s: f64,
    /// Answered within the window.
    requests: u64,
    ok: u64,
    goodput_per_s: f64,
    /// Non-2xx answers and transport errors over the whole cell (warm-up and drain included).
    failures: u64,
    transport_errors: u64,
    reconnects: u64,
    /// Statuses other than 2xx, whole cell.
    statuses: BTreeMap<u16, u64>,
    latency: Latency,
    write_latency: Latency,
    read_latency: Latency,
    server_cpu_s: f64,
    server_cpu_us_per_req: f64,
    /// Server CPU (cores busy) over the window.
    server_cores: f64,
    client_cpu_us_per_req: f64,
    client_cores: f64,
    /// Replays made by the layers (`GET /stats`), whole cell; `None` without the layer.
    retries: Option<u64>,
    /// Requests the layers gave up on.
    gave_up: Option<u64>,
    integrity: Option<Integrity>,
}

fn seed(db: &Path, rows: u32) -> impl Future<Output = Result<(), BoxError>> {
    let db = db.to_path_buf();
    async move {
        let pool = open_pool(&db, 1, BUSY_TIMEOUT).await?;
        let mut tx = pool.begin().await?;
        for i in 1..=i64::from(rows) {
            sqlx::query("INSERT INTO items (seq, name) VALUES (?, ?)")
                .bind(i)
                .bind(format!("seed-{i}"))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        pool.close().await;
        Ok(())
    }
}

struct CellSpec<'a> {
    round: usize,
    order: usize,
    load: Load,
    connections: usize,
    variant: &'a Variant,
}

async fn run_cell(plan: &Plan, spec: &CellSpec<'_>, ticks_per_s: f64) -> Result<Cell, BoxError> {
    let dir = tempfile::tempdir()?;
    let db_path = dir.path().join("items.db");
    if spec.load.seeded() {
        seed(&db_path, plan.seed_rows).await?;
    }
    let server = Server::start(plan, spec.variant.config, &db_path, dir.path())?;
    let server_pid = server.pid.to_string();
    let work = std::sync::Arc::new(Workload {
        load: spec.load,
        write_ratio: plan.write_ratio,
        seed_rows: plan.seed_rows,
        addr: server.addr.clone(),
        pace: match (spec.load, plan.rate) {
            (Load::Reads | Load::Insert1k, Some(rate)) => {
                Some(Duration::from_secs_f64(spec.connections as f64 / rate))
            }
            _ => None,
        },
    });

    // Every connection made before the clock starts (64 handshakes at a time: the listen
    // backlog never overflows).
    let mut senders = Vec::with_capacity(spec.connections);
    for chunk in (0..spec.connections).collect::<Vec<_>>().chunks(64) {
        let made = futures::future::join_all(chunk.iter().map(|_| connect(&server.addr))).await;
        for s in made {
            senders.push(s.map_err(|e| format!("connecting to the server: {e}"))?);
        }
    }

    let start = Instant::now();
    let window_start = start + plan.warmup;
    let timing = std::sync::Arc::new(Timing {
        start,
        end: window_start + plan.duration,
    });
    let tasks: Vec<_> = senders
        .into_iter()
        .enumerate()
        .map(|(c, s)| tokio::spawn(drive(c, s, work.clone(), timing.clone())))
        .collect();
    tokio::time::sleep_until(window_start.into()).await;
    let (server0, client0, t0) = (cpu_ticks(&server_pid)?, cpu_ticks("self")?, Instant::now());
    tokio::time::sleep_until(timing.end.into()).await;
    let (server1, client1, t1) = (cpu_ticks(&server_pid)?, cpu_ticks("self")?, Instant::now());
    let mut reports = Vec::with_capacity(tasks.len());
    for t in tasks {
        reports.push(t.await?);
    }

    // The layers' counters, before the server stops.
    let (retries, gave_up) = match stats(&server.addr).await {
        Some(v) if v["retry"] == true => (
            v["retries"].as_u64(),
            ["exhausted", "deadline", "budget_exhausted"]
                .iter()
                .map(|k| v["router_layer"]["outcomes"][k].as_u64())
                .sum::<Option<u64>>(),
        ),
        _ => (None, None),
    };
    server.stop()?;

    let from_us = window_start.duration_since(start).as_micros() as u64;
    let to_us = timing.end.duration_since(start).as_micros() as u64;
    let in_window = |s: &&Sample| s.done_us >= from_us && s.done_us < to_us;
    let window_s = t1.duration_since(t0).as_secs_f64();
    let all = reports.iter().flat_map(|r| r.samples.iter());
    let window: Vec<Sample> = all.clone().filter(in_window).copied().collect();
    let requests = window.len() as u64;
    let ok = window.iter().filter(|s| s.outcome == Outcome::Ok).count() as u64;
    let mut statuses = BTreeMap::new();
    let (mut failures, mut transport_errors) = (0, 0);
    for s in all {
        match s.outcome {
            Outcome::Ok => {}
            Outcome::Status(code) => {
                failures += 1;
                *statuses.entry(code).or_insert(0) += 1;
            }
            Outcome::Transport => {
                failures += 1;
                transport_errors += 1;
            }
        }
    }
    let lat = |f: &dyn Fn(&Sample) -> bool| {
        Latency::of(
            window
                .iter()
                .filter(|s| f(s))
                .map(|s| s.latency_us)
                .collect(),
        )
    };
    let server_cpu_s = (server1 - server0) as f64 / ticks_per_s;
    let client_cpu_s = (client1 - client0) as f64 / ticks_per_s;
    let per_req = |cpu_s: f64| cpu_s * 1e6 / requests.max(1) as f64;

    let integrity = if spec.load.writes() {
        Some(integrity(&db_path, &reports).await?)
    } else {
        None
    };
    Ok(Cell {
        round: spec.round,
        order: spec.order,
        load: spec.load,
        connections: spec.connections,
        config: spec.variant.label.clone(),
        window_s,
        requests,
        ok,
        goodput_per_s: ok as f64 / window_s,
        failures,
        transport_errors,
        reconnects: reports.iter().map(|r| u64::from(r.reconnects)).sum(),
        statuses,
        latency: lat(&|_| true),
        write_latency: lat(&|s| s.write),
        read_latency: lat(&|s| !s.write),
        server_cpu_s,
        server_cpu_us_per_req: per_req(server_cpu_s),
        server_cores: server_cpu_s / window_s,
        client_cpu_us_per_req: per_req(client_cpu_s),
        client_cores: client_cpu_s / window_s,
        retries,
        gave_up,
        integrity,
    })
}

/// `GET /stats` on a fresh connection.
async fn stats(addr: &str) -> Option<serde_json::Value> {
    let mut sender = connect(addr).await.ok()?;
    let req = Request::get("/stats")
        .header(hyper::header::HOST, addr)
        .body(Full::new(Bytes::new()))
        .ok()?;
    let res = sender.send_request(req).await.ok()?;
    let body = res.into_body().collect().await.ok()?.to_bytes();
    serde_json::from_slice(&body).ok()
}

/// Every `201` has its row, every row its `201`, none twice.
async fn integrity(db: &Path, reports: &[ConnReport]) -> Result<Integrity, BoxError> {
    let pool = open_pool(db, 1, BUSY_TIMEOUT).await?;
    let items = Db::from(&pool).all_items().await?;
    pool.close().await;
    let mut rows: HashMap<String, u64> = HashMap::new();
    for item in items.into_iter().filter(|i| !i.name.starts_with("seed-")) {
        *rows.entry(item.name).or_insert(0) += 1;
    }
    let acked: HashSet<String> = reports
        .iter()
        .enumerate()
        .flat_map(|(c, r)| r.created.iter().map(move |n| format!("c{c}-{n}")))
        .collect();
    let lost = acked.iter().filter(|n| !rows.contains_key(*n)).count() as u64;
    let unacknowledged = rows.keys().filter(|n| !acked.contains(*n)).count() as u64;
    let doubled = rows.values().filter(|&&k| k > 1).count() as u64;
    Ok(Integrity {
        rows: rows.values().sum(),
        acknowledged: acked.len() as u64,
        lost,
        unacknowledged,
        doubled,
        ok: lost == 0 && unacknowledged == 0 && doubled == 0,
    })
}

// ---------------------------------------------------------------------------------------------
// Summaries

/// A median with its spread over the rounds.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
struct Spread {
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            (v[mid - 1] + v[mid]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[v.len() - 1],
        })
    }
}

/// One configuration at one load and connection count, over the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Summary {
    load: Load,
    connections: usize,
    config: String,
    rounds: usize,
    goodput_per_s: Option<Spread>,
    p50_ms: Option<Spread>,
    p99_ms: Option<Spread>,
    write_p99_ms: Option<Spread>,
    read_p99_ms: Option<Spread>,
    server_cpu_us_per_req: Option<Spread>,
    client_cpu_us_per_req: Option<Spread>,
    server_cores: Option<Spread>,
    client_cores: Option<Spread>,
    /// Summed over the rounds.
    failures: u64,
    transport_errors: u64,
    requests_in_windows: u64,
    retries: Option<u64>,
    gave_up: Option<u64>,
    /// Every round's integrity check passed (`None`: a load that does not write).
    integrity_ok: Option<bool>,
    rows: u64,
    acknowledged: u64,
    /// The reference configuration of the load, and the ratios to it: the median (and
    /// spread) of the per-round ratios.
    reference: String,
    vs_ref_goodput: Option<Spread>,
    vs_ref_p99: Option<Spread>,
    vs_ref_write_p99: Option<Spread>,
    vs_ref_read_p99: Option<Spread>,
    vs_ref_server_cpu_per_req: Option<Spread>,
}

fn summarize(cells: &[Cell], plan_order: &[(Load, usize, Vec<String>)]) -> Vec<Summary> {
    let mut out = Vec::new();
    for (load, conns, labels) in plan_order {
        let group: Vec<&Cell> = cells
            .iter()
            .filter(|c| c.load == *load && c.connections == *conns)
            .collect();
        let reference = load.reference().to_string();
        let of = |label: &str| -> Vec<&Cell> {
            group
                .iter()
                .copied()
                .filter(|c| c.config == label)
                .collect()
        };
        let refs = of(&reference);
        for label in labels {
            let mine = of(label);
            if mine.is_empty() {
                continue;
            }
            let spread = |f: &dyn Fn(&Cell) -> f64| Spread::of(mine.iter().map(|c| f(c)));
            let ratio = |f: &dyn Fn(&Cell) -> f64| {
                Spread::of(mine.iter().filter_map(|c| {
                    let r = refs.iter().find(|r| r.round == c.round)?;
                    Some(f(c) / f(r))
                }))
            };
            let has_writes = *load != Load::Reads;
            let has_reads = matches!(load, Load::Reads | Load::Mixed);
            let layer = mine.iter().any(|c| c.retries.is_some());
            out.push(Summary {
                load: *load,
                connections: *conns,
                config: label.clone(),
                rounds: mine.len(),
                goodput_per_s: spread(&|c| c.goodput_per_s),
                p50_ms: spread(&|c| c.latency.p50_ms),
                p99_ms: spread(&|c| c.latency.p99_ms),
                write_p99_ms: has_writes
                    .then(|| spread(&|c| c.write_latency.p99_ms))
                    .flatten(),
                read_p99_ms: has_reads
                    .then(|| spread(&|c| c.read_latency.p99_ms))
                    .flatten(),
                server_cpu_us_per_req: spread(&|c| c.server_cpu_us_per_req),
                client_cpu_us_per_req: spread(&|c| c.client_cpu_us_per_req),
                server_cores: spread(&|c| c.server_cores),
                client_cores: spread(&|c| c.client_cores),
                failures: mine.iter().map(|c| c.failures).sum(),
                transport_errors: mine.iter().map(|c| c.transport_errors).sum(),
                requests_in_windows: mine.iter().map(|c| c.requests).sum(),
                retries: layer.then(|| mine.iter().filter_map(|c| c.retries).sum()),
                gave_up: layer.then(|| mine.iter().filter_map(|c| c.gave_up).sum()),
                integrity_ok: load.writes().then(|| {
                    mine.iter()
                        .all(|c| c.integrity.as_ref().is_some_and(|i| i.ok))
                }),
                rows: mine
                    .iter()
                    .filter_map(|c| c.integrity.as_ref().map(|i| i.rows))
                    .sum(),
                acknowledged: mine
                    .iter()
                    .filter_map(|c| c.integrity.as_ref().map(|i| i.acknowledged))
                    .sum(),
                vs_ref_goodput: ratio(&|c| c.goodput_per_s),
                vs_ref_p99: ratio(&|c| c.latency.p99_ms),
                vs_ref_write_p99: has_writes
                    .then(|| ratio(&|c| c.write_latency.p99_ms))
                    .flatten(),
                vs_ref_read_p99: has_reads
                    .then(|| ratio(&|c| c.read_latency.p99_ms))
                    .flatten(),
                vs_ref_server_cpu_per_req: ratio(&|c| c.server_cpu_us_per_req),
                reference: reference.clone(),
            });
        }
    }
    out
}

fn fmt_num(s: Option<Spread>, decimals: usize) -> String {
    s.map_or("–".into(), |s| format!("{:.*}", decimals, s.median))
}

fn fmt_spread(s: Option<Spread>, decimals: usize) -> String {
    s.map_or("–".into(), |s| {
        format!(
            "{:.d$} ({:.d$}–{:.d$})",
            s.median,
            s.min,
            s.max,
            d = decimals
        )
    })
}

fn fmt_ratio(s: Option<Spread>) -> String {
    s.map_or("–".into(), |s| {
        format!("**{:.2}×** ({:.2}–{:.2})", s.median, s.min, s.max)
    })
}

fn markdown(meta: &serde_json::Value, summaries: &[Summary], write_ratio: f64) -> String {
    let mut md = String::new();
    let _ = writeln!(md, "# Real client: the expert configurations\n");
    let _ = writeln!(
        md,
        "```text\n{}\n```\n",
        meta["command"].as_str().unwrap_or("")
    );
    let _ = writeln!(
        md,
        "{} round(s); per cell {} s warm-up + {} s measured; server pool {}; client: {} tokio \
         thread(s) in the bench process; {} cores; load average {} at the start, {} at the end; \
         commit {}. Medians over the rounds (min–max); ratios: median of the per-round ratios to \
         the load's reference (min–max). Failures: non-2xx and transport errors, whole cells, \
         all rounds. CPU per request: µs of CPU time (user + system, `/proc`) over the window / \
         requests answered in it.\n",
        meta["rounds"],
        meta["warmup_s"],
        meta["duration_s"],
        meta["pool_size"],
        meta["client_threads"],
        meta["cores"],
        meta["loadavg_start"].as_str().unwrap_or("?"),
        meta["loadavg_end"].as_str().unwrap_or("?"),
        meta["commit"].as_str().unwrap_or("?"),
    );
    if let Some(rate) = meta["rate"].as_f64() {
        let _ = writeln!(
            md,
            "`reads` and `insert1k` paced at {rate:.0} requests/s in all (open loop; latency \
             from the send).\n"
        );
    }
    let mut groups: Vec<(Load, usize)> =
        summaries.iter().map(|s| (s.load, s.connections)).collect();
    groups.dedup();
    for (load, conns) in groups {
        let rows: Vec<&Summary> = summaries
            .iter()
            .filter(|s| s.load == load && s.connections == conns)
            .collect();
        let _ = writeln!(
            md,
            "## {}: {}, {conns} connection(s); reference `{}`\n",
            load.key(),
            load.describe(write_ratio),
            load.reference()
        );
        match load {
            Load::Writes | Load::Mixed => {
                let mixed = load == Load::Mixed;
                let _ = writeln!(
                    md,
                    "| config | goodput/s | goodput × ref | p50 ms | p99 ms | p99 × ref |{} failures | replays | server CPU µs/req | client CPU µs/req | server + client cores | rows = 201s |",
                    if mixed {
                        " writes p99 ms | reads p99 ms | reads p99 × ref |"
                    } else {
                        ""
                    }
                );
                let _ = writeln!(
                    md,
                    "|---|---|---|---|---|---|{}---|---|---|---|---|---|",
                    if mixed { "---|---|---|" } else { "" }
                );
                for s in rows {
                    let mixed_cols = if mixed {
                        format!(
                            " {} | {} | {} |",
                            fmt_num(s.write_p99_ms, 1),
                            fmt_num(s.read_p99_ms, 1),
                            fmt_ratio(s.vs_ref_read_p99)
                        )
                    } else {
                        String::new()
                    };
                    let _ = writeln!(
                        md,
                        "| `{}` | {} | {} | {} | {} | {} |{mixed_cols} {} | {} | {} | {} | {} + {} | {} |",
                        s.config,
                        fmt_spread(s.goodput_per_s, 0),
                        fmt_ratio(s.vs_ref_goodput),
                        fmt_num(s.p50_ms, 1),
                        fmt_spread(s.p99_ms, 1),
                        fmt_ratio(s.vs_ref_p99),
                        s.failures,
                        s.retries.map_or("–".into(), |r| r.to_string()),
                        fmt_num(s.server_cpu_us_per_req, 0),
                        fmt_num(s.client_cpu_us_per_req, 0),
                        fmt_num(s.server_cores, 2),
                        fmt_num(s.client_cores, 2),
                        integrity_cell(s),
                    );
                }
            }
            Load::Reads | Load::Insert1k => {
                let _ = writeln!(
                    md,
                    "| config | server CPU µs/req | server CPU × ref | req/s | p50 ms | p99 ms | failures | client CPU µs/req | server + client cores |{}",
                    if load.writes() { " rows = 201s |" } else { "" }
                );
                let _ = writeln!(
                    md,
                    "|---|---|---|---|---|---|---|---|---|{}",
                    if load.writes() { "---|" } else { "" }
                );
                for s in rows {
                    let _ = writeln!(
                        md,
                        "| `{}` | {} | {} | {} | {} | {} | {} | {} | {} + {} |{}",
                        s.config,
                        fmt_spread(s.server_cpu_us_per_req, 1),
                        fmt_ratio(s.vs_ref_server_cpu_per_req),
                        fmt_num(s.goodput_per_s, 0),
                        fmt_num(s.p50_ms, 2),
                        fmt_num(s.p99_ms, 2),
                        s.failures,
                        fmt_num(s.client_cpu_us_per_req, 1),
                        fmt_num(s.server_cores, 2),
                        fmt_num(s.client_cores, 2),
                        if load.writes() {
                            format!(" {} |", integrity_cell(s))
                        } else {
                            String::new()
                        }
                    );
                }
            }
        }
        let _ = writeln!(md);
    }
    md
}

fn integrity_cell(s: &Summary) -> String {
    match s.integrity_ok {
        None => "–".into(),
        Some(true) => format!("OK ({} = {})", s.rows, s.acknowledged),
        Some(false) => format!("**BROKEN** ({} rows, {} 201s)", s.rows, s.acknowledged),
    }
}

/// Goodput and p99 of the `writes` load against connections, one line per configuration.
fn chart(summaries: &[Summary], path: &Path, title: &str) -> Result<(), BoxError> {
    use plotters::style::{BLACK, Color, Palette, Palette99, RGBColor, ShapeStyle};

    let rows: Vec<&Summary> = summaries
        .iter()
        .filter(|s| s.load == Load::Writes)
        .collect();
    let mut configs: Vec<&str> = Vec::new();
    for s in &rows {
        if !configs.contains(&s.config.as_str()) {
            configs.push(&s.config);
        }
    }
    let style = |i: usize, key: &str| -> ShapeStyle {
        match key {
            "one-writer" => BLACK.stroke_width(3),
            "two-pool" => RGBColor(120, 120, 120).stroke_width(3),
            "layer" => RGBColor(0, 90, 200).stroke_width(3),
            "layer-queue" => RGBColor(0, 160, 120).stroke_width(3),
            "layer-no-admission" => RGBColor(220, 80, 0).stroke_width(3),
            "layer-two-pool" => RGBColor(140, 60, 180).stroke_width(3),
            "bare" => RGBColor(200, 0, 0).stroke_width(2),
            _ => Palette99::pick(i).stroke_width(2),
        }
    };
    let med = |s: Option<Spread>| s.map_or(0.0, |s| s.median);
    let points = |key: &str, f: &dyn Fn(&Summary) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|s| s.config == key)
            .map(|s| (s.connections as f64, f(s)))
            .collect()
    };
    let lines: Vec<chart::Line> = configs
        .iter()
        .enumerate()
        .map(|(i, c)| {
            chart::Line::new(
                c.to_string(),
                style(i, c),
                points(c, &|s| med(s.goodput_per_s)),
                points(c, &|s| med(s.p99_ms)),
            )
        })
        .collect();
    let labels = chart::Labels {
        title,
        clients: "connections",
        goodput_caption: "goodput (201 answers/s, median of rounds)",
    };
    chart::goodput_and_p99(path, &labels, &lines)
}

fn chart_title(meta: &serde_json::Value) -> String {
    format!(
        "POST /items (deferred read-then-write) over loopback HTTP/1.1: {} round(s), {} s cells",
        meta["rounds"], meta["duration_s"]
    )
}

// ---------------------------------------------------------------------------------------------
// Main

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn commit() -> String {
    Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn run(plan: &Plan) -> Result<bool, BoxError> {
    ensure_open_files(2 * plan.max_connections() as u64 + 512)?;
    let ticks_per_s = clock_ticks_per_s();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(plan.client_threads)
        .enable_all()
        .build()?;
    let groups: Vec<(Load, usize, Vec<Variant>)> = plan
        .loads
        .iter()
        .flat_map(|&load| {
            plan.connections[&load]
                .iter()
                .map(move |&c| (load, c, plan.variants(load)))
        })
        .collect();
    let cells_per_round: usize = groups.iter().map(|g| g.2.len()).sum();
    let flags: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let command = if flags.is_empty() {
        "cargo run --release -p tower-sqlite-retry-loadtest --bin realclient".to_string()
    } else {
        format!(
            "cargo run --release -p tower-sqlite-retry-loadtest --bin realclient -- {}",
            flags.join(" ")
        )
    };
    let loadavg_start = loadavg();
    eprintln!(
        "realclient: {} rounds × {cells_per_round} cells, {:.1} s + {:.1} s each{}; configs {}",
        plan.rounds,
        plan.warmup.as_secs_f64(),
        plan.duration.as_secs_f64(),
        if cfg!(debug_assertions) {
            " (debug build: use --release for representative numbers)"
        } else {
            ""
        },
        plan.configs
            .iter()
            .map(|c| c.key())
            .collect::<Vec<_>>()
            .join(",")
    );
    let mut cells = Vec::new();
    for round in 0..plan.rounds {
        for (load, conns, variants) in &groups {
            let n = variants.len();
            for order in 0..n {
                let variant = &variants[(order + round) % n];
                let spec = CellSpec {
                    round,
                    order,
                    load: *load,
                    connections: *conns,
                    variant,
                };
                let cell = rt.block_on(run_cell(plan, &spec, ticks_per_s))?;
                eprintln!(
                    "round {}/{} {:>8} {:>5} conns {:>12}: {:>7.0} ok/s  p99 {:>8.1} ms  fail {:>6}  server {:>6.1} µs/req ({:.2} cores)  client {:>5.1} µs/req{}",
                    round + 1,
                    plan.rounds,
                    load.key(),
                    conns,
                    variant.label,
                    cell.goodput_per_s,
                    cell.latency.p99_ms,
                    cell.failures,
                    cell.server_cpu_us_per_req,
                    cell.server_cores,
                    cell.client_cpu_us_per_req,
                    match &cell.integrity {
                        Some(i) if i.ok => String::new(),
                        Some(i) => format!(
                            "  INTEGRITY BROKEN: {} rows, {} 201s, lost {}, unacknowledged {}, doubled {}",
                            i.rows, i.acknowledged, i.lost, i.unacknowledged, i.doubled
                        ),
                        None => String::new(),
                    }
                );
                cells.push(cell);
            }
        }
    }
    let order: Vec<(Load, usize, Vec<String>)> = groups
        .iter()
        .map(|(l, c, v)| (*l, *c, v.iter().map(|v| v.label.clone()).collect()))
        .collect();
    let summaries = summarize(&cells, &order);
    let intact = cells
        .iter()
        .all(|c| c.integrity.as_ref().is_none_or(|i| i.ok));

    let meta = serde_json::json!({
        "command": command,
        "rounds": plan.rounds,
        "duration_s": plan.duration.as_secs_f64(),
        "warmup_s": plan.warmup.as_secs_f64(),
        "pool_size": plan.pool_size,
        "seed_rows": plan.seed_rows,
        "write_ratio": plan.write_ratio,
        "rate": plan.rate,
        "client_threads": plan.client_threads,
        "server_log": plan.server_log,
        "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
        "loadavg_start": loadavg_start,
        "loadavg_end": loadavg(),
        "commit": commit(),
        "release": !cfg!(debug_assertions),
        "configs": plan.configs.iter().map(|c| serde_json::json!({
            "key": c.key(), "setup": c.describe(plan.pool_size),
        })).collect::<Vec<_>>(),
    });
    let md = markdown(&meta, &summaries, plan.write_ratio);
    if let Some(out) = &plan.out {
        std::fs::create_dir_all(out)?;
        let json = serde_json::json!({ "meta": meta, "summaries": summaries, "cells": cells });
        std::fs::write(
            out.join("realclient.json"),
            serde_json::to_string_pretty(&json)?,
        )?;
        std::fs::write(out.join("realclient.md"), &md)?;
        chart(&summaries, &out.join("realclient.svg"), &chart_title(&meta))?;
        eprintln!(
            "realclient: wrote {}/realclient.{{json,md,svg}}",
            out.display()
        );
    }
    println!("{md}");
    if plan.smoke {
        // The harness works: every cell answered, and nothing was lost or doubled.
        assert!(
            cells.iter().all(|c| c.requests > 0),
            "a cell answered nothing"
        );
        let one_writer_failed = cells
            .iter()
            .filter(|c| c.config == "one-writer")
            .any(|c| c.failures > 0);
        assert!(!one_writer_failed, "one-writer failed requests");
    }
    Ok(intact)
}

fn replot(dir: &Path) -> Result<(), BoxError> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("realclient.json"))?)?;
    let summaries: Vec<Summary> = serde_json::from_value(json["summaries"].clone())?;
    chart(
        &summaries,
        &dir.join("realclient.svg"),
        &chart_title(&json["meta"]),
    )?;
    eprintln!("realclient: redrew {}/realclient.svg", dir.display());
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(config) = args.serve {
        let Some(db) = &args.db else {
            eprintln!("realclient: --serve needs --db");
            return ExitCode::from(2);
        };
        return serve(config, db, args.pool_size, &args.server_log);
    }
    if let Some(dir) = &args.replot {
        return match replot(dir) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("realclient: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let plan = match Plan::from_args(&args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("realclient: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&plan) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("realclient: integrity BROKEN in at least one cell (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("realclient: {e}");
            ExitCode::FAILURE
        }
    }
}
