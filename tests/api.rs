//! The public API's shape: the crate root lists what the README's examples write (at most
//! twenty items), and every path that moved still compiles, deprecated, as the same item.

use std::path::Path;

/// The root's public re-exports, read from `src/lib.rs`: every name in a `pub use` that is not
/// `#[doc(hidden)]` (the deprecated old paths are), and every `pub mod`.
fn root_items() -> (Vec<String>, Vec<String>) {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
        .expect("src/lib.rs");
    let (mut items, mut modules) = (Vec::new(), Vec::new());
    let mut hidden = false;
    let mut statement = String::new();
    for line in lib.lines().map(str::trim) {
        if line.starts_with("//") {
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

#[test]
fn the_root_lists_at_most_twenty_items() {
    let (items, modules) = root_items();
    assert!(
        items.len() <= 20,
        "{} items at the crate root: {items:?}",
        items.len()
    );
    assert!(items.contains(&"SqliteRetryLayer".to_owned()), "{items:?}");
    assert!(items.contains(&"DriverError".to_owned()), "{items:?}");
    for module in ["body", "classify", "future", "metrics", "policy", "write"] {
        assert!(
            modules.contains(&module.to_owned()),
            "{module}: {modules:?}"
        );
    }
}

/// The reader itself: a root with one more item than the limit is refused.
#[test]
fn the_reader_counts_every_name_of_a_statement() {
    assert_eq!(
        names("pub use a::{B, c as d, e::F};"),
        ["B", "d", "e::F"].map(str::to_owned)
    );
    assert_eq!(names("pub use self::x::Y;"), ["Y"]);
}

/// Every old root path still names the same item (compiles, with a deprecation warning that
/// this file allows).
#[test]
#[allow(deprecated)]
fn old_root_paths_name_the_same_items() {
    use tower_sqlite_retry as root;

    fn same<T: 'static, U: 'static>() -> bool {
        std::any::TypeId::of::<T>() == std::any::TypeId::of::<U>()
    }
    assert!(same::<root::Admission, root::policy::Admission>());
    assert!(same::<root::AdmissionLimit, root::policy::AdmissionLimit>());
    assert!(same::<root::InvalidPolicy, root::policy::InvalidPolicy>());
    assert!(same::<root::Outcome, root::metrics::Outcome>());
    assert!(same::<root::RetryOutcome, root::metrics::RetryOutcome>());
    assert!(same::<root::MetricsSnapshot, root::metrics::MetricsSnapshot>());
    assert!(same::<
        root::ReplayBody<String>,
        root::body::ReplayBody<String>,
    >());
    assert!(same::<
        root::InRequest<std::future::Ready<()>>,
        root::future::InRequest<std::future::Ready<()>>,
    >());
    assert!(same::<root::WriteQueue, root::write::WriteQueue>());
    assert!(same::<root::WriteTurn, root::write::WriteTurn>());
    assert!(same::<root::TurnError, root::write::TurnError>());
    assert!(same::<root::WriteStats, root::write::WriteStats>());
    assert_eq!(root::HISTOGRAM_BUCKETS, root::metrics::HISTOGRAM_BUCKETS);
    assert!(matches!(root::policy::Admission::Off, root::Admission::Off));

    assert_eq!(root::sqlite_code_name(517), "SQLITE_BUSY_SNAPSHOT");
    assert_eq!(root::postgres_code_name("40001"), "serialization_failure");
    assert_eq!(root::mysql_code_name(1213), "ER_LOCK_DEADLOCK");
    assert!(root::classify_sqlite_code(5, "database is locked").is_some());
    assert!(root::classify_postgres_code("40P01").is_some());
    assert!(root::classify_mysql_code(1205).is_some());
    assert!(!root::is_constraint_violation(&sqlx::Error::PoolTimedOut));
    let classifier = root::SqlxErrors;
    assert!(
        root::ClassifyError::<sqlx::Error>::classify_error(&classifier, &sqlx::Error::PoolTimedOut)
            .is_some()
    );

    // The read limit on the policy still applies (validated as before).
    let policy = root::RetryPolicy::default()
        .read_limit(std::num::NonZeroUsize::new(1))
        .read_wait(std::time::Duration::ZERO);
    assert!(
        policy
            .validate()
            .unwrap_err()
            .to_string()
            .contains("read_wait")
    );
    // The layer's readings: the deprecated method and the one on `RetryMetrics` agree.
    let layer = root::SqliteRetryLayer::default();
    assert_eq!(layer.admission_limits(), layer.metrics().admission_limits());
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
