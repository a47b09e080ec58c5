//! [`ResponseFuture`]: the state machine that buffers, calls, backs off and replays.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use axum::extract::MatchedPath;
use http::request::Parts;
use http::{Method, Request, Response};
use pin_project_lite::pin_project;
use tokio::sync::{AcquireError, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

use crate::attempt::{Attempt, Outcome, RetryOutcome};
use crate::body::{Buffered, Collected, Collector, NotReplayable};
use crate::classify::{ClassifyError, Retryable};
use crate::layer::Shared;

type GateAcquire =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + 'static>>;

pin_project! {
    /// The response future of [`SqliteRetry`](crate::SqliteRetry).
    ///
    /// Dropping it stops everything: no further attempt starts, a pending backoff is
    /// cancelled, and buffered bytes are given back to the layer's in-flight cap.
    pub struct ResponseFuture<S, C>
    where
        S: Service<Request<Body>>,
    {
        #[pin]
        state: State<S::Future>,
        service: S,
        classifier: C,
        shared: Arc<Shared>,
        // The pristine request head; every attempt gets a copy (the last possible one gets
        // the original).
        head: Option<Parts>,
        body: Source,
        attempt: u32,
        max_attempts: u32,
        start: Instant,
        deadline: Option<Instant>,
        prev_delay: Duration,
        total_delay: Duration,
        fence: Option<Arc<AtomicBool>>,
        gate_permit: Option<OwnedSemaphorePermit>,
        // For the events, so they stand on their own when the span is filtered out.
        method: Method,
        route: Option<MatchedPath>,
        span: Span,
    }
}

/// Where attempts get their body from.
enum Source {
    /// Still being read (state `Buffering`).
    Reading(Collector),
    /// Buffered: every attempt gets a copy-free body.
    Replay(Buffered),
    /// Handed to the one and only attempt, untouched (or partly read, then prefixed).
    Once(Option<Body>, Option<NotReplayable>),
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Buffering,
        Gate { acquire: GateAcquire, since: Instant },
        Ready,
        Called { #[pin] future: F },
        Sleeping { #[pin] sleep: Sleep },
        Done,
    }
}

impl<S, C> ResponseFuture<S, C>
where
    S: Service<Request<Body>>,
{
    pub(crate) fn new(service: S, classifier: C, shared: Arc<Shared>, req: Request<Body>) -> Self {
        let policy = &shared.policy;
        let max_attempts = policy.max_attempts;
        let (head, body) = req.into_parts();
        let route = head.extensions.get::<MatchedPath>().cloned();
        let method = head.method.clone();
        let span = tracing::info_span!(
            target: "tower_sqlite_retry",
            "sqlite_retry",
            http.request.method = %head.method,
            http.route = route.as_ref().map(MatchedPath::as_str),
            retry.max_attempts = max_attempts,
            retry.attempts = tracing::field::Empty,
            retry.outcome = tracing::field::Empty,
        );
        shared.counters.request();
        if let Some(budget) = &policy.budget {
            budget.deposit();
        }
        let start = Instant::now();
        let deadline = start.checked_add(policy.deadline);

        let upgrade = head.method == http::Method::CONNECT
            || head.headers.contains_key(http::header::UPGRADE);
        let declared = head
            .headers
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let over_cap = |n: u64| usize::try_from(n).map_or(true, |n| n > policy.max_body_bytes);

        let (source, state, fence) = if max_attempts <= 1 {
            (Source::Once(Some(body), None), State::Ready, None)
        } else if upgrade {
            let _e = span.enter();
            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG, retry.not_replayable = "upgrade_or_connect", "passing through without retries");
            (
                Source::Once(Some(body), Some(NotReplayable::Upgrade)),
                State::Ready,
                None,
            )
        } else if declared.is_some_and(over_cap)
            || over_cap(http_body::Body::size_hint(&body).lower())
        {
            let _e = span.enter();
            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG, retry.not_replayable = "content_length_over_cap", "passing through without retries");
            (
                Source::Once(Some(body), Some(NotReplayable::DeclaredOverCap)),
                State::Ready,
                None,
            )
        } else if http_body::Body::is_end_stream(&body) {
            (
                Source::Replay(Buffered::empty()),
                State::Ready,
                Some(Arc::new(AtomicBool::new(false))),
            )
        } else {
            let collector = Collector::new(
                body,
                shared.counters.clone(),
                policy.max_body_bytes,
                policy.max_buffered_bytes,
            );
            (
                Source::Reading(collector),
                State::Buffering,
                Some(Arc::new(AtomicBool::new(false))),
            )
        };

        Self {
            state,
            service,
            classifier,
            shared,
            head: Some(head),
            body: source,
            attempt: 0,
            max_attempts,
            start,
            deadline,
            prev_delay: Duration::ZERO,
            total_delay: Duration::ZERO,
            fence,
            gate_permit: None,
            method,
            route,
            span,
        }
    }
}

