//! The operator's kit, `ops/grafana-dashboard.json` and `ops/prometheus-alerts.yml`, kept
//! honest: every metric and label their PromQL names is one the crate really emits, as
//! Prometheus scrapes it, and the dashboard shows every metric the crate has.
//!
//! Where the truth comes from: the crate itself, at run time, not a list written here nor a
//! reading of `src/recorder.rs` (its label keys are private, and text would say what the code
//! is meant to do, not what it does). [`drive`] sends real requests over HTTP through the layer
//! and a `WritePool` on a real SQLite file (a first try, a replay that gives up, a writer that
//! waits for the turn, a shared fsync of group commit) into `metrics-exporter-prometheus`
//! set up as the `recorder` module's docs say (`ATTEMPTS_BUCKETS`, `SECONDS_BUCKETS` for
//! `_seconds`), in both of its naming modes. Its scrape gives every series name, the
//! `_bucket`/`_sum`/`_count` ones included (mapped to their family by the `# TYPE` lines), and
//! every label of each. The crate's `describe_*` calls, seen by a recorder wrapped around the
//! exporter, list every metric it has: one the drive does not reach fails the test rather than
//! going unchecked.
//!
//! The checker is a small PromQL reader (selectors and their matchers, `by`/`without`,
//! `on`/`ignoring`, function calls); the rule file is read line by line (the subset of YAML a
//! rule file uses, `expr: |` and `>-` block scalars included): no dependency is added. The
//! checker is shown to fail: `the_checker_rejects_what_the_crate_does_not_emit` on made-up
//! queries, and the main test on a misspelt copy of every query of the kit.
#![cfg(all(feature = "metrics", feature = "axum", feature = "sqlite-write"))]

mod common;

// The exporter's setup, as the example app (and the `recorder` module's docs) make it.
#[path = "../examples/common/prometheus.rs"]
#[allow(dead_code, reason = "only its builder is used here")]
mod exporter;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::Mutex;
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::post;
use http::StatusCode;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_exporter_prometheus::PrometheusBuilder;
use metrics_util::layers::FanoutBuilder;
use serde_json::Value;
use sqlx::SqlitePool;
use sqlx::sqlite::{SqlitePoolOptions, SqliteSynchronous};
use tower_sqlite_retry::{DbError, Jitter, RetryPolicy, SqliteRetryLayer, WritePool};

use common::{HttpClient, TestDb, poll_until, serve};

const DASHBOARD: &str = "ops/grafana-dashboard.json";
const RULES: &str = "ops/prometheus-alerts.yml";

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
        writes.hold_fsync(true),
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
    writes.hold_fsync(false);
    assert_eq!(grouped.await.unwrap().status, StatusCode::CREATED);
    assert!(writes.stats().unwrap().syncs >= 1, "a shared fsync ran");

    // A sync of the WAL fails (its directory renamed while a commit waits: the WAL is no
    // longer at its path): the commit is answered 500, and the error counted.
    let dir = db.path.parent().unwrap().to_owned();
    let moved = dir.with_extension("moved");
    writes.hold_fsync(true);
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
    writes.hold_fsync(false);
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
// A small PromQL reader.

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    Num,
    /// `[5m]`, `[$__rate_interval]`, `[1h:1m]`: skipped whole.
    Range,
    Open,
    Close,
    LBrace,
    RBrace,
    Comma,
    Op(&'static str),
}

const OPS: [&str; 16] = [
    "==", "!=", ">=", "<=", "=~", "!~", "=", ">", "<", "+", "-", "*", "/", "%", "^", "@",
];

