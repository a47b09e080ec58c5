//! What buffering a body for replay really costs in memory, measured with a counting
//! allocator (this binary's global allocator; one test, so nothing else allocates meanwhile).
//!
//! The in-flight cap (`max_buffered_bytes`) counts the memory the layer holds, not the
//! payload: a body sent as 65,536 one-byte frames must cost about 64 KiB, not a `Bytes`
//! handle per byte; and a small body must not keep alive the (much larger) read buffer its
//! frame was cut from. Frames here are what hyper hands over: slices of one shared read
//! buffer, not an allocation each (which would hide both costs).

use std::alloc::System;
use std::convert::Infallible;

use axum::body::Body;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{Request, Response};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::{ServiceBuilder, ServiceExt};
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const PAYLOAD: usize = 64 * 1024;
const READ_BUFFER: usize = 8 * 1024;

/// The heap held now that was not held when `region` began.
fn held(region: &Region<'_, System>) -> i64 {
    let change = region.change();
    change.bytes_allocated as i64 - change.bytes_deallocated as i64
        + change.bytes_reallocated as i64
}

#[test]
fn buffered_bodies_cost_what_is_counted() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // One test: nothing else allocates while a region is measured.
    rt.block_on(one_byte_frames_cost_their_payload_not_a_handle_each());
    rt.block_on(a_small_body_does_not_pin_its_read_buffer());
    rt.block_on(abandoned_writes_free_what_they_captured());
}

async fn one_byte_frames_cost_their_payload_not_a_handle_each() {
    {
        let layer = SqliteRetryLayer::new(RetryPolicy::default());
        let metrics = layer.metrics();
        let svc = ServiceBuilder::new().layer(layer).service_fn(
            |req: Request<ReplayBody<Body>>| async move {
                let body = req.into_body().collect().await.unwrap().to_bytes();
                Ok::<_, Infallible>(Response::new(Body::from(body.len().to_string())))
            },
        );
        let (mut tx, rx) = futures::channel::mpsc::channel::<Bytes>(0);
        let body = Body::new(StreamBody::new(
            rx.map(|b| Ok::<_, Infallible>(Frame::data(b))),
        ));

        let request = tokio::spawn(svc.oneshot(Request::post("/").body(body).unwrap()));
        // Read buffers of 8 KiB (hyper's first size), each cut into one-byte frames.
        let read_buffers: Vec<Bytes> = (0..PAYLOAD / READ_BUFFER)
            .map(|k| Bytes::from(vec![k as u8; READ_BUFFER]))
            .collect();
        let region = Region::new(GLOBAL);
        for i in 0..PAYLOAD {
            let frame = read_buffers[i / READ_BUFFER].slice(i % READ_BUFFER..i % READ_BUFFER + 1);
            tx.send(frame).await.unwrap();
            tokio::task::yield_now().await;
        }
        while metrics.snapshot().buffered_bytes < PAYLOAD {
            tokio::task::yield_now().await;
        }
        // Everything sent is buffered, the stream is still open: what is held now?
        let change = region.change();
        let held = held(&region);
        let counted = metrics.snapshot().buffered_bytes;
        eprintln!(
            "payload {PAYLOAD} B in {PAYLOAD} frames: heap held {held} B ({:.2} B per payload byte), \
             counted against the in-flight cap {counted} B; {} allocations, {} frees",
            held as f64 / PAYLOAD as f64,
            change.allocations,
            change.deallocations,
        );
        assert!(
            (PAYLOAD..=2 * PAYLOAD).contains(&counted),
            "counted {counted}"
        );
        // The buffer (at most twice the payload while it grows), plus the request's own
        // state; a handle per frame would be 32 B × 65,536 = 2 MiB on its own.
        assert!(
            held <= (2 * PAYLOAD + 64 * 1024) as i64,
            "held {held} B for a {PAYLOAD} B body"
        );
        assert!(
            held <= counted as i64 + 64 * 1024,
            "the cap counts what is held: held {held}, counted {counted}"
        );

        drop(tx);
        let res = request.await.unwrap().unwrap();
        let text = res.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(text, PAYLOAD.to_string());
        assert_eq!(metrics.snapshot().buffered_bytes, 0);
    }
}

