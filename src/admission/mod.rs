//! Writer admission: a learned limit on each contended route's attempts in flight.
//!
//! SQLite has one writer. When two write transactions overlap, one of them fails
//! (`SQLITE_BUSY`, `SQLITE_BUSY_SNAPSHOT`) and has to run again: contention is cheapest when it
//! never happens. The expert's answer is one write connection and `BEGIN IMMEDIATE`; this
//! module gets the same effect without touching the handler or the pool, by queueing the
//! attempts of the routes that collide.
//!
//! - A route that never meets a retryable failure is never limited and pays a relaxed atomic
//!   load per request (the layer has no limited route), or one map look-up (it has some).
//! - The first retryable failure on a route gives it a limit of one attempt in flight. From
//!   then on its attempts wait for a slot, first come first served,
//!   *after* their body is read and *before* the inner service's readiness is taken, for at
//!   most the policy's deadline. A request keeps its slot through its backoff and replays, so a
//!   replay never goes to the back of the queue, until it ends or its handler calls
//!   [`Attempt::fence`](crate::Attempt::fence): once the transaction has committed, the next
//!   request may start while this handler finishes (its response, a receipt it sends).
//! - A request that holds a slot backs off briefly between its attempts: at most four times
//!   the policy's `base_delay` (8 ms by default), jittered as the policy says, instead of
//!   growing to `max_delay`. Every request queued behind it waits out its backoff too, and what
//!   it collided with is a writer outside this queue (another instance of the service, another
//!   process): a growing delay lets those writers capture the database while this instance's
//!   queue stalls. Measured on PostgreSQL with three instances, the short backoff cut p99 and
//!   the slowest request, for more replays (still far fewer than without admission).
//! - The limit follows AIMD, as TCP's window and Netflix's `concurrency-limits` do, judged
//!   every window of four times the limit's worth of admitted attempts (sixteen at least):
//!   when more than 5 % of them collided, the limit goes down by a quarter (at least one, never
//!   below one); when none did and requests are waiting, it goes up by one (a probe), after a
//!   wait that doubles each time a probe is followed by collisions and halves each time one
//!   is confirmed by a clean window. A route whose best limit is one (a SQLite write route
//!   running a read-then-write transaction: any overlap collides) thus probes ever more
//!   rarely, while a route whose handler spends most of its time outside the database (or
//!   runs on PostgreSQL) climbs to the concurrency it can use. Measured on the former, a
//!   controller that tolerated many collisions settled above one attempt in flight and did
//!   worse on every count than a limit of one: more replays, more CPU per write, lower
//!   goodput.
//!
//! # Which requests are admitted
//!
//! A route is its method and the route template the router matched (`POST /orders/{id}`,
//! axum's `MatchedPath`). Requests without a template are never admitted, only replayed: a
//! plain hyper or tower service, a layer outside the `Router`, the router's fallback, and any
//! build without the `axum` feature. Keyed by method alone, one `BUSY` on any `POST` would queue
//! every `POST` of the service behind a limit of one, a reader-heavy `POST /search` behind the
//! one write route that collides; keyed by the raw path, a client would choose the keys. Only
//! the nine methods of RFC 9110 and RFC 5789 get a limit (as the metrics' method label): the
//! map holds at most nine entries per route template of the application, whatever methods
//! clients send to an `any()` route.
//!
//! # The accounting
//!
//! Each route's slots are one small structure behind one lock: the limit, the slots held, and
//! the queue of waiting requests (first come first served). A request takes a slot only when
//! one is free and nobody waits ahead; a slot comes back through one path (the drop of the
//! request's slot, or of a wait that was granted a slot it never used), which hands it to the
//! first waiter if the limit allows. Lowering the limit only lowers the number: the slots held
//! above it are not "owed" (no permits retired later, no debt), they are just not handed on
//! when they come back; raising it hands the new slots to the waiters at once. Every change,
//! the learning's included, happens under the same lock, so no interleaving can lose or mint a
//! slot: once every request has ended, exactly `limit` requests can be admitted. An earlier
//! design kept the limit in a semaphore and paid a lowering back as permits returned; the
//! lowering and a permit's return ran under different locks, and one interleaving of the two
//! drained the semaphore for good. `tests/admission_model.rs` model-checks the queue with
//! `shuttle`, `tests/layer/admission_stress.rs` storms a real server.
//!
//! Why not tower's `ConcurrencyLimit`: its limit is fixed and known up front, applies to every
//! request of the route (reads too, unless the route is split by method), and takes its permit
//! in `poll_ready`, before the layer has the body. Why not a gradient limiter (latency-based,
//! Netflix's `Gradient2`, Envoy's adaptive concurrency): the signal here is exact (the
//! database *says* two transactions collided), where latency is a noisy proxy for it.

