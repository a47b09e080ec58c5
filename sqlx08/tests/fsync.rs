//! A failed fsync of the WAL on the sqlx 0.8 write path: the main crate's fault-injection tests
//! (`tests/write/power_loss.rs`), against sqlx 0.8's driver.
//!
//! The group commit and the refusal after a failed sync are the main crate's one
//! implementation, but the calls that run the `COMMIT`, the shared fsync and the checkpoint on
//! the writer connection are this crate's (`__sqlx_driver!` expanded against sqlx 0.8): a
//! failure that sqlx 0.8 reported differently, or a sync this crate's driver skipped, would not
//! show in the main crate's tests.
//!
//! The child process runs under the main crate's `LD_PRELOAD` shim
//! (`../tests/power_loss/shim.c`, built with `cc` at run time; without one the tests print
//! `SKIPPED:` and pass), which keeps a durable shadow of each file of the database's directory,
//! updated only by `fsync`/`fdatasync`, and makes the WAL's next fsync fail on command
//! (`.ctl/fail-next-fsync:<file>`). Once the child has exited, the test copies each shadow over
//! its file (the power loss) and opens the database afresh: every write the child was told was
//! durable must be there.
//!
//! - `after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit`: two commits
//!   waiting for a shared fsync that fails are not `Ok`, and later writes are refused.
//! - `after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write`: the same with a second
//!   pool on the file, whose fsync never failed: it refuses too.
//!
//! The child is this test binary itself, run with `TSR_SQLX08_FAULT_CHILD` set: the test
//! `fault_child` then does the child's part (without it, it returns).
#![cfg(target_os = "linux")]

use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sqlx::SqlitePool;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry_sqlx08::WritePool;

/// What the child does: `fault:<scenario>:<dir>`.
const CHILD: &str = "TSR_SQLX08_FAULT_CHILD";
/// The child's entry point, by its full name in this test binary.
const FAULT_CHILD: &str = "fault_child";
/// The database's file name, in the shim's directory.
const DB: &str = "db.sqlite";

// ---------------------------------------------------------------------------------------------
// Skips, the shim and the simulated disk
// ---------------------------------------------------------------------------------------------

/// Says that `test` skipped its check, and why, where someone will see it: a `SKIPPED:` line on
/// stderr (libtest shows it only for a failing test), and a line appended to the file
/// `TSR_SKIP_LOG` names, if set, which `.ci/run` counts (the main crate's `common::skipped`:
/// this package cannot use the main crate's test helpers).
fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let line = format!("SKIPPED: {test}: {why}");
    eprintln!("{line}");
    if let Some(path) = std::env::var_os("TSR_SKIP_LOG") {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path);
        // one write per line, in append mode: lines of parallel tests never interleave
        if let Ok(mut log) = log {
            let _ = log.write_all(format!("{line}\n").as_bytes());
        }
    }
}

/// The shim, built once per test process; `None` (after a `SKIPPED:` line) without a C
/// compiler or without the shim's source.
fn shim(test: &str) -> Option<&'static Path> {
    static SHIM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match SHIM.get_or_init(build_shim) {
        Ok(path) => Some(path),
        Err(why) => {
            skipped(test, why);
            None
        }
    }
}