/// A copy of the request head for one attempt.
fn copy_head(p: &Parts) -> Request<()> {
    let mut req = Request::new(());
    *req.method_mut() = p.method.clone();
    *req.uri_mut() = p.uri.clone();
    *req.version_mut() = p.version;
    *req.headers_mut() = p.headers.clone();
    *req.extensions_mut() = p.extensions.clone();
    req
}

/// Whether a response counts as a failure for the outcome (never for retry decisions).
fn is_failure<B>(res: &Response<B>) -> bool {
    res.status().is_client_error() || res.status().is_server_error()
}

impl<S, C, ResBody> Future for ResponseFuture<S, C>
where
    S: Service<Request<Body>, Response = Response<ResBody>>,
    C: ClassifyError<S::Error>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let _entered = this.span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Buffering => {
                    let Source::Reading(collector) = this.body else {
                        unreachable!("Buffering state holds a collector");
                    };
                    *this.body = match ready!(collector.poll_collect(cx)) {
                        Collected::Replayable(buffered) => Source::Replay(buffered),
                        Collected::PassThrough(body, why) => {
                            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                                retry.not_replayable = why.as_str(),
                                "passing through without retries"
                            );
                            Source::Once(Some(body), Some(why))
                        }
                    };
                    this.state.set(State::Ready);
                }
                StateProj::Gate { acquire, since } => {
                    // The semaphore lives as long as the layer and is never closed.
                    let permit = ready!(acquire.as_mut().poll(cx)).expect("gate never closed");
                    crate::recorder::queue_wait(
                        route_str(this.route),
                        this.method,
                        since.elapsed(),
                    );
                    *this.gate_permit = Some(permit);
                    this.state.set(State::Ready);
                }
                StateProj::Ready => {
                    // NOTE: tower's rule for a service used more than once: readiness is
                    // polled before every call, the first included. `this.service` is the
                    // instance `SqliteRetry::call` took ready with `mem::replace`, so for the
                    // first attempt this returns at once.
                    if let Err(e) = ready!(this.service.poll_ready(cx)) {
                        *this.gate_permit = None;
                        let outcome = if *this.attempt == 0 {
                            Outcome::FirstTry
                        } else {
                            Outcome::NonRetryable
                        };
                        finish_span(this.span, this.shared, outcome, (*this.attempt).max(1));
                        crate::recorder::request_finished(
                            route_str(this.route),
                            this.method,
                            outcome,
                            None,
                            (*this.attempt).max(1),
                            *this.total_delay,
                        );
                        this.state.set(State::Done);
                        return Poll::Ready(Err(e));
                    }
                    *this.attempt += 1;
                    let n = *this.attempt;
                    let (body, last) = match this.body {
                        Source::Replay(buffered) => (buffered.body(), n >= *this.max_attempts),
                        Source::Once(body, _) => (body.take().expect("one attempt only"), true),
                        Source::Reading(_) => unreachable!("body read before the first call"),
                    };
                    let mut req = if last {
                        let head = this.head.take().expect("head kept until the last attempt");
                        Request::from_parts(head, body)
                    } else {
                        let head = this
                            .head
                            .as_ref()
                            .expect("head kept until the last attempt");
                        copy_head(head).map(|()| body)
                    };
                    req.extensions_mut().insert(Attempt::new(
                        n,
                        *this.max_attempts,
                        this.fence.clone(),
                    ));
                    let future = this.service.call(req);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => {
                    let result = ready!(future.poll(cx));
                    *this.gate_permit = None;
                    let n = *this.attempt;
                    let reason = match &result {
                        Ok(res) => {
                            if let Some(inner) = res.extensions().get::<RetryOutcome>() {
                                // NOTE: an inner SqliteRetryLayer already retried; never
                                // multiply its attempts: pass its answer through.
                                let inner = *inner;
                                finish_span(this.span, this.shared, inner.outcome, inner.attempts);
                                this.state.set(State::Done);
                                return Poll::Ready(result);
                            }
                            res.extensions().get::<Retryable>().cloned()
                        }
                        Err(e) => this.classifier.classify_error(e),
                    };
                    let Some(reason) = reason else {
                        let outcome = match &result {
                            _ if n == 1 => Outcome::FirstTry,
                            Ok(res) if !is_failure(res) => Outcome::SucceededAfterRetry,
                            _ => Outcome::NonRetryable,
                        };
                        crate::recorder::request_finished(
                            route_str(this.route),
                            this.method,
                            outcome,
                            None,
                            n,
                            *this.total_delay,
                        );
                        this.state.set(State::Done);
                        return Poll::Ready(finish(
                            result,
                            this.span,
                            this.shared,
                            outcome,
                            n,
                            *this.total_delay,
                        ));
                    };
                    let elapsed = this.start.elapsed();
                    let policy = &this.shared.policy;
                    let stop = if let Source::Once(_, why) = this.body {
                        Some(if why.is_some() {
                            Outcome::NotReplayable
                        } else {
                            Outcome::Exhausted
                        })
                    } else if this
                        .fence
                        .as_ref()
                        .is_some_and(|f| f.load(std::sync::atomic::Ordering::Acquire))
                    {
                        Some(Outcome::Fenced)
                    } else if n >= *this.max_attempts {
                        Some(Outcome::Exhausted)
                    } else {
                        None
                    };
                    // The backoff is drawn only when nothing else has stopped the retries
                    // (the delay is unused once `stop` is set).
                    let (stop, delay) = match stop {
                        Some(outcome) => (Some(outcome), Duration::ZERO),
                        None => {
                            let delay = policy.delay(n, *this.prev_delay, &mut rand::rng());
                            let past_deadline = this.deadline.is_some_and(|d| {
                                Instant::now().checked_add(delay).is_none_or(|end| end > d)
                            });
                            let stop = if past_deadline {
                                Some(Outcome::Deadline)
                            } else if policy.budget.as_ref().is_some_and(|b| !b.withdraw()) {
                                Some(Outcome::BudgetExhausted)
                            } else {
                                None
                            };
                            (stop, delay)
                        }
                    };
                    if let Some(outcome) = stop {
                        let elapsed_ms = elapsed.as_millis() as u64;
                        macro_rules! stop_event {
                            ($level:expr, $message:literal) => {
                                tracing::event!(target: "tower_sqlite_retry", $level,
                                    retry.attempts = n,
                                    retry.elapsed_ms = elapsed_ms,
                                    retry.outcome = outcome.as_str(),
                                    db.response.status_code = reason.code(),
                                    error.type = reason.name(),
                                    http.request.method = %this.method,
                                    http.route = this.route.as_ref().map(MatchedPath::as_str),
                                    $message
                                )
                            };
                        }
                        match outcome {
                            Outcome::Exhausted | Outcome::Deadline => {
                                stop_event!(tracing::Level::ERROR, "retries exhausted")
                            }
                            _ => stop_event!(tracing::Level::WARN, "not retried"),
                        }
                        crate::recorder::request_finished(
                            route_str(this.route),
                            this.method,
                            outcome,
                            Some(reason.name()),
                            n,
                            *this.total_delay,
                        );
                        this.state.set(State::Done);
                        return Poll::Ready(finish(
                            result,
                            this.span,
                            this.shared,
                            outcome,
                            n,
                            *this.total_delay,
                        ));
                    }
                    tracing::event!(target: "tower_sqlite_retry", tracing::Level::WARN,
                        retry.attempt = n,
                        retry.delay_ms = delay.as_secs_f64() * 1000.0,
                        retry.elapsed_ms = elapsed.as_millis() as u64,
                        db.response.status_code = reason.code(),
                        error.type = reason.name(),
                        http.request.method = %this.method,
                        http.route = this.route.as_ref().map(MatchedPath::as_str),
                        "retrying request"
                    );
                    this.shared.counters.retry();
                    crate::recorder::replay(route_str(this.route), this.method, reason.name());
                    // The failed attempt's response is dropped here, before the backoff.
                    drop(result);
                    *this.prev_delay = delay;
                    *this.total_delay = this.total_delay.saturating_add(delay);
                    let sleep = tokio::time::sleep(delay);
                    this.state.set(State::Sleeping { sleep });
                }
                StateProj::Sleeping { sleep } => {
                    ready!(sleep.poll(cx));
                    match &this.shared.gate {
                        Some(gate) => {
                            let acquire = Box::pin(gate.clone().acquire_owned());
                            let since = Instant::now();
                            this.state.set(State::Gate { acquire, since });
                        }
                        None => this.state.set(State::Ready),
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

fn route_str(route: &Option<MatchedPath>) -> Option<&str> {
    route.as_ref().map(MatchedPath::as_str)
}

fn finish_span(span: &Span, shared: &Shared, outcome: Outcome, attempts: u32) {
    span.record("retry.attempts", attempts);
    span.record("retry.outcome", outcome.as_str());
    shared.counters.finished(outcome, attempts);
}

fn finish<B, E>(
    result: Result<Response<B>, E>,
    span: &Span,
    shared: &Shared,
    outcome: Outcome,
    attempts: u32,
    total_delay: Duration,
) -> Result<Response<B>, E> {
    finish_span(span, shared, outcome, attempts);
    result.map(|mut res| {
        // A retryable failure the layer gives up on tells the client when to come back, even
        // when the handler's own error type forgot to.
        if res.extensions().get::<Retryable>().is_some()
            && !res.headers().contains_key(http::header::RETRY_AFTER)
        {
            res.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static("1"),
            );
        }
        res.extensions_mut().insert(RetryOutcome {
            attempts,
            total_delay,
            outcome,
        });
        res
    })
}

impl<S, C> fmt::Debug for ResponseFuture<S, C>
where
    S: Service<Request<Body>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("total_delay", &self.total_delay)
            .finish_non_exhaustive()
    }
}