use std::collections::HashMap;
use std::fmt;
use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};

use http::Method;

use crate::route::Route;

mod operation;
mod queue;

pub(crate) use operation::OperationLimit;
#[allow(
    unused_imports,
    reason = "the wait's type, for a future that stores it unboxed"
)]
pub(crate) use queue::Acquire;
pub(crate) use queue::{Admitted, Entry, RouteLimit};

/// The locks the queue uses: the standard library's here, the model checker's when
/// `tests/admission_model.rs` includes `queue.rs` and `operation.rs`.
mod sync {
    pub(crate) use std::sync::atomic;
    pub(crate) use std::sync::{Arc, Mutex};
}

use sync::Arc;

/// How a layer admits the attempts of routes that meet contention; see
/// [`RetryPolicy::admission`](crate::RetryPolicy::admission).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Every attempt runs at once, as in the first release; replays still pass the replay
    /// gate.
    Off,
    /// A limit per route, learned from the retryable failures it meets (the default). Routes
    /// that never meet one are never queued, nor are requests without a route template or
    /// with a method outside RFC 9110 and RFC 5789 (see the module docs).
    ///
    /// A queued request keeps its slot through its replays, until it ends or its handler
    /// calls [`Attempt::fence`](crate::Attempt::fence) (its transaction committed). While it
    /// holds the slot it backs off at most four times the policy's `base_delay` between
    /// attempts, whatever `max_delay` says: the requests queued behind it wait out its
    /// backoff too, and the writer it collided with is outside its queue (another instance,
    /// another process).
    #[default]
    Adaptive,
}

/// The methods that may get a limit: the nine of RFC 9110 and RFC 5789, as the metrics'
/// `http_request_method` label. Any other method is never admitted, so that a client cannot
/// grow the map by inventing methods.
const METHODS: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

fn method_index(method: &Method) -> Option<usize> {
    METHODS.iter().position(|m| m == method)
}

/// Route limits by method (an index into [`METHODS`]), then by route template.
type ByMethod = [HashMap<Box<str>, Arc<RouteLimit>>; METHODS.len()];

/// Every route's limit, for one layer.
pub(crate) struct Admissions {
    mode: Admission,
    /// Whether any route has met contention: until then no request looks anything up.
    any: AtomicBool,
    routes: RwLock<ByMethod>,
    /// An operation's one limit (outside HTTP), by the operation's name.
    operation: Option<(Box<str>, Arc<OperationLimit>)>,
}

impl Admissions {
    pub(crate) fn new(mode: Admission) -> Self {
        Self {
            mode,
            any: AtomicBool::new(false),
            routes: RwLock::default(),
            operation: None,
        }
    }

    /// An operation's: no route, its one limit reported under its name.
    pub(crate) fn of_operation(name: &str, limit: Arc<OperationLimit>) -> Self {
        Self {
            operation: Some((name.into(), limit)),
            ..Self::new(Admission::Off)
        }
    }

