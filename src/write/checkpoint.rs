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
//! takes over once the transactions committed since the last checkpoint wrote about the
//! threshold's worth of pages (SQLite's own schedule), in two steps:
//!
//! 1. **Off the turn**: `PRAGMA wal_checkpoint(PASSIVE)` on a connection of its own (opened
//!    like the writer connection), while writers go on. It copies the bulk of the WAL, but it
//!    never catches up while writers append, and a WAL that is never caught up never restarts:
//!    it only grows (measured: up to the backstop, about 41 MB, with a checkpoint running back
//!    to back).
//! 2. **In the turn**: the checkpointer queues for the turn like a writer, and in it runs the
//!    same passive checkpoint again, which now copies only the frames appended meanwhile and
//!    catches up (no writer of this process appends); then the turn goes on. The next writer's transaction restarts the WAL from its start (as
//!    SQLite does once a checkpoint caught up and no reader still reads the WAL's frames), so
//!    the WAL stays near the threshold. It runs between two transactions, never inside a
//!    writer's `COMMIT`.
//!
//! A passive checkpoint never waits for a lock and never blocks a reader: a reader that still
//! reads old frames keeps the WAL from restarting (until it ends; the next checkpoint catches
//! up again). Nothing changes for durability: the checkpoint copies only what is already
//! committed (and synced, at `FULL`), and syncs the database file as SQLite's own would. A
//! checkpoint that fails is a WARN; one that fails with an I/O error (`SQLITE_IOERR`: a sync
//! of the WAL or the database refused) stops group commit (`group.rs`).
//!
//! - **Only** on a `WritePool`'s own writer connection sharing its fsync, whose
//!   `wal_autocheckpoint` is on and below the backstop: a connection the application
//!   configured otherwise (`wal_autocheckpoint = 0`, it checkpoints itself; or above the
//!   backstop) is left as it is.
//! - **How many commits make a threshold**: each checkpoint says how many frames the WAL
//!   holds; the frames appended since the previous checkpoint (all of them if the WAL
//!   restarted meanwhile, which the WAL header's checkpoint sequence number says), divided by
//!   the commits since, are the frames one commit writes, measured, for the next. The first
//!   checkpoint comes after `threshold` commits. Only commits that shared the fsync count.
//! - **When the checkpointer cannot run** (no runtime, a failing connection), the backstop
//!   still bounds the WAL: the writer connection's `COMMIT` checkpoints past it, as before.
//! - One checkpoint at a time; a commit that finds one running starts none.

use super::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::driver::{BACKSTOP_PAGES, Driver};
use super::group::{NORMAL, Syncs};

/// The background checkpointer of one database's writer connection.
pub(super) struct Checkpoints<D: Driver> {
    /// Where the checkpointing connection comes from (the writer connection's opener).
    pool: D::Pool,
    /// The shared fsync: its turn (the second step runs in it), its WAL's header, and where an
    /// I/O error stops group commit.
    syncs: Arc<Syncs<D>>,
    /// The database's `wal_autocheckpoint`, in pages: about this much WAL between two
    /// checkpoints.
    threshold: u32,
    /// Commits since the last checkpoint started.
    commits: AtomicU64,
    /// WAL frames one commit writes, measured by the last checkpoint (at least 1).
    per_commit: AtomicU64,
    /// A checkpoint runs.
    running: AtomicBool,
    /// The WAL as the last checkpoint left it: its frames, and its header's checkpoint
    /// sequence number (`None`: not read). Only the running checkpoint touches it.
    last: Mutex<(u64, Option<u32>)>,
}

