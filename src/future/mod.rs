//! [`ResponseFuture`]: the state machine that buffers, waits, calls, backs off and replays.
//!
//! ```text
//!          ┌───────────┐ body in: the deadline starts
//!  new ───►│ Buffering ├──────────────┐
//!   │      └───────────┘              ▼
//!   │ nothing to buffer         ┌───────────┐ checkpoint stops: Done (fenced, deadline,
//!   └──────────────────────────►│   Queue   ├──────────────────► not replayable)
//!              ┌───────────────►│checkpoint │
//!              │ slot / permit  └─┬───┬───┬─┘
//!              │                  │   │   │ no wait left
//!        ┌─────┴─────┐ route      │   │   ▼
//!        │   Admit   │◄───────────┘   │ ┌───────────┐ inner ready, checkpoint,
//!        │   Gate    │◄───────────────┘ │   Ready   ├──── budget: attempt n ──┐
//!        └───────────┘ replay           └───────────┘                         ▼
//!              ▲                                                        ┌───────────┐
//!              │ slept          ┌───────────┐  decide: Retry            │  Called   │
//!              └──── Queue ◄────┤  Backoff  │◄──────────────────────────┤           │
//!                               └───────────┘                           └─────┬─────┘
//!                                                        decide: Finish       ▼
//!                                                                           Done
//! ```
//!
//! Each state's work is one method of `Core` that returns the next state (or the answer):
//! `poll` only dispatches. Every wait (`Admit`, `Gate`, `Ready`) races the deadline, and every
//! wait's end goes through one checkpoint (`Core::checkpoint`) that runs again right before
//! each call: no attempt starts after a fence, past the deadline, or without a body to give it;
//! and a replay takes from the retry budget only there, when it really starts. What to do after
//! an attempt is decided in `decide.rs`.
//!
//! Each fact has one home: the admission slot, the fence and the deadline live in the
//! request's `RequestState` (shared with its attempts and with nested layers); the gate
//! permit and the time queued for the next attempt live in the state that waits for them;
//! what only replays need (the last failure, its reason, the delays) is boxed in `Replays`.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use pin_project_lite::pin_project;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};
use tower_service::Service;
use tracing::Span;

use crate::admission::{Admitted, RouteLimit};
pub use crate::attempt::InRequest;
use crate::attempt::{Attempt, Outcome, RequestState, RetryOutcome, with_current};
use crate::body::{NotReplayable, ReplayBody};
use crate::classify::{ClassifyError, Retryable};
use crate::decide::{After, Decision, Verdict, decide, gave_up, invites_retry};
use crate::recorder;
use crate::route::Route;
use crate::shared::Shared;

mod report;
mod source;

use self::source::Source;

/// The longest backoff of a request that holds a writer-admission slot while others queue
/// behind it, in `base_delay`s.
pub(crate) const ADMITTED_BACKOFF_FACTOR: u32 = 4;

/// The attempts a request holding a slot may make with the short backoff; past them it is
/// colliding with a writer outside the queue that holds on (a migration, a backup, another
/// process), and backs off as any request does, up to its deadline. Sixteen, not four: on
/// PostgreSQL with three instances (each one's queue losing to the others now and then) four
/// let a request back off to `max_delay` while its whole queue waited, for a clearly worse
/// p99 than sixteen, measured interleaved; a lock held for a second still costs
/// only about a dozen more attempts.
pub(crate) const SHORT_BACKOFF_ATTEMPTS: u32 = 16;

/// The wait for a permit: the replay gate's, or the read limit's (`None`: the read waited the
/// policy's `read_wait` and goes ahead without one).
type GateAcquire = Pin<Box<dyn Future<Output = Option<OwnedSemaphorePermit>> + Send + 'static>>;

