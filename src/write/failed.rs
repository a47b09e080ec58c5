//! `GroupCommitFailed`: what a write transaction committed with group commit is told when the
//! fsync it waited for failed.

use std::error::Error;
use std::fmt;

use crate::classify::Retryable;

/// The error a write transaction's `commit()` fails with when group commit (the
/// `WritePool`'s, on by default) shared the fsync and the WAL could not be made durable
/// for it: the fsync it waited for failed, the WAL was no longer at its path, or an earlier
/// sync of the WAL failed (then group commit stopped for the pool: see the write path's docs,
/// "When the disk refuses a write"). The transaction's `COMMIT` went through, but it is not
/// known to be durable.
///
/// Never retryable (a replay would write twice: the request was fenced at the `COMMIT`); the
/// layer answers `500`. The write path puts it inside the driver's I/O error
/// (`sqlx::Error::Io`), which the classifiers leave unretried like any other I/O error. Every other failure of a write transaction is its own, as without group commit.
#[derive(Clone)]
pub struct GroupCommitFailed {
    retryable: Option<Retryable>,
    detail: String,
}

impl GroupCommitFailed {
    pub(crate) fn new(retryable: Option<Retryable>, detail: String) -> Self {
        Self { retryable, detail }
    }

    /// The marker of the error, if it was retryable (never, for a failed fsync).
    pub fn retryable(&self) -> Option<&Retryable> {
        self.retryable.as_ref()
    }
}

impl fmt::Display for GroupCommitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "group commit: the write transaction was committed, but is not known to be durable: \
             {}",
            self.detail
        )
    }
}

impl fmt::Debug for GroupCommitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GroupCommitFailed")
            .field("retryable", &self.retryable.as_ref().map(Retryable::name))
            .field("detail", &self.detail)
            .finish()
    }
}

impl Error for GroupCommitFailed {}
