//! [`ResponseFuture`]: the state machine that buffers, waits, calls, backs off and replays.
//!
//! ```text
//!            ┌───────────┐ body read whole (or passed through)
//!  new ──────► Buffering ├──────────────────────┐
//!    │       └───────────┘                      ▼
//!    │ nothing to buffer                  ┌──────────┐  inner ready: attempt n
//!    └────────────────────────────────────►  Ready   ├───────────────────────┐
//!                                         └────▲─────┘                       ▼
//!                                  gate passed │ (or no gate)          ┌──────────┐
//!                                         ┌────┴─────┐                 │  Called  │
//!                                         │   Gate   │                 └────┬─────┘
//!                                         └────▲─────┘   decide: Retry      │
//!                                              │      ┌─────────┐           │
//!                                              └──────┤ Backoff ◄───────────┤
//!                                         slept       └─────────┘           │ decide: Finish
//!                                                                           ▼
//!                                                                         Done
//! ```
//!
//! The waits (`Ready`, `Gate`) race the deadline: past it, the last retryable failure is the
//! answer (outcome `deadline`). What to do after an attempt is decided in `decide.rs`; this
//! file only moves between states and records what happened.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Buf;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use pin_project_lite::pin_project;
use rand::RngExt;
use tokio::sync::{AcquireError, OwnedSemaphorePermit};
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

use crate::admission::{Admitted, RouteLimit};
use crate::attempt::{Attempt, Outcome, RequestState, RetryOutcome};
use crate::body::{Buffered, Caps, Collected, Collector, NotReplayable, Recording, ReplayBody};
use crate::classify::{ClassifyError, Retryable};
use crate::decide::{After, Decision, Verdict, decide, gave_up, invites_retry};
use crate::layer::Shared;
use crate::recorder;
use crate::route::Route;

/// The longest backoff of a request that holds a writer-admission slot, in `base_delay`s.
const ADMITTED_BACKOFF_FACTOR: u32 = 4;

type GateAcquire =
    Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send + 'static>>;
type AdmitAcquire = Pin<Box<dyn Future<Output = Admitted> + Send + 'static>>;

pin_project! {
    /// The response future of [`SqliteRetry`](crate::SqliteRetry).
    ///
    /// Dropping it stops everything: no further attempt starts, a pending backoff or wait is
    /// cancelled, buffered bytes are given back to the layer's in-flight cap, and the request
    /// is counted with outcome `cancelled`.
    #[project = Proj]
    pub struct ResponseFuture<S, C, B>
    where
        S: Service<Request<ReplayBody<B>>>,
        B: Body,
    {
        #[pin]
        state: State<S::Future>,
        // The deadline, armed the first time a wait is pending. Boxed, like the other state
        // that only retries and waits need, to keep the future small (it is boxed by axum per
        // request, and a small allocation is a cheap one).
        timer: Option<Pin<Box<Sleep>>>,
        service: S,
        classifier: C,
        shared: Arc<Shared>,
        // The pristine request head; every attempt gets a copy (the last possible one gets
        // the original).
        head: Option<Parts>,
        body: Source<B>,
        // Shared with this request's attempts (the fence; an inner layer's claim).
        request: Option<Arc<RequestState>>,
        // An outer layer's request this layer took over, to report the outcome to.
        outer: Option<Arc<RequestState>>,
        attempt: u32,
        max_attempts: u32,
        start: Instant,
        deadline: Option<Instant>,
        prev_delay: Duration,
        total_delay: Duration,
        gate_permit: Option<OwnedSemaphorePermit>,
        // The route's learned limit, once it has one (writer admission); whether this request
        // was admitted under it; and its slot, when no request state can hold it (the request
        // state holds it otherwise, until the fence or the end).
        route_limit: Option<Arc<RouteLimit>>,
        was_admitted: bool,
        admitted: Option<Admitted>,
        // An outer clone of this very layer already holds this request's slot.
        outer_admitted: bool,
        // When the current wait for a slot or the gate began, and all waits so far.
        wait_start: Option<Instant>,
        waited: Duration,
        // This attempt's time in the queues, when it passed one (admission or the gate, even
        // at once): one `queue_wait` sample per attempt that was queued.
        attempt_wait: Option<Duration>,
        // The last retryable failure, kept until the next attempt starts: the answer if the
        // deadline passes in between.
        last: Option<Box<Result<S::Response, S::Error>>>,
        reason: Option<Box<Retryable>>,
        route: Route,
        span: Span,
        done: bool,
    }

    impl<S, C, B> PinnedDrop for ResponseFuture<S, C, B>
    where
        S: Service<Request<ReplayBody<B>>>,
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if *this.done {
                return;
            }
            let _entered = this.span.enter();
            let attempts = *this.attempt;
            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                retry.attempts = attempts,
                http.request.method = %this.route.method,
                http.route = this.route.path(),
                "request cancelled"
            );
            let end = End {
                outcome: Outcome::Cancelled,
                attempts,
                reason: this.reason.as_deref(),
                backoff: *this.total_delay,
                passed_through: false,
            };
            record_end(this.span, this.shared, this.route, this.outer.as_deref(), end);
            // An attempt's `Attempt` may outlive this future (a task the handler spawned): the
            // slot must not live on with it.
            if let Some(request) = this.request.as_ref() {
                request.release_slot();
            }
            if let Source::Recording(r) = this.body {
                r.clear();
            }
        }
    }
}

