//! The load driver of `examples/contention.rs`, shared with `tests/app.rs`: serves the example
//! app on real loopback sockets (one server per instance, each with its own pool and its own
//! retry layers, all on one database), drives concurrent HTTP clients against them, and checks
//! what was committed against what was acknowledged.
//!
//! It needs `mod app_lib;` declared next to it (at the crate root of whoever includes it).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::ProgressBar;
use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::app_lib::{
    AppMetrics, Backend, Db, Item, RetryPolicies, Work, open_pool, redact, router,
};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Where a run keeps its items.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// A SQLite file, created if missing (table `items`). Use a fresh one for every run.
    SqliteFile(PathBuf),
    /// A database URL (`sqlite:`, `postgres://`, `mysql://`) and the table to use there. The
    /// run drops and creates the table first, and drops it at the end.
    Url { url: String, table: String },
}

impl Target {
    /// For the report: the file, or the URL (password hidden) and table.
    pub(crate) fn describe(&self) -> String {
        match self {
            Self::SqliteFile(path) => path.display().to_string(),
            Self::Url { url, table } => format!("{} (table {table})", redact(url)),
        }
    }

    async fn connect(&self, pool_size: u32, busy_timeout: Duration) -> Result<Db, BoxError> {
        match self {
            Self::SqliteFile(path) => Ok(open_pool(path, pool_size, busy_timeout).await?.into()),
            Self::Url { url, table } => Ok(Db::connect(url, table, pool_size, busy_timeout).await?),
        }
    }

    /// The `database` label of the write path: the file's name, or the table's.
    fn database_name(&self) -> String {
        match self {
            Self::SqliteFile(path) => path
                .file_name()
                .map_or_else(|| "items.db".into(), |n| n.to_string_lossy().into_owned()),
            Self::Url { table, .. } => table.clone(),
        }
    }
}

/// How `POST /items`' transaction begins (the app's `--config` makes the same choices).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Begin {
    /// `BEGIN` (deferred; `SERIALIZABLE` on PostgreSQL and MySQL): `bare`, `layer`.
    #[default]
    Deferred,
    /// SQLite's `BEGIN IMMEDIATE` on the pool: `immediate`.
    Immediate,
    /// SQLite's write path, `WritePool::begin()` (the turn, then `BEGIN IMMEDIATE` on its
    /// writer connection): `layer-write`.
    WritePath,
    /// The writer thread, a rusqlite `WriteThread` (the turn, then the transaction as a
    /// closure on the thread that owns the writer connection): `layer-thread`.
    WriteThread,
}

