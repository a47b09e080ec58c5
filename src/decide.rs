//! What to do after an attempt: plain data in, a decision out.
//!
//! The response future only moves between states; every "retry or stop, and why" lives here,
//! so that the rules can be read in one place and tested by a table (as tower keeps them in
//! `Policy::retry`).

use std::time::Duration;

use crate::attempt::Outcome;

/// What an attempt's result says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A response or error that no replay is asked for: `failed` when it is a `4xx`/`5xx`
    /// response or an error.
    Final { failed: bool },
    /// A retryable failure: the response carries the `Retryable` marker, or the classifier
    /// tagged the error.
    Retryable,
}

/// Everything the decision depends on, but the random delay (drawn only when everything else
/// allows a replay). The retry budget is not asked here: it is asked right before the replay
/// starts, once the backoff and the waits are over (a replay the deadline or a cancel stops
/// never takes from it).
#[derive(Clone, Copy, Debug)]
pub(crate) struct After {
    /// The attempt that just finished, 1 for the first.
    pub(crate) attempt: u32,
    pub(crate) max_attempts: u32,
    pub(crate) verdict: Verdict,
    /// The body cannot be given to another attempt (over a cap, an upgrade, a failed stream).
    pub(crate) not_replayable: bool,
    /// The handler called `Attempt::fence`.
    pub(crate) fenced: bool,
    /// Time left before the deadline; `None` when the deadline is too far to represent.
    pub(crate) remaining: Option<Duration>,
}

/// What the future does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Return this attempt's result, with this outcome.
    Finish(Outcome),
    /// Sleep `delay`, then replay.
    Retry { delay: Duration },
}

/// Decides after an attempt. `delay` draws the backoff; it is called at most once, and only
/// when nothing else has stopped the retries.
pub(crate) fn decide(after: After, delay: impl FnOnce() -> Duration) -> Decision {
    let stop = match after.verdict {
        Verdict::Final { .. } if after.attempt <= 1 => Some(Outcome::FirstTry),
        Verdict::Final { failed: false } => Some(Outcome::SucceededAfterRetry),
        Verdict::Final { failed: true } => Some(Outcome::NonRetryable),
        // The policy allows no replay at all: the one attempt was the last.
        Verdict::Retryable if after.max_attempts <= 1 => Some(Outcome::Exhausted),
        // The handler said a replay would repeat a side effect.
        Verdict::Retryable if after.fenced => Some(Outcome::Fenced),
        Verdict::Retryable if after.not_replayable => Some(Outcome::NotReplayable),
        Verdict::Retryable if after.attempt >= after.max_attempts => Some(Outcome::Exhausted),
        Verdict::Retryable => None,
    };
    if let Some(outcome) = stop {
        return Decision::Finish(outcome);
    }
    let delay = delay();
    // Never start a sleep that would end past the deadline (and the replay after it would
    // then start past it too).
    if after.remaining.is_some_and(|left| delay >= left) {
        return Decision::Finish(Outcome::Deadline);
    }
    Decision::Retry { delay }
}

/// Whether an answer the layer gives up on tells the client to come back (`Retry-After`):
/// only where a later try can succeed. Never after a fence (the handler said a repeat would do
/// a side effect twice), never for answers no replay was asked for.
pub(crate) fn invites_retry(outcome: Outcome) -> bool {
    match outcome {
        Outcome::Exhausted
        | Outcome::Deadline
        | Outcome::BudgetExhausted
        | Outcome::NotReplayable => true,
        Outcome::FirstTry
        | Outcome::SucceededAfterRetry
        | Outcome::Fenced
        | Outcome::NonRetryable
        | Outcome::Cancelled => false,
    }
}

/// Whether an outcome is the layer giving up on a retryable failure (logged at WARN or ERROR).
/// How a give-up is told (the layer's requests and the operations' calls alike): ERROR
/// `retries exhausted` when the attempts or the deadline ran out, WARN `not retried` for the
/// rest (the budget, the fence, a body that could not be kept).
pub(crate) fn give_up_event(outcome: Outcome) -> (tracing::Level, &'static str) {
    match outcome {
        Outcome::Exhausted | Outcome::Deadline => (tracing::Level::ERROR, "retries exhausted"),
        _ => (tracing::Level::WARN, "not retried"),
    }
}

