//! The operator's kit, `ops/grafana-dashboard.json`, `ops/prometheus-alerts.yml` and its
//! promtool tests `ops/prometheus-alerts-test.yml`, kept honest: every metric and label their
//! PromQL names is one the crate really emits, as Prometheus scrapes it, the dashboard shows
//! every metric the crate has, and every alert has its runbook section in `ops/README.md`.
//!
//! Where the truth comes from: the crate itself, at run time, not a list written here nor a
//! reading of `src/recorder.rs` (its label keys are private, and text would say what the code
//! is meant to do, not what it does). [`drive`] sends real requests over HTTP through the layer
//! and a `WritePool` on a real SQLite file (a first try, a replay that gives up, a writer that
//! waits for the turn, a shared fsync of group commit, a failed one) into `metrics-exporter-prometheus`
//! set up as the `metrics::recorder` module's docs say (`ATTEMPTS_BUCKETS`, `SECONDS_BUCKETS` for
//! `_seconds`), in both of its naming modes. Its scrape gives every series name, the
//! `_bucket`/`_sum`/`_count` ones included (mapped to their family by the `# TYPE` lines), and
//! every label of each. The crate's `describe_*` calls, seen by a recorder wrapped around the
//! exporter, list every metric it has: one the drive does not reach fails the test rather than
//! going unchecked.
//!
//! The PromQL is parsed by `promql-parser` (GreptimeDB's, which follows Prometheus' grammar
//! and its type checks), and the checker follows each query's labels through the syntax tree,
//! as Prometheus computes them: selectors and their matchers, `by`/`without`,
//! `on`/`ignoring`/`group_left`, the functions (counters for `rate()`, `le` for
//! `histogram_quantile()`). The rule file and its tests are read as YAML (`yaml_serde`), into
//! types that refuse a key they do not know. The checker is shown to fail:
//! `the_checker_rejects_what_the_crate_does_not_emit` on made-up queries, and the main test on
//! a misspelt copy of every query of the kit. Where `promtool` is installed (CI installs it),
//! it checks the rules and runs their tests too.
#![cfg(all(feature = "metrics", feature = "axum", feature = "sqlite-write"))]

mod common;

// The exporter's setup, as the example app (and the `metrics::recorder` module's docs) make it.
#[path = "../examples/common/prometheus.rs"]
#[allow(dead_code, reason = "only its builder is used here")]
mod exporter;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use http::StatusCode;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::layers::FanoutBuilder;
use promql_parser::label::MatchOp;
use promql_parser::parser::{
    self as promql, AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, VectorMatchCardinality,
    VectorSelector,
};
use serde::Deserialize;
use serde_json::Value;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer, WritePool};

use common::{HttpClient, TestDb, poll_until, serve};

const DASHBOARD: &str = "ops/grafana-dashboard.json";
const RULES: &str = "ops/prometheus-alerts.yml";
const RULE_TESTS: &str = "ops/prometheus-alerts-test.yml";
const RUNBOOK: &str = "ops/README.md";

/// Labels Prometheus adds to every series it scrapes (the target's).
const TARGET_LABELS: [&str; 2] = ["job", "instance"];

// ---------------------------------------------------------------------------------------------
// The truth: what the crate emits, as Prometheus scrapes it.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
}

/// Which series of its family a series is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// A counter or gauge, or a summary's quantiles.
    Whole,
    Bucket,
    Sum,
    Count,
}

#[derive(Debug)]
struct Series {
    family: String,
    kind: Kind,
    part: Part,
    /// Every label key seen on it.
    labels: BTreeSet<String>,
}

impl Series {
    /// What `rate()` and `increase()` apply to: a counter, or a histogram's or summary's
    /// buckets, sum and count.
    fn is_counter(&self) -> bool {
        self.kind == Kind::Counter || self.part != Part::Whole
    }

    fn has_label(&self, label: &str) -> bool {
        self.labels.contains(label) || TARGET_LABELS.contains(&label)
    }

    fn labels(&self) -> String {
        let labels: Vec<_> = self.labels.iter().map(String::as_str).collect();
        format!("[{}]", labels.join(", "))
    }
}

/// Every series of a scrape, by name.
#[derive(Debug, Default)]
struct Truth {
    series: BTreeMap<String, Series>,
}

impl Truth {
    /// Reads Prometheus' text format: `# TYPE` lines name the families, sample lines the
    /// series and their labels.
    fn from_scrape(text: &str) -> Self {
        let mut kinds = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                let kind = match kind {
                    "counter" => Kind::Counter,
                    "gauge" => Kind::Gauge,
                    "histogram" => Kind::Histogram,
                    "summary" => Kind::Summary,
                    other => panic!("unknown kind {other:?}: {line}"),
                };
                kinds.insert(name.to_owned(), kind);
            }
        }
        let mut truth = Self::default();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (name, labels) = sample(line);
            let (family, part) = if kinds.contains_key(&name) {
                (name.clone(), Part::Whole)
            } else {
                [
                    ("_bucket", Part::Bucket),
                    ("_sum", Part::Sum),
                    ("_count", Part::Count),
                ]
                .into_iter()
                .find_map(|(suffix, part)| {
                    let base = name.strip_suffix(suffix)?;
                    match (kinds.get(base)?, part) {
                        (Kind::Histogram, _) | (Kind::Summary, Part::Sum | Part::Count) => {
                            Some((base.to_owned(), part))
                        }
                        _ => None,
                    }
                })
                .unwrap_or_else(|| panic!("a sample of no family: {line}"))
            };
            let kind = kinds[&family];
            truth
                .series
                .entry(name)
                .or_insert_with(|| Series {
                    family,
                    kind,
                    part,
                    labels: BTreeSet::new(),
                })
                .labels
                .extend(labels);
        }
        truth
    }

    /// The families, with their kinds.
    fn families(&self) -> BTreeMap<&str, Kind> {
        self.series
            .values()
            .map(|s| (s.family.as_str(), s.kind))
            .collect()
    }

    fn names(&self) -> String {
        let names: Vec<_> = self.series.keys().map(String::as_str).collect();
        names.join(", ")
    }
}

/// A sample line's series name and label keys: `name{key="value",...} 1`.
fn sample(line: &str) -> (String, Vec<String>) {
    let end = line.find(['{', ' ']).expect("a sample line");
    let name = line[..end].to_owned();
    let mut labels = Vec::new();
    if line[end..].starts_with('{') {
        let mut chars = line[end + 1..].chars();
        loop {
            let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
            let key = key.trim_start_matches(',').to_owned();
            if key.is_empty() || key.starts_with('}') {
                break;
            }
            assert_eq!(chars.next(), Some('"'), "{line}");
            // The value, with its escapes (`\"`, `\\`, `\n`): its braces and commas are not
            // the label set's.
            let mut escaped = false;
            for c in chars.by_ref() {
                match (escaped, c) {
                    (false, '\\') => escaped = true,
                    (false, '"') => break,
                    _ => escaped = false,
                }
            }
            labels.push(key);
        }
    }
    (name, labels)
}

/// A recorder around another that notes every metric described to it, with its kind.
struct Described<R> {
    inner: R,
    described: Mutex<BTreeMap<String, &'static str>>,
}