/// One run: a fresh table, `instances` copies of the app (each its own server, pool and
/// layers) with or without the retry layers, and `clients` concurrent clients sending
/// `requests` requests in all, spread round-robin over the instances.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// A name for the report (`"without layer"`, `"with layer"`).
    pub(crate) label: String,
    pub(crate) target: Target,
    /// App instances sharing the database, as in a scaled-out deployment (at least 1).
    pub(crate) instances: usize,
    pub(crate) clients: usize,
    pub(crate) requests: usize,
    /// The share of requests that are `POST /items` (the rest are `GET /items`), `0.0..=1.0`.
    pub(crate) write_ratio: f64,
    /// Connections per instance.
    pub(crate) pool_size: u32,
    pub(crate) busy_timeout: Duration,
    /// `None` serves the app without any retry layer. Each instance gets its own layers built
    /// from these policies (its own counters, replay gate, buffer cap; a budget `Arc` inside a
    /// policy would be shared, so the demonstration sets none).
    pub(crate) retry: Option<RetryPolicies>,
    /// How `POST /items`' transaction begins; anything but `Deferred` is SQLite's only.
    pub(crate) begin: Begin,
    /// What `POST /items` does before and after its transaction.
    pub(crate) work: Work,
    /// Advanced once per finished request (pass `ProgressBar::hidden()` for none).
    pub(crate) progress: ProgressBar,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) label: String,
    pub(crate) retry_layer: bool,
    /// How `POST /items`' transaction began.
    pub(crate) begin: Begin,
    pub(crate) db: String,
    pub(crate) clients: usize,
    pub(crate) requests: u64,
    /// `POST /items` sent.
    pub(crate) writes: u64,
    /// `GET /items` sent.
    pub(crate) reads: u64,
    pub(crate) status_2xx: u64,
    pub(crate) status_5xx: u64,
    /// Anything else: 1xx/3xx/4xx answers, transport errors, unreadable 201 bodies.
    pub(crate) other: u64,
    /// Requests that got no HTTP answer at all (included in `other`).
    pub(crate) transport_errors: u64,
    /// Every status seen, with its count.
    pub(crate) statuses: BTreeMap<u16, u64>,
    pub(crate) elapsed_s: f64,
    pub(crate) throughput_rps: f64,
    pub(crate) latency_ms: Latency,
    /// `POST /items` answered 2xx.
    pub(crate) writes_2xx: u64,
    /// `GET /items` answered 2xx.
    pub(crate) reads_2xx: u64,
    /// `POST /items` answered 2xx per second of the run.
    pub(crate) writes_per_s: f64,
    /// `GET /items` answered 2xx per second of the run.
    pub(crate) reads_per_s: f64,
    /// The latency of `POST /items` alone (its `max`: the slowest write).
    pub(crate) write_latency_ms: Latency,
    /// The latency of `GET /items` alone.
    pub(crate) read_latency_ms: Latency,
    /// With the write path: its turn over the run, all instances together (`None` without).
    pub(crate) write_turn: Option<TurnReport>,
    /// The layers' counters, all instances together; `None` without them.
    pub(crate) layer: Option<LayerReport>,
    /// The same, instance by instance (one entry per instance, in order).
    pub(crate) instances: Vec<InstanceReport>,
    pub(crate) integrity: Integrity,
}

impl Report {
    /// Requests not answered 2xx.
    pub(crate) fn failures(&self) -> u64 {
        self.requests - self.status_2xx
    }

    pub(crate) fn success_pct(&self) -> f64 {
        if self.requests == 0 {
            return 100.0;
        }
        100.0 * self.status_2xx as f64 / self.requests as f64
    }
}

/// The write path's turn over a run (`WritePool::stats()` before and after it).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TurnReport {
    /// Write transactions that held the turn and gave it back during the run.
    pub(crate) transactions: u64,
    /// Time the turn was held during the run, in seconds.
    pub(crate) busy_s: f64,
    /// `busy_s` over the run's wall time: the share of it during which a write transaction
    /// held the turn (1.0: the database at its write limit).
    pub(crate) utilization: f64,
}

/// What the two runs of the demonstration show together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "verdict", content = "reasons", rename_all = "snake_case")]
pub(crate) enum Verdict {
    /// The run without the layer failed requests; with it none failed, nothing lost or doubled.
    Pass,
    /// Nothing failed with the layer, but nothing failed without it either: no contention was
    /// shown, so the run says nothing about the layer.
    NoContention,
    /// Why the demonstration failed: requests failed with the layer, rows were lost or
    /// doubled, or nothing could contend (no writes).
    Fail(Vec<String>),
}

/// Judges the run without the layer against the run with it.
#[allow(
    dead_code,
    reason = "the demonstration judges its other runs too: verdict_with"
)]
pub(crate) fn verdict(without: &Report, with: &Report) -> Verdict {
    verdict_with(without, with, &[])
}