pub(crate) fn gave_up(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Exhausted
            | Outcome::Deadline
            | Outcome::BudgetExhausted
            | Outcome::NotReplayable
            | Outcome::Fenced
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn after(attempt: u32, verdict: Verdict) -> After {
        After {
            attempt,
            max_attempts: 4,
            verdict,
            not_replayable: false,
            fenced: false,
            remaining: Some(1000 * MS),
        }
    }

    const OK: Verdict = Verdict::Final { failed: false };
    const FAILED: Verdict = Verdict::Final { failed: true };
    const RETRY: Verdict = Verdict::Retryable;

    #[test]
    fn the_table() {
        use Decision::{Finish, Retry};
        use Outcome::*;
        let d10 = 10 * MS;
        #[rustfmt::skip]
        let table: Vec<(&str, After, Decision)> = vec![
            // (case, input, decision)
            ("success on the first try", after(1, OK), Finish(FirstTry)),
            ("failure on the first try, not retryable", after(1, FAILED), Finish(FirstTry)),
            ("success after a replay", after(2, OK), Finish(SucceededAfterRetry)),
            ("4xx after a replay", after(3, FAILED), Finish(NonRetryable)),
            ("retryable, attempts left", after(1, RETRY), Retry { delay: d10 }),
            ("retryable on the last attempt", after(4, RETRY), Finish(Exhausted)),
            ("retryable past the last attempt", after(9, RETRY), Finish(Exhausted)),
            ("one attempt allowed", After { max_attempts: 1, ..after(1, RETRY) }, Finish(Exhausted)),
            ("one attempt allowed, body not kept", After { max_attempts: 1, not_replayable: true, ..after(1, RETRY) }, Finish(Exhausted)),
            ("fenced", After { fenced: true, ..after(1, RETRY) }, Finish(Fenced)),
            ("fenced and not replayable: the fence says more", After { fenced: true, not_replayable: true, ..after(1, RETRY) }, Finish(Fenced)),
            ("fenced on the last attempt", After { fenced: true, ..after(4, RETRY) }, Finish(Fenced)),
            ("fence does not matter on success", After { fenced: true, ..after(2, OK) }, Finish(SucceededAfterRetry)),
            ("body over the cap", After { not_replayable: true, ..after(1, RETRY) }, Finish(NotReplayable)),
            ("delay ends past the deadline", After { remaining: Some(5 * MS), ..after(1, RETRY) }, Finish(Deadline)),
            ("delay ends at the deadline", After { remaining: Some(d10), ..after(1, RETRY) }, Finish(Deadline)),
            ("deadline already passed", After { remaining: Some(Duration::ZERO), ..after(2, RETRY) }, Finish(Deadline)),
            ("deadline too far to represent", After { remaining: None, ..after(1, RETRY) }, Retry { delay: d10 }),
            ("deadline is checked before the delay is slept", After { remaining: Some(MS), ..after(1, RETRY) }, Finish(Deadline)),
            ("attempts are checked before the delay is drawn", after(4, RETRY), Finish(Exhausted)),
        ];
        for (case, input, want) in table {
            let mut drew = false;
            let got = decide(input, || {
                drew = true;
                d10
            });
            assert_eq!(got, want, "{case}");
            // The delay is drawn only when nothing else stopped first.
            assert_eq!(
                drew,
                matches!(want, Retry { .. } | Finish(Deadline)),
                "{case}: delay drawn"
            );
        }
    }

    #[test]
    fn retry_after_only_where_a_later_try_can_succeed() {
        for outcome in Outcome::ALL {
            let invites = invites_retry(outcome);
            let expected = matches!(
                outcome,
                Outcome::Exhausted
                    | Outcome::Deadline
                    | Outcome::BudgetExhausted
                    | Outcome::NotReplayable
            );
            assert_eq!(invites, expected, "{outcome}");
            // Every answer that invites a retry is one the layer gave up on.
            assert!(!invites || gave_up(outcome), "{outcome}");
        }
        assert!(!invites_retry(Outcome::Fenced));
        assert!(gave_up(Outcome::Fenced));
    }
}