    /// The route's limit, if it has one.
    pub(crate) fn lookup(&self, route: &Route) -> Option<Arc<RouteLimit>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let (method, path) = (method_index(&route.method)?, route.path()?);
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        routes[method].get(path).cloned()
    }

    /// A retryable failure on `route`: its limit, created (at one attempt in flight) if the
    /// route had none. `None` when admission is off, the route has no template or its method
    /// is not one of the nine standard ones.
    pub(crate) fn contended(&self, route: &Route) -> Option<Arc<RouteLimit>> {
        if self.mode == Admission::Off {
            return None;
        }
        if let Some(limit) = self.lookup(route) {
            return Some(limit);
        }
        let (method, path) = (method_index(&route.method)?, route.path()?);
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let limit = routes[method]
            .entry(path.into())
            .or_insert_with(|| Arc::new(RouteLimit::new()))
            .clone();
        self.any.store(true, Ordering::Release);
        Some(limit)
    }

    /// Every limited route's limit now, by route template, then method.
    pub(crate) fn limits(&self) -> Vec<AdmissionLimit> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = METHODS
            .iter()
            .zip(routes.iter())
            .flat_map(|(method, paths)| {
                paths.iter().map(move |(path, route)| {
                    let (limit, held, waiting) = route.snapshot();
                    AdmissionLimit {
                        method: Some(method.clone()),
                        route: path.clone(),
                        limit,
                        held,
                        waiting,
                    }
                })
            })
            .collect();
        out.sort_by(|a, b| {
            let index = |m: &Option<Method>| m.as_ref().and_then(method_index);
            (&*a.route, index(&a.method)).cmp(&(&*b.route, index(&b.method)))
        });
        if let Some((name, operation)) = &self.operation
            && let Some((limit, held, waiting)) = operation.snapshot()
        {
            out.push(AdmissionLimit {
                method: None,
                route: name.clone(),
                limit,
                held,
                waiting,
            });
        }
        out
    }
}

/// One route that writer admission limits, as
/// [`RetryMetrics::admission_limits`](crate::RetryMetrics::admission_limits) reports
/// it: its method and route template, and how many attempts it lets run at once. For an
/// [`Operation`](crate::Operation) (outside HTTP), its one limit: no method, its name where a
/// route has its template.
///
/// The figures are read together, at one moment: by the time the caller looks, requests may
/// have come and gone.
///
/// ```
/// # use tower_sqlite_retry::{RetryPolicy, SqliteRetryLayer};
/// let layer = SqliteRetryLayer::new(RetryPolicy::default());
/// for route in layer.metrics().admission_limits() {
///     println!(
///         "{} {}: {} in flight at most, {} now, {} queued",
///         route.method().map_or("", |m| m.as_str()),
///         route.route(),
///         route.limit(),
///         route.held(),
///         route.waiting(),
///     );
/// }
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdmissionLimit {
    method: Option<Method>,
    route: Box<str>,
    limit: u32,
    held: u32,
    waiting: u32,
}

impl AdmissionLimit {
    /// The request method (one of the nine of RFC 9110 and RFC 5789); `None` for an
    /// operation's limit.
    pub fn method(&self) -> Option<&Method> {
        self.method.as_ref()
    }

    /// The route template the router matched (`/orders/{id}`, never a raw path), or the
    /// operation's name.
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The attempts allowed in flight at once: from 1 (where every route starts, at its first
    /// retryable failure) to 256. An operation's limit goes away after a quiet time with no
    /// collision (it is then no longer listed).
    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// The slots held now: requests admitted and not yet ended nor fenced. It may exceed
    /// [`limit`](Self::limit) for a while right after the limit was lowered, until enough of
    /// them end.
    pub fn held(&self) -> u32 {
        self.held
    }

    /// The requests queued for a slot now.
    pub fn waiting(&self) -> u32 {
        self.waiting
    }
}

impl fmt::Display for AdmissionLimit {
    /// `POST /orders/{id}: 3` (the method, the route template and the limit); `claim: 1`
    /// for an operation.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.method {
            Some(method) => write!(f, "{} {}: {}", method, self.route, self.limit),
            None => write!(f, "{}: {}", self.route, self.limit),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::queue::{MAX_LIMIT, WINDOW_MIN};
    use super::*;

