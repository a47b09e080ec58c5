//! The dispatcher demonstration: workers that claim work items from a SQLite table, as a job
//! queue's dispatcher does, with four ways of handling the claim's `database is locked`, side
//! by side, in interleaved rounds.
//!
//! ```text
//! cargo run --release --example dispatcher
//! cargo run --release --example dispatcher -- --io-us 1000
//! cargo run --release --example dispatcher -- --rounds 3 --items 10000
//! cargo run --release --example dispatcher -- --json > dispatcher.json
//! ```
//!
//! Each run is one column on a fresh SQLite file (WAL, `synchronous = NORMAL` unless
//! `--synchronous full`, `busy_timeout` 5 s as sqlx sets by default, a pool of 8
//! connections), on tokio's multi-thread runtime. `--producers` tasks (2) insert `--items`
//! items (3000 in all), one per transaction, as fast as they can, while `--workers` tasks (8)
//! claim them. A claim is what duroxide's SQLite provider does to fetch work: in one deferred
//! transaction (`pool.begin()`), read the oldest pending item, then mark it taken, then commit.
//! A read followed by a write: when another connection committed in between, SQLite refuses
//! the write at once with `SQLITE_BUSY_SNAPSHOT`, and when another writer holds the lock at
//! that moment, with `SQLITE_BUSY` (both say `database is locked`), whatever `busy_timeout`
//! says. The worker then processes the item (nothing by default; `--process-us` µs of CPU,
//! `--io-us` µs of awaited waiting, as for a call to another service) and records it in a done
//! log kept in memory, keyed by item id, so that an item done twice is seen. Workers stop once
//! the producers have finished and a claim finds no pending item (a worker that finds none
//! before that waits for the next insert: no polling). The columns:
//!
//! | column | the claim | on an error |
//! |---|---|---|
//! | `no retry` | deferred `BEGIN` | counted as a failed claim; the worker polls again at once (the item stays pending: another claim takes it later) |
//! | `text-matched` | deferred `BEGIN` | duroxide's hand-rolled schedule: an error whose text contains `database is locked` (and any error it does not know: retryable too) sleeps `min(100 · 2^n, 3000)` ms, no jitter, where `n` counts the worker's errors since it last found the queue empty (so it keeps growing across successful claims: 200 ms, 400 ms, ... then 3 s each), with saturating arithmetic (the original's `100 * 2_u64.pow(n)` overflows from the 58th) |
//! | `backoff` | deferred `BEGIN` | this crate's `Operation::backoff()` with `RetryPolicy::default()`: `admit()` before each try (once claims collided, they take turns: admission), classified by the error's code, sleeps `next_delay()` (2 ms doubling to 100 ms, full jitter), `reset()` after each claim; a `None` (not retryable, or the streak ran out) is a failed claim |
//! | `write path` | `WritePool::begin()`: the claim waits for its turn in the process, then `BEGIN IMMEDIATE` on the write path's connection | cannot meet the read-then-write failure; wrapped in `Operation::run` (`RetryPolicy::default()`) for what the write path cannot prevent (another process's writer past `busy_timeout`, a pool time-out); an `Err` is a failed claim |
//!
//! The producers write as their column's claims do: autocommit inserts on the pool (SQLite's
//! `busy_timeout` covers a transaction that begins with its write), through the `WritePool`
//! in the write path's column (every writer of the process takes the turn).
//!
//! How to read the table, per column (the median of the rounds, then every round):
//!
//! - `items done`: distinct items in the done log; `claims failed`: claims that ended in an
//!   error not retried (`no retry`: every error; the others: an error given up on);
//! - `items lost`: produced, never done, once the workers drained the queue; `items done twice`:
//!   in the done log more than once;
//! - `items/s`: items done per second, from the start of the run to the last claim's commit
//!   (`drain time`);
//! - `claim p50`, `claim p99`, `claim max`: a successful claim's time, from the start of its
//!   first try, its retries and their sleeps included, to its commit (a failed claim has no
//!   latency: it is counted as failed; so `no retry`'s figures are of the last try alone);
//! - `item wait p50`, `item wait p99`, `item wait max`: an item's time in the queue, from its
//!   insert's commit to its claim's commit: what the dispatcher's user waits for. Unlike the
//!   claim's time it sees a worker asleep in a backoff (the items it would have claimed
//!   meanwhile wait) and a backlog of items;
//! - `retries`: tries after a claim's first (for `backoff` and `write path`, checked against
//!   the `Operation`'s own counters); `claims retried`: claims that needed at least one;
//! - `integrity`: `PRAGMA integrity_check` says `ok`, the table has every produced item and none
//!   left pending, each item's `taken_by` is the worker whose done log has it, and every
//!   produced item was done exactly once.
//!
//! Then the ratio of `backoff` to `text-matched` (items/s: above 1 is more; claim p99 and item
//! wait p99: below 1 is faster), per round too, and the verdict. What to look for: a percentile is only as wide
//! as the share of claims behind it. When fewer than 1 % of the claims retried (`claims
//! retried`), the p99 does not see them: their time is in `claim max`. And a worker asleep
//! claims nothing: whether that costs throughput depends on what processing an item takes
//! (none by default: one worker alone claims about as fast as SQLite commits; compare with
//! `--io-us 1000`).
//!
//! Timings vary between machines and runs: each round runs the four columns in turn, so that
//! a slow moment of the machine falls on all of them, and the medians smooth the rest. Which
//! column was faster is shown, never judged.
//!
//! Exits with status 0 on PASS (in every round and in the median, the `backoff` and
//! `write path` columns failed no claim, lost and doubled no item, and their integrity check
//! passed); 1 otherwise; 2 on bad flags or a setup error. The `no retry` column is expected to
//! fail claims (how many depends on the machine's speed); the report says whether it did, and
//! the exit status does not depend on it.
//!
//! Flags (`--help` explains each): `--items N` (3000), `--workers N` (8, at least 2),
//! `--producers N` (2), `--rounds N` (5), `--pool-size N` (8), `--busy-timeout-ms N` (5000),
//! `--synchronous normal|full` (normal), `--process-us N` (0), `--io-us N` (0),
//! `--base-delay-ms MS` and `--max-delay-ms MS` (the `backoff` and `write path` columns'
//! policy: `RetryPolicy::default()` with these), `--text-reset-on-claim` (the text-matched
//! schedule's `n` back to 0 after every successful claim too, as the newest duroxide
//! dispatchers do), `--json` (a machine-readable report on stdout). `RUST_LOG` sets the log
//! filter (default `error,tower_sqlite_retry=off`: the table counts the retries).

