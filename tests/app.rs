//! The example app (`examples/app.rs`) and the demonstration's driver (`examples/contention.rs`),
//! tested through the same code the examples run.
//!
//! Databases are real files in temporary directories: contention between connections is what
//! the layer is for, and `sqlite::memory:` gives every connection its own database.

// Shared with the examples, which use parts these tests do not (server URLs, instances).
#[allow(dead_code)]
#[path = "../examples/common/app_lib.rs"]
mod app_lib;
#[allow(dead_code)]
#[path = "../examples/common/driver.rs"]
mod driver;
// Used by the `metrics` feature's test only.
#[allow(dead_code)]
#[path = "../examples/common/prometheus.rs"]
mod prometheus;

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use http::{Request, Response, StatusCode, header};
use indicatif::ProgressBar;
use sqlx::SqlitePool;
use tempfile::TempDir;
use tower::ServiceExt;
use tower_sqlite_retry::metrics::Outcome;
use tower_sqlite_retry::metrics::RetryOutcome;
use tower_sqlite_retry::{Jitter, RetryPolicy};

use app_lib::{AppMetrics, Config, Item, Page, RetryPolicies, Work, open_pool, router};
use driver::{Begin, Scenario, Target};

struct TestApp {
    // Dropped last: removes the database file.
    _dir: TempDir,
    pool: SqlitePool,
    app: Router,
    metrics: Option<AppMetrics>,
}

async fn test_app(retry: Option<RetryPolicies>) -> TestApp {
    let dir = tempfile::tempdir().unwrap();
    let pool = open_pool(&dir.path().join("items.db"), 4, Duration::from_secs(5))
        .await
        .unwrap();
    let (app, metrics) = router(pool.clone(), retry);
    TestApp {
        _dir: dir,
        pool,
        app,
        metrics,
    }
}

async fn with_layer() -> TestApp {
    test_app(Some(RetryPolicies::both(RetryPolicy::default()))).await
}