/// [`verdict`], and every run of `also` (`BEGIN IMMEDIATE`, the write path) must have failed
/// nothing and lost or doubled nothing too. How fast any run was is no part of it.
pub(crate) fn verdict_with(without: &Report, with: &Report, also: &[&Report]) -> Verdict {
    let mut why = Vec::new();
    if with.writes == 0 || without.writes == 0 {
        why.push("no POST /items was sent, so nothing could contend".to_string());
    }
    if with.failures() > 0 {
        why.push(format!(
            "{} of {} requests failed with the layer (statuses {:?})",
            with.failures(),
            with.requests,
            with.statuses
        ));
    }
    for r in also {
        if r.writes == 0 {
            why.push(format!("no POST /items was sent in the run {}", r.label));
        }
        if r.failures() > 0 {
            why.push(format!(
                "{} of {} requests failed in the run {} (statuses {:?})",
                r.failures(),
                r.requests,
                r.label,
                r.statuses
            ));
        }
    }
    for r in [without, with].into_iter().chain(also.iter().copied()) {
        if !r.integrity.ok {
            why.push(format!("the run {} lost or doubled rows", r.label));
        }
    }
    if !why.is_empty() {
        Verdict::Fail(why)
    } else if without.failures() == 0 {
        Verdict::NoContention
    } else {
        Verdict::Pass
    }
}

/// One instance's share of a run: what its clients saw, and its own layers' counters.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct InstanceReport {
    /// 1-based.
    pub(crate) instance: usize,
    pub(crate) clients: usize,
    pub(crate) requests: u64,
    pub(crate) status_2xx: u64,
    pub(crate) status_5xx: u64,
    pub(crate) other: u64,
    pub(crate) latency_ms: Latency,
    /// `None` without the layers.
    pub(crate) layer: Option<LayerReport>,
}

/// Client-side latency percentiles (nearest rank), in milliseconds.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Latency {
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// The retry layers' counters at the end of a run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct LayerReport {
    /// Replays performed, both layers together.
    pub(crate) retries: u64,
    /// Requests that waited for a writer-admission slot.
    pub(crate) queued: u64,
    /// Requests by attempts made: index 0 = one attempt (the last bucket: that many or more).
    pub(crate) attempts_histogram: Vec<u64>,
    /// Requests the layer gave up on (`exhausted`, `deadline`, `budget_exhausted`).
    pub(crate) gave_up: u64,
    /// Everything, as `GET /stats` shows it (one entry per instance for a total).
    pub(crate) stats: serde_json::Value,
}

impl LayerReport {
    fn of(metrics: &AppMetrics) -> Self {
        let snap = metrics.snapshot();
        Self {
            retries: snap.retries(),
            queued: snap.queued(),
            attempts_histogram: snap.attempts_histogram(),
            gave_up: snap.gave_up(),
            stats: snap.to_json(),
        }
    }

    /// The instances' counters added up.
    fn total(parts: &[&LayerReport]) -> Self {
        let len = parts
            .iter()
            .map(|p| p.attempts_histogram.len())
            .max()
            .unwrap_or(0);
        let mut attempts_histogram = vec![0; len];
        for p in parts {
            for (sum, n) in attempts_histogram.iter_mut().zip(&p.attempts_histogram) {
                *sum += n;
            }
        }
        Self {
            retries: parts.iter().map(|p| p.retries).sum(),
            queued: parts.iter().map(|p| p.queued).sum(),
            attempts_histogram,
            gave_up: parts.iter().map(|p| p.gave_up).sum(),
            stats: if parts.len() == 1 {
                parts[0].stats.clone()
            } else {
                serde_json::Value::Array(parts.iter().map(|p| p.stats.clone()).collect())
            },
        }
    }
}

/// What was committed, against what was acknowledged with `201 Created`.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Integrity {
    /// `201 Created` answers.
    pub(crate) acknowledged: u64,
    /// Rows in the table after the run.
    pub(crate) rows: u64,
    /// Acknowledged items with no identical row (id, seq, name).
    pub(crate) lost: u64,
    /// Rows no `201` was answered for (a phantom write, or the second copy of a replay).
    pub(crate) unacknowledged: u64,
    /// Rows beyond the first with the same name: every request sends a unique name, so this
    /// counts inserts that happened twice.
    pub(crate) doubled: u64,
    /// Rows beyond the first with the same `seq`.
    pub(crate) duplicate_seqs: u64,
    pub(crate) ok: bool,
}

