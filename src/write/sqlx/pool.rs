//! The write path's pool, for any [`Driver`]: which database the pool writes to (asked of
//! SQLite on first use), its turn, and where write transactions take their connection.
//!
//! `WritePool` (sqlx 0.9) and the companion crate's (sqlx 0.8) are thin wrappers of
//! [`WritePool`] here: one implementation, so that the two cannot diverge.

use std::fmt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::OnceCell;

use super::checkpoint::Checkpoints;
use super::driver::Driver;
use super::gate::CommitGate;
use super::group::Syncs;
use crate::write::core::stats::{SLOW_DEFAULT, WriteStats};
use crate::write::core::turn::Queue;

/// Which connection a `WritePool`'s write transactions begin on.
///
/// Given to `WritePool::writer`; the default is [`Own`](Self::Own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum WriterConnection {
    /// A connection of the `WritePool`'s own, opened when first needed with the application
    /// pool's connect and pool options, kept outside any pool and handed from one writer to
    /// the next with no round trip (an in-memory database has none: it takes the pool's).
    #[default]
    Own,
    /// One from the application's pool, taken in the writer's turn, as readers take theirs.
    FromPool,
}

/// The write path over a pool of driver `D`. See the public `WritePool`s.
pub struct WritePool<D: Driver> {
    shared: Arc<Shared<D>>,
}

/// What every clone of one `WritePool`, and every transaction it began, shares.
pub(crate) struct Shared<D: Driver> {
    pub(crate) pool: D::Pool,
    /// Opens the writer connection (a pool of one with `pool`'s options and hooks); `None`:
    /// write transactions take their connection from `pool`.
    opener: Option<D::Pool>,
    /// Which database `pool` opens, and so which turn its writers take: asked of SQLite on the
    /// first write transaction.
    target: OnceCell<Target<D>>,
    /// A write transaction that holds the turn this long is reported (a WARN).
    pub(crate) slow: Option<Duration>,
    /// Whether group commit is on (it shares the fsync only where it can: `level_for`).
    pub(crate) group: bool,
}

/// The database a `WritePool` writes to, as SQLite named it.
pub(crate) struct Target<D: Driver> {
    pub(crate) queue: Arc<Queue>,
    /// The writer connection between two write transactions (`None` inside: before the first,
    /// while one runs, or after a failure closed it): `Some` when transactions run on a
    /// connection of the `WritePool`'s own. Only the turn's holder takes it, so its lock is
    /// never contended, and it is never held across an await.
    writer: Option<Mutex<Option<D::Connection>>>,
    /// Group commit's shared fsync: `Some` when the writer connection's commits may leave their
    /// fsync to it (group commit on, WAL, `synchronous` `FULL` or `EXTRA`: the writer
    /// connection then runs at `NORMAL` while other writers wait).
    pub(crate) syncs: Option<Arc<Syncs<D>>>,
    /// The write path's commit hook (`gate.rs`): on the writer connection, `Some` when the
    /// driver could set it; with the pool's connections, always (set for each transaction,
    /// where the driver has one).
    pub(crate) gate: Option<Arc<CommitGate>>,
    /// The background checkpointer (`checkpoint.rs`): `Some` when it took the writer
    /// connection's automatic checkpoints over (group commit sharing the fsync,
    /// `wal_autocheckpoint` on).
    pub(crate) checkpoints: Option<Arc<Checkpoints<D>>>,
}

