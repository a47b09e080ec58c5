//! The sqlx 0.9 binding (feature `sqlx`): turns a `sqlx::Error` into a [`Coded`] for the
//! tables.
//!
//! It depends on sqlx-core only (through the `sqlx` facade with no features), never on sqlx's
//! SQLite driver, so it cannot downcast to `SqliteError`: PostgreSQL and MySQL errors are
//! recognised first, by downcast, when their features are on, and what remains is SQLite's if
//! its code is one to four digits (see [`super::sqlite`] for why that rule is sound). The
//! `sqlx08` binding is the same code against sqlx 0.8's types.

use sqlx::error::{DatabaseError, ErrorKind};

use super::coded::{Backend, Coded};
use super::marker::{Constraint, Retryable};
use super::sqlite::sqlx_sqlite_code;

/// The kind of constraint sqlx's `ErrorKind` says, for a database whose table is not compiled
/// in (its feature is off).
fn kind_constraint(kind: ErrorKind) -> Option<Constraint> {
    match kind {
        ErrorKind::UniqueViolation
        | ErrorKind::ForeignKeyViolation
        | ErrorKind::ExclusionViolation => Some(Constraint::Conflict),
        ErrorKind::NotNullViolation | ErrorKind::CheckViolation => Some(Constraint::Invalid),
        _ => None,
    }
}

/// The kind of constraint violation a sqlx error is, for [`DbError`](crate::DbError).
pub(crate) fn constraint(error: &sqlx::Error) -> Option<Constraint> {
    constraint_of(error)
}

super::sqlx_binding::sqlx_binding!();
