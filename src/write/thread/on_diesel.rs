//! `DieselWriteThread`: the writer thread for Diesel's `SqliteConnection`.

use std::path::Path;

use std::any::Any;
use std::time::Duration;

use diesel::RunQueryDsl;
use diesel::connection::{
    AnsiTransactionManager, Connection, SimpleConnection, TransactionManager,
    TransactionManagerStatus,
};
use diesel::result::{ConnectionError, DatabaseErrorKind, Error};
use diesel::sqlite::SqliteConnection;

use super::{Core, Errors, Owned, Ran, WriteThreadOptions};
use crate::recorder::WriteStage;
use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::stats::WriteStats;

/// The text SQLite gives every `SQLITE_IOERR*` (`sqlite3ErrStr`), which Diesel passes on as the
/// message of an `Unknown` database error: a `COMMIT` that met it may have failed to sync the
/// WAL.
const SQLITE_IOERR_MESSAGE: &str = "disk I/O error";

/// SQLite's text for a `COMMIT` with no transaction open: the closure ended it itself.
const NO_TRANSACTION_MESSAGE: &str = "cannot commit - no transaction is active";

/// SQLite's text for a `BEGIN` on a connection that has a transaction open.
const NESTED_BEGIN_MESSAGE: &str = "cannot start a transaction within a transaction";

/// The writer thread of one SQLite database file, for Diesel: [`WriteThread`]'s design (see
/// there) on a `diesel::SqliteConnection`. Each write transaction is a closure given the
/// connection inside a transaction begun `IMMEDIATE` through Diesel's transaction manager (so
/// `conn.transaction(..)` in it nests as a savepoint), run on the writer thread in the file's turn, with group commit, the fence
/// at commit, and the same deadline and cancellation rules.
///
/// Diesel keeps no SQLite codes: a `COMMIT` that met an I/O error, and one with no transaction
/// left (the closure ended it itself, with a raw `COMMIT` or `ROLLBACK`: its writes may have
/// committed, and the request is fenced), are told by SQLite's fixed texts.
///
/// [`WriteThread`]: crate::write#group-commit
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use diesel::connection::SimpleConnection;
/// use diesel::prelude::*;
/// use tower_sqlite_retry::write::DieselWriteThread;
///
/// # let dir = tempfile::tempdir()?;
/// let writes = DieselWriteThread::open(dir.path().join("app.db"))?;
/// writes
///     .transaction(|conn| conn.batch_execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT)"))
///     .await?;
/// let inserted = writes
///     .transaction(|conn| {
///         diesel::sql_query("INSERT INTO orders (item) VALUES ('book')").execute(conn)
///     })
///     .await?; // Ok once committed and durable
/// assert_eq!(inserted, 1);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct DieselWriteThread {
    core: Core<SqliteConnection>,
}

