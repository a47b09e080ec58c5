//! The turn: one in-process FIFO queue per database, and the registry that makes every pool on
//! one database share it.
//!
//! One fact lives here and nowhere else: *which database* a queue serializes (its [`Key`]).
//! *Which request* holds a turn lives on the request (its `TurnsHeld`, in the request core):
//! the [`Turn`] names the request there when it is taken and un-names it before the turn goes
//! on, and keeps its queue alive meanwhile, so that the queue's address (its name there)
//! cannot be reused while anything names it.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;

use crate::attempt::RequestState;

use super::file_turn::FileTurn;
use super::stats::{TurnCounts, WriteStats};

/// The queues by key. Weak: a queue lives as long as a `WritePool` (or a turn) on its database
/// does; dead entries are swept when a new queue is made.
static QUEUES: LazyLock<Mutex<HashMap<Key, Weak<Queue>>>> = LazyLock::new(Default::default);

fn queues() -> std::sync::MutexGuard<'static, HashMap<Key, Weak<Queue>>> {
    QUEUES.lock().unwrap_or_else(|e| e.into_inner())
}

/// The database files this process refuses to write: a sync of the file's WAL failed, so
/// frames in it that committed at `NORMAL` may never reach the disk, and every later commit,
/// appended after them, would be lost with them on a power loss (recovery stops at the first
/// frame that is not on the disk). Kept by canonical path for the process's life, whatever
/// pools come and go (one fact per file); `ANY_REFUSED` lets a begin skip the lock while no
/// file is refused.
static REFUSED: LazyLock<Mutex<HashMap<PathBuf, Arc<str>>>> = LazyLock::new(Default::default);
static ANY_REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Which database a queue serializes.
#[derive(Clone, PartialEq, Eq, Hash)]
enum Key {
    /// A database file, by its canonical path: every pool (and `WriteQueue`) on the file in
    /// this process shares its queue.
    File(PathBuf),
    /// A database only one pool can reach (in memory, or a temporary one), by the address of
    /// a value that pool's clones share. The queue keeps that value alive (its `anchor`), so
    /// the address names no other pool while the queue lives.
    Private(usize),
}

/// The write queue of one database.
pub(crate) struct Queue {
    /// One permit: the turn. tokio's semaphore is FIFO (a released permit goes to the oldest
    /// waiter), and a waiter that gives up (dropped, or past its bound) leaves the line.
    turn: Semaphore,
    /// The file, for a file's queue.
    path: Option<PathBuf>,
    /// What the `Private` key is the address of.
    _anchor: Option<Arc<dyn Any + Send + Sync>>,
    /// How many wait, how long the turn is held: what the queue says of itself.
    counts: TurnCounts,
    /// The file's turn between processes (`file_turn.rs`), for a file's queue where there is
    /// one: taken by each writer once it has this queue's turn, kept for the next while this
    /// process's writers keep coming and no other process waits.
    file_turn: Option<FileTurn>,
}

impl Queue {
    /// The queue of the database file at `path` (canonicalized), shared with every other pool
    /// on that file in this process.
    pub(crate) fn of_file(path: &Path) -> Arc<Queue> {
        let path = canonical(path);
        Self::registered(Key::File(path.clone()), Some(path), None)
    }

    /// The queue of a database that only the pool `anchor` stands for can reach (an in-memory
    /// or temporary database): shared by whatever holds the same `anchor`, by nothing else.
    pub(crate) fn of_private(anchor: Arc<dyn Any + Send + Sync>) -> Arc<Queue> {
        let key = Key::Private(Arc::as_ptr(&anchor) as *const () as usize);
        Self::registered(key, None, Some(anchor))
    }

    fn registered(
        key: Key,
        path: Option<PathBuf>,
        anchor: Option<Arc<dyn Any + Send + Sync>>,
    ) -> Arc<Queue> {
        crate::attempt::register_writers_waiting(writers_waiting);
        let mut queues = queues();
        if let Some(queue) = queues.get(&key).and_then(Weak::upgrade) {
            return queue;
        }
        queues.retain(|_, q| q.strong_count() > 0);
        let database: Arc<str> = match path.as_deref().and_then(Path::file_name) {
            Some(name) => name.to_string_lossy().into(),
            None => "memory".into(),
        };
        let file_turn = path.as_deref().and_then(FileTurn::open);
        let queue = Arc::new(Queue {
            turn: Semaphore::new(1),
            path,
            _anchor: anchor,
            counts: TurnCounts::new(database),
            file_turn,
        });
        queues.insert(key, Arc::downgrade(&queue));
        queue
    }

