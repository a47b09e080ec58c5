//! Goodput under write contention: retry strategies against the single-writer limit.
//!
//! ```text
//! cargo run --release -p tower-sqlite-retry-loadtest --bin contention                      # the full sweep (~6 min on 2 cores)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin contention -- --quick           # a smoke run (~1 min)
//! cargo run --release -p tower-sqlite-retry-loadtest --bin contention -- --requests 4000 --clients 64 --strategies seed,default
//! cargo run --release -p tower-sqlite-retry-loadtest --bin contention -- --candidate 'mine:base_ms=5,cap_ms=250,jitter=full,attempts=50,deadline_s=10,gate=1'
//! ```
//!
//! Every cell (one strategy, one client count) gets a fresh SQLite file (WAL,
//! `synchronous = NORMAL`) in a temporary directory, a fresh pool, and a fresh axum server on
//! `127.0.0.1:0`. `--clients` concurrent HTTP/1.1 clients (hyper-util's pooled client, keep-alive,
//! one warm-up `GET /health` each) then send `--requests` `POST /items` in all. The handler runs
//! the deferred read-then-write transaction that meets `SQLITE_BUSY`/`SQLITE_BUSY_SNAPSHOT`
//! (`BEGIN`, `SELECT MAX(seq) + 1`, `INSERT`, `COMMIT`) and answers with [`DbError`] on error,
//! so a retryable failure carries the `Retryable` marker.
//!
//! Per cell: goodput (requests answered `201` per second of the whole batch, from the start until
//! the last answer), the steady goodput (successes per second from the start until the last
//! request is sent, while every client still has work: a schedule that parks its losers for
//! seconds looks good there and pays in batch time and tail latency instead), failures,
//! client-side latency p50/p99/p99.9/max over **all** requests (failed ones included), and
//! attempts per success
//! (handler invocations / successes, counted in the handler). The rows committed are checked
//! against the `201` answers (exactly once).
//!
//! Strategies (see `strategies()`): (a) no retry, `busy_timeout = 0`; (b) `busy_timeout` only
//! (30 s); (c) the seed schedule: our layer with 100 ms · 2^n capped at 3.2 s, no jitter, no
//! attempt cap; (d) tower's `Retry` with tower's `ExponentialBackoff` and the buffering policy of
//! `benches/common`; (e) our layer with each jitter kind, no gate; (f) our layer with a replay
//! gate of 1 and 2 permits; (g) the single-writer limit: a pool of **one** connection, every
//! write serialized, no contention possible, no retry needed; plus candidate default policies.
//!
//! Also: (h) our default layer with tower's `ConcurrencyLimitLayer(1)` on the write route (what a
//! user can do today to queue writers at the HTTP layer), and `cand-a20`, the recommended
//! default (today's default with 20 attempts).
//!
//! Flags (after `--`): `--quick` (400 requests per cell, 8 and 64 clients, one run, results to
//! `target/bench-results/`), `--requests N` (3000), `--clients 8,32,64,128`, `--pool-size N`
//! (the pool of every strategy but (g); 32), `--repeat N` (5: every cell runs N times, in
//! rounds, the order of the strategies rotated every round; the tables give medians of the
//! rates and latencies, sums of the counts, and the ratios to the single-writer limit as the
//! median of the per-round ratios, paired within a round; the seed schedule runs once), `--strategies key,key` (a subset, by key),
//! `--candidate 'key:base_ms=..|base_us=..,cap_ms=..,jitter=none|full|equal|decorrelated,attempts=N|max,deadline_s=..,gate=none|N'`
//! (repeatable; `kind=tower` makes it tower's backoff, a number as `jitter` its factor),
//! `--max-cell-secs S` (30: a cell stops starting requests after that long; marked
//! `truncated`), `--out DIR` (`benches/results`), `--replot DIR` (only redraw
//! `DIR/contention.svg` from `DIR/contention.json`). Environment: `CONTENTION_REQUESTS`,
//! `CONTENTION_CLIENTS`, `CONTENTION_POOL_SIZE`, `CONTENTION_REPEAT` as defaults for the flags.
//!
//! Writes `contention.json`, `contention.md` and `contention.svg` (goodput and p99 by strategy
//! and client count) to the output directory. Run with `--smoke`,
//! it does a tiny smoke run and writes nothing.

#[path = "../chart.rs"]
mod chart;
#[path = "../../../benches/common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tokio::net::TcpListener;
use tokio::sync::{Barrier, oneshot};
use tower::limit::ConcurrencyLimitLayer;
use tower_sqlite_retry::{DbError, Jitter, RetryMetrics, RetryPolicy, SqliteRetryLayer};

use common::{BufferedRetryLayer, ReplayPolicy};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

// ---------------------------------------------------------------------------------------------
// Strategies

/// How a cell serves its requests.
#[derive(Clone, Debug)]
enum Kind {
    /// No retry layer; the pool's `busy_timeout`.
    Bare { busy_timeout: Duration },
    /// `SqliteRetryLayer` with this policy.
    Ours(RetryPolicy),
    /// tower's `Retry` + `ExponentialBackoff` (min, max, jitter factor) + the buffering policy.
    Tower {
        min: Duration,
        max: Duration,
        jitter: f64,
        max_attempts: u32,
    },
    /// One connection: every transaction waits for the pool, none can conflict.
    SingleWriter,
    /// Our layer, and inside it tower's `ConcurrencyLimitLayer` on the write route only: at most
    /// this many write handlers run at once (the pool keeps its size for everything else).
    OursWriteLimit(RetryPolicy, usize),
}

