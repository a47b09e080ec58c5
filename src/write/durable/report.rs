//! What group commit's shared fsync says and bounds, whichever front end runs it (the sqlx
//! path's `Syncs`, the writer thread's fsync thread): the bound on commits waiting for one
//! fsync, the report of an fsync that ran, and of one that failed and stopped group commit.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::write::core::turn::Queue;

/// How many committed transactions may wait, unanswered, for the shared fsync (those waiting
/// and those the running fsync covers): past it, a transaction that begins runs at the pool's
/// own level and its `COMMIT` fsyncs in the turn, as without group commit, so that a disk that
/// stalls holds the writers back instead of letting every one of them commit (visible) without
/// an answer. Far above what a working disk gathers (`BENCHMARKS.md`: the largest group under
/// 256 writers).
pub(crate) const MAX_UNANSWERED: usize = 512;

/// What the commits a failed sync of the WAL stopped are told: `why`, and what to do.
pub(crate) fn stop_reason(why: &str) -> Arc<str> {
    Arc::from(format!("{why}; {STOPPED_ADVICE}"))
}

/// An fsync of `queue`'s WAL ran for `members` committed transactions and took `took`:
/// counted in its `WriteStats`, its metric recorded and its DEBUG event emitted, the same for
/// the sqlx path's groups and the writer thread's. The group's number.
pub(crate) fn report_sync(queue: &Queue, members: usize, took: Duration, ok: bool) -> u64 {
    let group = queue.counts().synced(members);
    crate::recorder::write_group(queue.database(), members, took);
    tracing::debug!(
        db.namespace = %queue.database(),
        db.write.group = group,
        db.write.transactions = members,
        db.write.fsync_us = u64::try_from(took.as_micros()).unwrap_or(u64::MAX),
        db.write.fsync_ok = ok,
        "group commit: an fsync of the WAL ran for the transactions waiting"
    );
    group
}

/// A shared fsync stopped for good (a sync of the WAL at `wal` failed, `why`): counted, and
/// said at ERROR, once per stop. The file's refusal is the caller's (`Queue::refuse`).
pub(crate) fn report_stop(queue: &Queue, wal: &Path, why: &str) {
    queue.counts().sync_failed();
    crate::recorder::write_sync_failed(queue.database());
    tracing::error!(
        db.namespace = %queue.database(),
        error.message = %why,
        "group commit stopped: a sync of the WAL ({}) failed, and what it did not make \
         durable cannot be told apart; the transactions waiting for an fsync fail, and \
         so does every later write to the database; {STOPPED_ADVICE}",
        wal.display()
    );
}

/// What an operator does once the disk refused a write of the WAL.
const STOPPED_ADVICE: &str = "writes to this database are refused until the process \
     restarts (frames the failed sync did not make durable would take every later commit with \
     them on a power loss); check the disk, then restart the process (SQLite recovers the WAL)";