/// Where attempts get their body from.
enum Source<B: Body> {
    /// Being read whole (state `Buffering`).
    Collecting(Collector<B>),
    /// Read whole: every attempt gets the same bytes.
    Buffered(Buffered),
    /// Recorded as the first attempt reads it (`Expect: 100-continue`).
    Recording(Recording<B>),
    /// For one attempt only, and why (`None`: the policy allows one attempt).
    Once(Option<ReplayBody<B>>, Option<NotReplayable>),
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Buffering,
        // Decides which wait comes next: a writer-admission slot, the replay gate, readiness.
        Queue,
        Admit { acquire: AdmitAcquire },
        Gate { acquire: GateAcquire },
        Ready,
        Called { #[pin] future: F },
        Backoff { #[pin] sleep: Sleep },
        Done,
    }
}

impl<S, C, B> ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
    B::Data: Buf,
{
    pub(crate) fn new(service: S, classifier: C, shared: Arc<Shared>, req: Request<B>) -> Self {
        let policy = &shared.policy;
        let max_attempts = policy.max_attempts;
        let (head, body) = req.into_parts();
        let route = Route::of(&head);
        let span = tracing::info_span!(
            target: "tower_sqlite_retry",
            "sqlite_retry",
            http.request.method = %head.method,
            http.route = route.path(),
            retry.max_attempts = max_attempts,
            retry.attempts = tracing::field::Empty,
            retry.outcome = tracing::field::Empty,
            http.request.resend_count = tracing::field::Empty,
            retry.queue_ms = tracing::field::Empty,
            db.response.status_code = tracing::field::Empty,
            error.type = tracing::field::Empty,
        );
        shared.counters.request();
        if let Some(budget) = &policy.budget {
            budget.deposit();
        }
        // NOTE: nested layers. An outer layer's attempt carries its `Attempt`: take the request
        // over, so that the outer layer passes this layer's answer through (responses and
        // errors alike) instead of replaying on top of it.
        let outer = head
            .extensions
            .get::<Attempt>()
            .and_then(|a| a.request_state().cloned());
        if let Some(outer) = &outer {
            outer.claim();
        }
        let outer_admitted = outer
            .as_ref()
            .is_some_and(|o| o.admitted_by() == layer_id(&shared));
        let route_limit = shared.admissions.lookup(&route);

        let upgrade = head.method == Method::CONNECT || head.headers.contains_key(header::UPGRADE);
        let declared = head
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let over_cap = |n: u64| usize::try_from(n).map_or(true, |n| n > policy.max_body_bytes);
        let declared_over_cap =
            declared.is_some_and(over_cap) || over_cap(body.size_hint().lower());
        let expect_continue = head
            .headers
            .get(header::EXPECT)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
        let caps = Caps {
            body: policy.max_body_bytes,
            in_flight: policy.max_buffered_bytes,
        };
        let declared = declared.and_then(|n| usize::try_from(n).ok());
        let pass = |why: Option<NotReplayable>, body: B| {
            if let Some(why) = why {
                let _e = span.enter();
                tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                    retry.not_replayable = why.as_str(),
                    "passing through without retries"
                );
            }
            (
                Source::Once(Some(ReplayBody::direct(body)), why),
                State::Queue,
                None,
            )
        };
        let replayable = || Some(Arc::new(RequestState::new(outer.clone())));
        let (source, state, request) = if max_attempts <= 1 {
            pass(None, body)
        } else if upgrade {
            pass(Some(NotReplayable::Upgrade), body)
        } else if declared_over_cap {
            pass(Some(NotReplayable::DeclaredOverCap), body)
        } else if body.is_end_stream() {
            (
                Source::Buffered(Buffered::empty()),
                State::Queue,
                replayable(),
            )
        } else if expect_continue {
            // The client waits for the go-ahead: let the first attempt read (and so ask for)
            // the body, and record it as it goes.
            let recording = Recording::new(body, shared.counters.clone(), caps, declared);
            (Source::Recording(recording), State::Queue, replayable())
        } else {
            let collector = Collector::new(body, shared.counters.clone(), caps, declared);
            (
                Source::Collecting(collector),
                State::Buffering,
                replayable(),
            )
        };

        let start = Instant::now();
        Self {
            state,
            timer: None,
            service,
            classifier,
            head: Some(head),
            body: source,
            request,
            outer,
            attempt: 0,
            max_attempts,
            start,
            deadline: start.checked_add(shared.policy.deadline),
            prev_delay: Duration::ZERO,
            total_delay: Duration::ZERO,
            gate_permit: None,
            route_limit,
            was_admitted: false,
            admitted: None,
            outer_admitted,
            wait_start: None,
            waited: Duration::ZERO,
            attempt_wait: None,
            last: None,
            reason: None,
            route,
            span,
            done: false,
            shared,
        }
    }
}