impl<R: Recorder> Described<R> {
    fn note(&self, key: &KeyName, kind: &'static str) {
        let mut described = self.described.lock().unwrap();
        described.insert(key.as_str().to_owned(), kind);
    }
}

impl<R: Recorder> Recorder for Described<R> {
    fn describe_counter(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.note(&key, "counter");
        self.inner.describe_counter(key, unit, description);
    }

    fn describe_gauge(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.note(&key, "gauge");
        self.inner.describe_gauge(key, unit, description);
    }

    fn describe_histogram(&self, key: KeyName, unit: Option<Unit>, description: SharedString) {
        self.note(&key, "histogram");
        self.inner.describe_histogram(key, unit, description);
    }

    fn register_counter(&self, key: &Key, metadata: &Metadata<'_>) -> Counter {
        self.inner.register_counter(key, metadata)
    }

    fn register_gauge(&self, key: &Key, metadata: &Metadata<'_>) -> Gauge {
        self.inner.register_gauge(key, metadata)
    }

    fn register_histogram(&self, key: &Key, metadata: &Metadata<'_>) -> Histogram {
        self.inner.register_histogram(key, metadata)
    }
}

/// The exporter as the example app sets it up (the crate's documented buckets), in either
/// naming.
fn prometheus(recommended_naming: bool) -> PrometheusBuilder {
    exporter::builder().with_recommended_naming(recommended_naming)
}

#[derive(Clone)]
struct AppState {
    /// Busy timeout 0: `SQLITE_BUSY` at once while the test holds the write lock.
    plain: SqlitePool,
    writes: WritePool,
}

/// `POST /orders`: an insert in a deferred transaction on the plain pool.
async fn order(State(s): State<AppState>, _body: String) -> Result<StatusCode, DbError> {
    let mut tx = s.plain.begin().await?;
    sqlx::query("INSERT INTO items (name) VALUES ('order')")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

/// `POST /items/{id}`: an insert through the write path.
async fn item(State(s): State<AppState>, Path(_id): Path<u32>) -> Result<StatusCode, DbError> {
    let mut tx = s.writes.begin().await?;
    sqlx::query("INSERT INTO items (name) VALUES ('item')")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(StatusCode::CREATED)
}

async fn rows(pool: &SqlitePool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM items")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Real traffic that makes the crate emit every metric it has.
async fn drive() {
    let db = TestDb::new();
    // WAL at FULL: the write path's group commit shares the fsync.
    let options = db
        .options(Duration::from_secs(5))
        .synchronous(SqliteSynchronous::Full);
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    let plain = SqlitePoolOptions::new()
        .max_connections(2)
        .connect_with(db.options(Duration::ZERO))
        .await
        .unwrap();
    let writes = WritePool::new(pool);
    // an operation outside HTTP meets contention: its admission limit (a gauge)
    let op = tower_sqlite_retry::Operation::new("drive", RetryPolicy::default());
    let mut backoff = op.backoff();
    assert!(backoff.next_delay(&sqlx::Error::PoolTimedOut).is_some());
    backoff.reset();
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(5))
        .jitter(Jitter::None);
    let app = Router::new()
        .route("/orders", post(order))
        .route("/items/{id}", post(item))
        .layer(SqliteRetryLayer::new(policy))
        .with_state(AppState {
            plain: plain.clone(),
            writes: writes.clone(),
        });
    let server = serve(app).await;
    let client = HttpClient::new(server.addr);

    // A first try, its body held for replay while it runs.
    assert_eq!(
        client.post("/orders", "abc").await.status,
        StatusCode::CREATED
    );
    // Both attempts meet the held lock: one replay (through the replay gate), then the layer
    // gives up (`exhausted`, with the error's name).
    let lock = db.hold_write_lock().await;
    let reply = client.post("/orders", "abc").await;
    assert_eq!(
        reply.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        reply.text()
    );
    lock.release().await;

    // The write path: a transaction that waits for nobody, then one that waits behind the
    // test's own (which, outside a request, is `_unknown`).
    assert_eq!(
        client.post("/items/1", "").await.status,
        StatusCode::CREATED
    );
    let held = writes.begin().await.unwrap();
    let waiting = tokio::spawn({
        let client = client.clone();
        async move { client.post("/items/2", "").await }
    });
    poll_until("a writer waiting for the turn", async || {
        writes.stats().is_some_and(|s| s.waiting == 1)
    })
    .await;
    held.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap().status, StatusCode::CREATED);

    // Group commit: a transaction commits while the fsync is held, and waits for the shared one.
    assert!(
        tower_sqlite_retry::__private::hold_fsync(&writes, true),
        "group commit shares no fsync here (it needs WAL at FULL)"
    );
    let before = rows(&plain).await;
    let grouped = tokio::spawn({
        let client = client.clone();
        async move { client.post("/items/3", "").await }
    });
    poll_until("its COMMIT went through", async || {
        rows(&plain).await > before
    })
    .await;
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    assert_eq!(grouped.await.unwrap().status, StatusCode::CREATED);
    assert!(writes.stats().unwrap().syncs >= 1, "a shared fsync ran");

    // A sync of the WAL fails (its directory renamed while a commit waits: the WAL is no
    // longer at its path): the commit is answered 500, and the error counted.
    let dir = db.path.parent().unwrap().to_owned();
    let moved = dir.with_extension("moved");
    tower_sqlite_retry::__private::hold_fsync(&writes, true);
    let before = rows(&plain).await;
    let failed = tokio::spawn({
        let client = client.clone();
        async move { client.post("/items/4", "").await }
    });
    poll_until("its COMMIT went through", async || {
        rows(&plain).await > before
    })
    .await;
    std::fs::rename(&dir, &moved).unwrap();
    tower_sqlite_retry::__private::hold_fsync(&writes, false);
    let reply = failed.await.unwrap();
    std::fs::rename(&moved, &dir).unwrap();
    assert_eq!(
        reply.status,
        StatusCode::INTERNAL_SERVER_ERROR,
        "{}",
        reply.text()
    );
    assert_eq!(writes.stats().unwrap().sync_errors, 1);
}

// ---------------------------------------------------------------------------------------------
// The PromQL, parsed by promql-parser and followed through its syntax tree.

/// Grafana's interval variables: PromQL reads a duration in their place (which one does not
/// matter here). Grafana's other variables stand in strings (`=~"$route"`), which PromQL reads
/// as they are; one anywhere else fails the parse.
const GRAFANA_RANGES: [&str; 3] = ["$__rate_interval", "$__interval", "$__range"];

/// Functions whose result labels the checker cannot follow (they make labels from values).
const UNFOLLOWED: [&str; 2] = ["label_replace", "label_join"];

/// Aggregations that select series rather than merge them: their result keeps the argument's
/// labels whatever their `by`.
const SELECTING: [&str; 4] = ["topk", "bottomk", "limitk", "limit_ratio"];

fn parse(expr: &str) -> Result<Expr, String> {
    let promql = GRAFANA_RANGES
        .iter()
        .fold(expr.to_owned(), |e, variable| e.replace(variable, "5m"));
    promql::parse(&promql)
}

