//! The Diesel binding (feature `diesel`): reads a `diesel::result::Error` for the tables.
//!
//! Diesel keeps no database code. Its SQLite backend reads the extended result code only to
//! pick a [`DatabaseErrorKind`] (unique and primary key, foreign key, not null, check) and
//! reports every other failure as `DatabaseError(DatabaseErrorKind::Unknown, info)`, whose
//! `info.message()` is `sqlite3_errmsg`'s text (`diesel/src/sqlite/connection/stmt.rs`,
//! `last_error`, the same in Diesel 2.2 and 2.3). So `SQLITE_BUSY` is known here by its text:
//!
//! - SQLite gives every `SQLITE_BUSY*` (`5`, `261` _RECOVERY, `517` _SNAPSHOT, `773` _TIMEOUT)
//!   one message, `database is locked`: `sqlite3_errmsg` falls back to `sqlite3ErrStr`, which
//!   masks the code to its primary code (`rc &= 0xff`), and SQLite sets no text of its own for
//!   lock contention (a busy `BEGIN`, `COMMIT`, a write, or the busy handler giving up);
//! - no other code has that text (`SQLITE_LOCKED` is `database table is locked`);
//! - the `SQLITE_BUSY`s the connection causes itself carry texts of their own
//!   (`cannot commit transaction - SQL statements in progress`, ...), which do not match, and so
//!   are not replayed, as with every other driver.
//!
//! Hence the verdict: retryable exactly when the error is `DatabaseError(Unknown, info)` with
//! `info.message()` equal to `database is locked` (named `SQLITE_BUSY`, code `5`), or
//! `DatabaseError(SerializationFailure, _)` (PostgreSQL's `40001` and MySQL's `1213` as Diesel's
//! backends report them: named `serialization_failure`, code `40001`, whatever the crate's
//! `postgres` and `mysql` features, which are about sqlx's drivers). Nothing else: a message
//! that differs by a byte, another kind with that message, PostgreSQL's deadlock `40P01` and
//! MySQL's lock wait time-out `1205` (both `Unknown` in Diesel, with the server's text) are
//! not replayed. The verdict from the message is said so in `DbError`'s event
//! (`db.classified_by = "message"`). What could defeat the text (`sqlite3_set_errmsg`, an
//! extension or function that sets that text itself) is in `docs/stacks.md`.
//!
//! Constraint kinds: `UniqueViolation` and `ForeignKeyViolation` are a conflict (`409`),
//! `NotNullViolation` and `CheckViolation` invalid input (`422`), as the code tables say for
//! SQLite's codes behind them. Kinds only Diesel 2.3 has (`RestrictViolation`,
//! `ExclusionViolation`, PostgreSQL's) are not named here, so that Diesel 2.2 builds: `500`.
//!
//! The dependency is declared without default features and with none of Diesel's turned on:
//! no backend, so no `libsqlite3-sys` (nor libpq, nor libmysqlclient) through this crate.

use diesel::result::{DatabaseErrorInformation, DatabaseErrorKind, Error};

use super::driver::DriverError;
use super::marker::{Constraint, Detail, Retryable};
use super::postgres::classify_postgres_code;
use super::sqlite::{classify_sqlite_code, sqlite_code_name};

/// The text SQLite gives every `SQLITE_BUSY*` (`sqlite3ErrStr(SQLITE_BUSY)`, the primary code's
/// message, from SQLite 3.x's first releases to 3.51).
pub(crate) const SQLITE_BUSY_MESSAGE: &str = "database is locked";

/// SQLite's `SQLITE_BUSY`, the code a Diesel error with [`SQLITE_BUSY_MESSAGE`] stands for.
const SQLITE_BUSY: i32 = 5;

/// PostgreSQL's serialization_failure, the SQLSTATE Diesel's `SerializationFailure` stands for
/// (MySQL's `1213` has this SQLSTATE too).
const SERIALIZATION_FAILURE: &str = "40001";

