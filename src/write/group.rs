//! Group commit: consecutive write transactions of one `WritePool` share one SQLite
//! transaction on its writer connection, each in a `SAVEPOINT` of its own, and one `COMMIT`.
//!
//! ```text
//!  begin: the pool's line                 commit: RELEASE (a joiner), then
//!   │  free: open a group  ─► BEGIN IMMEDIATE ─┐      ├─ a member waits in the line, within the
//!   │  busy: wait in line ─► handed the group ─┤      │  bounds, nobody else waits for the turn:
//!   │                        SAVEPOINT ◄───────┘      │  hand the group on, wait for its outcome
//!   │                           │                     └─ otherwise: COMMIT, tell every member
//!   ▼                           ▼                        waiting, pass the line on
//! ```
//!
//! **The line.** A `WritePool`'s members queue in its line (`Line`), not for the database's
//! turn: one member at a time uses the writer connection. The first member of a group takes
//! the turn and begins `IMMEDIATE`, and runs at depth 1, with no savepoint: alone, it costs
//! what a write transaction without groups costs. A member handed an open group joins it with
//! a `SAVEPOINT`, so that its rollback, drop or error rolls back only its own work.
//!
//! **When a group commits.** A member that has committed (released its savepoint) hands the
//! group to the next member in line only if one waits, the group has fewer than `max_members`
//! and is younger than `max_held`, and no writer outside the pool waits for the database's turn.
//! Otherwise it runs the group's `COMMIT` and tells every member waiting for it: an idle
//! service commits every transaction alone, with no added latency, and a group never outlives
//! its bounds by more than the member that crosses them. A member's `commit()` is `Ok` only
//! after the group's `COMMIT` was, and only then fences its request.
//!
//! **Failures.** The `COMMIT` failing, or a savepoint found gone (SQLite rolled the whole
//! transaction back on its own: `SQLITE_FULL`, `IOERR`, `NOMEM`, some `BUSY`), fails every
//! member waiting: each gets [`GroupCommitFailed`] with the error's classification, and none of
//! their requests is fenced. The connection is then closed (its transaction state is no longer
//! what sqlx counts), and the next member opens a new group.
//!
//! **The drop protocol**, per state, so that no group is ever left without someone to finish
//! it: a member dropped while open rolls back to its savepoint (sqlx's `start_rollback`) and
//! the group goes on in a spawned task; one dropped while its `RELEASE` or the group's
//! `COMMIT` runs fences its request (it may be committed) and the task finishes the step; a
//! group handed to a member that is gone is finished (committed) by its own `Drop`, and so is
//! the line's baton.

use std::collections::VecDeque;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::driver::Driver;
use super::failed::GroupCommitFailed;
use super::pool::{Shared, Target};
use super::turn::Turn;
#[allow(unused_imports)] // the model check's stand-in has `fence`/`deadline` as trait methods
use crate::attempt::{RequestState, current_request};

/// Group commit's bounds: how many write transactions one group may hold, and for how long.
/// See [`WritePool::group_commit`](crate::write) (feature `sqlite-write`).
///
/// ```
/// use std::num::NonZeroUsize;
/// use std::time::Duration;
/// use tower_sqlite_retry::write::GroupCommit;
///
/// let bounds = GroupCommit::default()
///     .max_members(NonZeroUsize::new(32).unwrap())
///     .max_held(Duration::from_millis(5));
/// assert_eq!(bounds.get_max_members().get(), 32);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupCommit {
    max_members: NonZeroUsize,
    max_held: Duration,
}

impl Default for GroupCommit {
    /// 64 members, 10 ms.
    fn default() -> Self {
        Self {
            max_members: NonZeroUsize::new(64).expect("non-zero"),
            max_held: Duration::from_millis(10),
        }
    }
}

impl GroupCommit {
    /// At most this many write transactions in one group (1: every transaction alone).
    pub fn max_members(mut self, n: NonZeroUsize) -> Self {
        self.max_members = n;
        self
    }

