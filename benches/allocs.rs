//! Heap allocations per request, bare router against `SqliteRetryLayer` (and the
//! `tower::retry` competitor), counted by a global allocator.
//!
//! ```text
//! cargo bench --bench allocs
//! ```
//!
//! The counting allocator is `stats_alloc`'s instrumented `System` (no `unsafe` here: the crate
//! forbids it). The requests are built before counting starts; what is counted is everything
//! the router stack allocates to answer one request (routing, extractors, the layer, the
//! response). The runtime is tokio's current-thread one, so no other thread allocates while
//! counting.
//!
//! A fourth contender, `bare + head copy`, is the bare router behind a `map_request` that makes
//! one copy of the request head exactly as the layer does (method, URI, version, headers,
//! extensions): the yardstick for the issue's rule that the layer adds no more than one copy of
//! the head.
//!
//! With the `metrics` feature (`cargo bench --features metrics --bench allocs`), `layer` emits
//! its metrics into the facade's no-op recorder (none is installed), and a fifth contender,
//! `layer + prometheus`, into `metrics-exporter-prometheus`' recorder, set for this thread.
//!
//! Results go to stdout (Markdown) and `benches/results/allocs.json`.
//!
//! `ALLOCS_ONLY=layer` (contenders, comma-separated; `bare` always runs) and
//! `ALLOCS_SIZES=GET` narrow a run, e.g. to count instructions per request under
//! `valgrind --tool=callgrind` (the difference between two runs with different
//! `ALLOCS_REQUESTS`, see BENCHMARKS.md); a narrowed run records nothing.

mod common;

use std::alloc::System;
use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::ServiceExt;
use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};

use common::{BufferedRetryLayer, ReplayPolicy};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

async fn handler(body: Bytes) -> StatusCode {
    black_box(body.len());
    StatusCode::OK
}

fn router() -> Router {
    Router::new().route("/items", get(handler).post(handler))
}

/// One copy of the head, as the layer makes it for an attempt.
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

const CONTENDERS: &[&str] = &[
    "bare",
    "bare + head copy",
    "layer",
    "tower_retry",
    #[cfg(feature = "metrics")]
    "layer + prometheus",
];

fn app(contender: &str) -> Router {
    match contender {
        "bare" => router(),
        "bare + head copy" => router().layer(tower::util::MapRequestLayer::new(copy_head)),
        "layer" | "layer + prometheus" => {
            router().layer(SqliteRetryLayer::new(RetryPolicy::default()))
        }
        "tower_retry" => router().layer(BufferedRetryLayer::new(ReplayPolicy::new(
            Duration::from_millis(2),
            Duration::from_millis(100),
            1.0,
            10,
        ))),
        other => unreachable!("{other}"),
    }
}

const SIZES: [(&str, usize); 3] = [("GET", 0), ("POST 1 KiB", 1024), ("POST 64 KiB", 64 * 1024)];

fn request(len: usize, payload: &Bytes) -> Request<Body> {
    let builder = Request::builder()
        .uri("/items")
        .header("host", "127.0.0.1:3000")
        .header("user-agent", "bench/1.0")
        .header("accept", "*/*");
    if len == 0 {
        builder.method("GET").body(Body::empty())
    } else {
        builder
            .method("POST")
            .header("content-type", "application/octet-stream")
            .header("content-length", len)
            .body(Body::from(payload.clone()))
    }
    .expect("valid request")
}

#[derive(Debug, serde::Serialize)]
struct Row {
    request: &'static str,
    contender: &'static str,
    allocations_per_request: f64,
    bytes_per_request: f64,
    reallocations_per_request: f64,
    /// `allocations_per_request` minus the bare router's.
    extra_allocations: f64,
    extra_bytes: f64,
}

