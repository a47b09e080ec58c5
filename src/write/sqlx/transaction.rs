//! A write transaction's lifecycle, for any [`Driver`]: one owner of the connection and the
//! turn, one state enum whose transitions are the only place either changes, and one drop
//! protocol, sqlx's own.
//!
//! ```text
//!  begin: turn, then connection
//!        │
//!        ▼          BEGIN ok          commit(): COMMIT sent
//!   Beginning ──────────────► Open ───────────────────────► Committing
//!        │ BEGIN failed        │ rollback(), or COMMIT         │ COMMIT ok: fence
//!        │                     │ failed (then rolled back)     │
//!        ▼                     ▼                               ▼
//!       Done ◄─────────────── Done ◄──────────────────────────Done
//!
//!  dropped in Beginning, Open or Committing (a cancelled begin, an early return, a cancelled
//!  commit): Committing fences first (the COMMIT may have gone through); then the session is
//!  abandoned.
//! ```
//!
//! The connection, the turn and their home are one `Session`, which settles them by one
//! protocol (`session.rs`); dropped before its outcome is known, the transaction abandons it.
//! **Abandoning**, the drop protocol, is sqlx's `Transaction::drop` and its pool's release, in
//! that order, before anyone else gets the connection or the turn:
//!
//! 1. `start_rollback`, synchronously, in `Drop`: the rollback whose answer nobody reads. sqlx's
//!    worker skips exactly one such rollback after a `COMMIT` or `ROLLBACK` whose answer was
//!    not read (a cancelled `commit()`), and otherwise rolls back; its `BEGIN` whose answer was
//!    not read it rolled back by itself. Either way the connection's state is then known, and
//!    nothing is left armed on it. (An *acknowledged* rollback here would leave the skip armed
//!    for the next owner's savepoint: the bug this protocol replaces.)
//! 2. The request lets go of the turn (it may queue for it again, behind this rollback).
//! 3. In a spawned task: `ping` (answered once the rollback ran), then roll back whatever depth
//!    is left (a savepoint left open), then the connection goes back only at depth 0 (closed
//!    otherwise), and only then the turn goes to the next in line, who never meets this
//!    transaction's lock. Bounded by the pool's `acquire_timeout`: past it the connection is
//!    closed and the turn goes on. Without a runtime the connection is closed at once (its
//!    worker still runs the queued rollback first).
//!
//! `commit()` is `Ok` only when the `COMMIT` was, at depth 1, leaving the connection at depth
//! 0; a savepoint left open makes it an error (and a rollback), never a `RELEASE` reported as a
//! commit.

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use tokio::time::Instant;

#[allow(unused_imports)] // the model check's stand-in has `fence`/`deadline` as trait methods
use crate::attempt::{RequestState, current_request};
use crate::recorder::{self, WriteStage};

use super::driver::Driver;
use super::gate::{Closed, CommitGate};
use super::group::{NORMAL, Pending};
use super::pool::{Shared, WritePool};
use super::session::Session;
use crate::write::core::bound::{bound, within};
use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::turn::Queue;

// A write transaction begins from the pool: here, so that the pool knows nothing of the
// transaction built on it.
impl<D: Driver> WritePool<D> {
    /// Waits for the turn, then begins `IMMEDIATE` (see [`Transaction::begin`]).
    pub async fn begin(&self) -> Result<Transaction<D>, D::Error> {
        Transaction::begin(self.shared()).await
    }
}

/// A write transaction begun `IMMEDIATE` in its turn. See the public `WriteTransaction`s.
pub struct Transaction<D: Driver> {
    state: State<D>,
    /// Group commit: this transaction runs at `NORMAL`, its fsync shared (waited for after its
    /// `COMMIT`).
    shares_fsync: bool,
}

/// Where the transaction is: the one home of its session (its connection, its turn and the
/// request the turn names).
enum State<D: Driver> {
    /// `BEGIN IMMEDIATE` sent, or about to be.
    Beginning(Session<D>),
    /// Begun: what the handler holds.
    Open(Session<D>),
    /// `COMMIT` sent, its answer not read yet.
    Committing(Session<D>),
    /// Over: the session was settled (or abandoned).
    Done,
}