    fn limited() -> Arc<RouteLimit> {
        Arc::new(RouteLimit::new())
    }

    /// Holds `n` slots at once (as `n` requests in flight would).
    fn hold(route: &Arc<RouteLimit>, n: u32) -> Vec<Admitted> {
        (0..n)
            .map(|_| route.try_admit().expect("a free slot"))
            .collect()
    }

    /// How many slots are free: taken one by one until none is (then given back).
    fn free(route: &Arc<RouteLimit>) -> u32 {
        let mut taken = Vec::new();
        while let Some(slot) = route.try_admit() {
            taken.push(slot);
        }
        taken.len() as u32
    }

    #[test]
    fn a_new_route_admits_one_at_a_time() {
        let route = limited();
        let first = route.try_admit().unwrap();
        assert!(route.try_admit().is_none());
        drop(first);
        assert!(route.try_admit().is_some());
    }

    /// Records one window of `n` attempts, `collided` of them colliding, with requests
    /// waiting all along.
    fn window(route: &RouteLimit, n: u32, collided: u32) {
        for i in 0..n {
            route.record_waiting(i < collided, true);
        }
    }

    /// The current window's length.
    fn w(route: &RouteLimit) -> u32 {
        (4 * route.limit()).max(WINDOW_MIN)
    }

    #[test]
    fn raises_only_while_requests_wait() {
        let route = limited();
        let _first = route.try_admit().unwrap();
        for _ in 0..10 * WINDOW_MIN {
            route.record(false);
        }
        assert_eq!(route.limit(), 1, "nobody waiting: no reason to raise");
        // A request queues: the next clean window raises the limit, and hands it the slot.
        let mut queued = pin!(route.admit());
        assert_eq!(route.waiting(), 1);
        for _ in 0..WINDOW_MIN {
            route.record(false);
        }
        assert_eq!(route.limit(), 2);
        assert_eq!(route.waiting(), 0);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(queued.as_mut().poll(&mut cx).is_ready());
        route.check();
    }

    #[test]
    fn a_probe_that_collides_is_undone_and_the_next_one_waits_twice_as_long() {
        let route = limited();
        let mut waits = Vec::new();
        for _ in 0..4 {
            // Clean windows at one until the probe raises the limit to two...
            let mut clean = 0;
            while route.limit() == 1 {
                window(&route, w(&route), 0);
                clean += 1;
            }
            waits.push(clean);
            // ... where a tenth of the attempts collide: back to one.
            let n = w(&route);
            window(&route, n, n / 10);
            assert_eq!(route.limit(), 1);
        }
        assert_eq!(waits, [1, 2, 4, 8], "probes back off");
        assert_eq!(free(&route), 1);
    }

    #[test]
    fn a_route_that_does_not_collide_climbs() {
        let route = limited();
        for _ in 0..200 {
            window(&route, w(&route), 0);
        }
        assert!(route.limit() > 100, "{}", route.limit());
        // A little contention (under 5 %) holds it; more lowers it by a quarter.
        let before = route.limit();
        let n = w(&route);
        window(&route, n, n / 50);
        assert_eq!(route.limit(), before);
        let held = hold(&route, before);
        window(&route, n, n / 5);
        assert_eq!(route.limit(), before * 3 / 4);
        assert_eq!(
            route.held(),
            before,
            "held slots stay held, above the new limit"
        );
        assert!(route.try_admit().is_none());
        drop(held);
        assert_eq!(route.held(), 0);
        assert_eq!(
            free(&route),
            before * 3 / 4,
            "the slots held while it was lowered are simply not handed on"
        );
    }

