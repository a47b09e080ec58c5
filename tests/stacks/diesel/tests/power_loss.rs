//! Durability under a power loss, on a simulated disk with a volatile write cache, for the
//! Diesel writer thread (`DieselWriteThread`, feature `diesel-write`): the main crate's
//! `tests/write/power_loss.rs`, against Diesel's `SqliteConnection` and its bundled SQLite.
//!
//! The group commit and the refusal after a failed sync are the main crate's one
//! implementation (`src/write/thread/mod.rs`), but the `BEGIN IMMEDIATE`, the `COMMIT` and what
//! a failed `COMMIT` is taken for are Diesel's (`on_diesel.rs`), and the SQLite that writes the
//! WAL is the one this package links: a commit this driver acknowledged before its fsync, or a
//! sync this SQLite skipped, would not show in the main crate's tests.
//!
//! A process crash (SIGKILL) leaves what the process wrote to the kernel; a power loss also
//! drops what the kernel had not written back: only what an fsync made durable is left. The
//! child processes here run under the main crate's `LD_PRELOAD` shim
//! (`../../power_loss/shim.c`, built with `cc` at run time; without one the tests print
//! `SKIPPED:` and pass, with a line in `TSR_SKIP_LOG`, which `.ci/run` counts and, with
//! `CI_STRICT=1`, fails on), which keeps, for every file of the database's directory, a
//! "durable shadow" updated only by `fsync`/`fdatasync`, and can make the WAL's next fsync fail
//! (`.ctl/fail-next-fsync:<file>`). After the child is gone, the test copies each shadow over
//! its file (a file without one is deleted, as is `-shm`) and opens the database afresh: SQLite
//! recovers what a machine that lost power would have found. The shim, the simulated disk, the
//! children and the seeded kill points are the main crate's power-loss harness
//! (`../../power_loss/harness.rs`, included from the checkout); the workloads on Diesel and
//! what must survive are here.
//!
//! - `every_acknowledged_write_survives_power_loss_on_the_diesel_writer_thread`: 32 tasks
//!   write unique ids through one `DieselWriteThread` (`FULL`, group commit: its defaults), each
//!   id printed once its `transaction` returned `Ok`; the child is SIGKILLed once the parent
//!   has read a random number of them (seeded; the seed is printed, `TSR_POWER_LOSS_SEED`
//!   replays it), several rounds on one file, every other round on a slower disk (bigger
//!   groups): every acknowledged id is in the recovered file, and the file is sound.
//! - `control_normal_loses_acknowledged_writes_on_the_diesel_writer_thread`: the same writer
//!   thread at `synchronous_normal()` (no fsync of the WAL before a checkpoint), 20 writes one
//!   after the other (far from the 1,000-page autocheckpoint), then SIGKILL and power loss:
//!   acknowledged writes are lost. It proves the simulator drops what was never synced, for
//!   this package's SQLite as for the main crate's.
//! - `after_a_failed_fsync_the_diesel_writer_thread_acknowledges_nothing`: a closure that
//!   committed while the shared fsync was held (the crate's test seam), which then fails (the
//!   shim's `fail-next-fsync`), is not `Ok`, and says it is the disk's; the transactions begun
//!   after it are refused, and are not in the file after a power loss; every write
//!   acknowledged before the failure is.
//!
//! The children are this test binary itself, run with `TSR_DIESEL_POWER_LOSS_CHILD` set: the
//! `#[ignore]`d tests `serve_child` and `fault_child` then do the child's part (without it they
//! return). Each parent checks that its child's harness ran that one test: a child whose
//! filter matched nothing says `running 0 tests` and exits 0.
#![cfg(target_os = "linux")]

#[path = "../../../power_loss/harness.rs"]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use diesel::connection::SimpleConnection;
use diesel::prelude::*;
use diesel::result::Error as DieselError;
use tower_sqlite_retry::write::{DieselWriteThread, WriteThreadOptions};
use tsr_stack_diesel::schema::items;

use harness::{ChildRan, DB, Disk, FaultChild, SEED, names_the_disk, shim, shim_command};