#[path = "common/cli.rs"]
mod cli;

use std::collections::HashMap;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde::Serialize;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{SqliteConnection, SqlitePool};
use tokio::sync::watch;
use tower_sqlite_retry::{Operation, RetryPolicy, WritePool};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The dispatcher demonstration: workers claim items from a SQLite table (read the oldest
/// pending one, mark it taken, in one deferred transaction) while producers insert more, with
/// no retry, with duroxide's text-matched schedule, with Operation::backoff(), and with the
/// write path, in interleaved rounds; checks that every item was done exactly once.
#[derive(Debug, Parser)]
#[command(
    name = "dispatcher",
    after_help = "Exits 0 on PASS; 1 if, in any round or in the median, the backoff or the \
    write path column failed a claim, lost or doubled an item, or failed its integrity check; \
    2 on bad flags or a setup error. The no retry column is expected to fail claims; the exit \
    status does not depend on it. Which column was faster is shown, not judged. RUST_LOG sets \
    the log filter (default: error,tower_sqlite_retry=off)."
)]
struct Args {
    /// Items the producers insert in all, per run (split evenly between them).
    #[arg(long, value_name = "N", default_value_t = 3000, value_parser = clap::value_parser!(u64).range(1..))]
    items: u64,
    /// Worker tasks claiming items; at least 2 (one worker alone never collides).
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(2..))]
    workers: u32,
    /// Producer tasks inserting items while the workers claim them.
    #[arg(long, value_name = "N", default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    producers: u32,
    /// Rounds; each runs the four columns in turn, and the table shows the median of each
    /// figure across the rounds.
    #[arg(long, value_name = "N", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    rounds: u32,
    /// Connections in each run's pool.
    #[arg(long, value_name = "N", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pool_size: u32,
    /// SQLite's busy_timeout, in milliseconds (sqlx's default).
    #[arg(long, value_name = "N", default_value_t = 5000)]
    busy_timeout_ms: u64,
    /// PRAGMA synchronous (WAL mode): normal (no fsync at commit) or full (sqlx's default: an
    /// fsync of the WAL at every commit; the write path then shares fsyncs, group commit).
    #[arg(long, value_name = "LEVEL", default_value = "normal", value_parser = ["normal", "full"])]
    synchronous: String,
    /// CPU work per item after its claim, in µs (standing for the processing; 0: none).
    #[arg(long, value_name = "N", default_value_t = 0)]
    process_us: u64,
    /// An awaited wait per item after its claim, in µs (standing for I/O: a call to another
    /// service; 0: none). tokio's timer rounds it up to whole milliseconds.
    #[arg(long, value_name = "N", default_value_t = 0)]
    io_us: u64,
    /// The backoff and write path columns' base delay, in ms [default: RetryPolicy::default()'s].
    #[arg(long, value_name = "MS", value_parser = positive_ms)]
    base_delay_ms: Option<f64>,
    /// The backoff and write path columns' cap on one delay, in ms [default:
    /// RetryPolicy::default()'s].
    #[arg(long, value_name = "MS", value_parser = positive_ms)]
    max_delay_ms: Option<f64>,
    /// Set the text-matched schedule's error count back to 0 after every successful claim
    /// too (the newest duroxide dispatchers do); by default only an empty queue does.
    #[arg(long)]
    text_reset_on_claim: bool,
    /// A machine-readable report on stdout.
    #[arg(long)]
    json: bool,
}

