//! The load driver of `examples/contention.rs`, shared with `tests/app.rs`: serves the example
//! app on a real loopback socket, drives concurrent HTTP clients against it, and checks what
//! was committed against what was acknowledged.
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
use sqlx::SqlitePool;
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::app_lib::{Item, RetryPolicies, open_pool, router};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// One run: a fresh database file, the app with or without the retry layers, and `clients`
/// concurrent clients sending `requests` requests in all.
#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    /// A name for the report (`"without layer"`, `"with layer"`).
    pub(crate) label: String,
    /// The SQLite file; created if missing. Use a fresh one for every run.
    pub(crate) db_path: PathBuf,
    pub(crate) clients: usize,
    pub(crate) requests: usize,
    /// The share of requests that are `POST /items` (the rest are `GET /items`), `0.0..=1.0`.
    pub(crate) write_ratio: f64,
    pub(crate) pool_size: u32,
    pub(crate) busy_timeout: Duration,
    /// `None` serves the app without any retry layer.
    pub(crate) retry: Option<RetryPolicies>,
    /// Advanced once per finished request (pass `ProgressBar::hidden()` for none).
    pub(crate) progress: ProgressBar,
}

/// What one run measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Report {
    pub(crate) label: String,
    pub(crate) retry_layer: bool,
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
    /// The layers' counters; `None` without them.
    pub(crate) layer: Option<LayerReport>,
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
    /// Requests by attempts made: index 0 = one attempt (the last bucket: that many or more).
    pub(crate) attempts_histogram: Vec<u64>,
    /// Requests the layer gave up on (`exhausted`, `deadline`, `budget_exhausted`).
    pub(crate) gave_up: u64,
    /// Everything, as `GET /stats` shows it.
    pub(crate) stats: serde_json::Value,
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

/// Runs one scenario to the end and reports. The database file is left in place.
pub(crate) async fn run(scenario: Scenario) -> Result<Report, BoxError> {
    let Scenario {
        label,
        db_path,
        clients,
        requests,
        write_ratio,
        pool_size,
        busy_timeout,
        retry,
        progress,
    } = scenario;
    let retry_layer = retry.is_some();

    let pool = open_pool(&db_path, pool_size, busy_timeout).await?;
    let (app, metrics) = router(pool.clone(), retry);

    // A real server on a real socket: what a client sees, keep-alive and all.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = stopped.await;
            })
            .await
    });

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let base = format!("http://{addr}");
    let next = Arc::new(AtomicUsize::new(0));
    let created = Arc::new(AtomicU64::new(0));

    let started = Instant::now();
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients.max(1) {
        let client = client.clone();
        let base = base.clone();
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
                let sample = if write {
                    post_item(&client, &base, i).await
                } else {
                    let after = mix(!(i as u64)) % (created.load(Ordering::Relaxed) + 1);
                    list_items(&client, &base, after).await
                };
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

    // Close the client's connections, then let the server finish.
    drop(client);
    let _ = stop.send(());
    server.await??;

    let layer = metrics.map(|m| {
        let snap = m.snapshot();
        LayerReport {
            retries: snap.retries(),
            attempts_histogram: snap.attempts_histogram(),
            gave_up: snap.gave_up(),
            stats: snap.to_json(),
        }
    });

    let mut statuses = BTreeMap::new();
    let (mut status_2xx, mut status_5xx, mut other, mut transport_errors) = (0, 0, 0, 0);
    let mut latencies: Vec<Duration> = Vec::with_capacity(samples.len());
    let mut acknowledged = Vec::new();
    let mut writes = 0;
    for s in samples.iter() {
        latencies.push(s.latency);
        writes += u64::from(s.write);
        match s.status {
            None => {
                transport_errors += 1;
                other += 1;
            }
            Some(code) => {
                *statuses.entry(code.as_u16()).or_insert(0u64) += 1;
                if s.bad_body {
                    other += 1;
                } else if code.is_success() {
                    status_2xx += 1;
                } else if code.is_server_error() {
                    status_5xx += 1;
                } else {
                    other += 1;
                }
            }
        }
        if let Some(item) = &s.item {
            acknowledged.push(item.clone());
        }
    }

    let integrity = check_integrity(&pool, &acknowledged).await?;
    pool.close().await;

    let n = samples.len() as u64;
    Ok(Report {
        label,
        retry_layer,
        db: db_path.display().to_string(),
        clients,
        requests: n,
        writes,
        reads: n - writes,
        status_2xx,
        status_5xx,
        other,
        transport_errors,
        statuses,
        elapsed_s: elapsed.as_secs_f64(),
        throughput_rps: n as f64 / elapsed.as_secs_f64().max(1e-9),
        latency_ms: latency(&mut latencies),
        layer,
        integrity,
    })
}

/// One request, as the client saw it.
#[derive(Debug)]
struct Sample {
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
    pool: &SqlitePool,
    acknowledged: &[Item],
) -> Result<Integrity, BoxError> {
    let rows: Vec<Item> =
        sqlx::query_as::<_, (i64, i64, String)>("SELECT id, seq, name FROM items ORDER BY id")
            .fetch_all(pool)
            .await?
            .into_iter()
            .map(Item::from)
            .collect();

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