/// The labels an expression's result can have: `None` for a number or a string, and where a
/// series is not one the crate emits (its problem is said once, at the selector).
type Labels = Option<BTreeSet<String>>;

/// What the checker found in one query.
#[derive(Debug, Default)]
struct Reading {
    problems: Vec<String>,
    /// The families its selectors read.
    families: BTreeSet<String>,
    /// Its selectors' metric names, in the order they are written.
    names: Vec<String>,
    /// The labels of its result.
    labels: Labels,
}

/// Reads `expr` against what the crate emits.
fn read(expr: &str, truth: &Truth) -> Reading {
    let mut checker = Checker {
        truth,
        reading: Reading::default(),
    };
    match parse(expr) {
        Ok(ast) => checker.reading.labels = checker.expr(&ast),
        Err(e) => checker
            .reading
            .problems
            .push(format!("cannot read the query: {}", e.trim())),
    }
    let mut reading = checker.reading;
    reading.problems.dedup();
    reading
}

/// What is wrong with `expr` against what the crate emits (nothing: an empty list).
fn problems(expr: &str, truth: &Truth) -> Vec<String> {
    read(expr, truth).problems
}

/// The labels the result of `expr` can have (for legends and annotations).
fn result_labels(expr: &str, truth: &Truth) -> BTreeSet<String> {
    read(expr, truth).labels.unwrap_or_default()
}

/// The families `expr` reads.
fn families(expr: &str, truth: &Truth) -> BTreeSet<String> {
    read(expr, truth).families
}

/// `[a, b]`.
fn list<'a>(labels: impl IntoIterator<Item = &'a String>) -> String {
    let labels: Vec<_> = labels.into_iter().map(String::as_str).collect();
    format!("[{}]", labels.join(", "))
}

/// Every selector in `expr`, in the order they are written.
fn selectors(expr: &Expr) -> Vec<&VectorSelector> {
    fn walk<'e>(e: &'e Expr, out: &mut Vec<&'e VectorSelector>) {
        match e {
            Expr::VectorSelector(vs) => out.push(vs),
            Expr::MatrixSelector(ms) => out.push(&ms.vs),
            Expr::Paren(p) => walk(&p.expr, out),
            Expr::Unary(u) => walk(&u.expr, out),
            Expr::Subquery(s) => walk(&s.expr, out),
            Expr::Aggregate(a) => {
                if let Some(param) = &a.param {
                    walk(param, out);
                }
                walk(&a.expr, out);
            }
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                walk(&b.rhs, out);
            }
            Expr::Call(c) => c.args.args.iter().for_each(|arg| walk(arg, out)),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    let mut out = Vec::new();
    walk(expr, &mut out);
    out
}

/// Follows a query's labels from its selectors up, as Prometheus computes them, and notes
/// every name or label the crate does not emit and every function given what it does not take.
struct Checker<'a> {
    truth: &'a Truth,
    reading: Reading,
}