/// What this crate reads of a Diesel error.
enum Read {
    /// `SQLITE_BUSY`, known by its message.
    Busy,
    /// `SerializationFailure`.
    SerializationFailure,
    /// A constraint kind, with its name for the events.
    Constraint(Constraint, &'static str),
    /// Another database error.
    Other,
    /// Not a database error (`NotFound`, a deserialization error, ...).
    NotDatabase,
}

fn read(error: &Error) -> Read {
    let Error::DatabaseError(kind, info) = error else {
        return Read::NotDatabase;
    };
    match kind {
        DatabaseErrorKind::Unknown if info.message() == SQLITE_BUSY_MESSAGE => Read::Busy,
        DatabaseErrorKind::SerializationFailure => Read::SerializationFailure,
        DatabaseErrorKind::UniqueViolation => {
            Read::Constraint(Constraint::Conflict, "unique_violation")
        }
        DatabaseErrorKind::ForeignKeyViolation => {
            Read::Constraint(Constraint::Conflict, "foreign_key_violation")
        }
        DatabaseErrorKind::NotNullViolation => {
            Read::Constraint(Constraint::Invalid, "not_null_violation")
        }
        DatabaseErrorKind::CheckViolation => {
            Read::Constraint(Constraint::Invalid, "check_violation")
        }
        _ => Read::Other,
    }
}

/// The marker of a `SQLITE_BUSY` known by its message: SQLite's table, and the one fact only
/// the request knows (as `classify_sqlite_in_request` says for the drivers with codes): met
/// while the request holds a write turn, the `SQLITE_BUSY` is the request's own lock (a write
/// outside its transaction), which a replay would meet again.
fn busy() -> Option<Retryable> {
    let verdict = classify_sqlite_code(SQLITE_BUSY, SQLITE_BUSY_MESSAGE);
    if verdict.is_some() && crate::attempt::current_request_holds_a_turn() {
        tracing::event!(
            target: "tower_sqlite_retry",
            tracing::Level::ERROR,
            db.response.status_code = SQLITE_BUSY,
            db.response.status_name = sqlite_code_name(SQLITE_BUSY),
            db.classified_by = "message",
            "SQLITE_BUSY while this request holds a write transaction open: a write outside \
             the transaction waited for the transaction's own lock; run it on the \
             transaction's connection. Not replayed: a replay would wait again"
        );
        return None;
    }
    verdict
}

/// The kind of constraint violation the error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &Error) -> Option<Constraint> {
    match read(error) {
        Read::Constraint(constraint, _) => Some(constraint),
        _ => None,
    }
}

/// How the verdict on `error` was reached when not by a code: `Some("message")` for a Diesel
/// `SQLITE_BUSY` (known by SQLite's text), for `DbError`'s retryable event.
pub(super) fn classified_by(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<&'static str> {
    let error = error.downcast_ref::<Error>()?;
    matches!(read(error), Read::Busy).then_some("message")
}

impl super::driver::Sealed for Error {}

/// Diesel 2.2 and 2.3 (`diesel::result::Error`): see the module's documentation for what is
/// read, and how.
impl DriverError for Error {
    fn retryable(&self) -> Option<Retryable> {
        match read(self) {
            Read::Busy => busy(),
            Read::SerializationFailure => classify_postgres_code(SERIALIZATION_FAILURE),
            _ => None,
        }
    }

    fn is_constraint_violation(&self) -> bool {
        constraint(self).is_some()
    }

    fn code(&self) -> Option<String> {
        match read(self) {
            Read::Busy => Some(SQLITE_BUSY.to_string()),
            Read::SerializationFailure => Some(SERIALIZATION_FAILURE.to_owned()),
            _ => None,
        }
    }

    fn code_name(&self) -> Option<&'static str> {
        match read(self) {
            Read::Busy => Some(sqlite_code_name(SQLITE_BUSY)),
            Read::SerializationFailure => Some("serialization_failure"),
            _ => None,
        }
    }
}