#[derive(Clone, Debug)]
struct Strategy {
    /// Short key for `--strategies` and the JSON.
    key: String,
    /// The issue's letter: `a`..`g`, or `cand` for a candidate default.
    group: &'static str,
    kind: Kind,
    /// Slow by design (the seed schedule): run in the first repeat only.
    once: bool,
}

impl Strategy {
    fn new(key: &str, group: &'static str, kind: Kind) -> Self {
        Self {
            key: key.to_string(),
            group,
            kind,
            once: false,
        }
    }

    fn once(mut self) -> Self {
        self.once = true;
        self
    }

    fn describe(&self) -> String {
        match &self.kind {
            Kind::Bare { busy_timeout } => {
                format!("no layer, busy_timeout {} ms", busy_timeout.as_millis())
            }
            Kind::Ours(p) => describe_policy(p),
            Kind::Tower {
                min,
                max,
                jitter,
                max_attempts,
            } => format!(
                "tower::retry ExponentialBackoff {}..{} ms, jitter {jitter}, {max_attempts} attempts",
                min.as_millis(),
                max.as_millis()
            ),
            Kind::SingleWriter => "no layer, pool of 1 connection".to_string(),
            Kind::OursWriteLimit(p, n) => format!(
                "{}; ConcurrencyLimitLayer({n}) on the write route",
                describe_policy(p)
            ),
        }
    }
}

fn describe_policy(p: &RetryPolicy) -> String {
    // `RetryPolicy`'s Debug output is the only view of every field; take what we need from it.
    let dbg = format!("{p:?}");
    let field = |name: &str| -> String {
        dbg.split(&format!("{name}: "))
            .nth(1)
            .map(|rest| {
                let mut depth = 0i32;
                let mut out = String::new();
                for ch in rest.chars() {
                    match ch {
                        '(' => depth += 1,
                        ')' if depth == 0 => break,
                        ')' => depth -= 1,
                        ',' if depth == 0 => break,
                        _ => {}
                    }
                    out.push(ch);
                }
                out.trim().to_string()
            })
            .unwrap_or_default()
    };
    let attempts = match field("max_attempts") {
        n if n == u32::MAX.to_string() => "no attempt cap".to_string(),
        n => format!("{n} attempts"),
    };
    format!(
        "ours: base {}, cap {}, jitter {}, {attempts}, deadline {}, gate {}",
        field("base_delay"),
        field("max_delay"),
        field("jitter"),
        field("deadline"),
        field("replay_gate"),
    )
}

/// The policy with this replay gate (`None`: no gate).
fn with_gate(p: RetryPolicy, gate: Option<usize>) -> RetryPolicy {
    match gate {
        Some(n) => p.replay_gate(n),
        None => p.no_replay_gate(),
    }
}

/// Our layer with the crate's default numbers, the given jitter and gate.
fn ours(jitter: Jitter, gate: Option<usize>) -> Kind {
    Kind::Ours(with_gate(RetryPolicy::default().jitter(jitter), gate))
}

/// A candidate policy: base, cap, jitter, attempts, deadline, gate.
fn candidate(
    base_ms: u64,
    cap_ms: u64,
    jitter: Jitter,
    attempts: u32,
    deadline_s: u64,
    gate: Option<usize>,
) -> Kind {
    Kind::Ours(with_gate(
        RetryPolicy::default()
            .base_delay(Duration::from_millis(base_ms))
            .max_delay(Duration::from_millis(cap_ms))
            .jitter(jitter)
            .max_attempts(attempts)
            .deadline(Duration::from_secs(deadline_s)),
        gate,
    ))
}

fn strategies() -> Vec<Strategy> {
    let ms = Duration::from_millis;
    vec![
        Strategy::new(
            "no-retry",
            "a",
            Kind::Bare {
                busy_timeout: Duration::ZERO,
            },
        ),
        Strategy::new(
            "busy-timeout",
            "b",
            Kind::Bare {
                busy_timeout: Duration::from_secs(30),
            },
        ),
        Strategy::new(
            "seed",
            "c",
            Kind::Ours(
                RetryPolicy::default()
                    .base_delay(ms(100))
                    .max_delay(ms(3200))
                    .jitter(Jitter::None)
                    .max_attempts(u32::MAX)
                    .deadline(Duration::from_secs(3600))
                    .no_replay_gate(),
            ),
        )
        .once(),
        // tower with the same numbers as our default (2 ms doubling to 100 ms, 10 attempts);
        // tower's jitter adds up to `jitter · base` on top of the base, clamped at the cap.
        Strategy::new(
            "tower-exp",
            "d",
            Kind::Tower {
                min: ms(2),
                max: ms(100),
                jitter: 1.0,
                max_attempts: 10,
            },
        ),
        Strategy::new("ours-none", "e", ours(Jitter::None, None)),
        Strategy::new("ours-full", "e", ours(Jitter::Full, None)),
        Strategy::new("ours-equal", "e", ours(Jitter::Equal, None)),
        Strategy::new("ours-decorr", "e", ours(Jitter::Decorrelated, None)),
        // The current `RetryPolicy::default()`: full jitter, gate 1.
        Strategy::new("default", "f", Kind::Ours(RetryPolicy::default())),
        Strategy::new("ours-full-gate2", "f", ours(Jitter::Full, Some(2))),
        Strategy::new("single-writer", "g", Kind::SingleWriter),
        // Not in the issue's list: what a user can do today to queue writers at the HTTP layer.
        Strategy::new(
            "default+write-limit1",
            "h",
            Kind::OursWriteLimit(RetryPolicy::default(), 1),
        ),
        // The candidate default: today's default with room for the gated tail of attempts.
        Strategy::new(
            "cand-a20",
            "cand",
            candidate(2, 100, Jitter::Full, 20, 10, Some(1)),
        ),
    ]
}