    /// The file this queue serializes writers of (`None` for an in-memory database).
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// From now on, until the process ends, no write to this database's file is acknowledged:
    /// a sync of its WAL failed (`why`). The first reason stays. (An in-memory database has no
    /// WAL to fail: nothing to refuse.)
    pub(crate) fn refuse(&self, why: &Arc<str>) {
        if let Some(path) = &self.path {
            let mut refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
            refused
                .entry(path.clone())
                .or_insert_with(|| Arc::clone(why));
            ANY_REFUSED.store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Why writes to this database's file are refused, if they are ([`refuse`](Self::refuse)).
    pub(crate) fn refused(&self) -> Option<Arc<str>> {
        if !ANY_REFUSED.load(std::sync::atomic::Ordering::Acquire) {
            return None;
        }
        let path = self.path.as_ref()?;
        let refused = REFUSED.lock().unwrap_or_else(|e| e.into_inner());
        refused.get(path).cloned()
    }

    /// What the queue counts.
    pub(crate) fn counts(&self) -> &TurnCounts {
        &self.counts
    }

    /// The `database` label of its metrics.
    pub(crate) fn database(&self) -> &Arc<str> {
        self.counts.database()
    }

    /// How many wait for the turn, how long it was held.
    pub(crate) fn stats(&self) -> WriteStats {
        self.counts.snapshot()
    }

    /// Whether nobody holds the turn (a `Turn` un-names its request before it gives the turn
    /// back).
    pub(crate) fn is_free(&self) -> bool {
        self.turn.available_permits() == 1
    }

    /// This queue's name in a request's [`TurnsHeld`](crate::attempt::TurnsHeld).
    fn id(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// Whether `request` holds the turn now: its own state says (the one place that does).
    pub(crate) fn is_held_by(&self, request: Option<&Arc<RequestState>>) -> bool {
        request.is_some_and(|r| r.turns().holds(self.id()))
    }

    /// Waits for the turn, in arrival order, until `until()` (asked only if the turn is not
    /// free at once). `None` when the bound passed first: the wait left the line. Holding it
    /// for `slow` or longer is reported (see `stats.rs`).
    pub(crate) async fn take(
        self: &Arc<Self>,
        request: Option<Arc<RequestState>>,
        slow: Option<Duration>,
        until: impl FnOnce() -> Option<Instant>,
    ) -> Option<Turn> {
        self.take_as(request, slow, until, Holder::Writer).await
    }

    /// The turn for the checkpointer, which is no writer: in line as any (FIFO, one holder),
    /// but neither counted waiting (so that no writer changes level for it, nor the read
    /// limit engages) nor counted a transaction, its time not in the writers' busy time.
    pub(crate) async fn take_for_checkpoint(self: &Arc<Self>) -> Turn {
        self.take_as(None, None, || None, Holder::Checkpoint)
            .await
            .expect("a wait without a bound ends with the turn")
    }

    /// The turn for the writer thread, at once if it is free: for a closure sent `since`
    /// (its wait, counted from then by its own [`Queued`] guard, is timed from then). Never
    /// named on the closure's request: the writer thread runs one closure at a time, so a
    /// request's second closure waits for its first, not for itself.
    #[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
    pub(crate) fn try_take_for_thread(
        self: &Arc<Self>,
        request: Option<Arc<RequestState>>,
        slow: Option<Duration>,
        since: std::time::Instant,
    ) -> Option<Turn> {
        let permit = self.turn.try_acquire().ok()?;
        // (Not at once: the permit goes back, and the writer thread waits for both.)
        if let Some(file_turn) = &self.file_turn
            && !file_turn.take_now()
        {
            return None;
        }
        Some(self.turn_of(permit, Holder::Thread { since }, None, request, slow))
    }

    /// [`try_take_for_thread`](Self::try_take_for_thread), waiting in line for the turn with
    /// no bound of its own: the writer thread bounds it (dropped, the wait leaves the line).
    #[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
    pub(crate) async fn take_for_thread(
        self: &Arc<Self>,
        request: Option<Arc<RequestState>>,
        slow: Option<Duration>,
        since: std::time::Instant,
    ) -> Turn {
        self.take_as(request, slow, || None, Holder::Thread { since })
            .await
            .expect("a wait without a bound ends with the turn")
    }

    /// A closure sent to a writer thread: counted waiting for this database's turn until the
    /// guard drops (the writer thread took the turn for it, or it left the queue).
    #[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
    pub(crate) fn queued(self: &Arc<Self>) -> Queued {
        self.counts.start_waiting();
        Queued {
            queue: Arc::clone(self),
        }
    }

    async fn take_as(
        self: &Arc<Self>,
        request: Option<Arc<RequestState>>,
        slow: Option<Duration>,
        until: impl FnOnce() -> Option<Instant>,
        holder: Holder,
    ) -> Option<Turn> {
        // The bound, asked once and only if a wait is needed.
        let mut until = Some(until);
        let mut bound = None;
        let mut bound_of = || *bound.get_or_insert_with(|| until.take().and_then(|f| f()));
        // A writer is counted waiting until it holds both turns, this process's and the file's.
        let mut waiting = None;
        let (permit, waited_from) = match self.turn.try_acquire() {
            Ok(permit) => (permit, None),
            Err(TryAcquireError::NoPermits) => {
                let started = std::time::Instant::now();
                waiting = matches!(holder, Holder::Writer).then(|| self.counts.waiting_for_turn());
                let acquire = self.turn.acquire();
                let acquired = match bound_of() {
                    Some(until) => tokio::time::timeout_at(until, acquire).await.ok()?,
                    None => acquire.await,
                };
                let permit = acquired.expect("the turn's semaphore is never closed");
                (permit, Some(started))
            }
            Err(TryAcquireError::Closed) => unreachable!("the turn's semaphore is never closed"),
        };
        // A writer's turn is the file's too, between processes. NOTE: the permit is held
        // meanwhile, and goes back if the wait ends without the file's turn.
        if let (Some(file_turn), false) = (&self.file_turn, matches!(holder, Holder::Checkpoint))
            && !file_turn.take_now()
        {
            let waited_from = waited_from.unwrap_or_else(std::time::Instant::now);
            let waiting = waiting.or_else(|| {
                matches!(holder, Holder::Writer).then(|| self.counts.waiting_for_turn())
            });
            // Counted when it ends, granted or given up.
            let other = self.counts.waiting_for_other_process();
            let take = file_turn.take();
            match bound_of() {
                Some(until) => tokio::time::timeout_at(until, take).await.ok()?,
                None => take.await,
            }
            // Waiting no more before it holds the turn, as below.
            drop((other, waiting));
            return Some(self.turn_of(permit, holder, Some(waited_from), request, slow));
        }
        drop(waiting);
        Some(self.turn_of(permit, holder, waited_from, request, slow))
    }

    /// The `Turn` of a permit just taken (after a wait begun at `waited_from`, if it waited).
    /// NOTE: a plain function: no await between the permit and the `Turn`, which gives it back
    /// (once, in its `Drop`).
    fn turn_of(
        self: &Arc<Self>,
        permit: tokio::sync::SemaphorePermit<'_>,
        holder: Holder,
        waited_from: Option<std::time::Instant>,
        request: Option<Arc<RequestState>>,
        slow: Option<Duration>,
    ) -> Turn {
        permit.forget();
        let named = matches!(holder, Holder::Writer) && request.is_some();
        if let Some(request) = request.as_ref().filter(|_| named) {
            request.turns().name(self.id());
        }
        let waited = match holder {
            Holder::Thread { since } => since.elapsed(),
            _ => waited_from.map_or(Duration::ZERO, |from| from.elapsed()),
        };
        let writer = !matches!(holder, Holder::Checkpoint);
        let taken = match writer {
            true => self
                .counts
                .taken(request.as_deref().map(RequestState::route), waited),
            false => std::time::Instant::now(),
        };
        Turn {
            queue: Arc::clone(self),
            named,
            request,
            taken,
            waited,
            slow,
            writer,
        }
    }
}

/// Who takes a turn, and so how it is counted and whether it names its request.
#[derive(Clone, Copy)]
enum Holder {
    /// A writer (for a request, or none): counted waiting while it waits, and named on its
    /// request while it holds the turn.
    Writer,
    /// The writer thread, for a closure sent `since`: counted waiting by the closure's own
    /// [`Queued`] guard since then, its wait timed from then; never named on the closure's
    /// request (see [`Queue::try_take_for_thread`]).
    #[cfg_attr(
        not(any(feature = "rusqlite-write", feature = "diesel-write")),
        allow(dead_code, reason = "the writer thread's")
    )]
    Thread { since: std::time::Instant },
    /// The checkpointer: neither counted nor named.
    Checkpoint,
}

/// A closure on its way to a writer thread, counted waiting for its database's turn until
/// dropped ([`Queue::queued`]).
#[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
pub(crate) struct Queued {
    queue: Arc<Queue>,
}

#[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
impl Drop for Queued {
    fn drop(&mut self) {
        self.queue.counts.stop_waiting();
    }
}

/// Whether a writer waits for a write turn of any database in this process now: what the
/// layer's read limit asks before a read runs (through the request core, where the first
/// queue registers this function). One load of the process-wide count that each queue's
/// waiting guard keeps beside its own (`stats::writers_waiting_anywhere`), so that a read never
/// takes the registry's lock.
fn writers_waiting() -> bool {
    super::stats::writers_waiting_anywhere()
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("path", &self.path)
            .field("free", &self.is_free())
            .finish()
    }
}

