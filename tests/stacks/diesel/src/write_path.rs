use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::{extract::State, http::StatusCode};
use deadpool_diesel::sqlite::Pool;
use diesel::prelude::*;
use tower_sqlite_retry::DbError;
use tower_sqlite_retry::write::{WriteQueue, WriteTurn};

use crate::schema::items;

/// Gives the turn back once the transaction is over: `committed()` when it committed (which
/// also fences the request: no replay past the commit), a plain drop when it failed. Before
/// the caller's `?` reads the error: a `SQLITE_BUSY` met while the request still holds its
/// turn reads as the request's own lock, and is not replayed.
pub fn give_back<T>(turn: WriteTurn, result: QueryResult<T>) -> QueryResult<T> {
    match &result {
        Ok(_) => turn.committed(),
        Err(_) => drop(turn),
    }
    result
}

/// Synchronous Diesel: the turn first (no connection held while waiting), then
/// `BEGIN IMMEDIATE`.
pub async fn add(
    State((db, writes)): State<(Arc<Mutex<SqliteConnection>>, WriteQueue)>,
    name: String,
) -> Result<StatusCode, DbError> {
    let turn = writes
        .turn(Duration::from_secs(5))
        .await
        .map_err(DbError::internal)?;
    let mut conn = db.lock().unwrap();
    let result = conn.immediate_transaction(|conn| {
        diesel::insert_into(items::table)
            .values(items::name.eq(&name))
            .execute(conn)
    });
    give_back(turn, result)?;
    Ok(StatusCode::CREATED)
}

/// deadpool-diesel: the turn first, then a connection; the turn goes into `interact` with
/// the transaction.
pub async fn add_pooled(
    State((pool, writes)): State<(Pool, WriteQueue)>,
    name: String,
) -> Result<StatusCode, DbError> {
    let turn = writes
        .turn(Duration::from_secs(5))
        .await
        .map_err(DbError::internal)?;
    let conn = pool.get().await.map_err(DbError::internal)?;
    conn.interact(move |conn| {
        let result = conn.immediate_transaction(|conn| {
            diesel::insert_into(items::table)
                .values(items::name.eq(&name))
                .execute(conn)
        });
        give_back(turn, result)
    })
    .await
    .map_err(|e| DbError::internal(e.to_string()))??;
    Ok(StatusCode::CREATED)
}
