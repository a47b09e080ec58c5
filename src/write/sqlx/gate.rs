//! Only the write path commits on its writer connection.
//!
//! A write transaction's connection can leave its transaction without the write path: a raw
//! `COMMIT`, `ROLLBACK` or `RELEASE` run on it, or a trigger's `RAISE(ROLLBACK, ...)`, which
//! rolls back SQLite's whole transaction while sqlx (and the write path) still count it open.
//! Every statement the handler runs after that runs in autocommit mode: without a guard, its
//! writes would land on their own, although the transaction's `commit()` then fails.
//!
//! The guard is a commit hook on the writer connection that lets a commit through only while
//! the write path is committing. Anything else that would commit there is turned into a
//! rollback by SQLite (the statement fails with `SQLITE_CONSTRAINT_COMMITHOOK`), and the
//! transaction's `commit()` then fails with an error that says why.
//!
//! A handler can replace the hook on its transaction's connection (`lock_handle()` then
//! `set_commit_hook`, or `remove_commit_hook`), which would remove the guard for every later
//! transaction, and leave the handler's own hook (a veto, say) deciding their commits. So the
//! gate is set again wherever it may have been replaced: after a `COMMIT` during which SQLite
//! did not ask it (a successful `COMMIT` always asks the hook, so an unasked gate was
//! replaced), after a failed `COMMIT`, and after a rollback. A commit that succeeds with the
//! gate asked, the common path, costs nothing more. A handler's hook thus lasts at most until
//! its own transaction ends.
//!
//! On one of the pool's connections (`WriterConnection::FromPool`, an in-memory database) the
//! gate is set after `BEGIN IMMEDIATE` and removed when the transaction ends, by every way out,
//! the drop protocol's included: the connection goes back to the pool with no commit hook, as
//! it came, so that neither the gate (which would refuse the pool's own autocommit writes) nor
//! a hook the handler set (a veto, which would roll back every later commit on it) outlives
//! the transaction. That costs two round trips to the connection's worker per transaction, in
//! those modes only.

use std::sync::atomic::{AtomicBool, Ordering};

/// What the writer connection's commit hook asks: whether the write path is committing now.
/// Not a public API (see `crate::__private`).
#[derive(Debug, Default)]
pub struct CommitGate {
    /// The write path sent its `COMMIT`: one commit may go through.
    open: AtomicBool,
    /// A commit was refused since the transaction began.
    refused: AtomicBool,
}

impl CommitGate {
    /// The commit hook: `true` lets the commit through (once per `COMMIT` the write path
    /// sends); `false` has SQLite roll it back.
    pub fn admits(&self) -> bool {
        if self.open.swap(false, Ordering::AcqRel) {
            return true;
        }
        self.refused.store(true, Ordering::Release);
        tracing::error!(
            "a statement on a write transaction's connection would have committed outside the \
             write path (after a raw COMMIT, ROLLBACK or RELEASE on it, or a trigger's \
             RAISE(ROLLBACK), the connection is in autocommit mode): refused, and rolled back \
             (SQLITE_CONSTRAINT_COMMITHOOK); the transaction's commit() will fail"
        );
        false
    }

    /// A transaction begins: nothing admitted or refused yet.
    pub(crate) fn reset(&self) {
        self.open.store(false, Ordering::Release);
        self.refused.store(false, Ordering::Release);
    }

    /// The write path is about to send its `COMMIT`.
    pub(crate) fn open(&self) {
        self.open.store(true, Ordering::Release);
    }

    /// The write path's `COMMIT` answered: whether a commit the write path did not send was
    /// refused since the transaction began, and whether the hook was not asked (still open:
    /// the handler replaced or removed it through `lock_handle()`, or the `COMMIT` failed
    /// before SQLite asks it) and must be set again.
    pub(crate) fn close(&self) -> Closed {
        let unasked = self.open.swap(false, Ordering::AcqRel);
        Closed {
            refused: self.refused.load(Ordering::Acquire),
            unasked,
        }
    }
}

/// What [`CommitGate::close`] found.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Closed {
    /// A commit the write path did not send was refused.
    pub(crate) refused: bool,
    /// The hook was not asked during the write path's `COMMIT`.
    pub(crate) unasked: bool,
}