fn lex(expr: &str) -> Result<Vec<Tok>, String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let rest: String = chars[i..chars.len().min(i + 2)].iter().collect();
        if c.is_whitespace() {
            i += 1;
        } else if c == '#' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '[' {
            while i < chars.len() && chars[i] != ']' {
                i += 1;
            }
            if i == chars.len() {
                return Err("`[` without `]`".into());
            }
            i += 1;
            toks.push(Tok::Range);
        } else if matches!(c, '"' | '\'' | '`') {
            let mut value = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err(format!("a string without its closing {c}")),
                    Some('\\') if c != '`' => {
                        value.extend(chars.get(i + 1));
                        i += 2;
                    }
                    Some(&d) if d == c => break,
                    Some(&d) => {
                        value.push(d);
                        i += 1;
                    }
                }
            }
            i += 1;
            toks.push(Tok::Str(value));
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() {
                if matches!(chars[i], 'e' | 'E') && matches!(chars.get(i + 1), Some('+' | '-')) {
                    i += 2;
                } else if chars[i].is_ascii_alphanumeric() || chars[i] == '.' {
                    i += 1;
                } else {
                    break;
                }
            }
            toks.push(Tok::Num);
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len()
                && (chars[i].is_ascii_alphanumeric() || matches!(chars[i], '_' | ':'))
            {
                i += 1;
            }
            toks.push(Tok::Ident(chars[start..i].iter().collect()));
        } else if let Some(tok) = match c {
            '(' => Some(Tok::Open),
            ')' => Some(Tok::Close),
            '{' => Some(Tok::LBrace),
            '}' => Some(Tok::RBrace),
            ',' => Some(Tok::Comma),
            _ => None,
        } {
            toks.push(tok);
            i += 1;
        } else if let Some(&op) = OPS.iter().find(|op| rest.starts_with(**op)) {
            toks.push(Tok::Op(op));
            i += op.len();
        } else if c == '$' {
            return Err("a Grafana variable outside a string or a range".into());
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    Ok(toks)
}

const AGGREGATIONS: &str =
    "sum min max avg group stddev stdvar count count_values bottomk topk quantile";

/// PromQL's functions but `label_replace` and `label_join` (they make labels this reader
/// cannot follow).
const FUNCTIONS: &str = "\
    abs absent absent_over_time avg_over_time ceil changes clamp clamp_max clamp_min \
    count_over_time day_of_month day_of_week day_of_year days_in_month delta deriv end \
    exp floor histogram_quantile hour idelta increase irate last_over_time ln log10 log2 \
    max_over_time min_over_time minute month predict_linear present_over_time \
    quantile_over_time rate resets round scalar sgn sort sort_desc sqrt start \
    stddev_over_time stdvar_over_time sum_over_time time timestamp vector year";

/// Whether `word` is one of the space-separated `words`.
fn is_one_of(words: &str, word: &str) -> bool {
    words.split_whitespace().any(|w| w == word)
}