/// The turn of one write transaction, and the request it belongs to: given back when dropped,
/// to the next in line.
pub(crate) struct Turn {
    queue: Arc<Queue>,
    /// The request the turn was taken for: named in its [`TurnsHeld`](crate::attempt::TurnsHeld)
    /// until it lets go ([`release_request`](Turn::release_request)).
    request: Option<Arc<RequestState>>,
    /// Whether the request is still named the holder.
    named: bool,
    taken: std::time::Instant,
    waited: Duration,
    /// Past which time held it is reported slow (`None`: never).
    slow: Option<Duration>,
    /// A writer's turn (counted, reported), or the checkpointer's (neither).
    writer: bool,
}

impl Turn {
    /// The request this turn was taken for.
    pub(crate) fn request(&self) -> Option<&Arc<RequestState>> {
        self.request.as_ref()
    }

    /// The queue this turn is of.
    pub(crate) fn queue(&self) -> &Arc<Queue> {
        &self.queue
    }

    /// The request lets go of the turn, which stays taken (a rollback still runs in it): the
    /// request may queue for the turn again, behind that rollback, instead of being told it
    /// already holds it.
    pub(crate) fn release_request(&mut self) {
        if let Some(request) = self.request.as_ref().filter(|_| self.named) {
            request.turns().unname(self.queue.id());
            self.named = false;
        }
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        // NOTE: the request is un-named before the turn goes to the next in line (so that the
        // queue is never free with a holder named), and the counts are settled before the permit goes to the
        // next in line (who sets them again); the metrics and the WARN come after.
        self.release_request();
        if !self.writer {
            self.queue.turn.add_permits(1);
            return;
        }
        let held = self.queue.counts.given_back(self.taken);
        // The file's turn, kept for the next writer of this process or let go, before this
        // queue's turn goes to it.
        if let Some(file_turn) = &self.queue.file_turn {
            file_turn.turn_given_back(self.queue.counts.has_waiting());
        }
        self.queue.turn.add_permits(1);
        let route = self.request.as_deref().map(RequestState::route);
        self.queue
            .counts
            .report(route, self.waited, held, self.slow);
    }
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn")
            .field("path", &self.queue.path)
            .field("in_request", &self.request.is_some())
            .finish()
    }
}

/// The key of a database file: its canonical path (symbolic links and `..` resolved), so that
/// two spellings of one file share a queue. A file not created yet: its directory's canonical
/// path and its name. Anything else: the path as it is.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(dir) = std::fs::canonicalize(parent) {
            return dir.join(name);
        }
    }
    path.to_owned()
}