/// Why `commit()` failed when the commit hook refused a commit the write path did not send.
const ENDED_OUTSIDE: &str = "the write transaction was ended by a statement the write path did \
     not run (a raw COMMIT, ROLLBACK or RELEASE on it, or a trigger's RAISE(ROLLBACK)): nothing \
     of it was committed, and the statements run after that were refused and rolled back";

impl<D: Driver> Transaction<D> {
    /// Waits for the turn of `home`'s database, then begins `IMMEDIATE` on a connection.
    ///
    /// Bounded by the current request's deadline (every step: the first use's question to
    /// SQLite, the turn, the connection, the `BEGIN`) and, for the wait for the turn, by the
    /// pool's `acquire_timeout`: past either, [`Driver::timed_out`]. The current request
    /// already holding this database's turn with a transaction open: [`Driver::invalid`], at
    /// once (it would wait for itself).
    pub(crate) async fn begin(home: &Arc<Shared<D>>) -> Result<Self, D::Error> {
        // The step a failure is counted at: `turn` once the wait for it ended without it.
        let mut stage = WriteStage::Begin;
        let begun = Self::begin_at(home, &mut stage).await;
        if begun.is_err() {
            recorder::write_error(home.known_target().map(|t| t.queue.database()), stage);
        }
        begun
    }

    /// [`begin`](Self::begin), saying at which step it failed in `stage`.
    async fn begin_at(home: &Arc<Shared<D>>, stage: &mut WriteStage) -> Result<Self, D::Error> {
        // Read while the layer polls the handler (or an `in_request` task).
        let request = current_request();
        if D::is_closed(&home.pool) {
            return Err(D::closed());
        }
        let deadline = request.as_ref().and_then(|r| r.deadline());
        // NOTE: each step that may wait races the deadline; one that need not (known target,
        // an idle writer connection) arms no timer.
        let target = match home.known_target() {
            Some(target) => target,
            None => match within(deadline, home.target()).await {
                Some(target) => target?,
                None => return Err(D::timed_out()),
            },
        };
        if target.queue.is_held_by(request.as_ref()) {
            *stage = WriteStage::Turn;
            return Err(D::invalid(
                "this request already holds the database's write turn: commit or drop its write \
                 transaction before beginning another (or use a savepoint on it)"
                    .to_owned(),
            ));
        }
        Self::begin_in(home, target, request, deadline, stage).await
    }