/// Parses `key:base_ms=5,cap_ms=250,jitter=full,attempts=50,deadline_s=10,gate=1`, starting
/// from the crate's defaults.
fn parse_candidate(spec: &str) -> Result<Strategy, String> {
    let (key, fields) = spec
        .split_once(':')
        .ok_or_else(|| format!("--candidate {spec:?}: expected key:field=value,..."))?;
    let mut p = RetryPolicy::default();
    let mut tower = false;
    let (mut base, mut cap, mut jit, mut attempts) = (
        Duration::from_millis(2),
        Duration::from_millis(100),
        1.0f64,
        10u32,
    );
    for kv in fields.split(',').filter(|s| !s.is_empty()) {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| format!("--candidate: {kv:?} is not field=value"))?;
        let num = || -> Result<u64, String> {
            v.parse()
                .map_err(|_| format!("--candidate: {k}: cannot parse {v:?}"))
        };
        match k {
            "kind" if v == "tower" => tower = true,
            "base_ms" => {
                base = Duration::from_millis(num()?);
                p = p.base_delay(base);
            }
            "base_us" => {
                base = Duration::from_micros(num()?);
                p = p.base_delay(base);
            }
            "cap_ms" => {
                cap = Duration::from_millis(num()?);
                p = p.max_delay(cap);
            }
            "jitter" => {
                p = p.jitter(match v {
                    "none" => Jitter::None,
                    "full" => Jitter::Full,
                    "equal" => Jitter::Equal,
                    "decorrelated" | "decorr" => Jitter::Decorrelated,
                    other => {
                        jit = other
                            .parse()
                            .map_err(|_| format!("--candidate: unknown jitter {other:?}"))?;
                        Jitter::Full
                    }
                })
            }
            "attempts" => {
                attempts = if v == "max" { u32::MAX } else { num()? as u32 };
                p = p.max_attempts(attempts);
            }
            "deadline_s" => p = p.deadline(Duration::from_secs(num()?)),
            "gate" => {
                p = if v == "none" {
                    p.no_replay_gate()
                } else {
                    p.replay_gate(num()? as usize)
                }
            }
            other => return Err(format!("--candidate: unknown field {other:?}")),
        }
    }
    let kind = if tower {
        Kind::Tower {
            min: base,
            max: cap,
            jitter: jit,
            max_attempts: attempts,
        }
    } else {
        p.validate()
            .map_err(|e| format!("--candidate {key}: {e}"))?;
        Kind::Ours(p)
    };
    Ok(Strategy::new(key, "cand", kind))
}

// ---------------------------------------------------------------------------------------------
// The service

#[derive(Clone)]
struct AppState {
    pool: SqlitePool,
    /// Handler invocations (attempts), whatever retries them.
    attempts: Arc<AtomicU64>,
}

#[derive(Deserialize)]
struct NewItem {
    name: String,
}

/// `POST /items`: the deferred read-then-write transaction.
async fn create_item(
    State(state): State<AppState>,
    Json(new): Json<NewItem>,
) -> Result<(StatusCode, String), DbError> {
    state.attempts.fetch_add(1, Ordering::Relaxed);
    let mut tx = state.pool.begin().await?;
    let seq: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM items")
        .fetch_one(&mut *tx)
        .await?;
    let id: i64 = sqlx::query_scalar("INSERT INTO items (seq, name) VALUES (?, ?) RETURNING id")
        .bind(seq)
        .bind(&new.name)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, id.to_string()))
}

async fn open_pool(path: &Path, size: u32, busy_timeout: Duration) -> Result<SqlitePool, BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(busy_timeout);
    let pool = SqlitePoolOptions::new()
        .max_connections(size)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(options)
        .await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS items (
            id   INTEGER PRIMARY KEY,
            seq  INTEGER NOT NULL UNIQUE,
            name TEXT    NOT NULL
        )",
    )
    .execute(&pool)
    .await?;
    // Open every connection now, so no cell pays for opening them while measured.
    let mut conns = Vec::new();
    for _ in 0..size {
        conns.push(pool.acquire().await?);
    }
    drop(conns);
    Ok(pool)
}

