use axum::{extract::State, http::StatusCode};
use deadpool_diesel::sqlite::Pool;
use diesel::prelude::*;
use tower_sqlite_retry::DbError;

use crate::schema::items;

pub async fn add(State(pool): State<Pool>, name: String) -> Result<StatusCode, DbError> {
    let conn = pool.get().await.map_err(DbError::internal)?;
    conn.interact(move |conn| {
        diesel::insert_into(items::table)
            .values(items::name.eq(name))
            .execute(conn)
    })
    .await
    // `interact`'s own error is a panic of the closure (or its cancellation), never the
    // database's: the query's error is the closure's result, the second `?`.
    .map_err(|e| DbError::internal(e.to_string()))??;
    Ok(StatusCode::CREATED)
}