impl Checker<'_> {
    fn problem(&mut self, problem: String) {
        self.reading.problems.push(problem);
    }

    /// The series `vs` names, if the crate emits it.
    fn series(&self, vs: &VectorSelector) -> Option<&Series> {
        self.truth.series.get(vs.name.as_deref()?)
    }

    fn expr(&mut self, e: &Expr) -> Labels {
        match e {
            Expr::VectorSelector(vs) => self.selector(vs),
            Expr::MatrixSelector(ms) => self.selector(&ms.vs),
            Expr::Paren(p) => self.expr(&p.expr),
            Expr::Unary(u) => self.expr(&u.expr),
            Expr::Subquery(s) => self.expr(&s.expr),
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) => None,
            Expr::Aggregate(a) => self.aggregate(a),
            Expr::Binary(b) => self.binary(b),
            Expr::Call(c) => self.call(c),
            Expr::Extension(_) => {
                self.problem("an extension of PromQL".to_owned());
                None
            }
        }
    }

    fn selector(&mut self, vs: &VectorSelector) -> Labels {
        let Some(name) = vs.name.clone() else {
            self.problem(format!(
                "`{vs}`: a selector without a metric name (name the series)"
            ));
            return None;
        };
        self.reading.names.push(name.clone());
        let Some(series) = self.truth.series.get(&name) else {
            self.problem(format!(
                "`{name}` is not a series the crate emits (it emits: {})",
                self.truth.names()
            ));
            return None;
        };
        self.reading.families.insert(series.family.clone());
        let mut problems = Vec::new();
        let matchers = vs.matchers.matchers.iter();
        let or_matchers = vs.matchers.or_matchers.iter().flatten();
        for m in matchers.chain(or_matchers) {
            if m.name == "__name__" {
                continue;
            }
            if !series.has_label(&m.name) {
                problems.push(format!(
                    "`{name}` has no label `{}` (its labels: {})",
                    m.name,
                    series.labels()
                ));
            }
            if m.value.contains('$') && matches!(m.op, MatchOp::Equal | MatchOp::NotEqual) {
                problems.push(format!(
                    "`{}{}\"{}\"`: a Grafana variable (several values, or All) needs `=~`",
                    m.name, m.op, m.value
                ));
            }
        }
        let mut labels = series.labels.clone();
        labels.extend(TARGET_LABELS.map(str::to_owned));
        self.reading.problems.extend(problems);
        Some(labels)
    }

    /// `keyword (labels)` applied to `of`, the labels of `what`: each must be one of them.
    fn grouping(&mut self, keyword: &str, labels: &[String], of: &Labels, what: &str) {
        let Some(of) = of else { return };
        for label in labels.iter().filter(|l| !of.contains(*l)) {
            self.problem(format!(
                "`{keyword} ({})`: {what} has no label `{label}` (its labels: {})",
                labels.join(", "),
                list(of)
            ));
        }
    }

    fn aggregate(&mut self, a: &AggregateExpr) -> Labels {
        let op = a.op.to_string();
        let param = a.param.as_deref().and_then(|p| match p {
            Expr::StringLiteral(s) => Some(s.val.clone()),
            other => {
                self.expr(other);
                None
            }
        });
        let inner = self.expr(&a.expr);
        let what = format!("the argument of `{op}`");
        let mut out = match &a.modifier {
            Some(LabelModifier::Include(by)) => {
                self.grouping("by", &by.labels, &inner, &what);
                Some(by.labels.iter().cloned().collect())
            }
            Some(LabelModifier::Exclude(without)) => {
                self.grouping("without", &without.labels, &inner, &what);
                inner.clone().map(|labels| {
                    let mut labels = labels;
                    labels.retain(|l| !without.labels.contains(l));
                    labels
                })
            }
            None => Some(BTreeSet::new()),
        };
        if SELECTING.contains(&op.as_str()) {
            out = inner;
        } else if let (Some(out), Some(label)) = (&mut out, param.filter(|_| op == "count_values"))
        {
            out.insert(label);
        }
        out
    }

    fn binary(&mut self, b: &BinaryExpr) -> Labels {
        let lhs = self.expr(&b.lhs);
        let rhs = self.expr(&b.rhs);
        let (lhs, rhs) = match (lhs, rhs) {
            (Some(lhs), Some(rhs)) => (lhs, rhs),
            // A number and a vector: the vector's labels.
            (Some(vector), None) | (None, Some(vector)) => return Some(vector),
            (None, None) => return None,
        };
        let modifier = b.modifier.as_ref();
        let matching = modifier.and_then(|m| m.matching.as_ref());
        let (on, matched) = match matching {
            Some(LabelModifier::Include(on)) => (true, on.labels.clone()),
            Some(LabelModifier::Exclude(ignoring)) => (false, ignoring.labels.clone()),
            None => (false, Vec::new()),
        };
        let keyword = if on { "on" } else { "ignoring" };
        if on || !matched.is_empty() {
            self.grouping(keyword, &matched, &Some(lhs.clone()), "the left side");
            self.grouping(keyword, &matched, &Some(rhs.clone()), "the right side");
        }
        let card = modifier.map(|m| &m.card);
        match card {
            Some(VectorMatchCardinality::ManyToOne(include)) => {
                self.grouping("group_left", &include.labels, &Some(rhs), "the right side");
                let mut out = lhs;
                out.extend(include.labels.iter().cloned());
                Some(out)
            }
            Some(VectorMatchCardinality::OneToMany(include)) => {
                self.grouping("group_right", &include.labels, &Some(lhs), "the left side");
                let mut out = rhs;
                out.extend(include.labels.iter().cloned());
                Some(out)
            }
            _ if b.op.is_set_operator() => match b.op.to_string().as_str() {
                // `or`: series of either side.
                "or" => Some(lhs.intersection(&rhs).cloned().collect()),
                // `and`, `unless`: the left side's series.
                _ => Some(lhs),
            },
            // One to one: the labels both sides share; `on` keeps only its own.
            _ if on => Some(matched.into_iter().filter(|l| lhs.contains(l)).collect()),
            _ => Some(
                lhs.intersection(&rhs)
                    .filter(|l| !matched.contains(*l))
                    .cloned()
                    .collect(),
            ),
        }
    }

    fn call(&mut self, c: &Call) -> Labels {
        let name = c.func.name;
        if UNFOLLOWED.contains(&name) {
            self.problem(format!(
                "`{name}()` makes labels this checker cannot follow"
            ));
        }
        let args: Vec<Labels> = c.args.args.iter().map(|arg| self.expr(arg)).collect();
        // The selectors under each argument, with their series.
        let under = |i: usize| -> Vec<(String, &Series)> {
            c.args
                .args
                .get(i)
                .map(|arg| selectors(arg))
                .unwrap_or_default()
                .into_iter()
                .filter_map(|vs| Some((vs.name.clone()?, self.series(vs)?)))
                .collect()
        };
        let mut problems = Vec::new();
        match name {
            "rate" | "irate" | "increase" | "resets" => {
                for (s, series) in under(0).into_iter().filter(|(_, s)| !s.is_counter()) {
                    problems.push(format!(
                        "`{name}()` of `{s}`, a {:?}: it takes counters (a histogram's too)",
                        series.kind
                    ));
                }
            }
            "delta" | "idelta" | "deriv" | "predict_linear" => {
                for (s, _) in under(0).into_iter().filter(|(_, s)| s.is_counter()) {
                    problems.push(format!("`{name}()` of `{s}`, a counter"));
                }
            }
            "histogram_quantile" => {
                for (s, _) in under(1)
                    .into_iter()
                    .filter(|(_, s)| (s.kind, s.part) != (Kind::Histogram, Part::Bucket))
                {
                    problems.push(format!(
                        "`histogram_quantile()` over `{s}`, not a histogram's `_bucket` series"
                    ));
                }
                if let Some(Some(labels)) = args.get(1)
                    && !labels.contains("le")
                {
                    problems.push(format!(
                        "`histogram_quantile()` over a result without `le` (its labels: {}): \
                         an aggregation inside it loses `le`",
                        list(labels)
                    ));
                }
            }
            _ => {}
        }
        self.reading.problems.extend(problems);
        match name {
            _ if UNFOLLOWED.contains(&name) => None,
            "histogram_quantile" => args.get(1).cloned().flatten().map(|mut labels| {
                labels.remove("le");
                labels
            }),
            "vector" | "absent" | "absent_over_time" => Some(BTreeSet::new()),
            _ if c.func.return_type == promql_parser::parser::value::ValueType::Scalar => None,
            // The others keep the labels of their series argument.
            _ => args.into_iter().flatten().next(),
        }
    }
}