/// What the child does: `serve:<config>:<base>:<dir>` or `fault:<scenario>:<dir>`.
const CHILD: &str = "TSR_DIESEL_POWER_LOSS_CHILD";
/// The children's entry points, by their full names in this test binary.
const SERVE_CHILD: &str = "serve_child";
const FAULT_CHILD: &str = "fault_child";
/// Kill rounds of the group commit test (each a fresh child on the same file).
const ROUNDS: u64 = 3;
/// Concurrent writing tasks in the group commit test's child.
const TASKS: i64 = 32;
/// Writes per task and round, at most (the ids of a task are `base + task * MAX_WRITES + n`).
const MAX_WRITES: i64 = 1_000_000;
/// The acknowledgements the parent reads before it kills the child: a number in this range.
const KILL_AFTER: (u64, u64) = (20, 4_000);
/// Writes of the control, one after the other (well under the 1,000-page autocheckpoint).
const CONTROL_WRITES: i64 = 20;
/// How long a child may take to get where its parent waits for it.
const CHILD_TIMEOUT: Duration = Duration::from_secs(60);
/// The fault child, for the harness.
const FAULT: FaultChild = FaultChild {
    var: CHILD,
    entry: FAULT_CHILD,
    timeout: CHILD_TIMEOUT,
};

// The group commit test's table: the ids acknowledged, each once (`seq` tells doubles apart).
diesel::table! {
    acks (seq) {
        seq -> BigInt,
        id -> BigInt,
    }
}

const ACKS_SCHEMA: &str = "CREATE TABLE acks (seq INTEGER PRIMARY KEY, id INTEGER NOT NULL)";
/// The fault scenario's table (`tsr_stack_diesel::schema::items`, without `UNIQUE`).
const ITEMS_SCHEMA: &str = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)";

// ---------------------------------------------------------------------------------------------
// The database (the shim and the simulated disk are the harness')
// ---------------------------------------------------------------------------------------------

/// A Diesel connection to `path` (not through the writer thread).
fn connect(path: &Path) -> SqliteConnection {
    let mut conn = SqliteConnection::establish(path.to_str().expect("a UTF-8 path"))
        .expect("open the database");
    conn.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
    conn
}

/// Creates the database (WAL) and `schema` from this process, then makes it durable: the
/// children find a database that survives every power loss, and only their writes at stake.
fn create(disk: &Disk, schema: &str) {
    let mut conn = connect(&disk.db());
    conn.batch_execute(&format!("PRAGMA journal_mode = WAL; {schema}"))
        .unwrap();
    drop(conn);
    disk.settle();
}

/// `PRAGMA integrity_check`'s one row on a sound file.
#[derive(QueryableByName)]
struct Integrity {
    #[diesel(sql_type = diesel::sql_types::Text)]
    integrity_check: String,
}

/// What `PRAGMA integrity_check` says of the file `conn` has open (`ok` when sound).
fn integrity(conn: &mut SqliteConnection) -> String {
    let rows: Vec<Integrity> = diesel::sql_query("PRAGMA integrity_check")
        .load(conn)
        .expect("PRAGMA integrity_check");
    rows.into_iter()
        .map(|r| r.integrity_check)
        .collect::<Vec<_>>()
        .join("; ")
}

/// The `acks` table at `path` as a fresh process finds it (SQLite recovers it): id → how
/// many rows; and what `PRAGMA integrity_check` says.
fn acks_in(path: &Path) -> (BTreeMap<i64, usize>, String) {
    let mut conn = connect(path);
    let ids: Vec<i64> = acks::table
        .select(acks::id)
        .load(&mut conn)
        .expect("read the acks");
    let mut counts = BTreeMap::new();
    for id in ids {
        *counts.entry(id).or_insert(0) += 1;
    }
    let integrity = integrity(&mut conn);
    (counts, integrity)
}

/// What a process crash alone (no power loss) would leave: the files as they are, recovered
/// from a copy.
fn acks_after_a_crash(disk: &Disk) -> BTreeMap<i64, usize> {
    let copy = disk.crash_copy();
    acks_in(&copy.path().join(DB)).0
}

// ---------------------------------------------------------------------------------------------
// The children
// ---------------------------------------------------------------------------------------------

/// One line on stdout, flushed at once: what the parent reads is all the child said before
/// it was killed.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").expect("stdout");
    out.flush().expect("stdout");
}