/// A layer's identity, for nested clones of it: the address of its shared state.
fn layer_id(shared: &Arc<Shared>) -> usize {
    Arc::as_ptr(shared) as usize
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

/// Polls the deadline (arming it the first time); true once it has passed.
fn deadline_passed(
    timer: &mut Option<Pin<Box<Sleep>>>,
    deadline: Option<Instant>,
    cx: &mut Context<'_>,
) -> bool {
    let Some(deadline) = deadline else {
        return false;
    };
    timer
        .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)))
        .as_mut()
        .poll(cx)
        .is_ready()
}

/// A `Retry-After` of 1 to 3 seconds, drawn per answer so that a burst of clients turned away
/// together does not come back together.
fn retry_after() -> HeaderValue {
    HeaderValue::from(rand::rng().random_range(1u32..=3))
}

impl<S, C, B, ResBody> Future for ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>>,
    C: ClassifyError<S::Error>,
    B: Body,
    B::Data: Buf,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span = this.span.clone();
        let _entered = span.enter();
        loop {
            match this.state.as_mut().project() {
                StateProj::Buffering => {
                    let Source::Collecting(collector) = this.body else {
                        unreachable!("Buffering state holds a collector");
                    };
                    *this.body = match ready!(collector.poll_collect(cx)) {
                        Collected::Replayable(buffered) => Source::Buffered(buffered),
                        Collected::PassThrough(body, why) => {
                            tracing::event!(target: "tower_sqlite_retry", tracing::Level::DEBUG,
                                retry.not_replayable = why.as_str(),
                                "passing through without retries"
                            );
                            Source::Once(Some(body), Some(why))
                        }
                    };
                    // The deadline runs from here: the upload's pace was the client's.
                    *this.start = Instant::now();
                    *this.deadline = this.start.checked_add(this.shared.policy.deadline);
                    this.state.set(State::Queue);
                }
                StateProj::Queue => {
                    // A task the handler spawned may have fenced during the backoff: then no
                    // replay (and the slot, given back by the fence, is not taken again).
                    if *this.attempt > 0
                        && this.request.as_ref().is_some_and(|r| r.is_fenced())
                        && let Some(last) = this.last.take()
                    {
                        let attempts = *this.attempt;
                        this.gave_up_event(Outcome::Fenced, attempts);
                        return Poll::Ready(this.finish(*last, Outcome::Fenced, attempts));
                    }
                    let next = this.next_wait();
                    this.state.set(next);
                }
                StateProj::Admit { acquire } => match acquire.as_mut().poll(cx) {
                    Poll::Ready(admitted) => {
                        this.admitted_now(admitted);
                        this.waited_now();
                        this.state.set(State::Queue);
                    }
                    Poll::Pending => {
                        if deadline_passed(this.timer, *this.deadline, cx) {
                            this.waited_now();
                            return Poll::Ready(this.at_deadline());
                        }
                        return Poll::Pending;
                    }
                },
                StateProj::Gate { acquire } => match acquire.as_mut().poll(cx) {
                    Poll::Ready(permit) => {
                        // The semaphore lives as long as the layer and is never closed.
                        *this.gate_permit = Some(permit.expect("gate never closed"));
                        this.waited_now();
                        this.state.set(State::Ready);
                    }
                    Poll::Pending => {
                        if deadline_passed(this.timer, *this.deadline, cx) {
                            this.waited_now();
                            return Poll::Ready(this.at_deadline());
                        }
                        return Poll::Pending;
                    }
                },
                StateProj::Ready => {
                    // NOTE: tower's rule for a service used more than once: readiness is
                    // polled before every call, the first included, on the very instance that
                    // is then called. `SqliteRetry::poll_ready` reserved nothing, so a slow
                    // upload never held the inner service's capacity while it was buffered.
                    match this.service.poll_ready(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(e)) => {
                            *this.gate_permit = None;
                            let attempts = *this.attempt;
                            return Poll::Ready(this.finish(
                                Err(e),
                                Outcome::NonRetryable,
                                attempts,
                            ));
                        }
                        Poll::Pending => {
                            if deadline_passed(this.timer, *this.deadline, cx) {
                                *this.gate_permit = None;
                                return Poll::Ready(this.at_deadline());
                            }
                            return Poll::Pending;
                        }
                    }
                    let req = this.next_attempt();
                    let future = this.service.call(req);
                    this.state.set(State::Called { future });
                }
                StateProj::Called { future } => {
                    // The request is the current one while its handler runs (the write path
                    // fences it and reads its deadline from there).
                    let result = {
                        let _current = crate::current::enter(this.request.as_ref(), *this.deadline);
                        ready!(future.poll(cx))
                    };
                    *this.gate_permit = None;
                    if let Some((outcome, attempts)) = this.inner_answered(&result) {
                        // NOTE: an inner layer retried (or chose not to): its answer is this
                        // layer's answer, as it is. Never multiply its attempts.
                        this.end(outcome, attempts, true);
                        return Poll::Ready(result);
                    }
                    let (verdict, reason) = match &result {
                        Ok(res) => match res.extensions().get::<Retryable>() {
                            Some(r) => (Verdict::Retryable, Some(r.clone())),
                            None => (
                                Verdict::Final {
                                    failed: is_failure(res),
                                },
                                None,
                            ),
                        },
                        Err(e) => match this.classifier.classify_error(e) {
                            Some(r) => (Verdict::Retryable, Some(r)),
                            None => (Verdict::Final { failed: true }, None),
                        },
                    };
                    if *this.was_admitted
                        && let Some(limit) = this.route_limit.as_ref()
                    {
                        limit.record(verdict == Verdict::Retryable);
                    }
                    if let Some(reason) = reason {
                        *this.reason = Some(Box::new(reason));
                        if this.route_limit.is_none() && !*this.outer_admitted {
                            // The route meets contention: from now on its attempts queue.
                            *this.route_limit = this.shared.admissions.contended(this.route);
                        }
                    }
                    let n = *this.attempt;
                    let policy = &this.shared.policy;
                    let not_replayable =
                        matches!(this.body, Source::Once(..)) || this.not_replayable().is_some();
                    let after = After {
                        attempt: n,
                        max_attempts: *this.max_attempts,
                        verdict,
                        not_replayable,
                        fenced: this.request.as_ref().is_some_and(|r| r.is_fenced()),
                        // Read the clock only when a replay is in question: a final answer
                        // never looks at it.
                        remaining: match verdict {
                            Verdict::Retryable => this
                                .deadline
                                .map(|d| d.saturating_duration_since(Instant::now())),
                            Verdict::Final { .. } => None,
                        },
                    };
                    let prev = *this.prev_delay;
                    // NOTE: a request holding an admission slot backs off briefly. Every
                    // request queued behind it waits out its backoff too, and what it collided
                    // with is a writer outside this queue (another instance, another process):
                    // growing the delay would let those capture the database (BENCHMARKS.md).
                    let cap = if *this.was_admitted || *this.outer_admitted {
                        policy.base_delay.saturating_mul(ADMITTED_BACKOFF_FACTOR)
                    } else {
                        policy.max_delay
                    };
                    let decision = decide(
                        after,
                        || policy.delay_within(n, prev, cap, &mut rand::rng()),
                        || policy.budget.as_ref().is_none_or(|b| b.withdraw()),
                    );
                    match decision {
                        Decision::Finish(outcome) => {
                            if verdict == Verdict::Retryable && gave_up(outcome) {
                                this.gave_up_event(outcome, n);
                            }
                            return Poll::Ready(this.finish(result, outcome, n));
                        }
                        Decision::Retry { delay } => {
                            this.replay_event(n, delay);
                            *this.last = Some(Box::new(result));
                            *this.prev_delay = delay;
                            *this.total_delay = this.total_delay.saturating_add(delay);
                            this.state.set(State::Backoff {
                                sleep: tokio::time::sleep(delay),
                            });
                        }
                    }
                }
                StateProj::Backoff { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Queue);
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            }
        }
    }
}