    /// Waits for the turn, then begins `IMMEDIATE` on a connection.
    async fn begin_in(
        home: &Arc<Shared<D>>,
        target: &super::pool::Target<D>,
        request: Option<Arc<RequestState>>,
        deadline: Option<Instant>,
        stage: &mut WriteStage,
    ) -> Result<Self, D::Error> {
        let acquire_timeout = D::acquire_timeout(&home.pool);
        let turn = target
            .queue
            .take(request, home.slow, || bound(deadline, acquire_timeout))
            .await
            .ok_or_else(|| {
                *stage = WriteStage::Turn;
                D::timed_out()
            })?;

        // Only now a connection: waiting writers hold none. A failure gives the turn back.
        let conn = match home.idle_writer(target) {
            Some(conn) => conn,
            None => match within(deadline, home.connection(target)).await {
                Some(conn) => conn?,
                None => return Err(D::timed_out()),
            },
        };
        // NOTE: from here the transaction owns the session: dropped at any await below, it
        // abandons it by the one drop protocol.
        let mut tx = Transaction {
            state: State::Beginning(Session::new(conn, turn, Arc::clone(home))),
            shares_fsync: false,
        };
        let session = tx.session_mut();
        // NOTE: a rollback whose answer nobody reads, before `BEGIN`, as the one `abandon`
        // sends: a no-op on a clean connection, it clears whatever a leaked transaction (a
        // `mem::forget`) left on it, so that every transaction begins on a clean one.
        D::start_rollback(session.conn_mut());
        if let Some(gate) = session.gate() {
            gate.reset();
        }
        // A file whose WAL failed to sync is written no more (`Queue::refuse`): asked in the
        // turn, so that no transaction begins after a refusal it could have seen; after the
        // rollback above, so that the connection is handed on as clean as by any writer (the
        // transaction dropped here abandons its session by the one drop protocol).
        if let Some(why) = session.turn().queue().refused() {
            return Err(D::group_failed(GroupCommitFailed::refused(why.to_string())));
        }
        if let Some(syncs) = session.syncs().cloned() {
            // Group commit: `NORMAL` (the fsync shared) while others write, the pool's own
            // level for a writer alone.
            let (level, change) = syncs.level_for(session.turn());
            tx.shares_fsync = level == NORMAL;
            if let Some(level) = change {
                // NOTE: unknown until every statement below ran: a begin that fails, or is
                // cancelled between two of them, leaves the level unknown, and the next
                // transaction sets it all again.
                syncs.forget_level();
                // The writer connection's automatic checkpoint changes with the level: left
                // to the background checkpointer while the fsync is shared (`checkpoint.rs`).
                let pages = tx.session_mut().checkpoints().map(|c| c.pages_at(level));
                let conn = tx.session_mut().conn_mut();
                let set = within(deadline, async {
                    D::set_synchronous(conn, level).await?;
                    if let Some(pages) = pages {
                        D::set_autocheckpoint(conn, pages).await?;
                    }
                    Ok(())
                })
                .await;
                if matches!(set, Some(Ok(()))) {
                    syncs.known_level(level);
                }
                match set {
                    Some(Ok(())) => {}
                    Some(Err(error)) => {
                        tx.end(false);
                        return Err(error);
                    }
                    // The deadline: the transaction is dropped, and finished.
                    None => return Err(D::timed_out()),
                }
            }
        }
        match within(deadline, D::begin_immediate(tx.session_mut().conn_mut())).await {
            Some(Ok(())) => {
                tx.state = match std::mem::replace(&mut tx.state, State::Done) {
                    State::Beginning(session) => State::Open(session),
                    _ => unreachable!("begin owns the transaction"),
                };
                // One of the pool's connections has the gate for this transaction only: set
                // now, removed at its end by every way out (`Session::guard_again`), the
                // drop protocol's included, which a failure here takes.
                tx.session_mut().guard_pooled().await?;
                Ok(tx)
            }
            // A database error (another process's lock past `busy_timeout`) leaves the
            // connection as it was; any other failure closes it.
            Some(Err(error)) => {
                let reusable = D::is_database_error(&error);
                tx.end(reusable);
                Err(error)
            }
            // The deadline: the `BEGIN` is still waiting in SQLite's busy handler. The request
            // is answered now; the abandoned session waits for the `BEGIN` in the background,
            // and the turn goes on after it.
            None => Err(D::timed_out()),
        }
    }

    /// Commits. `Ok` only if the `COMMIT` was, leaving the connection at depth 0, and (with
    /// group commit sharing the fsync) once an fsync of the WAL that started after it
    /// completed: the request is fenced as soon as the `COMMIT` was, and the connection and the
    /// turn handed on. A failure rolls back, fences nothing, and hands them on too. A savepoint
    /// of this transaction left open (a nested transaction forgotten) is [`Driver::invalid`],
    /// after a rollback of everything.
    pub async fn commit(mut self) -> Result<(), D::Error> {
        let database = Arc::clone(self.session_mut().turn().queue().database());
        // The step a failure is counted at: `sync` once committed, `commit` before.
        let mut stage = WriteStage::Commit;
        let committed = self.commit_at(&mut stage).await;
        if committed.is_err() {
            recorder::write_error(Some(&database), stage);
        }
        committed
    }