/// The names between `{{` and `}}` (Grafana's legends) or after `$labels.` (Prometheus'
/// templates).
fn template_labels(text: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    for part in text.split("{{").skip(1) {
        let inner = part.split("}}").next().unwrap_or("").trim();
        if !inner.is_empty() && ident(inner) == inner {
            out.push(inner.to_owned());
        }
    }
    for part in text.split("$labels.").skip(1) {
        out.push(ident(part));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The rule file and its promtool tests, read as YAML.

/// A Prometheus rule file, as far as the kit uses one: alerting rules only. A key it does not
/// know (a recording rule's `record`, a misspelt key) is an error, not skipped.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleFile {
    groups: Vec<RuleGroup>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleGroup {
    name: String,
    #[serde(default, rename = "interval")]
    _interval: Option<String>,
    #[serde(default, rename = "limit")]
    _limit: Option<u64>,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    alert: String,
    expr: String,
    #[serde(default, rename = "for")]
    for_: String,
    #[serde(default, rename = "keep_firing_for")]
    _keep_firing_for: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

/// The groups of a rule file.
fn read_groups(text: &str) -> Result<Vec<RuleGroup>, String> {
    let file: RuleFile = yaml_serde::from_str(text).map_err(|e| e.to_string())?;
    Ok(file.groups)
}

/// The alerting rules of a rule file, every group's.
fn read_rules(text: &str) -> Result<Vec<Rule>, String> {
    Ok(read_groups(text)?
        .into_iter()
        .flat_map(|group| group.rules)
        .collect())
}

/// A Prometheus duration (`5m`, `1h30m`), in seconds.
fn duration(text: &str) -> Option<u64> {
    promql_parser::util::parse_duration(text)
        .ok()
        .map(|d| d.as_secs())
}

/// A promtool unit-test file (`promtool test rules`), the parts the kit checks: which rule
/// files it loads, the series it feeds, and the alerts it expects when.
#[derive(Debug, Deserialize)]
struct RuleTests {
    rule_files: Vec<String>,
    tests: Vec<RuleTest>,
}

#[derive(Debug, Deserialize)]
struct RuleTest {
    #[serde(default)]
    name: String,
    input_series: Vec<InputSeries>,
    #[serde(default)]
    alert_rule_test: Vec<AlertTest>,
}

#[derive(Debug, Deserialize)]
struct InputSeries {
    series: String,
}

#[derive(Debug, Deserialize)]
struct AlertTest {
    alertname: String,
    eval_time: String,
    #[serde(default)]
    exp_alerts: Vec<ExpectedAlert>,
}

#[derive(Debug, Deserialize)]
struct ExpectedAlert {
    #[serde(default)]
    exp_labels: BTreeMap<String, String>,
}

// ---------------------------------------------------------------------------------------------
// The kit, checked.

/// Where every alert's `runbook_url` points: the runbook, on the repository's main branch
/// (Cargo.toml's `repository`), at the section named after the alert.
const RUNBOOK_URL: &str = concat!(env!("CARGO_PKG_REPOSITORY"), "/blob/main/ops/README.md");

/// An alert's description is at most this long: what fired, in a sentence or two; the
/// thresholds' reasons and what to do are the runbook's.
const DESCRIPTION_MAX: usize = 250;

/// The annotations every alert has, and the only ones.
const ANNOTATIONS: [&str; 3] = ["summary", "description", "runbook_url"];

struct Kit {
    dashboard: Value,
    groups: Vec<RuleGroup>,
    tests: RuleTests,
    runbook: String,
}

impl Kit {
    fn rules(&self) -> impl Iterator<Item = &Rule> {
        self.groups.iter().flat_map(|group| &group.rules)
    }
}

fn read_file(path: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kit() -> Kit {
    let dashboard = serde_json::from_str(&read_file(DASHBOARD)).expect("the dashboard is JSON");
    let groups = read_groups(&read_file(RULES)).unwrap_or_else(|e| panic!("{RULES}: {e}"));
    let tests = yaml_serde::from_str(&read_file(RULE_TESTS))
        .unwrap_or_else(|e| panic!("{RULE_TESTS}: {e}"));
    Kit {
        dashboard,
        groups,
        tests,
        runbook: read_file(RUNBOOK),
    }
}

/// The headings of a Markdown text, outside its code blocks.
fn headings(markdown: &str) -> Vec<&str> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        if !fenced && (1..=6).contains(&level) && line[level..].starts_with(' ') {
            out.push(line[level..].trim());
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, spaces as `-`, punctuation but `-` and `_`
/// dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// Every panel, those inside rows included.
fn panels(list: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for panel in list.as_array().into_iter().flatten() {
        out.push(panel);
        out.extend(panels(&panel["panels"]));
    }
    out
}

/// The dashboard's queries: `(where, expr, legend)`.
fn dashboard_queries(dashboard: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for panel in panels(&dashboard["panels"]) {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push((
                format!(
                    "{DASHBOARD}: panel {}, target {}",
                    panel["title"], target["refId"]
                ),
                target["expr"].as_str().unwrap_or_default().to_owned(),
                target["legendFormat"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            ));
        }
    }
    out
}

/// Every problem of the dashboard, and the families its panels show.
fn dashboard_problems(dashboard: &Value, truth: &Truth) -> (Vec<String>, BTreeSet<String>) {
    let mut out = Vec::new();
    let mut shown = BTreeSet::new();
    let datasource = |v: &Value| v["datasource"]["uid"] == "${datasource}";
    if dashboard["schemaVersion"].as_u64().is_none_or(|v| v < 36) {
        out.push(format!(
            "{DASHBOARD}: schemaVersion {}",
            dashboard["schemaVersion"]
        ));
    }
    let queries = dashboard_queries(dashboard);
    let variables = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut names = BTreeSet::new();
    for var in &variables {
        let name = var["name"].as_str().unwrap_or_default();
        names.insert(name);
        let here = format!("{DASHBOARD}: variable {name:?}");
        match var["type"].as_str() {
            Some("datasource") => {
                if var["query"] != "prometheus" {
                    out.push(format!("{here}: not a Prometheus data source"));
                }
                continue;
            }
            Some("query") => {}
            other => out.push(format!("{here}: type {other:?}")),
        }
        if !datasource(var) {
            out.push(format!("{here}: not on the `${{datasource}}` data source"));
        }
        let used = queries.iter().any(|(_, expr, _)| {
            expr.contains(&format!("${name}\"")) || expr.contains(&format!("${{{name}}}"))
        }) || variables.iter().any(|v| {
            v["definition"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("${name}\""))
        });
        if !used {
            out.push(format!("{here}: no query uses it"));
        }
        // `label_values(selector, label)`, in the query (a string, or `{"query": ...}`) and
        // its definition.
        let texts = [&var["query"], &var["query"]["query"], &var["definition"]];
        for text in texts.into_iter().filter_map(Value::as_str) {
            let inner = text
                .strip_prefix("label_values(")
                .and_then(|t| t.strip_suffix(')'))
                .and_then(|t| t.rsplit_once(','));
            let Some((selector, label)) = inner else {
                out.push(format!(
                    "{here}: {text:?} is not `label_values(selector, label)`"
                ));
                continue;
            };
            out.extend(
                problems(selector, truth)
                    .into_iter()
                    .map(|p| format!("{here}: {p}")),
            );
            if !result_labels(selector, truth).contains(label.trim()) {
                out.push(format!(
                    "{here}: `{selector}` has no label `{}`",
                    label.trim()
                ));
            }
        }
    }
    if !names.contains("datasource") {
        out.push(format!("{DASHBOARD}: no `datasource` variable"));
    }
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard["panels"]) {
        let title = &panel["title"];
        if !ids.insert(panel["id"].to_string()) {
            out.push(format!(
                "{DASHBOARD}: panel {title}: id {} twice",
                panel["id"]
            ));
        }
        if panel["gridPos"]["w"].as_u64().is_none() {
            out.push(format!("{DASHBOARD}: panel {title}: no gridPos"));
        }
        if panel["type"] == "row" {
            continue;
        }
        if panel["description"].as_str().is_none_or(str::is_empty) {
            out.push(format!("{DASHBOARD}: panel {title}: no description"));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            out.push(format!("{DASHBOARD}: panel {title}: no query"));
        }
        let mut refs = BTreeSet::new();
        if !datasource(panel) || !targets.iter().all(datasource) {
            out.push(format!(
                "{DASHBOARD}: panel {title}: not on `${{datasource}}`"
            ));
        }
        for target in &targets {
            if !refs.insert(target["refId"].to_string()) {
                out.push(format!(
                    "{DASHBOARD}: panel {title}: refId {} twice",
                    target["refId"]
                ));
            }
        }
    }
    for (here, expr, legend) in &queries {
        out.extend(
            problems(expr, truth)
                .into_iter()
                .map(|p| format!("{here}: {p}")),
        );
        let labels = result_labels(expr, truth);
        for label in template_labels(legend)
            .into_iter()
            .filter(|l| !labels.contains(l))
        {
            out.push(format!(
                "{here}: the legend's `{{{{{label}}}}}` is not a label of the result"
            ));
        }
        shown.extend(families(expr, truth));
    }
    (out, shown)
}

fn rules_problems(kit: &Kit, truth: &Truth) -> Vec<String> {
    let mut out = Vec::new();
    let mut groups = BTreeSet::new();
    for group in &kit.groups {
        if group.name.is_empty() || !groups.insert(&group.name) {
            out.push(format!(
                "{RULES}: group {:?}: empty or named twice",
                group.name
            ));
        }
    }
    let headings = headings(&kit.runbook);
    let anchors: Vec<String> = headings.iter().map(|h| anchor(h)).collect();
    if kit.rules().next().is_none() {
        out.push(format!("{RULES}: no alert"));
    }
    let mut alerts = BTreeSet::new();
    for rule in kit.rules() {
        let here = format!("{RULES}: {}", rule.alert);
        if !alerts.insert(&rule.alert) {
            out.push(format!("{here}: named twice"));
        }
        out.extend(
            problems(&rule.expr, truth)
                .into_iter()
                .map(|p| format!("{here}: {p}")),
        );
        if duration(&rule.for_).is_none_or(|s| s < 60) {
            out.push(format!(
                "{here}: `for: {}`, want a minute or more",
                rule.for_
            ));
        }
        let severity = rule.labels.get("severity").map(String::as_str);
        if !matches!(severity, Some("critical" | "warning" | "info")) {
            out.push(format!("{here}: severity {severity:?}"));
        }
        for key in ANNOTATIONS {
            if rule.annotations.get(key).is_none_or(String::is_empty) {
                out.push(format!("{here}: no {key}"));
            }
        }
        for key in rule.annotations.keys() {
            if !ANNOTATIONS.contains(&key.as_str()) {
                out.push(format!(
                    "{here}: annotation {key:?}, want only {ANNOTATIONS:?}"
                ));
            }
        }
        if let Some(description) = rule.annotations.get("description")
            && (description.len() > DESCRIPTION_MAX || description.contains('\n'))
        {
            out.push(format!(
                "{here}: a description of {} characters, or of several lines: say what fired \
                 in at most {DESCRIPTION_MAX}, and the rest in the runbook ({RUNBOOK})",
                description.len()
            ));
        }
        // Its runbook section: a heading named after the alert, and the URL its anchor.
        let want = format!("{RUNBOOK_URL}#{}", anchor(&rule.alert));
        if rule.annotations.get("runbook_url") != Some(&want) {
            out.push(format!(
                "{here}: runbook_url {:?}, want {want:?}",
                rule.annotations.get("runbook_url")
            ));
        }
        if !headings.contains(&rule.alert.as_str()) {
            out.push(format!(
                "{here}: {RUNBOOK} has no section `### {}`",
                rule.alert
            ));
        }
        let labels = result_labels(&rule.expr, truth);
        for text in rule.annotations.values() {
            for label in template_labels(text)
                .into_iter()
                .filter(|l| !labels.contains(l))
            {
                out.push(format!(
                    "{here}: `$labels.{label}` is not a label of the result"
                ));
            }
        }
    }
    // Every anchor of the runbook is one (GitHub numbers a second one alike), and every alert
    // section is a rule's.
    let mut seen = BTreeSet::new();
    for (heading, anchor) in headings.iter().zip(&anchors) {
        if !seen.insert(anchor) {
            out.push(format!(
                "{RUNBOOK}: the anchor #{anchor} twice ({heading:?})"
            ));
        }
        if heading.starts_with("TowerSqliteRetry") && !kit.rules().any(|r| r.alert == *heading) {
            out.push(format!(
                "{RUNBOOK}: a section for {heading}, which is no alert"
            ));
        }
    }
    out
}

/// The promtool unit tests of the rules: they feed only series the crate emits (as a real
/// scrape names and labels them), expect only labels the alert has, and show each alert both
/// firing and not.
fn rule_tests_problems(kit: &Kit, truth: &Truth) -> Vec<String> {
    let mut out = Vec::new();
    let tests = &kit.tests;
    let rules_file = RULES.rsplit('/').next().unwrap();
    if tests.rule_files != [rules_file] {
        out.push(format!(
            "{RULE_TESTS}: rule_files {:?}, want [{rules_file:?}]",
            tests.rule_files
        ));
    }
    let mut fired = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for test in &tests.tests {
        let here = format!("{RULE_TESTS}: test {:?}", test.name);
        for input in &test.input_series {
            match parse(&input.series) {
                Ok(Expr::VectorSelector(_)) => out.extend(
                    problems(&input.series, truth)
                        .into_iter()
                        .map(|p| format!("{here}: series {}: {p}", input.series)),
                ),
                _ => out.push(format!("{here}: {} is not a series", input.series)),
            }
        }
        for case in &test.alert_rule_test {
            let here = format!("{here}, {} at {}", case.alertname, case.eval_time);
            if duration(&case.eval_time).is_none() {
                out.push(format!("{here}: eval_time is not a duration"));
            }
            let Some(rule) = kit.rules().find(|r| r.alert == case.alertname) else {
                out.push(format!("{here}: no such alert in {RULES}"));
                continue;
            };
            let mut labels = result_labels(&rule.expr, truth);
            labels.extend(rule.labels.keys().cloned());
            for alert in &case.exp_alerts {
                for label in alert.exp_labels.keys().filter(|l| !labels.contains(*l)) {
                    out.push(format!("{here}: the alert has no label `{label}`"));
                }
            }
            if case.exp_alerts.is_empty() {
                quiet.insert(&rule.alert);
            } else {
                fired.insert(&rule.alert);
            }
        }
    }
    for rule in kit.rules() {
        if !fired.contains(&rule.alert) {
            out.push(format!("{RULE_TESTS}: no test where {} fires", rule.alert));
        }
        if !quiet.contains(&rule.alert) {
            out.push(format!(
                "{RULE_TESTS}: no test where {} does not fire",
                rule.alert
            ));
        }
    }
    out
}

#[tokio::test]
async fn the_kit_queries_only_what_the_crate_emits() {
    // The exporter in both naming modes (the kit must hold in either), the descriptions noted.
    let plain = prometheus(false).build_recorder();
    let plain_handle = plain.handle();
    let recommended = prometheus(true).build_recorder();
    let recommended_handle = recommended.handle();
    let noting = Described {
        inner: FanoutBuilder::default()
            .add_recorder(plain)
            .add_recorder(recommended)
            .build(),
        described: Mutex::default(),
    };
    {
        let _local = metrics::set_default_local_recorder(&noting);
        drive().await;
    }
    let described = noting.described.into_inner().unwrap();
    let kit = kit();
    for (mode, scrape) in [
        ("default naming", plain_handle.render()),
        ("recommended naming", recommended_handle.render()),
    ] {
        let truth = Truth::from_scrape(&scrape);

        // The drive reached every metric the crate describes, and only those.
        let families = truth.families();
        let emitted: BTreeSet<&str> = families.keys().copied().collect();
        let all: BTreeSet<&str> = described.keys().map(String::as_str).collect();
        assert_eq!(
            emitted, all,
            "{mode}: the metrics the drive emitted are not the ones the crate describes: \
             extend `drive` to reach the missing ones\n{scrape}"
        );
        for (name, kind) in &families {
            let want = match kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram | Kind::Summary => "histogram",
            };
            assert_eq!(described[*name], want, "{mode}: {name}");
        }
        // Every metric of the write path has the `database` label; the failed sync of the
        // drive is counted as a write transaction that failed at `sync`.
        for (name, series) in truth
            .series
            .iter()
            .filter(|(name, _)| name.starts_with("tower_sqlite_retry_write_"))
        {
            assert!(
                series.labels.contains("database"),
                "{mode}: {name} {}",
                series.labels()
            );
        }
        assert!(
            scrape.contains(
                "tower_sqlite_retry_write_errors_total{database=\"test.db\",stage=\"sync\"} 1\n"
            ),
            "{mode}: {scrape}"
        );

        let (mut wrong, shown) = dashboard_problems(&kit.dashboard, &truth);
        wrong.extend(rules_problems(&kit, &truth));
        wrong.extend(rule_tests_problems(&kit, &truth));
        assert!(
            wrong.is_empty(),
            "{mode}: the kit queries what the crate does not emit:\n{}",
            wrong.join("\n")
        );
        let missing: Vec<_> = all.iter().filter(|f| !shown.contains(**f)).collect();
        assert!(
            missing.is_empty(),
            "{DASHBOARD}: no panel shows {missing:?}"
        );

        // And the checker can fail on each of them: a misspelt metric, an unknown label.
        let queries = dashboard_queries(&kit.dashboard)
            .into_iter()
            .map(|(here, expr, _)| (here, expr))
            .chain(kit.rules().map(|r| (r.alert.clone(), r.expr.clone())))
            .chain(
                kit.tests
                    .tests
                    .iter()
                    .flat_map(|t| &t.input_series)
                    .map(|s| (RULE_TESTS.to_owned(), s.series.clone())),
            );
        for (here, expr) in queries {
            let name = read(&expr, &truth).names[0].clone();
            let misspelt = expr.replacen(name.as_str(), &format!("{name}s"), 1);
            assert!(
                !problems(&misspelt, &truth).is_empty(),
                "{here}: {misspelt}"
            );
            if expr.contains("by (") {
                let unknown = expr.replacen("by (", "by (databse, ", 1);
                assert!(!problems(&unknown, &truth).is_empty(), "{here}: {unknown}");
            }
        }
    }
}

/// The checker on made-up queries, against a scrape written here: the one place this file
/// writes series by hand, to show what the checker rejects.
#[test]
fn the_checker_rejects_what_the_crate_does_not_emit() {
    let truth = Truth::from_scrape(concat!(
        "# TYPE app_requests_total counter\n",
        "app_requests_total{http_route=\"/a/{id}\",outcome=\"first_try\"} 1\n",
        "# TYPE app_waiting gauge\n",
        "app_waiting{database=\"app.db\"} 0\n",
        "# TYPE app_held_seconds histogram\n",
        "app_held_seconds_bucket{database=\"app.db\",le=\"0.5\"} 1\n",
        "app_held_seconds_bucket{database=\"app.db\",le=\"+Inf\"} 1\n",
        "app_held_seconds_sum{database=\"app.db\"} 0.1\n",
        "app_held_seconds_count{database=\"app.db\"} 1\n",
        "# TYPE app_members summary\n",
        "app_members{database=\"app.db\",quantile=\"0.5\"} 2\n",
        "app_members_sum{database=\"app.db\"} 2\n",
        "app_members_count{database=\"app.db\"} 1\n",
    ));
    let good = [
        r#"sum by (outcome) (rate(app_requests_total{http_route=~"$route", outcome!="x"}[$__rate_interval]))"#,
        "histogram_quantile(0.99, sum by (le, database) (rate(app_held_seconds_bucket[5m]))) > 0.25",
        "sum(rate(app_held_seconds_sum[5m])) by (database) > 0.9",
        "sum by (database) (rate(app_members_sum[5m])) / on (database) sum by (database) (rate(app_members_count[5m]))",
        "max by (instance, job) (app_waiting)",
        "sum(increase(app_requests_total[$__range])) / sum(increase(app_requests_total[$__range]))",
        "app_waiting * on (database) group_left (quantile) app_members",
        "topk by (database) (3, app_held_seconds_count)",
    ];
    for expr in good {
        assert_eq!(problems(expr, &truth), Vec::<String>::new(), "{expr}");
    }
    let bad = [
        ("rate(app_request_total[5m])", "is not a series"),
        ("app_held_seconds", "is not a series"),
        ("app_held_seconds_buckets", "is not a series"),
        ("app_members_bucket", "is not a series"),
        (
            r#"app_requests_total{outcom="first_try"}"#,
            "no label `outcom`",
        ),
        (r#"app_waiting{le="1"}"#, "no label `le`"),
        (
            "sum by (error_type) (rate(app_requests_total[5m]))",
            "no label `error_type`",
        ),
        ("sum(app_waiting) by (http_route)", "no label `http_route`"),
        (
            "app_waiting / on (outcome) app_held_seconds_count",
            "no label `outcome`",
        ),
        (
            "app_waiting * on (database) group_left (outcome) app_members",
            "no label `outcome`",
        ),
        (
            "sum without (outcom) (app_requests_total)",
            "no label `outcom`",
        ),
        ("rate(app_waiting[5m])", "it takes counters"),
        ("deriv(app_requests_total[5m])", "a counter"),
        (
            "histogram_quantile(0.9, rate(app_held_seconds_sum[5m]))",
            "not a histogram's",
        ),
        (
            "histogram_quantile(0.9, sum by (database) (rate(app_held_seconds_bucket[5m])))",
            "loses `le`",
        ),
        // PromQL's own rules, the parser's: an unknown function, a missing `)`, a range
        // vector where an instant one goes, a Grafana variable outside a string.
        ("rat(app_requests_total[5m])", "cannot read the query"),
        ("sum(rate(app_requests_total[5m])", "cannot read the query"),
        ("sum(app_requests_total[5m])", "cannot read the query"),
        ("app_waiting > $threshold", "cannot read the query"),
        (r#"app_requests_total{http_route="$route"}"#, "needs `=~`"),
        ("{__name__=\"app_waiting\"}", "without a metric name"),
        (
            r#"label_replace(app_waiting, "d", "$1", "database", "(.*)")"#,
            "cannot follow",
        ),
    ];
    for (expr, why) in bad {
        let found = problems(expr, &truth);
        assert!(
            found.iter().any(|p| p.contains(why)),
            "{expr}: {found:?}, want {why:?}"
        );
    }

    // Legends and annotations name only labels the result keeps.
    let expr = "sum by (database) (rate(app_held_seconds_sum[5m]))";
    assert_eq!(
        result_labels(expr, &truth),
        BTreeSet::from(["database".to_owned()])
    );
    assert!(result_labels("sum(rate(app_requests_total[5m]))", &truth).is_empty());
    let quantile =
        "histogram_quantile(0.9, sum by (le, database) (rate(app_held_seconds_bucket[5m])))";
    assert_eq!(
        result_labels(quantile, &truth),
        BTreeSet::from(["database".to_owned()])
    );
    // One to one with `on`: only its labels; `group_left`: the left side's and those it takes.
    assert_eq!(
        result_labels("app_waiting / on (database) app_held_seconds_count", &truth),
        BTreeSet::from(["database".to_owned()])
    );
    assert_eq!(
        result_labels(
            "app_waiting * on (database) group_left (quantile) app_members",
            &truth
        ),
        BTreeSet::from(["database", "instance", "job", "quantile"].map(str::to_owned))
    );
    assert_eq!(
        template_labels("{{ $labels.database }} at {{ $value | humanize }}: {{outcome}}"),
        ["outcome", "database"]
    );
}

#[test]
fn the_rule_reader_reads_what_a_rule_file_holds() {
    let text = r#"
groups:
  - name: one
    interval: 1m
    rules:
      - alert: Literal
        expr: |
          sum by (x) (
            rate(a_total[5m])
          ) > 0
        for: 5m
        labels:
          severity: warning
        annotations:
          summary: "x is {{ $labels.x }}: \"quoted\""
          description: >-
            folded
            text

            next
  - name: two
    rules:
      - alert: 'Inline'
        expr: a_total > 1 # a comment
        for: 1h30m
        labels: {}
"#;
    let rules = read_rules(text).unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].alert, "Literal");
    assert_eq!(rules[0].expr, "sum by (x) (\n  rate(a_total[5m])\n) > 0\n");
    assert_eq!(rules[0].for_, "5m");
    assert_eq!(rules[0].labels["severity"], "warning");
    assert_eq!(
        rules[0].annotations["summary"],
        "x is {{ $labels.x }}: \"quoted\""
    );
    assert_eq!(rules[0].annotations["description"], "folded text\nnext");
    assert_eq!(
        (rules[1].alert.as_str(), rules[1].expr.as_str()),
        ("Inline", "a_total > 1")
    );
    assert_eq!(duration(&rules[1].for_), Some(5400));
    // A flow mapping is YAML too: no labels, which the kit's check then says (no severity).
    assert!(rules[1].labels.is_empty());
    // A recording rule, a key out of place, a tab for indentation: said, not skipped.
    let err = read_rules("groups:\n  - name: g\n    rules:\n      - record: r\n        expr: x\n")
        .unwrap_err();
    assert!(err.contains("record"), "{err}");
    let err = read_rules("groups:\n  - name: g\n    rules:\n      - alert: A\n        exp: x\n")
        .unwrap_err();
    assert!(err.contains("exp"), "{err}");
    assert!(read_rules("groups:\n\t- name: g\n").is_err());
}

/// The runbook's anchors as GitHub makes them, and the headings outside code blocks only.
#[test]
fn runbook_anchors_are_github_s() {
    assert_eq!(
        anchor("TowerSqliteRetryWriteTurnSaturated"),
        "towersqliteretrywriteturnsaturated"
    );
    assert_eq!(anchor("1. Export the metrics"), "1-export-the-metrics");
    assert_eq!(
        anchor("The names `Prometheus` sees"),
        "the-names-prometheus-sees"
    );
    assert_eq!(
        headings("# Kit\n\n```yaml\n# a comment\n```\n### Alert\n#not a heading\n"),
        ["Kit", "Alert"]
    );
}

/// The write-errors counter, stage by stage, from real failures of real write transactions:
/// no turn within the pool's `acquire_timeout` (a `WritePool`'s and a `WriteQueue`'s), a
/// `BEGIN IMMEDIATE` refused by another connection's lock, a `COMMIT` refused by a deferred
/// foreign key, a rollback of a transaction that a raw `ROLLBACK` already ended, a closed pool
/// before any database was known. (`sync`: the drive's failed WAL sync, in the main test.)
#[tokio::test]
async fn write_failures_are_counted_by_stage() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tower_sqlite_retry::metrics::recorder;
    use tower_sqlite_retry::write::WriteQueue;

    let debugging = DebuggingRecorder::new();
    let snapshotter = debugging.snapshotter();
    let _local = metrics::set_default_local_recorder(&debugging);

    let db = TestDb::new();
    let pool = SqlitePoolOptions::new()
        .max_connections(2)
        // The turn's wait below ends at this; long enough that opening a connection on a
        // busy machine never meets it (100 ms did, under CI's load).
        .acquire_timeout(Duration::from_secs(1))
        .connect_with(db.options(Duration::ZERO))
        .await
        .unwrap();
    sqlx::query(
        "CREATE TABLE parents (id INTEGER PRIMARY KEY);
         CREATE TABLE children (parent INTEGER REFERENCES parents (id)
             DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let writes = WritePool::new(pool.clone());

    // `turn`: the turn is held past the pool's acquire_timeout, for a WritePool and a
    // WriteQueue on the same file.
    let held = writes.begin().await.unwrap();
    assert!(writes.begin().await.is_err());
    let queue = WriteQueue::for_file(&db.path);
    assert!(queue.turn(Duration::from_millis(20)).await.is_err());
    held.rollback().await.unwrap();

    // `begin`: another connection holds the write lock, and the busy timeout is 0.
    let lock = db.hold_write_lock().await;
    assert!(writes.begin().await.is_err());
    lock.release().await;

    // `commit`: the deferred foreign key fails the COMMIT (rolled back).
    let mut tx = writes.begin().await.unwrap();
    sqlx::query("INSERT INTO children (parent) VALUES (42)")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert!(tx.commit().await.is_err());

    // `rollback`: the transaction was ended behind the write path's back.
    let mut tx = writes.begin().await.unwrap();
    sqlx::query("ROLLBACK").execute(&mut *tx).await.unwrap();
    assert!(tx.rollback().await.is_err());

    // Committed and rolled back as asked: nothing counted.
    let tx = writes.begin().await.unwrap();
    tx.commit().await.unwrap();
    writes.begin().await.unwrap().rollback().await.unwrap();

    // `begin`, database `_unknown`: a pool closed before its first transaction asked SQLite.
    let closed = WritePool::new(
        SqlitePoolOptions::new()
            .connect_with(db.options(Duration::ZERO))
            .await
            .unwrap(),
    );
    closed.pool().close().await;
    assert!(closed.begin().await.is_err());

    let mut counted: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == recorder::WRITE_ERRORS)
        .map(|(key, _, _, value)| {
            let labels: Vec<_> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let DebugValue::Counter(n) = value else {
                panic!("not a counter: {value:?}")
            };
            (labels.join(","), n)
        })
        .collect();
    counted.sort();
    assert_eq!(
        counted,
        [
            ("database=_unknown,stage=begin".to_owned(), 1),
            ("database=test.db,stage=begin".to_owned(), 1),
            ("database=test.db,stage=commit".to_owned(), 1),
            ("database=test.db,stage=rollback".to_owned(), 1),
            ("database=test.db,stage=turn".to_owned(), 2),
        ]
    );
}

/// promtool, where it is installed (CI installs it, `.ci/run`): the rule file passes
/// `promtool check rules`, and its unit tests `promtool test rules`.
#[test]
fn promtool_checks_the_rules_and_passes_their_tests() {
    let ops = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("ops");
    let promtool = |args: &[&str]| {
        std::process::Command::new("promtool")
            .args(args)
            .current_dir(&ops)
            .output()
    };
    if promtool(&["--version"]).is_err() {
        common::skipped(
            "promtool_checks_the_rules_and_passes_their_tests",
            "promtool is not installed (Debian's `prometheus` package has it; CI installs it)",
        );
        return;
    }
    let file = |path: &'static str| path.rsplit('/').next().unwrap();
    for args in [
        ["check", "rules", file(RULES)],
        ["test", "rules", file(RULE_TESTS)],
    ] {
        let out = promtool(&args).unwrap();
        assert!(
            out.status.success(),
            "promtool {}:\n{}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
