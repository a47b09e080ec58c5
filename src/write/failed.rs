//! `GroupCommitFailed`: what a member of a group commit is told when the group's `COMMIT`
//! failed, or SQLite rolled the group's transaction back.

use std::error::Error;
use std::fmt;

use crate::classify::Retryable;

/// The error a write transaction's `commit()` fails with when it was a member of a group
/// commit (see [`GroupCommit`](super::GroupCommit)) and the group's `COMMIT` failed, or SQLite
/// rolled the group's transaction back on its own: nothing of the member was committed.
///
/// The member that ran the `COMMIT` gets the driver's own error; the others get this one,
/// carrying the same classification: retryable when the `COMMIT`'s error was (the layer then
/// replays the member's request, which no commit fenced), not retryable otherwise. The
/// classifiers recognise it inside the driver's I/O error (`sqlx::Error::Io`), where the write
/// path puts it, and anywhere in an error's `source()` chain.
#[derive(Clone)]
pub struct GroupCommitFailed {
    retryable: Option<Retryable>,
    detail: String,
}

impl GroupCommitFailed {
    pub(crate) fn new(retryable: Option<Retryable>, detail: String) -> Self {
        Self { retryable, detail }
    }

    /// The marker of the group's error, if it was retryable.
    pub fn retryable(&self) -> Option<&Retryable> {
        self.retryable.as_ref()
    }
}

impl fmt::Display for GroupCommitFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the group commit this write transaction was a member of failed, nothing of it was \
             committed: {}",
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

/// The marker a group member's failure carries, found in an I/O error (where the write path
/// wraps it).
#[cfg_attr(
    not(any(feature = "sqlx", feature = "sqlx-0_8")),
    allow(dead_code, reason = "the sqlx bindings ask it")
)]
pub(crate) fn in_io_error(error: &std::io::Error) -> Option<Option<Retryable>> {
    let failed = error.get_ref()?.downcast_ref::<GroupCommitFailed>()?;
    Some(failed.retryable.clone())
}