impl DieselWriteThread {
    /// Opens the database file at `path` (created if missing) in WAL mode at
    /// `synchronous = FULL`, with group commit, on a writer thread of its own.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, ConnectionError> {
        Self::open_with(path, WriteThreadOptions::default(), |_| Ok(()))
    }

    /// Opens the database file at `path` for writing: a connection in WAL mode, `setup` run on
    /// it (pragmas such as `foreign_keys`; not `journal_mode` or `synchronous`, which are the
    /// writer's), then moved to a thread of its own. A failed setup is
    /// `ConnectionError::CouldntSetupConfiguration`. No runtime is needed, here or on the writer
    /// thread.
    pub fn open_with(
        path: impl AsRef<Path>,
        options: WriteThreadOptions,
        setup: impl FnOnce(&mut SqliteConnection) -> Result<(), Error>,
    ) -> Result<Self, ConnectionError> {
        let path = path.as_ref().to_owned();
        let url = path.to_str().ok_or_else(|| {
            ConnectionError::InvalidConnectionUrl(format!(
                "the path is not UTF-8: {}",
                path.display()
            ))
        })?;
        let mut conn = SqliteConnection::establish(url)?;
        let configure = |conn: &mut SqliteConnection| -> Result<(), Error> {
            conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {}; PRAGMA journal_mode = WAL",
                options.busy_timeout.as_millis()
            ))?;
            setup(conn)?;
            // A read, so that SQLite opens (and makes) the WAL of a database in WAL mode.
            conn.batch_execute("SELECT count(*) FROM sqlite_master")
        };
        configure(&mut conn).map_err(ConnectionError::CouldntSetupConfiguration)?;
        // The file SQLite opened, as SQLite names it ("" in memory: no file, no WAL, nothing
        // to share): whatever the URL's spelling (a `file:` URI, a relative path), the turn
        // and a refusal are the file's, shared with every other writer on it. A file in WAL
        // mode has its WAL beside it now (a file system without shared memory refuses WAL
        // mode, and then it has none).
        let file: String = diesel::select(diesel::dsl::sql::<diesel::sql_types::Text>(
            "(SELECT file FROM pragma_database_list WHERE name = 'main')",
        ))
        .get_result(&mut conn)
        .map_err(ConnectionError::CouldntSetupConfiguration)?;
        let mut wal = std::ffi::OsString::from(&file);
        wal.push("-wal");
        let shared = options.shares_fsync(!file.is_empty() && Path::new(&wal).exists(), &file);
        conn.batch_execute(options.synchronous_pragma(shared))
            .map_err(ConnectionError::CouldntSetupConfiguration)?;
        let core = Core::start(conn, path, &file, shared, &options)
            .map_err(|why| ConnectionError::CouldntSetupConfiguration(database_error(why)))?;
        Ok(Self { core })
    }

    /// Runs `f` in a write transaction on the writer thread (as Diesel's
    /// `immediate_transaction`: `BEGIN IMMEDIATE`, then `COMMIT` if `f` returned `Ok`,
    /// `ROLLBACK` if it returned `Err`), in this database's turn. The value once committed
    /// and, with group commit, durable; otherwise the error: `f`'s or Diesel's, or the writer
    /// thread's as an `Unknown` database error:
    ///
    /// - the request's deadline passed before `f` began (waiting for the writer thread, the
    ///   turn, or another process's lock): `database is locked`, SQLite's `SQLITE_BUSY` text
    ///   (retryable: the layer replays while its deadline allows); `f` never ran;
    /// - the fsync of the WAL failed, or an earlier one did (the file is refused): a message
    ///   that says so, never retryable (committed, not known durable);
    /// - a savepoint of Diesel's transaction manager that `f` began and left open (the whole
    ///   transaction rolled back), `f` sent while the request holds this database's turn
    ///   through a `WriteTransaction` or a `WriteTurn`, `f` panicked, or the writer thread
    ///   gone.
    ///
    /// A `COMMIT` that went through fences the current request, and so does a transaction that
    /// was over before `f` returned its error (it may have committed). If the caller stops
    /// waiting before `f` began, `f` never runs and is dropped at once; once it began, it runs
    /// to its end. After it, whatever it left (the transaction open, Diesel's manager broken)
    /// is rolled back and reset before the next closure.
    pub async fn transaction<T, E, F>(&self, f: F) -> Result<T, E>
    where
        F: FnOnce(&mut SqliteConnection) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        // What Diesel's `Connection::transaction` does, begun `IMMEDIATE`, with each step's
        // failure told apart.
        let body = move |conn: &mut SqliteConnection| -> Ran<T, E> {
            if let Err(error) = begin_immediate(conn) {
                return Ran::Failed {
                    error: E::from(error),
                    stage: Some(WriteStage::Begin),
                    disk: false,
                };
            }
            let value = match f(conn) {
                Ok(value) => value,
                Err(error) => {
                    return match AnsiTransactionManager::rollback_transaction(conn) {
                        Ok(()) => Ran::Failed {
                            error,
                            stage: None,
                            disk: false,
                        },
                        // Nothing to roll back: over already (a raw `COMMIT` or `ROLLBACK`, or
                        // SQLite's own rollback), and what it wrote may have committed; or
                        // Diesel's manager broke. (The writer thread makes the connection
                        // clean next.)
                        Err(_) => Ran::EndedInside(error),
                    };
                }
            };
            // A level the closure began and left open (a savepoint of Diesel's manager): its
            // `COMMIT` would only release that savepoint, leaving the transaction open. Rolled
            // back, all of it, and told (as `WriteTransaction::commit` refuses a savepoint
            // left open), never reported committed.
            let depth = AnsiTransactionManager::transaction_manager_status_mut(conn)
                .transaction_depth()
                .ok()
                .flatten()
                .map(|depth| depth.get());
            if depth.is_some_and(|depth| depth > 1) {
                reset(conn);
                return Ran::Failed {
                    error: E::from(database_error(
                        "a savepoint begun in the closure was left open: the whole transaction \
                         was rolled back"
                            .to_owned(),
                    )),
                    stage: Some(WriteStage::Commit),
                    disk: false,
                };
            }
            match AnsiTransactionManager::commit_transaction(conn) {
                Ok(()) => Ran::Committed(value),
                Err(error) => {
                    let message = match &error {
                        Error::DatabaseError(_, info) => info.message().to_owned(),
                        _ => String::new(),
                    };
                    if message == NO_TRANSACTION_MESSAGE || matches!(error, Error::NotInTransaction)
                    {
                        // The closure ended the transaction itself: what it wrote may have
                        // committed.
                        return Ran::EndedInside(E::from(database_error(
                            "the transaction was ended inside the closure (a raw COMMIT or \
                             ROLLBACK): its writes may have committed outside the write path"
                                .to_owned(),
                        )));
                    }
                    // Diesel leaves a failed `COMMIT`'s transaction open: rolled back here.
                    let _ = AnsiTransactionManager::rollback_transaction(conn);
                    Ran::Failed {
                        error: E::from(error),
                        stage: Some(WriteStage::Commit),
                        disk: message == SQLITE_IOERR_MESSAGE,
                    }
                }
            }
        };
        self.core.transaction(body, errors::<E>()).await
    }

    /// The turn's counts now (this file's: every writer on it in this process).
    pub fn stats(&self) -> WriteStats {
        self.core.stats()
    }

    /// The database file this writer writes.
    pub fn path(&self) -> &Path {
        self.core.path()
    }

    /// Test seam (`crate::__private::hold_diesel_thread_fsync`).
    pub(crate) fn hold_fsync(&self, held: bool) -> bool {
        self.core.hold_fsync(held)
    }
}