/// A permit of `semaphore` at once, or the wait for one, given up after `most` (if any).
fn permit_or_wait(
    semaphore: &Arc<Semaphore>,
    most: Option<Duration>,
) -> Result<OwnedSemaphorePermit, GateAcquire> {
    if let Ok(permit) = semaphore.clone().try_acquire_owned() {
        return Ok(permit);
    }
    let semaphore = semaphore.clone();
    Err(Box::pin(async move {
        let acquire = semaphore.acquire_owned();
        let permit = match most {
            Some(most) => tokio::time::timeout(most, acquire).await.ok()?,
            None => acquire.await,
        };
        Some(permit.expect("the layer's semaphores are never closed"))
    }))
}
type AdmitAcquire = Pin<Box<dyn Future<Output = Admitted> + Send + 'static>>;

pin_project! {
    /// The response future of [`SqliteRetry`](crate::SqliteRetry).
    ///
    /// Dropping it stops everything: no further attempt starts, a pending backoff or wait is
    /// cancelled, the admission slot, the gate permit and the buffered bytes are given back,
    /// and the request is counted with outcome `cancelled` (once, with nested layers).
    #[project = Proj]
    pub struct ResponseFuture<S, C, B>
    where
        S: Service<Request<ReplayBody<B>>>,
        B: Body,
    {
        #[pin]
        state: State<S::Future>,
        core: Core<S, C, B>,
    }

    impl<S, C, B> PinnedDrop for ResponseFuture<S, C, B>
    where
        S: Service<Request<ReplayBody<B>>>,
        B: Body,
    {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // A wait cut short is a wait all the same: sampled here, once.
            let queued = match this.state.project() {
                StateProj::Done => return,
                StateProj::Queue { pending } | StateProj::Ready { pending } => pending.waited,
                StateProj::Admit { since, pending, .. } | StateProj::Gate { since, pending, .. } => {
                    Some(pending.waited.unwrap_or_default() + since.elapsed())
                }
                StateProj::Buffering | StateProj::Called { .. } | StateProj::Backoff { .. } => None,
            };
            this.core.cancelled(queued);
        }
    }
}

/// Everything a request keeps between its states but the state itself.
struct Core<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    service: S,
    classifier: C,
    shared: Arc<Shared>,
    /// Shared with this request's attempts and nested layers: the fence, the slot, the
    /// deadline, the claim.
    request: Arc<RequestState>,
    /// The pristine request head; every attempt gets a copy (the last possible one gets the
    /// original).
    head: Option<Parts>,
    body: Source<B>,
    /// Attempts started.
    attempt: u32,
    /// The deadline's timer, armed the first time a wait is pending. Boxed, like the state
    /// that only retries and waits need, to keep the future small (axum boxes it per request).
    timer: Option<Pin<Box<Sleep>>>,
    replays: Option<Box<Replays<S::Response, S::Error>>>,
    span: Span,
}

/// What only a request that met a retryable failure or a queue needs.
struct Replays<R, E> {
    /// The last retryable failure, kept until the next attempt starts: the answer if the
    /// deadline, the fence or the budget stops the replay.
    last: Option<Result<R, E>>,
    reason: Option<Retryable>,
    prev_delay: Duration,
    total_delay: Duration,
    /// All waits for a slot or the gate so far.
    waited: Duration,
}

impl<R, E> Default for Replays<R, E> {
    fn default() -> Self {
        Self {
            last: None,
            reason: None,
            prev_delay: Duration::ZERO,
            total_delay: Duration::ZERO,
            waited: Duration::ZERO,
        }
    }
}

/// What the next attempt has gathered on its way through the queues.
#[derive(Default)]
struct Pending {
    /// The replay gate's or the read limit's permit, held until the attempt's answer is in.
    permit: Option<OwnedSemaphorePermit>,
    /// The read limit was asked (and waited for, if it had to) for this attempt.
    read_checked: bool,
    /// Time spent in the queues (admission, the gate), once it passed one, even at once: one
    /// `queue_wait` sample per attempt that was queued.
    waited: Option<Duration>,
}

