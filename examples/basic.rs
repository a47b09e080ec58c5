//! The README's quick start: one write route, one read route, the layer around both.
//!
//! ```text
//! cargo run --example basic
//! curl -d pen localhost:3000/orders
//! curl localhost:3000/orders
//! ```
use axum::{Json, Router, extract::State, routing::post};
use sqlx::SqlitePool;
use tower_sqlite_retry::{DbError, SqliteRetryLayer};

// One transaction per request: a replay re-runs all of it, so nothing is done twice.
async fn create_order(State(db): State<SqlitePool>, item: String) -> Result<Json<i64>, DbError> {
    let mut tx = db.begin().await?; // sqlx errors convert; busy ones are replayed
    let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM orders")
        .fetch_one(&mut *tx)
        .await?;
    sqlx::query("INSERT INTO orders (seq, item) VALUES (?, ?)")
        .bind(next)
        .bind(item)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(Json(next))
}

async fn list_orders(State(db): State<SqlitePool>) -> Result<Json<Vec<String>>, DbError> {
    let items = sqlx::query_scalar("SELECT item FROM orders ORDER BY seq")
        .fetch_all(&db)
        .await?;
    Ok(Json(items))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let db = SqlitePool::connect("sqlite:orders.db?mode=rwc").await?;
    sqlx::query("CREATE TABLE IF NOT EXISTS orders (seq INTEGER PRIMARY KEY, item TEXT NOT NULL)")
        .execute(&db)
        .await?;
    let app = Router::new()
        .route("/orders", post(create_order).get(list_orders))
        .layer(SqliteRetryLayer::default()) // RetryPolicy::default()
        .with_state(db);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app).await?;
    Ok(())
}
