use std::sync::Arc;

use axum::{extract::State, http::StatusCode};
use diesel::prelude::*;
use diesel::sqlite::SqliteConnection;
use diesel_async::RunQueryDsl;
use diesel_async::sync_connection_wrapper::SyncConnectionWrapper;
use tokio::sync::Mutex;
use tower_sqlite_retry::DbError;

use crate::schema::items;

pub type Db = Arc<Mutex<SyncConnectionWrapper<SqliteConnection>>>;

pub async fn add(State(db): State<Db>, name: String) -> Result<StatusCode, DbError> {
    let mut conn = db.lock().await;
    diesel::insert_into(items::table)
        .values(items::name.eq(name))
        .execute(&mut *conn)
        .await?;
    Ok(StatusCode::CREATED)
}