impl Pending {
    fn add(&mut self, waited: Duration) {
        *self.waited.get_or_insert(Duration::ZERO) += waited;
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Buffering,
        // The checkpoint, then the next wait: a slot on the route, the gate, readiness.
        Queue { pending: Pending },
        Admit { acquire: AdmitAcquire, limit: Arc<RouteLimit>, since: Instant, pending: Pending },
        Gate { acquire: GateAcquire, since: Instant, pending: Pending },
        Ready { pending: Pending },
        Called { #[pin] future: F, permit: Option<OwnedSemaphorePermit> },
        Backoff { #[pin] sleep: Sleep },
        Done,
    }
}

/// What a state's method returns: the next state, or the answer.
enum Next<F, T> {
    To(State<F>),
    Answer(T),
}

impl<S, C, B> ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    pub(crate) fn new(service: S, classifier: C, shared: Arc<Shared>, req: Request<B>) -> Self {
        let policy = &shared.policy;
        let (head, body) = req.into_parts();
        let route = Route::of(&head);
        // NOTE: no span yet: a first attempt that succeeds pays for none. The request's span
        // is opened when a replay or a give-up is in question, or a real wait (`Core::span`).
        let span = Span::none();
        shared.stats.counters.request();
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
        let budget = policy
            .budget
            .as_ref()
            .map_or(0, |b| Arc::as_ptr(b) as *const () as usize);
        let request = Arc::new(RequestState::new(layer_id(&shared), budget, outer, route));
        if let Some(budget) = &policy.budget
            && !request.outer_deposited()
        {
            budget.deposit();
        }

        let body = Source::of(&head, body, &shared);
        let state = if body.is_collecting() {
            State::Buffering
        } else {
            request.start(Instant::now().checked_add(policy.deadline));
            State::Queue {
                pending: Pending::default(),
            }
        };
        Self {
            state,
            core: Core {
                service,
                classifier,
                shared,
                request,
                head: Some(head),
                body,
                attempt: 0,
                timer: None,
                replays: None,
                span,
            },
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

/// A `Retry-After` of 1 to 3 seconds, drawn per answer so that a burst of clients turned away
/// together does not come back together.
fn retry_after() -> HeaderValue {
    HeaderValue::from(crate::policy::random_secs(1, 3))
}

impl<S, C, B, ResBody> Future for ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>>,
    C: ClassifyError<S::Error>,
    B: Body,
    ResBody: Default,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Proj { mut state, core } = self.project();
        loop {
            // The request's span, once it has one (it may open on the way); a first attempt
            // that succeeds has none, and pays for no clone or enter.
            let span = (!core.span.is_none()).then(|| core.span.clone());
            let _entered = span.as_ref().map(Span::enter);
            let next = match state.as_mut().project() {
                StateProj::Buffering => ready!(core.buffer(cx)),
                StateProj::Queue { pending } => core.queue(std::mem::take(pending)),
                StateProj::Admit {
                    acquire,
                    limit,
                    since,
                    pending,
                } => ready!(core.admit(cx, acquire, limit, *since, pending)),
                StateProj::Gate {
                    acquire,
                    since,
                    pending,
                } => ready!(core.gate(cx, acquire, *since, pending)),
                StateProj::Ready { pending } => ready!(core.ready(cx, pending)),
                StateProj::Called { future, permit } => {
                    let result = ready!(with_current(&core.request, || future.poll(cx)));
                    drop(permit.take());
                    core.answered(result)
                }
                StateProj::Backoff { sleep } => {
                    ready!(sleep.poll(cx));
                    Next::To(State::Queue {
                        pending: Pending::default(),
                    })
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            match next {
                Next::To(next) => state.set(next),
                Next::Answer(answer) => {
                    state.set(State::Done);
                    return Poll::Ready(answer);
                }
            }
        }
    }
}

type Answer<S, B> = Result<
    <S as Service<Request<ReplayBody<B>>>>::Response,
    <S as Service<Request<ReplayBody<B>>>>::Error,
>;

impl<S, C, B, ResBody> Core<S, C, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<ResBody>>,
    C: ClassifyError<S::Error>,
    B: Body,
    ResBody: Default,
{
    /// `Buffering`: reads the body whole; the deadline runs from its end (the upload's pace
    /// was the client's).
    fn buffer(&mut self, cx: &mut Context<'_>) -> Poll<Next<S::Future, Answer<S, B>>> {
        let Source::Collecting(collector, until) = &mut self.body else {
            unreachable!("Buffering state holds a collector");
        };
        // NOTE: the upload has `deadline` to arrive (its own timer, from the request's start):
        // a stalled or trickling client must not hold its bytes against `max_buffered_bytes`,
        // and so switch retries off for everyone, for longer. Past it the request is passed
        // through to one attempt.
        let collected = match collector.poll_collect(cx) {
            Poll::Ready(collected) => collected,
            Poll::Pending => {
                let Some(until) = *until else {
                    return Poll::Pending;
                };
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
                if timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                collector.give_up(NotReplayable::BodyTooSlow)
            }
        };
        // The attempts' deadline gets a timer of its own.
        self.timer = None;
        self.body = Source::collected(collected);
        self.request
            .start(Instant::now().checked_add(self.shared.policy.deadline));
        Poll::Ready(Next::To(State::Queue {
            pending: Pending::default(),
        }))
    }

    /// `Queue`: the checkpoint, then the next wait: a slot on the route (writer admission,
    /// held until the request ends or fences), the replay gate (replays only), the read limit
    /// (a `GET` or `HEAD` while writers wait for a write turn), the inner service's
    /// readiness.
    fn queue(&mut self, mut pending: Pending) -> Next<S::Future, Answer<S, B>> {
        if let Err(stop) = self.checkpoint() {
            return self.stop(stop, pending);
        }
        if self.request.needs_slot()
            && let Some(limit) = self.shared.stats.admissions.lookup(self.request.route())
        {
            pending.add(Duration::ZERO);
            match limit.try_admit() {
                Some(admitted) => self.request.hold(limit, admitted),
                None => {
                    self.shared.stats.counters.queued();
                    self.span();
                    return Next::To(State::Admit {
                        acquire: Box::pin(limit.admit()),
                        limit,
                        since: Instant::now(),
                        pending,
                    });
                }
            }
        }
        // The replay gate (replays only), or the read limit (a read while writers wait).
        let wait = if self.attempt > 0
            && pending.permit.is_none()
            && let Some(gate) = &self.shared.gate
        {
            Some((gate, None))
        } else if pending.permit.is_none()
            && !pending.read_checked
            && let Some(reads) = &self.shared.reads
            && self.request.outer().is_none()
            && matches!(self.request.route().method, Method::GET | Method::HEAD)
            && crate::attempt::writers_waiting()
        {
            pending.read_checked = true;
            Some((reads, Some(self.shared.read_wait)))
        } else {
            None
        };
        if let Some((semaphore, most)) = wait {
            pending.add(Duration::ZERO);
            match permit_or_wait(semaphore, most) {
                Ok(permit) => pending.permit = Some(permit),
                Err(acquire) => {
                    self.span();
                    return Next::To(State::Gate {
                        acquire,
                        since: Instant::now(),
                        pending,
                    });
                }
            }
        }
        Next::To(State::Ready { pending })
    }

    /// `Admit`: waits for a slot on the route, within the deadline.
    fn admit(
        &mut self,
        cx: &mut Context<'_>,
        acquire: &mut AdmitAcquire,
        limit: &Arc<RouteLimit>,
        since: Instant,
        pending: &mut Pending,
    ) -> Poll<Next<S::Future, Answer<S, B>>> {
        let polled = acquire.as_mut().poll(cx);
        Poll::Ready(match ready!(self.wait_end(cx, polled, since, pending)) {
            Ok((admitted, pending)) => {
                self.request.hold(limit.clone(), admitted);
                Next::To(State::Queue { pending })
            }
            Err(stop) => stop,
        })
    }

    /// `Gate`: waits for a permit (the replay gate's, or the read limit's), within the
    /// deadline.
    fn gate(
        &mut self,
        cx: &mut Context<'_>,
        acquire: &mut GateAcquire,
        since: Instant,
        pending: &mut Pending,
    ) -> Poll<Next<S::Future, Answer<S, B>>> {
        let polled = acquire.as_mut().poll(cx);
        Poll::Ready(match ready!(self.wait_end(cx, polled, since, pending)) {
            Ok((permit, mut pending)) => {
                pending.permit = permit;
                Next::To(State::Queue { pending })
            }
            Err(stop) => stop,
        })
    }

    /// The end of a wait in a queue (a slot, the gate): what it waited for, with the wait
    /// added to the attempt's queue time, or past the deadline the request's end.
    #[allow(clippy::type_complexity)]
    fn wait_end<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<T>,
        since: Instant,
        pending: &mut Pending,
    ) -> Poll<Result<(T, Pending), Next<S::Future, Answer<S, B>>>> {
        let got = match polled {
            Poll::Ready(got) => Some(got),
            Poll::Pending if self.deadline_passed(cx) => None,
            Poll::Pending => return Poll::Pending,
        };
        let mut pending = std::mem::take(pending);
        pending.add(self.waited(since));
        Poll::Ready(match got {
            Some(got) => Ok((got, pending)),
            None => Err(self.stop(Outcome::Deadline, pending)),
        })
    }

    /// `Ready`: waits for the inner service's readiness, within the deadline, then starts the
    /// attempt.
    fn ready(
        &mut self,
        cx: &mut Context<'_>,
        pending: &mut Pending,
    ) -> Poll<Next<S::Future, Answer<S, B>>> {
        // NOTE: tower's rule for a service used more than once: readiness is polled before
        // every call, the first included, on the very instance that is then called.
        // `SqliteRetry::poll_ready` reserved nothing, so a slow upload never held the inner
        // service's capacity while it was buffered.
        match self.service.poll_ready(cx) {
            Poll::Ready(Ok(())) => Poll::Ready(self.call(std::mem::take(pending))),
            Poll::Ready(Err(e)) => {
                let attempts = self.attempt;
                Poll::Ready(Next::Answer(self.finish(
                    Err(e),
                    Outcome::NonRetryable,
                    attempts,
                )))
            }
            Poll::Pending if self.deadline_passed(cx) => {
                Poll::Ready(self.stop(Outcome::Deadline, std::mem::take(pending)))
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Starts an attempt: the checkpoint once more (the readiness wait may have been long),
    /// the budget for a replay, then the call.
    fn call(&mut self, pending: Pending) -> Next<S::Future, Answer<S, B>> {
        if let Err(stop) = self.checkpoint() {
            return self.stop(stop, pending);
        }
        let n = self.attempt + 1;
        let last = n >= self.shared.policy.max_attempts;
        let Some((body, last)) = self.body.for_attempt(last) else {
            return self.stop(Outcome::NotReplayable, pending);
        };
        if self.attempt > 0
            && let Some(budget) = &self.shared.policy.budget
            && !budget.withdraw()
        {
            return self.stop(Outcome::BudgetExhausted, pending);
        }
        if let Some(waited) = pending.waited {
            recorder::queue_wait(
                self.request.route().path(),
                &self.request.route().method,
                waited,
            );
        }
        // Routed by axum (a route template): the inner `Route` boxes the body again.
        let body = body.routed(self.request.route().path().is_some());
        let req = self.next_attempt(body, last);
        let future = with_current(&self.request, || self.service.call(req));
        Next::To(State::Called {
            future,
            permit: pending.permit,
        })
    }

    /// `Called`: an attempt's answer is in: pass an inner layer's through, or decide.
    fn answered(&mut self, result: Answer<S, B>) -> Next<S::Future, Answer<S, B>> {
        if let Some((outcome, attempts)) = self.inner_answered(&result) {
            // NOTE: an inner layer retried (or chose not to): its answer is this layer's
            // answer, as it is. Never multiply its attempts.
            self.end(outcome, attempts, true);
            return Next::Answer(result);
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
            Err(e) => match self.classifier.classify_error(e) {
                Some(r) => (Verdict::Retryable, Some(r)),
                None => (Verdict::Final { failed: true }, None),
            },
        };
        self.request.record(verdict == Verdict::Retryable);
        // A replay or a give-up is in question: the request gets its span from here on.
        let span = match verdict {
            Verdict::Retryable => self.span(),
            Verdict::Final { .. } => Span::none(),
        };
        let _entered = span.enter();
        if let Some(reason) = reason {
            self.replays().reason = Some(reason);
            if self.request.needs_slot() {
                // The route meets contention: from now on its attempts queue.
                self.shared.stats.admissions.contended(self.request.route());
            }
        }
        let n = self.attempt;
        let policy = &self.shared.policy;
        let after = After {
            attempt: n,
            max_attempts: policy.max_attempts,
            verdict,
            not_replayable: !self.replayable(),
            fenced: self.request.is_fenced(),
            // Read the clock only when a replay is in question: a final answer never looks
            // at it.
            remaining: match verdict {
                Verdict::Retryable => self.remaining(),
                Verdict::Final { .. } => None,
            },
        };
        // NOTE: a request holding an admission slot while others queue behind it backs off
        // briefly at first: they wait out its backoff too, and growing the delay would let the
        // writers outside the queue (another instance) capture the database (BENCHMARKS.md).
        // Past a few collisions the writer it meets holds on (a migration, a backup, another
        // process): it backs off as any request does, and its deadline decides.
        let cap = if n <= SHORT_BACKOFF_ATTEMPTS && self.request.holds_slot_with_queue() {
            policy.base_delay.saturating_mul(ADMITTED_BACKOFF_FACTOR)
        } else {
            policy.max_delay
        };
        let prev = self
            .replays
            .as_ref()
            .map_or(Duration::ZERO, |r| r.prev_delay);
        match decide(after, || policy.random_delay(n, prev, cap)) {
            Decision::Finish(outcome) => {
                if verdict == Verdict::Retryable && gave_up(outcome) {
                    self.gave_up_event(outcome, n);
                }
                Next::Answer(self.finish(result, outcome, n))
            }
            Decision::Retry { delay } => {
                self.replay_event(n, delay);
                let replays = self.replays();
                replays.last = Some(result);
                replays.prev_delay = delay;
                replays.total_delay = replays.total_delay.saturating_add(delay);
                Next::To(State::Backoff {
                    sleep: tokio::time::sleep(delay),
                })
            }
        }
    }

    /// The one checkpoint every wait's end and every call goes through: whether the request
    /// may go on to another attempt.
    fn checkpoint(&self) -> Result<(), Outcome> {
        if self.attempt > 0 {
            // A task the handler spawned may have fenced during the backoff or a wait: then
            // no replay (and the slot, given back by the fence, is not taken again).
            if self.request.is_fenced() {
                return Err(Outcome::Fenced);
            }
            if !self.replayable() {
                return Err(Outcome::NotReplayable);
            }
        }
        // A permit and the deadline may come in the same wake: the deadline wins. (The clock
        // is read only once a wait or a replay happened: a first attempt straight from its
        // body starts at its deadline's start.)
        if (self.attempt > 0 || self.timer.is_some()) && self.remaining() == Some(Duration::ZERO) {
            return Err(Outcome::Deadline);
        }
        Ok(())
    }

    /// Stops before an attempt (the checkpoint, the deadline, the budget): the last retryable
    /// failure is the answer, or a bare `503` when no attempt could start.
    fn stop(&mut self, outcome: Outcome, pending: Pending) -> Next<S::Future, Answer<S, B>> {
        if let Some(waited) = pending.waited {
            recorder::queue_wait(
                self.request.route().path(),
                &self.request.route().method,
                waited,
            );
        }
        drop(pending.permit);
        let span = self.span();
        let _entered = span.enter();
        let attempts = self.attempt;
        self.gave_up_event(outcome, attempts);
        let result = self
            .replays
            .as_mut()
            .and_then(|r| r.last.take())
            .unwrap_or_else(|| {
                let mut res = Response::new(ResBody::default());
                *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                res.headers_mut().insert(header::RETRY_AFTER, retry_after());
                Ok(res)
            });
        Next::Answer(self.finish(result, outcome, attempts))
    }

    /// The request for the next attempt (counting it), with its body; `last`: no attempt
    /// can follow it (it gets the original head).
    fn next_attempt(&mut self, body: ReplayBody<B>, last: bool) -> Request<ReplayBody<B>> {
        self.attempt += 1;
        let n = self.attempt;
        let max_attempts = self.shared.policy.max_attempts;
        if n > 1 {
            self.shared.stats.counters.retry();
            recorder::replay(
                self.request.route().path(),
                &self.request.route().method,
                self.reason().map_or("", Retryable::name),
            );
        }
        // The previous failure is no longer the answer: a new attempt starts.
        if let Some(r) = self.replays.as_mut() {
            r.last = None;
        }
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
            .insert(Attempt::new(n, max_attempts, Some(self.request.clone())));
        req
    }

    /// Whether an inner layer took the request over, and how it ended there.
    fn inner_answered(&self, result: &Answer<S, B>) -> Option<(Outcome, u32)> {
        let claimed = self.request.is_claimed().then(|| self.request.reported());
        // Responses say so too (an inner layer that could not share its request state with
        // this one: a service in between dropped the extension).
        let answered = match result {
            Ok(res) => res.extensions().get::<RetryOutcome>().copied(),
            Err(_) => None,
        };
        match (claimed, answered) {
            (Some(Some(reported)), _) => Some(reported),
            (_, Some(o)) => Some((o.outcome, o.attempts)),
            (Some(None), None) => Some((Outcome::FirstTry, self.attempt)),
            (None, None) => None,
        }
    }

    /// Records the end and returns the answer, marked with its `RetryOutcome`.
    fn finish(&mut self, result: Answer<S, B>, outcome: Outcome, attempts: u32) -> Answer<S, B> {
        self.end(outcome, attempts, false);
        let total_delay = self
            .replays
            .as_ref()
            .map_or(Duration::ZERO, |r| r.total_delay);
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
}

impl<S, C, B> Core<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    fn replays(&mut self) -> &mut Replays<S::Response, S::Error> {
        self.replays.get_or_insert_with(Box::default)
    }

    fn reason(&self) -> Option<&Retryable> {
        self.replays.as_ref().and_then(|r| r.reason.as_ref())
    }

    /// Time left before the deadline (`None`: no deadline, or too far to represent).
    fn remaining(&self) -> Option<Duration> {
        self.request
            .deadline()
            .map(|d| d.saturating_duration_since(Instant::now()))
    }

    /// Time since the request's clock started.
    fn elapsed(&self) -> Duration {
        self.remaining().map_or(Duration::ZERO, |left| {
            self.shared.policy.deadline.saturating_sub(left)
        })
    }

    /// Polls the deadline (arming it the first time); true once it has passed.
    fn deadline_passed(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(deadline) = self.request.deadline() else {
            return false;
        };
        self.timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)))
            .as_mut()
            .poll(cx)
            .is_ready()
    }

    /// A wait for a slot or the gate that began at `since` is over: counted in the request's
    /// total (a wait's one sample goes out with its attempt, or when the request stops).
    fn waited(&mut self, since: Instant) -> Duration {
        let waited = since.elapsed();
        self.replays().waited += waited;
        waited
    }

    /// Why this request's body cannot go to another attempt, if it cannot.
    fn not_replayable(&self) -> Option<NotReplayable> {
        self.body.not_replayable()
    }

    /// Whether this request's body can go to another attempt.
    fn replayable(&self) -> bool {
        self.body.replayable()
    }
}

impl<S, C, B> fmt::Debug for ResponseFuture<S, C, B>
where
    S: Service<Request<ReplayBody<B>>>,
    B: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("attempt", &self.core.attempt)
            .field("max_attempts", &self.core.shared.policy.max_attempts)
            .field(
                "total_delay",
                &self
                    .core
                    .replays
                    .as_ref()
                    .map_or(Duration::ZERO, |r| r.total_delay),
            )
            .finish_non_exhaustive()
    }
}
