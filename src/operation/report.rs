//! What an operation reports: the retry and give-up events (the layer's, with
//! `retry.operation` where the layer has `http.route`) and its end in the metrics facade.

use std::time::Duration;

use tracing::Level;

use crate::classify::Retryable;
use crate::decide::{gave_up, give_up_event};
use crate::metrics::Outcome;
use crate::recorder;

/// How an operation (a call, a request of a tower service, a loop's streak) ended.
pub(super) struct End<'a> {
    pub(super) outcome: Outcome,
    pub(super) attempts: u32,
    pub(super) elapsed: Duration,
    /// The time it spent in backoff.
    pub(super) backoff: Duration,
    /// The retryable error it retried on last.
    pub(super) reason: Option<&'a Retryable>,
    /// A loop's streak: giving up is a WARN (the loop goes on), never an ERROR.
    pub(super) in_loop: bool,
}

/// One retry given: the `retrying operation` event at the policy's level, the metric.
pub(super) fn retrying(
    operation: &str,
    level: Level,
    attempt: u32,
    delay: Duration,
    elapsed: Duration,
    reason: Option<&Retryable>,
) {
    let delay_ms = delay.as_secs_f64() * 1000.0;
    let elapsed_ms = elapsed.as_millis() as u64;
    event_at_level!(level,
        retry.attempt = attempt,
        retry.delay_ms = delay_ms,
        retry.elapsed_ms = elapsed_ms,
        db.response.status_code = reason.map(Retryable::code),
        error.type = reason.map(Retryable::name),
        retry.operation = operation,
        "retrying operation"
    );
    recorder::operation_retry(operation, reason.map_or("", Retryable::name));
}

/// The end: the give-up event where it gave up, the metrics.
pub(super) fn finished(operation: &str, end: &End<'_>) {
    let End {
        outcome,
        attempts,
        elapsed,
        backoff,
        reason,
        in_loop,
    } = *end;
    if gave_up(outcome) {
        let elapsed_ms = elapsed.as_millis() as u64;
        // A loop's streak gives up at WARN whatever ran out: the loop goes on.
        let (level, message) = give_up_event(outcome);
        let level = if in_loop { Level::WARN } else { level };
        event_at_level!(level,
            retry.attempts = attempts,
            retry.elapsed_ms = elapsed_ms,
            retry.outcome = outcome.as_str(),
            db.response.status_code = reason.map(Retryable::code),
            error.type = reason.map(Retryable::name),
            retry.operation = operation,
            "{message}"
        );
    }
    recorder::operation_finished(recorder::OperationFinished {
        operation,
        outcome,
        error_type: reason.filter(|_| gave_up(outcome)).map(Retryable::name),
        attempts,
        backoff,
    });
}

/// A try waited for its admission slot: the layer's queue-wait metric, by operation.
pub(super) fn queued(operation: &str, waited: Duration) {
    recorder::operation_queue_wait(operation, waited);
}

/// A loop's streak ended on an error that is not retryable: WARN `not retried`, with the
/// error's type and the like give-ups not logged since the last such event.
pub(super) fn not_retryable(
    operation: &str,
    error_type: Option<&str>,
    attempts: u32,
    suppressed: u64,
) {
    event_at_level!(Level::WARN,
        retry.attempts = attempts,
        retry.outcome = Outcome::NonRetryable.as_str(),
        error.type = error_type,
        retry.suppressed = suppressed,
        retry.operation = operation,
        "not retried"
    );
}

/// The operation's admission limit is now `limit` (0: it has none).
pub(super) fn admission_limit(operation: &str, limit: u32) {
    recorder::operation_admission_limit(operation, limit);
}
