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
//! Measured with `wrk` under 64 writers: more writes, for less CPU per write. Where each
//! `COMMIT` syncs in the turn the background checkpoint's fsyncs competed with the turn's own:
//! group commit off at `FULL`, fewer writes; a writer alone (one connection) lost too. A WAL
//! at `NORMAL` (nothing to share) was tried with the checkpointer on every writer connection,
//! a writer alone too: the turn was held longer per transaction, and the writes moved within
//! the rounds' noise (the checkpoint's work is only moved, not saved, and on two cores
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
//!    like the writer connection, kept between checkpoints), while writers go on. It copies the bulk of the WAL, but it
//!    never catches up while writers append, and a WAL that is never caught up never restarts:
//!    it only grows (measured: up to the backstop, with a checkpoint running back to back).
//! 2. **In the turn**: the checkpointer queues for the turn like a writer, and in it runs
//!    `PRAGMA wal_checkpoint(RESTART)`, which copies only the frames appended meanwhile (no
//!    writer of this process appends), waits for the readers still reading the WAL's frames,
//!    and restarts the WAL from its start, so that it stays near the threshold; then the turn
//!    goes on. It runs between two transactions, never inside a writer's `COMMIT`.
//!
//! The wait for readers is bounded: the checkpointer's connection waits at most 5 ms for a
//! lock ([`CHECKPOINTER_BUSY_SQL`](super::driver::CHECKPOINTER_BUSY_SQL)), so a long reader
//! keeps the WAL from restarting (the next writer restarts it if no reader is left, as SQLite
//! does; else the next checkpoint tries again) instead of holding every writer back. Measured:
//! a passive checkpoint in the turn, which waits for nobody, sometimes left the WAL
//! unrestarted when handlers read after their commit, and its file grew well past the
//! threshold. Nothing changes for durability: the checkpoint copies only what is already
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
//!   checkpoint comes after a sixteenth of `threshold` commits (`FIRST_GUESS`), to measure early. Only commits that shared the fsync count.
//! - **When the checkpointer cannot run** (no runtime, a failing connection), the backstop
//!   still bounds the WAL: the writer connection's `COMMIT` checkpoints past it, as before.
//! - One checkpoint at a time; a commit that finds one running starts none.

use crate::write::core::sync::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::driver::{BACKSTOP_PAGES, Driver};
use super::group::{NORMAL, Syncs};

/// The frames one commit is assumed to write before the first checkpoint measured it: many,
/// so that the first checkpoint comes early (after a sixteenth of the threshold's commits, for
/// transactions of a page or so) and measures. Assuming one, as SQLite's page count would, let
/// the WAL of a four-page transaction reach four thresholds before the first checkpoint, and
/// its file keeps that size.
const FIRST_GUESS: u64 = 16;

/// `per_commit`'s unit: a sixteenth of a frame.
const SIXTEENTHS: u64 = 16;

/// The background checkpointer of one database's writer connection.
pub(crate) struct Checkpoints<D: Driver> {
    /// Where the checkpointing connection comes from (the writer connection's opener).
    pool: D::Pool,
    /// The checkpointer's own connection between two checkpoints (`None` before the first,
    /// and after a failure closed it). Only the running checkpoint takes it.
    conn: Mutex<Option<D::Connection>>,
    /// The shared fsync: its turn (the second step runs in it), its WAL's header, and where an
    /// I/O error stops group commit.
    syncs: Arc<Syncs<D>>,
    /// The database's `wal_autocheckpoint`, in pages: about this much WAL between two
    /// checkpoints.
    threshold: u32,
    /// Commits since the last checkpoint started.
    commits: AtomicU64,
    /// WAL frames one commit writes, measured by the last checkpoint, in sixteenths of a frame
    /// (rounding a fraction of a frame down let the WAL run well past the threshold between
    /// two checkpoints).
    per_commit: AtomicU64,
    /// A checkpoint runs.
    running: AtomicBool,
    /// The pool closed: no checkpoint starts any more.
    closed: AtomicBool,
    /// Told when a checkpoint ends (for [`close`](Checkpoints::close)).
    idle: tokio::sync::Notify,
    /// The WAL as the last checkpoint left it: its frames, and its header's checkpoint
    /// sequence number (`None`: not read). Only the running checkpoint touches it.
    last: Mutex<(u64, Option<u32>)>,
}