impl<D: Driver> Clone for WritePool<D> {
    fn clone(&self) -> Self {
        Self {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<D: Driver> WritePool<D> {
    /// The write path over `pool`, with a writer connection of its own (`own`) or with
    /// connections from `pool`. Opens nothing.
    pub fn new(pool: D::Pool, own: bool) -> Self {
        Self::build(pool, own, Some(SLOW_DEFAULT), true)
    }

    fn build(pool: D::Pool, own: bool, slow: Option<Duration>, group: bool) -> Self {
        let opener = own.then(|| D::opener(&pool));
        Self {
            shared: Arc::new(Shared {
                pool,
                opener,
                target: OnceCell::new(),
                slow,
                group,
            }),
        }
    }

    fn rebuild(&self, own: bool, slow: Option<Duration>, group: bool) -> Self {
        Self::build(self.shared.pool.clone(), own, slow, group)
    }

    /// The same pool, writing on a connection of its own or on the pool's.
    pub fn writer(self, writer: WriterConnection) -> Self {
        let own = writer == WriterConnection::Own;
        self.rebuild(own, self.shared.slow, self.shared.group)
    }

    /// The same pool, reporting write transactions that hold the turn `slow` or longer
    /// (`None`: none); the public wrappers split it into `slow_transaction` and
    /// `no_slow_transaction_report`.
    pub fn slow_report(self, slow: Option<Duration>) -> Self {
        self.rebuild(self.shared.opener.is_some(), slow, self.shared.group)
    }

    /// The same pool, with group commit on or off.
    pub fn group_commit(self, on: bool) -> Self {
        self.rebuild(self.shared.opener.is_some(), self.shared.slow, on)
    }

    /// The turn's counts now, once the first write transaction asked SQLite which database
    /// the pool writes to (`None` before).
    pub fn stats(&self) -> Option<WriteStats> {
        Some(self.shared.target.get()?.queue.stats())
    }

    /// Test seam (`crate::__private::writer_connections_opened`): how many writer connections
    /// group commit saw opened (0 where it shares no fsync).
    pub fn writer_connections_opened(&self) -> u64 {
        self.shared
            .target
            .get()
            .and_then(|t| t.syncs.as_ref())
            .map_or(0, |syncs| syncs.attached())
    }

    /// Test seam (`crate::__private::hold_fsync`): while `held`, group commit starts no fsync
    /// (transactions commit, and wait for it). `false` if this pool shares no fsync (group
    /// commit off, not WAL, not `FULL`, or before its first write transaction).
    pub fn hold_fsync(&self, held: bool) -> bool {
        match self.shared.target.get().and_then(|t| t.syncs.as_ref()) {
            Some(syncs) => {
                syncs.hold(held);
                true
            }
            None => false,
        }
    }

    /// What every clone of this pool shares (a transaction begins from it).
    pub(crate) fn shared(&self) -> &Arc<Shared<D>> {
        &self.shared
    }

    /// The pool.
    pub fn pool(&self) -> &D::Pool {
        &self.shared.pool
    }

    /// The database file writers take the turn of, once the first write transaction asked
    /// SQLite; `None` before, and for an in-memory or temporary database.
    pub fn path(&self) -> Option<&Path> {
        self.shared.target.get()?.queue.path()
    }

    /// Closes the pool: first every commit that went through is answered (the shared fsync
    /// it waits for runs), and the checkpointer's connection closes; then the pool, then the
    /// writer connection.
    pub async fn close(&self) {
        if let Some(target) = self.shared.target.get() {
            if let Some(syncs) = &target.syncs {
                syncs.drained().await;
            }
            if let Some(checkpoints) = &target.checkpoints {
                checkpoints.close().await;
            }
        }
        D::close_pool(&self.shared.pool).await;
        if let Some(opener) = &self.shared.opener {
            D::close_pool(opener).await;
        }
        let idle = self.shared.target.get().and_then(|t| t.take_writer());
        if let Some(conn) = idle {
            D::close(conn).await;
        }
    }
}

impl<D: Driver> Shared<D> {
    /// The database this pool writes to, asked of SQLite once.
    pub(crate) async fn target(&self) -> Result<&Target<D>, D::Error> {
        self.target.get_or_try_init(|| self.resolve()).await
    }

    /// The database this pool writes to, if it was asked already.
    pub(crate) fn known_target(&self) -> Option<&Target<D>> {
        self.target.get()
    }

    /// Asks SQLite which database the pool opens. A file: its turn is the file's, and the
    /// writer connection (when the pool has one) is the one just asked. In memory or
    /// temporary: a second connection would open another, empty, database, so transactions
    /// take their connection from the pool, and the turn is this pool's alone.
    async fn resolve(&self) -> Result<Target<D>, D::Error> {
        let file = match &self.opener {
            Some(opener) => {
                let mut conn = D::detach(D::acquire(opener).await?);
                match D::main_file(&mut conn).await? {
                    Some(file) => {
                        let queue = Queue::of_file(&file);
                        let (wal, synchronous) = D::durability(&mut conn).await?;
                        // Group commit shares the fsync of a WAL at `FULL` or `EXTRA` (at a
                        // lower level, or with another journal, there is none to share).
                        let syncs = (self.group && wal && synchronous >= 2)
                            .then(|| Syncs::new(&file, Arc::clone(&queue), synchronous));
                        if let Some(syncs) = &syncs {
                            // The WAL's descriptor, opened with the writer connection (SQLite
                            // made the WAL for the read just above).
                            syncs.attach();
                        }
                        // Checkpoints off the turn where the fsync is shared (measured: a gain
                        // there, a loss where each `COMMIT` syncs in the turn; `checkpoint.rs`).
                        let checkpoints = match &syncs {
                            Some(syncs) => {
                                Checkpoints::take_over(&mut conn, opener, Arc::clone(syncs)).await?
                            }
                            None => None,
                        };
                        let gate = Arc::new(CommitGate::default());
                        let gate = D::guard_commits(&mut conn, Arc::clone(&gate))
                            .await?
                            .then_some(gate);
                        return Ok(Target {
                            queue,
                            writer: Some(Mutex::new(Some(conn))),
                            syncs,
                            gate,
                            checkpoints,
                        });
                    }
                    None => {
                        D::close(conn).await;
                        None
                    }
                }
            }
            None => D::main_file(&mut *D::acquire(&self.pool).await?).await?,
        };
        let queue = match file {
            Some(file) => Queue::of_file(&file),
            None => Queue::of_private(D::identity(&self.pool)),
        };
        Ok(Target {
            queue,
            writer: None,
            syncs: None,
            // Set on the pool's connection for each transaction, removed at its end.
            gate: Some(Arc::new(CommitGate::default())),
            checkpoints: None,
        })
    }

    /// The writer connection, if this pool has one and it is idle (the turn's holder asks).
    pub(crate) fn idle_writer(&self, target: &Target<D>) -> Option<Conn<D>> {
        target.take_writer().map(Conn::Own)
    }

    /// A connection for a write transaction, in its turn: the writer connection (opened if
    /// there is none), or one from the pool.
    pub(crate) async fn connection(&self, target: &Target<D>) -> Result<Conn<D>, D::Error> {
        let (Some(_), Some(opener)) = (&target.writer, &self.opener) else {
            return Ok(Conn::Pooled(D::acquire(&self.pool).await?));
        };
        if let Some(conn) = self.idle_writer(target) {
            return Ok(conn);
        }
        if D::is_closed(opener) {
            return Err(D::closed());
        }
        let mut conn = D::detach(D::acquire(opener).await?);
        if let Some(syncs) = &target.syncs {
            // A new writer connection, at the pool's `synchronous`, and the WAL's descriptor
            // opened with it (once it read the database: SQLite opens the WAL then).
            D::durability(&mut conn).await?;
            syncs.attach();
        }
        if let Some(gate) = &target.gate {
            D::guard_commits(&mut conn, Arc::clone(gate)).await?;
        }
        Ok(Conn::Own(conn))
    }

    /// The connection back where it came from if `clean` (no transaction left on it);
    /// closed otherwise (the next writer opens another).
    pub(crate) fn give_back(&self, conn: Conn<D>, clean: bool) {
        let clean = clean && D::depth(&conn) == 0;
        match conn {
            Conn::Pooled(conn) if clean => drop(conn),
            Conn::Pooled(conn) => drop(D::detach(conn)),
            Conn::Own(conn) => {
                let writer = self.target.get().and_then(|t| t.writer.as_ref());
                let open = self.opener.as_ref().is_some_and(|o| !D::is_closed(o));
                if let (true, true, Some(writer)) = (clean, open, writer) {
                    *lock(writer) = Some(conn);
                }
            }
        }
    }
}

impl<D: Driver> Target<D> {
    fn take_writer(&self) -> Option<D::Connection> {
        lock(self.writer.as_ref()?).take()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The connection a write transaction runs on.
pub(crate) enum Conn<D: Driver> {
    /// The pool's (`WriterConnection::FromPool`, or an in-memory database).
    Pooled(D::Pooled),
    /// The `WritePool`'s own, back to its `Target::writer`.
    Own(D::Connection),
}

impl<D: Driver> std::ops::Deref for Conn<D> {
    type Target = D::Connection;

    fn deref(&self) -> &D::Connection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Own(conn) => conn,
        }
    }
}

impl<D: Driver> std::ops::DerefMut for Conn<D> {
    fn deref_mut(&mut self) -> &mut D::Connection {
        match self {
            Conn::Pooled(conn) => conn,
            Conn::Own(conn) => conn,
        }
    }
}

impl<D: Driver> fmt::Debug for WritePool<D> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let target = self.shared.target.get();
        f.debug_struct("WritePool")
            .field("own_writer_connection", &self.shared.opener.is_some())
            .field("slow_transaction", &self.shared.slow)
            .field("group_commit", &self.shared.group)
            .field("queue", &target.map(|t| &t.queue))
            .finish_non_exhaustive()
    }
}