/// Builds the main crate's shim into this package's target directory. Its source is outside
/// this package: a build from the published package alone has none, and says so.
fn build_shim() -> Result<PathBuf, String> {
    let source = Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/power_loss/shim.c"
    ));
    if !source.exists() {
        return Err(format!(
            "no power-loss shim source at {} (outside the main crate's checkout)",
            source.display()
        ));
    }
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("power_loss");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Built under a name of this process's, then renamed: another test process may be loading
    // the previous one.
    let building = dir.join(format!("shim-{}.so", std::process::id()));
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&building)
        .arg(source)
        .args(["-ldl", "-lpthread"])
        .output()
        .map_err(|e| format!("no C compiler to build the power-loss shim (`cc`: {e})"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&building);
        return Err(format!(
            "`cc` could not build the power-loss shim ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let shim = dir.join("shim.so");
    std::fs::rename(&building, &shim).map_err(|e| format!("cannot rename the shim: {e}"))?;
    Ok(shim)
}

/// A database directory the shim tracks (`TSR_SHIM_DIR`), and its durable shadows
/// (`TSR_SHIM_DURABLE`): what each file holds after a power loss.
struct Disk {
    root: tempfile::TempDir,
    dir: PathBuf,
    durable: PathBuf,
}

impl Disk {
    fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("db");
        let durable = root.path().join("durable");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&durable).unwrap();
        Self { root, dir, durable }
    }

    fn db(&self) -> PathBuf {
        self.dir.join(DB)
    }

    /// The file names of both directories (`-shm` aside: it is rebuilt on recovery).
    fn names(&self) -> BTreeSet<String> {
        let mut names = BTreeSet::new();
        for dir in [&self.dir, &self.durable] {
            for entry in std::fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_file() {
                    let name = entry.file_name().into_string().unwrap();
                    if !name.ends_with("-shm") {
                        names.insert(name);
                    }
                }
            }
        }
        names
    }

    /// The power loss, once the child is gone: every file becomes its shadow (no shadow: the
    /// file is gone), `-shm` is deleted. Returns the names that had a shadow.
    fn power_loss(&self) -> BTreeSet<String> {
        let mut shadowed = BTreeSet::new();
        for name in self.names() {
            let shadow = self.durable.join(&name);
            let real = self.dir.join(&name);
            if shadow.exists() {
                std::fs::copy(&shadow, &real).unwrap();
                shadowed.insert(name);
            } else if real.exists() {
                std::fs::remove_file(&real).unwrap();
            }
        }
        let shm = self.dir.join(format!("{DB}-shm"));
        if shm.exists() {
            std::fs::remove_file(shm).unwrap();
        }
        shadowed
    }

    /// The environment of a child under the shim; no fsync delay (the fsync is held and
    /// released by the scenario itself).
    fn shim_env(&self, command: &mut Command, shim: &Path) {
        command
            .env("LD_PRELOAD", shim)
            .env("TSR_SHIM_DIR", &self.dir)
            .env("TSR_SHIM_DURABLE", &self.durable)
            .env("TSR_SHIM_FSYNC_DELAY_US", "0");
    }
}

/// WAL at `FULL` with a busy timeout of 5 s: the settings under which group commit shares
/// the WAL's fsync.
fn options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .busy_timeout(Duration::from_secs(5))
}

// ---------------------------------------------------------------------------------------------
// The child and what its harness said
// ---------------------------------------------------------------------------------------------

/// A child process of this test binary running its entry point `name` (an `#[ignore]`d test)
/// alone, as the main crate's `common::child_test` runs its children.
fn child_test(name: &str) -> Command {
    let mut command = Command::new(std::env::current_exe().expect("this binary"));
    command.args([
        name,
        "--exact",
        "--ignored",
        "--nocapture",
        "--test-threads",
        "1",
    ]);
    command
}

/// What a finished child's harness said about its entry point: a child whose filter matched
/// nothing (a renamed test) says `running 0 tests` and exits 0, so the parent must ask (the
/// main crate's `common::ChildRan`).
#[derive(Debug, Default)]
struct ChildRan {
    started: bool,
    passed: bool,
}

impl ChildRan {
    /// Reads all of the child's output.
    fn output(output: &str) -> Self {
        let mut ran = Self::default();
        for line in output.lines() {
            if line.trim() == "running 1 test" {
                ran.started = true;
            }
            if line.contains("test result: ok. 1 passed") {
                ran.passed = true;
            }
        }
        ran
    }