/// One app instance being served.
struct Instance {
    db: Db,
    metrics: Option<AppMetrics>,
    base: String,
    stop: oneshot::Sender<()>,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

/// Runs one scenario to the end and reports. A SQLite file is left in place; a table named
/// by a URL is dropped.
pub(crate) async fn run(scenario: Scenario) -> Result<Report, BoxError> {
    let Scenario {
        label,
        target,
        instances,
        clients,
        requests,
        write_ratio,
        pool_size,
        busy_timeout,
        retry,
        begin,
        work,
        progress,
    } = scenario;
    let retry_layer = retry.is_some();
    let database = target.database_name();
    if begin != Begin::Deferred
        && let Target::Url { url, .. } = &target
        && Backend::of_url(url) != Some(Backend::Sqlite)
    {
        return Err(format!("{begin:?}: SQLite's only, not {}", redact(url)).into());
    }
    let instances = instances.max(1);
    let clients = clients.max(1);

    // A fresh table, then one pool per instance: N processes sharing one database.
    let setup = target.connect(1, busy_timeout).await?;
    if let Target::Url { .. } = target {
        setup.drop_table().await?;
    }
    setup.create_schema().await?;
    let mut served = Vec::with_capacity(instances);
    for _ in 0..instances {
        let db = target
            .connect(pool_size, busy_timeout)
            .await?
            .with_work(work);
        let db = match begin {
            Begin::Deferred => db,
            Begin::Immediate => db.begin_immediate(),
            Begin::WritePath => db.with_write_path(&database)?,
            Begin::WriteThread => db.with_write_thread(&database)?,
        };
        let (app, metrics) = router(db.clone(), retry.clone());
        // A real server on a real socket: what a client sees, keep-alive and all.
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}", listener.local_addr()?);
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        served.push(Instance {
            db,
            metrics,
            base,
            stop,
            server,
        });
    }

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let next = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicU64::new(0));
    // The write path's turn before the run (`None`: no write transaction yet, nothing held).
    let turns_before: Vec<Option<tower_sqlite_retry::write::WriteStats>> =
        served.iter().map(|s| s.db.write_stats()).collect();

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for c in 0..clients {
        // Round-robin: client c talks to instance c mod N, as behind a load balancer that
        // keeps each client's connection on one instance.
        let instance = c % instances;
        let client = client.clone();
        let base = served[instance].base.clone();
        let next = next.clone();
        let created = created.clone();
        let progress = progress.clone();
        tasks.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                let write = unit(mix(i as u64)) < write_ratio;
                let mut sample = if write {
                    post_item(&client, &base, i).await
                } else {
                    let after = mix(!(i as u64)) % (created.load(Ordering::Relaxed) + 1);
                    list_items(&client, &base, after).await
                };
                sample.instance = instance;
                if sample.item.is_some() {
                    created.fetch_add(1, Ordering::Relaxed);
                }
                samples.push(sample);
                progress.inc(1);
            }
            samples
        }));
    }
    let mut samples = Vec::with_capacity(requests);
    for task in tasks {
        samples.extend(task.await?);
    }
    let elapsed = started.elapsed();

    // Close the client's connections, then let the servers finish.
    drop(client);
    let mut dbs = Vec::with_capacity(instances);
    let mut per_instance_layers = Vec::with_capacity(instances);
    for s in served {
        let _ = s.stop.send(());
        s.server.await??;
        per_instance_layers.push(s.metrics.as_ref().map(LayerReport::of));
        dbs.push(s.db);
    }
    let layer = if retry_layer {
        let parts: Vec<&LayerReport> = per_instance_layers.iter().flatten().collect();
        Some(LayerReport::total(&parts))
    } else {
        None
    };
    // The instances (all in this process, on one database) share its turn: one reading covers
    // them all.
    let write_turn = matches!(begin, Begin::WritePath | Begin::WriteThread).then(|| {
        let (mut transactions, mut busy) = (0, Duration::ZERO);
        if let (Some(db), Some(before)) = (dbs.first(), turns_before.first())
            && let Some(after) = db.write_stats()
        {
            transactions = after.transactions - before.map_or(0, |b| b.transactions);
            busy = after
                .busy
                .saturating_sub(before.map_or(Duration::ZERO, |b| b.busy));
        }
        TurnReport {
            transactions,
            busy_s: busy.as_secs_f64(),
            utilization: busy.as_secs_f64() / elapsed.as_secs_f64().max(1e-9),
        }
    });

    let tally = Tally::of(samples.iter());
    let acknowledged: Vec<Item> = samples.iter().filter_map(|s| s.item.clone()).collect();
    let instance_reports = per_instance_layers
        .into_iter()
        .enumerate()
        .map(|(i, layer)| {
            let t = Tally::of(samples.iter().filter(|s| s.instance == i));
            InstanceReport {
                instance: i + 1,
                clients: (0..clients).filter(|c| c % instances == i).count(),
                requests: t.requests,
                status_2xx: t.status_2xx,
                status_5xx: t.status_5xx,
                other: t.other,
                latency_ms: t.latency,
                layer,
            }
        })
        .collect();

    let integrity = check_integrity(setup.clone(), &acknowledged).await?;
    for db in &dbs {
        db.close().await;
    }
    if let Target::Url { .. } = target {
        setup.drop_table().await?;
    }
    setup.close().await;

    let n = tally.requests;
    let per_s = |count: u64| count as f64 / elapsed.as_secs_f64().max(1e-9);
    Ok(Report {
        label,
        retry_layer,
        begin,
        db: target.describe(),
        clients,
        requests: n,
        writes: tally.writes,
        reads: n - tally.writes,
        status_2xx: tally.status_2xx,
        status_5xx: tally.status_5xx,
        other: tally.other,
        transport_errors: tally.transport_errors,
        statuses: tally.statuses,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_rps: n as f64 / elapsed.as_secs_f64().max(1e-9),
        latency_ms: tally.latency,
        writes_2xx: tally.writes_2xx,
        reads_2xx: tally.status_2xx - tally.writes_2xx,
        writes_per_s: per_s(tally.writes_2xx),
        reads_per_s: per_s(tally.status_2xx - tally.writes_2xx),
        write_latency_ms: tally.write_latency,
        read_latency_ms: tally.read_latency,
        write_turn,
        layer,
        instances: instance_reports,
        integrity,
    })
}

