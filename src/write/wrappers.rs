//! The public `WritePool` / `WriteTransaction` wrappers' delegations, written once for every
//! sqlx version: expanded in `write/sqlx.rs` (sqlx 0.9) and in the companion crate
//! `tower-sqlite-retry-sqlx08`, each with its own types. What differs between the two (the
//! constructor, `begin`, `group_commit`, their documentation) stays beside the expansion.

/// Expands, for a wrapper pair `$pool { inner: WritePool<D> }` and `$tx { inner:
/// Transaction<D> }` of one sqlx version, their delegating methods and trait impls. Doc-hidden:
/// for this crate and its sqlx 0.8 companion, which pins this crate's exact version.
#[doc(hidden)]
#[macro_export]
macro_rules! __write_wrappers {
    (
        pool: $pool:ident,
        transaction: $tx:ident,
        sqlite_pool: $sqlite_pool:ty,
        connection: $connection:ty,
        error: $error:ty $(,)?
    ) => {
        impl $pool {
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

            /// Deprecated: [`writer`](Self::writer) with `WriterConnection::Own` (`true`) or
            /// `WriterConnection::FromPool` (`false`).
            #[deprecated(
                since = "0.1.0",
                note = "use `.writer(WriterConnection::Own)` or `.writer(WriterConnection::FromPool)`"
            )]
            pub fn writer_connection(self, own: bool) -> Self {
                self.writer(if own {
                    $crate::write::WriterConnection::Own
                } else {
                    $crate::write::WriterConnection::FromPool
                })
            }

            /// Reports write transactions that hold the turn `slow` or longer (`None`: none);
            /// 250 ms by default. The report is a WARN (target `tower_sqlite_retry`, `slow
            /// write transaction`) naming the route and method, with the time held and
            /// waited; at most one a second per database, each saying how many were left out
            /// since the last. It carries no user data. A transaction that holds the turn has
            /// every other writer wait as long: this is the database's slow-transaction log.
            pub fn slow_transaction(self, slow: ::std::option::Option<::std::time::Duration>) -> Self {
                Self {
                    inner: self.inner.slow_transaction(slow),
                }
            }

            /// Test seam: while `held`, group commit starts no fsync, and every transaction
            /// shares it, so that transactions commit and then wait for it. `false` if this
            /// pool shares no fsync. Not a public API.
            #[doc(hidden)]
            pub fn hold_fsync(&self, held: bool) -> bool {
                self.inner.hold_fsync(held)
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
    };
}