#[derive(Debug)]
struct Selector {
    name: String,
    /// Its name's token.
    at: usize,
    /// `(label, op, value)`.
    matchers: Vec<(String, &'static str, String)>,
}

#[derive(Debug)]
struct Grouping {
    /// `by`, `without`, `on`, `ignoring`, `group_left`, `group_right`.
    keyword: String,
    labels: Vec<String>,
    /// The tokens it applies to: an aggregation's argument, or the whole query.
    scope: Range<usize>,
}

#[derive(Debug)]
struct Call {
    name: String,
    args: Range<usize>,
    /// An aggregation with `by` or `without`.
    grouped: bool,
}

#[derive(Debug, Default)]
struct Query {
    selectors: Vec<Selector>,
    groupings: Vec<Grouping>,
    calls: Vec<Call>,
}

/// `( label, ... )` at `at`: the labels, and the token after `)`.
fn label_list(toks: &[Tok], at: usize) -> Result<(Vec<String>, usize), String> {
    if toks.get(at) != Some(&Tok::Open) {
        return Err("a label list without `(`".into());
    }
    let mut labels = Vec::new();
    let mut i = at + 1;
    loop {
        match (toks.get(i), toks.get(i + 1)) {
            (Some(Tok::Close), _) => return Ok((labels, i + 1)),
            (Some(Tok::Ident(label)), Some(Tok::Comma)) => {
                labels.push(label.clone());
                i += 2;
            }
            (Some(Tok::Ident(label)), Some(Tok::Close)) => {
                labels.push(label.clone());
                return Ok((labels, i + 2));
            }
            _ => return Err("a label list that is not `(label, ...)`".into()),
        }
    }
}

fn analyze(expr: &str) -> Result<Query, String> {
    let toks = lex(expr)?;
    let mut partner = vec![0; toks.len()];
    let mut open = Vec::new();
    for (i, tok) in toks.iter().enumerate() {
        match tok {
            Tok::Open => open.push(i),
            Tok::Close => {
                let o = open.pop().ok_or("a `)` without its `(`")?;
                partner[o] = i;
                partner[i] = o;
            }
            _ => {}
        }
    }
    if !open.is_empty() {
        return Err("a `(` without its `)`".into());
    }
    let mut q = Query::default();
    // The `by (...)` lists after an aggregation's argument, read with the aggregation.
    let mut consumed = vec![false; toks.len()];
    let mut i = 0;
    while i < toks.len() {
        if consumed[i] {
            i += 1;
            continue;
        }
        let Tok::Ident(word) = &toks[i] else {
            if toks[i] == Tok::LBrace {
                return Err("a selector without a metric name".into());
            }
            i += 1;
            continue;
        };
        let lower = word.to_ascii_lowercase();
        let next = toks.get(i + 1);
        let grouping_at = |at: usize| match toks.get(at) {
            Some(Tok::Ident(w)) if ["by", "without"].contains(&w.to_ascii_lowercase().as_str()) => {
                Some(w.to_ascii_lowercase())
            }
            _ => None,
        };
        if is_one_of(AGGREGATIONS, &lower) {
            if let Some(keyword) = grouping_at(i + 1) {
                // `sum by (labels) (argument)`
                let (labels, after) = label_list(&toks, i + 2)?;
                if toks.get(after) != Some(&Tok::Open) {
                    return Err(format!("`{word} {keyword} (...)` without its argument"));
                }
                let args = after + 1..partner[after];
                q.groupings.push(Grouping {
                    keyword,
                    labels,
                    scope: args.clone(),
                });
                q.calls.push(Call {
                    name: lower,
                    args,
                    grouped: true,
                });
                i = after + 1;
            } else if next == Some(&Tok::Open) {
                // `sum (argument)`, perhaps `by (labels)` after it
                let args = i + 2..partner[i + 1];
                let mut grouped = false;
                if let Some(keyword) = grouping_at(args.end + 1) {
                    let (labels, after) = label_list(&toks, args.end + 2)?;
                    consumed[args.end + 1..after].fill(true);
                    q.groupings.push(Grouping {
                        keyword,
                        labels,
                        scope: args.clone(),
                    });
                    grouped = true;
                }
                q.calls.push(Call {
                    name: lower,
                    args,
                    grouped,
                });
                i += 2;
            } else {
                return Err(format!("the aggregation `{word}` without its argument"));
            }
            continue;
        }
        match lower.as_str() {
            "by" | "without" => return Err(format!("`{word}` outside an aggregation")),
            "on" | "ignoring" | "group_left" | "group_right" => {
                if next == Some(&Tok::Open) {
                    let (labels, after) = label_list(&toks, i + 1)?;
                    q.groupings.push(Grouping {
                        keyword: lower.clone(),
                        labels,
                        scope: 0..toks.len(),
                    });
                    i = after;
                } else {
                    i += 1;
                }
            }
            "bool" | "and" | "or" | "unless" | "inf" | "nan" => i += 1,
            "offset" => i += 2,
            "label_replace" | "label_join" => {
                return Err(format!("`{word}` makes labels this checker cannot follow"));
            }
            _ if next == Some(&Tok::Open) => {
                if !is_one_of(FUNCTIONS, &lower) {
                    return Err(format!("`{word}()` is not a PromQL function"));
                }
                q.calls.push(Call {
                    name: lower.clone(),
                    args: i + 2..partner[i + 1],
                    grouped: false,
                });
                i += 2;
            }
            _ => {
                let mut selector = Selector {
                    name: word.clone(),
                    at: i,
                    matchers: Vec::new(),
                };
                i += 1;
                if toks.get(i) == Some(&Tok::LBrace) {
                    i += 1;
                    loop {
                        match &toks[i..] {
                            [Tok::RBrace, ..] => break,
                            [Tok::Ident(label), Tok::Op(op), Tok::Str(value), rest @ ..]
                                if ["=", "!=", "=~", "!~"].contains(op) =>
                            {
                                selector.matchers.push((label.clone(), *op, value.clone()));
                                i += 3;
                                if rest.first() == Some(&Tok::Comma) {
                                    i += 1;
                                }
                            }
                            _ => {
                                return Err(format!("the matchers of `{word}` are not read"));
                            }
                        }
                    }
                    i += 1;
                }
                q.selectors.push(selector);
            }
        }
    }
    Ok(q)
}

/// What is wrong with `expr` against what the crate emits (nothing: an empty list).
fn problems(expr: &str, truth: &Truth) -> Vec<String> {
    let q = match analyze(expr) {
        Ok(q) => q,
        Err(e) => return vec![format!("cannot read the query: {e}")],
    };
    let mut out = Vec::new();
    for s in &q.selectors {
        let Some(series) = truth.series.get(&s.name) else {
            out.push(format!(
                "`{}` is not a series the crate emits (it emits: {})",
                s.name,
                truth.names()
            ));
            continue;
        };
        for (label, op, value) in &s.matchers {
            if !series.has_label(label) {
                out.push(format!(
                    "`{}` has no label `{label}` (its labels: {})",
                    s.name,
                    series.labels()
                ));
            }
            if value.contains('$') && !op.ends_with('~') {
                out.push(format!(
                    "`{label}{op}\"{value}\"`: a Grafana variable (several values, or All) needs `=~`"
                ));
            }
        }
    }
    for g in &q.groupings {
        for s in q.selectors.iter().filter(|s| g.scope.contains(&s.at)) {
            let Some(series) = truth.series.get(&s.name) else {
                continue;
            };
            for label in g.labels.iter().filter(|l| !series.has_label(l)) {
                out.push(format!(
                    "`{} ({})`: `{}` has no label `{label}` (its labels: {})",
                    g.keyword,
                    g.labels.join(", "),
                    s.name,
                    series.labels()
                ));
            }
        }
    }
    for c in &q.calls {
        let inside: Vec<(&Selector, &Series)> = q
            .selectors
            .iter()
            .filter(|s| c.args.contains(&s.at))
            .filter_map(|s| Some((s, truth.series.get(&s.name)?)))
            .collect();
        match c.name.as_str() {
            "rate" | "irate" | "increase" | "resets" => {
                for (s, series) in inside.iter().filter(|(_, series)| !series.is_counter()) {
                    out.push(format!(
                        "`{}()` of `{}`, a {:?}: it takes counters (a histogram's too)",
                        c.name, s.name, series.kind
                    ));
                }
            }
            "delta" | "idelta" | "deriv" | "predict_linear" => {
                for (s, _) in inside.iter().filter(|(_, series)| series.is_counter()) {
                    out.push(format!("`{}()` of `{}`, a counter", c.name, s.name));
                }
            }
            "histogram_quantile" => {
                for (s, _) in inside.iter().filter(|(_, series)| {
                    (series.kind, series.part) != (Kind::Histogram, Part::Bucket)
                }) {
                    out.push(format!(
                        "`histogram_quantile()` over `{}`, not a histogram's `_bucket` series",
                        s.name
                    ));
                }
                for g in q
                    .groupings
                    .iter()
                    .filter(|g| c.args.contains(&g.scope.start))
                {
                    let has_le = g.labels.iter().any(|l| l == "le");
                    if (g.keyword == "by") != has_le {
                        out.push(format!(
                            "`{} ({})` inside `histogram_quantile()` loses `le`",
                            g.keyword,
                            g.labels.join(", ")
                        ));
                    }
                }
            }
            _ => {}
        }
    }
    out.dedup();
    out
}

/// The labels the result of `expr` can have (for legends and annotations): those of every
/// series it reads, kept by every `by`, none after an aggregation without one.
fn result_labels(expr: &str, truth: &Truth) -> BTreeSet<String> {
    let Ok(q) = analyze(expr) else {
        return BTreeSet::new();
    };
    let mut out: Option<BTreeSet<String>> = None;
    let mut meet = |set: BTreeSet<String>| {
        out = Some(match out.take() {
            Some(o) => o.intersection(&set).cloned().collect(),
            None => set,
        });
    };
    for series in q.selectors.iter().filter_map(|s| truth.series.get(&s.name)) {
        let mut labels = series.labels.clone();
        labels.extend(TARGET_LABELS.map(str::to_owned));
        meet(labels);
    }
    for g in q.groupings.iter().filter(|g| g.keyword == "by") {
        meet(g.labels.iter().cloned().collect());
    }
    for c in &q.calls {
        if is_one_of(AGGREGATIONS, &c.name) && !c.grouped {
            meet(BTreeSet::new());
        }
    }
    let mut out = out.unwrap_or_default();
    for g in q.groupings.iter().filter(|g| g.keyword == "without") {
        for label in &g.labels {
            out.remove(label);
        }
    }
    if q.calls.iter().any(|c| c.name == "histogram_quantile") {
        out.remove("le");
    }
    out
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

/// The families `expr` reads.
fn families(expr: &str, truth: &Truth) -> BTreeSet<String> {
    analyze(expr)
        .map(|q| {
            q.selectors
                .iter()
                .filter_map(|s| Some(truth.series.get(&s.name)?.family.clone()))
                .collect()
        })
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------------------------
// The rule file, read line by line.

#[derive(Debug, Default)]
struct Rule {
    alert: String,
    line: usize,
    expr: String,
    for_: String,
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

/// `key: value` (the value may be empty).
fn key_value(text: &str, n: usize) -> Result<(&str, &str), String> {
    let (key, value) = text
        .split_once(':')
        .ok_or_else(|| format!("line {n}: not `key: value`"))?;
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(format!("line {n}: key {key:?}"));
    }
    Ok((key, value.trim()))
}

/// A one-line scalar: plain, `"double"` or `'single'` quoted.
fn scalar(value: &str, n: usize) -> Result<String, String> {
    let mut out = String::new();
    let rest = if let Some(body) = value.strip_prefix('"') {
        let mut chars = body.char_indices();
        loop {
            match chars.next() {
                None => return Err(format!("line {n}: an unclosed \"")),
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, c)) => out.push(c),
                    None => return Err(format!("line {n}: a \\ at the end")),
                },
                Some((i, '"')) => break &body[i + 1..],
                Some((_, c)) => out.push(c),
            }
        }
    } else if let Some(body) = value.strip_prefix('\'') {
        let mut rest = body;
        loop {
            let end = rest
                .find('\'')
                .ok_or_else(|| format!("line {n}: an unclosed '"))?;
            out.push_str(&rest[..end]);
            rest = &rest[end + 1..];
            match rest.strip_prefix('\'') {
                Some(more) => {
                    out.push('\'');
                    rest = more;
                }
                None => break rest,
            }
        }
    } else {
        if value.starts_with(['{', '[', '&', '*', '!', '%', '@', '`']) {
            return Err(format!("line {n}: YAML this reader does not read: {value}"));
        }
        let plain = value.split(" #").next().unwrap_or("");
        return Ok(plain.trim().to_owned());
    };
    let rest = rest.trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(format!("line {n}: text after a quoted value: {rest}"));
    }
    Ok(out)
}