    #[test]
    fn never_below_one_nor_above_the_maximum() {
        let route = limited();
        for _ in 0..100 {
            route.record(true);
        }
        assert_eq!(route.limit(), 1);
        for _ in 0..(MAX_LIMIT as usize + 10) * 4 * MAX_LIMIT as usize {
            route.record_waiting(false, true);
        }
        assert_eq!(route.limit(), MAX_LIMIT);
        assert_eq!(free(&route), MAX_LIMIT);
    }

    #[test]
    fn waiters_are_served_in_arrival_order_and_a_slot_goes_to_the_first() {
        let route = limited();
        let first = route.try_admit().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut a = Box::pin(route.admit());
        let mut b = Box::pin(route.admit());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        assert!(b.as_mut().poll(&mut cx).is_pending());
        assert!(route.try_admit().is_none(), "nobody passes the queue");
        drop(first);
        assert!(b.as_mut().poll(&mut cx).is_pending(), "b is behind a");
        let Poll::Ready(a_slot) = a.as_mut().poll(&mut cx) else {
            panic!("a got the slot");
        };
        drop(a_slot);
        assert!(b.as_mut().poll(&mut cx).is_ready());
        route.check_within_limit();
    }

    #[test]
    fn a_cancelled_wait_hands_its_granted_slot_on() {
        let route = limited();
        let first = route.try_admit().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let a = route.admit();
        let mut b = Box::pin(route.admit());
        assert!(b.as_mut().poll(&mut cx).is_pending());
        // The slot comes back and goes to `a`, which is dropped before it runs.
        drop(first);
        assert_eq!(route.held(), 1);
        drop(a);
        assert_eq!(route.held(), 1, "handed to b, not lost");
        assert!(b.as_mut().poll(&mut cx).is_ready());
        // A wait granted at once and dropped unpolled gives its slot back too.
        drop(b);
        drop(route.admit());
        assert_eq!((route.held(), route.waiting()), (0, 0));
        assert_eq!(free(&route), 1);
    }

    #[test]
    fn a_raise_hands_the_new_slots_to_the_waiters() {
        let route = limited();
        let _first = route.try_admit().unwrap();
        let mut cx = Context::from_waker(Waker::noop());
        let mut a = Box::pin(route.admit());
        assert!(a.as_mut().poll(&mut cx).is_pending());
        route.set_limit(2);
        assert!(a.as_mut().poll(&mut cx).is_ready());
    }

    /// Finding: the limit was lowered by retiring permits (`debt`) under the learning's lock
    /// while `Admitted::drop` paid that debt without it; a slot coming back between the two
    /// steps wrapped the debt to `u32::MAX`, and from then on every slot was forgotten as it
    /// came back: the route locked itself out. Here threads take and give back slots while
    /// others record windows that raise and lower the limit; once every slot is back, the
    /// route must admit exactly `limit` requests.
    #[test]
    fn many_threads_never_lose_a_slot() {
        // Rounds on a fresh route each: a route's probes grow rarer as they fail, and the
        // lowerings (the moments that matter) come from the probes.
        for round in 0..100u64 {
            let route = Arc::new(RouteLimit::new());
            let threads: Vec<_> = (0..8u64)
                .map(|t| {
                    let route = route.clone();
                    std::thread::spawn(move || {
                        let mut held = Vec::new();
                        let mut x = (round * 8 + t).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                        for i in 0..20_000u64 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            // Phases of clean windows (the limit climbs) and of collisions
                            // (it falls), while slots are taken and given back.
                            let storm = (i / 500) % 2 == 1;
                            match x % 4 {
                                0 => held.extend(route.try_admit()),
                                1 => drop(held.pop()),
                                _ => {
                                    route.record_waiting(storm && x % 2 == 0, true);
                                }
                            }
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            route.check();
            assert_eq!(route.held(), 0);
            assert_eq!(
                free(&route),
                route.limit(),
                "round {round}: every slot is back"
            );
        }
    }
}