    /// [`commit`](Self::commit), saying at which step it failed in `stage`.
    async fn commit_at(mut self, stage: &mut WriteStage) -> Result<(), D::Error> {
        let session = self.session_mut();
        let depth = D::depth(session.conn());
        if depth != 1 {
            let clean = session.roll_back_all().await;
            self.end(clean);
            return Err(D::invalid(if depth > 1 {
                format!(
                    "the write transaction was rolled back, not committed: {} savepoint(s) of \
                     it were still open (a nested transaction forgotten); commit or drop each \
                     before the transaction",
                    depth - 1
                )
            } else {
                "the write transaction was no longer open on its connection".to_owned()
            }));
        }
        self.state = match std::mem::replace(&mut self.state, State::Done) {
            State::Open(session) => State::Committing(session),
            _ => unreachable!("a transaction the handler holds is open"),
        };
        let shares_fsync = self.shares_fsync;
        let session = self.session_mut();
        let gate = session.gate().cloned();
        if let Some(gate) = &gate {
            gate.open();
        }
        let queue = Arc::clone(session.turn().queue());
        let committed = D::commit(session.conn_mut()).await;
        let closed = gate.as_ref().map(|gate| gate.close()).unwrap_or_default();
        if let Err(error) = &committed
            && D::is_io_error(error)
            && let Some(syncs) = session.syncs()
        {
            // The disk refused a write of the WAL (a sync in the `COMMIT`, the backstop
            // checkpoint's): what the shared fsync would make durable can no longer be told.
            syncs.stop("a COMMIT on the writer connection failed with an I/O error (SQLITE_IOERR)");
        }
        match committed {
            Ok(()) => {
                // The order that follows is the types': each step consumes the one before.
                let committed = Committed::now(session, shares_fsync, queue);
                let handed_on = committed.hand_on(&mut self, gate.as_ref(), closed).await?;
                handed_on.durable().await.map_err(|failed| {
                    *stage = WriteStage::Sync;
                    D::group_failed(failed)
                })
            }
            Err(error) => {
                // Nothing was committed: no fence. The transaction may still be open (a
                // `COMMIT` that met `SQLITE_BUSY`, a deferred foreign key).
                self.state = match std::mem::replace(&mut self.state, State::Done) {
                    State::Committing(session) => State::Open(session),
                    _ => unreachable!("commit owns the transaction"),
                };
                let session = self.session_mut();
                let clean =
                    session.roll_back_all().await && session.guard_again(gate.as_ref()).await;
                self.end(clean);
                if closed.refused {
                    return Err(D::invalid(ENDED_OUTSIDE.to_owned()));
                }
                Err(error)
            }
        }
    }

    /// Rolls back, and hands the connection and the turn on.
    pub async fn rollback(mut self) -> Result<(), D::Error> {
        let session = self.session_mut();
        let rolled_back = D::rollback(session.conn_mut()).await;
        if rolled_back.is_err() {
            let database = session.turn().queue().database();
            recorder::write_error(Some(database), WriteStage::Rollback);
        }
        let gate = session.gate().cloned();
        let clean = rolled_back.is_ok()
            && session.roll_back_all().await
            && session.guard_again(gate.as_ref()).await;
        self.end(clean);
        rolled_back
    }

    /// The session, while the transaction is live.
    fn session_mut(&mut self) -> &mut Session<D> {
        match &mut self.state {
            State::Beginning(session) | State::Open(session) | State::Committing(session) => {
                session
            }
            State::Done => unreachable!("the transaction is over"),
        }
    }

    /// Over, its outcome known: the session settles (the connection goes back if `reusable`
    /// and at depth 0, given up otherwise; then the turn goes on).
    fn end(&mut self, reusable: bool) {
        if let State::Beginning(session) | State::Open(session) | State::Committing(session) =
            std::mem::replace(&mut self.state, State::Done)
        {
            session.settle(reusable);
        }
    }
}

impl<D: Driver> Drop for Transaction<D> {
    fn drop(&mut self) {
        let session = match std::mem::replace(&mut self.state, State::Done) {
            State::Done => return,
            State::Beginning(session) | State::Open(session) => session,
            State::Committing(session) => {
                // The COMMIT may have gone through: never replay this request.
                if let Some(request) = session.turn().request() {
                    request.fence();
                }
                session
            }
        };
        session.abandon();
    }
}

/// A `COMMIT` SQLite answered `Ok`, at the one moment nothing else has happened since: what
/// must follow it, in its order, is this type's and the next one's, each step consuming the
/// one before, so that no edit that compiles can reorder them.
///
/// 1. [`now`](Self::now), a plain function (no `await` can come between the `COMMIT`'s answer
///    and it): the request is fenced, and the transaction takes its place among the shared
///    fsync's waiters, so that the fsync it waits for starts after its `COMMIT`; the
///    checkpointer counts the commit.
/// 2. [`hand_on`](Self::hand_on): the connection goes back (the gate set again first if the
///    handler replaced it, or taken off one of the pool's connections) and the turn to the
///    next writer, who is let run before this task goes on.
/// 3. [`HandedOn::durable`]: the shared fsync awaited, then the file's refusal asked (a sync
///    of its WAL that failed meanwhile, through any pool, may have left earlier frames off the
///    disk, and this transaction's follow them).
#[must_use = "a COMMIT answered Ok is acknowledged only once it was handed on and is durable"]
struct Committed<D: Driver> {
    fsync: Option<Pending<D>>,
    depth: usize,
    handed_on: bool,
    queue: Arc<Queue>,
}

