//! The power-loss harness: a disk with a volatile write cache, simulated, and the child
//! processes that write to it. Shared, driver-independent, by the three power-loss tests, each
//! of which includes this file with `#[path = "..."] mod harness;`:
//!
//! - `tests/write/power_loss.rs` (the main crate, sqlx 0.9 and the rusqlite writer thread),
//! - `sqlx08/tests/fsync.rs` (the companion crate, sqlx 0.8),
//! - `tests/stacks/diesel/tests/power_loss.rs` (the Diesel writer thread).
//!
//! A process crash (SIGKILL) leaves what the process wrote to the kernel; a power loss also
//! drops what the kernel had not written back: only what an fsync made durable is left. The
//! child runs under the `LD_PRELOAD` shim next to this file (`shim.c`, built with `cc` at run
//! time into the target directory; without a C compiler the tests print `SKIPPED:`, append a
//! line to the file `TSR_SKIP_LOG` names, and pass), which keeps, for every file of the
//! database's directory, a "durable shadow" updated only by `fsync`/`fdatasync`, and runs the
//! fault commands opened under `.ctl/` (`fail-next-fsync:<file>`, `writeback-error:<file>`).
//! Once the child is gone, [`Disk::power_loss`] copies each shadow over its file (a file
//! without one is deleted, as is `-shm`): SQLite then recovers what a machine that lost power
//! would have found.
//!
//! The child is the test binary itself, running one `#[ignore]`d entry point alone, its job in
//! an environment variable of the test's (`<kind>:<field>:...`, read with [`child_job`]). A
//! child whose filter matched nothing (a renamed entry point) says `running 0 tests` and exits
//! 0: its parent checks with [`ChildRan`] that it ran its one test. Kill points are seeded
//! ([`seed`]: `TSR_POWER_LOSS_SEED` replays them).
//!
//! What the child writes, how it is killed, and what must be in the file after the power loss
//! are each test's own. Only std and `tempfile` (a dev-dependency of all three packages) are
//! used here.

// Each package uses part of the harness (the sqlx 0.8 tests kill no serving child and need no
// seed; the Diesel tests have a fault test of their own): what one leaves unused is not dead.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{Debug, Display};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The database's file name, in the shim's directory.
pub(crate) const DB: &str = "db.sqlite";
/// Replays the kill points of the tests that kill a serving child at a random moment.
pub(crate) const SEED: &str = "TSR_POWER_LOSS_SEED";
/// The shim's source, built at run time (see [`shim`]).
const SHIM_SOURCE: &str = include_str!("shim.c");

// ---------------------------------------------------------------------------------------------
// Skips and the shim
// ---------------------------------------------------------------------------------------------

/// Says that `test` skipped its check, and why, where someone will see it: a `SKIPPED:` line on
/// stderr (libtest shows it only for a failing test), and a line appended to the file
/// `TSR_SKIP_LOG` names, if set, which `.ci/run` counts and, with `CI_STRICT=1`, fails on (the
/// main crate's `common::skipped`, which the other packages cannot use).
pub(crate) fn skipped(test: &str, why: &str) {
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
/// compiler.
pub(crate) fn shim(test: &str) -> Option<&'static Path> {
    static SHIM: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match SHIM.get_or_init(build_shim) {
        Ok(path) => Some(path),
        Err(why) => {
            skipped(test, why);
            None
        }
    }
}

/// Builds the shim into the target directory (`CARGO_TARGET_TMPDIR/power_loss/shim.so`), from
/// its source as this file was compiled with.
fn build_shim() -> Result<PathBuf, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("power_loss");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // Built under a name of this process's, then renamed: another test process (of this
    // package, or of another sharing the target directory) may be loading the previous one.
    let source = dir.join(format!("shim-{}.c", std::process::id()));
    std::fs::write(&source, SHIM_SOURCE)
        .map_err(|e| format!("cannot write {}: {e}", source.display()))?;
    let building = dir.join(format!("shim-{}.so", std::process::id()));
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&building)
        .arg(&source)
        .args(["-ldl", "-lpthread"])
        .output();
    let _ = std::fs::remove_file(&source);
    let out = out.map_err(|e| format!("no C compiler to build the power-loss shim (`cc`: {e})"))?;
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

// ---------------------------------------------------------------------------------------------
// The simulated disk
// ---------------------------------------------------------------------------------------------

/// A database directory the shim tracks (`TSR_SHIM_DIR`), and its durable shadows
/// (`TSR_SHIM_DURABLE`): what each file holds after a power loss. Both are in `root`, a
/// temporary directory deleted with the value.
pub(crate) struct Disk {
    pub(crate) root: tempfile::TempDir,
    pub(crate) dir: PathBuf,
    pub(crate) durable: PathBuf,
    /// For several processes writing its files at once: the shim's shared journals of dirty
    /// ranges (`TSR_SHIM_SHARED`), so that a sync by any process makes every process's writes
    /// durable, as the kernel's page cache does.
    shared: Option<PathBuf>,
}

