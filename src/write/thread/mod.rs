//! The writer thread: the write path for synchronous drivers (rusqlite: `on_rusqlite.rs`,
//! Diesel: `on_diesel.rs`), each write transaction a closure run on the database's writer
//! thread. This file is the part every driver shares: the channel, the turn, the fence, the
//! deadline and cancellation, group commit's fsync thread; a driver's part runs `BEGIN
//! IMMEDIATE`, the closure and `COMMIT` and says what came of it (`Ran`).
//!
//! ```text
//!  handler tasks                 writer thread (owns the connection)        fsync thread
//!  transaction(f1) ─┐            ┌─ f1: turn, BEGIN IMMEDIATE, f1, COMMIT ─┐
//!  transaction(f2) ─┼─ FIFO ───► ├─ f2: turn, BEGIN IMMEDIATE, f2, COMMIT ─┼─► fsync the WAL,
//!  transaction(f3) ─┘  channel   └─ f3: …                                  ┘   answer f1, f2
//! ```
//!
//! With sqlx, every statement of a transaction is a round trip between the handler's task and
//! the connection's worker thread, and the turn passes from one writer to the next through a
//! wake-up of the next handler's task: most of a turn is those hops, not SQLite's work
//! (BENCHMARKS.md). A synchronous driver has no such hops to make: the handler's transaction
//! body, a closure, goes to the thread that owns the database's writer connection, which runs
//! the closures one after the other, each in its own `BEGIN IMMEDIATE` … `COMMIT`, so that the
//! turn passes from one to the next on that thread with nothing in between.
//!
//! What stays as on the sqlx write path:
//! - **The turn** is the file's (`core/turn.rs`): the writer thread takes it for each closure, so
//!   sqlx `WritePool`s and `WriteQueue`s on the same file take turns with it, first come first
//!   served, and `WriteStats`, the slow-transaction report and the metrics count each closure
//!   as one transaction.
//! - **The fence**: a request whose `COMMIT` went through is never replayed.
//! - **Group commit** (WAL, `synchronous = FULL`, on by default): the writer connection runs at
//!   `NORMAL`, and a closure's result is handed back only once an fsync of the WAL that started
//!   after its `COMMIT` completed; the fsyncs run on a thread of their own, and every closure
//!   that committed while one ran shares the next. A closure that commits alone (no other
//!   closure sent, no fsync under way or waiting) has nothing to share it with: the writer
//!   thread syncs the WAL itself, as SQLite's `COMMIT` at `FULL` would, without the hand-off
//!   to the fsync thread and back. Each closure is its own SQLite transaction:
//!   all-or-nothing, and blind to another's failure. After a failed sync of the WAL the file is
//!   refused every write until the process restarts, as on the sqlx path (`write/mod.rs`, "Group
//!   commit").
//! - **Every wait ends by the caller's deadline.** A closure waits in the writer thread's
//!   inbox (`inbox.rs`), then for the turn, then for SQLite's lock (another process's write,
//!   in `BEGIN IMMEDIATE`). Its caller is answered at its deadline by a timer of its own,
//!   whatever the writer thread is doing: a closure still in the inbox then is taken out of it
//!   and never runs. Once the writer thread took it, each wait there is bounded by the same
//!   deadline: the turn's, and SQLite's busy handler (the writer connection's `busy_timeout` is
//!   lowered to what is left of the deadline for its `BEGIN`). A closure that began runs to its
//!   end (nothing cuts a transaction under way), and is counted whether or not anyone hears of
//!   it. Closures without a deadline keep `busy_timeout`'s wait.
//! - **Nothing wedges.** Whatever the last closure did (left its transaction open, ended it
//!   itself, had it rolled back by SQLite after `SQLITE_FULL` or a trigger's `RAISE(ROLLBACK)`,
//!   panicked), the connection is made clean before the turn goes on: rolled back, and the
//!   driver's own transaction state reset (`Owned::make_clean`), said at WARN and counted as a
//!   write error. A transaction that was over before the write path ended it may have
//!   committed (a raw `COMMIT`): its request is fenced.
//! - **Memory is bounded.** At most [`MAX_QUEUED`](inbox::MAX_QUEUED) closures wait in the
//!   inbox; past it a caller waits for room within its deadline, and past that it gets the
//!   turn's retryable error. A closure whose caller left is dropped at once, with what it
//!   captured.
//! - **Everything is seen.** A closure is counted waiting for the turn from the moment it is
//!   sent (`WriteStats::waiting`, the `write_waiting` gauge, the read limit, and its wait in
//!   `write_wait`); one that holds the turn past the slow threshold is reported while it runs,
//!   by its caller, and again when it ends.
//! - **A bound on commits waiting for one fsync** (`MAX_UNANSWERED`, 512, as on the sqlx
//!   path): while that many committed closures wait unanswered (those the fsync under way
//!   runs for and those queued for the next), the writer thread begins no other, before it
//!   takes the turn, until the fsync answers some. A disk that stalls so holds writers back
//!   instead of letting every closure commit (visible to readers) without an answer. (The
//!   sqlx path lets the next transaction commit at `FULL` in the turn instead, which on a
//!   stalled disk waits just the same; here the level would have to change per driver.)
//! - **Shutdown is truthful.** Once the last handle is dropped the writer thread runs what is
//!   in its inbox, the fsync thread answers every committed closure, and only then is the
//!   connection closed (closing SQLite's last connection deletes the WAL a pending fsync would
//!   sync).
//! - **No runtime is needed** on the writer thread: a closure that waits there for a turn held
//!   elsewhere in the process is polled on the thread itself (`block.rs`).
//!
//! A task that writes in a loop, one closure at a time, would pay two wake-ups of a sleeping
//! thread per transaction (the writer thread's, then the caller's worker's): `hand_off.rs`
//! replaces them with short waits that do not sleep, only while closures come back to back.
//!
//! The files: this one, the caller's side (`Core`: sending a closure, waiting for its answer
//! or its deadline); `writer.rs`, the writer thread's side (a closure from its turn to its
//! answer); `inbox.rs`, the queue between them; `fsync.rs`, group commit's fsync thread;
//! `hand_off.rs` and `block.rs`, the waits; `on_rusqlite.rs` and `on_diesel.rs`, the drivers.