/// The value of a key at column `column`: one line, or a block scalar (`|`, `>`, with a `-`
/// or `+` after) in the lines after it; the index of the line after the value.
fn value(
    lines: &[&str],
    next: usize,
    column: usize,
    v: &str,
    n: usize,
) -> Result<(String, usize), String> {
    let Some(style) = v.chars().next().filter(|c| ['|', '>'].contains(c)) else {
        return Ok((scalar(v, n)?, next));
    };
    if !["", "-", "+"].contains(&&v[1..]) {
        return Err(format!("line {n}: block scalar header {v:?}"));
    }
    let mut end = next;
    while end < lines.len() {
        let line = lines[end];
        let trimmed = line.trim_start();
        if !trimmed.is_empty() && line.len() - trimmed.len() <= column {
            break;
        }
        end += 1;
    }
    let block = &lines[next..end];
    let indent = block
        .iter()
        .find(|l| !l.trim().is_empty())
        .map_or(0, |l| l.len() - l.trim_start().len());
    let body: Vec<&str> = block
        .iter()
        .map(|l| l.get(indent..).unwrap_or(""))
        .collect();
    let text = if style == '|' {
        body.join("\n")
    } else {
        // Folded: lines joined by spaces, an empty line a line break.
        body.split(|l| l.is_empty())
            .map(|para| para.join(" "))
            .collect::<Vec<_>>()
            .join("\n")
    };
    Ok((text.trim_end().to_owned(), end))
}

