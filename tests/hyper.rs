//! The layer without axum: a plain hyper server and a tower `service_fn`, over real TCP, a real
//! SQLite file and a real `SQLITE_BUSY`. This target needs only the `sqlx` feature: CI builds
//! and runs it with `--no-default-features --features sqlx`, so it proves the layer and
//! `DbError` work with the crate's `axum` feature off.

use std::convert::Infallible;
use std::str::FromStr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use tokio::sync::{mpsc, watch};
use tower::ServiceBuilder;
use tower_sqlite_retry::body::ReplayBody;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, Retryable, SqliteRetryLayer};

#[derive(Clone)]
struct Handler {
    pool: SqlitePool,
    /// Each attempt's number and status.
    seen: Arc<Mutex<Vec<(u32, u16)>>>,
    failed: mpsc::UnboundedSender<()>,
    released: watch::Receiver<bool>,
}

impl Handler {
    async fn handle(self, req: Request<ReplayBody<Incoming>>) -> Response<Full<Bytes>> {
        let attempt = req.extensions().get::<Attempt>().unwrap().number();
        if attempt > 1 {
            // Replays wait until the test has released its lock: no timing involved.
            let mut released = self.released.clone();
            released.wait_for(|r| *r).await.unwrap();
        }
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let name = String::from_utf8(body.to_vec()).unwrap();
        let result = async {
            let mut tx = self.pool.begin().await?;
            sqlx::query("INSERT INTO items (name) VALUES (?)")
                .bind(&name)
                .execute(&mut *tx)
                .await?;
            tx.commit().await
        }
        .await;
        let res = match result {
            Ok(()) => Response::new(Full::new(Bytes::from(name))),
            Err(e) => DbError::from(e).into_http_response(),
        };
        self.seen
            .lock()
            .unwrap()
            .push((attempt, res.status().as_u16()));
        if res.extensions().get::<Retryable>().is_some() {
            let _ = self.failed.send(());
        }
        res
    }
}

#[tokio::test]
async fn a_plain_hyper_service_is_replayed_without_axum() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("hyper.db").display());
    let options = |busy: Duration| {
        SqliteConnectOptions::from_str(&url)
            .unwrap()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(busy)
    };
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(options(Duration::ZERO))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();

    let (failed_tx, mut failed) = mpsc::unbounded_channel();
    let (release, released) = watch::channel(false);
    let handler = Handler {
        pool: pool.clone(),
        seen: Arc::default(),
        failed: failed_tx,
        released,
    };
    let seen = handler.seen.clone();
    let layer = SqliteRetryLayer::new(
        RetryPolicy::default()
            .max_attempts(5)
            .base_delay(Duration::from_millis(1))
            .max_delay(Duration::from_millis(1))
            .jitter(Jitter::None),
    );
    let metrics = layer.metrics();
    let service =
        ServiceBuilder::new()
            .layer(layer)
            .service_fn(move |req: Request<ReplayBody<Incoming>>| {
                let handler = handler.clone();
                async move { Ok::<_, Infallible>(handler.clone().handle(req).await) }
            });

    // hyper itself, no axum: one connection served by the layered tower service.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (stream, _) = listener.accept().await.unwrap();
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(stream), TowerToHyperService::new(service))
            .await
            .unwrap();
    });

    // Another connection holds the write lock: the handler's insert gets SQLITE_BUSY at once.
    let mut holder = SqliteConnection::connect_with(&options(Duration::from_secs(5)))
        .await
        .unwrap();
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut holder)
        .await
        .unwrap();

    let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let request = tokio::spawn(
        client.request(
            Request::post(format!("http://{addr}/items"))
                .body(Full::new(Bytes::from_static(b"pear")))
                .unwrap(),
        ),
    );
    failed.recv().await.unwrap();
    sqlx::query("COMMIT").execute(&mut holder).await.unwrap();
    release.send(true).unwrap();

    let res = request.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"pear");
    assert_eq!(*seen.lock().unwrap(), [(1, 503), (2, 200)]);
    let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 1, "exactly once");
    let snap = metrics.snapshot();
    assert_eq!((snap.succeeded_after_retry, snap.retries), (1, 1));
    server.abort();
}