    /// No member joins a group older than this: the group commits first. (A member already in
    /// it runs to its end, so a slow member is the bound's only overshoot.)
    pub fn max_held(mut self, held: Duration) -> Self {
        self.max_held = held;
        self
    }

    /// The bound on members.
    pub fn get_max_members(&self) -> NonZeroUsize {
        self.max_members
    }

    /// The bound on age.
    pub fn get_max_held(&self) -> Duration {
        self.max_held
    }
}

/// What a group's members waiting for its `COMMIT` are told.
#[derive(Clone)]
pub(super) enum Outcome {
    Committed,
    Failed(GroupCommitFailed),
}

/// A `WritePool`'s line: its members, one at a time on the writer connection.
pub(super) struct Line<D: Driver> {
    /// A member runs, or a group is being opened or committed: the next member waits.
    busy: bool,
    waiters: VecDeque<oneshot::Sender<Handoff<D>>>,
}

impl<D: Driver> Default for Line<D> {
    fn default() -> Self {
        Self {
            busy: false,
            waiters: VecDeque::new(),
        }
    }
}

/// What a member waiting in line is handed.
pub(super) enum Handoff<D: Driver> {
    /// The open group: join it.
    Group(OpenGroup<D>),
    /// No group: open the next one.
    Open(Baton<D>),
}

/// The line's turn to open a group. Dropped unused (its member gave up), it passes on.
pub(super) struct Baton<D: Driver> {
    home: Option<Arc<Shared<D>>>,
}

impl<D: Driver> Baton<D> {
    fn new(home: Arc<Shared<D>>) -> Self {
        Self { home: Some(home) }
    }

    /// Used: whoever holds it passes the line on itself.
    fn used(mut self) -> Arc<Shared<D>> {
        self.home.take().expect("a baton is used once")
    }
}

