//! The write path: queue the *transaction*, not the request.
//!
//! # Why
//!
//! SQLite has one writer. Two ways of living with that are common, and both cost more than
//! they need to:
//!
//! - a deferred transaction (`pool.begin()`) that reads and then writes fails with
//!   `SQLITE_BUSY` at once when another connection wrote in between; the layer replays the
//!   whole request, redoing everything the handler did before and after its transaction;
//! - `BEGIN IMMEDIATE` takes the write lock first, so it never fails that way; but writers
//!   waiting for the lock wait *inside* SQLite's busy handler, which polls with sleeps (the
//!   slowest writer waits far longer than any transaction takes), and each of them holds a pool connection
//!   while it waits, so readers run out of connections.
//!
//! [`WritePool`] keeps `BEGIN IMMEDIATE` and moves the wait in front of it: a write transaction
//! first waits for its **turn** in an in-process FIFO queue of its database file, and only then
//! begins `IMMEDIATE`, on a **writer connection** the `WritePool` keeps for write transactions
//! (opened when first needed, with the pool's options). The turn goes back
//! the moment the transaction's `COMMIT` (or rollback) has returned. So
//!
//! - only the transaction is serialized: authentication, parsing and the work after the commit
//!   run in parallel with other writers;
//! - waiting writers hold no connection and never sleep-poll in SQLite: the next writer is
//!   woken the moment the previous one committed, in arrival order, and begins at once on a
//!   warm writer connection (no pool acquire, no ping, no competing with readers for one);
//! - the application's pool is left to readers: a write needs none of its connections, even
//!   when readers hold them all ([`WritePool::writer`][writers]`(WriterConnection::FromPool)` goes back to
//!   taking write connections from it);
//! - writers in **other processes** are still excluded by SQLite (`busy_timeout`) and, past it,
//!   covered by the layer's replay: the `SQLITE_BUSY` of `BEGIN IMMEDIATE` is retryable.
//!
//! # The commit fences the request
//!
//! Under [`SqliteRetryLayer`](crate::SqliteRetryLayer), [`WriteTransaction::commit`][commit] fences
//! the request (as [`Attempt::fence`](crate::Attempt::fence) does): a retryable failure after
//! the commit is answered as it is, never replayed, because a replay would write twice. Code
//! below the handler needs no [`Attempt`](crate::Attempt) for this: the layer makes its
//! request the current one while the handler runs, and the commit finds it there. A `commit()`
//! cancelled after its `COMMIT` was sent (the client went away, a timeout around it) fences
//! too: the `COMMIT` may have gone through.
//!
//! A task the handler spawns is not the request's, unless it is wrapped in
//! [`in_request`](crate::in_request): `tokio::spawn(in_request(store.put(..))).await`, the
//! cancel-safe way to write, then fences the request at its commit and waits for the turn no
//! longer than the request's deadline.
//!
//! # The transaction's lifecycle
//!
//! A `WriteTransaction` is as safe as sqlx's own `Transaction`, whose protocol it keeps: it
//! alone owns its connection and its turn; dropped (an early return, a `?`, a panic, a
//! cancelled request) it sends the rollback sqlx's `Transaction` sends, and the turn goes to
//! the next writer only once that rollback ran on the connection; the connection goes on only
//! with no transaction left on it (closed otherwise); `commit()` is `Ok` only when the
//! `COMMIT` was, leaving no transaction open (a savepoint left open is an error, not a
//! `RELEASE` reported as a commit). The next writer always begins on a clean connection.
//!
//! # Rules
//!
//! - **One turn per database**: every `WritePool` on one database file in this process shares
//!   one queue, whatever the pool (the file's canonical path, as SQLite names it, is the key).
//!   Each `WritePool` (with its clones) has a writer connection of its own; the shared turn
//!   keeps all of them to one write transaction at a time.
//! - **Every wait is bounded**: by the request's deadline under the layer, and by the pool's
//!   `acquire_timeout` for the wait for the turn; past either, [`begin`][begin] fails with
//!   `sqlx::Error::PoolTimedOut` (retryable, as a pool time-out always was). The deadline
//!   bounds the `BEGIN IMMEDIATE` too (which waits out another process's lock for up to
//!   `busy_timeout`): the request is answered at its deadline, and the `BEGIN` is finished in
//!   the background before the turn goes on. The one wait the deadline does not cut is a
//!   committed transaction's wait for a shared fsync (group commit, below): it has committed,
//!   and the fsync runs or starts at once.
//! - **Dropped without commit**: the transaction rolls back and the turn goes back as soon as
//!   the rollback has run (one round trip to the connection, bounded by `acquire_timeout`), so
//!   the next writer never meets its write lock; a handler that fails with `?` gives the turn
//!   back while the layer's backoff runs, not after it.
//! - **One write transaction open at a time per request**: a second [`begin`][begin] on the
//!   same database while the request holds a write transaction open would wait for itself, so
//!   it fails at once with `sqlx::Error::InvalidArgument` instead. Sequential transactions (the
//!   first committed, rolled back or dropped) are fine: the second waits for the first's
//!   rollback, as any writer would. For a nested one, use a savepoint on the open one
//!   (`sqlx::Connection::begin(&mut *tx)`). Without the layer there is no request to tell, and
//!   such a wait ends at the pool's `acquire_timeout`.
//! - **Write through the transaction**: a write through the pool (`&*db`) while the request
//!   holds a write transaction open waits for that transaction's own lock, for the whole
//!   `busy_timeout`, and fails `SQLITE_BUSY`. A replay would wait again, so it is not
//!   retryable then: the request is answered `500` and an ERROR event says why. Run it on the
//!   transaction (`&mut *tx`).
//! - Reads need no turn: read from [`WritePool::pool`][pool] (or `&*db`), as before.
//!
//! # Group commit
//!
//! On by default ([`WritePool::group_commit`][group]`(None)` turns it off). In WAL mode at
//! `synchronous = FULL` (sqlx's default, and SQLite's), every `COMMIT` waits for an fsync of the
//! WAL while it holds the write lock: the fsync, not the transaction, is then the database's
//! write limit. With group commit the writer connection runs at `NORMAL`, each write transaction
//! still commits on its own, in its turn, and its `commit()` returns `Ok` only once an fsync
//! of the WAL that *started after* its `COMMIT` returned has completed. The write lock is held
//! for the transaction's statements only, and one fsync, outside it, makes durable every
//! transaction that committed while the previous fsync ran.
//!
//! **No client can tell it from one transaction at a time** (but by the speed): every
//! transaction has the outcome it would have alone (its own `COMMIT`, deferred foreign keys,
//! triggers, commit hooks and errors: another request's failure is never its own), and its
//! acknowledgement waits for nothing but an fsync that runs or starts at once (never for
//! another request's work, so a lock held across `commit()` or a slow next writer delays
//! nobody). The request is fenced at its `COMMIT`; the wait for the fsync is not cut by the
//! deadline (a `COMMIT` under way never is), so a write is never answered as failed when it
//! committed. Running a group's members inside one SQLite transaction (each in a `SAVEPOINT`)
//! with one `COMMIT`, an earlier design, made them share one fate, which clients could tell.
//!
//! The one difference, and only on a power loss: a transaction's rows are visible to readers
//! from its `COMMIT`, up to one fsync before its writer is answered. A power loss in that
//! window loses rows a reader may have seen, never one whose writer was told it committed (the
//! WAL is appended in commit order, so no later transaction is durable without an earlier
//! one). A process crash loses nothing.
//!
//! **The fsync, as careful as SQLite's.** The WAL is synced through one read-write descriptor
//! opened with the first writer connection and kept, through writer connections that close and
//! open again, for as long as the WAL at its path is the file it has open, as SQLite keeps its
//! own for a connection's life: it hears
//! every writeback error from then on (Linux tells a failed writeback once to each descriptor
//! open at the time, so a descriptor opened for one fsync could miss an error another heard
//! first), and it can be flushed on Windows (`FlushFileBuffers` needs write access). Before an
//! fsync is trusted, the descriptor is checked to be the file at the WAL's path (device and
//! inode; volume and file index on Windows): a WAL gone, renamed with its directory or
//! replaced is not what recovery reads after a power loss, so its commits are never answered
//! `Ok` through it. The WAL's directory is synced once, as SQLite does on its handle's first
//! sync (so the WAL's own directory entry survives a power loss).
//!
//! **When the disk refuses a write.** After any error syncing the WAL (the shared fsync; a
//! background checkpoint or a `COMMIT` on the writer connection failing with `SQLITE_IOERR`),
//! nothing more is acknowledged through the shared fsync: on Linux the pages whose writeback
//! failed are clean in the page cache and never written again, and recovery stops at the first
//! bad frame of the WAL, so every transaction after it could be lost on a power loss however
//! many later fsyncs succeed (PostgreSQL's "fsyncgate"). So the `commit()`s waiting, and any
//! that committed while sharing, fail with [`GroupCommitFailed`] (not retryable, never
//! replayed: committed, not known durable; the layer answers `500`), and **the database file
//! is refused every write until the process restarts**, through every pool of the process on
//! it, now or later: a transaction begun after the failure fails at its begin, one that began
//! before and commits after it fails at its commit, both with [`GroupCommitFailed`]
//! ([`is_refusal`](GroupCommitFailed::is_refusal)), since its frames would follow the ones the
//! failed sync may have left off the disk. An ERROR event says so once, and
//! [`WriteStats::sync_errors`] and the `tower_sqlite_retry_write_sync_errors_total` counter
//! count it (`ops/` has the alert). Why refuse rather than repair: a checkpoint that copies
//! every frame into the database file and restarts the WAL would copy frames from the page
//! cache that the disk never took, whose state is what the failed writeback left; SQLite
//! cannot tell a page the kernel dropped from one it holds. PostgreSQL, in the same case,
//! stops. What an operator does, as PostgreSQL asks after a failed fsync: check the disk
//! (kernel log, SMART, free space), then restart the process, which opens the database afresh
//! and lets SQLite recover the WAL from what is on the disk. Reads go on meanwhile.
//!
//! **A bound on commits waiting for one fsync.** At most 512 committed transactions wait
//! unanswered for the shared fsync (those it runs for and those queued for the next): past
//! that, a transaction begins at the pool's own level and its `COMMIT` fsyncs in the turn, as
//! without groups, so a disk that stalls holds writers back instead of letting every one of
//! them commit (visible to readers) without an answer, for clients to time out on and retry.
//! The bound is far above the groups a working disk gathers under hundreds of writers.
//!
//! **Two things SQLite does that group commit does not.** With `psow=0` (a device whose
//! sector writes may damage the bytes around them), SQLite pads a syncing commit's frames to
//! a sector boundary; commits that share the fsync run at `NORMAL` and are not padded: on
//! such a device, turn group commit off. And SQLite at `FULL` syncs the WAL's directory once
//! per handle; the crate does too (above), and ignores its result as SQLite does.
//!
//! Where there is no fsync to share it changes nothing: at `NORMAL` or `OFF`, in a
//! rollback-journal mode, with `writer(WriterConnection::FromPool)`, in memory; nor for a transaction that
//! begins while no other writer waits and no fsync is under way (an idle service, one client):
//! it runs at the pool's level and its `COMMIT` fsyncs as without groups, with no hand-off.
//! Why it is on: at `FULL` the fsync, not the transaction, limits an SQLite database's writes;
//! sharing it gives more writes than `BEGIN IMMEDIATE` (`BENCHMARKS.md` has the measurement).
//!
//! **Checkpoints off the turn.** While the fsync is shared, the writer connection's `COMMIT`
//! no longer copies the WAL into the database when it crosses `wal_autocheckpoint` (1,000
//! pages by default), which stalled every writer behind it: a connection of the `WritePool`'s
//! own runs `PRAGMA wal_checkpoint(PASSIVE)` in the background on SQLite's schedule (about
//! that many pages apart), then `PRAGMA wal_checkpoint(RESTART)` in the turn, between two
//! transactions, which copies the few frames appended meanwhile and restarts the WAL from its
//! start, so that the file stays near `wal_autocheckpoint` (a passive checkpoint alone never
//! catches up while writers append: the WAL then grew to the backstop). It waits at most 5 ms
//! for readers still reading the WAL's frames; a longer reader delays the restart to the next
//! writer or checkpoint. The writer connection's own automatic checkpoint stays as a backstop
//! at 10,000 pages. A writer alone (its `COMMIT` syncs anyway) checkpoints as SQLite
//! does. Measured with `wrk` under 64 writers at `FULL`, it gave more writes for less CPU per
//! write (`BENCHMARKS.md`). A connection configured with `wal_autocheckpoint = 0` (the application checkpoints) or above
//! the backstop is left as it is; so is a pool without group commit, where it measured worse,
//! as did a writer alone, and a WAL at `NORMAL`, where it was tried and gained nothing.
//!
//! # Only the write path commits
//!
//! The writer connection's commit hook lets a commit through only while the write path runs
//! its `COMMIT` (sqlx 0.9; sqlx 0.8 has no commit hook). A transaction can end without the
//! write path (a raw `COMMIT`, `ROLLBACK` or `RELEASE` run on it, a trigger's
//! `RAISE(ROLLBACK, ...)`, which rolls back SQLite's whole transaction while sqlx still counts
//! it open); every statement after that would run in autocommit mode and land on its own. The
//! hook refuses each such commit (SQLite rolls the statement back:
//! `SQLITE_CONSTRAINT_COMMITHOOK`, and an ERROR event says why), and the transaction's
//! `commit()` fails with `InvalidArgument` saying what happened: nothing of the transaction is
//! in the file. A commit hook a handler sets on its transaction's connection (through
//! `lock_handle()`) decides that transaction's commit, and ends with it: the guard is set again
//! after a `COMMIT` that did not ask it, a failed `COMMIT`, and a rollback, so no later
//! transaction meets the handler's hook.
//!
//! # In-memory databases
//!
//! The first write transaction asks SQLite which database the pool opens. An in-memory (or
//! temporary) database can be reached only through the pool's own connections (a second
//! connection would open another, empty, database), so its write transactions take their
//! connection from the pool, and its turn is that pool's alone (its clones share it; another
//! in-memory database, even of the same name, never does). With a pool of one connection, a
//! read through the pool inside a write transaction waits for that connection (until the
//! pool's `acquire_timeout`): read through the transaction. With a shared-cache in-memory
//! database (`sqlite::memory:`), SQLite locks tables, not the file: a read through the pool of
//! a table the open write transaction wrote waits until it commits, which the same request
//! would never do: read through the transaction there too.
//!
//! # What it does not cover, and what it costs
//!
//! - **Other processes**: the turn is in-process. A writer in another process is excluded by
//!   SQLite itself: `BEGIN IMMEDIATE` waits for it up to `busy_timeout` (holding the turn, so
//!   this process's other writers wait behind it), and past that fails `SQLITE_BUSY`, which
//!   the layer replays until the deadline.
//! - **Spawned tasks** without [`in_request`](crate::in_request): their commits fence nothing
//!   (a replay writes again), their waits are bounded by `acquire_timeout` alone. With it,
//!   await the task before the handler answers: the layer decides on replay when the handler
//!   answers.
//! - **Background work** that outlives the request: spawn it without `in_request` (the
//!   request's deadline would cut its waits short), and make it idempotent.
//! - The costs: one more SQLite connection per `WritePool` (the writer); one query on the first
//!   write transaction (which database); per transaction, one message to the connection's
//!   worker before `BEGIN` (the rollback no one waits for, which clears what a leaked
//!   transaction left) and a timer for the deadline; per dropped transaction, one spawned task
//!   and one round trip (its rollback, then a ping) before the turn goes on.
//!
//! # What a transaction's time in the turn is made of
//!
//! While writers wait, the turn is the database's write limit, and a transaction holds it from
//! its `BEGIN` to its `COMMIT`. sqlx runs each SQLite connection on a thread of its own, so
//! every statement is a round trip: the command wakes that thread, the answer wakes the
//! handler's task, which the runtime then has to schedule. Measured on sqlx's side (64 writers,
//! two cores, a four-statement transaction, `BENCHMARKS.md`): about four fifths of the time a
//! transaction held the turn was that wake-up and scheduling, one fifth SQLite. It follows (an
//! inference from that measurement, not measured as such) that fewer statements inside the
//! turn shorten it more than faster ones: one multi-row `INSERT` instead of a loop, `RETURNING`
//! instead of a `SELECT` after the write, and anything that is not a statement of the
//! transaction (hashing, rendering, a read that need not see the transaction's writes) done
//! before `begin()` or after `commit()`.
//!
//! # Readers beside the writer
//!
//! The transaction holding the turn is the one every queued writer waits for, and each of its
//! statements waits for a core like any other work. Two things keep the writer's pace beside
//! readers:
//!
//! - **The hand-over.** A `commit()` that leaves writers queued lets the next one run first (its
//!   task is requeued once behind it) before its own handler goes on: the next writer takes the
//!   turn and sends its `BEGIN` while the committed handler does its read after the commit or
//!   writes its response. Without it the turn sat idle for a large part of the time it was
//!   held, between one writer's `COMMIT` and the next one's `BEGIN`.
//! - **The read limit**, the layer's, on by default: while writers wait for a turn, at most one
//!   `GET`/`HEAD` handler per core but one (at least one) runs under the layer, leaving the
//!   turn's holder a core (a read held back waits at most its
//!   [`max_wait`](crate::policy::ReadLimit::max_wait), 10 ms, then runs anyway). It trades
//!   reads for writes (`BENCHMARKS.md`, "What happens to the writes beside readers").
//!   [`no_read_limit`](crate::SqliteRetryLayer::no_read_limit) turns it
//!   off, [`limit_reads_while_writers_wait`](crate::SqliteRetryLayer::limit_reads_while_writers_wait)
//!   sets another; a service without the write path never meets it.
//!
//! # Watching the single writer
//!
//! The write lock is the resource an SQLite service runs out of first. Per database:
//! [`WritePool::stats`][stats] (and [`WriteQueue::stats`]) reads the queue's length, the
//! transactions so far and the time the turn was held; two readings give the writer's
//! **utilization** ([`WriteStats::utilization_since`]: at 1.0 the database is at its write
//! limit). With the `metrics` feature, the time each write transaction waited for the turn
//! and held it, per route, and the queue's length go to the `metrics` facade (the crate's
//! `metrics::recorder` module lists them, with the feature). A transaction
//! that holds the turn longer than [`WritePool::slow_transaction`][slow] (250 ms by default) is
//! logged at WARN with its route, at most once a second per database: the slow-transaction
//! log. The counting costs two clock readings and a few uncontended atomics per transaction.
//!
//! # In a store
//!
//! A store that holds the pool and hands `&self.db` to functions generic over sqlx's
//! `Executor` (reads, single-statement writes) can keep its `SqlitePool` for those and hold a
//! `WritePool` beside it for its transactions, made from the same pool
//! (`WritePool::new(pool.clone())`): `self.db.begin_with("BEGIN IMMEDIATE")` becomes
//! `self.writes.begin()`, and nothing else changes. A helper that took the transaction as
//! `&mut Transaction<'_, Sqlite>` takes `&mut SqliteConnection` instead (callers keep
//! `&mut tx`, which derefs to it; inside, `&mut **tx` becomes `&mut *tx`). A single statement
//! run on the pool outside a transaction is a transaction of its own that begins with its
//! write, so SQLite's `busy_timeout` covers it without the turn (but not inside an open write
//! transaction of the same request: see *Write through the transaction* above).
//!
//! A store whose constructor is derived (`#[derive(Constructor)]`, `derive-new`'s `new`) would
//! gain an argument with the new field, and every caller would change: write the three-line
//! `new` by hand, so that callers keep `Store::new(pool)`. A `BEGIN_IMMEDIATE` constant the
//! store passed to `begin_with` goes with its uses (`begin()` always begins `IMMEDIATE`);
//! keep it only for a transaction that deliberately takes a pool connection outside the turn
//! (a migration at start-up), which then waits in SQLite's busy handler as before.
//!
#![cfg_attr(feature = "sqlite-write", doc = "```")]
#![cfg_attr(not(feature = "sqlite-write"), doc = "```ignore")]
//! use sqlx::{SqliteConnection, SqlitePool};
//! use tower_sqlite_retry::WritePool;
//!
//! #[derive(Clone)]
//! pub struct Store {
//!     db: SqlitePool,     // reads, single statements: unchanged
//!     writes: WritePool,  // write transactions
//! }
//!
//! impl Store {
//!     // By hand rather than derived: callers keep `Store::new(pool)`.
//!     pub fn new(db: SqlitePool) -> Self {
//!         let writes = WritePool::new(db.clone());
//!         Self { db, writes }
//!     }
//!
//!     pub async fn rename(&self, id: i64, name: &str) -> Result<(), sqlx::Error> {
//!         // was: let mut tx = self.db.begin_with(BEGIN_IMMEDIATE).await?;
//!         let mut tx = self.writes.begin().await?;
//!         touch(&mut tx, id).await?; // a helper that took `&mut Transaction<'_, Sqlite>`
//!         sqlx::query("UPDATE items SET name = ? WHERE id = ?")
//!             .bind(name)
//!             .bind(id)
//!             .execute(&mut *tx)
//!             .await?;
//!         tx.commit().await
//!     }
//!
//!     pub async fn name(&self, id: i64) -> Result<String, sqlx::Error> {
//!         sqlx::query_scalar("SELECT name FROM items WHERE id = ?")
//!             .bind(id)
//!             .fetch_one(&self.db)
//!             .await
//!     }
//! }
//!
//! // was: `tx: &mut Transaction<'_, Sqlite>` and `&mut **tx`.
//! async fn touch(tx: &mut SqliteConnection, id: i64) -> Result<(), sqlx::Error> {
//!     sqlx::query("UPDATE items SET touched = touched + 1 WHERE id = ?")
//!         .bind(id)
//!         .execute(&mut *tx)
//!         .await
//!         .map(drop)
//! }
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let options = sqlx::sqlite::SqliteConnectOptions::new()
//! #     .filename(dir.path().join("store.db"))
//! #     .create_if_missing(true);
//! # let pool = SqlitePool::connect_with(options).await?;
//! # sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, touched INTEGER DEFAULT 0)")
//! #     .execute(&pool)
//! #     .await?;
//! # sqlx::query("INSERT INTO items (id, name) VALUES (1, 'a')").execute(&pool).await?;
//! let store = Store::new(pool);
//! store.rename(1, "b").await?;
//! assert_eq!(store.name(1).await?, "b");
//! # Ok(())
//! # }
//! ```
//!
//! Pair it with WAL (`journal_mode(Wal)`), a `busy_timeout` of a few seconds (for writers in
//! other processes), and `synchronous(Normal)`.
//!
//! # Other drivers
//!
//! For sqlx 0.8, rusqlite or libSQL, [`WriteQueue`] is the turn on its own: wait for a
//! [`WriteTurn`], begin `IMMEDIATE` with your driver, and call
//! [`committed`](WriteTurn::committed) after the commit (it fences the request and gives the
//! turn back; dropping the turn gives it back without fencing).
//!
//! # Example
//!
//! The one-line change is the state's type: `SqlitePool` becomes [`WritePool`]. `db.begin()`
//! keeps its spelling (and now begins `IMMEDIATE`, in turn); reads use `&*db`.
//!
#![cfg_attr(all(feature = "sqlite-write", feature = "axum"), doc = "```")]
#![cfg_attr(
    not(all(feature = "sqlite-write", feature = "axum")),
    doc = "```ignore"
)]
//! use axum::{Json, Router, extract::State, routing::post};
//! use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};
//! use tower_sqlite_retry::{DbError, RetryPolicy, SqliteRetryLayer, WritePool};
//!
//! async fn create_order(
//!     State(db): State<WritePool>,
//!     Json(item): Json<String>,
//! ) -> Result<Json<(i64, i64)>, DbError> {
//!     // Work before the transaction runs in parallel with other writers.
//!     let item = item.trim().to_owned();
//!     let mut tx = db.begin().await?; // waits for the turn, then BEGIN IMMEDIATE
//!     let next: i64 = sqlx::query_scalar("SELECT COALESCE(MAX(seq), 0) + 1 FROM orders")
//!         .fetch_one(&mut *tx)
//!         .await?;
//!     sqlx::query("INSERT INTO orders (seq, item) VALUES (?, ?)")
//!         .bind(next)
//!         .bind(&item)
//!         .execute(&mut *tx)
//!         .await?;
//!     tx.commit().await?; // commits, gives the turn back, fences the request
//!     let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM orders")
//!         .fetch_one(&*db) // reads take no turn
//!         .await?;
//!     Ok(Json((next, count)))
//! }
//!
//! fn app(db: WritePool) -> Router {
//!     Router::new()
//!         .route("/orders", post(create_order))
//!         .layer(SqliteRetryLayer::new(RetryPolicy::default()))
//!         .with_state(db)
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # use tower::ServiceExt;
//! # let dir = tempfile::tempdir()?;
//! let options = SqliteConnectOptions::new()
//!     .filename(dir.path().join("shop.db"))
//!     .create_if_missing(true)
//!     .journal_mode(SqliteJournalMode::Wal)
//!     .busy_timeout(std::time::Duration::from_secs(5));
//! let pool = SqlitePoolOptions::new().max_connections(8).connect_with(options).await?;
//! sqlx::query("CREATE TABLE orders (seq INTEGER PRIMARY KEY, item TEXT NOT NULL)")
//!     .execute(&pool)
//!     .await?;
//! let app = app(WritePool::new(pool));
//! # let req = http::Request::post("/orders")
//! #     .header("content-type", "application/json")
//! #     .body(axum::body::Body::from("\"tea\""))?;
//! # let res = app.oneshot(req).await?;
//! # assert_eq!(res.status(), 200);
//! # Ok(())
//! # }
//! ```
//!
#![cfg_attr(feature = "sqlite-write", doc = "[`WritePool`]: WritePool")]
#![cfg_attr(feature = "sqlite-write", doc = "[begin]: WritePool::begin")]
#![cfg_attr(feature = "sqlite-write", doc = "[pool]: WritePool::pool")]
#![cfg_attr(feature = "sqlite-write", doc = "[writers]: WritePool::writer")]
#![cfg_attr(feature = "sqlite-write", doc = "[commit]: WriteTransaction::commit")]
#![cfg_attr(feature = "sqlite-write", doc = "[stats]: WritePool::stats")]
#![cfg_attr(feature = "sqlite-write", doc = "[slow]: WritePool::slow_transaction")]
#![cfg_attr(feature = "sqlite-write", doc = "[group]: WritePool::group_commit")]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[`WritePool`]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[begin]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.begin"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[pool]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.pool"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[writers]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.writer"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[commit]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WriteTransaction.html#method.commit"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[stats]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.stats"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[slow]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.slow_transaction"
)]
#![cfg_attr(
    not(feature = "sqlite-write"),
    doc = "[group]: https://docs.rs/tower-sqlite-retry/latest/tower_sqlite_retry/write/struct.WritePool.html#method.group_commit"
)]