/// The router for one strategy, and our layer's counters when it has one.
fn app(kind: &Kind, state: AppState) -> (Router, Option<RetryMetrics>) {
    let router = Router::new()
        .route("/items", post(create_item))
        .route("/health", get(|| async { "ok" }));
    match kind {
        Kind::Bare { .. } | Kind::SingleWriter => (router.with_state(state), None),
        Kind::Ours(policy) => {
            let layer = SqliteRetryLayer::new(policy.clone());
            let metrics = layer.metrics();
            (router.layer(layer).with_state(state), Some(metrics))
        }
        Kind::OursWriteLimit(policy, permits) => {
            let layer = SqliteRetryLayer::new(policy.clone());
            let metrics = layer.metrics();
            let router = Router::new()
                .route(
                    "/items",
                    post(create_item).layer(ConcurrencyLimitLayer::new(*permits)),
                )
                .route("/health", get(|| async { "ok" }))
                .layer(layer)
                .with_state(state);
            (router, Some(metrics))
        }
        Kind::Tower {
            min,
            max,
            jitter,
            max_attempts,
        } => {
            let layer =
                BufferedRetryLayer::new(ReplayPolicy::new(*min, *max, *jitter, *max_attempts));
            (router.layer(layer).with_state(state), None)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One cell

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Cell {
    strategy: String,
    group: String,
    description: String,
    clients: usize,
    pool_size: u32,
    /// Requests sent (fewer than asked when `truncated`).
    requests: u64,
    ok: u64,
    failed: u64,
    failure_pct: f64,
    /// Statuses other than 201, with counts (0 = no HTTP answer).
    statuses: BTreeMap<u16, u64>,
    /// Time from the start until the last response.
    elapsed_s: f64,
    /// Time from the start until the last request was sent (all clients busy until then).
    window_s: f64,
    /// Successes per second of `elapsed_s`: the whole batch, its slowest requests included
    /// (the headline goodput).
    goodput_per_s: f64,
    /// Successes completed within the window, per second of it: the rate while every client
    /// still had work. A schedule that parks its losers for seconds (the seed's) looks good here
    /// and pays in `elapsed_s` and the latency tail instead.
    steady_goodput_per_s: f64,
    /// Client-side latency over all requests, ms.
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    /// Client-side latency over the successful requests only, ms.
    ok_p99_ms: f64,
    /// Handler invocations.
    attempts: u64,
    attempts_per_success: f64,
    /// Our layer's outcome counters, when the strategy is our layer.
    layer_exhausted: Option<u64>,
    layer_deadline: Option<u64>,
    /// Our layer's requests by attempts made (index 0 = one attempt; the last bucket: 16 or
    /// more).
    layer_attempts_histogram: Option<Vec<u64>>,
    /// How many runs were aggregated into this cell (medians of the rates and latencies,
    /// sums of the counts).
    runs: usize,
    /// The round of a single run (0-based); the aggregate keeps the first.
    round: usize,
    /// Median over rounds of this strategy's goodput ÷ the single-writer's in the same round
    /// (paired, so that a burst of load from a neighbour cancels out).
    vs_single_writer_goodput: Option<f64>,
    /// The same for p99 latency.
    vs_single_writer_p99: Option<f64>,
    /// This strategy's median goodput ÷ the seed schedule's (which runs once).
    vs_seed_goodput: Option<f64>,
    /// Rows in the table after the run; must equal `ok`.
    rows: u64,
    exactly_once: bool,
    truncated: bool,
}

struct Sample {
    /// When the request was sent, from the start of the cell.
    sent_at: Duration,
    latency: Duration,
    /// `None`: no HTTP answer.
    status: Option<StatusCode>,
}

async fn run_cell(
    strategy: &Strategy,
    clients: usize,
    requests: usize,
    pool_size: u32,
    max_cell: Duration,
) -> Result<Cell, BoxError> {
    let dir = tempfile::tempdir()?;
    let db = dir.path().join("bench.db");
    let (size, busy_timeout) = match &strategy.kind {
        Kind::Bare { busy_timeout } => (pool_size, *busy_timeout),
        Kind::SingleWriter => (1, Duration::from_secs(5)),
        // sqlx's default busy timeout, as a user of the layer would have it.
        Kind::Ours(_) | Kind::Tower { .. } | Kind::OursWriteLimit(..) => {
            (pool_size, Duration::from_secs(5))
        }
    };
    let pool = open_pool(&db, size, busy_timeout).await?;
    let attempts = Arc::new(AtomicU64::new(0));
    let (router, metrics) = app(
        &strategy.kind,
        AppState {
            pool: pool.clone(),
            attempts: attempts.clone(),
        },
    );

    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, router)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let base = format!("http://{addr}");
    let next = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(clients + 1));
    let start_slot = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let client = client.clone();
        let base = base.clone();
        let next = next.clone();
        let barrier = barrier.clone();
        let start_slot = start_slot.clone();
        tasks.push(tokio::spawn(async move {
            // Warm-up: open this client's connection before the clock starts.
            let warm = Request::builder()
                .method(Method::GET)
                .uri(format!("{base}/health"))
                .body(Full::new(Bytes::new()))
                .expect("request");
            let _ = send(&client, warm).await;
            barrier.wait().await;
            let started = *start_slot
                .get()
                .expect("start set before the barrier opens");
            let mut samples = Vec::new();
            let mut last = started;
            loop {
                if started.elapsed() >= max_cell {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let body = format!("{{\"name\":\"item-{i}\"}}");
                let req = Request::builder()
                    .method(Method::POST)
                    .uri(format!("{base}/items"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(body)))
                    .expect("request");
                let sent_at = started.elapsed();
                let mut sample = send(&client, req).await;
                sample.sent_at = sent_at;
                last = Instant::now();
                samples.push(sample);
            }
            (samples, last)
        }));
    }
    start_slot.set(Instant::now()).expect("start set once");
    barrier.wait().await;
    let started = *start_slot.get().expect("start");
    let mut samples = Vec::with_capacity(requests);
    let mut end = started;
    for task in tasks {
        let (s, last) = task.await?;
        samples.extend(s);
        end = end.max(last);
    }
    let elapsed = end.duration_since(started);
    drop(client);
    let _ = stop.send(());
    server.await??;

    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    drop(dir);

    let n = samples.len() as u64;
    // The steady window: from the start until the last request was sent. Past it fewer and
    // fewer clients have work, and the batch only waits for its slowest requests.
    let window = samples
        .iter()
        .map(|s| s.sent_at)
        .max()
        .unwrap_or_default()
        .max(Duration::from_millis(1));
    let steady_ok = samples
        .iter()
        .filter(|s| s.status == Some(StatusCode::CREATED) && s.sent_at + s.latency <= window)
        .count();
    let mut statuses = BTreeMap::new();
    let mut ok = 0u64;
    let mut all: Vec<Duration> = Vec::with_capacity(samples.len());
    let mut ok_lat: Vec<Duration> = Vec::new();
    for s in &samples {
        all.push(s.latency);
        match s.status {
            Some(StatusCode::CREATED) => {
                ok += 1;
                ok_lat.push(s.latency);
            }
            Some(code) => *statuses.entry(code.as_u16()).or_insert(0) += 1,
            None => *statuses.entry(0).or_insert(0) += 1,
        }
    }
    let (p50, p99, p999, max) = {
        let mut v = all;
        (
            pct(&mut v, 50.0),
            pct(&mut v, 99.0),
            pct(&mut v, 99.9),
            pct(&mut v, 100.0),
        )
    };
    let ok_p99 = pct(&mut ok_lat, 99.0);
    let attempts = attempts.load(Ordering::Relaxed);
    let snap = metrics.map(|m| m.snapshot());
    let secs = elapsed.as_secs_f64().max(1e-9);
    Ok(Cell {
        strategy: strategy.key.clone(),
        group: strategy.group.to_string(),
        description: strategy.describe(),
        clients,
        pool_size: size,
        requests: n,
        ok,
        failed: n - ok,
        failure_pct: if n == 0 {
            0.0
        } else {
            100.0 * (n - ok) as f64 / n as f64
        },
        statuses,
        elapsed_s: secs,
        window_s: window.as_secs_f64(),
        goodput_per_s: ok as f64 / secs,
        steady_goodput_per_s: steady_ok as f64 / window.as_secs_f64(),
        p50_ms: p50,
        p99_ms: p99,
        p999_ms: p999,
        max_ms: max,
        ok_p99_ms: ok_p99,
        attempts,
        attempts_per_success: if ok == 0 {
            f64::NAN
        } else {
            attempts as f64 / ok as f64
        },
        layer_exhausted: snap.map(|s| s.exhausted),
        layer_deadline: snap.map(|s| s.deadline),
        layer_attempts_histogram: snap.map(|s| s.attempts_histogram.to_vec()),
        runs: 1,
        round: 0,
        vs_single_writer_goodput: None,
        vs_single_writer_p99: None,
        vs_seed_goodput: None,
        rows: rows as u64,
        exactly_once: rows as u64 == ok,
        truncated: (n as usize) < requests,
    })
}

async fn send(client: &Client<HttpConnector, Full<Bytes>>, req: Request<Full<Bytes>>) -> Sample {
    let start = Instant::now();
    let status = async {
        let res = client.request(req).await.ok()?;
        let status = res.status();
        res.into_body().collect().await.ok()?;
        Some(status)
    }
    .await;
    Sample {
        sent_at: Duration::ZERO,
        latency: start.elapsed(),
        status,
    }
}

/// Nearest-rank percentile, in ms (0 for no samples).
fn pct(v: &mut [Duration], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1].as_secs_f64() * 1000.0
}

