//! A storm over real HTTP on a multi-threaded runtime: writer admission's accounting must
//! come out of it intact.
//!
//! A real SQLite file in WAL mode; a write route whose handler runs a deferred read-then-write
//! transaction on a pool with busy timeout 0, so that it collides (`SQLITE_BUSY`,
//! `SQLITE_BUSY_SNAPSHOT`) whenever another writer overlaps it: the route's own concurrent
//! requests once the limit was probed up, and an outside writer (another "process") that
//! commits in a loop. The route's limit thus goes down and up during the storm. Many clients
//! send requests at once; some drop their request at a random moment (the connection closes),
//! some ask the server to drop it (a middleware outside the layer gives up on it after a
//! random time: while it waits for a slot, holds one, backs off or runs). After the storm and
//! once every server-side request future is gone: the route still serves at once (a final
//! request gets 200 without queueing), no slot is held, nobody waits, and the limit is within
//! `1..=256`.
#![allow(missing_docs)]

use crate::common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::{Next, from_fn, from_fn_with_state};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use common::{HttpClient, TestDb, serve};
use http::StatusCode;
use sqlx::{Connection, SqlitePool};
use tokio::sync::Notify;
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer};

const CLIENTS: u64 = 24;
const REQUESTS_PER_CLIENT: u64 = 40;
const CANCEL_HEADER: &str = "x-cancel-after-us";

/// A small deterministic random source (xorshift), one per task.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

#[derive(Clone)]
struct App {
    pool: SqlitePool,
    /// A unique `seq` for each attempt's row.
    seq: Arc<AtomicU64>,
}

/// Reads, yields a random number of times (others may commit meanwhile), then writes: a
/// deferred transaction that collides with any writer that overlaps it.
async fn write(State(app): State<App>) -> Result<StatusCode, DbError> {
    let seq = app.seq.fetch_add(1, Ordering::Relaxed);
    let mut tx = app.pool.begin().await?;
    let _: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&mut *tx)
        .await?;
    for _ in 0..Rng::new(seq).below(4) {
        tokio::task::yield_now().await;
    }
    sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'stress')")
        .bind(seq as i64)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

/// Drops the rest of the stack (the retry layer's future included) after the time the
/// request's header asks for.
async fn cancel_after(req: Request, next: Next) -> Response {
    let after = req
        .headers()
        .get(CANCEL_HEADER)
        .and_then(|v| v.to_str().ok()?.parse().ok());
    match after {
        Some(us) => tokio::time::timeout(Duration::from_micros(us), next.run(req))
            .await
            .unwrap_or_else(|_| StatusCode::REQUEST_TIMEOUT.into_response()),
        None => next.run(req).await,
    }
}

/// Counts the server's live request futures, whether they complete or are dropped.
#[derive(Clone, Default)]
struct Live(Arc<(AtomicUsize, Notify)>);

struct LiveGuard(Live);

impl Drop for LiveGuard {
    fn drop(&mut self) {
        if (self.0).0.0.fetch_sub(1, Ordering::AcqRel) == 1 {
            (self.0).0.1.notify_waiters();
        }
    }
}

impl Live {
    fn enter(&self) -> LiveGuard {
        self.0.0.fetch_add(1, Ordering::AcqRel);
        LiveGuard(self.clone())
    }

    /// Waits until no request future is left on the server.
    async fn drained(&self) {
        loop {
            let notified = self.0.1.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.0.0.load(Ordering::Acquire) == 0 {
                return;
            }
            notified.await;
        }
    }
}