use std::any::Any;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::attempt::current_request;
use crate::recorder::{self, WriteStage};

use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::stats::WriteStats;
use crate::write::core::turn::Queue;

mod block;
mod fsync;
mod hand_off;
mod inbox;
#[cfg(test)]
mod inbox_tests;
#[cfg(feature = "diesel-write")]
pub(crate) mod on_diesel;
#[cfg(feature = "rusqlite-write")]
pub(crate) mod on_rusqlite;
mod progress;
mod writer;

use fsync::Fsync;
use inbox::{Inbox, Refused, Ticket};
use progress::Progress;
use writer::{Sent, Writer};

/// What the inbox shares between the callers and the writer thread (the model check,
/// `tests/write_thread_model.rs`, swaps in shuttle's).
mod sync {
    pub(super) use std::sync::atomic::{AtomicUsize, Ordering};
    pub(super) use std::sync::{Condvar, Mutex, MutexGuard};
}

/// A closure on its way to the writer thread, typed away.
type Job<C> = Box<dyn FnOnce(&mut Writer<C>) + Send>;

/// A connection the writer thread owns: what the writer thread asks of its driver beside the
/// transaction itself (`Ran`).
pub(super) trait Owned: Send + 'static {
    /// Makes the connection clean if it is not: no transaction left open on it, as SQLite
    /// counts it and as the driver does (rolled back, the driver's own state reset). `Ok(true)`
    /// if something was left open; `Err`: it could not be made clean (the writer thread then
    /// ends, its callers told).
    fn make_clean(&mut self) -> Result<bool, String>;

    /// Sets how long SQLite's busy handler waits for another connection's lock (the
    /// connection's `busy_timeout`); `false` if it could not be set.
    fn set_busy_timeout(&mut self, wait: Duration) -> bool;

    /// Whether a closure's error is `SQLITE_BUSY` (as the driver's error, or as a `DbError`
    /// tagged with it): met by a closure, it is a lock the closure waited for through a
    /// connection of its own, while the writer connection (its own transaction) held it.
    fn is_busy(error: &dyn Any) -> bool;
}