/// Several runs of one cell as one: medians of the rates and latencies, sums of the counts.
fn aggregate(runs: &[&Cell]) -> Cell {
    let first = runs[0];
    if runs.len() == 1 {
        return first.clone();
    }
    let med = |f: fn(&Cell) -> f64| -> f64 {
        let mut v: Vec<f64> = runs.iter().map(|c| f(c)).collect();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let sum = |f: fn(&Cell) -> u64| -> u64 { runs.iter().map(|c| f(c)).sum() };
    let opt_sum = |f: fn(&Cell) -> Option<u64>| -> Option<u64> {
        runs.iter().map(|c| f(c)).sum::<Option<u64>>()
    };
    let requests = sum(|c| c.requests);
    let ok = sum(|c| c.ok);
    let attempts = sum(|c| c.attempts);
    let mut statuses = BTreeMap::new();
    for c in runs {
        for (k, v) in &c.statuses {
            *statuses.entry(*k).or_insert(0) += v;
        }
    }
    let histogram = runs
        .iter()
        .map(|c| c.layer_attempts_histogram.clone())
        .collect::<Option<Vec<_>>>()
        .map(|hs| {
            let mut total = vec![0u64; hs[0].len()];
            for h in hs {
                for (t, x) in total.iter_mut().zip(h) {
                    *t += x;
                }
            }
            total
        });
    Cell {
        strategy: first.strategy.clone(),
        group: first.group.clone(),
        description: first.description.clone(),
        clients: first.clients,
        pool_size: first.pool_size,
        requests,
        ok,
        failed: requests - ok,
        failure_pct: if requests == 0 {
            0.0
        } else {
            100.0 * (requests - ok) as f64 / requests as f64
        },
        statuses,
        elapsed_s: med(|c| c.elapsed_s),
        window_s: med(|c| c.window_s),
        goodput_per_s: med(|c| c.goodput_per_s),
        steady_goodput_per_s: med(|c| c.steady_goodput_per_s),
        p50_ms: med(|c| c.p50_ms),
        p99_ms: med(|c| c.p99_ms),
        p999_ms: med(|c| c.p999_ms),
        max_ms: runs.iter().map(|c| c.max_ms).fold(0.0, f64::max),
        ok_p99_ms: med(|c| c.ok_p99_ms),
        attempts,
        attempts_per_success: if ok == 0 {
            f64::NAN
        } else {
            attempts as f64 / ok as f64
        },
        layer_exhausted: opt_sum(|c| c.layer_exhausted),
        layer_deadline: opt_sum(|c| c.layer_deadline),
        layer_attempts_histogram: histogram,
        rows: sum(|c| c.rows),
        exactly_once: runs.iter().all(|c| c.exactly_once),
        truncated: runs.iter().any(|c| c.truncated),
        runs: runs.len(),
        round: first.round,
        vs_single_writer_goodput: None,
        vs_single_writer_p99: None,
        vs_seed_goodput: None,
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration

#[derive(Debug)]
struct Config {
    requests: usize,
    clients: Vec<usize>,
    pool_size: u32,
    only: Option<Vec<String>>,
    candidates: Vec<Strategy>,
    max_cell: Duration,
    out: Option<PathBuf>,
    quick: bool,
    repeat: usize,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .map(|s| {
            s.trim()
                .parse()
                .map_err(|_| format!("cannot parse {s:?} as a number"))
        })
        .collect()
}

fn parse_args() -> Result<Config, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let real_run = !args.iter().any(|a| a == "--smoke");
    let quick = args.iter().any(|a| a == "--quick");
    let default_clients = std::env::var("CONTENTION_CLIENTS")
        .ok()
        .map(|v| parse_list(&v))
        .transpose()?;
    let mut cfg = Config {
        requests: env_or("CONTENTION_REQUESTS", if quick { 400 } else { 3000 }),
        clients: default_clients.unwrap_or_else(|| {
            if quick {
                vec![8, 64]
            } else {
                vec![8, 32, 64, 128]
            }
        }),
        pool_size: env_or("CONTENTION_POOL_SIZE", 32),
        only: None,
        candidates: Vec::new(),
        max_cell: Duration::from_secs(if quick { 15 } else { 30 }),
        out: None,
        quick,
        repeat: env_or("CONTENTION_REPEAT", if quick { 1 } else { 5 }),
    };
    if !real_run {
        // `--smoke`: a tiny run that checks the harness works, and nothing more.
        cfg.requests = 40;
        cfg.clients = vec![8];
        cfg.only = Some(
            ["no-retry", "tower-exp", "default", "single-writer"]
                .map(String::from)
                .to_vec(),
        );
        cfg.max_cell = Duration::from_secs(20);
        cfg.repeat = 1;
        return Ok(cfg);
    }
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let mut value = |flag: &str| it.next().ok_or_else(|| format!("{flag} needs a value"));
        match arg.as_str() {
            "--bench" | "--quick" => {}
            "--requests" => {
                cfg.requests = value("--requests")?
                    .parse()
                    .map_err(|_| "--requests: not a number")?
            }
            "--clients" => cfg.clients = parse_list(&value("--clients")?)?,
            "--pool-size" => {
                cfg.pool_size = value("--pool-size")?
                    .parse()
                    .map_err(|_| "--pool-size: not a number")?
            }
            "--strategies" => {
                cfg.only = Some(
                    value("--strategies")?
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .collect(),
                )
            }
            "--candidate" => cfg
                .candidates
                .push(parse_candidate(&value("--candidate")?)?),
            "--max-cell-secs" => {
                cfg.max_cell = Duration::from_secs_f64(
                    value("--max-cell-secs")?
                        .parse()
                        .map_err(|_| "--max-cell-secs: not a number")?,
                )
            }
            "--out" => cfg.out = Some(PathBuf::from(value("--out")?)),
            "--repeat" => {
                cfg.repeat = value("--repeat")?
                    .parse::<usize>()
                    .map_err(|_| "--repeat: not a number")?
                    .max(1)
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if cfg.out.is_none() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        cfg.out = Some(if quick {
            root.join("target/bench-results")
        } else {
            root.join("benches/results")
        });
    }
    Ok(cfg)
}

// ---------------------------------------------------------------------------------------------
// Output

fn fmt_ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn markdown(cells: &[Cell], clients: &[usize]) -> String {
    let mut md = String::new();
    for &c in clients {
        let _ = writeln!(md, "#### {c} clients\n");
        let _ = writeln!(
            md,
            "| strategy | | goodput/s | steady/s | failed | p50 ms | p99 ms | p99.9 ms | max ms | attempts/success | × single-writer goodput | × single-writer p99 | × seed goodput | notes |"
        );
        let _ = writeln!(
            md,
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        for x in cells.iter().filter(|x| x.clients == c) {
            let rel = |r: Option<f64>| r.map_or("–".to_string(), |r| format!("{r:.2}"));
            let mut notes = Vec::new();
            if x.truncated {
                notes.push(format!("truncated at {} requests", x.requests));
            }
            if let Some(e) = x.layer_exhausted.filter(|e| *e > 0) {
                notes.push(format!("{e} exhausted"));
            }
            if let Some(d) = x.layer_deadline.filter(|d| *d > 0) {
                notes.push(format!("{d} deadline"));
            }
            if let Some(h) = &x.layer_attempts_histogram
                && let Some(top) = h.iter().rposition(|n| *n > 0)
                && top > 0
            {
                let plus = if top + 1 == h.len() { "+" } else { "" };
                notes.push(format!("max {}{plus} attempts", top + 1));
            }
            if !x.exactly_once {
                notes.push(format!("ROWS {} ≠ OK {}", x.rows, x.ok));
            }
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} |",
                x.strategy,
                x.group,
                x.goodput_per_s,
                x.steady_goodput_per_s,
                if x.failed == 0 {
                    "0".to_string()
                } else {
                    format!("{} ({:.2}%)", x.failed, x.failure_pct)
                },
                fmt_ms(x.p50_ms),
                fmt_ms(x.p99_ms),
                fmt_ms(x.p999_ms),
                fmt_ms(x.max_ms),
                x.attempts_per_success,
                rel(x.vs_single_writer_goodput),
                rel(x.vs_single_writer_p99),
                rel(x.vs_seed_goodput),
                notes.join("; "),
            );
        }
        let _ = writeln!(md);
    }
    md
}

/// Draws goodput and p99 by client count, one line per strategy (`strategies`: key and group,
/// in legend order).
fn chart(
    cells: &[Cell],
    strategies: &[(String, String)],
    path: &Path,
    title: &str,
) -> Result<(), BoxError> {
    use plotters::style::{BLACK, Color, Palette, Palette99, RGBColor, ShapeStyle};

    let style = |i: usize, key: &str| -> ShapeStyle {
        if key == "single-writer" {
            BLACK.stroke_width(3)
        } else if key == "seed" {
            RGBColor(150, 150, 150).stroke_width(3)
        } else if key == "default" {
            RGBColor(0, 90, 200).stroke_width(3)
        } else if key.starts_with("cand") {
            RGBColor(220, 80, 0).stroke_width(3)
        } else {
            Palette99::pick(i).stroke_width(2)
        }
    };
    let points = |key: &str, f: fn(&Cell) -> f64| -> Vec<(f64, f64)> {
        cells
            .iter()
            .filter(|c| c.strategy == key)
            .map(|c| (c.clients as f64, f(c)))
            .collect()
    };
    let lines: Vec<chart::Line> = strategies
        .iter()
        .enumerate()
        .map(|(i, (key, group))| {
            chart::Line::new(
                format!("{key} ({group})"),
                style(i, key),
                points(key, |c| c.goodput_per_s),
                points(key, |c| c.p99_ms),
            )
        })
        .collect();
    let labels = chart::Labels {
        title,
        clients: "concurrent clients",
        goodput_caption: "goodput (successful writes/s over the whole batch)",
    };
    chart::goodput_and_p99(path, &labels, &lines)
}

// ---------------------------------------------------------------------------------------------

/// `--replot DIR`: draws `DIR/contention.svg` again from `DIR/contention.json`.
fn replot(dir: &Path) -> Result<(), BoxError> {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("contention.json"))?)?;
    let cells: Vec<Cell> = serde_json::from_value(json["cells"].clone())?;
    let keys: Vec<(String, String)> = json["strategies"]
        .as_array()
        .ok_or("no strategies")?
        .iter()
        .map(|s| {
            (
                s["key"].as_str().unwrap_or_default().to_string(),
                s["group"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let title = format!(
        "SQLite write contention: {} POSTs per cell, pool {} (single-writer: 1)",
        json["requests_per_cell"], json["pool_size"]
    );
    chart(&cells, &keys, &dir.join("contention.svg"), &title)?;
    eprintln!("wrote {}", dir.join("contention.svg").display());
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--replot") {
        let Some(dir) = args.get(i + 1) else {
            eprintln!("contention: --replot needs a directory");
            return std::process::ExitCode::from(2);
        };
        return match replot(Path::new(dir)) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("contention: replot: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let cfg = match parse_args() {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("contention: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let mut list = strategies();
    list.extend(cfg.candidates.iter().cloned());
    if let Some(only) = &cfg.only {
        for key in only {
            if !list.iter().any(|s| &s.key == key) {
                eprintln!("contention: unknown strategy {key:?}");
                return std::process::ExitCode::from(2);
            }
        }
        list.retain(|s| only.contains(&s.key));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");

    eprintln!(
        "contention: {} strategies × clients {:?}, {} requests per cell, pool {} (single-writer: 1){}",
        list.len(),
        cfg.clients,
        cfg.requests,
        cfg.pool_size,
        if cfg.quick { ", quick" } else { "" }
    );
    let began = Instant::now();
    let mut runs: Vec<Cell> = Vec::new();
    // Repeats outermost, then client counts: every strategy meets the same machine load within
    // a sweep, and a burst of noise from a neighbour hits one run of each, not all runs of one.
    for round in 0..cfg.repeat {
        for &clients in &cfg.clients {
            // Rotate the order every round, so that no strategy always runs right after the
            // same neighbour or at the same point of a drift in machine load.
            let mut order: Vec<&Strategy> = list.iter().collect();
            let len = order.len();
            order.rotate_left(round % len.max(1));
            for s in order.into_iter().filter(|s| round == 0 || !s.once) {
                let mut cell = match rt.block_on(run_cell(
                    s,
                    clients,
                    cfg.requests,
                    cfg.pool_size,
                    cfg.max_cell,
                )) {
                    Ok(cell) => cell,
                    Err(e) => {
                        eprintln!("contention: {} at {clients} clients: {e}", s.key);
                        return std::process::ExitCode::FAILURE;
                    }
                };
                eprintln!(
                    "  run {}  {:>3} clients  {:<16} {:>6.0}/s  fail {:>5.1}%  p50 {:>7} ms  p99 {:>7} ms  att/ok {:>5.2}{}{}",
                    round + 1,
                    clients,
                    s.key,
                    cell.goodput_per_s,
                    cell.failure_pct,
                    fmt_ms(cell.p50_ms),
                    fmt_ms(cell.p99_ms),
                    cell.attempts_per_success,
                    if cell.truncated { "  (truncated)" } else { "" },
                    if cell.exactly_once {
                        ""
                    } else {
                        "  ROWS != OK"
                    },
                );
                cell.round = round;
                runs.push(cell);
            }
        }
    }
    let mut cells = Vec::new();
    for &clients in &cfg.clients {
        for s in &list {
            let of: Vec<&Cell> = runs
                .iter()
                .filter(|c| c.clients == clients && c.strategy == s.key)
                .collect();
            let mut cell = aggregate(&of);
            let paired = |f: fn(&Cell) -> f64| -> Option<f64> {
                let mut ratios: Vec<f64> = of
                    .iter()
                    .filter_map(|x| {
                        runs.iter()
                            .find(|y| {
                                y.clients == clients
                                    && y.strategy == "single-writer"
                                    && y.round == x.round
                            })
                            .map(|y| f(x) / f(y))
                    })
                    .collect();
                if ratios.is_empty() {
                    return None;
                }
                ratios.sort_by(f64::total_cmp);
                let n = ratios.len();
                Some(if n % 2 == 1 {
                    ratios[n / 2]
                } else {
                    (ratios[n / 2 - 1] + ratios[n / 2]) / 2.0
                })
            };
            cell.vs_single_writer_goodput = paired(|c| c.goodput_per_s);
            cell.vs_single_writer_p99 = paired(|c| c.p99_ms);
            cells.push(cell);
        }
    }
    for i in 0..cells.len() {
        let seed = cells
            .iter()
            .find(|c| c.clients == cells[i].clients && c.strategy == "seed")
            .map(|c| c.goodput_per_s);
        cells[i].vs_seed_goodput = seed.map(|g| cells[i].goodput_per_s / g);
    }
    let md = markdown(&cells, &cfg.clients);
    println!();
    println!(
        "### Contention: pool of {} connections (single-writer: 1), {} POSTs per cell, median of {} run(s)",
        cfg.pool_size, cfg.requests, cfg.repeat
    );
    println!();
    print!("{md}");
    let total = began.elapsed();
    println!("(total {:.0} s)", total.as_secs_f64());

    let Some(out) = &cfg.out else {
        return std::process::ExitCode::SUCCESS;
    };
    if let Err(e) = std::fs::create_dir_all(out) {
        eprintln!("contention: {}: {e}", out.display());
        return std::process::ExitCode::FAILURE;
    }
    let json = serde_json::json!({
        "bench": "contention",
        "requests_per_cell": cfg.requests,
        "clients": cfg.clients,
        "pool_size": cfg.pool_size,
        "max_cell_secs": cfg.max_cell.as_secs_f64(),
        "quick": cfg.quick,
        "total_s": total.as_secs_f64(),
        "strategies": list.iter().map(|s| serde_json::json!({
            "key": s.key, "group": s.group, "description": s.describe(),
        })).collect::<Vec<_>>(),
        "repeat": cfg.repeat,
        "cells": cells,
        "runs": runs,
    });
    let title = format!(
        "SQLite write contention: {} POSTs per cell, pool {} (single-writer: 1)",
        cfg.requests, cfg.pool_size
    );
    let writes = [
        (
            out.join("contention.json"),
            serde_json::to_string_pretty(&json).expect("json") + "\n",
        ),
        (out.join("contention.md"), md),
    ];
    for (path, text) in writes {
        if let Err(e) = std::fs::write(&path, text) {
            eprintln!("contention: {}: {e}", path.display());
            return std::process::ExitCode::FAILURE;
        }
        eprintln!("wrote {}", path.display());
    }
    let svg = out.join("contention.svg");
    let keys: Vec<(String, String)> = list
        .iter()
        .map(|s| (s.key.clone(), s.group.to_string()))
        .collect();
    if let Err(e) = chart(&cells, &keys, &svg, &title) {
        eprintln!("contention: chart: {e}");
        return std::process::ExitCode::FAILURE;
    }
    eprintln!("wrote {}", svg.display());
    std::process::ExitCode::SUCCESS
}