async fn count_live(State(live): State<Live>, req: Request, next: Next) -> Response {
    let _guard = live.enter();
    next.run(req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_colliding_and_cancelled_requests_leaves_the_accounting_intact() {
    let db = TestDb::new();
    let pool = db.pool(8, Duration::ZERO).await;
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(8)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(4))
            .jitter(Jitter::Full)
            .deadline(Duration::from_secs(3)),
    );
    let live = Live::default();
    let app = Router::new()
        .route("/items/{id}", post(write))
        .layer(layer.clone())
        .layer(from_fn(cancel_after))
        .layer(from_fn_with_state(live.clone(), count_live))
        .with_state(App {
            pool: pool.clone(),
            seq: Arc::default(),
        });
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);

    // The route meets contention before the storm, for certain: a held write lock makes
    // every attempt of a request fail with SQLITE_BUSY, so the route gets its limit.
    let lock = db.hold_write_lock().await;
    let res = client.post("/items/first", "").await;
    assert_eq!(res.status, StatusCode::SERVICE_UNAVAILABLE);
    lock.release().await;
    assert_eq!(layer.metrics().admission_limits().len(), 1);

    // Another writer, outside the layer, commits in a loop all through the storm.
    let stop = Arc::new(AtomicBool::new(false));
    let outsider = {
        let stop = stop.clone();
        let mut conn = sqlx::SqliteConnection::connect_with(&db.options(Duration::from_secs(5)))
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut rng = Rng::new(u64::MAX);
            let mut n: i64 = -1;
            while !stop.load(Ordering::Relaxed) {
                let mut tx = conn.begin().await.unwrap();
                sqlx::query("INSERT INTO items (seq, name) VALUES (?, 'outside')")
                    .bind(n)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                for _ in 0..rng.below(8) {
                    tokio::task::yield_now().await;
                }
                tx.commit().await.unwrap();
                n -= 1;
                tokio::time::sleep(Duration::from_micros(200 + rng.below(800))).await;
            }
        })
    };

    // Watches the limit move, for the report.
    let watcher = {
        let (stop, layer) = (stop.clone(), layer.clone());
        tokio::spawn(async move {
            let (mut low, mut high, mut changes, mut last) = (u32::MAX, 0, 0, 1);
            while !stop.load(Ordering::Relaxed) {
                if let Some(route) = layer.metrics().admission_limits().first() {
                    low = low.min(route.limit());
                    high = high.max(route.limit());
                    changes += u32::from(route.limit() != last);
                    last = route.limit();
                }
                tokio::time::sleep(Duration::from_micros(500)).await;
            }
            (low, high, changes)
        })
    };

    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut rng = Rng::new(c + 1);
                let mut statuses = Vec::new();
                for i in 0..REQUESTS_PER_CLIENT {
                    let mut req = http::Request::post(format!("/items/{c}-{i}"));
                    if rng.below(8) == 0 {
                        req = req.header(CANCEL_HEADER, rng.below(5000).to_string());
                    }
                    let req = req.body(Body::empty()).unwrap();
                    if rng.below(8) == 0 {
                        // The client gives up at a random moment: its connection closes.
                        let wait = Duration::from_micros(rng.below(5000));
                        if let Ok(res) = tokio::time::timeout(wait, client.send(req)).await {
                            statuses.push(res.status);
                        }
                    } else {
                        statuses.push(client.send(req).await.status);
                    }
                }
                statuses
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for c in clients {
        statuses.extend(c.await.unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    outsider.await.unwrap();
    let (low, high, changes) = watcher.await.unwrap();
    tokio::time::timeout(Duration::from_secs(60), live.drained())
        .await
        .expect("every server-side request ends or is dropped");

    let created = statuses
        .iter()
        .filter(|s| **s == StatusCode::CREATED)
        .count();
    assert!(created > 0, "the storm got writes through: {statuses:?}");
    let metrics = layer.metrics().snapshot();
    assert!(metrics.retries > 0, "the storm collided: {metrics:?}");
    eprintln!(
        "{} requests answered, {created} created; retries {}, queued {}; the limit seen \
         between {low} and {high}, {changes} changes seen; now {:?}",
        statuses.len(),
        metrics.retries,
        metrics.queued,
        layer.metrics().admission_limits()
    );

    let limits = layer.metrics().admission_limits();
    assert_eq!(limits.len(), 1, "{limits:?}");
    let route = &limits[0];
    assert_eq!(route.route(), "/items/{id}");
    assert!((1..=256).contains(&route.limit()), "{route:?}");
    assert_eq!((route.held(), route.waiting()), (0, 0), "{route:?}");

    // The route still serves, at once.
    let queued = layer.metrics().snapshot().queued;
    assert_eq!(
        client.post("/items/last", "").await.status,
        StatusCode::CREATED
    );
    assert_eq!(layer.metrics().snapshot().queued, queued, "not queued");
    let route = &layer.metrics().admission_limits()[0];
    assert_eq!((route.held(), route.waiting()), (0, 0), "{route:?}");
}