/// What [`DbError`](crate::DbError)'s tracing events say of a Diesel database error: the code
/// when one was read (`5`, `40001`), the kind's name for a constraint (`unique_violation`), the
/// constraint and table when the backend names them (PostgreSQL), the message.
pub(super) fn database_detail(
    error: &(dyn std::error::Error + Send + Sync + 'static),
) -> Option<Detail> {
    let error = error.downcast_ref::<Error>()?;
    let Error::DatabaseError(_, info) = error else {
        return None;
    };
    let info: &dyn DatabaseErrorInformation = info.as_ref();
    let name = match read(error) {
        Read::Constraint(_, name) => name,
        Read::Busy | Read::SerializationFailure => error.code_name().unwrap_or_default(),
        Read::Other | Read::NotDatabase => "",
    };
    Some(Detail {
        code: error.code().unwrap_or_default(),
        name,
        constraint: info.constraint_name().map(str::to_owned),
        table: info.table_name().map(str::to_owned),
        message: info.message().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use diesel::result::{DatabaseErrorKind, Error};
    use http::StatusCode;

    use super::*;
    use crate::{DbError, classify_error_chain};

    fn db(kind: DatabaseErrorKind, message: &str) -> Error {
        Error::DatabaseError(kind, Box::new(message.to_owned()))
    }

    fn busy() -> Error {
        db(DatabaseErrorKind::Unknown, "database is locked")
    }

    #[test]
    fn busy_is_known_by_its_exact_message() {
        let marker = busy().retryable().expect("SQLITE_BUSY is retryable");
        assert_eq!((marker.code(), marker.name()), ("5", "SQLITE_BUSY"));
        assert_eq!(busy().code().as_deref(), Some("5"));
        assert_eq!(busy().code_name(), Some("SQLITE_BUSY"));
        assert!(!busy().is_constraint_violation());
        let err = DbError::from(busy());
        assert_eq!(err.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.retryable(), Some(&marker));
    }

    #[test]
    fn other_texts_and_other_kinds_are_not_busy() {
        for message in [
            // SQLite's own same-connection SQLITE_BUSY: a replay meets it again.
            "cannot commit transaction - SQL statements in progress",
            "cannot release savepoint - SQL statements in progress",
            "unable to delete/modify user-function due to active statements",
            // SQLITE_LOCKED (6 and 262 share this text: not told apart, not replayed).
            "database table is locked",
            "database is deadlocked",
            // Close is not equal.
            "Database is locked",
            "database is locked ",
            "database is locked: main",
            "",
        ] {
            let err = db(DatabaseErrorKind::Unknown, message);
            assert_eq!(err.retryable(), None, "{message:?}");
            assert_eq!(err.code(), None, "{message:?}");
            assert_eq!(
                DbError::from(err).status(),
                StatusCode::INTERNAL_SERVER_ERROR,
                "{message:?}"
            );
        }
        // The text with another kind: not SQLite's busy (diesel-async reports a failed
        // `spawn_blocking` as `UnableToSendCommand` with the join error's text).
        for kind in [
            DatabaseErrorKind::UnableToSendCommand,
            DatabaseErrorKind::ReadOnlyTransaction,
            DatabaseErrorKind::ClosedConnection,
        ] {
            let err = db(kind, "database is locked");
            assert_eq!(err.retryable(), None, "{kind:?}");
        }
        assert_eq!(Error::NotFound.retryable(), None);
        assert_eq!(Error::NotFound.code(), None);
        assert_eq!(
            DbError::from(Error::NotFound).status(),
            StatusCode::INTERNAL_SERVER_ERROR
        );
    }

    #[test]
    fn serialization_failure_is_retryable() {
        let err = db(
            DatabaseErrorKind::SerializationFailure,
            "could not serialize access due to concurrent update",
        );
        let marker = err
            .retryable()
            .expect("a serialization failure is retryable");
        assert_eq!(
            (marker.code(), marker.name()),
            ("40001", "serialization_failure")
        );
        assert_eq!(err.code().as_deref(), Some("40001"));
        assert_eq!(err.code_name(), Some("serialization_failure"));
        assert_eq!(DbError::from(err).status(), StatusCode::SERVICE_UNAVAILABLE);
    }

    #[test]
    fn constraint_kinds_answer_as_for_other_drivers() {
        for (kind, status) in [
            (DatabaseErrorKind::UniqueViolation, StatusCode::CONFLICT),
            (DatabaseErrorKind::ForeignKeyViolation, StatusCode::CONFLICT),
            (
                DatabaseErrorKind::NotNullViolation,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
            (
                DatabaseErrorKind::CheckViolation,
                StatusCode::UNPROCESSABLE_ENTITY,
            ),
        ] {
            // Even with the busy text: the kind decides (SQLite never sends it with these).
            for message in ["UNIQUE constraint failed: items.name", "database is locked"] {
                let err = db(kind, message);
                assert!(err.is_constraint_violation(), "{kind:?}");
                assert_eq!(err.retryable(), None, "{kind:?}");
                assert_eq!(DbError::from(err).status(), status, "{kind:?}");
            }
        }
    }

    #[test]
    fn only_the_message_verdict_is_marked_as_such() {
        assert_eq!(classified_by(&busy()), Some("message"));
        let serialization = db(DatabaseErrorKind::SerializationFailure, "x");
        assert_eq!(classified_by(&serialization), None);
        assert_eq!(
            classified_by(&db(DatabaseErrorKind::UniqueViolation, "x")),
            None
        );
        assert_eq!(classified_by(&std::io::Error::other("x")), None);
    }

    /// `DbError`'s retryable event carries `db.classified_by = "message"` for the busy text,
    /// and no such field for a verdict by kind.
    #[test]
    fn the_retryable_event_says_the_verdict_came_from_the_message() {
        use std::fmt::Debug;
        use std::sync::{Arc, Mutex};

        use tracing::field::{Field, Visit};
        use tracing_subscriber::layer::{Context, SubscriberExt};

        type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;
        struct Record(Seen);
        struct Fields(String, Option<String>);
        impl Visit for Fields {
            fn record_str(&mut self, field: &Field, value: &str) {
                if field.name() == "db.classified_by" {
                    self.1 = Some(value.to_owned());
                }
            }
            fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
                match field.name() {
                    "message" => self.0 = format!("{value:?}"),
                    "db.classified_by" => self.1 = Some(format!("{value:?}")),
                    _ => {}
                }
            }
        }
        impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Record {
            fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
                let mut fields = Fields(String::new(), None);
                event.record(&mut fields);
                self.0.lock().unwrap().push((fields.0, fields.1));
            }
        }

        let seen = Seen::default();
        let subscriber = tracing_subscriber::registry().with(Record(seen.clone()));
        tracing::subscriber::with_default(subscriber, || {
            let _: http::Response<String> = DbError::from(busy()).into_http_response();
            let serialization = db(DatabaseErrorKind::SerializationFailure, "x");
            let _: http::Response<String> = DbError::from(serialization).into_http_response();
        });
        let retryable: Vec<_> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|(message, _)| message == "db error (retryable)")
            .map(|(_, by)| by.clone())
            .collect();
        assert_eq!(retryable, [Some("message".to_owned()), None]);
    }

    #[test]
    fn detail_names_the_code_or_the_kind() {
        let detail = database_detail(&busy()).unwrap();
        assert_eq!(
            (detail.code.as_str(), detail.name, detail.message.as_str()),
            ("5", "SQLITE_BUSY", "database is locked")
        );
        let detail = database_detail(&db(DatabaseErrorKind::UniqueViolation, "u")).unwrap();
        assert_eq!(
            (detail.code.as_str(), detail.name, detail.message.as_str()),
            ("", "unique_violation", "u")
        );
        assert!(database_detail(&Error::NotFound).is_none());
    }

    /// An application's error around Diesel's, and pools' errors that hold it as their
    /// `source()`: the chain classifier finds it.
    #[test]
    fn the_chain_finds_diesel_errors() {
        #[derive(Debug, thiserror::Error)]
        enum AppError {
            #[error("database")]
            Db(#[from] Error),
        }
        assert_eq!(
            classify_error_chain(&AppError::from(busy()))
                .unwrap()
                .name(),
            "SQLITE_BUSY"
        );
        assert!(
            classify_error_chain(&AppError::from(db(DatabaseErrorKind::UniqueViolation, "u")))
                .is_none()
        );
        let report = anyhow::Error::from(busy()).context("saving the item");
        assert_eq!(classify_error_chain(&*report).unwrap().code(), "5");
        // Diesel's `ConnectionError` forwards `source()` past the error it holds: read here.
        let setup = diesel::ConnectionError::CouldntSetupConfiguration(busy());
        assert_eq!(classify_error_chain(&setup).unwrap().code(), "5");
        let bad = diesel::ConnectionError::BadConnection("no such file".to_owned());
        assert!(classify_error_chain(&bad).is_none());
        // A `DbError` made from it answers with its own marker.
        assert!(classify_error_chain(&DbError::from(busy())).is_some());
    }
}
