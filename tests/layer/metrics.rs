//! The `metrics` feature: what the layer emits through the `metrics` facade after real
//! requests over HTTP against a real SQLite file (a held `BEGIN IMMEDIATE` makes attempt 1
//! meet `SQLITE_BUSY`).
//!
//! The recorders are installed for this thread only (`metrics::set_default_local_recorder`):
//! the runtime is tokio's current-thread one, so the server, the client and the layer all run
//! here. The one test builds the only layers of this test binary, so the layer describes its
//! metrics (once per process) to these recorders.
#![cfg(feature = "metrics")]

use crate::common;

// The exporter's setup, as the example app (and the `metrics::recorder` module's docs) make it.
use crate::prometheus as exporter;

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{Request, StatusCode};
use metrics::Unit;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use metrics_util::layers::FanoutBuilder;
use sqlx::SqlitePool;
use tokio::sync::{mpsc, watch};
use tower::{ServiceBuilder, ServiceExt};
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::metrics::recorder;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

use common::{HttpClient, TestDb, serve};

#[derive(Clone)]
struct AppState {
    pool: SqlitePool,
    /// The route and attempt number of every attempt that failed.
    failed: mpsc::UnboundedSender<(&'static str, u32)>,
    /// Replays of `POST /items` wait for this, so they run only once the lock is gone.
    released: watch::Receiver<bool>,
}

/// One insert in a deferred transaction: `SQLITE_BUSY` at once while another connection holds
/// the write lock (busy timeout 0).
async fn insert(s: &AppState, route: &'static str, attempt: &Attempt) -> Result<(), DbError> {
    let result = async {
        let mut tx = s.pool.begin().await?;
        sqlx::query(
            "INSERT INTO items (seq, name) VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM items), 'x')",
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = result {
        s.failed.send((route, attempt.number())).unwrap();
        return Err(e.into());
    }
    Ok(())
}

/// `POST /items`: its replays wait until the test has released the lock.
async fn insert_after_release(
    State(s): State<AppState>,
    attempt: Attempt,
    _body: String,
) -> Result<StatusCode, DbError> {
    if attempt.is_replay() {
        s.released.clone().wait_for(|r| *r).await.unwrap();
    }
    insert(&s, "/items", &attempt).await?;
    Ok(StatusCode::CREATED)
}

/// `POST /strict/{id}`: every attempt at once.
async fn insert_now(
    State(s): State<AppState>,
    attempt: Attempt,
    _body: String,
) -> Result<StatusCode, DbError> {
    insert(&s, "/strict/{id}", &attempt).await?;
    Ok(StatusCode::CREATED)
}

/// No jitter: the first backoff is exactly the base delay, 1 ms.
fn policy(attempts: u32) -> RetryPolicy {
    RetryPolicy::default()
        .max_attempts(attempts)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(Jitter::None)
}

/// The exporter as the example app sets it up (the crate's documented buckets), in either
/// naming.
fn prometheus(recommended_naming: bool) -> PrometheusBuilder {
    exporter::builder().with_recommended_naming(recommended_naming)
}

/// A metric's identity in the assertions: name and `key=value` labels, in order.
type Series = (String, Vec<String>);

fn series(name: &str, labels: &[&str]) -> Series {
    (
        name.to_owned(),
        labels.iter().map(|l| (*l).to_owned()).collect(),
    )
}

/// The `# TYPE` and `# HELP` lines of a Prometheus scrape.
fn metadata_lines(handle: &PrometheusHandle) -> BTreeSet<String> {
    handle
        .render()
        .lines()
        .filter(|l| l.starts_with("# "))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_replay_over_http_is_counted_recorded_and_described() {
    let debugging = DebuggingRecorder::new();
    let snapshotter = debugging.snapshotter();
    // Both of metrics-exporter-prometheus' naming modes, to check that neither changes a name.
    let plain = prometheus(false).build_recorder();
    let plain_handle = plain.handle();
    let recommended = prometheus(true).build_recorder();
    let recommended_handle = recommended.handle();
    let fanout = FanoutBuilder::default()
        .add_recorder(debugging)
        .add_recorder(plain)
        .add_recorder(recommended)
        .build();
    let _local = metrics::set_default_local_recorder(&fanout);

    let db = TestDb::new();
    let pool = db.pool(4, Duration::ZERO).await;
    let (failed, mut failed_rx) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let state = AppState {
        pool,
        failed,
        released,
    };
    // The strict route has a layer of its own inside the router-wide one: the outer layer
    // passes its answer through, and must not count it again.
    let app = Router::new()
        .route("/items", post(insert_after_release))
        .route("/items/{id}", get(|| async { "an item" }))
        .route(
            "/strict/{id}",
            post(insert_now).layer(SqliteRetryLayer::new(policy(2))),
        )
        .layer(SqliteRetryLayer::new(policy(5)))
        .with_state(state);
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);

    // A plain read: one attempt.
    assert_eq!(client.get("/items/42").await.status, StatusCode::OK);

    // Both attempts of the strict route meet the held lock: exhausted.
    let lock = db.hold_write_lock().await;
    let reply = client.post("/strict/7", "a").await;
    assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(failed_rx.recv().await, Some(("/strict/{id}", 1)));
    assert_eq!(failed_rx.recv().await, Some(("/strict/{id}", 2)));
    lock.release().await;

    // Attempt 1 meets the lock; the replay runs once it is released, and succeeds.
    let lock = db.hold_write_lock().await;
    let request = tokio::spawn({
        let client = client.clone();
        async move { client.post("/items", "abc").await }
    });
    assert_eq!(failed_rx.recv().await, Some(("/items", 1)));
    // Meanwhile the request's 3 body bytes are held for the replay.
    assert!(
        plain_handle
            .render()
            .contains("\ntower_sqlite_retry_buffered_bytes 3\n"),
        "{}",
        plain_handle.render()
    );
    lock.release().await;
    release.send(true).unwrap();
    let reply = request.await.unwrap();
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text());

    // Everything emitted, by series.
    let mut values: BTreeMap<Series, DebugValue> = BTreeMap::new();
    let mut units: BTreeMap<String, (Option<Unit>, bool)> = BTreeMap::new();
    for (key, unit, description, value) in snapshotter.snapshot().into_vec() {
        let (_kind, key) = key.into_parts();
        let name = key.name().to_owned();
        let labels = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        units.insert(name.clone(), (unit, description.is_some()));
        values.insert((name, labels), value);
    }
    let counter = |v: u64| DebugValue::Counter(v);
    let histogram = |xs: &[f64]| DebugValue::Histogram(xs.iter().map(|x| (*x).into()).collect());
    let get = "http_request_method=GET";
    let post = "http_request_method=POST";
    let items = "http_route=/items";
    let item = "http_route=/items/{id}";
    let strict = "http_route=/strict/{id}";
    let busy = "error_type=SQLITE_BUSY";

    let expected = BTreeMap::from([
        // One series per route, method, outcome (and error): the strict request counted once.
        (
            series(recorder::REQUESTS, &[item, get, "outcome=first_try"]),
            counter(1),
        ),
        (
            series(
                recorder::REQUESTS,
                &[strict, post, "outcome=exhausted", busy],
            ),
            counter(1),
        ),
        (
            series(
                recorder::REQUESTS,
                &[items, post, "outcome=succeeded_after_retry"],
            ),
            counter(1),
        ),
        (series(recorder::REPLAYS, &[strict, post, busy]), counter(1)),
        (series(recorder::REPLAYS, &[items, post, busy]), counter(1)),
        (series(recorder::ATTEMPTS, &[item, get]), histogram(&[1.0])),
        (
            series(recorder::ATTEMPTS, &[strict, post]),
            histogram(&[2.0]),
        ),
        (
            series(recorder::ATTEMPTS, &[items, post]),
            histogram(&[2.0]),
        ),
        (series(recorder::BACKOFF, &[item, get]), histogram(&[0.0])),
        (
            series(recorder::BACKOFF, &[strict, post]),
            histogram(&[0.001]),
        ),
        (
            series(recorder::BACKOFF, &[items, post]),
            histogram(&[0.001]),
        ),
        // Every byte reserved was given back.
        (
            series(recorder::BUFFERED_BYTES, &[]),
            DebugValue::Gauge(0.0.into()),
        ),
    ]);
    // One wait at the replay gate per replay; how long it took is the clock's business.
    for route in [strict, items] {
        let key = series(recorder::QUEUE_WAIT, &[route, post]);
        match values.remove(&key) {
            Some(DebugValue::Histogram(waits)) if waits.len() == 1 && waits[0].0 >= 0.0 => {}
            other => panic!("{key:?}: {other:?}"),
        }
    }
    assert_eq!(values, expected);

    // Every metric described, with its unit.
    let described = |u: Unit| (Some(u), true);
    assert_eq!(
        units,
        BTreeMap::from([
            (recorder::REQUESTS.to_owned(), described(Unit::Count)),
            (recorder::REPLAYS.to_owned(), described(Unit::Count)),
            (recorder::ATTEMPTS.to_owned(), described(Unit::Count)),
            (recorder::BACKOFF.to_owned(), described(Unit::Seconds)),
            (recorder::QUEUE_WAIT.to_owned(), described(Unit::Seconds)),
            (recorder::BUFFERED_BYTES.to_owned(), described(Unit::Bytes)),
        ])
    );

    // In Prometheus' text format, the names are the same whether or not the exporter adds
    // `_total` and units itself: it never doubles them.
    let metadata = metadata_lines(&plain_handle);
    assert_eq!(metadata, metadata_lines(&recommended_handle));
    let types: BTreeSet<&str> = metadata
        .iter()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .collect();
    assert_eq!(
        types,
        BTreeSet::from([
            "tower_sqlite_retry_requests_total counter",
            "tower_sqlite_retry_replays_total counter",
            "tower_sqlite_retry_attempts histogram",
            "tower_sqlite_retry_backoff_seconds histogram",
            "tower_sqlite_retry_queue_wait_seconds histogram",
            "tower_sqlite_retry_buffered_bytes gauge",
        ])
    );
    assert_eq!(
        metadata.iter().filter(|l| l.starts_with("# HELP ")).count(),
        6
    );
    // The cases that crossed no wire, on the paused clock, on their own methods' series.
    tokio::time::pause();
    nested_cancels_are_counted_once().await;
    waits_cut_short_are_sampled_once().await;
    let mut after: BTreeMap<Series, DebugValue> = BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let (_kind, key) = key.into_parts();
        let labels = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        after.insert((key.name().to_owned(), labels), value);
    }
    let unknown = "http_route=_unknown";
    let put = "http_request_method=PUT";
    let patch = "http_request_method=PATCH";
    let x = "http_route=/x";
    // Two abandoned requests through two nested layers: two requests, one attempt each.
    assert_eq!(
        after.get(&series(
            recorder::REQUESTS,
            &[unknown, put, "outcome=cancelled"]
        )),
        Some(&counter(2)),
        "{after:#?}"
    );
    assert_eq!(
        after.get(&series(recorder::ATTEMPTS, &[unknown, put])),
        Some(&histogram(&[1.0, 1.0]))
    );
    // Four queued attempts: two that passed at once, one that met its deadline after 1 s in
    // the queue, one whose client left after 5 ms in it.
    // (The deadline's timer fires on the next millisecond tick.)
    match after.get(&series(recorder::QUEUE_WAIT, &[x, patch])) {
        Some(DebugValue::Histogram(w))
            if w.len() == 4
                && (w[0], w[1], w[3]) == (0.0.into(), 0.0.into(), 0.005.into())
                && (1.0..1.01).contains(&w[2].0) => {}
        other => panic!("{other:?}"),
    }

    let scrape = recommended_handle.render();
    assert!(!scrape.contains("_total_total"), "{scrape}");
    assert!(
        scrape.contains(
            "tower_sqlite_retry_requests_total{http_route=\"/strict/{id}\",\
             http_request_method=\"POST\",outcome=\"exhausted\",error_type=\"SQLITE_BUSY\"} 1\n"
        ),
        "{scrape}"
    );
}

/// Two PUTs through two nested clones of one layer, each dropped while its handler runs.
async fn nested_cancels_are_counted_once() {
    let layer = SqliteRetryLayer::new(policy(5));
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .layer(layer)
        .service_fn(|_: Request<ReplayBody<ReplayBody<Body>>>| {
            std::future::pending::<Result<Response<Body>, Infallible>>()
        });
    for _ in 0..2 {
        let req = Request::put("/x").body(Body::from("x")).unwrap();
        let mut fut = std::pin::pin!(svc.clone().oneshot(req));
        assert!(futures::poll!(&mut fut).is_pending());
    }
}

/// PATCHes on a route that collided once (it has one slot): one takes the slot and keeps it,
/// one waits until its deadline, one is dropped while it waits.
async fn waits_cut_short_are_sampled_once() {
    let calls = Arc::new(AtomicU32::new(0));
    let release = Arc::new(tokio::sync::Notify::new());
    let (c, r) = (calls.clone(), release.clone());
    let layer = SqliteRetryLayer::new(policy(5).deadline(Duration::from_secs(1)));
    let handler = move |headers: http::HeaderMap| {
        let n = c.fetch_add(1, Ordering::SeqCst);
        let r = r.clone();
        async move {
            if n == 0 {
                let mut res = StatusCode::SERVICE_UNAVAILABLE.into_response();
                res.extensions_mut()
                    .insert(Retryable::new("5", "SQLITE_BUSY"));
                return res;
            }
            if headers.contains_key("hold") {
                r.notified().await;
            }
            StatusCode::OK.into_response()
        }
    };
    // Writer admission needs the route template: the layer inside the router.
    let app = Router::new()
        .route("/x", axum::routing::patch(handler))
        .layer(layer);
    let patch = |hold: bool| {
        let mut req = Request::patch("/x");
        if hold {
            req = req.header("hold", "1");
        }
        req.body(Body::from("x")).unwrap()
    };
    // Attempt 2 passes the (new) slot and the gate at once: one sample.
    let res = app.clone().oneshot(patch(false)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    // The holder passes at once too: one sample.
    let holder = tokio::spawn(app.clone().oneshot(patch(true)));
    while calls.load(Ordering::SeqCst) < 3 {
        tokio::task::yield_now().await;
    }
    let late = app.clone().oneshot(patch(false)).await.unwrap();
    assert_eq!(
        late.status(),
        StatusCode::SERVICE_UNAVAILABLE,
        "its deadline"
    );
    let mut gone = Box::pin(app.oneshot(patch(false)));
    assert!(futures::poll!(&mut gone).is_pending());
    tokio::time::advance(Duration::from_millis(5)).await;
    drop(gone);
    release.notify_one();
    assert_eq!(holder.await.unwrap().unwrap().status(), StatusCode::OK);
}