fn positive_ms(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(ms) if ms > 0.0 && ms <= 3_600_000.0 => Ok(ms),
        Ok(_) => Err("must be above 0 and at most an hour".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// A setting of the policy, read from its `Debug` output (the policy has setters only; `Debug`
/// shows every setting), so that the header follows the crate's defaults.
fn policy_field(policy: &RetryPolicy, field: &str) -> String {
    let debug = format!("{policy:?}");
    debug
        .split(&format!("{field}: "))
        .nth(1)
        .and_then(|rest| rest.split([',', ' ', '}']).next())
        .unwrap_or("?")
        .to_string()
}

impl Args {
    /// The policy of the backoff and write path columns: `RetryPolicy::default()`, with
    /// `--base-delay-ms` and `--max-delay-ms` if given.
    fn policy(&self) -> RetryPolicy {
        let mut policy = RetryPolicy::default();
        if let Some(ms) = self.base_delay_ms {
            policy = policy.base_delay(Duration::from_secs_f64(ms / 1000.0));
        }
        if let Some(ms) = self.max_delay_ms {
            policy = policy.max_delay(Duration::from_secs_f64(ms / 1000.0));
        }
        policy
    }

    fn synchronous(&self) -> SqliteSynchronous {
        if self.synchronous == "full" {
            SqliteSynchronous::Full
        } else {
            SqliteSynchronous::Normal
        }
    }
}

/// A column of the table: how a claim meets its errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Column {
    NoRetry,
    TextMatched,
    Backoff,
    WritePath,
}

impl Column {
    const ALL: [Column; 4] = [
        Column::NoRetry,
        Column::TextMatched,
        Column::Backoff,
        Column::WritePath,
    ];

    fn label(self) -> &'static str {
        match self {
            Column::NoRetry => "no retry",
            Column::TextMatched => "text-matched",
            Column::Backoff => "backoff",
            Column::WritePath => "write path",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Column::NoRetry => "no-retry",
            Column::TextMatched => "text-matched",
            Column::Backoff => "backoff",
            Column::WritePath => "write-path",
        }
    }

    /// The columns the exit status answers for.
    fn judged(self) -> bool {
        matches!(self, Column::Backoff | Column::WritePath)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(cli::env_filter("error,tower_sqlite_retry=off"))
        .with_writer(std::io::stderr)
        .init();
    match run(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("dispatcher: {e}");
            ExitCode::from(2)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The claim
// ---------------------------------------------------------------------------------------------

/// The oldest pending item.
const PICK: &str = "SELECT id FROM items WHERE taken = 0 ORDER BY id LIMIT 1";
/// Marks it taken by this worker.
const TAKE: &str = "UPDATE items SET taken = 1, taken_by = ? WHERE id = ?";

/// The claim's statements, on a connection inside a transaction: read, then write.
async fn pick_and_take(
    conn: &mut SqliteConnection,
    worker: u32,
) -> Result<Option<i64>, sqlx::Error> {
    let id: Option<i64> = sqlx::query_scalar(PICK).fetch_optional(&mut *conn).await?;
    let Some(id) = id else {
        return Ok(None);
    };
    sqlx::query(TAKE)
        .bind(worker)
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(Some(id))
}

/// One try of a claim in a deferred transaction on the pool (`BEGIN`): the item, or `None`
/// when no item is pending.
async fn claim_deferred(pool: &SqlitePool, worker: u32) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = pool.begin().await?;
    match pick_and_take(&mut tx, worker).await? {
        Some(id) => {
            tx.commit().await?;
            Ok(Some(id))
        }
        None => {
            tx.rollback().await?;
            Ok(None)
        }
    }
}

/// One try of a claim on the write path: its turn, then `BEGIN IMMEDIATE`.
async fn claim_write_path(writes: &WritePool, worker: u32) -> Result<Option<i64>, sqlx::Error> {
    let mut tx = writes.begin().await?;
    match pick_and_take(&mut tx, worker).await? {
        Some(id) => {
            tx.commit().await?;
            Ok(Some(id))
        }
        None => {
            tx.rollback().await?;
            Ok(None)
        }
    }
}

/// How duroxide's SQLite provider classifies an error (`sqlx_to_provider_error`): by its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TextVerdict {
    Retryable,
    Permanent,
}

fn classify_by_text(error: &sqlx::Error) -> TextVerdict {
    let text = error.to_string();
    if text.contains("database is locked") || text.contains("SQLITE_BUSY") {
        TextVerdict::Retryable
    } else if text.contains("UNIQUE constraint") || text.contains("PRIMARY KEY") {
        TextVerdict::Permanent
    } else {
        // connection errors, time-outs, and every error it does not know: retryable
        TextVerdict::Retryable
    }
}

/// duroxide's dispatcher delay after its `n`-th retryable error in a row:
/// `(100 * 2^n).min(3000)` ms, no jitter. Saturating, so that the 58th error and later wait
/// the cap: the original's `100 * 2_u64.pow(n)` overflows from there on (a panic in a debug
/// build, a wrapped, far shorter delay in a release build).
fn text_matched_delay(n: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(2u64.saturating_pow(n)).min(3000))
}

/// CPU work standing for the item's processing.
fn process(micros: u64) {
    if micros == 0 {
        return;
    }
    let until = Instant::now() + Duration::from_micros(micros);
    let mut x = 0u64;
    while Instant::now() < until {
        x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
    }
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

/// What the producers have told the workers: items committed so far, producers finished.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    produced: u64,
    finished: u32,
}

/// What a worker saw.
#[derive(Debug, Default)]
struct WorkerLog {
    /// The items it claimed and processed, in order.
    done: Vec<i64>,
    /// When each of `done` was claimed (its claim's commit).
    claimed_at: Vec<Instant>,
    /// Each successful claim's time, first try to commit.
    latencies: Vec<Duration>,
    claims_failed: u64,
    retries: u64,
    /// Claims that needed at least one retry.
    claims_retried: u64,
    /// Its last claim's commit.
    last_commit: Option<Instant>,
    /// The first error of a failed claim, for the report.
    first_failure: Option<String>,
}

/// What a producer inserted.
#[derive(Debug, Default)]
struct ProducerLog {
    ids: Vec<i64>,
    /// When each of `ids` was inserted (its commit).
    produced_at: Vec<Instant>,
    insert_errors: u64,
}

/// Where a run writes: the pool (deferred transactions), or the write path.
#[derive(Clone)]
enum Writer {
    Pool(SqlitePool),
    WritePath(WritePool),
}

/// The settings one run needs.
#[derive(Debug, Clone, Copy)]
struct Setup {
    items: u64,
    workers: u32,
    producers: u32,
    process_us: u64,
    io_us: u64,
    text_reset_on_claim: bool,
}

