use std::sync::{Arc, Mutex};

use axum::{extract::State, http::StatusCode};
use diesel::prelude::*;
use tower_sqlite_retry::DbError;

use crate::schema::items;

pub async fn add(
    State(db): State<Arc<Mutex<SqliteConnection>>>,
    name: String,
) -> Result<StatusCode, DbError> {
    let mut conn = db.lock().unwrap();
    diesel::insert_into(items::table)
        .values(items::name.eq(name))
        .execute(&mut *conn)?;
    Ok(StatusCode::CREATED)
}