impl std::fmt::Debug for DieselWriteThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DieselWriteThread")
            .field("path", &self.core.path())
            .finish_non_exhaustive()
    }
}

/// `BEGIN IMMEDIATE` through Diesel's transaction manager (so that `conn.transaction(..)` in the
/// closure nests as a savepoint). If SQLite has a transaction open that Diesel's manager does
/// not count (a raw `BEGIN` left by an earlier closure), it is rolled back and the `BEGIN`
/// tried once more.
fn begin_immediate(conn: &mut SqliteConnection) -> Result<(), Error> {
    match AnsiTransactionManager::begin_transaction_sql(conn, "BEGIN IMMEDIATE") {
        Err(Error::DatabaseError(_, info)) if info.message() == NESTED_BEGIN_MESSAGE => {
            tracing::warn!(
                "a transaction was open on the writer connection, unknown to Diesel's \
                 transaction manager (a raw BEGIN left by an earlier closure): rolled back"
            );
            reset(conn);
            AnsiTransactionManager::begin_transaction_sql(conn, "BEGIN IMMEDIATE")
        }
        begun => begun,
    }
}

/// Rolls back whatever SQLite has open (nothing: SQLite refuses, and that is ignored) and sets
/// Diesel's transaction manager back to no transaction, whatever it counted or whether it
/// broke (Diesel 2.2 leaves it broken for good after a `ROLLBACK` that failed, as one does
/// after SQLite rolled the transaction back itself).
fn reset(conn: &mut SqliteConnection) {
    let _ = conn.batch_execute("ROLLBACK");
    *AnsiTransactionManager::transaction_manager_status_mut(conn) =
        TransactionManagerStatus::default();
}

impl Owned for SqliteConnection {
    fn make_clean(&mut self) -> Result<bool, String> {
        let status = AnsiTransactionManager::transaction_manager_status_mut(self);
        if matches!(status.transaction_depth(), Ok(None)) {
            // (A transaction SQLite has open and Diesel does not count is found by the next
            // `BEGIN`: `begin_immediate`.)
            return Ok(false);
        }
        reset(self);
        match AnsiTransactionManager::transaction_manager_status_mut(self).transaction_depth() {
            Ok(None) => Ok(true),
            _ => Err("Diesel's transaction manager could not be reset".to_owned()),
        }
    }

    fn set_busy_timeout(&mut self, wait: Duration) -> bool {
        self.batch_execute(&format!("PRAGMA busy_timeout = {}", wait.as_millis()))
            .is_ok()
    }

    fn is_busy(error: &dyn Any) -> bool {
        match error.downcast_ref::<Error>() {
            Some(Error::DatabaseError(_, info)) => {
                info.message() == crate::classify::diesel::SQLITE_BUSY_MESSAGE
            }
            Some(_) => false,
            None => crate::classify::is_sqlite_busy(error),
        }
    }
}

/// An `Unknown` database error with `message`, as Diesel reports SQLite's.
fn database_error(message: String) -> Error {
    Error::DatabaseError(DatabaseErrorKind::Unknown, Box::new(message))
}

/// The writer thread's own errors, as Diesel's.
fn errors<E: From<Error>>() -> Errors<E> {
    Errors {
        // SQLite's own text for `SQLITE_BUSY`, which the Diesel classifier knows.
        timed_out: || {
            E::from(database_error(
                crate::classify::diesel::SQLITE_BUSY_MESSAGE.to_owned(),
            ))
        },
        not_durable: |failed: GroupCommitFailed| E::from(database_error(failed.to_string())),
        misuse: |why: &str| E::from(database_error(why.to_owned())),
    }
}