fn read_rules(text: &str) -> Result<Vec<Rule>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut rules = Vec::new();
    // The rule being read, and its keys' column.
    let mut current: Option<(Rule, usize)> = None;
    let mut section: Option<String> = None;
    let mut i = 0;
    while i < lines.len() {
        let (line, n) = (lines[i], i + 1);
        i += 1;
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if line.contains('\t') {
            return Err(format!("line {n}: a tab"));
        }
        let indent = line.len() - trimmed.len();
        if let Some(item) = trimmed.strip_prefix("- ") {
            let (key, v) = key_value(item, n)?;
            rules.extend(current.take().map(|(rule, _)| rule));
            section = None;
            match key {
                "alert" => {
                    let rule = Rule {
                        alert: scalar(v, n)?,
                        line: n,
                        ..Rule::default()
                    };
                    current = Some((rule, indent + 2));
                }
                "name" => {} // a group
                _ => {
                    return Err(format!(
                        "line {n}: a list item `{key}` (recording rules are not read)"
                    ));
                }
            }
            continue;
        }
        let (key, v) = key_value(trimmed, n)?;
        match &mut current {
            Some((rule, column)) if indent == *column => {
                section = None;
                let (v, next) = value(&lines, i, indent, v, n)?;
                i = next;
                match key {
                    "expr" => rule.expr = v,
                    "for" => rule.for_ = v,
                    "keep_firing_for" => {}
                    "labels" | "annotations" if v.is_empty() => section = Some(key.to_owned()),
                    _ => return Err(format!("line {n}: a rule's key `{key}`")),
                }
            }
            Some((rule, column)) if indent > *column => {
                let (v, next) = value(&lines, i, indent, v, n)?;
                i = next;
                match section.as_deref() {
                    Some("labels") => rule.labels.insert(key.to_owned(), v),
                    Some("annotations") => rule.annotations.insert(key.to_owned(), v),
                    _ => return Err(format!("line {n}: `{key}` indented under nothing")),
                };
            }
            _ => {
                rules.extend(current.take().map(|(rule, _)| rule));
                if !["groups", "rules", "interval", "limit"].contains(&key) {
                    return Err(format!("line {n}: a group's key `{key}`"));
                }
            }
        }
    }
    rules.extend(current.map(|(rule, _)| rule));
    Ok(rules)
}