    /// Panics unless the child ran its one entry point and it passed.
    fn assert_passed(&self, name: &str, output: &str) {
        assert!(
            self.started,
            "the child ran no test: is `{name}` its full name?\n{output}"
        );
        assert!(self.passed, "the child's `{name}` did not pass:\n{output}");
    }
}

/// Runs `scenario` in a child under the shim; `Err` with its output if it failed. Its disk,
/// for the power loss that follows.
fn run_fault_child(scenario: &str, shim: &Path) -> Result<(String, Disk), String> {
    let disk = Disk::new();
    let out_path = disk.root.path().join("child.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let mut command = child_test(FAULT_CHILD);
    command
        .env(CHILD, format!("fault:{scenario}:{}", disk.dir.display()))
        .stdout(out.try_clone().unwrap())
        .stderr(out);
    disk.shim_env(&mut command, shim);
    let mut child = command.spawn().expect("spawn the child");
    // Bounded: a scenario that hangs (a commit that never returns) fails the test, it does not
    // hang it.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(status) if status.success() => {
            // exit 0 is also a child whose filter matched no test: it must say it ran one
            ChildRan::output(&output).assert_passed(FAULT_CHILD, &output);
            Ok((output, disk))
        }
        Some(status) => Err(format!("the child exited {status}:\n{output}")),
        None => Err(format!("the child did not finish within 120 s:\n{output}")),
    }
}