fn post_items(body: &str) -> Request<Body> {
    Request::post("/items")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

impl TestApp {
    async fn call(&self, req: Request<Body>) -> Response<Body> {
        self.app.clone().oneshot(req).await.unwrap()
    }

    async fn get(&self, uri: &str) -> Response<Body> {
        self.call(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn post_json(&self, body: &str) -> Response<Body> {
        self.call(post_items(body)).await
    }

    /// `POST /items` on a task of its own (for a request that waits on a held lock).
    fn spawn_post_json(&self, body: &str) -> tokio::task::JoinHandle<Response<Body>> {
        let (app, req) = (self.app.clone(), post_items(body));
        tokio::spawn(async move { app.oneshot(req).await.unwrap() })
    }

    async fn create(&self, name: &str) -> Item {
        let res = self
            .post_json(&serde_json::json!({ "name": name }).to_string())
            .await;
        assert_eq!(res.status(), StatusCode::CREATED);
        json(res).await
    }

    fn retries(&self) -> u64 {
        self.metrics.as_ref().unwrap().snapshot().retries()
    }
}

async fn json<T: serde::de::DeserializeOwned>(res: Response<Body>) -> T {
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!("{e}: {:?}", String::from_utf8_lossy(&bytes));
    })
}

#[tokio::test]
async fn post_creates_201_with_the_item() {
    let t = with_layer().await;
    let first = t.create("apple").await;
    let second = t.create("pear").await;
    assert_eq!((first.seq, first.name.as_str()), (1, "apple"));
    assert_eq!((second.seq, second.name.as_str()), (2, "pear"));
    assert_ne!(first.id, second.id);
}

#[tokio::test]
async fn a_first_try_answer_goes_back_untouched() {
    let t = with_layer().await;
    let res = t.post_json(r#"{"name": "apple"}"#).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    // No `RetryOutcome` (and no allocation) when the layer did nothing; the counters say it.
    assert!(res.extensions().get::<RetryOutcome>().is_none());
    let stats: serde_json::Value = json(t.get("/stats").await).await;
    assert_eq!(stats["write_layer"]["outcomes"]["first_try"], 1, "{stats}");
}

#[tokio::test]
async fn get_by_id_finds_the_item_or_404() {
    let t = with_layer().await;
    let item = t.create("apple").await;

    let res = t.get(&format!("/items/{}", item.id)).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(json::<Item>(res).await, item);

    let res = t.get(&format!("/items/{}", item.id + 1000)).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn an_unknown_route_answers_404_with_a_body_that_says_so() {
    for t in [with_layer().await, test_app(None).await] {
        let res = t.get("/no/such/route").await;
        assert_eq!(res.status(), StatusCode::NOT_FOUND);
        let body = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(&body[..], b"no such route\n");
    }
}

#[tokio::test]
async fn list_pages_through_every_item_in_order() {
    let t = with_layer().await;
    let mut created = Vec::new();
    for name in ["a", "b", "c", "d", "e"] {
        created.push(t.create(name).await);
    }

    let mut seen = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let res = t.get(&format!("/items?limit=2&after={after}")).await;
        assert_eq!(res.status(), StatusCode::OK);
        let page: Page = json(res).await;
        assert!(page.items.len() <= 2);
        pages += 1;
        seen.extend(page.items);
        match page.next {
            Some(next) => after = next,
            None => break,
        }
    }
    assert_eq!(seen, created);
    assert_eq!(pages, 3);

    let page: Page = json(t.get("/items").await).await;
    assert_eq!(page.items, created);
    assert_eq!(page.next, None);
}

#[tokio::test]
async fn malformed_json_is_a_4xx_and_never_replayed() {
    let t = with_layer().await;
    for (body, status) in [
        (r#"{"name": "#, StatusCode::BAD_REQUEST),
        (r#"{"nom": "apple"}"#, StatusCode::UNPROCESSABLE_ENTITY),
        (r#"{"name": ""}"#, StatusCode::UNPROCESSABLE_ENTITY),
    ] {
        let res = t.post_json(body).await;
        assert_eq!(res.status(), status, "{body}");
        // Answered by the first attempt as it is: no `RetryOutcome`.
        assert!(res.extensions().get::<RetryOutcome>().is_none(), "{body}");
    }
    assert_eq!(t.retries(), 0);
    let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&t.pool)
        .await
        .unwrap();
    assert_eq!(count, 0);
}

#[tokio::test]
async fn write_route_has_its_own_layer_inside_the_router_wide_one() {
    let t = with_layer().await;
    t.create("apple").await;
    let res = t.get("/items").await;
    assert_eq!(res.status(), StatusCode::OK);

    let snap = t.metrics.as_ref().unwrap().snapshot();
    // The route layer saw the POST only; the router-wide layer saw both.
    assert_eq!(snap.write.requests, 1);
    assert_eq!(snap.read.requests, 2);
    assert_eq!(snap.read.attempts_histogram[0], 2);
}

#[tokio::test]
async fn stats_returns_the_counters_as_json() {
    let t = with_layer().await;
    t.create("apple").await;
    let res = t.get("/stats").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "application/json",
        "{:?}",
        res.headers()
    );
    let stats: serde_json::Value = json(res).await;
    assert_eq!(stats["retry"], true);
    assert_eq!(stats["retries"], 0);
    assert_eq!(stats["write_layer"]["requests"], 1);
    assert_eq!(stats["write_layer"]["outcomes"]["first_try"], 1);
    assert!(stats["router_layer"]["attempts_histogram"].is_array());

    let bare = test_app(None).await;
    let stats: serde_json::Value = json(bare.get("/stats").await).await;
    assert_eq!(stats, serde_json::json!({ "retry": false }));
}

/// Takes SQLite's write lock on another connection (`BEGIN IMMEDIATE` and an insert); it is
/// held until that connection commits.
async fn hold_write_lock(pool: &SqlitePool) -> sqlx::pool::PoolConnection<sqlx::Sqlite> {
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .unwrap();
    sqlx::query("INSERT INTO items (seq, name) VALUES (1000, 'holder')")
        .execute(&mut *conn)
        .await
        .unwrap();
    conn
}

#[tokio::test]
async fn busy_write_without_the_layer_answers_503_at_once() {
    let t = test_app(None).await;
    let mut holder = hold_write_lock(&t.pool).await;

    // busy_timeout is 5 s, yet the deferred read-then-write transaction fails at once.
    let res = tokio::time::timeout(Duration::from_secs(2), t.post_json(r#"{"name": "x"}"#))
        .await
        .expect("answered without waiting for busy_timeout");
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    // `DbError` alone never invites a retry: the layer does, where a later try can succeed.
    assert!(!res.headers().contains_key(header::RETRY_AFTER));

    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
}

#[tokio::test]
async fn busy_write_with_the_layer_is_replayed_until_it_commits() {
    // No jitter, so the schedule is known: replays at ~2, 6, 14, 30, 62, ... ms.
    let policy = RetryPolicy::default().max_attempts(30).jitter(Jitter::None);
    let t = test_app(Some(RetryPolicies::both(policy))).await;
    let mut holder = hold_write_lock(&t.pool).await;

    let request = t.spawn_post_json(r#"{"name": "x"}"#);
    // Release the lock only once the request has failed on it and a replay has started: the
    // layer's own counter says so, whatever the machine's speed.
    tokio::time::timeout(Duration::from_secs(20), async {
        while t.retries() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .expect("a replay started while the lock was held");
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    drop(holder);

    let res = request.await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let outcome = res.extensions().get::<RetryOutcome>().copied().unwrap();
    assert_eq!(outcome.outcome(), Outcome::SucceededAfterRetry);
    assert!(outcome.attempts() >= 2, "{outcome:?}");
    let item: Item = json(res).await;
    // Its replay read the holder's committed row.
    assert_eq!((item.seq, item.name.as_str()), (1001, "x"));
    assert_eq!(t.retries(), u64::from(outcome.attempts() - 1));
}

/// The value of the one line of a Prometheus scrape that starts with `series ` (name and
/// labels exactly as rendered).
#[cfg(feature = "metrics")]
fn scraped(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

/// The sum of the values of every line of a scrape that starts with `prefix`.
#[cfg(feature = "metrics")]
fn scraped_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

#[cfg(feature = "metrics")]
async fn scrape(t: &TestApp) -> String {
    let res = t.get("/metrics").await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        res.headers()[header::CONTENT_TYPE],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
        .await
        .unwrap();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// `GET /metrics` after reads, a write, a 404 and a write replayed behind a held lock: the
/// series of both layers, each request counted once although the write route has two layers.
/// The exporter is installed for this thread only (the runtime is the current-thread one).
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_scrape_shows_the_layers_series() {
    let recorder = prometheus::builder().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let mut t = with_layer().await;
    t.app = prometheus::route(t.app.clone(), handle, String::new);

    t.create("apple").await;
    assert_eq!(t.get("/items").await.status(), StatusCode::OK);
    assert_eq!(t.get("/items/999").await.status(), StatusCode::NOT_FOUND);

    // A write behind a held lock is replayed until the lock is gone: release it once the
    // scrape shows a replay.
    let mut holder = hold_write_lock(&t.pool).await;
    let request = t.spawn_post_json(r#"{"name": "x"}"#);
    let replays =
        r#"tower_sqlite_retry_replays_total{http_route="/items",http_request_method="POST","#;
    let start = std::time::Instant::now();
    while !scrape(&t).await.contains(replays) {
        assert!(start.elapsed() < Duration::from_secs(30), "no replay seen");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    sqlx::query("COMMIT").execute(&mut *holder).await.unwrap();
    drop(holder);
    let res = request.await.unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let outcome = res.extensions().get::<RetryOutcome>().copied().unwrap();
    assert_eq!(outcome.outcome(), Outcome::SucceededAfterRetry);
    let attempts = f64::from(outcome.attempts());

    let text = scrape(&t).await;
    let value = |series: &str| scraped(&text, series).unwrap_or_else(|| panic!("{series}\n{text}"));
    let post = r#"http_route="/items",http_request_method="POST""#;
    let list = r#"http_route="/items",http_request_method="GET""#;
    let item = r#"http_route="/items/{id}",http_request_method="GET""#;
    for (series, expected) in [
        (
            format!("tower_sqlite_retry_requests_total{{{post},outcome=\"first_try\"}}"),
            1.0,
        ),
        (
            format!(
                "tower_sqlite_retry_requests_total{{{post},outcome=\"succeeded_after_retry\"}}"
            ),
            1.0,
        ),
        (
            format!("tower_sqlite_retry_requests_total{{{list},outcome=\"first_try\"}}"),
            1.0,
        ),
        (
            format!("tower_sqlite_retry_requests_total{{{item},outcome=\"first_try\"}}"),
            1.0,
        ),
        (format!("tower_sqlite_retry_attempts_count{{{post}}}"), 2.0),
        (
            format!("tower_sqlite_retry_attempts_sum{{{post}}}"),
            1.0 + attempts,
        ),
        (
            format!("tower_sqlite_retry_attempts_bucket{{{post},le=\"1\"}}"),
            1.0,
        ),
        (format!("tower_sqlite_retry_attempts_count{{{item}}}"), 1.0),
        (
            format!("tower_sqlite_retry_backoff_seconds_count{{{post}}}"),
            2.0,
        ),
        // One wait at the replay gate per replay.
        (
            format!("tower_sqlite_retry_queue_wait_seconds_count{{{post}}}"),
            attempts - 1.0,
        ),
        ("tower_sqlite_retry_buffered_bytes".to_owned(), 0.0),
    ] {
        assert_eq!(value(&series), expected, "{series}\n{text}");
    }
    // Four requests counted (the scrapes are not), every replay counted, and SQLITE_BUSY
    // among their causes.
    assert_eq!(
        scraped_sum(&text, "tower_sqlite_retry_requests_total{"),
        4.0,
        "{text}"
    );
    assert_eq!(scraped_sum(&text, replays), attempts - 1.0, "{text}");
    assert!(
        text.contains(&format!("{replays}error_type=\"SQLITE_BUSY\"}}")),
        "{text}"
    );
    assert_eq!(t.retries(), outcome.attempts() as u64 - 1);
    for metadata in [
        "# TYPE tower_sqlite_retry_requests_total counter",
        "# TYPE tower_sqlite_retry_replays_total counter",
        "# TYPE tower_sqlite_retry_attempts histogram",
        "# TYPE tower_sqlite_retry_backoff_seconds histogram",
        "# TYPE tower_sqlite_retry_queue_wait_seconds histogram",
        "# TYPE tower_sqlite_retry_buffered_bytes gauge",
    ] {
        assert!(text.lines().any(|l| l == metadata), "{metadata}\n{text}");
    }
}

fn scenario(dir: &TempDir, name: &str, retry: Option<RetryPolicies>) -> Scenario {
    Scenario {
        label: name.to_string(),
        target: Target::SqliteFile(dir.path().join(format!("{name}.db"))),
        instances: 1,
        clients: 16,
        requests: 300,
        write_ratio: 0.7,
        pool_size: 8,
        busy_timeout: Duration::from_secs(5),
        retry,
        begin: Begin::Deferred,
        work: Work::default(),
        progress: ProgressBar::hidden(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_driver_with_the_layer_fails_nothing_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let policies = RetryPolicies::both(RetryPolicy::default());
    let report = driver::run(scenario(&dir, "with-layer", Some(policies)))
        .await
        .unwrap();

    assert_eq!(report.requests, 300);
    assert_eq!(report.failures(), 0, "{report:#?}");
    assert_eq!(report.status_2xx, 300);
    assert_eq!(report.success_pct(), 100.0);
    let i = &report.integrity;
    assert!(i.ok, "{i:#?}");
    assert_eq!(i.rows, report.writes);
    assert_eq!(i.acknowledged, report.writes);
    assert_eq!((i.lost, i.unacknowledged, i.doubled), (0, 0, 0));
    let layer = report.layer.as_ref().unwrap();
    assert_eq!(layer.gave_up, 0);
    assert_eq!(layer.attempts_histogram.iter().sum::<u64>(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_driver_without_the_layer_fails_requests_but_keeps_data_consistent() {
    let dir = tempfile::tempdir().unwrap();
    let report = driver::run(scenario(&dir, "without-layer", None))
        .await
        .unwrap();

    assert_eq!(report.requests, 300);
    assert!(report.layer.is_none());
    // Failures are likely here but not certain: no assertion on their number. What did
    // commit must still match the answers exactly.
    assert_eq!(report.status_2xx + report.status_5xx + report.other, 300);
    assert_eq!(report.transport_errors, 0);
    assert!(report.integrity.ok, "{:#?}", report.integrity);
    assert_eq!(report.integrity.rows, report.integrity.acknowledged);
}

/// The demonstration's two runs on a small scenario: `clients` clients, `write_ratio` writes.
async fn both_runs(clients: usize, write_ratio: f64) -> (driver::Report, driver::Report) {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, retry| {
        let mut s = scenario(&dir, name, retry);
        (s.clients, s.requests, s.write_ratio) = (clients, 40, write_ratio);
        driver::run(s)
    };
    let without = run("without-layer", None).await.unwrap();
    let with = run(
        "with-layer",
        Some(RetryPolicies::both(RetryPolicy::default())),
    )
    .await
    .unwrap();
    (without, with)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demonstration_without_contention_is_not_a_pass() {
    // One client: one request at a time, so nothing can collide, with or without the layer.
    let (without, with) = both_runs(1, 0.7).await;
    assert_eq!((without.failures(), with.failures()), (0, 0));
    assert!(without.writes > 0);
    assert_eq!(
        driver::verdict(&without, &with),
        driver::Verdict::NoContention
    );

    // The same runs, had the one without the layer failed a request: a pass.
    let mut failed = without.clone();
    failed.status_2xx -= 1;
    failed.status_5xx += 1;
    assert_eq!(driver::verdict(&failed, &with), driver::Verdict::Pass);
    // ... and had the one with the layer failed one too: a failure, whatever happened without.
    let mut with_failed = with.clone();
    with_failed.status_2xx -= 1;
    with_failed.status_5xx += 1;
    assert!(matches!(
        driver::verdict(&failed, &with_failed),
        driver::Verdict::Fail(why) if why[0].contains("1 of 40 requests failed with the layer")
    ));
}

/// The demonstration's other runs (`BEGIN IMMEDIATE`, the write path) must fail nothing and
/// lose nothing too; how fast they were is no part of the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demonstration_fails_when_another_run_fails_a_request_or_breaks_integrity() {
    let (without, with) = both_runs(4, 0.7).await;
    let mut failed = without.clone();
    failed.status_2xx -= 1;
    failed.status_5xx += 1;
    let mut other = with.clone();
    other.label = "BEGIN IMMEDIATE".into();
    assert_eq!(
        driver::verdict_with(&failed, &with, &[&other, &with]),
        driver::Verdict::Pass
    );
    // Slower is still a pass.
    let mut slow = other.clone();
    (slow.latency_ms.max, slow.write_latency_ms.max) = (60_000.0, 60_000.0);
    slow.reads_per_s /= 100.0;
    assert_eq!(
        driver::verdict_with(&failed, &with, &[&slow]),
        driver::Verdict::Pass
    );

    let mut one_failed = other.clone();
    one_failed.status_2xx -= 1;
    one_failed.status_5xx += 1;
    let verdict = driver::verdict_with(&failed, &with, &[&one_failed]);
    assert!(
        matches!(&verdict, driver::Verdict::Fail(why)
            if why.iter().any(|w| w.contains("1 of 40 requests failed in the run BEGIN IMMEDIATE"))),
        "{verdict:?}"
    );
    let mut broken = other.clone();
    broken.integrity.ok = false;
    let verdict = driver::verdict_with(&failed, &with, &[&broken]);
    assert!(
        matches!(&verdict, driver::Verdict::Fail(why)
            if why.iter().any(|w| w.contains("the run BEGIN IMMEDIATE lost or doubled rows"))),
        "{verdict:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_demonstration_without_writes_fails_and_says_why() {
    let (without, with) = both_runs(8, 0.0).await;
    assert_eq!((without.writes, with.writes), (0, 0));
    let verdict = driver::verdict(&without, &with);
    assert!(
        matches!(&verdict, driver::Verdict::Fail(why) if why.iter().any(|w| w.contains("no POST /items was sent"))),
        "{verdict:?}"
    );
}

#[tokio::test]
async fn integrity_check_catches_lost_doubled_and_phantom_rows() {
    let t = test_app(None).await;
    let a = t.create("a").await;
    let b = t.create("b").await;
    let intact = driver::check_integrity(&t.pool, &[a.clone(), b.clone()])
        .await
        .unwrap();
    assert!(intact.ok, "{intact:?}");

    // A row nobody was answered for, with a name already stored: a doubled insert.
    sqlx::query("INSERT INTO items (seq, name) VALUES (3, 'b')")
        .execute(&t.pool)
        .await
        .unwrap();
    // An acknowledged item that is not stored.
    let ghost = Item {
        id: 99,
        seq: 99,
        name: "ghost".into(),
    };
    let broken = driver::check_integrity(&t.pool, &[a, b, ghost])
        .await
        .unwrap();
    assert!(!broken.ok);
    assert_eq!(
        (broken.lost, broken.unacknowledged, broken.doubled),
        (1, 1, 1),
        "{broken:?}"
    );
}

/// `n` concurrent `POST /items` through `app` (each its own task on a multi-threaded runtime);
/// their statuses.
async fn concurrent_posts(app: &Router, n: usize) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let app = app.clone();
            tokio::spawn(async move {
                app.oneshot(
                    Request::post("/items")
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(format!(r#"{{"name": "w{i}"}}"#)))
                        .unwrap(),
                )
                .await
                .unwrap()
                .status()
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expert_configurations_serialize_writers_without_any_replay() {
    for config in [
        Config::OneWriter,
        Config::TwoPool,
        Config::Immediate,
        Config::LayerQueue,
        Config::LayerTwoPool,
        Config::LayerWrite,
        Config::LayerThread,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let db = config
            .open(&dir.path().join("items.db"), 8, Duration::from_secs(5))
            .await
            .unwrap();
        let (app, metrics) = config.router(db.clone());
        let statuses = concurrent_posts(&app, 48).await;
        assert!(
            statuses.iter().all(|s| *s == StatusCode::CREATED),
            "{config:?}: {statuses:?}"
        );
        // One writer at a time (a single write connection, the write lock taken first, the
        // limit inside the layer built once, or the write path's turn): no transaction ever
        // met another, so nothing was replayed.
        assert_eq!(
            metrics.map_or(0, |m| m.snapshot().retries()),
            0,
            "{config:?}"
        );
        let items = db.all_items().await.unwrap();
        assert_eq!(items.len(), 48, "{config:?}");
        let mut seqs: Vec<i64> = items.iter().map(|i| i.seq).collect();
        seqs.dedup();
        assert_eq!(seqs, (1..=48).collect::<Vec<_>>(), "{config:?}");
        db.close().await;
    }
}

#[tokio::test]
async fn only_the_layer_configurations_have_retry_layers() {
    let dir = tempfile::tempdir().unwrap();
    for config in Config::ALL {
        let db = config
            .open(
                &dir.path().join(format!("{}.db", config.key())),
                2,
                Duration::from_secs(5),
            )
            .await
            .unwrap();
        let (app, metrics) = config.router(db);
        let with_layer = !matches!(
            config,
            Config::Bare | Config::OneWriter | Config::TwoPool | Config::Immediate
        );
        assert_eq!(metrics.is_some(), with_layer, "{config:?}");
        let res = app
            .oneshot(
                Request::post("/items")
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(r#"{"name": "x"}"#))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED, "{config:?}");
        if let Some(metrics) = metrics {
            assert_eq!(metrics.write.snapshot().first_try, 1, "{config:?}");
        }
    }
}

/// `immediate`, `layer-write` and `layer-thread` as the demonstration runs them: real HTTP on
/// loopback,
/// concurrent writers and readers, a handler with work before and after its transaction;
/// nothing fails, and the database holds exactly what was answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_the_write_path_and_the_writer_thread_serve_over_http_with_integrity() {
    let dir = tempfile::tempdir().unwrap();
    let work = Work::new(20);
    assert!(work.read_after_commit() && work.prep_rounds > 0, "{work:?}");
    for (name, begin, retry) in [
        ("immediate", Begin::Immediate, None),
        (
            "write-path",
            Begin::WritePath,
            Some(RetryPolicies::both(RetryPolicy::default())),
        ),
        (
            "writer-thread",
            Begin::WriteThread,
            Some(RetryPolicies::both(RetryPolicy::default())),
        ),
    ] {
        let mut s = scenario(&dir, name, retry);
        (s.begin, s.work) = (begin, work);
        let report = driver::run(s).await.unwrap();
        assert_eq!(report.begin, begin);
        assert_eq!(report.requests, 300, "{name}");
        assert_eq!(report.failures(), 0, "{name}: {report:#?}");
        assert!(report.writes > 0 && report.reads > 0, "{name}: {report:#?}");
        assert_eq!(report.writes_2xx, report.writes, "{name}");
        assert_eq!(report.reads_2xx, report.reads, "{name}");
        assert!(
            report.write_latency_ms.max <= report.latency_ms.max,
            "{name}"
        );
        let i = &report.integrity;
        assert!(i.ok, "{name}: {i:#?}");
        assert_eq!(
            (i.rows, i.acknowledged),
            (report.writes, report.writes),
            "{name}"
        );
        match begin {
            Begin::WritePath | Begin::WriteThread => {
                let turn = report.write_turn.as_ref().expect("the write path's turn");
                // Every write committed in its turn (a transaction rolled back would count too).
                assert!(turn.transactions >= report.writes, "{turn:?}");
                assert!(turn.busy_s > 0.0, "{turn:?}");
            }
            _ => assert!(report.write_turn.is_none(), "{name}"),
        }
    }
}

/// `layer-thread` runs `POST /items`' transaction on the writer thread: the process has a
/// thread named for this file's writer (`tsr-writer:<file>`, cut to Linux's 15 bytes) once
/// the write came back, its turn counted the write, and the row is in the file.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_thread_writes_on_the_writer_thread() {
    let writers = || -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == "tsr-writer:thre")
            .count()
    };
    assert_eq!(writers(), 0);
    let dir = tempfile::tempdir().unwrap();
    let config = Config::LayerThread;
    let db = config
        .open(
            &dir.path().join("thread-probe.db"),
            4,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    let (app, metrics) = config.router(db.clone());
    assert!(metrics.is_some());
    let res = app
        .oneshot(post_items(r#"{"name": "on the thread"}"#))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    // Counted once the write came back: the thread names itself as it starts, which a look
    // right after `open` could precede.
    assert_eq!(writers(), 1, "one writer thread for the file");
    assert_eq!(db.write_stats().unwrap().transactions, 1);
    let items = db.all_items().await.unwrap();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0].name, "on the thread");
}

/// `layer-write`'s app, with work around the transaction, on a SQLite file in `dir`.
async fn write_path_app(dir: &TempDir) -> (app_lib::Db, Router) {
    let config = Config::LayerWrite;
    let db = config
        .open(&dir.path().join("items.db"), 4, Duration::from_secs(5))
        .await
        .unwrap()
        .with_work(Work::new(10));
    let (app, metrics) = config.router(db.clone());
    assert!(metrics.is_some());
    assert!(db.has_write_path());
    (db, app)
}

#[tokio::test]
async fn the_write_path_shows_its_turn_in_stats_and_reads_after_its_commit() {
    let dir = tempfile::tempdir().unwrap();
    let (db, app) = write_path_app(&dir).await;
    for n in 1..=3 {
        let res = app
            .clone()
            .oneshot(post_items(&format!(r#"{{"name": "w{n}"}}"#)))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        // The read after the commit saw the item just committed.
        assert_eq!(res.headers()["x-item-count"], n.to_string().as_str());
    }
    let res = app
        .clone()
        .oneshot(Request::get("/stats").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let stats: serde_json::Value = json(res).await;
    let turn = &stats["write_turn"];
    assert_eq!(turn["database"], "items.db", "{stats}");
    assert_eq!(turn["transactions"], 3, "{stats}");
    assert_eq!(turn["waiting"], 0, "{stats}");
    assert_eq!(turn["held"], false, "{stats}");
    assert!(turn["busy_seconds"].as_f64().unwrap() > 0.0, "{stats}");
    assert_eq!(stats["retry"], true);
    db.close().await;
}

/// `GET /metrics` of `layer-write`: the app's utilization gauge, computed at each scrape
/// between two readings of the turn (0 before any write; above 0 after writes; 0 again when
/// nothing was written since the previous scrape), beside the crate's write-path series.
#[cfg(feature = "metrics")]
#[tokio::test]
async fn metrics_scrape_shows_the_write_paths_utilization() {
    let recorder = prometheus::builder().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let dir = tempfile::tempdir().unwrap();
    let (db, app) = write_path_app(&dir).await;
    let watched = db.clone();
    let app = prometheus::route(app, handle, move || watched.write_utilization_metrics());
    let scrape = || async {
        let res = app
            .clone()
            .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let bytes = axum::body::to_bytes(res.into_body(), usize::MAX)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    let gauge = r#"tower_sqlite_retry_write_utilization{database="items.db"}"#;

    let text = scrape().await;
    assert_eq!(scraped(&text, gauge), Some(0.0), "{text}");
    assert!(
        text.lines()
            .any(|l| l == "# TYPE tower_sqlite_retry_write_utilization gauge"),
        "{text}"
    );

    for n in 0..5 {
        let res = app
            .clone()
            .oneshot(post_items(&format!(r#"{{"name": "w{n}"}}"#)))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
    }
    let text = scrape().await;
    let utilization = scraped(&text, gauge).unwrap_or_else(|| panic!("{gauge}\n{text}"));
    assert!(
        utilization > 0.0 && utilization <= 1.5,
        "{utilization}\n{text}"
    );
    // The crate's own series of the write path, by the same database.
    assert!(
        text.lines().any(
            |l| l.starts_with("tower_sqlite_retry_write_held_seconds_count{")
                && l.contains(r#"database="items.db""#)
        ),
        "{text}"
    );

    // Nothing written since the previous scrape: the turn was not held in between.
    let text = scrape().await;
    assert_eq!(scraped(&text, gauge), Some(0.0), "{text}");
    db.close().await;
}

/// `layer-thread` behind another connection's write lock: the writes queued for the writer
/// thread are shown waiting, in `/stats` (the turn's `waiting`) and in `/metrics` (the
/// `write_waiting` gauge), while they wait; all commit once the lock is gone. (The recorder is
/// this thread's: the runtime is the current-thread one, where the handlers count their
/// closures in.)
#[cfg(feature = "metrics")]
#[tokio::test]
async fn layer_thread_shows_its_queued_writes_in_stats_and_metrics() {
    let handle = prometheus::builder()
        .install_recorder()
        .expect("the only global recorder of this binary");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("queued.db");
    let config = Config::LayerThread;
    let db = config
        .open(&path, 4, Duration::from_secs(30))
        .await
        .unwrap();
    let (app, _) = config.router(db.clone());
    let app = prometheus::route(app, handle, String::new);
    let get = |uri: &'static str| {
        let app = app.clone();
        async move {
            let res = app
                .oneshot(Request::get(uri).body(Body::empty()).unwrap())
                .await
                .unwrap();
            String::from_utf8(
                axum::body::to_bytes(res.into_body(), usize::MAX)
                    .await
                    .unwrap()
                    .to_vec(),
            )
            .unwrap()
        }
    };
    let other = rusqlite::Connection::open(&path).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    let writes: Vec<_> = (0..3)
        .map(|n| {
            let app = app.clone();
            tokio::spawn(app.oneshot(post_items(&format!(r#"{{"name": "q{n}"}}"#))))
        })
        .collect();
    // The first waits for the lock holding the turn; the other two wait for the writer thread.
    let start = std::time::Instant::now();
    loop {
        let stats: serde_json::Value = serde_json::from_str(&get("/stats").await).unwrap();
        if stats["write_turn"]["waiting"] == 2 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "{stats}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let text = get("/metrics").await;
    let gauge = r#"tower_sqlite_retry_write_waiting{database="queued.db"}"#;
    assert_eq!(scraped(&text, gauge), Some(2.0), "{text}");
    other.execute_batch("COMMIT").unwrap();
    for write in writes {
        assert_eq!(write.await.unwrap().unwrap().status(), StatusCode::CREATED);
    }
    assert_eq!(db.all_items().await.unwrap().len(), 3);
    let text = get("/metrics").await;
    assert_eq!(scraped(&text, gauge), Some(0.0), "{text}");
}