async fn produce(
    writer: Writer,
    producer: u32,
    count: u64,
    progress: Arc<watch::Sender<Progress>>,
) -> Result<ProducerLog, BoxError> {
    const INSERT: &str = "INSERT INTO items (producer) VALUES (?) RETURNING id";
    let mut log = ProducerLog::default();
    for _ in 0..count {
        let mut errors_in_a_row = 0u32;
        let id = loop {
            let inserted = match &writer {
                Writer::Pool(pool) => {
                    sqlx::query_scalar::<_, i64>(INSERT)
                        .bind(producer)
                        .fetch_one(pool)
                        .await
                }
                Writer::WritePath(writes) => {
                    async {
                        let mut tx = writes.begin().await?;
                        let id = sqlx::query_scalar::<_, i64>(INSERT)
                            .bind(producer)
                            .fetch_one(&mut *tx)
                            .await?;
                        tx.commit().await?;
                        Ok(id)
                    }
                    .await
                }
            };
            match inserted {
                Ok(id) => break id,
                // An insert waits up to busy_timeout for the lock: an error here is rare, and
                // is retried (an item not inserted is not produced, so it cannot be lost).
                Err(e) => {
                    log.insert_errors += 1;
                    errors_in_a_row += 1;
                    if errors_in_a_row >= 100 {
                        return Err(format!(
                            "producer {producer}: 100 inserts in a row failed: {e}"
                        )
                        .into());
                    }
                    tokio::task::yield_now().await;
                }
            }
        };
        log.ids.push(id);
        log.produced_at.push(Instant::now());
        // After the commit: a worker that sees this count sees the item.
        progress.send_modify(|p| p.produced += 1);
    }
    progress.send_modify(|p| p.finished += 1);
    Ok(log)
}

/// A worker: claims, processes and logs items until the producers have finished and a claim
/// finds none pending.
async fn work(
    column: Column,
    writer: Writer,
    operation: Operation,
    worker: u32,
    setup: Setup,
    mut progress: watch::Receiver<Progress>,
) -> WorkerLog {
    let mut log = WorkerLog::default();
    // text-matched: the worker's retryable errors since it last found the queue empty
    let mut text_errors: u32 = 0;
    // backoff: the schedule of the worker's streaks of errors
    let mut backoff = operation.backoff();
    loop {
        // Read before the claim: if every producer had finished by now, a claim that finds no
        // pending item means there is none left (its read began after their last commit).
        let seen = *progress.borrow_and_update();
        let retries_before = log.retries;
        let started = Instant::now();
        // The claim, its retries included: `Ok(Some(id))` claimed, `Ok(None)` no item
        // pending, `Err(why)` failed.
        let claimed: Result<Option<i64>, String> = match (column, &writer) {
            (Column::NoRetry, Writer::Pool(pool)) => claim_deferred(pool, worker)
                .await
                .map_err(|e| e.to_string()),
            (Column::TextMatched, Writer::Pool(pool)) => loop {
                match claim_deferred(pool, worker).await {
                    Ok(Some(id)) => {
                        if setup.text_reset_on_claim {
                            text_errors = 0;
                        }
                        break Ok(Some(id));
                    }
                    Ok(None) => {
                        text_errors = 0;
                        break Ok(None);
                    }
                    Err(e) => match classify_by_text(&e) {
                        TextVerdict::Retryable => {
                            text_errors = text_errors.saturating_add(1);
                            log.retries += 1;
                            tokio::time::sleep(text_matched_delay(text_errors)).await;
                        }
                        TextVerdict::Permanent => {
                            text_errors = 0;
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            break Err(e.to_string());
                        }
                    },
                }
            },
            (Column::Backoff, Writer::Pool(pool)) => loop {
                // the operation's admission: once claims collide, they take turns; the slot
                // is held through the try and its backoff, and goes back before processing
                let slot = match backoff.admit().await {
                    Ok(slot) => slot,
                    Err(e) => break Err(e.to_string()),
                };
                match claim_deferred(pool, worker).await {
                    Ok(claimed) => {
                        backoff.reset();
                        break Ok(claimed);
                    }
                    Err(e) => match backoff.next_delay(&e) {
                        Some(delay) => {
                            log.retries += 1;
                            tokio::time::sleep(delay).await;
                        }
                        None => {
                            // not retryable, or the streak ran out: the loop goes on, at the cap
                            drop(slot);
                            tokio::time::sleep(backoff.cap()).await;
                            break Err(e.to_string());
                        }
                    },
                }
            },
            (Column::WritePath, Writer::WritePath(writes)) => {
                let mut tries = 0u64;
                let result = operation
                    .run(|_attempt| {
                        tries += 1;
                        claim_write_path(writes, worker)
                    })
                    .await;
                log.retries += tries.saturating_sub(1);
                result.map_err(|e| e.to_string())
            }
            (column, _) => unreachable!("{} runs on its own writer", column.label()),
        };
        if log.retries > retries_before {
            log.claims_retried += 1;
        }
        match claimed {
            Ok(Some(id)) => {
                let now = Instant::now();
                log.latencies.push(now - started);
                log.last_commit = Some(now);
                process(setup.process_us);
                if setup.io_us > 0 {
                    tokio::time::sleep(Duration::from_micros(setup.io_us)).await;
                }
                log.done.push(id);
                log.claimed_at.push(now);
            }
            Ok(None) => {
                if seen.finished == setup.producers {
                    return log;
                }
                // Wait for the next item (or the last producer's end): no polling.
                if progress.changed().await.is_err() {
                    return log;
                }
            }
            Err(why) => {
                log.claims_failed += 1;
                log.first_failure.get_or_insert(why);
            }
        }
    }
}

