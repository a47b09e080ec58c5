//! What the layer allocates for a request that needs no retry, over real HTTP, pinned: a
//! change that allocates more per `GET` or per `POST` fails here (a counting allocator, not a
//! speed test).
//!
//! The same axum app is served over loopback (hyper, as in production: header values are
//! slices of the connection's read buffer) with and without `SqliteRetryLayer`, and a plain
//! `TcpStream` client sends the same bytes on one keep-alive connection. Every allocation of
//! the process is counted (this binary's global allocator; one test, so nothing else runs), so
//! the client's, hyper's and the handler's are in both counts alike: the difference per request
//! is the layer's.

use std::alloc::System;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;

use axum::Router;
use axum::routing::{get, post};
use bytes::Bytes;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};

/// `tower::retry` made to replay axum requests as a careful user would (the benches' own
/// competitor): printed beside the layer, for what any replaying middleware allocates.
#[path = "../benches/common/mod.rs"]
mod competitor;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Allocations the layer may add to a `GET` with no body, and to a 1 KiB `POST` (the body
/// buffered for a replay), over the same app without it, measured by this test's own printout
/// (`cargo test --test allocations -- --nocapture`; the count is exact, the same in every run
/// and build profile). Lower them with the code, never raise them without a reason written
/// here. Where the 14 of a `GET` go, about (BENCHMARKS.md, "What does the layer cost a
/// request that needs no retry?"): the copy of the head a replay needs, 7 (the header map's
/// two tables; the extensions' map, one box per extension axum's routing put there, and the
/// path parameters' vector); clones of the inner service (axum's `Route`, a box each): the
/// one the future keeps for a replay, and the one in the layer's service that axum's routing
/// clones for every request; the `Attempt` extension (its box, and the map growing for it);
/// the request's shared state (`Arc<RequestState>`); the replayable body boxed into axum's
/// `Body`; the layer's future boxed by axum's route.
const MAX_EXTRA_PER_GET: f64 = 14.0;
const MAX_EXTRA_PER_POST: f64 = 16.0;

const REQUESTS: usize = 2_000;
const WARM_UP: usize = 200;

#[derive(Clone, Copy, PartialEq)]
enum Wrap {
    Bare,
    Layer,
    TowerRetry,
}

fn app(wrap: Wrap) -> Router {
    let router = Router::new()
        .route("/items/{id}", get(|| async { "an item" }))
        .route(
            "/items",
            post(|body: Bytes| async move { body.len().to_string() }),
        );
    let router = match wrap {
        Wrap::Bare => router,
        Wrap::Layer => router.layer(SqliteRetryLayer::new(RetryPolicy::default())),
        Wrap::TowerRetry => router.layer(competitor::BufferedRetryLayer::new(
            competitor::ReplayPolicy::new(
                std::time::Duration::from_millis(10),
                std::time::Duration::from_secs(1),
                0.5,
                10,
            ),
        )),
    };
    // As `axum::serve` does (`into_make_service`): the routes are made once, not per request.
    router.with_state(())
}

fn get_request() -> Vec<u8> {
    b"GET /items/7 HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: allocations/1.0\r\naccept: */*\r\n\r\n"
        .to_vec()
}

fn post_request() -> Vec<u8> {
    let mut request = b"POST /items HTTP/1.1\r\nhost: 127.0.0.1\r\nuser-agent: allocations/1.0\r\n\
        content-type: application/octet-stream\r\ncontent-length: 1024\r\n\r\n"
        .to_vec();
    request.extend(std::iter::repeat_n(b'x', 1024));
    request
}

/// Reads one response (status line, headers, a `content-length` body); its status.
fn read_response(reader: &mut BufReader<TcpStream>, line: &mut String, body: &mut Vec<u8>) -> u16 {
    line.clear();
    reader.read_line(line).expect("a status line");
    let status = line[9..12].parse().expect("a status code");
    let mut length = 0;
    loop {
        line.clear();
        reader.read_line(line).expect("a header line");
        if line == "\r\n" {
            break;
        }
        if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
            length = value.trim().parse().expect("a length");
        }
    }
    body.resize(length, 0);
    reader.read_exact(body).expect("the body");
    status
}

/// Allocations per request of the whole process, for `REQUESTS` requests of `request` on one
/// connection to `app`, after a warm-up.
fn allocations_per_request(app: Router, request: &[u8]) -> f64 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let server = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            // One connection, then the server ends with it.
            let (stream, _) = listener.accept().await.unwrap();
            let service = hyper_util::service::TowerToHyperService::new(app);
            hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await
                .unwrap();
        });
    });
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    let (mut line, mut body) = (String::with_capacity(256), Vec::with_capacity(2048));
    let mut send = |n: usize| {
        for _ in 0..n {
            writer.write_all(request).unwrap();
            assert_eq!(read_response(&mut reader, &mut line, &mut body), 200);
        }
    };
    send(WARM_UP);
    let region = Region::new(GLOBAL);
    send(REQUESTS);
    let counted = region.change().allocations;
    drop(writer);
    drop(reader);
    server.join().unwrap();
    counted as f64 / REQUESTS as f64
}

#[test]
fn the_layer_allocates_at_most_its_pinned_count_per_request() {
    let mut report = Vec::new();
    for (what, request, most) in [
        ("GET", get_request(), MAX_EXTRA_PER_GET),
        ("POST 1 KiB", post_request(), MAX_EXTRA_PER_POST),
    ] {
        let bare = allocations_per_request(app(Wrap::Bare), &request);
        let layer = allocations_per_request(app(Wrap::Layer), &request);
        let tower = allocations_per_request(app(Wrap::TowerRetry), &request);
        let extra = layer - bare;
        println!(
            "{what}: bare {bare:.2}, layer {layer:.2} (+{extra:.2}), tower::retry {tower:.2} \
             (+{:.2}) allocations per request",
            tower - bare
        );
        report.push((what, extra, most));
    }
    // (A stray allocation or two over the run, a timer's or the connection's, is not the
    // layer's: 0.01 per request is 20 of them.)
    for (what, extra, most) in report {
        assert!(
            extra <= most + 0.01,
            "{what}: the layer allocates {extra:.2} more per request than the bare app, over the \
             pinned {most}"
        );
    }
}
