//! The sqlx bindings' shared code, as a macro expanded in `sqlx.rs` and `sqlx08.rs`: the same
//! logic against sqlx 0.9's and sqlx 0.8's types.

/// The sqlx bindings' shared code, expanded in `sqlx.rs` and `sqlx08.rs`, where `sqlx` names
/// each version's crate: the same logic against sqlx 0.9's and sqlx 0.8's types.
#[cfg(any(feature = "sqlx", feature = "sqlx-0_8"))]
macro_rules! sqlx_binding {
    () => {
        /// Whether a sqlx error is worth a replay (the body of `DriverError::retryable`).
        fn classify_error(error: &sqlx::Error) -> Option<Retryable> {
            match error {
                sqlx::Error::PoolTimedOut => Some(super::marker::pool_timed_out()),
                sqlx::Error::Database(db) => coded(db.as_ref()).classify(),
                _ => None,
            }
        }

        /// Which database the error came from, and its code there.
        fn coded(db: &dyn DatabaseError) -> Coded<'_> {
            let message = db.message();
            #[cfg(feature = "postgres")]
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                return Coded {
                    backend: Backend::Postgres(pg.code()),
                    message,
                };
            }
            // `code()` is MySQL's SQLSTATE, too coarse (`40001` for a deadlock, `HY000` for a lock
            // wait timeout); the error number tells them apart.
            #[cfg(feature = "mysql")]
            if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                return Coded {
                    backend: Backend::MySql {
                        number: my.number(),
                        sqlstate: my.code(),
                    },
                    message,
                };
            }
            // SQLite's table only for sqlx's own SQLite driver: a third-party or custom
            // `DatabaseError` with numeric codes is no SQLite error (1285 is not SQLITE_BUSY).
            let code = db.code();
            let sqlite = code
                .as_deref()
                .and_then(sqlx_sqlite_code)
                .filter(|_| super::coded::is_sqlx_sqlite_error(db.as_error()));
            let backend = match sqlite {
                Some(code) => Backend::Sqlite(code),
                None => Backend::Unknown(code),
            };
            Coded { backend, message }
        }

        /// What kind of constraint violation a sqlx error is, if one: the database's table
        /// decides; for a database whose table is not compiled in, sqlx's `ErrorKind`.
        fn constraint_of(error: &sqlx::Error) -> Option<Constraint> {
            let sqlx::Error::Database(db) = error else {
                return None;
            };
            let coded = coded(db.as_ref());
            match coded.backend {
                Backend::Unknown(_) => kind_constraint(db.kind()),
                _ => coded.constraint(),
            }
        }

        impl super::driver::Sealed for sqlx::Error {}

        impl super::driver::DriverError for sqlx::Error {
            fn retryable(&self) -> Option<Retryable> {
                classify_error(self)
            }

            fn is_constraint_violation(&self) -> bool {
                constraint_of(self).is_some()
            }

            fn code(&self) -> Option<String> {
                let sqlx::Error::Database(db) = self else {
                    return None;
                };
                Some(coded(db.as_ref()).code()).filter(|code| !code.is_empty())
            }

            fn code_name(&self) -> Option<&'static str> {
                let sqlx::Error::Database(db) = self else {
                    return None;
                };
                Some(coded(db.as_ref()).name()).filter(|name| !name.is_empty())
            }
        }

        /// What [`DbError`](crate::DbError)'s tracing events say of a sqlx database error.
        pub(super) fn database_detail(
            error: &(dyn std::error::Error + Send + Sync + 'static),
        ) -> Option<super::marker::Detail> {
            match error.downcast_ref::<sqlx::Error>()? {
                sqlx::Error::Database(db) => {
                    let coded = coded(db.as_ref());
                    Some(super::marker::Detail {
                        code: coded.code(),
                        name: coded.name(),
                        constraint: db.constraint().map(str::to_owned),
                        table: db.table().map(str::to_owned),
                        message: db.message().to_owned(),
                    })
                }
                _ => None,
            }
        }
    };
}
pub(super) use sqlx_binding;