// The module in layers, each importing only from those below it (`tests/layer/layering.rs`
// holds it so; ARCHITECTURE.md draws it):
//
//   this file            the facade: the docs above and the public names below, nothing else
//   queue.rs, sqlx/,     the front ends, beside each other: `WriteQueue` (the turn alone, for
//   thread/              any driver), the sqlx path (`WritePool`: driver seam, pool, session,
//                        transaction, its group commit and checkpoints), the writer thread
//   durable/             what makes a commit durable, shared by the front ends: the WAL's
//                        descriptor and its fsync, what a shared fsync reports and bounds
//   core/                the file's turn: in this process (`turn.rs`) and between processes
//                        (`file_turn.rs`), its counts (`stats.rs`), bounds and failures
mod core;
mod durable;
mod queue;
mod sqlx;
#[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
mod thread;

pub use self::core::failed::GroupCommitFailed;
pub use self::core::stats::WriteStats;
pub use self::queue::{TurnError, WriteQueue, WriteTurn};
pub use self::sqlx::pool::WriterConnection;
#[cfg(feature = "sqlite-write")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite-write")))]
pub use self::sqlx::v0_9::{WritePool, WriteTransaction};
#[cfg(any(feature = "rusqlite-write", feature = "diesel-write"))]
#[cfg_attr(
    docsrs,
    doc(cfg(any(feature = "rusqlite-write", feature = "diesel-write")))
)]
pub use self::thread::WriteThreadOptions;
#[cfg(feature = "diesel-write")]
#[cfg_attr(docsrs, doc(cfg(feature = "diesel-write")))]
pub use self::thread::on_diesel::DieselWriteThread;
#[cfg(feature = "rusqlite-write")]
#[cfg_attr(docsrs, doc(cfg(feature = "rusqlite-write")))]
pub use self::thread::on_rusqlite::WriteThread;

/// The one implementation of the write path, generic over the driver: what
/// `tower-sqlite-retry-sqlx08` builds sqlx 0.8's `WritePool` on, through `crate::__private`.
pub(crate) mod shared {
    pub use super::sqlx::driver::{
        AUTOCHECKPOINT_SQL, CHECKPOINT_SQL, CHECKPOINTER_BUSY_SQL, DURABILITY_SQL, Driver,
        RESTART_SQL, synchronous_pragma,
    };
    pub use super::sqlx::gate::CommitGate;
    pub use super::sqlx::pool::WritePool;
    pub use super::sqlx::transaction::Transaction;
}