/// What a closure's transaction came to on the writer thread: the driver's part of the work
/// (`BEGIN IMMEDIATE`, the closure, `COMMIT` or `ROLLBACK`) tells the writer's part (the turn,
/// the fence, the fsync, the answer).
pub(super) enum Ran<T, E> {
    /// Committed.
    Committed(T),
    /// Nothing committed: the closure's error (rolled back), or the transaction's, counted at
    /// `stage` (`None`: the closure's own); `disk` when the `COMMIT` met an I/O error (a sync
    /// of the WAL in it failed).
    Failed {
        error: E,
        stage: Option<WriteStage>,
        disk: bool,
    },
    /// The transaction was over before the write path ended it: the closure ended it (a raw
    /// `COMMIT` or `ROLLBACK`), or SQLite rolled it back itself (after `SQLITE_FULL`, an I/O
    /// error, a trigger's `RAISE(ROLLBACK)`). What the closure wrote may have committed (a raw
    /// `COMMIT`): the request is fenced. `error`: the closure's own if it failed, the writer's
    /// if it returned `Ok`.
    EndedInside(E),
}

/// The errors the writer thread gives, in the driver's type.
pub(super) struct Errors<E> {
    /// The turn not reached within the request's deadline (retryable).
    pub(super) timed_out: fn() -> E,
    /// Committed, not known durable; or refused (never retryable).
    pub(super) not_durable: fn(GroupCommitFailed) -> E,
    /// A misuse, or the writer thread gone.
    pub(super) misuse: fn(&str) -> E,
}

impl<E> Clone for Errors<E> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<E> Copy for Errors<E> {}

/// How the writer thread opens and runs its connection (`WriteThread::open_with`,
/// `DieselWriteThread::open_with`).
#[derive(Clone, Debug)]
pub struct WriteThreadOptions {
    pub(super) busy_timeout: Duration,
    pub(super) group_commit: bool,
    pub(super) full: bool,
    pub(super) slow: Option<Duration>,
}

impl Default for WriteThreadOptions {
    fn default() -> Self {
        Self {
            busy_timeout: Duration::from_secs(5),
            group_commit: true,
            full: true,
            slow: Some(crate::write::core::stats::SLOW_DEFAULT),
        }
    }
}

impl WriteThreadOptions {
    /// SQLite's `busy_timeout` on the writer connection (5 s by default): how long a `BEGIN
    /// IMMEDIATE` waits for another process's write lock.
    pub fn busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Group commit (on by default): closures that commit while an fsync of the WAL runs share
    /// the next one; each closure's result is handed back once an fsync that started after its
    /// `COMMIT` completed. Off: every `COMMIT` syncs on its own, in the turn.
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// `synchronous = NORMAL` instead of `FULL` (the default, SQLite's): no commit waits for
    /// an fsync, and a power loss may take the last commits (a crash takes none). Nothing is
    /// shared then: group commit changes nothing.
    pub fn synchronous_normal(mut self) -> Self {
        self.full = false;
        self
    }

    /// A transaction that holds the turn this long or longer is reported (a WARN and a
    /// counter; 250 ms by default), as `WritePool::slow_transaction`.
    pub fn slow_transaction(mut self, slow: Duration) -> Self {
        self.slow = Some(slow);
        self
    }

    /// Whether the fsync is shared, for a connection in `wal` mode on `file` ("" in memory).
    pub(super) fn shares_fsync(&self, wal: bool, file: &str) -> bool {
        self.group_commit && self.full && wal && !file.is_empty()
    }

    /// The `PRAGMA` the writer connection runs at, given whether the fsync is shared.
    pub(super) fn synchronous_pragma(&self, shared: bool) -> &'static str {
        if self.full && !shared {
            "PRAGMA synchronous = FULL"
        } else {
            "PRAGMA synchronous = NORMAL"
        }
    }
}

/// One writer thread (and its fsync thread), whatever the driver: the inbox its closures go
/// through, the file's turn, and group commit's fsync. Cloning is cheap; once the last clone
/// is dropped the writer thread runs what its inbox holds, then ends.
pub(super) struct Core<C> {
    inner: Arc<Inner<C>>,
}

impl<C> Clone for Core<C> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

struct Inner<C> {
    inbox: Arc<Inbox<Job<C>>>,
    /// How quickly closures sent alone are answered (`hand_off.rs`).
    pace: hand_off::Pace,
    queue: Arc<Queue>,
    path: PathBuf,
    slow: Option<Duration>,
    /// Group commit's fsync thread, for the test seam.
    fsync: Option<Arc<Fsync>>,
}

impl<C> Drop for Inner<C> {
    fn drop(&mut self) {
        // Every handle is gone: no closure comes any more.
        self.inbox.close();
    }
}

/// A closure in the inbox, from its caller's side: withdrawn if the caller leaves while it is
/// there (dropped, or at its deadline).
struct Pending<'a, J> {
    inbox: &'a Inbox<J>,
    progress: &'a Progress,
    database: &'a str,
    /// `None` once answered, or once the writer thread is known to have taken it.
    ticket: Option<Ticket>,
}