impl<D: Driver> Drop for Baton<D> {
    fn drop(&mut self) {
        if let Some(home) = self.home.take() {
            pass_line(&home);
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

fn line_of<D: Driver>(home: &Shared<D>) -> &Mutex<Line<D>> {
    &target_of(home).line
}

fn target_of<D: Driver>(home: &Shared<D>) -> &Target<D> {
    home.known_target()
        .expect("group commit runs once the database is known")
}

/// The line goes to the next member waiting (who opens a group), or is free.
fn pass_line<D: Driver>(home: &Arc<Shared<D>>) {
    let mut line = lock(line_of(home));
    while let Some(waiter) = line.waiters.pop_front() {
        match waiter.send(Handoff::Open(Baton::new(Arc::clone(home)))) {
            Ok(()) => return,
            // NOTE: the baton comes back unused; disarmed, so that its drop does not take the
            // line's lock again.
            Err(Handoff::Open(mut baton)) => drop(baton.home.take()),
            Err(Handoff::Group(_)) => unreachable!("a baton was sent"),
        }
    }
    line.busy = false;
}

/// A group between `BEGIN IMMEDIATE` and `COMMIT`: the writer connection in its transaction,
/// the database's turn, the members waiting for the outcome. Dropped unfinished, it finishes
/// itself (commits, in a spawned task): no member is ever left waiting.
pub(super) struct OpenGroup<D: Driver> {
    live: Option<Live<D>>,
}

struct Live<D: Driver> {
    conn: D::Connection,
    turn: Turn,
    home: Arc<Shared<D>>,
    waiting: Vec<oneshot::Sender<Outcome>>,
    members: usize,
    started: Instant,
}

impl<D: Driver> OpenGroup<D> {
    fn live(&mut self) -> &mut Live<D> {
        self.live.as_mut().expect("a group is live until finished")
    }

    pub(super) fn conn(&self) -> &D::Connection {
        &self.live.as_ref().expect("live").conn
    }

    pub(super) fn conn_mut(&mut self) -> &mut D::Connection {
        &mut self.live().conn
    }

    /// Whether another member may join, by the bounds and by who else waits.
    fn joinable(&self, bounds: &GroupCommit) -> bool {
        let live = self.live.as_ref().expect("live");
        live.members < bounds.max_members.get()
            && live.started.elapsed() < bounds.max_held
            && !live.turn.queue().counts().waiting_for_the_turn()
    }

    /// Commits the group and tells every member waiting; then the connection, the turn and
    /// the line go on. The group stays whole until the `COMMIT`'s answer: dropped half-way,
    /// its own `Drop` finishes it. Returns the caller's own result (the driver's error).
    async fn commit(&mut self) -> Result<(), D::Error> {
        let committed = D::commit(&mut self.live().conn).await;
        // NOTE: no await from here: the outcome is told, and the connection, the turn and the
        // line go on, whatever becomes of the caller.
        let live = self.live.take().expect("live");
        let at_zero = D::depth(&live.conn) == 0;
        let (outcome, result) = match committed {
            Ok(()) if at_zero => (Outcome::Committed, Ok(())),
            Ok(()) => {
                let failed = GroupCommitFailed::new(
                    None,
                    "COMMIT left the connection in a transaction".to_owned(),
                );
                (
                    Outcome::Failed(failed.clone()),
                    Err(D::group_failed(failed)),
                )
            }
            Err(error) => (
                Outcome::Failed(GroupCommitFailed::new(
                    D::classify(&error),
                    "the group's COMMIT failed".to_owned(),
                )),
                Err(error),
            ),
        };
        let committed = matches!(outcome, Outcome::Committed);
        let mut live = live;
        live.tell(&outcome);
        if committed {
            live.release(true);
        } else {
            live.release_after_rollback();
        }
        result
    }

    /// The group failed (a savepoint gone, a connection lost): every member waiting is told,
    /// the connection is closed.
    fn fail(mut self, failed: GroupCommitFailed) {
        if let Some(mut live) = self.live.take() {
            live.tell(&Outcome::Failed(failed));
            live.release(false);
        }
    }
}

impl<D: Driver> Live<D> {
    /// Tells every member waiting for the group's outcome.
    fn tell(&mut self, outcome: &Outcome) {
        for member in self.waiting.drain(..) {
            let _ = member.send(outcome.clone());
        }
    }

    /// The connection back (closed unless `clean`), the turn and the line on.
    fn release(self, clean: bool) {
        let Live {
            conn,
            turn,
            home,
            waiting,
            members,
            started,
        } = self;
        debug_assert!(waiting.is_empty(), "every member was told");
        drop(waiting);
        let queue = &target_of(&home).queue;
        queue.counts().members(members);
        crate::recorder::write_group(queue.database(), members, started.elapsed());
        home.give_back(super::pool::Conn::Own(conn), clean);
        drop(turn);
        pass_line(&home);
    }

    /// A failed `COMMIT` may leave the transaction open: rolled back in the background before
    /// the connection goes on.
    fn release_after_rollback(self) {
        if !D::can_spawn() {
            self.release(false);
            return;
        }
        D::spawn(async move {
            let mut live = self;
            let clean = rolled_back::<D>(&mut live.conn).await;
            live.release(clean);
        });
    }
}

/// Rolls the connection back to depth 0, if it can (acknowledged).
async fn rolled_back<D: Driver>(conn: &mut D::Connection) -> bool {
    for _ in 0..64 {
        if D::depth(conn) == 0 {
            return true;
        }
        if D::rollback(conn).await.is_err() {
            return false;
        }
    }
    false
}

impl<D: Driver> Drop for OpenGroup<D> {
    fn drop(&mut self) {
        let Some(live) = self.live.take() else {
            return;
        };
        let group = OpenGroup { live: Some(live) };
        if D::can_spawn() {
            D::spawn(group.settle());
        } else {
            group.fail(GroupCommitFailed::new(
                None,
                "the group was dropped outside a runtime".to_owned(),
            ));
        }
    }
}

impl<D: Driver> OpenGroup<D> {
    /// A group nobody holds any more (its member is gone, or the one handed it): once the
    /// connection has run what was queued on it, finished for the members waiting. At depth 0
    /// a `COMMIT` went through unanswered (a member's commit cancelled): told, and the skip
    /// sqlx's worker armed for it consumed; at depth 1 it is committed now; anything else is
    /// a failure.
    async fn settle(mut self) {
        let pinged = D::ping(self.conn_mut()).await.is_ok();
        match D::depth(self.conn()) {
            1 if pinged => {
                let _ = self.commit().await;
            }
            0 if pinged => {
                let conn = self.conn_mut();
                D::start_rollback(conn);
                let clean = D::ping(conn).await.is_ok();
                let mut live = self.live.take().expect("live");
                live.tell(&Outcome::Committed);
                live.release(clean);
            }
            _ => self.fail(GroupCommitFailed::new(
                None,
                "the group's transaction was not where it was left".to_owned(),
            )),
        }
    }
}

/// A write transaction that is a member of a group.
pub(super) struct Member<D: Driver> {
    state: MState<D>,
    request: Option<Arc<RequestState>>,
    bounds: GroupCommit,
    /// When it started waiting to write; then, once in the group, when it joined (with the
    /// time it waited): what its route's metrics and the slow-transaction WARN report.
    since: Instant,
    waited: Option<Duration>,
    slow: Option<Duration>,
}

enum MState<D: Driver> {
    /// `BEGIN IMMEDIATE` (`first`) or `SAVEPOINT` sent, or about to be.
    Beginning {
        group: OpenGroup<D>,
        first: bool,
    },
    /// Begun: what the handler holds. The first member runs at depth 1, a joiner at 2.
    Open {
        group: OpenGroup<D>,
        first: bool,
    },
    /// A joiner's `RELEASE` sent, its answer not read yet.
    Releasing {
        group: OpenGroup<D>,
    },
    /// A rollback of the member sent (to its savepoint, or the first member's whole
    /// transaction), its answer not read yet.
    RollingBack {
        group: OpenGroup<D>,
        first: bool,
    },
    /// The group's `COMMIT`, sent by this member, its answer not read yet.
    Committing {
        group: OpenGroup<D>,
    },
    /// Released into the group, which went on: waiting for its outcome.
    Waiting(oneshot::Receiver<Outcome>),
    Done,
}

impl<D: Driver> Member<D> {
    /// Begins a member: in line, then handed the group (a `SAVEPOINT`) or the line's baton
    /// (the database's turn, then `BEGIN IMMEDIATE`).
    pub(super) async fn begin(
        home: &Arc<Shared<D>>,
        bounds: GroupCommit,
        request: Option<Arc<RequestState>>,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Self, D::Error> {
        let since = Instant::now();
        let handoff = {
            let mut line = lock(line_of(home));
            if !line.busy {
                line.busy = true;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                line.waiters.push_back(tx);
                Some(rx)
            }
        };
        let baton = match handoff {
            None => Baton::new(Arc::clone(home)),
            Some(handed) => match Self::wait_in_line(home, deadline, handed).await {
                Some(Ok(Handoff::Group(mut group))) => {
                    group.live().turn.name(request.clone());
                    let mut member = Member {
                        state: MState::Beginning {
                            group,
                            first: false,
                        },
                        request,
                        bounds,
                        since,
                        waited: None,
                        slow: home.slow,
                    };
                    member.savepoint().await?;
                    return Ok(member);
                }
                Some(Ok(Handoff::Open(baton))) => baton,
                // The line went away (the runtime is shutting down).
                Some(Err(_)) => return Err(D::closed()),
                // NOTE: dropping the receiver gives up the place in line; whatever was handed
                // to it since is dropped with it and finishes itself (a group commits, a baton
                // passes the line on).
                None => return Err(D::timed_out()),
            },
        };
        Self::open(home, bounds, request, deadline, baton, since).await
    }

    /// Waits in line, counted as waiting to write (it is).
    async fn wait_in_line(
        home: &Arc<Shared<D>>,
        deadline: Option<tokio::time::Instant>,
        handed: oneshot::Receiver<Handoff<D>>,
    ) -> Option<Result<Handoff<D>, oneshot::error::RecvError>> {
        let _waiting = target_of(home).queue.counts().waiting();
        super::transaction::within(deadline, handed).await
    }

    /// The first member: the database's turn, the writer connection, `BEGIN IMMEDIATE`.
    async fn open(
        home: &Arc<Shared<D>>,
        bounds: GroupCommit,
        request: Option<Arc<RequestState>>,
        deadline: Option<tokio::time::Instant>,
        baton: Baton<D>,
        since: Instant,
    ) -> Result<Self, D::Error> {
        let target = target_of(home);
        let acquire_timeout = D::acquire_timeout(&home.pool);
        // A failure before `used()` drops the baton: the line goes on.
        let turn = target
            .queue
            .take_for_group(request.clone(), || {
                super::transaction::bound(deadline, acquire_timeout)
            })
            .await
            .ok_or_else(D::timed_out)?;
        let conn = match home.idle_writer(target) {
            Some(super::pool::Conn::Own(conn)) => conn,
            _ => match super::transaction::within(deadline, home.connection(target)).await {
                Some(Ok(super::pool::Conn::Own(conn))) => conn,
                Some(Ok(other)) => {
                    home.give_back(other, true);
                    return Err(D::invalid(
                        "group commit needs the pool's writer connection".to_owned(),
                    ));
                }
                Some(Err(error)) => return Err(error),
                None => return Err(D::timed_out()),
            },
        };
        let home = baton.used();
        let mut member = Member {
            since,
            waited: None,
            slow: home.slow,
            state: MState::Beginning {
                group: OpenGroup {
                    live: Some(Live {
                        conn,
                        turn,
                        home,
                        waiting: Vec::new(),
                        members: 1,
                        started: Instant::now(),
                    }),
                },
                first: true,
            },
            request,
            bounds,
        };
        let conn = member.conn_mut();
        // NOTE: as a write transaction alone does: the unanswered rollback before `BEGIN`
        // clears whatever a leaked transaction left on the connection.
        D::start_rollback(conn);
        match super::transaction::within(deadline, D::begin_immediate(conn)).await {
            Some(Ok(())) => {
                member.opened();
                Ok(member)
            }
            Some(Err(error)) => {
                let reusable = D::is_database_error(&error);
                let mut group = member.take_group();
                let live = group.live.take().expect("live");
                live.release(reusable);
                Err(error)
            }
            // The deadline: the member is dropped while `Beginning`, which finishes it.
            None => Err(D::timed_out()),
        }
    }

    /// A joiner's `SAVEPOINT`.
    async fn savepoint(&mut self) -> Result<(), D::Error> {
        let conn = self.conn_mut();
        let began = D::begin_savepoint(conn).await;
        if began.is_ok() && D::depth(conn) == 2 {
            self.opened();
            if let MState::Open { group, .. } = &mut self.state {
                group.live().members += 1;
            }
            return Ok(());
        }
        // The group is not where a group between members is.
        self.take_group().fail(GroupCommitFailed::new(
            None,
            "a member could not open its savepoint".to_owned(),
        ));
        Err(began.err().unwrap_or_else(|| {
            D::group_failed(GroupCommitFailed::new(
                None,
                "a member could not open its savepoint in the group".to_owned(),
            ))
        }))
    }

    fn opened(&mut self) {
        self.state = match std::mem::replace(&mut self.state, MState::Done) {
            MState::Beginning { group, first } => MState::Open { group, first },
            _ => unreachable!("a member begins once"),
        };
        let now = Instant::now();
        let waited = now.saturating_duration_since(self.since);
        self.since = now;
        self.waited = Some(waited);
        crate::recorder::write_wait(self.request.as_deref().map(RequestState::route), waited);
    }

    /// The member leaves the group (its work released, rolled back, or dropped): its time in
    /// it reported per route, as a write transaction alone reports its turn.
    fn left(&mut self, group: &OpenGroup<D>) {
        if let Some(waited) = self.waited.take()
            && let Some(live) = &group.live
        {
            let route = self.request.as_deref().map(RequestState::route);
            live.turn
                .queue()
                .counts()
                .report(route, waited, self.since.elapsed(), self.slow);
        }
    }

    fn conn_mut(&mut self) -> &mut D::Connection {
        match &mut self.state {
            MState::Beginning { group, .. }
            | MState::Open { group, .. }
            | MState::Releasing { group }
            | MState::RollingBack { group, .. }
            | MState::Committing { group } => group.conn_mut(),
            MState::Waiting(_) | MState::Done => unreachable!("the member holds the group"),
        }
    }

    pub(super) fn conn(&self) -> &D::Connection {
        match &self.state {
            MState::Open { group, .. } => group.conn(),
            _ => unreachable!("a transaction the handler holds is open"),
        }
    }

    pub(super) fn conn_open_mut(&mut self) -> &mut D::Connection {
        match &mut self.state {
            MState::Open { group, .. } => group.conn_mut(),
            _ => unreachable!("a transaction the handler holds is open"),
        }
    }

    /// The group out of the member's state (which is then `Done`); the member's request no
    /// longer named by the turn.
    fn take_group(&mut self) -> OpenGroup<D> {
        match std::mem::replace(&mut self.state, MState::Done) {
            MState::Beginning { mut group, .. }
            | MState::Open { mut group, .. }
            | MState::Releasing { mut group }
            | MState::RollingBack { mut group, .. }
            | MState::Committing { mut group } => {
                group.live().turn.release_request();
                self.left(&group);
                group
            }
            MState::Waiting(_) | MState::Done => unreachable!("the member holds the group"),
        }
    }

    /// Commits: a joiner releases its savepoint; then the group goes on to the next member in
    /// line (this one waits for its outcome), or this member commits it. `Ok` only once the
    /// group's `COMMIT` was: the request is fenced then.
    pub(super) async fn commit(mut self) -> Result<(), D::Error> {
        let MState::Open { first, .. } = self.state else {
            unreachable!("a transaction the handler holds is open");
        };
        let expected = if first { 1 } else { 2 };
        let depth = D::depth(self.conn_mut());
        if depth != expected {
            // A savepoint of this member left open: roll the member back, as `commit()`
            // without groups does.
            let rolled_back = self.roll_back_member().await;
            return Err(rolled_back.err().unwrap_or_else(|| {
                D::invalid(format!(
                    "the write transaction was rolled back, not committed: {} savepoint(s) of \
                     it were still open (a nested transaction forgotten)",
                    depth.saturating_sub(expected)
                ))
            }));
        }
        if !first {
            self.state = match std::mem::replace(&mut self.state, MState::Done) {
                MState::Open { group, .. } => MState::Releasing { group },
                _ => unreachable!("matched above"),
            };
            let conn = self.conn_mut();
            let released = D::commit(conn).await;
            if released.is_err() || D::depth(conn) != 1 {
                // The savepoint is gone: SQLite rolled the whole transaction back.
                self.take_group().fail(GroupCommitFailed::new(
                    None,
                    "the group's transaction was rolled back".to_owned(),
                ));
                return Err(released.err().unwrap_or_else(|| {
                    D::group_failed(GroupCommitFailed::new(
                        None,
                        "the group's transaction was rolled back".to_owned(),
                    ))
                }));
            }
        }
        // This member's work is in the group (at depth 1): on to the next member, or commit.
        let mut group = self.take_group();
        // NOTE: nobody in line now (the common case when idle): commit at once, with no channel.
        // A member that comes in line after this look waits for the line, which this commit
        // passes on.
        let someone_waits = group.joinable(&self.bounds) && {
            let home = &group.live.as_ref().expect("live").home;
            !lock(line_of(home)).waiters.is_empty()
        };
        if !someone_waits {
            return self.commit_group(group).await;
        }
        let (tx, mut rx) = oneshot::channel();
        group.live().waiting.push(tx);
        match hand_on(group, &self.bounds) {
            None => {
                self.state = MState::Waiting(rx);
                let deadline = self.request.as_ref().and_then(|r| r.deadline());
                let MState::Waiting(rx) = &mut self.state else {
                    unreachable!("set above")
                };
                match super::transaction::within(deadline, rx).await {
                    Some(told) => {
                        self.state = MState::Done;
                        self.told(told)
                    }
                    // The request's deadline: answered now, fenced (its work may yet be
                    // committed with the group), as a cancelled commit is.
                    None => Err(D::timed_out()),
                }
            }
            Some(mut group) => {
                // Nobody took it after all (the members in line gave up): this member commits.
                rx.close();
                group.live().waiting.retain(|tx| !tx.is_closed());
                self.commit_group(group).await
            }
        }
    }

    /// This member commits the group, for itself and every member waiting.
    async fn commit_group(mut self, mut group: OpenGroup<D>) -> Result<(), D::Error> {
        group.live().turn.name(self.request.clone());
        self.state = MState::Committing { group };
        let MState::Committing { group } = &mut self.state else {
            unreachable!("set above")
        };
        // NOTE: cancelled half-way, this member's `Drop` fences its request (the `COMMIT` may
        // go through) and the group's `Drop` finishes it.
        let committed = group.commit().await;
        self.state = MState::Done;
        if committed.is_ok()
            && let Some(request) = &self.request
        {
            request.fence();
        }
        committed
    }

    /// The member's outcome, once the group told it.
    fn told(&self, told: Result<Outcome, oneshot::error::RecvError>) -> Result<(), D::Error> {
        match told {
            Ok(Outcome::Committed) => {
                if let Some(request) = &self.request {
                    request.fence();
                }
                Ok(())
            }
            Ok(Outcome::Failed(failed)) => Err(D::group_failed(failed)),
            Err(_) => Err(D::group_failed(GroupCommitFailed::new(
                None,
                "the group ended without an outcome".to_owned(),
            ))),
        }
    }

    /// Rolls back: a joiner to its savepoint, and the group goes on; the first member the
    /// whole transaction (nobody else is in it yet).
    pub(super) async fn rollback(mut self) -> Result<(), D::Error> {
        self.roll_back_member().await
    }

    async fn roll_back_member(&mut self) -> Result<(), D::Error> {
        let MState::Open { first, .. } = self.state else {
            unreachable!("a transaction the handler holds is open");
        };
        let down_to = if first { 0 } else { 1 };
        self.state = match std::mem::replace(&mut self.state, MState::Done) {
            MState::Open { group, first } => MState::RollingBack { group, first },
            _ => unreachable!("matched above"),
        };
        let conn = self.conn_mut();
        let mut result = Ok(());
        while D::depth(conn) > down_to {
            if let Err(error) = D::rollback(conn).await {
                result = Err(error);
                break;
            }
        }
        let at = D::depth(conn);
        let mut group = self.take_group();
        if at != down_to || result.is_err() {
            group.fail(GroupCommitFailed::new(
                None,
                "a member could not roll back to its savepoint: the group's transaction was \
                 rolled back"
                    .to_owned(),
            ));
        } else if first {
            // Nobody else was in the group.
            group.live.take().expect("live").release(true);
        } else if let Some(mut group) = hand_on(group, &self.bounds) {
            let _ = group.commit().await;
        }
        result
    }
}

/// The group, between members, to the next member in line if the bounds allow; `Some` if
/// nobody took it (the caller commits it).
fn hand_on<D: Driver>(group: OpenGroup<D>, bounds: &GroupCommit) -> Option<OpenGroup<D>> {
    if !group.joinable(bounds) {
        return Some(group);
    }
    let home = Arc::clone(&group.live.as_ref().expect("live").home);
    let mut line = lock(line_of(&home));
    let mut group = group;
    while let Some(waiter) = line.waiters.pop_front() {
        match waiter.send(Handoff::Group(group)) {
            Ok(()) => return None,
            Err(Handoff::Group(back)) => group = back,
            Err(Handoff::Open(_)) => unreachable!("a group was sent"),
        }
    }
    Some(group)
}

/// What a member dropped in the middle leaves to do, in the background: the group goes on
/// once the connection has run what was queued (rolled back to the member's savepoint if it
/// is still open), or fails if it is not where it should be.
async fn go_on<D: Driver>(mut group: OpenGroup<D>, bounds: GroupCommit) {
    let conn = group.conn_mut();
    let pinged = D::ping(conn).await.is_ok();
    if pinged && D::depth(conn) == 2 && D::rollback(conn).await.is_err() {
        return group.fail(GroupCommitFailed::new(
            None,
            "a dropped member's savepoint could not be rolled back".to_owned(),
        ));
    }
    if pinged && D::depth(group.conn_mut()) == 1 {
        if let Some(mut group) = hand_on(group, &bounds) {
            let _ = group.commit().await;
        }
    } else {
        group.fail(GroupCommitFailed::new(
            None,
            "a dropped member left the group's transaction where it should not be".to_owned(),
        ));
    }
}

impl<D: Driver> Drop for Member<D> {
    fn drop(&mut self) {
        let fence = || {
            if let Some(request) = &self.request {
                request.fence();
            }
        };
        match std::mem::replace(&mut self.state, MState::Done) {
            MState::Done => {}
            // Released into the group: it may commit, so never replay this request.
            MState::Waiting(_) => fence(),
            // The first member, before anyone joined: it ends as a transaction alone does.
            // (Its rollback nobody waits for is sqlx's protocol for an open transaction, and for
            // a `ROLLBACK` whose answer was not read, which the worker then skips.)
            MState::Beginning { group, first: true }
            | MState::Open { group, first: true }
            | MState::RollingBack { group, first: true } => end_alone(group),
            // A joiner: its savepoint rolled back (a `SAVEPOINT` whose answer was not read the
            // worker rolls back itself), then the group goes on.
            MState::Beginning { mut group, .. } | MState::Open { mut group, .. } => {
                group.live().turn.release_request();
                self.left(&group);
                spawn_or_fail(group, self.bounds);
            }
            // sqlx's protocol for a rollback whose answer was not read: the rollback nobody
            // waits for, which the worker skips if that one went through (and otherwise runs).
            MState::RollingBack { mut group, .. } => {
                group.live().turn.release_request();
                self.left(&group);
                D::start_rollback(group.conn_mut());
                spawn_or_fail(group, self.bounds);
            }
            MState::Releasing { mut group } => {
                fence();
                group.live().turn.release_request();
                self.left(&group);
                // sqlx's protocol: the rollback nobody waits for, which the worker skips if the
                // RELEASE went through unanswered.
                D::start_rollback(group.conn_mut());
                spawn_or_fail(group, self.bounds);
            }
            // The group's COMMIT may go through; the group's own `Drop` finishes it.
            MState::Committing { group } => {
                fence();
                drop(group);
            }
        }
    }
}

/// The first member of a group, dropped before anyone joined: it ends as a transaction alone
/// does. The rollback nobody waits for now; in the background, once the connection ran it,
/// whatever is left rolled back, then the connection, the turn and the line go on.
fn end_alone<D: Driver>(mut group: OpenGroup<D>) {
    group.live().turn.release_request();
    D::start_rollback(group.conn_mut());
    let live = group.live.take().expect("live");
    if !D::can_spawn() {
        return live.release(false);
    }
    D::spawn(async move {
        let mut live = live;
        let clean = D::ping(&mut live.conn).await.is_ok() && rolled_back::<D>(&mut live.conn).await;
        live.release(clean);
    });
}

/// [`go_on`] in the background; without a runtime, the group fails.
fn spawn_or_fail<D: Driver>(group: OpenGroup<D>, bounds: GroupCommit) {
    if D::can_spawn() {
        D::spawn(go_on(group, bounds));
    } else {
        group.fail(GroupCommitFailed::new(
            None,
            "a member was dropped outside a runtime".to_owned(),
        ));
    }
}

impl<D: Driver> fmt::Debug for Member<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            MState::Beginning { .. } => "beginning",
            MState::Open { first: true, .. } => "open (first in its group)",
            MState::Open { .. } => "open (in a group)",
            MState::Releasing { .. } => "releasing",
            MState::RollingBack { .. } => "rolling back",
            MState::Committing { .. } => "committing",
            MState::Waiting(_) => "waiting for its group",
            MState::Done => "done",
        };
        f.debug_struct("WriteTransaction")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
