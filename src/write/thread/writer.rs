//! The writer thread's side: the connection, and each closure from its turn to its answer.
//!
//! ```text
//!  take the next closure from the inbox (in order; none: the last handle is gone, end)
//!   │ caller gone ─────────────────────────────────────────────► never runs
//!   │ deadline passed, or no room among the commits waiting for their fsync by it ─► timed out
//!   ▼
//!  the turn: at once, or waited for until the deadline ────────► timed out
//!   │ (from here the closure is no longer counted waiting)
//!   │ caller gone / deadline passed / the file refused ────────► never runs / timed out / refused
//!   ▼
//!  SQLite's busy handler bounded by the deadline; the driver's BEGIN IMMEDIATE, the closure,
//!  COMMIT or ROLLBACK (`Ran`)
//!   ▼
//!  the connection made clean (whatever the closure left), then the turn goes on
//!   ▼
//!  the answer: at once, or once group commit's fsync made the COMMIT durable
//! ```

use std::any::Any;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::attempt::RequestState;
use crate::recorder::{self, WriteStage};

use super::block::block_until;
use super::fsync::Fsync;
use super::hand_off::Next;
use super::inbox::Inbox;
use super::progress::{Note, Progress};
use super::{Errors, Job, Owned, Ran, WriteThreadOptions};
use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::turn::{Queue, Queued};

/// What comes with a closure from its caller.
pub(super) struct Sent {
    pub(super) request: Option<Arc<RequestState>>,
    pub(super) deadline: Option<Instant>,
    /// When it was sent: its wait for the turn is timed from then.
    pub(super) since: std::time::Instant,
    /// Counts it waiting for the turn until it takes it (or never will).
    pub(super) queued: Queued,
    pub(super) progress: Arc<Progress>,
}

/// The writer thread's side: the connection, and what each closure needs.
pub(super) struct Writer<C> {
    conn: C,
    inbox: Arc<Inbox<Job<C>>>,
    queue: Arc<Queue>,
    /// Group commit's fsync thread, when the fsync is shared.
    fsync: Option<Arc<Fsync>>,
    slow: Option<Duration>,
    /// SQLite's `busy_timeout` as configured, and the one the connection has now (lowered for a
    /// closure whose deadline is nearer).
    busy_timeout: Duration,
    busy_now: Duration,
    /// The connection could not be made clean: nothing more runs on it.
    broken: bool,
}

impl<C: Owned> Writer<C> {
    pub(super) fn new(
        conn: C,
        inbox: Arc<Inbox<Job<C>>>,
        queue: Arc<Queue>,
        fsync: Option<Arc<Fsync>>,
        options: &WriteThreadOptions,
    ) -> Self {
        Self {
            conn,
            inbox,
            queue,
            fsync,
            slow: options.slow,
            busy_timeout: options.busy_timeout,
            busy_now: options.busy_timeout,
            broken: false,
        }
    }

