//! The tracing schema, captured with a real subscriber and asserted field by field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common;
use axum::Router;
use axum::body::Body;
use axum::routing::post;
use http::Request;
use tower::ServiceExt;
use tower_sqlite_retry::{Attempt, DbError, Jitter, RetryPolicy, SqliteRetryLayer};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

#[derive(Clone, Default)]
struct Captured {
    events: Arc<Mutex<Vec<(Level, String, Fields)>>>,
    closed_spans: Arc<Mutex<Vec<(String, Fields)>>>,
}

struct Visitor<'a>(&'a mut Fields);

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

struct SpanFields(Fields);

impl<S: Subscriber + for<'a> LookupSpan<'a>> tracing_subscriber::Layer<S> for Captured {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut Visitor(&mut fields));
        ctx.span(id)
            .unwrap()
            .extensions_mut()
            .insert(SpanFields(fields));
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let span = ctx.span(id).unwrap();
        let mut ext = span.extensions_mut();
        values.record(&mut Visitor(&mut ext.get_mut::<SpanFields>().unwrap().0));
    }
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != "tower_sqlite_retry" {
            return;
        }
        let mut fields = Fields::new();
        event.record(&mut Visitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        self.events
            .lock()
            .unwrap()
            .push((*event.metadata().level(), message, fields));
    }
    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let span = ctx.span(&id).unwrap();
        let fields = span.extensions().get::<SpanFields>().unwrap().0.clone();
        self.closed_spans
            .lock()
            .unwrap()
            .push((span.name().to_owned(), fields));
    }
}

#[tokio::test]
async fn retries_and_exhaustion_follow_the_schema() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _guard = common::capture_tracing(subscriber);

    let policy = RetryPolicy::default()
        .max_attempts(3)
        .base_delay(Duration::from_millis(1))
        .max_delay(Duration::from_millis(2))
        .jitter(Jitter::None);
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(|_: Attempt| async { Err::<(), _>(DbError::from(sqlx::Error::PoolTimedOut)) }),
        )
        .layer(SqliteRetryLayer::new(policy));
    let res = app
        .oneshot(Request::post("/orders/42").body(Body::from("x")).unwrap())
        .await
        .unwrap();
    assert_eq!(res.status(), 503);

    let events = captured.events.lock().unwrap().clone();
    let retries: Vec<_> = events
        .iter()
        .filter(|(_, m, _)| m == "retrying request")
        .collect();
    assert_eq!(retries.len(), 2, "one event per retry: {events:#?}");
    for (i, (level, _, f)) in retries.iter().enumerate() {
        assert_eq!(*level, Level::DEBUG, "a replay is the layer doing its job");
        assert_eq!(f["retry.attempt"], (i + 1).to_string());
        assert!(f["retry.delay_ms"].parse::<f64>().unwrap() <= 2.0);
        assert!(f.contains_key("retry.elapsed_ms"));
        assert_eq!(f["db.response.status_code"], "pool_timed_out");
        assert_eq!(f["error.type"], "POOL_TIMED_OUT");
        assert_eq!(f["http.request.method"], "POST");
        assert_eq!(
            f["http.route"], "/orders/{id}",
            "the template, never the raw path"
        );
    }
    let (level, _, f) = events
        .iter()
        .find(|(_, m, _)| m == "retries exhausted")
        .expect("an ERROR on exhaustion");
    assert_eq!(*level, Level::ERROR);
    assert_eq!(f["retry.attempts"], "3");
    assert_eq!(f["retry.outcome"], "exhausted");
    assert!(f.contains_key("retry.elapsed_ms"));

    let spans = captured.closed_spans.lock().unwrap().clone();
    let (_, span) = spans
        .iter()
        .find(|(name, _)| name == "sqlite_retry")
        .expect("one span per request");
    assert_eq!(spans.iter().filter(|(n, _)| n == "sqlite_retry").count(), 1);
    assert_eq!(span["http.request.method"], "POST");
    assert_eq!(span["http.route"], "/orders/{id}");
    assert_eq!(span["retry.max_attempts"], "3");
    assert_eq!(span["retry.attempts"], "3");
    assert_eq!(span["retry.outcome"], "exhausted");
    assert_eq!(span["http.request.resend_count"], "2");
    assert_eq!(span["db.response.status_code"], "pool_timed_out");
    assert_eq!(span["error.type"], "POOL_TIMED_OUT");
}

#[tokio::test]
async fn first_try_success_opens_no_span_and_warns_nothing() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _guard = common::capture_tracing(subscriber);
    let app = Router::new()
        .route("/ok", post(|| async { "ok" }))
        .layer(SqliteRetryLayer::new(RetryPolicy::default()));
    app.oneshot(Request::post("/ok").body(Body::empty()).unwrap())
        .await
        .unwrap();
    let events = captured.events.lock().unwrap().clone();
    assert!(
        events.iter().all(|(l, _, _)| *l > Level::WARN),
        "{events:?}"
    );
    // A first attempt that succeeds costs no span at all (the metrics count it).
    let spans = captured.closed_spans.lock().unwrap().clone();
    assert!(spans.iter().all(|(n, _)| n != "sqlite_retry"), "{spans:?}");
}

type Events = Vec<(Level, String)>;