async fn a_small_body_does_not_pin_its_read_buffer() {
    const SMALL: usize = 100;
    const BIG: usize = 1024 * 1024;
    let layer = SqliteRetryLayer::new(RetryPolicy::default());
    let metrics = layer.metrics();
    let (entered_tx, entered) = tokio::sync::oneshot::channel::<()>();
    let (go_tx, go) = tokio::sync::oneshot::channel::<()>();
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some((entered_tx, go))));
    let svc =
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |req: Request<ReplayBody<Body>>| {
                let (entered_tx, go) = slot.lock().unwrap().take().unwrap();
                async move {
                    // The body is buffered (the layer holds it); wait while the test measures.
                    entered_tx.send(()).unwrap();
                    go.await.unwrap();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    Ok::<_, Infallible>(Response::new(Body::from(body.len().to_string())))
                }
            });
    let region = Region::new(GLOBAL);
    // A read buffer of 1 MiB, of which the request's one frame is the first 100 bytes.
    let frame = Bytes::from(vec![7u8; BIG]).slice(..SMALL);
    let body = Body::new(StreamBody::new(futures::stream::iter([
        Ok::<_, Infallible>(Frame::data(frame)),
    ])));
    let request = tokio::spawn(svc.oneshot(Request::post("/").body(body).unwrap()));
    entered.await.unwrap();
    let held = held(&region);
    let counted = metrics.snapshot().buffered_bytes;
    eprintln!(
        "a {SMALL} B body cut from a {BIG} B read buffer: heap held {held} B, counted {counted} B"
    );
    assert!(counted >= SMALL, "counted {counted}");
    assert!(
        held <= counted as i64 + 64 * 1024,
        "the cap counts what is held: held {held} B, counted {counted} B"
    );
    go_tx.send(()).unwrap();
    let res = request.await.unwrap().unwrap();
    let text = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(text, SMALL.to_string());
    assert_eq!(metrics.snapshot().buffered_bytes, 0);
}

/// The writer thread's inbox holds what its callers' closures captured only while they wait:
/// while the writer thread waits for another connection's lock, 10,000 callers each send a
/// closure holding 1 MiB and leave (their future dropped once the closure is in line). What
/// the heap holds stays flat (a few MiB at most), not 10,000 MiB, nor the inbox's 512 MiB.
async fn abandoned_writes_free_what_they_captured() {
    use tower_sqlite_retry::write::{WriteThread, WriteThreadOptions};
    const CALLERS: usize = 10_000;
    const CAPTURED: usize = 1024 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("abandoned.db");
    let writes = WriteThread::open_with(
        &path,
        WriteThreadOptions::default().busy_timeout(std::time::Duration::from_secs(600)),
        |conn| conn.execute_batch("CREATE TABLE items (id INTEGER PRIMARY KEY, data BLOB)"),
    )
    .unwrap();
    // Another connection holds the write lock; the writer thread waits for it, for a closure
    // with no deadline.
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let first = {
        let writes = writes.clone();
        tokio::spawn(async move {
            writes
                .transaction(|tx| tx.execute("INSERT INTO items (data) VALUES (NULL)", []))
                .await
        })
    };
    while !writes.stats().held {
        tokio::task::yield_now().await;
    }
    let region = Region::new(GLOBAL);
    let mut most = 0;
    for _ in 0..CALLERS {
        // (Zeroed: the allocator counts it, the system need not back it.)
        let captured = vec![0u8; CAPTURED];
        let mut write = Box::pin(writes.transaction(move |tx| {
            tx.execute("INSERT INTO items (data) VALUES (?1)", [&captured])
        }));
        // Polled once: the closure is in line, its caller waiting for the answer.
        assert!(futures::poll!(write.as_mut()).is_pending());
        drop(write);
        most = most.max(held(&region));
    }
    let stats = writes.stats();
    eprintln!(
        "{CALLERS} callers left, each closure holding {CAPTURED} B: the heap held {most} B at \
         most; waiting now: {}",
        stats.waiting
    );
    assert!(
        most < 16 * CAPTURED as i64,
        "abandoned closures kept what they captured: {most} B held"
    );
    assert_eq!(stats.waiting, 0, "none left counted waiting");
    other.execute_batch("COMMIT").unwrap();
    first.await.unwrap().unwrap();
    let rows: i64 = rusqlite::Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM items", [], |row| row.get(0))
        .unwrap();
    assert_eq!(rows, 1, "no abandoned closure ran");
}
