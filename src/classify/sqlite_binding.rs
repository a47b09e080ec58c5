//! The SQLite-only bindings' shared code (rusqlite, libSQL), as a macro expanded in
//! `rusqlite.rs` and `libsql.rs` beside each one's `coded` (the one thing they do differently:
//! where the driver's error keeps SQLite's extended code): the `DriverError` impl, what
//! `DbError`'s events say.

macro_rules! sqlite_binding {
    (
        driver: $driver:ident $(,)?
    ) => {
        /// The kind of constraint violation the error is, for [`DbError`](crate::DbError).
        pub(crate) fn constraint(error: &$driver::Error) -> Option<Constraint> {
            coded(error)?.constraint()
        }

        impl super::driver::Sealed for $driver::Error {}

        impl DriverError for $driver::Error {
            fn retryable(&self) -> Option<Retryable> {
                coded(self)?.classify()
            }

            fn is_constraint_violation(&self) -> bool {
                constraint(self).is_some()
            }

            fn code(&self) -> Option<String> {
                Some(coded(self)?.code())
            }

            fn code_name(&self) -> Option<&'static str> {
                Some(coded(self)?.name()).filter(|name| !name.is_empty())
            }
        }

        /// What [`DbError`](crate::DbError)'s tracing events say of an error that carries a
        /// SQLite code.
        pub(super) fn database_detail(
            error: &(dyn std::error::Error + Send + Sync + 'static),
        ) -> Option<Detail> {
            Some(coded(error.downcast_ref::<$driver::Error>()?)?.detail())
        }
    };
}
pub(super) use sqlite_binding;
