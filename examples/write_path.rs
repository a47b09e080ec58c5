//! The write path in a store: a `WritePool` beside the pool, a write that runs to its end even
//! if the client goes away (spawned, and still part of the request with `in_request`), reads
//! on the pool.
//!
//! ```text
//! cargo run --example write_path --features sqlite-write
//! curl -d 'buy pens' localhost:3000/notes
//! curl localhost:3000/notes
//! ```
use std::time::Duration;

use axum::{Json, Router, extract::State, routing::post};
use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool, in_request};

/// A store as applications write them: the pool for reads, a `WritePool` beside it for write
/// transactions.
#[derive(Clone)]
struct Notes {
    db: SqlitePool,
    writes: WritePool,
}

impl Notes {
    fn new(db: SqlitePool) -> Self {
        let writes = WritePool::new(db.clone());
        Self { db, writes }
    }

    /// Read, then write, in one transaction: it waits for its turn, then begins `IMMEDIATE`;
    /// its commit fences the request (no replay after it), wherever this runs.
    async fn put(self, text: String) -> Result<i64, sqlx::Error> {
        let mut tx = self.writes.begin().await?;
        let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM notes")
            .fetch_one(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO notes (seq, text) VALUES (?, ?)")
            .bind(next)
            .bind(text)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(next)
    }

    async fn all(&self) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT text FROM notes ORDER BY seq")
            .fetch_all(&self.db)
            .await
    }
}

async fn create(State(notes): State<Notes>, text: String) -> Result<Json<i64>, DbError> {
    // Spawned, the write runs to its end even if the client goes away mid-way (a dropped
    // request would otherwise drop the transaction half-way). `in_request` keeps it the
    // request's: its commit fences the request, its wait for the turn ends at the deadline.
    let seq = tokio::spawn(in_request(notes.put(text)))
        .await
        .map_err(DbError::internal)??;
    Ok(Json(seq))
}

async fn list(State(notes): State<Notes>) -> Result<Json<Vec<String>>, DbError> {
    Ok(Json(notes.all().await?))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = SqliteConnectOptions::new()
        .filename("notes.db")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let db = SqlitePoolOptions::new()
        .max_connections(8)
        .connect_with(options)
        .await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS notes (seq INTEGER PRIMARY KEY, text TEXT NOT NULL)")
        .execute(&db)
        .await?;
    let app = Router::new()
        .route("/notes", post(create).get(list))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()))
        .with_state(Notes::new(db));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    println!("listening on http://127.0.0.1:3000 (POST /notes, GET /notes)");
    axum::serve(listener, app).await?;
    Ok(())
}
