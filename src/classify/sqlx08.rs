//! The sqlx 0.8 binding (feature `sqlx-0_8`): turns a sqlx 0.8 error into a [`Coded`] for the
//! tables.
//!
//! The same code as the sqlx 0.8 binding (`sqlx.rs`, whose module documentation says why it
//! works as it does), against sqlx 0.8's types: sqlx-core 0.8 through the facade with no
//! features, PostgreSQL's and MySQL's pure-Rust drivers when their features are on. Keep the
//! two files alike. sqlx 0.8's SQLite driver gives the extended result code in decimal, as
//! 0.9's does (`SqliteError::code`).
//!
//! In an application on sqlx 0.8 the crate is named `sqlx`; here it is `sqlx_0_8`, as in the
//! examples below.

use sqlx_0_8 as sqlx;

use sqlx::error::{DatabaseError, ErrorKind};

use super::coded::{Backend, Coded};
use super::marker::{Constraint, Retryable};
use super::sqlite::sqlx_sqlite_code;

/// The kind of constraint sqlx's `ErrorKind` says, for a database whose table is not compiled
/// in (its feature is off).
fn kind_constraint(kind: ErrorKind) -> Option<Constraint> {
    match kind {
        // sqlx 0.8 has no `ErrorKind::ExclusionViolation`.
        ErrorKind::UniqueViolation | ErrorKind::ForeignKeyViolation => Some(Constraint::Conflict),
        ErrorKind::NotNullViolation | ErrorKind::CheckViolation => Some(Constraint::Invalid),
        _ => None,
    }
}

/// The kind of constraint violation a sqlx error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &sqlx::Error) -> Option<Constraint> {
    constraint_of(error)
}

super::sqlx_binding::sqlx_binding!();