impl<S, C, B, ResBody> Proj<'_, S, C, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>>,
    B: Body,
    B::Data: Buf,
    ResBody: Default,
{
    /// The next wait before an attempt: a slot on the route (writer admission, held until the
    /// request ends or fences), then the replay gate (replays only), then the inner service's
    /// readiness.
    fn next_wait(&mut self) -> State<S::Future> {
        if !*self.was_admitted
            && !*self.outer_admitted
            && let Some(limit) = self.route_limit.as_ref()
        {
            self.attempt_wait.get_or_insert(Duration::ZERO);
            match limit.try_admit() {
                Some(admitted) => self.admitted_now(admitted),
                None => {
                    self.shared.counters.queued();
                    *self.wait_start = Some(Instant::now());
                    return State::Admit {
                        acquire: Box::pin(limit.admit()),
                    };
                }
            }
        }
        if *self.attempt > 0
            && self.gate_permit.is_none()
            && let Some(gate) = &self.shared.gate
        {
            self.attempt_wait.get_or_insert(Duration::ZERO);
            match gate.clone().try_acquire_owned() {
                Ok(permit) => *self.gate_permit = Some(permit),
                Err(_) => {
                    *self.wait_start = Some(Instant::now());
                    return State::Gate {
                        acquire: Box::pin(gate.clone().acquire_owned()),
                    };
                }
            }
        }
        State::Ready
    }

    fn admitted_now(&mut self, admitted: Admitted) {
        *self.was_admitted = true;
        match self.request.as_ref() {
            Some(request) => {
                request.set_admitted_by(layer_id(self.shared));
                request.hold_slot(admitted);
            }
            None => *self.admitted = Some(admitted),
        }
    }

    /// A wait for a slot or the gate is over: count it.
    fn waited_now(&mut self) {
        if let Some(start) = self.wait_start.take() {
            let waited = start.elapsed();
            *self.waited += waited;
            *self.attempt_wait.get_or_insert(Duration::ZERO) += waited;
        }
    }

    /// The request for the next attempt (counting it).
    fn next_attempt(&mut self) -> Request<ReplayBody<B>> {
        if let Some(waited) = self.attempt_wait.take() {
            recorder::queue_wait(self.route.path(), &self.route.method, waited);
        }
        *self.attempt += 1;
        let n = *self.attempt;
        if n > 1 {
            self.shared.counters.retry();
            recorder::replay(
                self.route.path(),
                &self.route.method,
                self.reason.as_deref().map_or("", Retryable::name),
            );
        }
        // The previous failure is no longer the answer: a new attempt starts.
        *self.last = None;
        let (body, last) = match self.body {
            Source::Buffered(buffered) => (buffered.body(), n >= *self.max_attempts),
            Source::Recording(recording) => (recording.body(), n >= *self.max_attempts),
            Source::Once(body, _) => (body.take().expect("one attempt only"), true),
            Source::Collecting(_) => unreachable!("body read before the first call"),
        };
        let mut req = if last {
            let head = self.head.take().expect("head kept until the last attempt");
            Request::from_parts(head, body)
        } else {
            let head = self
                .head
                .as_ref()
                .expect("head kept until the last attempt");
            copy_head(head).map(|()| body)
        };
        req.extensions_mut()
            .insert(Attempt::new(n, *self.max_attempts, self.request.clone()));
        req
    }

    /// Whether an inner layer took the request over, and how it ended there.
    fn inner_answered(
        &self,
        result: &Result<Response<ResBody>, S::Error>,
    ) -> Option<(Outcome, u32)> {
        let claimed = self
            .request
            .as_ref()
            .and_then(|r| r.is_claimed().then(|| r.reported()));
        // Responses say so too (an inner layer this layer could not share its request state
        // with, because this one allows no replay).
        let answered = match result {
            Ok(res) => res.extensions().get::<RetryOutcome>().copied(),
            Err(_) => None,
        };
        match (claimed, answered) {
            (Some(Some(reported)), _) => Some(reported),
            (_, Some(o)) => Some((o.outcome, o.attempts)),
            (Some(None), None) => Some((Outcome::FirstTry, *self.attempt)),
            (None, None) => None,
        }
    }

    /// Past the deadline while waiting: the last retryable failure is the answer, or a bare
    /// `503` when no attempt could start.
    fn at_deadline(&mut self) -> Result<Response<ResBody>, S::Error> {
        let attempts = *self.attempt;
        self.gave_up_event(Outcome::Deadline, attempts);
        let result = self.last.take().map(|last| *last).unwrap_or_else(|| {
            let mut res = Response::new(ResBody::default());
            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            res.headers_mut().insert(header::RETRY_AFTER, retry_after());
            Ok(res)
        });
        self.finish(result, Outcome::Deadline, attempts)
    }

    /// Records the end and returns the answer, marked with its `RetryOutcome`.
    fn finish(
        &mut self,
        result: Result<Response<ResBody>, S::Error>,
        outcome: Outcome,
        attempts: u32,
    ) -> Result<Response<ResBody>, S::Error> {
        self.end(outcome, attempts, false);
        let total_delay = *self.total_delay;
        result.map(|mut res| {
            if invites_retry(outcome)
                && res.extensions().get::<Retryable>().is_some()
                && !res.headers().contains_key(header::RETRY_AFTER)
            {
                res.headers_mut().insert(header::RETRY_AFTER, retry_after());
            }
            // The first attempt's own answer goes back untouched: no allocation for a request
            // the layer did nothing to.
            if outcome != Outcome::FirstTry {
                res.extensions_mut().insert(RetryOutcome {
                    attempts,
                    total_delay,
                    outcome,
                });
            }
            res
        })
    }

    fn end(&mut self, outcome: Outcome, attempts: u32, passed_through: bool) {
        // The slot and the gate permit go back as soon as the answer is known (the slot
        // earlier if the handler fenced).
        *self.admitted = None;
        if let Some(request) = self.request.as_ref() {
            request.release_slot();
        }
        *self.gate_permit = None;
        if !self.waited.is_zero() {
            self.span
                .record("retry.queue_ms", self.waited.as_secs_f64() * 1000.0);
        }
        let end = End {
            outcome,
            attempts,
            reason: self.reason.as_deref(),
            backoff: *self.total_delay,
            passed_through,
        };
        record_end(
            self.span,
            self.shared,
            self.route,
            self.outer.as_deref(),
            end,
        );
        if let Source::Recording(r) = self.body {
            r.clear();
        }
        *self.done = true;
        self.state.set(State::Done);
    }

    fn replay_event(&self, attempt: u32, delay: Duration) {
        let reason = self.reason.as_deref();
        let elapsed_ms = self.start.elapsed().as_millis() as u64;
        let delay_ms = delay.as_secs_f64() * 1000.0;
        macro_rules! replay_event {
            ($level:expr) => {
                tracing::event!(target: "tower_sqlite_retry", $level,
                    retry.attempt = attempt,
                    retry.delay_ms = delay_ms,
                    retry.elapsed_ms = elapsed_ms,
                    db.response.status_code = reason.map(Retryable::code),
                    error.type = reason.map(Retryable::name),
                    http.request.method = %self.route.method,
                    http.route = self.route.path(),
                    "retrying request"
                )
            };
        }
        use tracing::Level;
        match self.shared.policy.replay_event_level {
            l if l == Level::TRACE => replay_event!(Level::TRACE),
            l if l == Level::DEBUG => replay_event!(Level::DEBUG),
            l if l == Level::INFO => replay_event!(Level::INFO),
            l if l == Level::WARN => replay_event!(Level::WARN),
            _ => replay_event!(Level::ERROR),
        }
    }

    /// Why this request's body cannot go to another attempt, if it cannot.
    fn not_replayable(&self) -> Option<NotReplayable> {
        match &*self.body {
            Source::Once(_, why) => *why,
            Source::Recording(r) => r.not_replayable(),
            Source::Buffered(_) | Source::Collecting(_) => None,
        }
    }

    fn gave_up_event(&self, outcome: Outcome, attempts: u32) {
        let reason = self.reason.as_deref();
        let not_replayable = self.not_replayable().map(NotReplayable::as_str);
        let elapsed_ms = self.start.elapsed().as_millis() as u64;
        macro_rules! stop_event {
            ($level:expr, $message:literal) => {
                tracing::event!(target: "tower_sqlite_retry", $level,
                    retry.attempts = attempts,
                    retry.elapsed_ms = elapsed_ms,
                    retry.outcome = outcome.as_str(),
                    retry.not_replayable = not_replayable,
                    db.response.status_code = reason.map(Retryable::code),
                    error.type = reason.map(Retryable::name),
                    http.request.method = %self.route.method,
                    http.route = self.route.path(),
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
fn record_end(
    span: &Span,
    shared: &Shared,
    route: &Route,
    outer: Option<&RequestState>,
    end: End<'_>,
) {
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
    shared.counters.finished(outcome, attempts);
    if !passed_through {
        recorder::request_finished(
            route.path(),
            &route.method,
            outcome,
            // The error names the outcome only when the request ended on it.
            reason.filter(|_| gave_up(outcome)).map(Retryable::name),
            attempts,
            backoff,
        );
    }
    if let Some(outer) = outer {
        outer.report(outcome, attempts);
    }
}

impl<S, C, B> fmt::Debug for ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempt", &self.attempt)
            .field("max_attempts", &self.max_attempts)
            .field("total_delay", &self.total_delay)
            .finish_non_exhaustive()
    }
}