/// The child side: `fault:<scenario>:<dir>`. Not a test on its own: run by
/// [`run_fault_child`]; a no-op without its variable.
#[test]
#[ignore = "a child process's entry point, run by the fsync-error tests"]
fn fault_child() {
    let Some(spec) = std::env::var(CHILD)
        .ok()
        .filter(|s| s.starts_with("fault:"))
    else {
        return;
    };
    let mut parts = spec.splitn(3, ':').skip(1);
    let scenario = parts.next().expect("scenario").to_owned();
    let dir = PathBuf::from(parts.next().expect("dir"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        match scenario.as_str() {
            "failed-fsync" => failed_fsync(&dir).await,
            "failed-fsync-two-pools" => failed_fsync_two_pools(&dir).await,
            other => panic!("unknown scenario {other}"),
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The scenarios (in the child, under the shim)
// ---------------------------------------------------------------------------------------------

/// A sqlx 0.8 pool on `dir/db.sqlite` with the `items` table.
async fn pool(dir: &Path) -> SqlitePool {
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options(&dir.join(DB)))
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// A pool at `FULL` on `dir/db.sqlite`, its write path (group commit on, the default) after a
/// first write, with the shared fsync held. The first write's fsync was not held: it is
/// acknowledged, and must survive the power loss.
async fn held_write_pool(dir: &Path) -> (SqlitePool, WritePool) {
    let pool = pool(dir).await;
    let writes = WritePool::new(pool.clone());
    transaction(&writes, "first")
        .await
        .expect("the first write transaction");
    println!("fault: acked first");
    assert!(
        tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, true),
        "the write path shares the WAL's fsync (WAL, FULL, group commit on)"
    );
    (pool, writes)
}

/// One write transaction inserting `name`: `Ok`, or the step that failed and why.
async fn transaction(writes: &WritePool, name: &str) -> Result<(), String> {
    let mut tx = writes.begin().await.map_err(|e| format!("begin: {e}"))?;
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(&mut *tx)
        .await
        .map_err(|e| format!("insert: {e}"))?;
    tx.commit().await.map_err(|e| format!("commit: {e}"))
}

/// Polls `check` every 2 ms until it holds (a condition, not a guess at timing); panics with
/// `what` after 30 s.
async fn poll_until(what: &str, mut check: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    loop {
        if check().await {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "{what}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Begins on `writes`, inserts `name`, and commits in a task of its own; returns once the
/// `COMMIT` went through (the row is in the file, read through `pool`) and the transaction gave
/// its turn back (which it does after it joined the wait for the shared fsync), with the task,
/// which still waits for its fsync while that is held. Without both conditions, the fault
/// could be injected before the commit waits for the fsync it is meant to fail.
async fn commit_in_background(
    writes: &WritePool,
    pool: &SqlitePool,
    name: &str,
) -> tokio::task::JoinHandle<Result<(), sqlx::Error>> {
    let given_back = writes.stats().map_or(0, |s| s.transactions);
    let mut tx = writes.begin().await.unwrap();
    sqlx::query("INSERT INTO items (name) VALUES (?)")
        .bind(name)
        .execute(&mut *tx)
        .await
        .unwrap();
    let commit = tokio::spawn(tx.commit());
    poll_until(&format!("{name}'s COMMIT went through"), async || {
        let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
            .fetch_all(pool)
            .await
            .unwrap();
        names.iter().any(|n| n == name)
    })
    .await;
    // The row can be in the file before the commit joined the fsync's waiters: the turn comes
    // back only after it did.
    poll_until(&format!("{name}'s turn given back"), async || {
        writes.stats().is_some_and(|s| s.transactions > given_back)
    })
    .await;
    commit
}

/// Runs a shim command (`.ctl/<command>`): the open fails with `NotFound` once it ran.
fn shim_command(dir: &Path, command: &str) {
    let error = std::fs::File::open(dir.join(".ctl").join(command)).expect_err("a shim command");
    assert_eq!(
        error.kind(),
        ErrorKind::NotFound,
        "the shim ran `{command}` ({error}; InvalidInput: unknown command, other: no such file)"
    );
}

/// Whether an error says it is the disk's or the fsync's.
fn names_the_disk(error: &str) -> bool {
    let error = error.to_lowercase();
    error.contains("disk") || error.contains("fsync")
}

/// `later` was refused (the database's writes are, after its WAL failed to sync).
fn assert_refused(name: &str, later: Result<(), String>) {
    let error = later.expect_err(&format!("{name} acknowledged after the WAL failed to sync"));
    assert!(
        error.contains("write refused") && names_the_disk(&error),
        "{name}: refused, saying why: {error}"
    );
}

/// None of `names` is in the file.
async fn assert_not_in_file(pool: &SqlitePool, names: &[&str]) {
    for name in names {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM items WHERE name = ?")
            .bind(name)
            .fetch_one(pool)
            .await
            .unwrap();
        assert_eq!(n, 0, "{name} was refused: nothing of it written");
    }
}

/// The shared fsync itself fails. Both transactions that committed while it was held waited
/// for it: neither is acknowledged, and every later write is refused.
async fn failed_fsync(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    let t2 = commit_in_background(&writes, &pool, "t2").await;
    assert!(
        !t1.is_finished() && !t2.is_finished(),
        "acknowledged before any fsync (held)"
    );

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, false);
    let (t1, t2) = (t1.await.unwrap(), t2.await.unwrap());
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    println!("fault: t2 (waited for the same fsync): {t2:?}");
    let e1 = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    let e2 = t2.expect_err("t2 acknowledged although the fsync it waited for failed");
    for error in [e1, e2] {
        assert!(
            names_the_disk(&error.to_string()),
            "the error names the disk or the fsync: {error}"
        );
    }

    // Every later write to the file is refused: its frames would follow the ones the failed
    // fsync left off the disk, and a power loss would take it with them.
    for name in ["t3", "t4"] {
        let later = transaction(&writes, name).await;
        println!("fault: {name} (begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    println!("fault: stats: {:?}", writes.stats());
    assert_not_in_file(&pool, &["t3", "t4"]).await;
}

/// The failed fsync with two pools on the file (a store holding a `WritePool` per pool): the
/// refusal is the file's, so the pool whose fsync never failed refuses too, as does the first
/// pool again.
async fn failed_fsync_two_pools(dir: &Path) {
    let (pool, writes) = held_write_pool(dir).await;
    let other = WritePool::new(self::pool(dir).await);
    transaction(&other, "other-first")
        .await
        .expect("the second pool writes before the failure");
    println!("fault: acked other-first");
    let t1 = commit_in_background(&writes, &pool, "t1").await;
    assert!(!t1.is_finished(), "acknowledged before any fsync (held)");

    shim_command(dir, &format!("fail-next-fsync:{DB}-wal"));
    tower_sqlite_retry_sqlx08::__private::hold_fsync(&writes, false);
    let t1 = t1.await.unwrap();
    println!("fault: t1 (waited for the failed fsync): {t1:?}");
    let error = t1.expect_err("t1 acknowledged although the fsync it waited for failed");
    assert!(
        names_the_disk(&error.to_string()),
        "t1's error names the disk or the fsync: {error}"
    );

    for name in ["t3-other", "t4-other"] {
        let later = transaction(&other, name).await;
        println!("fault: {name} (the other pool, begun after the failure): {later:?}");
        assert_refused(name, later);
    }
    let later = transaction(&writes, "t5").await;
    println!("fault: t5 (the first pool again): {later:?}");
    assert_refused("t5", later);
    println!("fault: stats: {:?} {:?}", writes.stats(), other.stats());
    assert_not_in_file(&pool, &["t3-other", "t4-other", "t5"]).await;
}

// ---------------------------------------------------------------------------------------------
// The tests (the parent: the child, then the power loss)
// ---------------------------------------------------------------------------------------------

/// Runs `scenario` in a child under the shim (it fails if the scenario fails), then the power
/// loss: every write the child printed as acknowledged (`fault: acked <name>`) must be in the
/// file a fresh process recovers.
fn fault_test(test: &str, scenario: &str) {
    let Some(shim) = shim(test) else { return };
    let (output, disk) = match run_fault_child(scenario, shim) {
        Ok(done) => done,
        Err(why) => panic!("{test}: {why}"),
    };
    for line in output.lines().filter(|l| l.starts_with("fault:")) {
        eprintln!("{test}: {line}");
    }
    // A write acknowledged after the failure, were there one, would be lost with the frames
    // the failed fsync left off the disk.
    let acked: Vec<&str> = output
        .lines()
        // (the first line the child prints follows the harness' `test ... ` on its line)
        .filter_map(|l| l.split_once("fault: acked ").map(|(_, name)| name.trim()))
        .collect();
    assert!(
        !acked.is_empty(),
        "{test}: the child acknowledged a write before the fault"
    );
    let shadowed = disk.power_loss();
    let names = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(names_in(&disk.db()));
    eprintln!("{test}: after the power loss ({shadowed:?}): {names:?}");
    for name in acked {
        assert!(
            names.contains(name),
            "{test}: {name}, acknowledged, lost in the power loss after the fault: {names:?}"
        );
    }
}

/// The `name` of every row of `items`, as a fresh process with sqlx 0.8 finds the file (SQLite
/// recovers it).
async fn names_in(path: &Path) -> BTreeSet<String> {
    let pool = SqlitePoolOptions::new()
        .max_connections(1)
        .connect_with(options(path))
        .await
        .unwrap();
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM items")
        .fetch_all(&pool)
        .await
        .unwrap();
    pool.close().await;
    names.into_iter().collect()
}

/// A shared fsync that fails: the two commits that waited for it are not `Ok` and name the
/// disk, the next two writes are refused and nothing of them is in the file; the write
/// acknowledged before survives the power loss.
#[test]
fn after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit() {
    fault_test(
        "after_a_failed_fsync_later_commits_are_not_acknowledged_by_group_commit",
        "failed-fsync",
    );
}

/// The same with a second pool on the file: after the first pool's fsync failed, the second
/// pool's writes are refused too (and the first pool's); both pools' writes acknowledged before
/// survive the power loss.
#[test]
fn after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write() {
    fault_test(
        "after_a_failed_fsync_no_pool_on_the_file_acknowledges_a_write",
        "failed-fsync-two-pools",
    );
}