/// A Prometheus duration (`5m`, `1h30m`), in seconds.
fn duration(text: &str) -> Option<u64> {
    let mut total = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit())?;
        let number: u64 = rest[..digits].parse().ok()?;
        let unit_end = rest[digits..]
            .find(|c: char| c.is_ascii_digit())
            .map_or(rest.len(), |e| digits + e);
        let unit = match &rest[digits..unit_end] {
            "ms" => 0,
            "s" => 1,
            "m" => 60,
            "h" => 3600,
            "d" => 86_400,
            "w" => 604_800,
            "y" => 31_536_000,
            _ => return None,
        };
        total += number * unit;
        rest = &rest[unit_end..];
    }
    Some(total)
}

// ---------------------------------------------------------------------------------------------
// The kit, checked.

struct Kit {
    dashboard: Value,
    rules: Vec<Rule>,
    rules_text: String,
}

fn kit() -> Kit {
    let read = |path: &str| {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let dashboard = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let rules_text = read(RULES);
    let rules = read_rules(&rules_text).unwrap_or_else(|e| panic!("{RULES}: {e}"));
    Kit {
        dashboard,
        rules,
        rules_text,
    }
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
    let exprs = kit
        .rules_text
        .lines()
        .filter(|l| l.trim_start().starts_with("expr:"))
        .count();
    if kit.rules.is_empty() || exprs != kit.rules.len() {
        out.push(format!(
            "{RULES}: {} rules read, {exprs} `expr:` lines",
            kit.rules.len()
        ));
    }
    let mut alerts = BTreeSet::new();
    for rule in &kit.rules {
        let here = format!("{RULES}:{}: {}", rule.line, rule.alert);
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
        for key in ["summary", "description"] {
            if rule.annotations.get(key).is_none_or(String::is_empty) {
                out.push(format!("{here}: no {key}"));
            }
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

        let (mut wrong, shown) = dashboard_problems(&kit.dashboard, &truth);
        wrong.extend(rules_problems(&kit, &truth));
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
            .chain(kit.rules.iter().map(|r| (r.alert.clone(), r.expr.clone())));
        for (here, expr) in queries {
            let name = &analyze(&expr).unwrap().selectors[0].name;
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
        ("rat(app_requests_total[5m])", "not a PromQL function"),
        (r#"app_requests_total{http_route="$route"}"#, "needs `=~`"),
        ("sum(rate(app_requests_total[5m])", "without its `)`"),
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
    let err = read_rules(text).unwrap_err();
    assert!(err.contains("line 26"), "flow mappings are refused: {err}");
    let rules =
        read_rules(&text.replace("labels: {}", "labels:\n          severity: info")).unwrap();
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].alert, "Literal");
    assert_eq!(rules[0].expr, "sum by (x) (\n  rate(a_total[5m])\n) > 0");
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
    assert_eq!(rules[1].labels["severity"], "info");
    // A recording rule, a key out of place: said, not skipped.
    assert!(read_rules("groups:\n  - name: g\n    rules:\n      - record: r\n").is_err());
    assert!(
        read_rules("groups:\n  - name: g\n    rules:\n      - alert: A\n        exp: x\n").is_err()
    );
}