fn main() {
    // `cargo test --benches` runs this without `--bench`: a short run then.
    let requests: usize = if std::env::args().any(|a| a == "--bench") {
        std::env::var("ALLOCS_REQUESTS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(2000)
    } else {
        20
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // `ALLOCS_ONLY=layer` runs the bare router and the named contenders only (e.g. under
    // `valgrind --tool=dhat`, to see where one contender allocates).
    let only = std::env::var("ALLOCS_ONLY").ok();
    let picked = |c: &str| {
        c == "bare"
            || only
                .as_deref()
                .is_none_or(|o| o.split(',').any(|n| n.trim() == c))
    };
    // `ALLOCS_SIZES=GET` (or `POST 1 KiB`, ...) runs those requests only.
    let sizes = std::env::var("ALLOCS_SIZES").ok();
    let mut rows: Vec<Row> = Vec::new();
    for (size, len) in SIZES.into_iter().filter(|(s, _)| {
        sizes
            .as_deref()
            .is_none_or(|o| o.split(',').any(|n| n.trim() == *s))
    }) {
        let payload = Bytes::from(vec![b'x'; len]);
        let mut bare = (0.0, 0.0);
        for &contender in CONTENDERS.iter().filter(|c| picked(c)) {
            // The recorder (built before counting starts) takes this thread's metrics for the
            // contender's warm-up and run.
            #[cfg(feature = "metrics")]
            let prometheus = (contender == "layer + prometheus")
                .then(|| metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder());
            #[cfg(feature = "metrics")]
            let _local = prometheus
                .as_ref()
                .map(|r| metrics::set_default_local_recorder(r));
            let app = app(contender);
            // Warm up: lazily initialised statics, thread-local RNGs, tracing callsites.
            rt.block_on(async {
                for _ in 0..100 {
                    let res = app.clone().oneshot(request(len, &payload)).await.unwrap();
                    assert_eq!(res.status(), StatusCode::OK);
                }
            });
            let reqs: Vec<_> = (0..requests).map(|_| request(len, &payload)).collect();
            let mut responses = Vec::with_capacity(requests);
            let region = Region::new(GLOBAL);
            rt.block_on(async {
                for req in reqs {
                    responses.push(app.clone().oneshot(req).await.unwrap());
                }
            });
            let stats = region.change();
            assert!(responses.iter().all(|r| r.status() == StatusCode::OK));
            drop(responses);
            let n = requests as f64;
            let allocs = stats.allocations as f64 / n;
            let bytes = stats.bytes_allocated as f64 / n;
            if contender == "bare" {
                bare = (allocs, bytes);
            }
            rows.push(Row {
                request: size,
                contender,
                allocations_per_request: allocs,
                bytes_per_request: bytes,
                reallocations_per_request: stats.reallocations as f64 / n,
                extra_allocations: allocs - bare.0,
                extra_bytes: bytes - bare.1,
            });
        }
    }

    println!();
    println!("### Heap allocations per request ({requests} requests each)");
    println!();
    println!(
        "| request | contender | allocs/req | bytes/req | reallocs/req | extra allocs vs bare | extra bytes vs bare |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {:.0} | {:.2} | {:+.2} | {:+.0} |",
            r.request,
            r.contender,
            r.allocations_per_request,
            r.bytes_per_request,
            r.reallocations_per_request,
            r.extra_allocations,
            r.extra_bytes
        );
    }
    println!();
    // A filtered run (`ALLOCS_ONLY`, `ALLOCS_SIZES`) leaves the recorded results alone.
    if requests >= 1000 && only.is_none() && sizes.is_none() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/results");
        std::fs::create_dir_all(&dir).expect("results dir");
        let json = serde_json::to_string_pretty(&serde_json::json!({
            "bench": "allocs",
            "requests_per_cell": requests,
            "rows": rows,
        }))
        .expect("json");
        std::fs::write(dir.join("allocs.json"), json + "\n").expect("write allocs.json");
        println!("wrote {}", dir.join("allocs.json").display());
    }
}