/// Sends one request through a layer with `policy` to a handler that answers per path, and
/// returns the events at each level and the span's outcome.
async fn levels_for(
    policy: RetryPolicy,
    path: &'static str,
    body: &'static str,
    cancel: bool,
) -> (Events, String) {
    use axum::response::IntoResponse;
    use http::StatusCode;
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _guard = common::capture_tracing(subscriber);
    let busy = || DbError::from(sqlx::Error::PoolTimedOut).into_response();
    let app = Router::new()
        .route("/ok", post(|| async { "ok" }))
        .route(
            "/second",
            post(move |a: Attempt| async move {
                if a.number() == 1 {
                    busy()
                } else {
                    "ok".into_response()
                }
            }),
        )
        .route("/busy", post(move || async move { busy() }))
        .route(
            "/fenced",
            post(move |a: Attempt| async move {
                a.fence();
                busy()
            }),
        )
        .route(
            "/conflict",
            post(move |a: Attempt| async move {
                if a.number() == 1 {
                    busy()
                } else {
                    StatusCode::CONFLICT.into_response()
                }
            }),
        )
        .route(
            "/slow",
            post(move || async move {
                tokio::time::sleep(Duration::from_millis(30)).await;
                busy()
            }),
        )
        .layer(SqliteRetryLayer::new(policy));
    let fut = app.oneshot(Request::post(path).body(Body::from(body)).unwrap());
    if cancel {
        // Polled until it is in its first backoff (a long one), then dropped: the client
        // went away.
        let mut fut = std::pin::pin!(fut);
        let in_backoff = || {
            captured
                .events
                .lock()
                .unwrap()
                .iter()
                .any(|(_, m, _)| m == "retrying request")
        };
        while !in_backoff() {
            assert!(futures::poll!(fut.as_mut()).is_pending());
            tokio::task::yield_now().await;
        }
    } else {
        fut.await.unwrap();
    }
    let events = captured
        .events
        .lock()
        .unwrap()
        .iter()
        .map(|(l, m, _)| (*l, m.clone()))
        .collect();
    // The span opens only once a replay or a give-up is in question: `none` without one.
    let spans = captured.closed_spans.lock().unwrap().clone();
    let outcome = spans
        .iter()
        .find(|(n, _)| n == "sqlite_retry")
        .map_or("none".to_owned(), |(_, span)| span["retry.outcome"].clone());
    (events, outcome)
}

#[tokio::test]
async fn levels_match_what_happened() {
    let base = || {
        RetryPolicy::default()
            .max_attempts(3)
            .base_delay(Duration::ZERO)
            .max_delay(Duration::from_millis(1))
    };
    let retrying = (Level::DEBUG, "retrying request".to_owned());
    let exhausted = (Level::ERROR, "retries exhausted".to_owned());
    let not_retried = (Level::WARN, "not retried".to_owned());
    let db_error = (Level::DEBUG, "db error (retryable)".to_owned());
    #[rustfmt::skip]
    let cases: Vec<(&str, RetryPolicy, &str, &str, Events)> = vec![
        ("first_try", base(), "/ok", "x", vec![]),
        ("succeeded_after_retry", base(), "/second", "x", vec![db_error.clone(), retrying.clone()]),
        ("exhausted", base(), "/busy", "x", vec![db_error.clone(), retrying.clone(), db_error.clone(), retrying.clone(), db_error.clone(), exhausted.clone()]),
        ("deadline", base().base_delay(Duration::from_millis(50)).max_delay(Duration::from_millis(50)).jitter(Jitter::None).deadline(Duration::from_millis(60)), "/slow", "x", vec![db_error.clone(), exhausted.clone()]),
        // The budget is asked when the replay would start, after its backoff.
        ("budget_exhausted", base().tps_budget(0.0, 0), "/busy", "x", vec![db_error.clone(), retrying.clone(), not_retried.clone()]),
        ("not_replayable", base().max_body_bytes(1), "/busy", "too long", vec![(Level::DEBUG, "passing through without retries".to_owned()), db_error.clone(), not_retried.clone()]),
        ("fenced", base(), "/fenced", "x", vec![db_error.clone(), not_retried.clone()]),
        ("non_retryable", base(), "/conflict", "x", vec![db_error.clone(), retrying.clone()]),
        ("cancelled", base().base_delay(Duration::from_secs(60)).max_delay(Duration::from_secs(60)).jitter(Jitter::None).deadline(Duration::from_secs(3600)), "/busy", "x", vec![db_error.clone(), retrying.clone(), (Level::DEBUG, "request cancelled".to_owned())]),
    ];
    for (outcome, policy, path, body, want) in cases {
        let (events, got) = levels_for(policy, path, body, outcome == "cancelled").await;
        let span_outcome = if outcome == "first_try" {
            "none"
        } else {
            outcome
        };
        assert_eq!(got, span_outcome, "{outcome}: span outcome");
        assert_eq!(events, want, "{outcome}: events and levels");
        // WARN and ERROR only when the layer gave up.
        let loud = events.iter().any(|(l, _)| *l <= Level::WARN);
        let gave_up = matches!(
            outcome,
            "exhausted" | "deadline" | "budget_exhausted" | "not_replayable" | "fenced"
        );
        assert_eq!(loud, gave_up, "{outcome}");
    }
}

#[tokio::test]
async fn the_replay_event_level_is_configurable() {
    let policy = RetryPolicy::default()
        .max_attempts(2)
        .base_delay(Duration::ZERO)
        .max_delay(Duration::from_millis(1))
        .replay_event_level(Level::INFO);
    let (events, outcome) = levels_for(policy, "/second", "x", false).await;
    assert_eq!(outcome, "succeeded_after_retry");
    assert!(
        events.contains(&(Level::INFO, "retrying request".to_owned())),
        "{events:?}"
    );
}