/// A run's figures: one column of one round.
#[derive(Debug, Clone, Serialize)]
struct RunReport {
    column: &'static str,
    round: u32,
    produced: u64,
    /// Distinct items in the done log.
    done: u64,
    claims_failed: u64,
    lost: u64,
    doubled: u64,
    retries: u64,
    /// Claims that needed at least one retry.
    claims_retried: u64,
    /// The `Operation`'s own count of retries (`backoff`, `write path`).
    operation_retries: Option<u64>,
    insert_errors: u64,
    items_per_s: f64,
    /// From the start to the last claim's commit.
    drain_s: f64,
    /// From the start to the last worker's end.
    elapsed_s: f64,
    claim_ms: Latency,
    /// An item's wait: from its insert's commit to its claim's commit.
    wait_ms: Latency,
    integrity: Integrity,
    /// The first error of a failed claim, if any.
    first_failure: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Latency {
    p50: f64,
    p99: f64,
    max: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Integrity {
    ok: bool,
    /// `PRAGMA integrity_check`'s answer.
    integrity_check: String,
    /// Rows in the table.
    rows: u64,
    /// Rows still pending.
    pending: u64,
    /// Rows whose `taken_by` is not the worker that did the item (or taken and never done).
    taker_mismatch: u64,
    /// Items in the done log that no producer inserted.
    unknown_done: u64,
    /// Produced items not done exactly once (lost, or done more than once).
    not_exactly_once: u64,
}

impl RunReport {
    /// Why this run fails the demonstration (nothing: it does not).
    fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.claims_failed > 0 {
            why.push(format!("{} claims failed", self.claims_failed));
        }
        if self.lost > 0 {
            why.push(format!("{} items lost", self.lost));
        }
        if self.doubled > 0 {
            why.push(format!("{} items done twice", self.doubled));
        }
        if !self.integrity.ok {
            why.push(format!("integrity {}", self.integrity.describe()));
        }
        why
    }
}

impl Integrity {
    fn describe(&self) -> String {
        if self.ok {
            return "OK".into();
        }
        format!(
            "BROKEN (integrity_check {:?}, {} rows, {} pending, {} taken_by mismatches, {} \
             unknown items done, {} items not done exactly once)",
            self.integrity_check,
            self.rows,
            self.pending,
            self.taker_mismatch,
            self.unknown_done,
            self.not_exactly_once
        )
    }
}

async fn open(path: &Path, args: &Args) -> Result<SqlitePool, sqlx::Error> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(args.synchronous())
        .busy_timeout(Duration::from_millis(args.busy_timeout_ms));
    let pool = SqlitePoolOptions::new()
        .max_connections(args.pool_size)
        .connect_with(options)
        .await?;
    sqlx::query(
        "CREATE TABLE items (
            id INTEGER PRIMARY KEY,
            producer INTEGER NOT NULL,
            taken INTEGER NOT NULL DEFAULT 0,
            taken_by INTEGER
        )",
    )
    .execute(&pool)
    .await?;
    sqlx::query("CREATE INDEX items_pending ON items (taken, id)")
        .execute(&pool)
        .await?;
    Ok(pool)
}

/// One column of one round, on a fresh file at `path`.
async fn run_column(
    column: Column,
    round: u32,
    path: &Path,
    args: &Args,
    setup: Setup,
) -> Result<RunReport, BoxError> {
    let pool = open(path, args).await?;
    let writer = match column {
        Column::WritePath => Writer::WritePath(WritePool::new(pool.clone())),
        _ => Writer::Pool(pool.clone()),
    };
    let operation = Operation::new("claim", args.policy());
    let (progress_tx, progress_rx) = watch::channel(Progress::default());
    let progress_tx = Arc::new(progress_tx);

    let started = Instant::now();
    let workers: Vec<_> = (0..setup.workers)
        .map(|w| {
            tokio::spawn(work(
                column,
                writer.clone(),
                operation.clone(),
                w,
                setup,
                progress_rx.clone(),
            ))
        })
        .collect();
    let producers: Vec<_> = (0..setup.producers)
        .map(|p| {
            let share = setup.items / u64::from(setup.producers)
                + u64::from(u64::from(p) < setup.items % u64::from(setup.producers));
            tokio::spawn(produce(writer.clone(), p, share, progress_tx.clone()))
        })
        .collect();
    drop(progress_rx);

    let mut produced_logs = Vec::new();
    let mut producer_error = None;
    for p in producers {
        match p.await? {
            Ok(log) => produced_logs.push(log),
            Err(e) => {
                // Let the workers end: they stop once every producer has finished.
                progress_tx.send_modify(|p| p.finished += 1);
                producer_error.get_or_insert(e);
            }
        }
    }
    let mut logs = Vec::new();
    for w in workers {
        logs.push(w.await?);
    }
    let elapsed = started.elapsed();
    if let Some(e) = producer_error {
        return Err(e);
    }
    let announced = progress_tx.borrow().produced;

    // The done log against what was produced.
    let produced: Vec<i64> = produced_logs
        .iter()
        .flat_map(|l| l.ids.iter().copied())
        .collect();
    let mut done_by: HashMap<i64, (u32, u32)> = HashMap::new(); // id -> (times, last worker)
    for (w, log) in logs.iter().enumerate() {
        for id in &log.done {
            let entry = done_by.entry(*id).or_insert((0, 0));
            entry.0 += 1;
            entry.1 = w as u32;
        }
    }
    if announced != produced.len() as u64 {
        return Err(format!(
            "the producers announced {announced} items and logged {}",
            produced.len()
        )
        .into());
    }
    let produced_set: std::collections::HashSet<i64> = produced.iter().copied().collect();
    let lost = produced
        .iter()
        .filter(|id| !done_by.contains_key(id))
        .count() as u64;
    let doubled = done_by.values().filter(|(n, _)| *n > 1).count() as u64;
    let unknown_done = done_by
        .keys()
        .filter(|id| !produced_set.contains(id))
        .count() as u64;

    // The table against the done log.
    let integrity_check: String = sqlx::query_scalar("PRAGMA integrity_check")
        .fetch_one(&pool)
        .await?;
    let rows: Vec<(i64, i64, Option<i64>)> =
        sqlx::query_as("SELECT id, taken, taken_by FROM items")
            .fetch_all(&pool)
            .await?;
    let pending = rows.iter().filter(|(_, taken, _)| *taken == 0).count() as u64;
    let taker_mismatch = rows
        .iter()
        .filter(|(id, taken, by)| *taken != 0 && done_by.get(id).map(|(_, w)| i64::from(*w)) != *by)
        .count() as u64;
    let row_count = rows.len() as u64;
    let integrity = Integrity {
        ok: integrity_check == "ok"
            && row_count == produced.len() as u64
            && pending == 0
            && taker_mismatch == 0
            && unknown_done == 0
            && lost + doubled == 0,
        integrity_check,
        rows: row_count,
        pending,
        taker_mismatch,
        unknown_done,
        not_exactly_once: lost + doubled,
    };
    match &writer {
        Writer::WritePath(writes) => writes.close().await,
        Writer::Pool(pool) => pool.close().await,
    }

    // Each item's wait, from its insert's commit to its (first) claim's commit.
    let produced_at: HashMap<i64, Instant> = produced_logs
        .iter()
        .flat_map(|l| l.ids.iter().copied().zip(l.produced_at.iter().copied()))
        .collect();
    let mut waits: Vec<f64> = logs
        .iter()
        .flat_map(|l| l.done.iter().zip(&l.claimed_at))
        .filter_map(|(id, claimed)| {
            let produced = produced_at.get(id)?;
            Some(claimed.saturating_duration_since(*produced).as_secs_f64() * 1000.0)
        })
        .collect();
    waits.sort_by(f64::total_cmp);
    let mut latencies: Vec<f64> = logs
        .iter()
        .flat_map(|l| l.latencies.iter().map(|d| d.as_secs_f64() * 1000.0))
        .collect();
    latencies.sort_by(f64::total_cmp);
    let last_commit = logs.iter().filter_map(|l| l.last_commit).max();
    let drain = last_commit.map_or(elapsed, |t| t - started);
    let done = done_by.len() as u64;
    let retries = logs.iter().map(|l| l.retries).sum();
    let operation_retries = match column {
        Column::Backoff | Column::WritePath => Some(operation.metrics().snapshot().retries),
        _ => None,
    };
    Ok(RunReport {
        column: column.label(),
        round,
        produced: produced.len() as u64,
        done,
        claims_failed: logs.iter().map(|l| l.claims_failed).sum(),
        lost,
        doubled,
        retries,
        claims_retried: logs.iter().map(|l| l.claims_retried).sum(),
        operation_retries,
        insert_errors: produced_logs.iter().map(|l| l.insert_errors).sum(),
        items_per_s: done as f64 / drain.as_secs_f64().max(f64::MIN_POSITIVE),
        drain_s: drain.as_secs_f64(),
        elapsed_s: elapsed.as_secs_f64(),
        claim_ms: Latency {
            p50: percentile(&latencies, 0.50),
            p99: percentile(&latencies, 0.99),
            max: latencies.last().copied().unwrap_or(0.0),
        },
        wait_ms: Latency {
            p50: percentile(&waits, 0.50),
            p99: percentile(&waits, 0.99),
            max: waits.last().copied().unwrap_or(0.0),
        },
        integrity,
        first_failure: logs.iter().find_map(|l| l.first_failure.clone()),
    })
}