impl<J> Pending<'_, J> {
    /// Takes the closure out of the inbox: `true` if it was still there (it never runs).
    fn withdraw(&mut self) -> bool {
        self.ticket
            .take()
            .is_some_and(|ticket| self.inbox.withdraw(ticket))
    }
}

impl<J> Drop for Pending<'_, J> {
    fn drop(&mut self) {
        // NOTE: the caller left (its future dropped): a closure still in the inbox is dropped
        // now, with what it captured; one the writer thread took sees its caller gone (its
        // answer's receiver dropped) and does not begin, or runs to its end if it began. What
        // the writer thread noted of it before its answer was left unheard is said now.
        self.withdraw();
        self.progress.say(self.database);
    }
}

impl<C: Owned> Core<C> {
    /// Moves `conn` (set up, at the level `shared` asks for) to a writer thread of its own.
    /// `file`: the database file as SQLite names it ("" in memory); `shared`: group commit
    /// shares the WAL's fsync, on a second thread. `Err`: why not.
    pub(super) fn start(
        conn: C,
        path: PathBuf,
        file: &str,
        shared: bool,
        options: &WriteThreadOptions,
    ) -> Result<Self, String> {
        let queue = if file.is_empty() {
            Queue::of_private(Arc::new(()))
        } else {
            Queue::of_file(Path::new(file))
        };
        let fsync = if shared {
            let mut wal_path = std::ffi::OsString::from(file);
            wal_path.push("-wal");
            Some(Arc::new(Fsync::open(
                PathBuf::from(wal_path),
                Arc::clone(&queue),
            )?))
        } else {
            None
        };
        let inbox = Arc::new(Inbox::new());
        let no_thread = |e: std::io::Error| format!("no thread for the writer: {e}");
        let fsync_thread = match &fsync {
            Some(fsync) => Some(fsync.spawn().map_err(no_thread)?),
            None => None,
        };
        let writer = Writer::new(
            conn,
            Arc::clone(&inbox),
            Arc::clone(&queue),
            fsync.clone(),
            options,
        );
        std::thread::Builder::new()
            .name(format!("tsr-writer:{}", queue.database()))
            .spawn(move || writer.serve(fsync_thread))
            .map_err(no_thread)?;
        Ok(Self {
            inner: Arc::new(Inner {
                inbox,
                pace: hand_off::Pace::new(),
                queue,
                path,
                slow: options.slow,
                fsync,
            }),
        })
    }