impl<D: Driver> Checkpoints<D> {
    /// The checkpointer of the writer connection `conn`, if it may take over its checkpoints
    /// while the fsync is shared: `conn`'s `wal_autocheckpoint` is on and below the backstop
    /// (the caller knows it is the writer connection of group commit's shared fsync). Nothing
    /// changes on `conn` here: see [`pages_at`](Self::pages_at).
    pub(crate) async fn take_over(
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
            conn: Mutex::new(None),
            syncs,
            threshold,
            commits: AtomicU64::new(0),
            per_commit: AtomicU64::new(FIRST_GUESS * SIXTEENTHS),
            running: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            idle: tokio::sync::Notify::new(),
            last: Mutex::new((0, None)),
        })))
    }

    /// The writer connection's `wal_autocheckpoint` at `synchronous` level `level`, set with
    /// it: the backstop while it runs at `NORMAL` (its fsync shared, its checkpoints left to
    /// this checkpointer); the database's own threshold at the pool's level (a writer alone,
    /// whose `COMMIT` syncs in the turn anyway: checkpoints as SQLite schedules them).
    pub(crate) fn pages_at(&self, level: u8) -> u32 {
        if level == NORMAL {
            BACKSTOP_PAGES
        } else {
            self.threshold
        }
    }

    /// A transaction that shared the fsync committed on the writer connection: starts a
    /// checkpoint when the commits since the last one wrote about a threshold's worth.
    pub(crate) fn committed(self: &Arc<Self>) {
        if self.closed.load(Ordering::Acquire) {
            return;
        }
        let commits = self.commits.fetch_add(1, Ordering::Relaxed) + 1;
        let sixteenths = commits.saturating_mul(self.per_commit.load(Ordering::Relaxed));
        if sixteenths < u64::from(self.threshold) * SIXTEENTHS
            || self.running.swap(true, Ordering::AcqRel)
        {
            return;
        }
        let commits = self.commits.swap(0, Ordering::Relaxed);
        // NOTE: the guard exists before the task: a task that never runs lets go of
        // `running` when it is dropped.
        let run = Running(Arc::clone(self));
        D::spawn(run.checkpoint(commits));
    }

    /// The pool closes: no checkpoint starts from now on, the one running (if any) ends, and
    /// the checkpointer's connection is closed, so that none of the pool's connections is left
    /// open on the file (the last one to close checkpoints the WAL and removes it).
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        loop {
            let ended = self.idle.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.running.load(Ordering::Acquire) {
                break;
            }
            ended.await;
        }
        let conn = self.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(conn) = conn {
            D::close(conn).await;
        }
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
            let per_commit = appended.saturating_mul(SIXTEENTHS) / commits;
            self.per_commit.store(per_commit.max(1), Ordering::Relaxed);
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
        let idle = this.conn.lock().unwrap_or_else(|e| e.into_inner()).take();
        let mut conn = match idle {
            Some(conn) => conn,
            None => match D::checkpointer(&this.pool).await {
                Ok(conn) => conn,
                Err(error) => return self.failed(&error),
            },
        };
        // 1. Off the turn: the bulk of the WAL, while writers go on.
        let sequence = this.syncs.wal_sequence();
        let (_, frames, done) = match D::checkpoint(&mut conn, false).await {
            Ok(counts) => counts,
            Err(error) => return self.failed(&error),
        };
        this.measure(frames, sequence, commits);
        // 2. In the turn: caught up and restarted. Even when the first step caught up: a
        // writer in its transaction meanwhile appends after it. (The checkpointer's turn is
        // no writer's: not counted waiting, nor as a transaction.)
        let in_turn = true;
        let turn = this.syncs.queue().take_for_checkpoint().await;
        let taken = Instant::now();
        let restarted_now = D::checkpoint(&mut conn, true).await;
        drop(turn);
        let turn_us = u64::try_from(taken.elapsed().as_micros()).unwrap_or(u64::MAX);
        // The frames left in the WAL, and whether the step in the turn restarted it.
        let (left, restarted) = match restarted_now {
            Ok((completed, frames, _)) => (if completed { 0 } else { frames }, completed),
            Err(error) => return self.failed(&error),
        };
        *this.conn.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
        this.left(left, this.syncs.wal_sequence());
        tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
            db.namespace = %this.syncs.queue().database(),
            db.write.wal_frames = frames,
            db.write.checkpointed = done,
            db.write.in_turn = in_turn,
            db.write.restarted = restarted,
            db.write.turn_us = turn_us,
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
        self.0.idle.notify_waiters();
    }
}