/// The client-side counts over some samples.
struct Tally {
    requests: u64,
    writes: u64,
    /// Writes answered 2xx (counted in `status_2xx` too).
    writes_2xx: u64,
    status_2xx: u64,
    status_5xx: u64,
    other: u64,
    transport_errors: u64,
    statuses: BTreeMap<u16, u64>,
    latency: Latency,
    write_latency: Latency,
    read_latency: Latency,
}

impl Tally {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Self {
        let mut t = Self {
            requests: 0,
            writes: 0,
            writes_2xx: 0,
            status_2xx: 0,
            status_5xx: 0,
            other: 0,
            transport_errors: 0,
            statuses: BTreeMap::new(),
            latency: Latency::default(),
            write_latency: Latency::default(),
            read_latency: Latency::default(),
        };
        let mut latencies = Vec::new();
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        for s in samples {
            t.requests += 1;
            latencies.push(s.latency);
            if s.write {
                writes.push(s.latency);
            } else {
                reads.push(s.latency);
            }
            t.writes += u64::from(s.write);
            match s.status {
                None => {
                    t.transport_errors += 1;
                    t.other += 1;
                }
                Some(code) => {
                    *t.statuses.entry(code.as_u16()).or_insert(0) += 1;
                    if s.bad_body {
                        t.other += 1;
                    } else if code.is_success() {
                        t.status_2xx += 1;
                        t.writes_2xx += u64::from(s.write);
                    } else if code.is_server_error() {
                        t.status_5xx += 1;
                    } else {
                        t.other += 1;
                    }
                }
            }
        }
        t.latency = latency(&mut latencies);
        t.write_latency = latency(&mut writes);
        t.read_latency = latency(&mut reads);
        t
    }
}

/// One request, as the client saw it.
#[derive(Debug)]
struct Sample {
    /// The instance (0-based) that answered.
    instance: usize,
    write: bool,
    latency: Duration,
    /// `None`: no HTTP answer (connection error).
    status: Option<StatusCode>,
    /// A `201` whose body was not the item asked for.
    bad_body: bool,
    /// The item a `201` answered with.
    item: Option<Item>,
}

