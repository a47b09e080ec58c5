//! Overhead of `SqliteRetryLayer` when nothing goes wrong: in-process router calls
//! (`tower::ServiceExt::oneshot`), no socket, no database.
//!
//! ```text
//! cargo bench --bench overhead -- --warm-up-time 1 --measurement-time 3
//! ```
//!
//! Contenders on the same axum router (one route whose handler reads the whole body):
//!
//! - `bare`: the router alone;
//! - `head_copy`: the router behind a `map_request` that copies the request head once, as the
//!   layer must to replay (method, URI, version, headers, extensions): the floor of any
//!   replaying middleware, not a contender;
//! - `layer`: `Router::layer(SqliteRetryLayer::new(RetryPolicy::default()))` (no retry happens);
//! - `tower_retry`: `Router::layer` of tower's `Retry` with a policy that buffers the body into
//!   `Bytes` and copies the request head per attempt, as the layer does (`benches/common`).
//!
//! and three requests: `GET` without a body, `POST` 1 KiB and `POST` 64 KiB (with the headers a
//! real client sends).
//!
//! Criterion measures each pair in turn. Because the machine is shared (2 cores, other builds
//! running), the ratios are then measured once more **interleaved**: rounds in which every
//! contender runs a short batch, in rotating order, and the median of the per-round ratios is
//! reported. Both are printed and written to `benches/results/overhead.json`.
//!
//! A last pass serves the bare, layer and tower_retry routers over loopback HTTP/1.1 (one
//! keep-alive connection each, requests one after another), interleaved the same way: the
//! layer's cost as a share of a real request.
//!
//! Environment: `OVERHEAD_ROUNDS` (default 30) and `OVERHEAD_BATCH_MS` (default 20) size the
//! interleaved pass.

mod common;

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use criterion::{BatchSize, Criterion, criterion_group};
use http::{Request, StatusCode};
use tower::ServiceExt;
use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};

use common::{BufferedRetryLayer, ReplayPolicy};

/// The handler: reads the whole body, answers 200.
async fn handler(body: Bytes) -> StatusCode {
    black_box(body.len());
    StatusCode::OK
}

