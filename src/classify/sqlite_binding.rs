//! The SQLite-only bindings' shared code (rusqlite, libSQL), as a macro expanded in
//! `rusqlite.rs` and `libsql.rs` beside each one's `coded` (the one thing they do differently:
//! where the driver's error keeps SQLite's extended code): the `DriverError` impl, what
//! `DbError`'s events say, and the deprecated per-driver functions and classifier.

macro_rules! sqlite_binding {
    (
        driver: $driver:ident,
        feature: $feature:literal,
        classify: $classify:ident,
        is_constraint_violation: $is_constraint_violation:ident,
        classifier: $classifier:ident $(,)?
    ) => {
        #[doc = concat!(
            "Whether a ", stringify!($driver), " error is worth replaying the whole request ",
            "for: deprecated, the same as `tower_sqlite_retry::classify` (and ",
            "[`DriverError::retryable`](crate::DriverError::retryable)), one function for ",
            "every driver."
        )]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        #[deprecated(since = "0.1.0", note = "use `tower_sqlite_retry::classify` (or `DriverError::retryable`): one function for every driver")]
        pub fn $classify(error: &$driver::Error) -> Option<Retryable> {
            error.retryable()
        }

        #[doc = concat!(
            "Whether a ", stringify!($driver), " error is a constraint violation: deprecated, ",
            "the same as [`DriverError::is_constraint_violation`]",
            "(crate::DriverError::is_constraint_violation)."
        )]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        #[deprecated(since = "0.1.0", note = "use `DriverError::is_constraint_violation` (or `classify::is_constraint_violation`): one for every driver")]
        pub fn $is_constraint_violation(error: &$driver::Error) -> bool {
            error.is_constraint_violation()
        }

        #[doc = concat!(
            "An error classifier for services whose error is, or boxes, a `",
            stringify!($driver), "::Error`: deprecated, use `classify::DriverErrors`, one ",
            "classifier for every driver."
        )]
        #[cfg_attr(docsrs, doc(cfg(feature = $feature)))]
        #[derive(Clone, Copy, Debug, Default)]
        #[deprecated(
            since = "0.1.0",
            note = "use `classify::DriverErrors`: one classifier for every driver"
        )]
        pub struct $classifier;

        #[allow(deprecated)]
        impl ClassifyError<$driver::Error> for $classifier {
            fn classify_error(&self, error: &$driver::Error) -> Option<Retryable> {
                error.retryable()
            }
        }

        #[allow(deprecated)]
        impl ClassifyError<tower::BoxError> for $classifier {
            fn classify_error(&self, error: &tower::BoxError) -> Option<Retryable> {
                error
                    .downcast_ref::<$driver::Error>()
                    .and_then(DriverError::retryable)
            }
        }

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
