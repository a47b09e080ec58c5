//! Where a request's attempts get their body from, chosen once per request: read whole first
//! (`Collecting`, then `Buffered`), recorded as the first attempt reads it (`Recording`, for
//! `Expect: 100-continue`), or passed through to a single attempt (`Once`, and why). See the
//! `body` module's docs for the ways a body is kept.

use http::request::Parts;
use http::{Method, header};
use http_body::Body;
use tokio::time::Instant;

use crate::body::{
    Buffered, Caps, Collected, Collector, Held, NotReplayable, Recording, ReplayBody,
};
use crate::shared::Shared;

/// Where attempts get their body from.
pub(super) enum Source<B: Body> {
    /// Being read whole (state `Buffering`), until the upload's deadline.
    Collecting(Collector<B>, Option<Instant>),
    /// Read whole: every attempt gets the same bytes.
    Buffered(Buffered),
    /// Recorded as the first attempt reads it (`Expect: 100-continue`).
    Recording(Recording<B>),
    /// For one attempt only, and why (`None`: the policy allows one attempt).
    Once(Option<ReplayBody<B>>, Option<NotReplayable>),
}

impl<B: Body> Source<B> {
    /// The source for a request with this head and body, under this layer's policy: what a
    /// body that cannot be replayed is passed through for is said once, at DEBUG.
    pub(super) fn of(head: &Parts, body: B, shared: &Shared) -> Self {
        let policy = &shared.policy;
        let max_attempts = policy.max_attempts;
        let upgrade = head.method == Method::CONNECT || head.headers.contains_key(header::UPGRADE);
        let pass = |why: Option<NotReplayable>, body: B| Self::once(ReplayBody::direct(body), why);
        if max_attempts <= 1 {
            pass(None, body)
        } else if upgrade {
            pass(Some(NotReplayable::Upgrade), body)
        } else if body.is_end_stream() && body.size_hint().exact() == Some(0) {
            // Nothing to read (a GET): no header but the upgrade's matters.
            Source::Buffered(Buffered::empty())
        } else {
            let declared = head
                .headers
                .get(header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok());
            let over_cap = |n: u64| usize::try_from(n).map_or(true, |n| n > policy.max_body_bytes);
            let declared_over_cap =
                declared.is_some_and(over_cap) || over_cap(body.size_hint().lower());
            let declared = declared.and_then(|n| usize::try_from(n).ok());
            let caps = Caps {
                body: policy.max_body_bytes,
                in_flight: policy.max_buffered_bytes,
            };
            if declared_over_cap {
                pass(Some(NotReplayable::DeclaredOverCap), body)
            } else if body.is_end_stream() {
                Source::Buffered(Buffered::empty())
            } else if head
                .headers
                .get(header::EXPECT)
                .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
            {
                // The client waits for the go-ahead: let the first attempt read (and so ask
                // for) the body, and record it as it goes, within the deadline from the
                // request's start (as a buffered body is).
                Source::Recording(Recording::new(
                    body,
                    Held::new(shared.stats.in_flight.clone(), caps, declared),
                    Instant::now().checked_add(policy.deadline),
                ))
            } else {
                Source::Collecting(
                    Collector::new(
                        body,
                        Held::new(shared.stats.in_flight.clone(), caps, declared),
                    ),
                    // The upload's own deadline, from the request's start.
                    Instant::now().checked_add(policy.deadline),
                )
            }
        }
    }

    /// A body for one attempt only, and why (`None`: the policy allows one attempt).
    fn once(body: ReplayBody<B>, why: Option<NotReplayable>) -> Self {
        if let Some(why) = why {
            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                retry.not_replayable = why.as_str(),
                "passing through without retries"
            );
        }
        Source::Once(Some(body), why)
    }

    /// The body was read whole, or buffering stopped (a cap, an error, the deadline).
    pub(super) fn collected(collected: Collected<B>) -> Self {
        match collected {
            Collected::Replayable(buffered) => Source::Buffered(buffered),
            Collected::PassThrough(read, why) => Self::once(ReplayBody::prefixed(read), Some(why)),
        }
    }

    /// Whether the body is still being read whole (the request waits in `Buffering`).
    pub(super) fn is_collecting(&self) -> bool {
        matches!(self, Source::Collecting(..))
    }

    /// The next attempt's body, and whether it is the last (`last`: the policy allows no
    /// other). `None` when a recording was lost since the checkpoint (a task of an earlier
    /// attempt read past a cap on another thread): no replay on what is left of it.
    pub(super) fn for_attempt(&mut self, last: bool) -> Option<(ReplayBody<B>, bool)> {
        match self {
            Source::Buffered(buffered) => Some((ReplayBody::buffered(buffered), last)),
            Source::Recording(recording) => Some((ReplayBody::recorded(recording, last)?, last)),
            Source::Once(body, _) => Some((body.take().expect("one attempt only"), true)),
            Source::Collecting(..) => unreachable!("body read before the first call"),
        }
    }

    /// Why the body cannot go to another attempt, if it cannot.
    pub(super) fn not_replayable(&self) -> Option<NotReplayable> {
        match self {
            Source::Once(_, why) => *why,
            Source::Recording(r) => r.not_replayable(),
            Source::Buffered(_) | Source::Collecting(..) => None,
        }
    }

    /// Whether the body can go to another attempt.
    pub(super) fn replayable(&self) -> bool {
        !matches!(self, Source::Once(..)) && self.not_replayable().is_none()
    }

    /// The request is over: a recording stops (its copy is given back).
    pub(super) fn stop(&self) {
        if let Source::Recording(r) = self {
            r.stop();
        }
    }
}