fn router() -> Router {
    Router::new().route("/items", get(handler).post(handler))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contender {
    Bare,
    HeadCopy,
    Layer,
    TowerRetry,
}

impl Contender {
    const ALL: [Contender; 4] = [
        Contender::Bare,
        Contender::HeadCopy,
        Contender::Layer,
        Contender::TowerRetry,
    ];

    fn name(self) -> &'static str {
        match self {
            Contender::Bare => "bare",
            Contender::HeadCopy => "head_copy",
            Contender::Layer => "layer",
            Contender::TowerRetry => "tower_retry",
        }
    }

    fn app(self) -> Router {
        match self {
            Contender::Bare => router(),
            Contender::HeadCopy => router().layer(tower::util::MapRequestLayer::new(copy_head)),
            Contender::Layer => router().layer(SqliteRetryLayer::new(RetryPolicy::default())),
            // The same numbers as the layer's defaults: 10 attempts, 2 ms doubling to 100 ms.
            Contender::TowerRetry => router().layer(BufferedRetryLayer::new(ReplayPolicy::new(
                Duration::from_millis(2),
                Duration::from_millis(100),
                1.0,
                10,
            ))),
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Size {
    Get,
    Post1K,
    Post64K,
}

impl Size {
    const ALL: [Size; 3] = [Size::Get, Size::Post1K, Size::Post64K];

    fn name(self) -> &'static str {
        match self {
            Size::Get => "GET",
            Size::Post1K => "POST 1 KiB",
            Size::Post64K => "POST 64 KiB",
        }
    }

    fn id(self) -> &'static str {
        match self {
            Size::Get => "get",
            Size::Post1K => "post_1k",
            Size::Post64K => "post_64k",
        }
    }

    fn payload(self) -> Bytes {
        match self {
            Size::Get => Bytes::new(),
            Size::Post1K => Bytes::from(vec![b'x'; 1024]),
            Size::Post64K => Bytes::from(vec![b'x'; 64 * 1024]),
        }
    }
}

/// A request as hyper would hand it to the router: a handful of headers, the body as one
/// chunk (`payload` is cloned: a refcount, never a copy).
fn request(size: Size, payload: &Bytes) -> Request<Body> {
    let builder = Request::builder()
        .uri("/items")
        .header("host", "127.0.0.1:3000")
        .header("user-agent", "bench/1.0")
        .header("accept", "*/*");
    match size {
        Size::Get => builder.method("GET").body(Body::empty()),
        Size::Post1K | Size::Post64K => builder
            .method("POST")
            .header("content-type", "application/octet-stream")
            .header("content-length", payload.len())
            .body(Body::from(payload.clone())),
    }
    .expect("valid request")
}

/// The floor of any replaying middleware: one copy of the request head (method, URI, version,
/// headers, extensions), as the layer makes it, and nothing else.
fn copy_head(req: Request<Body>) -> Request<Body> {
    let mut copy = Request::new(());
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    black_box(copy);
    req
}

async fn call(app: &Router, req: Request<Body>) {
    let res = app.clone().oneshot(req).await.expect("infallible");
    assert_eq!(res.status(), StatusCode::OK);
    black_box(res);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn bench_overhead(c: &mut Criterion) {
    let rt = runtime();
    for size in Size::ALL {
        let payload = size.payload();
        let mut group = c.benchmark_group(format!("overhead/{}", size.id()));
        for contender in Contender::ALL {
            let app = contender.app();
            group.bench_function(contender.name(), |b| {
                b.to_async(&rt).iter_batched(
                    || request(size, &payload),
                    |req| call(&app, req),
                    BatchSize::SmallInput,
                );
            });
        }
        group.finish();
    }
}

criterion_group!(benches, bench_overhead);

/// One interleaved measurement: ns per request of each contender, per round.
#[derive(Debug, serde::Serialize)]
struct SizeResult {
    request: &'static str,
    /// Median over rounds of ns per request.
    ns_per_request: Vec<(&'static str, f64)>,
    /// Criterion's median estimate (ns), when its report was found.
    criterion_median_ns: Vec<(&'static str, Option<f64>)>,
    /// Median over rounds of the per-round ratio.
    head_copy_vs_bare: f64,
    layer_vs_bare: f64,
    tower_vs_bare: f64,
    layer_vs_tower: f64,
    /// The spread of `layer_vs_bare` over rounds (10th and 90th percentile).
    layer_vs_bare_p10_p90: (f64, f64),
    rounds: usize,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn percentile(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Times `iters` requests of one contender; ns per request. Requests are built before the
/// clock starts.
fn time_batch(
    rt: &tokio::runtime::Runtime,
    app: &Router,
    size: Size,
    payload: &Bytes,
    iters: usize,
) -> f64 {
    let reqs: Vec<_> = (0..iters).map(|_| request(size, payload)).collect();
    rt.block_on(async {
        let start = Instant::now();
        for req in reqs {
            call(app, req).await;
        }
        start.elapsed().as_nanos() as f64 / iters as f64
    })
}

fn criterion_dir() -> PathBuf {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return PathBuf::from(home);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("criterion")
}

/// Criterion's median estimate for one benchmark, from its `estimates.json`.
fn criterion_median(size: Size, contender: Contender) -> Option<f64> {
    let path = criterion_dir()
        .join(format!("overhead_{}", size.id()))
        .join(contender.name())
        .join("new/estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    v["median"]["point_estimate"].as_f64()
}

fn interleaved() -> Vec<SizeResult> {
    let rt = runtime();
    let rounds = env_usize("OVERHEAD_ROUNDS", 30).max(3);
    let batch = Duration::from_millis(env_usize("OVERHEAD_BATCH_MS", 20) as u64);
    let apps: Vec<(Contender, Router)> = Contender::ALL.iter().map(|c| (*c, c.app())).collect();
    let mut out = Vec::new();
    for size in Size::ALL {
        let payload = size.payload();
        // Calibrate: how many requests fill one batch (on the bare router, after a warm-up).
        for (_, app) in &apps {
            time_batch(&rt, app, size, &payload, 2000);
        }
        let per = time_batch(&rt, &apps[0].1, size, &payload, 2000);
        let iters = ((batch.as_nanos() as f64 / per) as usize).clamp(100, 100_000);
        let mut samples: Vec<Vec<f64>> = vec![Vec::new(); apps.len()];
        for round in 0..rounds {
            for k in 0..apps.len() {
                let i = (k + round) % apps.len();
                samples[i].push(time_batch(&rt, &apps[i].1, size, &payload, iters));
            }
        }
        let ratio = |a: usize, b: usize| -> Vec<f64> {
            samples[a]
                .iter()
                .zip(&samples[b])
                .map(|(x, y)| x / y)
                .collect()
        };
        let mut hb = ratio(1, 0);
        let mut lb = ratio(2, 0);
        let mut tb = ratio(3, 0);
        let mut lt = ratio(2, 3);
        let spread = (percentile(&mut lb, 10.0), percentile(&mut lb, 90.0));
        out.push(SizeResult {
            request: size.name(),
            ns_per_request: apps
                .iter()
                .zip(samples.iter_mut())
                .map(|((c, _), s)| (c.name(), median(s)))
                .collect(),
            criterion_median_ns: Contender::ALL
                .iter()
                .map(|c| (c.name(), criterion_median(size, *c)))
                .collect(),
            head_copy_vs_bare: median(&mut hb),
            layer_vs_bare: median(&mut lb),
            tower_vs_bare: median(&mut tb),
            layer_vs_tower: median(&mut lt),
            layer_vs_bare_p10_p90: spread,
            rounds,
        });
    }
    out
}

/// The same contenders served over loopback HTTP/1.1 (one keep-alive connection per
/// contender, requests one after another), interleaved as above: the layer's cost as a share of
/// a real request, before any database work.
#[derive(Debug, serde::Serialize)]
struct HttpResult {
    request: &'static str,
    /// Median over rounds of µs per request.
    us_per_request: Vec<(&'static str, f64)>,
    layer_vs_bare: f64,
    tower_vs_bare: f64,
    layer_vs_tower: f64,
    rounds: usize,
}

fn http_pass() -> Vec<HttpResult> {
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let rounds = env_usize("OVERHEAD_ROUNDS", 30).max(3);
    let batch = Duration::from_millis(env_usize("OVERHEAD_BATCH_MS", 20) as u64);
    rt.block_on(async {
        let mut addrs = Vec::new();
        for c in [Contender::Bare, Contender::Layer, Contender::TowerRetry] {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            addrs.push((c, listener.local_addr().expect("addr")));
            let app = c.app();
            tokio::spawn(async move { axum::serve(listener, app).await });
        }
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let send = |addr: std::net::SocketAddr, size: Size, payload: Bytes| {
            let client = client.clone();
            async move {
                let builder = Request::builder()
                    .uri(format!("http://{addr}/items"))
                    .header("user-agent", "bench/1.0")
                    .header("accept", "*/*");
                let req = match size {
                    Size::Get => builder.method("GET").body(Full::new(Bytes::new())),
                    _ => builder
                        .method("POST")
                        .header("content-type", "application/octet-stream")
                        .body(Full::new(payload)),
                }
                .expect("request");
                let res = client.request(req).await.expect("response");
                assert_eq!(res.status(), StatusCode::OK);
                black_box(res.into_body().collect().await.expect("body"));
            }
        };
        let mut out = Vec::new();
        for size in Size::ALL {
            let payload = size.payload();
            let time = |addr, n: usize| {
                let payload = payload.clone();
                let send = &send;
                async move {
                    let start = Instant::now();
                    for _ in 0..n {
                        send(addr, size, payload.clone()).await;
                    }
                    start.elapsed().as_nanos() as f64 / 1000.0 / n as f64
                }
            };
            for (_, addr) in &addrs {
                time(*addr, 200).await;
            }
            let per = time(addrs[0].1, 200).await;
            let iters = ((batch.as_micros() as f64 / per) as usize).clamp(20, 10_000);
            let mut samples: Vec<Vec<f64>> = vec![Vec::new(); addrs.len()];
            for round in 0..rounds {
                for k in 0..addrs.len() {
                    let i = (k + round) % addrs.len();
                    samples[i].push(time(addrs[i].1, iters).await);
                }
            }
            let ratio = |a: usize, b: usize| -> Vec<f64> {
                samples[a]
                    .iter()
                    .zip(&samples[b])
                    .map(|(x, y)| x / y)
                    .collect()
            };
            let (mut lb, mut tb, mut lt) = (ratio(1, 0), ratio(2, 0), ratio(1, 2));
            out.push(HttpResult {
                request: size.name(),
                us_per_request: addrs
                    .iter()
                    .zip(samples.iter_mut())
                    .map(|((c, _), s)| (c.name(), median(s)))
                    .collect(),
                layer_vs_bare: median(&mut lb),
                tower_vs_bare: median(&mut tb),
                layer_vs_tower: median(&mut lt),
                rounds,
            });
        }
        out
    })
}

fn print_http_table(results: &[HttpResult]) {
    println!("### Overhead over loopback HTTP/1.1 (interleaved, median of per-round ratios)");
    println!();
    println!(
        "| request | bare µs | layer µs | tower_retry µs | layer/bare | tower_retry/bare | layer/tower_retry |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in results {
        let us = |i: usize| r.us_per_request[i].1;
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} |",
            r.request,
            us(0),
            us(1),
            us(2),
            r.layer_vs_bare,
            r.tower_vs_bare,
            r.layer_vs_tower,
        );
    }
    println!();
}

fn print_table(results: &[SizeResult]) {
    println!();
    println!("### Overhead (interleaved, median of per-round ratios)");
    println!();
    println!(
        "| request | bare ns | head_copy ns | layer ns | tower_retry ns | head_copy/bare | layer/bare | tower_retry/bare | layer/tower_retry | layer/bare p10–p90 |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in results {
        let ns = |i: usize| r.ns_per_request[i].1;
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3}–{:.3} |",
            r.request,
            ns(0),
            ns(1),
            ns(2),
            ns(3),
            r.head_copy_vs_bare,
            r.layer_vs_bare,
            r.tower_vs_bare,
            r.layer_vs_tower,
            r.layer_vs_bare_p10_p90.0,
            r.layer_vs_bare_p10_p90.1,
        );
    }
    if results
        .iter()
        .all(|r| r.criterion_median_ns.iter().all(|(_, m)| m.is_some()))
    {
        println!();
        println!("### Overhead (criterion medians, each benchmark measured in turn)");
        println!();
        println!(
            "| request | bare ns | head_copy ns | layer ns | tower_retry ns | layer/bare | tower_retry/bare | layer/tower_retry |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        for r in results {
            let m = |i: usize| r.criterion_median_ns[i].1.unwrap_or(f64::NAN);
            println!(
                "| {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.3} | {:.3} | {:.3} |",
                r.request,
                m(0),
                m(1),
                m(2),
                m(3),
                m(2) / m(0),
                m(3) / m(0),
                m(2) / m(3),
            );
        }
    }
    println!();
}

fn main() {
    benches();
    criterion::Criterion::default()
        .configure_from_args()
        .final_summary();
    // `cargo bench` passes `--bench`; `cargo test --benches` does not (criterion then runs
    // every benchmark once, as a test): the interleaved pass is for real runs only.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let results = interleaved();
    print_table(&results);
    let http = http_pass();
    print_http_table(&http);
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
    std::fs::create_dir_all(&dir).expect("results dir");
    let json = serde_json::to_string_pretty(&serde_json::json!({
        "bench": "overhead",
        "method": "in-process oneshot calls on an axum Router; interleaved rounds, median of per-round ratios",
        "results": results,
        "loopback_http": http,
    }))
    .expect("json");
    std::fs::write(dir.join("overhead.json"), json + "\n").expect("write overhead.json");
    println!("wrote {}", dir.join("overhead.json").display());
}