impl<D: Driver> Committed<D> {
    /// Step 1, right after the `COMMIT`'s answer: fence, join the next fsync, count.
    fn now(session: &Session<D>, shares_fsync: bool, queue: Arc<Queue>) -> Self {
        if let Some(request) = session.turn().request() {
            request.fence();
        }
        let depth = D::depth(session.conn());
        let handed_on = session.turn().queue().counts().has_waiting();
        let top = shares_fsync && depth == 0;
        let fsync = session
            .syncs()
            .filter(|_| top)
            .map(|syncs| syncs.committed());
        if top && let Some(checkpoints) = session.checkpoints() {
            checkpoints.committed();
        }
        Self {
            fsync,
            depth,
            handed_on,
            queue,
        }
    }

    /// Step 2: the connection and the turn handed on; the next writer let run first.
    async fn hand_on(
        self,
        tx: &mut Transaction<D>,
        gate: Option<&Arc<CommitGate>>,
        closed: Closed,
    ) -> Result<HandedOn<D>, D::Error> {
        if closed.unasked || tx.session_mut().is_pooled() {
            // The handler replaced the commit hook: set again before anyone else commits on
            // this connection; or one of the pool's goes back with none (`gate.rs`).
            let clean = tx.session_mut().guard_again(gate).await;
            tx.end(clean);
        } else {
            tx.end(true);
        }
        if self.depth != 0 {
            return Err(D::invalid(format!(
                "COMMIT left the connection at depth {}: it was closed",
                self.depth
            )));
        }
        if self.handed_on {
            // The next writer was just woken: let it take the turn and send its `BEGIN`
            // before this task goes on with the handler.
            YieldOnce(false).await;
        }
        Ok(HandedOn {
            fsync: self.fsync,
            queue: self.queue,
        })
    }
}

/// A committed transaction whose connection and turn went on: only its durability is left.
#[must_use = "a COMMIT answered Ok is acknowledged only once it is durable"]
struct HandedOn<D: Driver> {
    fsync: Option<Pending<D>>,
    queue: Arc<Queue>,
}

impl<D: Driver> HandedOn<D> {
    /// Step 3: `Ok` once durable. Committed and fenced, so not bounded by the deadline, as a
    /// `COMMIT` is not.
    async fn durable(self) -> Result<(), GroupCommitFailed> {
        if let Some(pending) = self.fsync {
            pending.durable().await?;
        }
        // Asked after the fsync (the shared one, or the `COMMIT`'s own).
        match self.queue.refused() {
            Some(why) => Err(GroupCommitFailed::refused(why.to_string())),
            None => Ok(()),
        }
    }
}

/// Pending once, its task woken meanwhile: the task goes to the back of the runtime's run
/// queue, so the task just woken by this one (the next writer, handed the turn) runs first.
///
/// NOTE: not `tokio::task::yield_now`, which defers the wake-up until the worker next parks or
/// does its maintenance (up to dozens of tasks later). A task woken while it is polled is
/// requeued behind the others once its poll returns; the writer it woke sits in the worker's
/// next-task slot. Without this, the committed handler's own next step (its read after the
/// commit, its response) ran first, and each of those wakes a thread: on a busy machine the
/// next writer took the turn 135–162 µs after it was free, on average (`BENCHMARKS.md`).
struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    }
}

impl<D: Driver> std::ops::Deref for Transaction<D> {
    type Target = D::Connection;

    fn deref(&self) -> &D::Connection {
        match &self.state {
            State::Open(session) => session.conn(),
            _ => unreachable!("a transaction the handler holds is open"),
        }
    }
}

impl<D: Driver> std::ops::DerefMut for Transaction<D> {
    fn deref_mut(&mut self) -> &mut D::Connection {
        match &mut self.state {
            State::Open(session) => session.conn_mut(),
            _ => unreachable!("a transaction the handler holds is open"),
        }
    }
}

impl<D: Driver> fmt::Debug for Transaction<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (state, turn) = match &self.state {
            State::Beginning(session) => ("beginning", Some(session.turn())),
            State::Open(session) => ("open", Some(session.turn())),
            State::Committing(session) => ("committing", Some(session.turn())),
            State::Done => ("done", None),
        };
        f.debug_struct("WriteTransaction")
            .field("state", &state)
            .field("turn", &turn)
            .finish()
    }
}
