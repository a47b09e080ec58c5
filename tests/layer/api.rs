//! The public API's shape, as `docs/semver.md` states it: the crate root is exactly the list
//! that page gives; nothing is deprecated; the only hidden items are the `__private` module
//! and the companion crate's two macros; setters, off-switches and getters follow the page's
//! conventions; and every item the page's module table names is where it says.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).to_path_buf()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("a readable directory") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The library's sources: this crate's and the companion crate's.
fn library_sources() -> Vec<PathBuf> {
    let mut files = sources(&root().join("src"));
    files.extend(sources(&root().join("sqlx08/src")));
    files
}

/// The root's public re-exports, read from `src/lib.rs`: every name in a `pub use` that is not
/// `#[doc(hidden)]` (the deprecated old paths are), and every `pub mod`.
fn root_items() -> (Vec<String>, Vec<String>) {
    let lib = read(&root().join("src/lib.rs"));
    let (mut items, mut modules) = (Vec::new(), Vec::new());
    let mut hidden = false;
    let mut statement = String::new();
    for raw in lib.lines() {
        let line = raw.trim();
        // Only the root's own statements: a nested module's (indented) are its own.
        if line.starts_with("//") || (statement.is_empty() && raw.starts_with(' ')) {
            continue;
        }
        if line == "#[doc(hidden)]" {
            hidden = true;
            continue;
        }
        if let Some(name) = line.strip_prefix("pub mod ") {
            modules.push(name.trim_end_matches(';').to_owned());
        }
        if line.starts_with("pub use ") || !statement.is_empty() {
            statement.push_str(line);
            statement.push(' ');
            if line.ends_with(';') {
                if !hidden {
                    items.extend(names(&statement));
                }
                statement.clear();
                hidden = false;
            }
            continue;
        }
        if !line.starts_with("#[") {
            hidden = false;
        }
    }
    modules.sort();
    modules.dedup();
    (items, modules)
}

/// The names a `pub use path::{a, b};` or `pub use path::a;` statement brings in.
fn names(statement: &str) -> Vec<String> {
    let body = statement
        .trim()
        .trim_start_matches("pub use ")
        .trim_end_matches(';');
    let list = match body.find('{') {
        Some(open) => &body[open + 1..body.rfind('}').expect("a closing brace")],
        None => body.rsplit("::").next().expect("a name"),
    };
    list.split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(|name| name.rsplit(" as ").next().unwrap_or(name).to_owned())
        .collect()
}

/// The root's items as `docs/semver.md` lists them (the backquoted names of its "The crate
/// root" paragraph).
fn documented_root() -> Vec<String> {
    let page = read(&root().join("docs/semver.md"));
    let start = page
        .find("**The crate root**")
        .expect("docs/semver.md: the crate root");
    let paragraph = &page[start..start + page[start..].find("\n\n").expect("a paragraph")];
    let mut names: Vec<String> = paragraph
        .split('`')
        .skip(1)
        .step_by(2)
        .filter(|name| !name.contains('-'))
        .map(str::to_owned)
        .collect();
    names.sort();
    names
}

#[test]
fn the_root_is_what_docs_semver_md_says() {
    let (mut items, modules) = root_items();
    items.sort();
    assert_eq!(
        items,
        documented_root(),
        "src/lib.rs against docs/semver.md"
    );
    assert!(items.len() <= 20, "{} items at the crate root", items.len());
    for module in ["body", "classify", "future", "metrics", "policy", "write"] {
        assert!(
            modules.contains(&module.to_owned()),
            "{module}: {modules:?}"
        );
    }
}

/// The reader itself: every name of a statement counts.
#[test]
fn the_reader_counts_every_name_of_a_statement() {
    assert_eq!(
        names("pub use a::{B, c as d, e::F};"),
        ["B", "d", "e::F"].map(str::to_owned)
    );
    assert_eq!(names("pub use self::x::Y;"), ["Y"]);
}

/// The attribute lines of the library that make an item deprecated or hidden, with where.
fn attributes(needle: &str) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for file in library_sources() {
        let text = read(&file);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim();
            if code.starts_with("//") || !code.contains(needle) {
                continue;
            }
            // The item the attribute is on: the next line that is not an attribute or a doc
            // comment.
            let item = lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .find(|l| !l.starts_with("#[") && !l.starts_with("///"))
                .unwrap_or_default();
            found.push((
                format!("{}:{}", file.strip_prefix(root()).unwrap().display(), i + 1),
                item.to_owned(),
            ));
        }
    }
    found
}

#[test]
fn nothing_is_deprecated() {
    let found = attributes("#[deprecated");
    assert!(found.is_empty(), "deprecated items: {found:#?}");
    let manifest = read(&root().join("Cargo.toml"));
    assert!(
        !manifest.to_lowercase().contains("## deprecated"),
        "a deprecated feature in Cargo.toml"
    );
}

#[test]
fn the_only_hidden_items_are_the_private_module_and_the_companion_macros() {
    let allowed = [
        "pub mod __private {",
        "macro_rules! __sqlx_driver {",
        "macro_rules! __write_wrappers {",
    ];
    let wrong: Vec<_> = attributes("#[doc(hidden)]")
        .into_iter()
        .filter(|(_, item)| !allowed.contains(&item.as_str()))
        .collect();
    assert!(
        wrong.is_empty(),
        "hidden items besides __private: {wrong:#?}"
    );
}