impl Disk {
    pub(crate) fn new() -> Self {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("db");
        let durable = root.path().join("durable");
        std::fs::create_dir(&dir).unwrap();
        std::fs::create_dir(&durable).unwrap();
        Self {
            root,
            dir,
            durable,
            shared: None,
        }
    }

    /// A disk that several processes write at once (see `shared`).
    pub(crate) fn shared_by_processes() -> Self {
        let mut disk = Self::new();
        let shared = disk.root.path().join("journals");
        std::fs::create_dir(&shared).unwrap();
        disk.shared = Some(shared);
        disk
    }

    /// The database's path ([`DB`] in the shim's directory).
    pub(crate) fn db(&self) -> PathBuf {
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
    pub(crate) fn power_loss(&self) -> BTreeSet<String> {
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
        // What was dirty went with the power.
        if let Some(shared) = &self.shared {
            for journal in std::fs::read_dir(shared).unwrap() {
                std::fs::remove_file(journal.unwrap().path()).unwrap();
            }
        }
        shadowed
    }

    /// What this process (not under the shim) did to the files is durable: every shadow
    /// becomes its file (no file: no shadow).
    pub(crate) fn settle(&self) {
        for name in self.names() {
            let shadow = self.durable.join(&name);
            let real = self.dir.join(&name);
            if real.exists() {
                std::fs::copy(&real, &shadow).unwrap();
            } else if shadow.exists() {
                std::fs::remove_file(&shadow).unwrap();
            }
        }
    }

    /// What a process crash alone (no power loss) would leave: the database and its WAL as
    /// they are, copied into a directory of their own, where the test recovers [`DB`].
    pub(crate) fn crash_copy(&self) -> tempfile::TempDir {
        let copy = tempfile::tempdir().unwrap();
        for name in [DB.to_owned(), format!("{DB}-wal")] {
            let real = self.dir.join(&name);
            if real.exists() {
                std::fs::copy(&real, copy.path().join(&name)).unwrap();
            }
        }
        copy
    }

    /// The environment of a child under the shim, on a disk whose every fsync of a tracked
    /// file takes `fsync_delay_us` more.
    pub(crate) fn shim_env(&self, command: &mut Command, shim: &Path, fsync_delay_us: u64) {
        command
            .env("LD_PRELOAD", shim)
            .env("TSR_SHIM_DIR", &self.dir)
            .env("TSR_SHIM_DURABLE", &self.durable)
            .env("TSR_SHIM_FSYNC_DELAY_US", fsync_delay_us.to_string());
        if let Some(shared) = &self.shared {
            command.env("TSR_SHIM_SHARED", shared);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The child and what its harness said
// ---------------------------------------------------------------------------------------------

/// A child process of this test binary running its entry point `name` (an `#[ignore]`d test,
/// by its full name) alone, as the main crate's `common::child_test` runs its children.
pub(crate) fn child_test(name: &str) -> Command {
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

/// The child `entry` with its job (`var` = `job`) under the shim on `disk`, its stdin closed;
/// its stdout and stderr are the caller's to set.
pub(crate) fn child_command(
    var: &str,
    entry: &str,
    job: &str,
    disk: &Disk,
    shim: &Path,
    fsync_delay_us: u64,
) -> Command {
    let mut command = child_test(entry);
    command.env(var, job).stdin(Stdio::null());
    disk.shim_env(&mut command, shim, fsync_delay_us);
    command
}

/// In the child: the `N` fields of its job when `var` holds `<kind>:<field>:...` (the last
/// field is the rest, `:` and all: a path); `None` without the variable or for another kind,
/// when the entry point returns at once (it is then a test run without its parent).
pub(crate) fn child_job<const N: usize>(var: &str, kind: &str) -> Option<[String; N]> {
    let job = std::env::var(var).ok()?;
    let fields = job.strip_prefix(kind)?.strip_prefix(':')?;
    let fields: Vec<String> = fields.splitn(N, ':').map(str::to_owned).collect();
    Some(
        fields
            .try_into()
            .unwrap_or_else(|_| panic!("{var}={job}: not {N} fields after `{kind}:`")),
    )
}

/// What a child's harness said about its entry point, read line by line: a child whose filter
/// matched nothing (a renamed test) says `running 0 tests` and exits 0, so the parent must ask
/// (the main crate's `common::ChildRan`).
#[derive(Debug, Default)]
pub(crate) struct ChildRan {
    started: bool,
    passed: bool,
}

impl ChildRan {
    /// Reads one line of the child's output.
    pub(crate) fn line(&mut self, line: &str) {
        if line.trim() == "running 1 test" {
            self.started = true;
        }
        if line.contains("test result: ok. 1 passed") {
            self.passed = true;
        }
    }

    /// All of a finished child's output.
    pub(crate) fn output(output: &str) -> Self {
        let mut ran = Self::default();
        output.lines().for_each(|l| ran.line(l));
        ran
    }

    /// Panics unless the child started its one entry point (`output`: what it said, for the
    /// message).
    pub(crate) fn assert_started(&self, name: &str, output: &str) {
        assert!(
            self.started,
            "the child ran no test: is `{name}` its full name?\n{output}"
        );
    }

    /// Panics unless the child ran its one entry point and it passed.
    pub(crate) fn assert_passed(&self, name: &str, output: &str) {
        self.assert_started(name, output);
        assert!(self.passed, "the child's `{name}` did not pass:\n{output}");
    }
}

// ---------------------------------------------------------------------------------------------
// Fault injection: the child runs a scenario under the shim and fails (non-zero) if it fails
// ---------------------------------------------------------------------------------------------

/// A test binary's fault child: the variable that names its job (`fault:<scenario>:<dir>`),
/// the entry point's full name, and how long it may run.
#[derive(Debug)]
pub(crate) struct FaultChild {
    pub(crate) var: &'static str,
    pub(crate) entry: &'static str,
    pub(crate) timeout: Duration,
}

/// Runs `scenario` in the fault child under the shim, on a fresh disk, with no fsync delay (the
/// scenario holds and releases the fsync itself); `Err` with its output if it failed. Its
/// output and its disk, for the power loss that follows.
pub(crate) fn run_fault_child(
    child: &FaultChild,
    scenario: &str,
    shim: &Path,
) -> Result<(String, Disk), String> {
    let disk = Disk::new();
    let out_path = disk.root.path().join("child.out");
    let out = std::fs::File::create(&out_path).unwrap();
    let job = format!("fault:{scenario}:{}", disk.dir.display());
    let mut command = child_command(child.var, child.entry, &job, &disk, shim, 0);
    command.stdout(out.try_clone().unwrap()).stderr(out);
    let mut process = command.spawn().expect("spawn the child");
    // Bounded: a scenario that hangs (a commit that is never answered) fails the test, it does
    // not hang it.
    let started = Instant::now();
    let status = loop {
        if let Some(status) = process.try_wait().unwrap() {
            break Some(status);
        }
        if started.elapsed() > child.timeout {
            let _ = process.kill();
            let _ = process.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let output = std::fs::read_to_string(&out_path).unwrap_or_default();
    match status {
        Some(status) if status.success() => {
            // exit 0 is also a child whose filter matched no test: it must say it ran one
            ChildRan::output(&output).assert_passed(child.entry, &output);
            Ok((output, disk))
        }
        Some(status) => Err(format!("the child exited {status}:\n{output}")),
        None => Err(format!(
            "the child did not finish within {} s:\n{output}",
            child.timeout.as_secs()
        )),
    }
}

/// What follows `what` on each line of the child's output that has it, trimmed (the first line
/// the child prints follows the harness' `test ... ` on its line).
pub(crate) fn said(output: &str, what: &str) -> Vec<String> {
    output
        .lines()
        .filter_map(|l| l.split_once(what).map(|(_, rest)| rest.trim().to_owned()))
        .collect()
}

/// Runs `scenario` in the fault child under the shim (it fails if the scenario fails), then the
/// power loss: every write the child printed as acknowledged (`fault: acked <name>`) must be
/// among `names_in` the recovered file (a write acknowledged after the failure, were there one,
/// would be lost with the frames the failed fsync left off the disk).
pub(crate) fn fault_test(
    test: &str,
    child: &FaultChild,
    scenario: &str,
    names_in: impl FnOnce(&Path) -> BTreeSet<String>,
) {
    let Some(shim) = shim(test) else { return };
    let (output, disk) = match run_fault_child(child, scenario, shim) {
        Ok(done) => done,
        Err(why) => panic!("{test}: {why}"),
    };
    for line in output.lines().filter(|l| l.starts_with("fault:")) {
        eprintln!("{test}: {line}");
    }
    let acked = said(&output, "fault: acked ");
    assert!(
        !acked.is_empty(),
        "{test}: the child acknowledged a write before the fault"
    );
    let shadowed = disk.power_loss();
    let names = names_in(&disk.db());
    eprintln!("{test}: after the power loss ({shadowed:?}): {names:?}");
    for name in acked {
        assert!(
            names.contains(&name),
            "{test}: {name}, acknowledged, lost in the power loss after the fault: {names:?}"
        );
    }
}

/// Runs a shim command (`.ctl/<command>` in the shim's directory `dir`): the open fails with
/// `NotFound` once it ran.
pub(crate) fn shim_command(dir: &Path, command: &str) {
    let error = std::fs::File::open(dir.join(".ctl").join(command)).expect_err("a shim command");
    assert_eq!(
        error.kind(),
        ErrorKind::NotFound,
        "the shim ran `{command}` ({error}; InvalidInput: unknown command, other: no such file)"
    );
}

/// Whether an error says it is the disk's or the fsync's.
pub(crate) fn names_the_disk(error: &str) -> bool {
    let error = error.to_lowercase();
    error.contains("disk") || error.contains("fsync")
}

/// `later` was refused (the database's writes are, after its WAL failed to sync), saying why.
pub(crate) fn assert_refused(name: &str, later: Result<(), String>) {
    let error = later.expect_err(&format!("{name} acknowledged after the WAL failed to sync"));
    assert!(
        error.contains("write refused") && names_the_disk(&error),
        "{name}: refused, saying why: {error}"
    );
}

// ---------------------------------------------------------------------------------------------
// The rounds of a test that kills a serving child: what each must find in the file
// ---------------------------------------------------------------------------------------------

/// One round as found in the file after the power loss: what the test reports, and asserts
/// on in its own words (nothing lost).
pub(crate) struct Round {
    /// Acknowledged ids not in the file.
    pub(crate) lost: Vec<i64>,
    /// The round's rows (ids from its `base`) after the power loss.
    pub(crate) rows: usize,
    /// The round's rows after a mere crash (SIGKILL, nothing dropped).
    pub(crate) crash_rows: usize,
}

/// The rounds so far of a test that kills a serving child: [`Rounds::check`] checks each,
/// [`Rounds::finish`] all of them.
#[derive(Default)]
pub(crate) struct Rounds {
    acked: usize,
    rows: usize,
    wal_shadows: usize,
}

impl Rounds {
    /// Checks one round: `acked`, the ids the child acknowledged before the kill; `recovered`
    /// and `crashed`, each id's rows in the file after the power loss and after a mere crash;
    /// `base`, the round's first id; `shadowed`, the files the power loss restored from their
    /// durable shadow. Asserts that no id is in the file twice and that the power loss kept
    /// nothing a crash would not (the simulator's own check).
    pub(crate) fn check<V>(
        &mut self,
        round: impl Display,
        acked: &BTreeSet<i64>,
        recovered: &BTreeMap<i64, V>,
        crashed: &BTreeMap<i64, V>,
        base: i64,
        shadowed: &BTreeSet<String>,
    ) -> Round
    where
        V: Copy + PartialOrd + From<u8> + Debug,
    {
        let lost = acked
            .iter()
            .filter(|id| !recovered.contains_key(id))
            .copied()
            .collect();
        let doubled: Vec<_> = recovered.iter().filter(|(_, n)| **n > V::from(1)).collect();
        assert!(
            doubled.is_empty(),
            "round {round}: in the file twice: {doubled:?}"
        );
        let beyond_crash: Vec<_> = recovered
            .keys()
            .filter(|id| !crashed.contains_key(id))
            .collect();
        assert!(
            beyond_crash.is_empty(),
            "round {round}: the simulator is broken: rows after the power loss that a crash \
             would not keep: {beyond_crash:?}"
        );
        if shadowed.contains(&format!("{DB}-wal")) {
            self.wal_shadows += 1;
        }
        self.acked += acked.len();
        self.rows = recovered.len();
        Round {
            lost,
            rows: recovered.keys().filter(|id| **id >= base).count(),
            crash_rows: crashed.keys().filter(|id| **id >= base).count(),
        }
    }

    /// After the last round: says what was checked, and asserts that the test tested
    /// something: writes were acknowledged, rows survived, and the WAL was synced through the
    /// shim (a shim that did nothing would leave no shadow of it, and no row after a power
    /// loss).
    pub(crate) fn finish(self, test: &str, rounds: impl Display) {
        let Self {
            acked,
            rows,
            wal_shadows,
        } = self;
        eprintln!(
            "{test}: {acked} writes acknowledged in {rounds} rounds, none lost; {rows} rows in \
             the file; the WAL had a durable shadow at {wal_shadows} of the power losses"
        );
        assert!(acked > 0, "the child acknowledged writes between kills");
        assert!(rows > 0, "rows survived the power losses");
        assert!(
            wal_shadows > 0,
            "the WAL was synced through the shim in some round"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Seeded kill points
// ---------------------------------------------------------------------------------------------

/// The seed of the kill points: `TSR_POWER_LOSS_SEED`, or the clock's (the test prints it).
pub(crate) fn seed() -> u64 {
    std::env::var(SEED)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            now.as_secs() ^ u64::from(now.subsec_nanos())
        })
}

/// splitmix64: the kill points, from the seed (no random number crate is a dev-dependency of
/// every package that includes this file).
#[derive(Debug)]
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub(crate) fn between(&mut self, (lo, hi): (u64, u64)) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}