/// The nearest-rank percentile of sorted values (0 for none).
fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(mut values: Vec<f64>) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

// ---------------------------------------------------------------------------------------------
// The rounds and the report
// ---------------------------------------------------------------------------------------------

/// A column's figures, the median across the rounds.
#[derive(Debug, Clone, Serialize)]
struct MedianReport {
    column: &'static str,
    done: f64,
    claims_failed: f64,
    lost: f64,
    doubled: f64,
    retries: f64,
    claims_retried: f64,
    items_per_s: f64,
    drain_s: f64,
    claim_p50_ms: f64,
    claim_p99_ms: f64,
    claim_max_ms: f64,
    wait_p50_ms: f64,
    wait_p99_ms: f64,
    wait_max_ms: f64,
    /// Rounds whose integrity check failed.
    integrity_broken_rounds: u32,
}

impl MedianReport {
    fn of(column: Column, runs: &[&RunReport]) -> Self {
        let m = |f: &dyn Fn(&RunReport) -> f64| median(runs.iter().map(|r| f(r)).collect());
        Self {
            column: column.label(),
            done: m(&|r| r.done as f64),
            claims_failed: m(&|r| r.claims_failed as f64),
            lost: m(&|r| r.lost as f64),
            doubled: m(&|r| r.doubled as f64),
            retries: m(&|r| r.retries as f64),
            claims_retried: m(&|r| r.claims_retried as f64),
            items_per_s: m(&|r| r.items_per_s),
            drain_s: m(&|r| r.drain_s),
            claim_p50_ms: m(&|r| r.claim_ms.p50),
            claim_p99_ms: m(&|r| r.claim_ms.p99),
            claim_max_ms: m(&|r| r.claim_ms.max),
            wait_p50_ms: m(&|r| r.wait_ms.p50),
            wait_p99_ms: m(&|r| r.wait_ms.p99),
            wait_max_ms: m(&|r| r.wait_ms.max),
            integrity_broken_rounds: runs.iter().filter(|r| !r.integrity.ok).count() as u32,
        }
    }

    fn failures(&self) -> Vec<String> {
        let mut why = Vec::new();
        if self.claims_failed > 0.0 {
            why.push(format!(
                "median {} claims failed",
                count(self.claims_failed)
            ));
        }
        if self.lost > 0.0 {
            why.push(format!("median {} items lost", count(self.lost)));
        }
        if self.doubled > 0.0 {
            why.push(format!("median {} items done twice", count(self.doubled)));
        }
        if self.integrity_broken_rounds > 0 {
            why.push(format!(
                "integrity broken in {} rounds",
                self.integrity_broken_rounds
            ));
        }
        why
    }
}

/// A median count: whole, or with its half.
fn count(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn ms(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} ms")
    } else {
        format!("{v:.1} ms")
    }
}

fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 {
        format!("{:.2}×", a / b)
    } else {
        "-".to_string()
    }
}