    /// Runs the closures in the order they were sent, until every handle is gone; then the
    /// fsync thread answers what it holds, and the connection closes, in that order. A closure
    /// that panics fails its own transaction only (`run`), and the next closure runs.
    pub(super) fn serve(mut self, fsync_thread: Option<JoinHandle<()>>) {
        let mut next = Next::default();
        let mut took = Duration::ZERO;
        while !self.broken
            && let Some(job) = self.inbox.take(&mut next, took)
        {
            let began = std::time::Instant::now();
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&mut self)));
            took = began.elapsed();
            // (A closure's own panic is caught around it, in `run`: this is for the writer
            // thread's own code.)
            if ran.is_err() {
                let recovered = self.conn.make_clean();
                tracing::error!(
                    db.namespace = %self.queue.database(),
                    recovered = recovered.is_ok(),
                    "the writer thread panicked running a write transaction: its caller failed{}",
                    match &recovered {
                        Ok(_) => String::new(),
                        Err(why) => format!(
                            "; the connection could not be made clean ({why}), and the writer \
                             thread ends"
                        ),
                    }
                );
                self.broken |= recovered.is_err();
            }
        }
        // Nothing more runs: what is left in the inbox (the writer thread ends early) is
        // dropped, its callers told, and no closure comes in.
        self.inbox.abandon();
        if let (Some(fsync), Some(thread)) = (&self.fsync, fsync_thread) {
            fsync.finish(thread);
        }
        // (The connection closes as `self` drops, last.)
    }

    /// The turn for a closure sent `since`: at once when it is free; otherwise waited for
    /// (first come, first served) on this thread until `deadline`. `None`: not reached.
    fn turn(
        &self,
        request: &Option<Arc<RequestState>>,
        deadline: Option<Instant>,
        since: std::time::Instant,
    ) -> Option<crate::write::core::turn::Turn> {
        if let Some(turn) = self
            .queue
            .try_take_for_thread(request.clone(), self.slow, since)
        {
            return Some(turn);
        }
        let waiting = self
            .queue
            .take_for_thread(request.clone(), self.slow, since);
        block_until(waiting, deadline)
    }

    /// SQLite's busy handler waits for another connection's lock (another process's write)
    /// until the earlier of `busy_timeout` and `deadline`.
    fn bound_busy_wait(&mut self, deadline: Option<Instant>) {
        let wait = match deadline {
            None => self.busy_timeout,
            Some(deadline) => deadline
                .saturating_duration_since(Instant::now())
                .min(self.busy_timeout),
        };
        // SQLite counts in milliseconds: rounded down, never past the deadline.
        let wait = Duration::from_millis(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX));
        if wait != self.busy_now && self.conn.set_busy_timeout(wait) {
            self.busy_now = wait;
        }
    }

    /// After a closure: the connection made clean if it is not (counted as a write error,
    /// and noted for its caller to say); if it cannot be, the writer thread ends.
    fn clean(&mut self, progress: &Progress) {
        match self.conn.make_clean() {
            Ok(false) => {}
            Ok(true) => {
                recorder::write_error(Some(self.queue.database()), WriteStage::Commit);
                progress.note(Note::LeftOpen);
            }
            Err(why) => {
                recorder::write_error(Some(self.queue.database()), WriteStage::Rollback);
                tracing::error!(
                    db.namespace = %self.queue.database(),
                    error.message = %why,
                    "the writer connection could not be made clean after a write \
                     transaction: the writer thread ends, and the closures waiting for it \
                     fail"
                );
                self.broken = true;
            }
        }
    }

    /// One closure, from its turn to its answer.
    pub(super) fn run<T, E>(
        &mut self,
        sent: Sent,
        body: impl FnOnce(&mut C) -> Ran<T, E>,
        errors: Errors<E>,
        answer: oneshot::Sender<Result<T, E>>,
    ) where
        T: Send + 'static,
        E: Send + 'static,
    {
        let Sent {
            request,
            deadline,
            since,
            queued,
            progress,
        } = sent;
        // Nobody waits any more: it never runs.
        if answer.is_closed() {
            return;
        }
        let database = Arc::clone(self.queue.database());
        let failed = |stage: WriteStage| recorder::write_error(Some(&database), stage);
        let timed_out = |answer: oneshot::Sender<Result<T, E>>| {
            failed(WriteStage::Turn);
            let _ = answer.send(Err((errors.timed_out)()));
        };
        let past = |d: Instant| Instant::now() >= d;
        if deadline.is_some_and(past) {
            return timed_out(answer);
        }
        // Too many committed closures wait for the fsync: none begins until it answers some.
        if let Some(fsync) = &self.fsync
            && !fsync.room_before(deadline)
        {
            return timed_out(answer);
        }
        let Some(turn) = self.turn(&request, deadline, since) else {
            return timed_out(answer);
        };
        // Waiting no more: it holds the turn.
        drop(queued);
        // The wait may have been long: a caller gone meanwhile, or a deadline passed, and it
        // does not begin.
        if answer.is_closed() {
            return;
        }
        if deadline.is_some_and(past) {
            drop(turn);
            return timed_out(answer);
        }
        if let Some(why) = self.queue.refused() {
            drop(turn);
            failed(WriteStage::Begin);
            let refused = GroupCommitFailed::refused(why.to_string());
            let _ = answer.send(Err((errors.not_durable)(refused)));
            return;
        }
        self.bound_busy_wait(deadline);
        progress.started(since);
        // NOTE: the turn is held across the whole transaction and until the connection is
        // clean again: the next writer (of this process, or another) never meets a lock this
        // closure left.
        let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&mut self.conn)));
        // After a panic too: whatever the unwinding left open (a transaction told not to roll
        // back) is rolled back before anyone hears of it.
        self.clean(&progress);
        let Ok(ran) = ran else {
            // As a panicking handler fails its own request: its transaction only.
            tracing::error!(
                db.namespace = %database,
                "a write transaction's closure panicked on the writer thread: its transaction \
                 was rolled back and its caller failed"
            );
            drop(turn);
            send(answer, Err((errors.misuse)(PANICKED)), &progress, &database);
            return;
        };
        let fence = || {
            if let Some(request) = &request {
                request.fence();
            }
        };
        match ran {
            Ran::Committed(value) => {
                fence();
                // The next closure may run: this one's commit is done, its turn over.
                drop(turn);
                let not_durable = errors.not_durable;
                let alone = self.inbox.len() == 0;
                match &self.fsync {
                    Some(fsync) => fsync.committed(
                        Box::new(move |durable| {
                            if durable.is_err() {
                                recorder::write_error(Some(&database), WriteStage::Sync);
                            }
                            let answered = durable.map(|()| value).map_err(not_durable);
                            send(answer, answered, &progress, &database);
                        }),
                        alone,
                    ),
                    None => {
                        let answered = match self.queue.refused() {
                            Some(why) => {
                                failed(WriteStage::Sync);
                                Err(not_durable(GroupCommitFailed::refused(why.to_string())))
                            }
                            None => Ok(value),
                        };
                        send(answer, answered, &progress, &database);
                    }
                }
            }
            Ran::Failed { error, stage, disk } => {
                if disk && let Some(fsync) = &self.fsync {
                    fsync.stop(
                        "a COMMIT on the writer connection failed with an I/O error (SQLITE_IOERR)",
                    );
                }
                if stage.is_none() && C::is_busy(&error as &dyn Any) {
                    // The closure's own lock, met through another connection: a replay would
                    // wait for it again (as the classifiers say of a request holding a turn).
                    fence();
                    progress.note(Note::OwnLock);
                }
                drop(turn);
                if let Some(stage) = stage {
                    failed(stage);
                }
                send(answer, Err(error), &progress, &database);
            }
            Ran::EndedInside(error) => {
                fence();
                drop(turn);
                failed(WriteStage::Commit);
                progress.note(Note::EndedInside);
                send(answer, Err(error), &progress, &database);
            }
        }
    }
}

/// What the caller of a closure that panicked is told.
const PANICKED: &str = "the write transaction's closure panicked on the writer thread: its \
     transaction was rolled back";

/// Sends a closure's answer; what the writer thread noted of it is said here if nobody is left
/// to hear it (the caller says it otherwise, `Progress`).
fn send<R>(answer: oneshot::Sender<R>, answered: R, progress: &Progress, database: &str) {
    if answer.send(answered).is_err() {
        progress.say(database);
    }
}
