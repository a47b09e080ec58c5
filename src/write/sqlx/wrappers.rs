//! What the write path has of a sqlx version, written once for every version: the `Driver`
//! implementation (`__sqlx_driver!`) and the public `WritePool` / `WriteTransaction`
//! wrappers' delegations (`__write_wrappers!`), expanded in `write/sqlx.rs` (sqlx 0.9) and in
//! the companion crate `tower-sqlite-retry-sqlx08`, each against its own `sqlx_core` and
//! `sqlx_sqlite`. What differs between the two (how `BEGIN IMMEDIATE` is spelt, the commit
//! hook sqlx 0.8 lacks, the constructor, `begin`, `group_commit`, their documentation) stays
//! beside the expansion.

/// Expands `impl Driver for $driver` against the `sqlx_core` and `sqlx_sqlite` crates of the
/// crate that expands it (sqlx 0.9 here, 0.8 in the companion crate: their APIs agree on
/// everything used here but the `BEGIN` statement's type, given as `begin`). `$extra` are
/// further `Driver` methods one version has (sqlx 0.9's commit hook). Doc-hidden, as
/// [`__write_wrappers!`].
#[doc(hidden)]
#[macro_export]
macro_rules! __sqlx_driver {
    (
        driver: $driver:ident,
        begin: $begin:expr,
        extra: { $($extra:item)* } $(,)?
    ) => {
        impl $crate::__private::Driver for $driver {
            type Connection = ::sqlx_sqlite::SqliteConnection;
            type Pooled = ::sqlx_core::pool::PoolConnection<::sqlx_sqlite::Sqlite>;
            type Pool = ::sqlx_sqlite::SqlitePool;
            type Error = ::sqlx_core::Error;

            async fn acquire(
                pool: &::sqlx_sqlite::SqlitePool,
            ) -> ::std::result::Result<Self::Pooled, ::sqlx_core::Error> {
                pool.acquire().await
            }

            fn detach(conn: Self::Pooled) -> ::sqlx_sqlite::SqliteConnection {
                conn.detach()
            }

            fn is_closed(pool: &::sqlx_sqlite::SqlitePool) -> bool {
                pool.is_closed()
            }

            fn acquire_timeout(pool: &::sqlx_sqlite::SqlitePool) -> ::std::time::Duration {
                pool.options().get_acquire_timeout()
            }

            fn opener(pool: &::sqlx_sqlite::SqlitePool) -> ::sqlx_sqlite::SqlitePool {
                let options: ::sqlx_sqlite::SqliteConnectOptions =
                    (*pool.connect_options()).clone();
                let pool_options: ::sqlx_sqlite::SqlitePoolOptions = pool.options().clone();
                pool_options
                    .max_connections(1)
                    .min_connections(0)
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .test_before_acquire(false)
                    .connect_lazy_with(options)
            }

            async fn close_pool(pool: &::sqlx_sqlite::SqlitePool) {
                pool.close().await;
            }

            fn identity(
                pool: &::sqlx_sqlite::SqlitePool,
            ) -> ::std::sync::Arc<dyn ::std::any::Any + Send + Sync> {
                pool.connect_options()
            }

            async fn main_file(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> ::std::result::Result<::std::option::Option<::std::path::PathBuf>, ::sqlx_core::Error>
            {
                let file: String = ::sqlx_core::query_scalar::query_scalar(
                    "SELECT file FROM pragma_database_list WHERE name = 'main'",
                )
                .fetch_one(conn)
                .await?;
                Ok((!file.is_empty()).then(|| ::std::path::PathBuf::from(file)))
            }

            fn begin_immediate(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> impl ::std::future::Future<Output = ::std::result::Result<(), ::sqlx_core::Error>>
            + Send
            + '_ {
                <::sqlx_sqlite::SqliteTransactionManager as ::sqlx_core::transaction::TransactionManager>::begin(
                    conn,
                    Some($begin),
                )
            }

            async fn durability(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> ::std::result::Result<(bool, u8), ::sqlx_core::Error> {
                let (mode, level): (String, i64) =
                    ::sqlx_core::query_as::query_as($crate::__private::DURABILITY_SQL)
                        .fetch_one(conn)
                        .await?;
                Ok((
                    mode.eq_ignore_ascii_case("wal"),
                    u8::try_from(level).unwrap_or(u8::MAX),
                ))
            }

            async fn autocheckpoint(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> ::std::result::Result<::std::option::Option<u32>, ::sqlx_core::Error> {
                let pages: i64 =
                    ::sqlx_core::query_scalar::query_scalar($crate::__private::AUTOCHECKPOINT_SQL)
                        .fetch_one(conn)
                        .await?;
                Ok(u32::try_from(pages).ok())
            }

            async fn checkpointer(
                pool: &::sqlx_sqlite::SqlitePool,
            ) -> ::std::result::Result<::sqlx_sqlite::SqliteConnection, ::sqlx_core::Error> {
                let mut conn = Self::detach(Self::acquire(pool).await?);
                ::sqlx_core::query::query($crate::__private::CHECKPOINTER_BUSY_SQL)
                    .execute(&mut conn)
                    .await?;
                Ok(conn)
            }

            async fn checkpoint(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
                restart: bool,
            ) -> ::std::result::Result<(bool, u64, u64), ::sqlx_core::Error> {
                let sql = if restart {
                    $crate::__private::RESTART_SQL
                } else {
                    $crate::__private::CHECKPOINT_SQL
                };
                let (busy, log, done): (i64, i64, i64) =
                    ::sqlx_core::query_as::query_as(sql).fetch_one(conn).await?;
                Ok((
                    busy == 0,
                    u64::try_from(log).unwrap_or(0),
                    u64::try_from(done).unwrap_or(0),
                ))
            }

            async fn set_synchronous(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
                level: u8,
            ) -> ::std::result::Result<(), ::sqlx_core::Error> {
                ::sqlx_core::query::query($crate::__private::synchronous_pragma(level))
                    .execute(conn)
                    .await
                    .map(drop)
            }

            fn commit(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> impl ::std::future::Future<Output = ::std::result::Result<(), ::sqlx_core::Error>>
            + Send
            + '_ {
                <::sqlx_sqlite::SqliteTransactionManager as ::sqlx_core::transaction::TransactionManager>::commit(conn)
            }

            fn rollback(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> impl ::std::future::Future<Output = ::std::result::Result<(), ::sqlx_core::Error>>
            + Send
            + '_ {
                <::sqlx_sqlite::SqliteTransactionManager as ::sqlx_core::transaction::TransactionManager>::rollback(conn)
            }

            fn start_rollback(conn: &mut ::sqlx_sqlite::SqliteConnection) {
                <::sqlx_sqlite::SqliteTransactionManager as ::sqlx_core::transaction::TransactionManager>::start_rollback(conn);
            }

            fn depth(conn: &::sqlx_sqlite::SqliteConnection) -> usize {
                <::sqlx_sqlite::SqliteTransactionManager as ::sqlx_core::transaction::TransactionManager>::get_transaction_depth(conn)
            }

            fn ping(
                conn: &mut ::sqlx_sqlite::SqliteConnection,
            ) -> impl ::std::future::Future<Output = ::std::result::Result<(), ::sqlx_core::Error>>
            + Send
            + '_ {
                ::sqlx_core::connection::Connection::ping(conn)
            }

            async fn close(conn: ::sqlx_sqlite::SqliteConnection) {
                let _ = ::sqlx_core::connection::Connection::close(conn).await;
            }

            fn timed_out() -> ::sqlx_core::Error {
                ::sqlx_core::Error::PoolTimedOut
            }

            fn closed() -> ::sqlx_core::Error {
                ::sqlx_core::Error::PoolClosed
            }

            fn invalid(message: String) -> ::sqlx_core::Error {
                ::sqlx_core::Error::InvalidArgument(message)
            }

            fn is_database_error(error: &::sqlx_core::Error) -> bool {
                matches!(error, ::sqlx_core::Error::Database(_))
            }

            fn is_io_error(error: &::sqlx_core::Error) -> bool {
                // SQLite's extended result code: its low byte is the primary code, 10
                // `SQLITE_IOERR`.
                match error {
                    ::sqlx_core::Error::Database(error) => error
                        .code()
                        .and_then(|code| code.parse::<i32>().ok())
                        .is_some_and(|code| code & 0xff == 10),
                    _ => false,
                }
            }

            fn classify(error: &::sqlx_core::Error) -> ::std::option::Option<$crate::Retryable> {
                $crate::DriverError::retryable(error)
            }

            fn group_failed(failure: $crate::write::GroupCommitFailed) -> ::sqlx_core::Error {
                ::sqlx_core::Error::Io(::std::io::Error::other(failure))
            }

            $($extra)*
        }
    };
}

/// Expands, for a wrapper `$pool { inner: WritePool<$driver> }` of one sqlx version, the
/// transaction type `$tx { inner: Transaction<$driver> }` and `$pool::begin` (each with the
/// documentation given), and both types' delegating methods and trait impls. Doc-hidden:
/// for this crate and its sqlx 0.8 companion, which pins this crate's exact version.
#[doc(hidden)]
#[macro_export]
macro_rules! __write_wrappers {
    (
        driver: $driver:ident,
        pool: $pool:ident,
        $(#[$tx_meta:meta])*
        transaction: $tx:ident,
        $(#[$begin_meta:meta])*
        begin,
        sqlite_pool: $sqlite_pool:ty,
        connection: $connection:ty,
        error: $error:ty $(,)?
    ) => {
        $(#[$tx_meta])*
        pub struct $tx {
            inner: $crate::__private::Transaction<$driver>,
        }

        impl $pool {
            $(#[$begin_meta])*
            pub async fn begin(&self) -> ::std::result::Result<$tx, $error> {
                ::std::result::Result::Ok($tx {
                    inner: self.inner.begin().await?,
                })
            }

            /// Which connection write transactions begin on: one of this `WritePool`'s own
            /// ([`WriterConnection::Own`]($crate::write::WriterConnection::Own), the default:
            /// opened when first needed with the application pool's connect and pool options,
            /// then kept outside any pool, never pinged or recycled, and handed from one
            /// writer to the next with no round trip) or one from the application's pool,
            /// taken as readers take theirs, in their turn
            /// ([`WriterConnection::FromPool`]($crate::write::WriterConnection::FromPool)).
            ///
            /// The writer connection is one more SQLite connection on the file: one file
            /// handle, its own page cache (which stays warm while no other connection
            /// writes). One is always enough: only the turn's holder uses it. An in-memory
            /// database has none (a second connection would open another database). A
            /// connection that fails (anything but a database error, or a transaction it
            /// could not end) is closed, and the next writer opens a new one.
            pub fn writer(self, writer: $crate::write::WriterConnection) -> Self {
                Self {
                    inner: self.inner.writer(writer),
                }
            }

            /// Reports write transactions that hold the turn `slow` or longer; 250 ms by
            /// default ([`no_slow_transaction_report`](Self::no_slow_transaction_report): none).
            /// The report is a WARN (target `tower_sqlite_retry`, `slow write transaction`)
            /// naming the route and method, with the time held and waited; at most one a
            /// second per database, each saying how many were left out since the last. It
            /// carries no user data. A transaction that holds the turn has every other writer
            /// wait as long: this is the database's slow-transaction log.
            pub fn slow_transaction(self, slow: ::std::time::Duration) -> Self {
                Self {
                    inner: self.inner.slow_report(::std::option::Option::Some(slow)),
                }
            }

            /// No report of slow write transactions (see
            /// [`slow_transaction`](Self::slow_transaction)).
            pub fn no_slow_transaction_report(self) -> Self {
                Self {
                    inner: self.inner.slow_report(::std::option::Option::None),
                }
            }

            /// The database's write turn now: writers waiting, transactions, time held; two
            /// readings give its utilization
            /// ([`WriteStats::utilization_since`]($crate::write::WriteStats::utilization_since)).
            /// `None` until the first write transaction asked SQLite which database the pool
            /// writes to.
            pub fn stats(&self) -> ::std::option::Option<$crate::write::WriteStats> {
                self.inner.stats()
            }

            /// The pool, for reads (they take no turn) and anything else.
            pub fn pool(&self) -> &$sqlite_pool {
                self.inner.pool()
            }

            /// The pool back (the writer connection closes once no clone of this `WritePool`
            /// and no write transaction of it is left).
            pub fn into_pool(self) -> $sqlite_pool {
                self.inner.pool().clone()
            }

            /// The database file whose writers this queue serializes (its canonical path),
            /// once the first write transaction asked SQLite; `None` before, and for an
            /// in-memory database.
            pub fn path(&self) -> ::std::option::Option<&::std::path::Path> {
                self.inner.path()
            }

            /// Closes the application's pool and then the writer connection (as the pool's
            /// own `close` does: waits for the connections in use to come back, then closes
            /// them).
            pub async fn close(&self) {
                self.inner.close().await;
            }
        }

        /// Reads go to the pool as before: `.fetch_one(&*db)`.
        impl ::std::ops::Deref for $pool {
            type Target = $sqlite_pool;

            fn deref(&self) -> &$sqlite_pool {
                self.inner.pool()
            }
        }

        impl ::std::convert::From<$sqlite_pool> for $pool {
            fn from(pool: $sqlite_pool) -> Self {
                Self::new(pool)
            }
        }

        impl ::std::fmt::Debug for $pool {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.inner.fmt(f)
            }
        }

        impl $tx {
            /// Commits, gives the turn back, and, once committed, fences the current request:
            /// a retryable failure after this point is answered as it is, never replayed.
            ///
            /// `Ok` only when the `COMMIT` was, leaving the connection with no transaction
            /// open. A failed commit fences nothing (nothing was committed), rolls back, and
            /// gives the turn back too. A savepoint of this transaction still open (a nested
            /// transaction forgotten with `mem::forget`) would turn the `COMMIT` into a
            /// `RELEASE`: it fails with `Error::InvalidArgument` instead, after a rollback of
            /// the whole transaction.
            pub async fn commit(self) -> ::std::result::Result<(), $error> {
                self.inner.commit().await
            }

            /// Rolls back and gives the turn back.
            pub async fn rollback(self) -> ::std::result::Result<(), $error> {
                self.inner.rollback().await
            }
        }

        impl ::std::ops::Deref for $tx {
            type Target = $connection;

            fn deref(&self) -> &$connection {
                &self.inner
            }
        }

        impl ::std::ops::DerefMut for $tx {
            fn deref_mut(&mut self) -> &mut $connection {
                &mut self.inner
            }
        }

        impl ::std::fmt::Debug for $tx {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                self.inner.fmt(f)
            }
        }

        // Asserted at compile time: both types are `Send + Sync`, and so are the futures of
        // `begin`, `commit`, `rollback` and `close` (a handler holding them is `Send`).
        const _: () = {
            fn send_sync<T: Send + Sync>() {}
            fn send<T: Send>(_: &T) {}
            #[allow(dead_code)]
            fn types() {
                send_sync::<$pool>();
                send_sync::<$tx>();
            }
            #[allow(dead_code, unused_must_use)]
            async fn futures(db: $pool) -> ::std::result::Result<(), $error> {
                send(&db.begin());
                send(&db.begin().await?.commit());
                send(&db.begin().await?.rollback());
                send(&db.close());
                Ok(())
            }
        };
    };
}
