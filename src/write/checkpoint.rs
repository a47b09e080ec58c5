//! Checkpoints off the turn: the WAL is checkpointed by a connection of its own, in the
//! background, not by the writer connection's `COMMIT` while its transaction holds the turn.
//!
//! SQLite checkpoints a WAL database automatically (`wal_autocheckpoint`, 1,000 pages by
//! default): the `COMMIT` that takes the WAL past the threshold copies the WAL's pages into the
//! database and syncs both (two fsyncs at `NORMAL` as at `FULL`), and returns only then. With
//! `BEGIN IMMEDIATE` on a pool that stalls one connection while the others write on; with the
//! write path it stalls the turn, and every writer waits.
//!
//! **When**: only while the writer connection's fsync is shared (group commit on, WAL at
//! `FULL` or `EXTRA`, the defaults; the connection at `NORMAL` because writers are queued).
//! Measured with `wrk`, 64 writers, seven interleaved rounds (`BENCHMARKS.md`): there, writes
//! went from 2,011 to 2,749 a second (median) and server CPU per write from 561 to 465 µs.
//! Where each `COMMIT` syncs in the turn the background checkpoint's fsyncs competed with the
//! turn's own: group commit off at `FULL`, 1,165 → 927 writes a second; a writer alone (one
//! connection) lost too. A WAL at `NORMAL` (nothing to share) was tried with the checkpointer
//! on every writer connection, a writer alone too: the turn's mean time held per transaction
//! went from 347 to 390 µs (medians of five alternations, 64 writers), and the writes moved
//! within the rounds' noise (the checkpoint's work is only moved, not saved, and on two cores
//! it then runs beside the turn). So those keep SQLite's own schedule: the writer
//! connection's `wal_autocheckpoint` is switched with its `synchronous` level
//! ([`pages_at`](Checkpoints::pages_at)), the backstop at `NORMAL`, the database's own
//! threshold at the pool's level.
//!
//! So, while the fsync is shared, the writer connection's own automatic checkpoint is moved to
//! a backstop far above the database's threshold ([`BACKSTOP_PAGES`]), and this checkpointer
//! runs
//! `PRAGMA wal_checkpoint(PASSIVE)` on a connection of its own (opened like the writer
//! connection, kept idle between checkpoints) once the transactions committed since the last
//! checkpoint wrote about the threshold's worth of pages: SQLite's own schedule, off the turn.
//! A passive checkpoint never waits for a lock and never blocks a writer or a reader. Nothing
//! changes for durability: the checkpoint copies only what is already committed (and synced,
//! at `FULL`), and syncs the database file as SQLite's own would.
//!
//! - **Only** on a `WritePool`'s own writer connection sharing its fsync, whose
//!   `wal_autocheckpoint` is on and below the backstop: a connection the application
//!   configured otherwise (`wal_autocheckpoint = 0`, it checkpoints itself; or above the
//!   backstop) is left as it is.
//! - **How many commits make a threshold**: each checkpoint says how many frames the WAL
//!   held; divided by the commits since the previous one, that is the frames one commit
//!   writes, measured, for the next. The first checkpoint comes after `threshold` commits.
//!   Only commits that shared the fsync count.
//! - **When the checkpointer cannot run** (no runtime, a failing connection), the backstop
//!   still bounds the WAL: the writer connection's `COMMIT` checkpoints past it, as before.
//! - One checkpoint at a time; a commit that finds one running starts none.

use super::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use super::driver::{BACKSTOP_PAGES, Driver};
use super::group::NORMAL;

/// The background checkpointer of one database's writer connection.
pub(super) struct Checkpoints<D: Driver> {
    /// Where the checkpointing connection comes from (the writer connection's opener).
    pool: D::Pool,
    /// The database's `wal_autocheckpoint`, in pages: about this much WAL between two
    /// checkpoints.
    threshold: u32,
    /// Commits since the last checkpoint started.
    commits: AtomicU64,
    /// WAL frames one commit writes, measured by the last checkpoint (at least 1).
    per_commit: AtomicU64,
    /// A checkpoint runs.
    running: AtomicBool,
    /// The database's name, for the events.
    database: Arc<str>,
}

impl<D: Driver> Checkpoints<D> {
    /// The checkpointer of the writer connection `conn`, if it may take over its checkpoints
    /// while the fsync is shared: `conn`'s `wal_autocheckpoint` is on and below the backstop
    /// (the caller knows it is the writer connection of group commit's shared fsync). Nothing
    /// changes on `conn` here: see [`pages_at`](Self::pages_at).
    pub(super) async fn take_over(
        conn: &mut D::Connection,
        pool: &D::Pool,
        database: &Arc<str>,
    ) -> Result<Option<Arc<Self>>, D::Error> {
        let threshold = match D::autocheckpoint(conn).await? {
            Some(pages) if pages > 0 && pages < BACKSTOP_PAGES => pages,
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(Self {
            pool: pool.clone(),
            threshold,
            commits: AtomicU64::new(0),
            per_commit: AtomicU64::new(1),
            running: AtomicBool::new(false),
            database: Arc::clone(database),
        })))
    }

    /// The writer connection's `wal_autocheckpoint` at `synchronous` level `level`, set with
    /// it: the backstop while it runs at `NORMAL` (its fsync shared, its checkpoints left to
    /// this checkpointer); the database's own threshold at the pool's level (a writer alone,
    /// whose `COMMIT` syncs in the turn anyway: checkpoints as SQLite schedules them).
    pub(super) fn pages_at(&self, level: u8) -> u32 {
        if level == NORMAL {
            BACKSTOP_PAGES
        } else {
            self.threshold
        }
    }

    /// A transaction that shared the fsync committed on the writer connection: starts a
    /// checkpoint when the commits since the last one wrote about a threshold's worth.
    pub(super) fn committed(self: &Arc<Self>) {
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        let frames = commits.saturating_mul(self.per_commit.load(Ordering::Relaxed));
        if frames < u64::from(self.threshold) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let commits = self.commits.swap(0, Ordering::Relaxed);
        // NOTE: the guard exists before the task: a task that never runs lets go of
        // `running` when it is dropped.
        let run = Running(Arc::clone(self));
        D::spawn(run.checkpoint(commits));
    }
}

/// A checkpoint under way: lets go of `running` when dropped (done, or never run).
struct Running<D: Driver>(Arc<Checkpoints<D>>);

impl<D: Driver> Running<D> {
    async fn checkpoint(self, commits: u64) {
        let this = &self.0;
        let started = Instant::now();
        match D::checkpoint(&this.pool).await {
            Ok((frames, done)) => {
                if frames > 0 && commits > 0 {
                    this.per_commit
                        .store((frames / commits).max(1), Ordering::Relaxed);
                }
                tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                    db.namespace = %this.database,
                    db.write.wal_frames = frames,
                    db.write.checkpointed = done,
                    db.write.commits = commits,
                    db.write.checkpoint_us =
                        u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
                    "checkpoint of the WAL, off the turn"
                );
            }
            Err(error) => {
                tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                    db.namespace = %this.database,
                    error.type = D::classify(&error).as_ref().map(|r| r.name()),
                    "checkpoint of the WAL failed (the writer connection's backstop still bounds it)"
                );
            }
        }
    }
}

impl<D: Driver> Drop for Running<D> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}
