//! The tracing schema, captured with a real subscriber and asserted field by field.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

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
    let _guard = tracing::subscriber::set_default(subscriber);

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
async fn first_try_success_records_outcome_without_warnings() {
    let captured = Captured::default();
    let subscriber = tracing_subscriber::registry().with(captured.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
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
    let spans = captured.closed_spans.lock().unwrap().clone();
    let (_, span) = spans.iter().find(|(n, _)| n == "sqlite_retry").unwrap();
    assert_eq!(span["retry.outcome"], "first_try");
    assert_eq!(span["retry.attempts"], "1");
}
