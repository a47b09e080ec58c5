use axum::{extract::State, http::StatusCode};
use sea_orm::{ActiveModelTrait, ConnAcquireErr, DatabaseConnection, DbErr, RuntimeErr, Set};
use sea_orm::{SqlxError, TransactionError, TransactionTrait};
use tower_sqlite_retry::DbError;

use crate::item;

/// SeaORM's `DbErr` holds sqlx's error in `Exec`, `Query` and `Conn`: `DbError` classifies it
/// (`503` and a replay for `SQLITE_BUSY`, `409` for a unique violation, ...). A pool time-out
/// is SeaORM's own `ConnAcquireErr::Timeout`, sqlx's `PoolTimedOut` before it: retryable too.
pub fn db_error(err: DbErr) -> DbError {
    match err {
        DbErr::Exec(RuntimeErr::SqlxError(e))
        | DbErr::Query(RuntimeErr::SqlxError(e))
        | DbErr::Conn(RuntimeErr::SqlxError(e)) => DbError::from(e),
        DbErr::ConnectionAcquire(ConnAcquireErr::Timeout) => DbError::from(SqlxError::PoolTimedOut),
        other => DbError::internal(other),
    }
}

pub async fn add(
    State(db): State<DatabaseConnection>,
    name: String,
) -> Result<StatusCode, DbError> {
    let item = item::ActiveModel {
        name: Set(name),
        ..Default::default()
    };
    item.insert(&db).await.map_err(db_error)?;
    Ok(StatusCode::CREATED)
}

/// In a transaction: `TransactionError` has no `source()`; its `DbErr` is taken out.
pub async fn add_in_transaction(
    State(db): State<DatabaseConnection>,
    name: String,
) -> Result<StatusCode, DbError> {
    db.transaction::<_, _, DbErr>(|txn| {
        Box::pin(async move {
            let item = item::ActiveModel {
                name: Set(name),
                ..Default::default()
            };
            item.insert(txn).await
        })
    })
    .await
    .map_err(|e| match e {
        TransactionError::Connection(e) | TransactionError::Transaction(e) => db_error(e),
    })?;
    Ok(StatusCode::CREATED)
}