/// Public functions named against the conventions: a `get_` getter (but tower's `get_ref` and
/// `get_mut` of a wrapper, C-GETTER's exception), a `without_` or `disable_` off-switch (it is
/// `no_<name>`), a setter that takes an `Option` to mean off. `__private` (the generic write
/// path, `src/write/sqlx/pool.rs`) is no API and is left out.
#[test]
fn names_follow_the_conventions() {
    let mut wrong = Vec::new();
    for file in library_sources() {
        if file.ends_with("src/write/sqlx/pool.rs") {
            continue;
        }
        let text = read(&file);
        for (i, line) in text.lines().enumerate() {
            let code = line.trim();
            let Some(rest) = code.strip_prefix("pub fn ") else {
                continue;
            };
            let name = rest.split(['(', '<']).next().unwrap_or_default();
            let takes_option = code.contains("(self,") && code.contains(": Option<")
                || code.contains("(mut self,") && code.contains(": Option<")
                || code.contains("(self, ") && code.contains("::std::option::Option<");
            if (name.starts_with("get_") && name != "get_ref" && name != "get_mut")
                || name.starts_with("without_")
                || name.starts_with("disable_")
                || takes_option
            {
                wrong.push(format!(
                    "{}:{}: {code}",
                    file.strip_prefix(root()).unwrap().display(),
                    i + 1
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "against docs/semver.md's conventions: {wrong:#?}"
    );
}

/// Every item the module table of `docs/semver.md` names is at that path (it compiles), and
/// the off-switches are spelt as the page says.
#[test]
#[allow(unused_imports)]
fn the_modules_hold_what_docs_semver_md_says() {
    use tower_sqlite_retry::body::ReplayBody;
    use tower_sqlite_retry::classify::{
        ClassifyError, DriverError, NeverRetryErrors, RetryDriverErrors, Retryable,
        classify_error_chain, classify_mysql_code, classify_postgres_code, classify_sqlite_code,
        mysql_code_name, postgres_code_name, sqlite_code_name, tag_retryable,
    };
    use tower_sqlite_retry::future::{InRequest, ResponseFuture};
    use tower_sqlite_retry::metrics::{
        HISTOGRAM_BUCKETS, MetricsSnapshot, Outcome, RetryMetrics, RetryOutcome,
    };
    use tower_sqlite_retry::policy::{
        Admission, AdmissionLimit, InvalidPolicy, Jitter, ReadLimit, RetryPolicy,
    };
    use tower_sqlite_retry::write::{
        GroupCommitFailed, TurnError, WritePool, WriteQueue, WriteStats, WriteThread,
        WriteThreadOptions, WriteTransaction, WriteTurn, WriterConnection,
    };

    let _ = RetryPolicy::default().no_budget().no_replay_gate();
    let _ = tower_sqlite_retry::SqliteRetryLayer::default().no_read_limit();
    let _: fn(WritePool, bool) -> WritePool = WritePool::group_commit;
    let _: fn(WritePool) -> WritePool = WritePool::no_slow_transaction_report;
    let _: fn(WritePool, std::time::Duration) -> WritePool = WritePool::slow_transaction;
    // `rusqlite-write` (on in this test build): the writer thread and its options, which
    // spell their setters as the page says. (`DieselWriteThread`, `diesel-write`, is checked in
    // the Diesel stack package, which can link Diesel's SQLite.)
    type Options = WriteThreadOptions;
    let _: fn(Options, std::time::Duration) -> Options = Options::busy_timeout;
    let _: fn(Options, bool) -> Options = Options::group_commit;
    let _: fn(Options) -> Options = Options::synchronous_normal;
    let _: fn(Options, std::time::Duration) -> Options = Options::slow_transaction;
    let _: fn(&WriteThread) -> WriteStats = WriteThread::stats;
    // Several processes on one file: how often and how long this process's writers waited for
    // another process's turn.
    let _: fn(&WriteStats) -> (u64, std::time::Duration) = |s| (s.process_waits, s.process_waited);
    let _: fn(&WriteThread) -> &Path = WriteThread::path;
    assert_eq!(sqlite_code_name(517), "SQLITE_BUSY_SNAPSHOT");
    assert!(
        RetryDriverErrors
            .classify_error(&sqlx::Error::PoolTimedOut)
            .is_some()
    );
}

/// A read limit that would never let a read wait is refused, with the reason.
#[test]
#[should_panic(expected = "max_wait is zero")]
fn a_zero_read_wait_is_refused_by_the_layer() {
    use tower_sqlite_retry::SqliteRetryLayer;
    use tower_sqlite_retry::policy::ReadLimit;

    let limit = ReadLimit::new(std::num::NonZeroUsize::MIN).max_wait(std::time::Duration::ZERO);
    let _ = SqliteRetryLayer::default().limit_reads_while_writers_wait(limit);
}

/// A `RetryMetrics` is one reference-counted pointer: applications keep it in their axum state,
/// which axum clones two or three times per request, so each field more would be one more
/// atomic add and subtract per clone on a counter every request shares.
#[test]
fn a_metrics_handle_is_one_pointer() {
    assert_eq!(
        std::mem::size_of::<tower_sqlite_retry::RetryMetrics>(),
        std::mem::size_of::<usize>()
    );
}