    /// Runs `body` (the driver's transaction around the closure) on the writer thread, in the
    /// file's turn: its value once committed and, with group commit, durable.
    pub(super) async fn transaction<T, E>(
        &self,
        body: impl FnOnce(&mut C) -> Ran<T, E> + Send + 'static,
        errors: Errors<E>,
    ) -> Result<T, E>
    where
        T: Send + 'static,
        E: Send + 'static,
    {
        let inner = &*self.inner;
        let request = current_request();
        let failed = |stage| recorder::write_error(Some(inner.queue.database()), stage);
        // The request holds this file's turn through another write path (a `WriteTransaction`
        // or a `WriteTurn` open): the writer thread would wait for it, and the request for
        // the writer thread. (The writer thread's own turns name no request: a request's
        // second closure waits for its first, behind it in the inbox.)
        if inner.queue.is_held_by(request.as_ref()) {
            failed(WriteStage::Turn);
            return Err((errors.misuse)(
                "this request holds this database's write turn already (a write transaction \
                 or a WriteTurn open): the writer thread would wait for it, and the request \
                 for the writer thread",
            ));
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        let reported = request.clone();
        let (answer, answered) = oneshot::channel::<Result<T, E>>();
        let progress = Arc::new(Progress::default());
        let sent = std::time::Instant::now();
        let job: Job<C> = {
            let sent = Sent {
                request,
                deadline,
                since: sent,
                queued: inner.queue.queued(),
                progress: Arc::clone(&progress),
            };
            Box::new(move |writer: &mut Writer<C>| writer.run(sent, body, errors, answer))
        };
        let alone = inner.inbox.len() == 0;
        let ticket = match inner.inbox.push(job, deadline).await {
            Ok(ticket) => ticket,
            Err(Refused::Full) => {
                failed(WriteStage::Turn);
                return Err((errors.timed_out)());
            }
            Err(Refused::Closed) => return Err((errors.misuse)(GONE)),
        };
        let mut pending = Pending {
            inbox: &inner.inbox,
            progress: &progress,
            database: inner.queue.database(),
            ticket: Some(ticket),
        };
        let answer = hand_off::answer(answered, &inner.pace, sent, alone);
        let waited = self
            .wait(answer, &mut pending, deadline, sent, reported.as_deref())
            .await;
        // (What the writer thread noted of the closure is said as `pending` drops, here, in
        // the caller's context.)
        drop(pending);
        match waited {
            Waited::Answer(Some(result)) => result,
            Waited::Answer(None) => Err((errors.misuse)(GONE)),
            Waited::TimedOut => {
                failed(WriteStage::Turn);
                Err((errors.timed_out)())
            }
        }
    }

    /// The closure's answer; or, if its deadline passes while it is still in the inbox,
    /// `TimedOut` (taken out: it never runs). Past the deadline a closure the writer thread
    /// took is waited for: its waits there end by the same deadline, and once it began it
    /// runs to its end. Meanwhile, a closure that holds the turn past the slow threshold is
    /// reported. The timers need tokio's: without a runtime, the answer alone is awaited (the
    /// writer thread still refuses a closure it takes past its deadline).
    async fn wait<R>(
        &self,
        answer: impl Future<Output = Option<R>>,
        pending: &mut Pending<'_, Job<C>>,
        deadline: Option<Instant>,
        sent: std::time::Instant,
        request: Option<&crate::attempt::RequestState>,
    ) -> Waited<R> {
        let mut answer = pin!(answer);
        let timers = tokio::runtime::Handle::try_current().is_ok();
        let slow = self.inner.slow;
        // The earliest the closure can have held the turn `slow`: `slow` after it was sent.
        let mut check_slow = slow.map(|slow| Instant::from_std(sent) + slow);
        loop {
            let deadline_now = deadline.filter(|_| pending.ticket.is_some());
            let wake = match (deadline_now, check_slow) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(wake) = wake.filter(|_| timers) else {
                let answer = answer.await;
                pending.ticket = None;
                return Waited::Answer(answer);
            };
            let mut sleep = pin!(tokio::time::sleep_until(wake));
            let answered = std::future::poll_fn(|cx| {
                if let Poll::Ready(answer) = answer.as_mut().poll(cx) {
                    return Poll::Ready(Some(answer));
                }
                sleep.as_mut().poll(cx).map(|()| None)
            })
            .await;
            if let Some(answer) = answered {
                pending.ticket = None;
                return Waited::Answer(answer);
            }
            let now = Instant::now();
            if deadline_now.is_some_and(|d| now >= d) && pending.withdraw() {
                return Waited::TimedOut;
            }
            // (Past the deadline and not withdrawn: the writer thread took it; its answer
            // comes.)
            if let (Some(at), Some(slow)) = (check_slow, slow)
                && now >= at
            {
                check_slow = match pending.progress.held(sent) {
                    // Still waiting for the turn (counted waiting, not slow).
                    None => Some(now + slow),
                    Some(held) if held >= slow => {
                        self.inner.queue.counts().report_running(
                            request.map(crate::attempt::RequestState::route),
                            held,
                            slow,
                        );
                        None
                    }
                    Some(held) => Some(now + (slow - held)),
                };
            }
        }
    }

    /// The turn's counts now (this file's: every writer on it in this process).
    pub(super) fn stats(&self) -> WriteStats {
        self.inner.queue.stats()
    }

    /// The database file this writer writes.
    pub(super) fn path(&self) -> &Path {
        &self.inner.path
    }

    /// Test seam (`crate::__private::hold_thread_fsync`): while `held`, no fsync starts
    /// (closures commit, and wait for it). `false` if the fsync is not shared.
    pub(super) fn hold_fsync(&self, held: bool) -> bool {
        let Some(fsync) = &self.inner.fsync else {
            return false;
        };
        fsync.lock().held = held;
        fsync.wake.notify_one();
        true
    }
}

/// How a caller's wait ended.
enum Waited<R> {
    /// The writer thread's answer (`None`: it dropped the closure unanswered).
    Answer(Option<R>),
    /// The deadline passed while the closure was in the inbox: it never runs.
    TimedOut,
}

const GONE: &str = "the write transaction ended without an answer: the writer thread is gone \
     (its connection could not be made clean after a transaction, or it panicked)";