impl<D: Driver> Checkpoints<D> {
    /// The checkpointer of the writer connection `conn`, if it may take over its checkpoints
    /// while the fsync is shared: `conn`'s `wal_autocheckpoint` is on and below the backstop
    /// (the caller knows it is the writer connection of group commit's shared fsync). Nothing
    /// changes on `conn` here: see [`pages_at`](Self::pages_at).
    pub(super) async fn take_over(
        conn: &mut D::Connection,
        pool: &D::Pool,
        syncs: Arc<Syncs<D>>,
    ) -> Result<Option<Arc<Self>>, D::Error> {
        let threshold = match D::autocheckpoint(conn).await? {
            Some(pages) if pages > 0 && pages < BACKSTOP_PAGES => pages,
            _ => return Ok(None),
        };
        Ok(Some(Arc::new(Self {
            pool: pool.clone(),
            syncs,
            threshold,
            commits: AtomicU64::new(0),
            per_commit: AtomicU64::new(1),
            running: AtomicBool::new(false),
            last: Mutex::new((0, None)),
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

    /// The frames one commit wrote: those appended since the last checkpoint (all of them if
    /// the WAL restarted since, its header's sequence number changed) over `commits`.
    fn measure(&self, frames: u64, sequence: Option<u32>, commits: u64) {
        let (last_frames, last_sequence) = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        let restarted = match (sequence, last_sequence) {
            (Some(now), Some(then)) => now != then,
            // Not read: a WAL shorter than the last is one that restarted.
            _ => frames < last_frames,
        };
        let appended = if restarted {
            frames
        } else {
            frames.saturating_sub(last_frames)
        };
        if appended > 0 && commits > 0 {
            self.per_commit
                .store((appended / commits).max(1), Ordering::Relaxed);
        }
    }

    /// The WAL as this checkpoint leaves it.
    fn left(&self, frames: u64, sequence: Option<u32>) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = (frames, sequence);
    }
}

/// A checkpoint under way: lets go of `running` when dropped (done, or never run).
struct Running<D: Driver>(Arc<Checkpoints<D>>);

impl<D: Driver> Running<D> {
    async fn checkpoint(self, commits: u64) {
        let this = &self.0;
        let started = Instant::now();
        // 1. Off the turn: the bulk of the WAL, while writers go on.
        let sequence = this.syncs.wal_sequence();
        let (frames, done) = match D::checkpoint(&this.pool).await {
            Ok(counts) => counts,
            Err(error) => return self.failed(&error),
        };
        this.measure(frames, sequence, commits);
        let mut left = (frames, done);
        let mut in_turn = false;
        // 2. In the turn: caught up, so that the WAL restarts with the next writer. Even when
        // the first step caught up: a writer in its transaction meanwhile appends after it,
        // and a WAL restarts only for a writer that began with every frame checkpointed.
        if let Some(turn) = this.syncs.queue().take(None, None, || None).await {
            in_turn = true;
            let caught_up = D::checkpoint(&this.pool).await;
            drop(turn);
            match caught_up {
                Ok(counts) => left = counts,
                Err(error) => return self.failed(&error),
            }
        }
        this.left(left.0, this.syncs.wal_sequence());
        tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
            db.namespace = %this.syncs.queue().database(),
            db.write.wal_frames = frames,
            db.write.checkpointed = done,
            db.write.wal_frames_left = left.0.saturating_sub(left.1),
            db.write.in_turn = in_turn,
            db.write.commits = commits,
            db.write.checkpoint_us =
                u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            "checkpoint of the WAL, off the writers' transactions"
        );
    }

    /// A checkpoint failed: a WARN, and group commit stops if the disk refused (the
    /// writer connection's backstop still bounds the WAL).
    fn failed(&self, error: &D::Error) {
        let this = &self.0;
        let io = D::is_io_error(error);
        tracing::event!(target: "tower_sqlite_retry", tracing::Level::WARN,
            db.namespace = %this.syncs.queue().database(),
            error.type = D::classify(error).as_ref().map(|r| r.name()),
            db.write.io_error = io,
            "checkpoint of the WAL failed (the writer connection's own checkpoints still bound \
             the WAL)"
        );
        if io {
            this.syncs
                .stop("a checkpoint of the WAL failed with an I/O error (SQLITE_IOERR)");
        }
    }
}

impl<D: Driver> Drop for Running<D> {
    fn drop(&mut self) {
        self.0.running.store(false, Ordering::Release);
    }
}
