//! `GroupCommitFailed`: what a write transaction committed with group commit is told when the
//! fsync it waited for failed.

use std::error::Error;
use std::fmt;

/// The error a write transaction's `commit()` fails with when group commit (the
/// `WritePool`'s, on by default) shared the fsync and the WAL could not be made durable
/// for it: the fsync it waited for failed, the WAL was no longer at its path, or an earlier
/// sync of the WAL failed (then the database is refused writes: see the write path's docs,
/// "When the disk refuses a write"). The transaction's `COMMIT` went through, but it is not
/// known to be durable.
///
/// Never retryable (a replay would write twice: the request was fenced at the `COMMIT`); the
/// layer answers `500`. The write path puts it inside the driver's I/O error
/// (`sqlx::Error::Io`), which the classifiers leave unretried like any other I/O error. Every other failure of a write transaction is its own, as without group commit.
///
/// Also what a write transaction on a database whose WAL failed to sync earlier (through any
/// pool of this process) is told, at its begin or, if it began before, at its commit: such a
/// database is refused every write until the process restarts ([`is_refusal`](Self::is_refusal)).
#[derive(Clone)]
pub struct GroupCommitFailed {
    detail: String,
    refusal: bool,
}

impl GroupCommitFailed {
    pub(crate) fn new(detail: String) -> Self {
        Self {
            detail,
            refusal: false,
        }
    }

    /// The database's writes are refused (an earlier sync of its WAL failed): `detail` says
    /// which and why.
    pub(crate) fn refused(detail: String) -> Self {
        Self {
            detail,
            refusal: true,
        }
    }

    /// Whether the transaction was refused because an earlier sync of the database's WAL
    /// failed (then nothing of it is acknowledged, and no later write to the file will be until
    /// the process restarts), rather than its own fsync failing.
    pub fn is_refusal(&self) -> bool {
        self.refusal
    }
}

impl fmt::Display for GroupCommitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.refusal {
            return write!(
                f,
                "write refused: an earlier sync of the database's WAL failed, and no write to \
                 it is acknowledged until the process restarts: {}",
                self.detail
            );
        }
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
            .field("detail", &self.detail)
            .field("refusal", &self.refusal)
            .finish()
    }
}

impl Error for GroupCommitFailed {}