async fn run(args: &Args) -> Result<bool, BoxError> {
    let setup = Setup {
        items: args.items,
        workers: args.workers,
        producers: args.producers,
        process_us: args.process_us,
        io_us: args.io_us,
        text_reset_on_claim: args.text_reset_on_claim,
    };
    args.policy().validate()?;
    let dir = tempfile::tempdir()?;
    if !args.json {
        println!(
            "dispatcher: {} workers claim {} items that {} producers insert meanwhile, {} \
             round{} of 4 columns; pool {}, WAL, synchronous {}, busy_timeout {} ms, {} cores{}",
            args.workers,
            args.items,
            args.producers,
            args.rounds,
            if args.rounds == 1 { "" } else { "s" },
            args.pool_size,
            args.synchronous.to_uppercase(),
            args.busy_timeout_ms,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            if cfg!(debug_assertions) {
                " (debug build: use --release for representative numbers)"
            } else {
                ""
            }
        );
        println!("database: a fresh file per run in {}", dir.path().display());
        println!(
            "claim: BEGIN; SELECT the oldest pending item; UPDATE it taken; COMMIT; then process \
             it ({})",
            match (args.process_us, args.io_us) {
                (0, 0) => "nothing but the done log: --process-us 0, --io-us 0".to_string(),
                (cpu, 0) => format!("~{cpu} µs of CPU"),
                (0, io) => format!("an awaited wait of {io} µs, as for I/O"),
                (cpu, io) => format!("~{cpu} µs of CPU, then an awaited wait of {io} µs"),
            }
        );
        println!("  no retry      a failed claim is counted; the worker polls again at once");
        println!(
            "  text-matched  on \"database is locked\" (or any unknown error) sleep min(100·2^n, \
             3000) ms, no jitter,"
        );
        println!(
            "                n = the worker's errors since {}",
            if args.text_reset_on_claim {
                "its last claim or empty poll (--text-reset-on-claim)"
            } else {
                "it last found the queue empty"
            }
        );
        let policy = args.policy();
        let name = if args.base_delay_ms.is_none() && args.max_delay_ms.is_none() {
            "RetryPolicy::default()"
        } else {
            "RetryPolicy::default() with --base-delay-ms/--max-delay-ms"
        };
        println!(
            "  backoff       Operation::backoff(), {name}: by code, {} doubling to {}, jitter {};",
            policy_field(&policy, "base_delay"),
            policy_field(&policy, "max_delay"),
            policy_field(&policy, "jitter")
        );
        println!(
            "                admit() before each try (contended claims take turns), reset() after each claim"
        );
        println!(
            "  write path    WritePool::begin() (the turn, then BEGIN IMMEDIATE) in \
             Operation::run({name})"
        );
    }

    let mut rounds: Vec<Vec<RunReport>> = Vec::new();
    for round in 1..=args.rounds {
        let mut reports = Vec::new();
        for column in Column::ALL {
            let path = dir.path().join(format!("r{round}-{}.db", column.tag()));
            let report = run_column(column, round, &path, args, setup).await?;
            if !args.json {
                eprintln!(
                    "round {round}/{}, {:>12}: {} items in {:.2} s",
                    args.rounds, report.column, report.done, report.elapsed_s
                );
            }
            reports.push(report);
        }
        rounds.push(reports);
    }

    let medians: Vec<MedianReport> = Column::ALL
        .iter()
        .enumerate()
        .map(|(c, column)| {
            let runs: Vec<&RunReport> = rounds.iter().map(|r| &r[c]).collect();
            MedianReport::of(*column, &runs)
        })
        .collect();

    // The verdict: the judged columns, in every round and in the median.
    let mut failures = Vec::new();
    // What is worth saying but decides nothing.
    let mut notes = Vec::new();
    for (c, column) in Column::ALL.iter().enumerate() {
        if !column.judged() {
            continue;
        }
        for r in &rounds {
            let why = r[c].failures();
            if !why.is_empty() {
                failures.push(format!(
                    "{}, round {}: {}",
                    column.label(),
                    r[c].round,
                    why.join(", ")
                ));
            }
            if let Some(op) = r[c].operation_retries
                && op != r[c].retries
            {
                notes.push(format!(
                    "{}, round {}: the Operation counted {op} retries, the workers {}",
                    column.label(),
                    r[c].round,
                    r[c].retries
                ));
            }
        }
        let why = medians[c].failures();
        if !why.is_empty() {
            failures.push(format!("{}, median: {}", column.label(), why.join(", ")));
        }
    }
    let pass = failures.is_empty();
    let no_retry_failed_rounds = rounds.iter().filter(|r| r[0].claims_failed > 0).count();
    let (text, backoff) = (&medians[1], &medians[2]);

    if args.json {
        let out = serde_json::json!({
            "config": {
                "items": args.items,
                "workers": args.workers,
                "producers": args.producers,
                "rounds": args.rounds,
                "pool_size": args.pool_size,
                "busy_timeout_ms": args.busy_timeout_ms,
                "synchronous": args.synchronous,
                "process_us": args.process_us,
                "io_us": args.io_us,
                "text_reset_on_claim": args.text_reset_on_claim,
                "policy": format!("{:?}", args.policy()),
                "cores": std::thread::available_parallelism().map_or(1, |n| n.get()),
                "release": !cfg!(debug_assertions),
            },
            "rounds": rounds,
            "median": medians,
            "backoff_vs_text_matched": {
                "items_per_s": backoff.items_per_s / text.items_per_s.max(f64::MIN_POSITIVE),
                "claim_p99": backoff.claim_p99_ms / text.claim_p99_ms.max(f64::MIN_POSITIVE),
                "item_wait_p99": backoff.wait_p99_ms / text.wait_p99_ms.max(f64::MIN_POSITIVE),
            },
            "no_retry_failed_rounds": no_retry_failed_rounds,
            "pass": pass,
            "failures": failures,
            "notes": notes,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(pass);
    }

    print_medians(&medians, args.rounds);
    print_rounds(&rounds);
    println!();
    println!(
        "backoff ÷ text-matched, medians: items/s {} (above 1: more), claim p99 {} (below 1: \
         faster), item wait p99 {} (below 1: sooner)",
        ratio(backoff.items_per_s, text.items_per_s),
        ratio(backoff.claim_p99_ms, text.claim_p99_ms),
        ratio(backoff.wait_p99_ms, text.wait_p99_ms)
    );
    if rounds.len() > 1 {
        let per_round: Vec<String> = rounds
            .iter()
            .map(|r| {
                format!(
                    "round {}: {} / {} / {}",
                    r[0].round,
                    ratio(r[2].items_per_s, r[1].items_per_s),
                    ratio(r[2].claim_ms.p99, r[1].claim_ms.p99),
                    ratio(r[2].wait_ms.p99, r[1].wait_ms.p99)
                )
            })
            .collect();
        println!(
            "  per round (items/s / claim p99 / item wait p99): {}",
            per_round.join(", ")
        );
    }
    let inserts: u64 = rounds.iter().flatten().map(|r| r.insert_errors).sum();
    if inserts > 0 {
        println!("producers: {inserts} inserts failed and were retried (none was lost)");
    }
    if no_retry_failed_rounds > 0 {
        let first = rounds
            .iter()
            .find_map(|r| r[0].first_failure.clone())
            .unwrap_or_default();
        println!(
            "no retry: FAILED claims in {no_retry_failed_rounds} of {} rounds (median {}), as \
             expected: e.g. {first}",
            rounds.len(),
            count(medians[0].claims_failed)
        );
    } else {
        println!(
            "no retry: no claim failed in any round: the workers did not collide on this \
             machine (more --workers or --items make them)"
        );
    }
    for note in &notes {
        println!("note: {note}");
    }
    if pass {
        println!(
            "verdict: PASS: backoff and write path: no claim failed, every produced item done \
             exactly once, integrity OK, in every round and in the median"
        );
    } else {
        println!("verdict: FAIL: {}", failures.join("; "));
    }
    Ok(pass)
}

fn print_medians(medians: &[MedianReport], rounds: u32) {
    let each = |f: &dyn Fn(&MedianReport) -> String| medians.iter().map(f).collect::<Vec<_>>();
    let rows: Vec<(&str, Vec<String>)> = vec![
        ("", each(&|m| m.column.to_string())),
        ("items done", each(&|m| count(m.done))),
        ("claims failed", each(&|m| count(m.claims_failed))),
        ("items lost", each(&|m| count(m.lost))),
        ("items done twice", each(&|m| count(m.doubled))),
        ("items/s", each(&|m| format!("{:.0}/s", m.items_per_s))),
        ("drain time", each(&|m| format!("{:.2} s", m.drain_s))),
        ("claim p50", each(&|m| ms(m.claim_p50_ms))),
        ("claim p99", each(&|m| ms(m.claim_p99_ms))),
        ("claim max", each(&|m| ms(m.claim_max_ms))),
        ("item wait p50", each(&|m| ms(m.wait_p50_ms))),
        ("item wait p99", each(&|m| ms(m.wait_p99_ms))),
        ("item wait max", each(&|m| ms(m.wait_max_ms))),
        ("retries", each(&|m| count(m.retries))),
        ("claims retried", each(&|m| count(m.claims_retried))),
        (
            "integrity",
            each(&|m| match m.integrity_broken_rounds {
                0 => "OK".to_string(),
                n => format!("BROKEN ×{n}"),
            }),
        ),
    ];
    println!();
    println!(
        "median of {rounds} round{}:",
        if rounds == 1 { "" } else { "s" }
    );
    print_grid(&rows);
}

fn print_rounds(rounds: &[Vec<RunReport>]) {
    let header = [
        "round",
        "column",
        "done",
        "failed",
        "lost",
        "twice",
        "items/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "wait p99",
        "retries",
        "retried",
        "integrity",
    ];
    let mut lines: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rounds.iter().flatten() {
        lines.push(vec![
            r.round.to_string(),
            r.column.to_string(),
            r.done.to_string(),
            r.claims_failed.to_string(),
            r.lost.to_string(),
            r.doubled.to_string(),
            format!("{:.0}", r.items_per_s),
            format!("{:.1}", r.claim_ms.p50),
            format!("{:.1}", r.claim_ms.p99),
            format!("{:.1}", r.claim_ms.max),
            format!("{:.1}", r.wait_ms.p99),
            r.retries.to_string(),
            r.claims_retried.to_string(),
            if r.integrity.ok { "OK" } else { "BROKEN" }.to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            lines
                .iter()
                .map(|l| l[c].chars().count())
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    println!();
    println!("every round:");
    for l in &lines {
        let mut out = String::new();
        for (c, (v, w)) in l.iter().zip(&widths).enumerate() {
            // the column's name left-aligned, the figures right-aligned
            if c == 1 {
                out.push_str(&format!("  {v:<w$}", w = w - 2));
            } else {
                out.push_str(&format!("{v:>w$}"));
            }
        }
        println!("{}", out.trim_end());
    }
    for r in rounds.iter().flatten() {
        if !r.integrity.ok {
            println!(
                "integrity, {} round {}: {}",
                r.column,
                r.round,
                r.integrity.describe()
            );
        }
    }
}

fn print_grid(rows: &[(&str, Vec<String>)]) {
    let name_width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0) + 1;
    let columns = rows.first().map_or(0, |(_, v)| v.len());
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .map(|(_, vals)| vals[c].chars().count())
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    for (name, vals) in rows {
        let mut line = format!("{name:<name_width$}");
        for (v, width) in vals.iter().zip(&widths) {
            line.push_str(&format!("{v:>width$}"));
        }
        println!("{}", line.trim_end());
    }
}