async fn post_item(client: &Client<HttpConnector, Full<Bytes>>, base: &str, i: usize) -> Sample {
    // Every request names its item uniquely, so a doubled insert shows as a repeated name.
    let name = format!("item-{i}");
    let body = serde_json::to_vec(&serde_json::json!({ "name": name })).expect("json");
    let req = Request::builder()
        .method(Method::POST)
        .uri(format!("{base}/items"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .expect("valid request");
    let (latency, answer) = send(client, req).await;
    let mut sample = Sample {
        instance: 0,
        write: true,
        latency,
        status: answer.as_ref().map(|(s, _)| *s),
        bad_body: false,
        item: None,
    };
    if let Some((StatusCode::CREATED, body)) = answer {
        match serde_json::from_slice::<Item>(&body) {
            Ok(item) if item.name == name => sample.item = Some(item),
            _ => sample.bad_body = true,
        }
    }
    sample
}

async fn list_items(client: &Client<HttpConnector, Full<Bytes>>, base: &str, after: u64) -> Sample {
    let req = Request::builder()
        .method(Method::GET)
        .uri(format!("{base}/items?limit=20&after={after}"))
        .body(Full::new(Bytes::new()))
        .expect("valid request");
    let (latency, answer) = send(client, req).await;
    Sample {
        instance: 0,
        write: false,
        latency,
        status: answer.map(|(s, _)| s),
        bad_body: false,
        item: None,
    }
}

/// Sends a request and reads the whole answer; the latency covers both.
async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> (Duration, Option<(StatusCode, Bytes)>) {
    let start = Instant::now();
    let answer = async {
        let res = client.request(req).await.ok()?;
        let status = res.status();
        let body = res.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    }
    .await;
    (start.elapsed(), answer)
}

/// Compares the table with the items answered `201 Created`.
pub(crate) async fn check_integrity(
    db: impl Into<Db>,
    acknowledged: &[Item],
) -> Result<Integrity, BoxError> {
    let rows = db.into().all_items().await?;

    let by_id: HashMap<i64, &Item> = rows.iter().map(|r| (r.id, r)).collect();
    let acked_ids: HashSet<i64> = acknowledged.iter().map(|a| a.id).collect();
    let lost = acknowledged
        .iter()
        .filter(|a| by_id.get(&a.id) != Some(a))
        .count() as u64;
    let unacknowledged = rows.iter().filter(|r| !acked_ids.contains(&r.id)).count() as u64;
    let names: HashSet<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    let seqs: HashSet<i64> = rows.iter().map(|r| r.seq).collect();
    let doubled = (rows.len() - names.len()) as u64;
    let duplicate_seqs = (rows.len() - seqs.len()) as u64;

    let acknowledged = acknowledged.len() as u64;
    let rows = rows.len() as u64;
    let ok = rows == acknowledged
        && lost == 0
        && unacknowledged == 0
        && doubled == 0
        && duplicate_seqs == 0;
    Ok(Integrity {
        acknowledged,
        rows,
        lost,
        unacknowledged,
        doubled,
        duplicate_seqs,
        ok,
    })
}

fn latency(latencies: &mut [Duration]) -> Latency {
    if latencies.is_empty() {
        return Latency::default();
    }
    latencies.sort_unstable();
    let at = |p: f64| {
        let rank = ((p / 100.0) * latencies.len() as f64).ceil() as usize;
        latencies[rank.clamp(1, latencies.len()) - 1].as_secs_f64() * 1000.0
    };
    Latency {
        p50: at(50.0),
        p95: at(95.0),
        p99: at(99.0),
        max: at(100.0),
    }
}

/// SplitMix64: a well-mixed hash of the request number, so the request mix is the same on
/// every run without a random number generator.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A hash mapped to `[0, 1)`.
fn unit(h: u64) -> f64 {
    (h >> 11) as f64 / (1u64 << 53) as f64
}
