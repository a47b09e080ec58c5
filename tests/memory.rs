//! What buffering a body for replay really costs in memory, measured with a counting
//! allocator (this binary's global allocator; one test, so nothing else allocates meanwhile).
//!
//! The in-flight cap (`max_buffered_bytes`) counts the memory the layer holds, not the
//! payload: a body sent as 65,536 one-byte frames must cost about 64 KiB, not a `Bytes`
//! handle (and the frame behind it) per byte.

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
use tower_sqlite_retry::{ReplayBody, RetryPolicy, SqliteRetryLayer};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const PAYLOAD: usize = 64 * 1024;

#[test]
fn one_byte_frames_cost_their_payload_not_a_handle_each() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
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

        let region = Region::new(GLOBAL);
        let request = tokio::spawn(svc.oneshot(Request::post("/").body(body).unwrap()));
        for i in 0..PAYLOAD {
            // Each frame is its own one-byte allocation, as a trickling client's would be.
            tx.send(Bytes::from(vec![i as u8])).await.unwrap();
            tokio::task::yield_now().await;
        }
        while metrics.snapshot().buffered_bytes < PAYLOAD {
            tokio::task::yield_now().await;
        }
        // Everything sent is buffered, the stream is still open: what is held now?
        let change = region.change();
        let held = change.bytes_allocated as i64 - change.bytes_deallocated as i64
            + change.bytes_reallocated as i64;
        let counted = metrics.snapshot().buffered_bytes;
        eprintln!(
            "payload {PAYLOAD} B in {PAYLOAD} frames: heap held {held} B ({:.2} B per payload byte), \
             counted against the in-flight cap {counted} B; {} allocations, {} frees",
            held as f64 / PAYLOAD as f64,
            change.allocations,
            change.deallocations,
        );
        assert!((PAYLOAD..=2 * PAYLOAD).contains(&counted), "counted {counted}");
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
    });
}
