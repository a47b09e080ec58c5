//! What a request reports: its span (opened only when a replay, a give-up or a real wait is
//! in question), the replay and give-up events, and its end (the span's fields, the layer's
//! counters, the metrics, and the outer layer that handed it over).

use std::time::Duration;

use http::Request;
use http_body::Body;
use tower_service::Service;
use tracing::Span;

use super::Core;
use crate::attempt::{Outcome, RequestState};
use crate::body::{NotReplayable, ReplayBody};
use crate::classify::Retryable;
use crate::decide::{gave_up, give_up_event};
use crate::recorder;
use crate::shared::Shared;

impl<S, C, B> Core<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    /// The request's span, opened the first time a replay, a give-up or a real wait is in
    /// question (a first attempt that succeeds opens none), as a child of the span current
    /// then (the caller's).
    pub(super) fn span(&mut self) -> Span {
        if self.span.is_none() {
            self.span = tracing::info_span!(
                target: "tower_sqlite_retry",
                "sqlite_retry",
                http.request.method = %self.request.route().method,
                http.route = self.request.route().path(),
                retry.max_attempts = self.shared.policy.max_attempts,
                retry.attempts = tracing::field::Empty,
                retry.outcome = tracing::field::Empty,
                http.request.resend_count = tracing::field::Empty,
                retry.queue_ms = tracing::field::Empty,
                db.response.status_code = tracing::field::Empty,
                error.type = tracing::field::Empty,
            );
        }
        self.span.clone()
    }

    /// The response future was dropped before the answer: `queued` is the wait it was in.
    pub(super) fn cancelled(&self, queued: Option<Duration>) {
        let _entered = self.span.enter();
        if let Some(waited) = queued {
            recorder::queue_wait(
                self.request.route().path(),
                &self.request.route().method,
                waited,
            );
        }
        tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
            retry.attempts = self.attempt,
            http.request.method = %self.request.route().method,
            http.route = self.request.route().path(),
            "request cancelled"
        );
        // An inner layer that took the request over counts it (its future is dropped next).
        let passed_through = self.request.is_claimed();
        self.end(Outcome::Cancelled, self.attempt, passed_through);
    }

    /// The end of the request, whatever it was: the slot goes back (earlier if the handler
    /// fenced), the end is recorded, the recording stops.
    pub(super) fn end(&self, outcome: Outcome, attempts: u32, passed_through: bool) {
        // An attempt's `Attempt` may outlive this future (a task the handler spawned): the
        // slot must not live on with it.
        self.request.release_slot();
        let (reason, backoff, waited) = match self.replays.as_deref() {
            Some(r) => (r.reason.as_ref(), r.total_delay, r.waited),
            None => (None, Duration::ZERO, Duration::ZERO),
        };
        if !waited.is_zero() {
            self.span
                .record("retry.queue_ms", waited.as_secs_f64() * 1000.0);
        }
        let end = End {
            outcome,
            attempts,
            reason,
            backoff,
            passed_through,
        };
        record_end(&self.span, &self.shared, &self.request, end);
        self.body.stop();
    }

    pub(super) fn replay_event(&self, attempt: u32, delay: Duration) {
        let reason = self.reason();
        let elapsed_ms = self.elapsed().as_millis() as u64;
        let delay_ms = delay.as_secs_f64() * 1000.0;
        event_at_level!(self.shared.policy.replay_event_level,
            retry.attempt = attempt,
            retry.delay_ms = delay_ms,
            retry.elapsed_ms = elapsed_ms,
            db.response.status_code = reason.map(Retryable::code),
            error.type = reason.map(Retryable::name),
            http.request.method = %self.request.route().method,
            http.route = self.request.route().path(),
            "retrying request"
        );
    }

    pub(super) fn gave_up_event(&self, outcome: Outcome, attempts: u32) {
        let reason = self.reason();
        let not_replayable = self.not_replayable().map(NotReplayable::as_str);
        let elapsed_ms = self.elapsed().as_millis() as u64;
        let (level, message) = give_up_event(outcome);
        event_at_level!(level,
            retry.attempts = attempts,
            retry.elapsed_ms = elapsed_ms,
            retry.outcome = outcome.as_str(),
            retry.not_replayable = not_replayable,
            db.response.status_code = reason.map(Retryable::code),
            error.type = reason.map(Retryable::name),
            http.request.method = %self.request.route().method,
            http.route = self.request.route().path(),
            "{message}"
        );
    }
}

/// How a request ended, as recorded.
struct End<'a> {
    outcome: Outcome,
    attempts: u32,
    reason: Option<&'a Retryable>,
    backoff: Duration,
    /// An inner layer handled the request: it emitted the metrics already.
    passed_through: bool,
}

/// Records how a request ended: the span's fields, the counters, the metrics, and the outer
/// layer that handed the request over, if any.
fn record_end(span: &Span, shared: &Shared, request: &RequestState, end: End<'_>) {
    let route = request.route();
    let End {
        outcome,
        attempts,
        reason,
        backoff,
        passed_through,
    } = end;
    span.record("retry.attempts", attempts);
    span.record("retry.outcome", outcome.as_str());
    if attempts > 1 {
        span.record("http.request.resend_count", attempts - 1);
    }
    if let Some(r) = reason {
        span.record("db.response.status_code", r.code());
        span.record("error.type", r.name());
    }
    shared.stats.counters.finished(outcome, attempts);
    if !passed_through {
        recorder::request_finished(recorder::Finished {
            route: route.path(),
            method: &route.method,
            outcome,
            // The error names the outcome only when the request ended on it.
            error_type: reason.filter(|_| gave_up(outcome)).map(Retryable::name),
            attempts,
            backoff,
        });
    }
    if let Some(outer) = request.outer() {
        outer.report(outcome, attempts);
    }
}