/// Polls `check` every 2 ms until it holds (a condition, not a guess at timing); panics with
/// `what` after 30 s.
async fn poll_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    loop {
        if check() {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The children's runtime: two workers, as on this machine's cores.
fn child_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

// ---------------------------------------------------------------------------------------------
// The serving child: writes until killed
// ---------------------------------------------------------------------------------------------

/// One write transaction through the writer thread: the id `id` into `acks`.
async fn insert_ack(writes: &DieselWriteThread, id: i64) -> Result<usize, DieselError> {
    writes
        .transaction(move |conn| {
            diesel::insert_into(acks::table)
                .values(acks::id.eq(id))
                .execute(conn)
        })
        .await
}

/// The serving child: `serve:<config>:<base>:<dir>`, until killed. Not a test on its own: run
/// by the power-loss tests; a no-op without its variable.
///
/// - `full`: the writer thread with its defaults (WAL, `FULL`, group commit); [`TASKS`] tasks
///   write ids from `base` as fast as answered, each printed (`acked <id>`) once its
///   `transaction` returned `Ok`; a failure is printed (`failed <id>: ...`) and ends its task.
/// - `normal`: the writer thread at `synchronous_normal()`; [`CONTROL_WRITES`] ids one after
///   the other, each printed once `Ok`, then `control: done`, then nothing until killed.
#[test]
#[ignore = "a child process's entry point, run by the power-loss tests"]
fn serve_child() {
    let Some([config, base, dir]) = harness::child_job(CHILD, "serve") else {
        return;
    };
    let base: i64 = base.parse().expect("a number");
    let dir = PathBuf::from(dir);
    child_runtime().block_on(async move {
        let options = match config.as_str() {
            "full" => WriteThreadOptions::default(),
            "normal" => WriteThreadOptions::default().synchronous_normal(),
            other => panic!("unknown config {other}"),
        };
        let writes = DieselWriteThread::open_with(dir.join(DB), options, |_| Ok(()))
            .expect("the writer thread");
        say("serving");
        if config == "normal" {
            for id in base..base + CONTROL_WRITES {
                insert_ack(&writes, id).await.expect("a control write");
                say(&format!("acked {id}"));
            }
            say("control: done");
            // Until killed: nothing more is written (no checkpoint, no close).
            std::future::pending::<()>().await;
        }
        let tasks: Vec<_> = (0..TASKS)
            .map(|task| {
                let writes = writes.clone();
                tokio::spawn(async move {
                    for n in 0..MAX_WRITES {
                        let id = base + task * MAX_WRITES + n;
                        match insert_ack(&writes, id).await {
                            Ok(_) => say(&format!("acked {id}")),
                            Err(error) => {
                                say(&format!("failed {id}: {error}"));
                                return;
                            }
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

/// When the parent kills the serving child.
enum KillWhen {
    /// Once it has read this many acknowledgements.
    Acked(usize),
    /// Once the child said `control: done`.
    Done,
}

/// What the parent read from a serving child, until it died.
#[derive(Default)]
struct Served {
    acked: BTreeSet<i64>,
    failed: Vec<String>,
    done: bool,
    serving: bool,
    /// The lines that are not acknowledgements (for a failure's message).
    other: Vec<String>,
}

impl Served {
    fn line(&mut self, line: &str, ran: &mut ChildRan) {
        ran.line(line);
        // (the first line the child prints follows the harness' `test serve_child ... `)
        if let Some((_, id)) = line.split_once("acked ") {
            self.acked
                .insert(id.trim().parse().expect("an acknowledged id"));
            return;
        }
        if let Some((_, failed)) = line.split_once("failed ") {
            self.failed.push(failed.to_owned());
        } else if line.contains("control: done") {
            self.done = true;
        } else if line.contains("serving") {
            self.serving = true;
        }
        self.other.push(line.to_owned());
    }
}

/// Runs the serving child `config` on `disk` under the shim and SIGKILLs it once `when`; then
/// what it acknowledged (every line it printed, those read after the kill included: nothing
/// runs after SIGKILL, so each was acknowledged before the power loss, and they are the writes
/// acknowledged closest to it, the ones most at risk).
fn serve_then_kill(
    config: &str,
    base: i64,
    disk: &Disk,
    shim: &Path,
    fsync_delay_us: u64,
    when: KillWhen,
) -> Served {
    let job = format!("serve:{config}:{base}:{}", disk.dir.display());
    let mut command = harness::child_command(CHILD, SERVE_CHILD, &job, disk, shim, fsync_delay_us);
    command.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = command.spawn().expect("spawn the serving child");
    let stdout = child.stdout.take().unwrap();
    let (lines, read) = mpsc::channel();
    // Reads the child's stdout until it dies.
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut ran = ChildRan::default();
    let mut served = Served::default();
    let deadline = Instant::now() + CHILD_TIMEOUT;
    let reached = loop {
        let due = match when {
            KillWhen::Acked(n) => served.acked.len() >= n,
            KillWhen::Done => served.done,
        };
        if due {
            break Ok(());
        }
        match read.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(line) => served.line(&line, &mut ran),
            Err(RecvTimeoutError::Timeout) => {
                break Err(format!("not within {} s", CHILD_TIMEOUT.as_secs()));
            }
            Err(RecvTimeoutError::Disconnected) => break Err("the child exited".to_owned()),
        }
    };
    // SIGKILL: no destructor, no checkpoint, nothing flushed.
    let killed = child.kill();
    let status = child.wait().expect("wait for the child");
    for line in read {
        served.line(&line, &mut ran);
    }
    reader.join().unwrap();
    let said = served.other.join("\n");
    if let Err(why) = reached {
        panic!(
            "the serving child ({config}) did not get where it is killed: {why} ({status}; {} \
             acknowledged); it said:\n{said}",
            served.acked.len()
        );
    }
    killed.expect("SIGKILL the child");
    ran.assert_started(SERVE_CHILD, &said);
    assert!(served.serving, "the child said it served:\n{said}");
    served
}

// ---------------------------------------------------------------------------------------------
// The kill tests (the parent: the child, the SIGKILL, the power loss)
// ---------------------------------------------------------------------------------------------

/// Group commit at `FULL` on the Diesel writer thread, 32 tasks, SIGKILL and power loss at a
/// random moment, several rounds on one file: every write acknowledged before the kill is in
/// the recovered file, and the file is sound.
#[test]
fn every_acknowledged_write_survives_power_loss_on_the_diesel_writer_thread() {
    let test = "every_acknowledged_write_survives_power_loss_on_the_diesel_writer_thread";
    let Some(shim) = shim(test) else { return };
    let seed = harness::seed();
    eprintln!("{test}: seed {seed} ({SEED}={seed} replays the kill points)");
    let mut rng = harness::Rng(seed);
    let disk = Disk::new();
    create(&disk, ACKS_SCHEMA);

    let mut rounds = harness::Rounds::default();
    for round in 0..ROUNDS {
        // A slower disk every other round: bigger groups.
        let fsync_delay_us = if round % 2 == 0 { 0 } else { 1000 };
        let kill_after = usize::try_from(rng.between(KILL_AFTER)).unwrap();
        let base = i64::try_from(round + 1).unwrap() * 1_000 * MAX_WRITES;
        let served = serve_then_kill(
            "full",
            base,
            &disk,
            shim,
            fsync_delay_us,
            KillWhen::Acked(kill_after),
        );

        let crashed = acks_after_a_crash(&disk);
        let shadowed = disk.power_loss();
        let (recovered, integrity) = acks_in(&disk.db());
        disk.settle();

        assert!(
            served.failed.is_empty(),
            "round {round}: failed writes: {:?}",
            served.failed
        );
        let found = rounds.check(round, &served.acked, &recovered, &crashed, base, &shadowed);
        let (lost, round_rows, crash_rows) = (&found.lost, found.rows, found.crash_rows);
        eprintln!(
            "{test}: round {round} (fsync delay {fsync_delay_us} us, killed after {kill_after} \
             acknowledgements read): {} acknowledged, {} of them lost; {round_rows} rows of the \
             round after the power loss ({crash_rows} after a mere crash: {} committed rows \
             lost to the power loss); integrity: {integrity}; shadows: {shadowed:?}",
            served.acked.len(),
            lost.len(),
            crash_rows - round_rows.min(crash_rows),
        );
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged by the Diesel writer thread before the kill, lost in \
             the power loss: {} of {} (first: {:?}; seed {seed})",
            lost.len(),
            served.acked.len(),
            lost.iter().take(10).collect::<Vec<_>>()
        );
        assert_eq!(
            integrity, "ok",
            "round {round}: the recovered file is sound (seed {seed})"
        );
    }
    rounds.finish(test, ROUNDS);
}

/// The control: the Diesel writer thread at `synchronous_normal()`, where nothing syncs the
/// WAL before a checkpoint; writes acknowledged one after the other, then SIGKILL and power
/// loss: they are lost (all of them, expectedly). Fails if the shim stopped dropping what was
/// never synced.
#[test]
fn control_normal_loses_acknowledged_writes_on_the_diesel_writer_thread() {
    let test = "control_normal_loses_acknowledged_writes_on_the_diesel_writer_thread";
    let Some(shim) = shim(test) else { return };
    let disk = Disk::new();
    create(&disk, ACKS_SCHEMA);
    let served = serve_then_kill("normal", 1, &disk, shim, 0, KillWhen::Done);
    let acked = &served.acked;
    assert_eq!(
        acked.len(),
        usize::try_from(CONTROL_WRITES).unwrap(),
        "every control write acknowledged"
    );

    let crashed = acks_after_a_crash(&disk);
    let shadowed = disk.power_loss();
    let (recovered, integrity) = acks_in(&disk.db());
    let lost: Vec<_> = acked
        .iter()
        .filter(|id| !recovered.contains_key(id))
        .collect();
    eprintln!(
        "{test}: {} acknowledged at NORMAL; after a mere crash {} are in the file; after the \
         power loss {} are lost; integrity: {integrity}; shadows: {shadowed:?}",
        acked.len(),
        acked.iter().filter(|id| crashed.contains_key(id)).count(),
        lost.len()
    );
    assert!(
        acked.iter().all(|id| crashed.contains_key(id)),
        "a process crash loses nothing: every acknowledged write is in the files"
    );
    assert!(
        !lost.is_empty(),
        "the simulated power loss lost no acknowledged write at synchronous = NORMAL: the shim \
         does not drop unsynced writes"
    );
    assert_eq!(integrity, "ok", "the recovered file is sound");
    // ... and lost them because the shim dropped what was not synced, not because it tracked
    // nothing: the WAL the child made has a durable image (what of it was synced: its
    // header), which a shim not loaded never keeps (the power loss would then take the WAL
    // whole, synced or not).
    assert!(
        shadowed.contains(&format!("{DB}-wal")),
        "the shim kept no durable image of the WAL: is it loaded? {shadowed:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Fault injection: the child runs a scenario under the shim and fails (non-zero) if it fails
// ---------------------------------------------------------------------------------------------

/// The child side: `fault:<scenario>:<dir>`. Not a test on its own: run by
/// `harness::run_fault_child`; a no-op without its variable.
#[test]
#[ignore = "a child process's entry point, run by the fsync-error tests"]
fn fault_child() {
    let Some([scenario, dir]) = harness::child_job(CHILD, "fault") else {
        return;
    };
    let dir = PathBuf::from(dir);
    child_runtime().block_on(async move {
        match scenario.as_str() {
            "failed-fsync" => failed_fsync(&dir).await,
            other => panic!("unknown scenario {other}"),
        }
    });
}

/// One write through the Diesel writer thread, inserting `name`: `Ok`, or why not.
async fn insert_name(writes: &DieselWriteThread, name: &str) -> Result<usize, DieselError> {
    let name = name.to_owned();
    writes
        .transaction(move |conn| {
            diesel::insert_into(items::table)
                .values(items::name.eq(name))
                .execute(conn)
        })
        .await
}

/// The `name` of every row of `items` at `path`, read on a connection of its own.
fn names_in(path: &Path) -> BTreeSet<String> {
    let mut conn = connect(path);
    items::table
        .select(items::name)
        .load::<String>(&mut conn)
        .expect("read the items")
        .into_iter()
        .collect()
}

/// The shared fsync of the Diesel writer thread fails. A closure that committed while it was
/// held waited for it: it is not acknowledged, and its error says it is the disk's. Every
/// transaction begun after is refused, saying why, and nothing of it is in the file. The
/// writes acknowledged before (`fault: acked <name>`) must survive the power loss that
/// follows; the refused ones (`fault: refused <name>`) must not be there.
async fn failed_fsync(dir: &Path) {
    let path = dir.join(DB);
    let writes = DieselWriteThread::open(&path).expect("the writer thread");
    writes
        .transaction(|conn| conn.batch_execute(ITEMS_SCHEMA))
        .await
        .expect("the schema");
    insert_name(&writes, "first")
        .await
        .expect("the first write");
    say("fault: acked first");
    // A group, acknowledged before the fault.
    let group: Vec<_> = (0..8)
        .map(|i| {
            let writes = writes.clone();
            tokio::spawn(async move { insert_name(&writes, &format!("before-{i}")).await })
        })
        .collect();
    for (i, write) in group.into_iter().enumerate() {
        write.await.unwrap().expect("a write before the fault");
        say(&format!("fault: acked before-{i}"));
    }

    assert!(
        tower_sqlite_retry::__private::hold_diesel_thread_fsync(&writes, true),
        "the Diesel writer thread shares the WAL's fsync (WAL, FULL, group commit on)"
    );
    let before = writes.stats().transactions;
    let t1 = {
        let writes = writes.clone();
        tokio::spawn(async move { insert_name(&writes, "t1").await })
    };
    // Committed (in the file) and its turn given back, which the writer thread does before it
    // hands the closure to the fsync: without both, the fault could be injected before t1
    // waits for the fsync it is meant to fail.
    poll_until("t1 committed, its turn given back", || {
        writes.stats().transactions > before && names_in(&path).contains("t1")
    })
    .await;
    assert!(!t1.is_finished(), "t1 acknowledged before any fsync (held)");

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry::__private::hold_diesel_thread_fsync(&writes, false);
    let t1 = tokio::time::timeout(Duration::from_secs(30), t1)
        .await
        .expect("t1 answered within 30 s of the fsync's release")
        .unwrap();
    say(&format!("fault: t1 (waited for the failed fsync): {t1:?}"));
    let error = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    assert!(
        names_the_disk(&error.to_string()),
        "t1's error names the disk or the fsync: {error}"
    );

    // Every later write to the file is refused: its frames would follow the ones the failed
    // fsync left off the disk, and a power loss would take it with them.
    for name in ["t2", "t3"] {
        let later = insert_name(&writes, name).await;
        say(&format!(
            "fault: {name} (begun after the failure): {later:?}"
        ));
        harness::assert_refused(name, later.map(drop).map_err(|e| e.to_string()));
        say(&format!("fault: refused {name}"));
    }
    say(&format!("fault: stats: {:?}", writes.stats()));
    let names = names_in(&path);
    for name in ["t2", "t3"] {
        assert!(
            !names.contains(name),
            "{name} was refused: nothing of it written: {names:?}"
        );
    }
}

/// A shared fsync that fails under the Diesel writer thread: the closure that waited for it is
/// not `Ok` and names the disk, the next two are refused; after the power loss, every write
/// acknowledged before the failure is in the file, neither refused one is, and the file is
/// sound.
#[test]
fn after_a_failed_fsync_the_diesel_writer_thread_acknowledges_nothing() {
    let test = "after_a_failed_fsync_the_diesel_writer_thread_acknowledges_nothing";
    let Some(shim) = shim(test) else { return };
    let (output, disk) = match harness::run_fault_child(&FAULT, "failed-fsync", shim) {
        Ok(done) => done,
        Err(why) => panic!("{test}: {why}"),
    };
    for line in output.lines().filter(|l| l.contains("fault: ")) {
        eprintln!("{test}: {line}");
    }
    // (the first line the child prints follows the harness' `test fault_child ... `)
    let said = |what: &str| harness::said(&output, what);
    let (acked, refused) = (said("fault: acked "), said("fault: refused "));
    assert!(
        !acked.is_empty(),
        "{test}: the child acknowledged writes before the fault"
    );
    assert_eq!(refused, ["t2", "t3"], "{test}: the child refused t2 and t3");

    // Then the power goes.
    let shadowed = disk.power_loss();
    let mut conn = connect(&disk.db());
    let integrity = integrity(&mut conn);
    drop(conn);
    let names = names_in(&disk.db());
    eprintln!(
        "{test}: after the power loss ({shadowed:?}): {names:?}; integrity: {integrity} (t1, \
         committed but its fsync failed, {})",
        if names.contains("t1") {
            "is there: synced later, after its failed fsync"
        } else {
            "is not there"
        }
    );
    for name in &acked {
        assert!(
            names.contains(name),
            "{test}: {name}, acknowledged before the failed fsync, lost in the power loss: \
             {names:?}"
        );
    }
    for name in &refused {
        assert!(
            !names.contains(name),
            "{test}: {name}, refused, is in the file after the power loss: {names:?}"
        );
    }
    assert_eq!(integrity, "ok", "{test}: the recovered file is sound");
}
