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
//!   then on its attempts wait for a slot, first come first served (tokio's fair semaphore),
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
//!   queue stalls. Measured on PostgreSQL with three instances (BENCHMARKS.md), the short
//!   backoff took p99 from 0.28–0.42 s to 0.12–0.16 s and the slowest request from 0.5–0.85 s
//!   to under 0.3 s, for about twice the replays (still a seventh of those without admission).
//! - The limit follows AIMD, as TCP's window and Netflix's `concurrency-limits` do, judged
//!   every window of four times the limit's worth of admitted attempts (sixteen at least):
//!   when more than 5 % of them collided, the limit goes down by a quarter (at least one, never
//!   below one); when none did and requests are waiting, it goes up by one (a probe), after a
//!   wait that doubles each time a probe is followed by collisions and halves each time one
//!   is confirmed by a clean window. A route whose best limit is one (a SQLite write route
//!   running a read-then-write transaction: any overlap collides) thus probes ever more
//!   rarely, while a route whose handler spends most of its time outside the database (or
//!   runs on PostgreSQL) climbs to the concurrency it can use. Measured on the former
//!   (BENCHMARKS.md, "Real client"), a controller that tolerated 20–40 % of collisions settled
//!   around five attempts in flight and did worse on every count than a limit of one: a
//!   replay for every three commits, a quarter more CPU per write, and lower goodput.
//!
//! Why not tower's `ConcurrencyLimit`: its limit is fixed and known up front, applies to every
//! request of the route (reads too, unless the route is split by method), and takes its permit
//! in `poll_ready`, before the layer has the body. Why not a gradient limiter (latency-based,
//! Netflix's `Gradient2`, Envoy's adaptive concurrency): the signal here is exact (the
//! database *says* two transactions collided), where latency is a noisy proxy for it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use http::Method;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::route::Route;

/// How a layer admits the attempts of routes that meet contention; see
/// [`RetryPolicy::admission`](crate::RetryPolicy::admission).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Every attempt runs at once, as in the first release; replays still pass the replay
    /// gate.
    Off,
    /// A limit per route, learned from the retryable failures it meets (the default). Routes
    /// that never meet one are never queued.
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

/// The most attempts in flight a learned limit grows to.
const MAX_LIMIT: u32 = 256;
/// The fewest admitted attempts a window holds; a window is four times the limit, at least.
const WINDOW_MIN: u32 = 16;
/// Lower the limit when more than this share of a window's attempts collide.
const LOWER_ABOVE: f64 = 0.05;
/// The most clean windows between two probes of a higher limit (the wait doubles after each
/// probe that collides, from one window).
const PROBE_MAX: u32 = 256;

/// Every route's limit, for one layer.
pub(crate) struct Admissions {
    mode: Admission,
    /// Whether any route has met contention: until then no request looks anything up.
    any: AtomicBool,
    routes: RwLock<ByMethod>,
}

/// Route limits by method, then by route template (`""` when the route is unknown).
type ByMethod = HashMap<Method, HashMap<Box<str>, Arc<RouteLimit>>>;

impl Admissions {
    pub(crate) fn new(mode: Admission) -> Self {
        Self {
            mode,
            any: AtomicBool::new(false),
            routes: RwLock::default(),
        }
    }

    /// The route's limit, if it has one.
    pub(crate) fn lookup(&self, route: &Route) -> Option<Arc<RouteLimit>> {
        if !self.any.load(Ordering::Acquire) {
            return None;
        }
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        routes
            .get(&route.method)?
            .get(route.path().unwrap_or(""))
            .cloned()
    }

    /// A retryable failure on `route`: its limit, created (at one attempt in flight) if the
    /// route had none. `None` when admission is off.
    pub(crate) fn contended(&self, route: &Route) -> Option<Arc<RouteLimit>> {
        if self.mode == Admission::Off {
            return None;
        }
        if let Some(limit) = self.lookup(route) {
            return Some(limit);
        }
        let mut routes = self.routes.write().unwrap_or_else(|e| e.into_inner());
        let limit = routes
            .entry(route.method.clone())
            .or_default()
            .entry(route.path().unwrap_or("").into())
            .or_insert_with(|| Arc::new(RouteLimit::new()))
            .clone();
        self.any.store(true, Ordering::Release);
        Some(limit)
    }

    /// Every limited route's current limit (`METHOD path`, limit), for reports.
    pub(crate) fn limits(&self) -> Vec<(String, u32)> {
        let routes = self.routes.read().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<_> = routes
            .iter()
            .flat_map(|(method, paths)| {
                paths
                    .iter()
                    .map(move |(path, limit)| (format!("{method} {path}"), limit.limit()))
            })
            .collect();
        out.sort();
        out
    }
}

/// One route's learned limit and its queue.
pub(crate) struct RouteLimit {
    semaphore: Arc<Semaphore>,
    /// Requests waiting for a slot now.
    waiting: AtomicU32,
    /// Permits to retire as they come back (the limit was lowered while they were held).
    debt: AtomicU32,
    state: Mutex<Aimd>,
}

struct Aimd {
    limit: u32,
    /// Admitted attempts finished in the current window, and how many of them collided.
    attempts: u32,
    collisions: u32,
    /// Clean windows (no collision, requests waiting) since the limit last changed.
    clean: u32,
    /// Clean windows to wait before the next probe.
    probe_every: u32,
    /// The last change was a probe (a raise) not yet confirmed by a clean window.
    probing: bool,
}

impl RouteLimit {
    fn new() -> Self {
        Self {
            semaphore: Arc::new(Semaphore::new(1)),
            waiting: AtomicU32::new(0),
            debt: AtomicU32::new(0),
            state: Mutex::new(Aimd {
                limit: 1,
                attempts: 0,
                collisions: 0,
                clean: 0,
                probe_every: 1,
                probing: false,
            }),
        }
    }

    pub(crate) fn limit(&self) -> u32 {
        self.lock().limit
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Aimd> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot at once, if one is free (never ahead of a waiting request: tokio hands a
    /// returned permit to the first waiter directly).
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Admitted> {
        let permit = self.semaphore.clone().try_acquire_owned().ok()?;
        Some(Admitted {
            permit: Some(permit),
            route: self.clone(),
        })
    }

    /// Waits for a slot, in arrival order. The wait ends when the returned future completes
    /// or is dropped.
    pub(crate) fn admit(
        self: &Arc<Self>,
    ) -> impl std::future::Future<Output = Admitted> + Send + 'static {
        let route = self.clone();
        route.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(route.clone());
        async move {
            let permit = route
                .semaphore
                .clone()
                .acquire_owned()
                .await
                .expect("admission semaphore never closed");
            drop(waiting);
            Admitted {
                permit: Some(permit),
                route,
            }
        }
    }

    /// How an admitted attempt ended: `collided` when it failed retryably.
    ///
    /// Every window of attempts (four times the limit, at least [`WINDOW_MIN`]): more than
    /// [`LOWER_ABOVE`] collided → the limit goes down by a quarter (at least one, never below
    /// one), and if it had just been raised, the next probe waits twice as long; none collided
    /// while requests were waiting → one more clean window, and after `probe_every` of them the
    /// limit goes up by one (a probe; a clean window at the new limit confirms it and halves
    /// the wait again); otherwise it holds.
    pub(crate) fn record(&self, collided: bool) {
        let mut s = self.lock();
        s.attempts += 1;
        s.collisions += u32::from(collided);
        if s.attempts < (4 * s.limit).max(WINDOW_MIN) {
            return;
        }
        let share = f64::from(s.collisions) / f64::from(s.attempts);
        let clean = s.collisions == 0;
        s.attempts = 0;
        s.collisions = 0;
        if share > LOWER_ABOVE {
            if s.probing {
                s.probe_every = (s.probe_every * 2).min(PROBE_MAX);
                s.probing = false;
            }
            s.clean = 0;
            if s.limit > 1 {
                let lower = (s.limit * 3 / 4).clamp(1, s.limit - 1);
                self.debt.fetch_add(s.limit - lower, Ordering::AcqRel);
                // Permits free right now retire at once; held ones as they come back.
                let retired = self.semaphore.forget_permits((s.limit - lower) as usize) as u32;
                self.debt.fetch_sub(retired, Ordering::AcqRel);
                s.limit = lower;
            }
            return;
        }
        if !clean {
            // A little contention: hold, and do not count the window as clean.
            return;
        }
        if s.probing {
            // A clean window at the probed limit: keep it, and probe sooner again.
            s.probing = false;
            s.probe_every = (s.probe_every / 2).max(1);
        }
        if self.waiting.load(Ordering::Relaxed) == 0 || s.limit >= MAX_LIMIT {
            return;
        }
        s.clean += 1;
        if s.clean < s.probe_every {
            return;
        }
        s.clean = 0;
        s.probing = true;
        s.limit += 1;
        // Pay back a retired permit rather than add one, if any is still owed.
        let repaid = self
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok();
        if !repaid {
            self.semaphore.add_permits(1);
        }
    }
}

/// Counts a request as waiting until it gets its slot or gives up.
struct Waiting(Arc<RouteLimit>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A slot on a limited route, held from admission until the request ends or its handler
/// fences (through its backoffs and replays).
pub(crate) struct Admitted {
    permit: Option<OwnedSemaphorePermit>,
    route: Arc<RouteLimit>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let retire = self
            .route
            .debt
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
            .is_ok();
        if retire {
            permit.forget();
        }
    }
}

// A stand-in until the admission rework lands (it defines `RouteLimit::waiting` itself).
impl RouteLimit {
    /// Requests waiting for a slot now.
    pub(crate) fn waiting(&self) -> u32 {
        self.waiting.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limited() -> Arc<RouteLimit> {
        Arc::new(RouteLimit::new())
    }

    /// Holds `n` slots at once (as `n` requests in flight would).
    fn hold(route: &Arc<RouteLimit>, n: usize) -> Vec<Admitted> {
        (0..n)
            .map(|_| route.try_admit().expect("a free slot"))
            .collect()
    }

    #[test]
    fn a_new_route_admits_one_at_a_time() {
        let route = limited();
        let first = route.try_admit().unwrap();
        assert!(route.try_admit().is_none());
        drop(first);
        assert!(route.try_admit().is_some());
    }

    /// Records one window of `n` attempts, `collided` of them colliding.
    fn window(route: &RouteLimit, n: u32, collided: u32) {
        for i in 0..n {
            route.record(i < collided);
        }
    }

    /// The current window's length.
    fn w(route: &RouteLimit) -> u32 {
        (4 * route.limit()).max(WINDOW_MIN)
    }

    #[test]
    fn raises_only_while_requests_wait() {
        let route = limited();
        window(&route, 10 * WINDOW_MIN, 0);
        assert_eq!(route.limit(), 1, "nobody waiting: no reason to raise");
        route.waiting.fetch_add(1, Ordering::Relaxed);
        window(&route, WINDOW_MIN, 0);
        assert_eq!(route.limit(), 2);
        assert_eq!(route.semaphore.available_permits(), 2);
    }

    #[test]
    fn a_probe_that_collides_is_undone_and_the_next_one_waits_twice_as_long() {
        let route = limited();
        route.waiting.fetch_add(1, Ordering::Relaxed);
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
        assert_eq!(route.semaphore.available_permits(), 1);
    }

    #[test]
    fn a_route_that_does_not_collide_climbs() {
        let route = limited();
        route.waiting.fetch_add(1, Ordering::Relaxed);
        for _ in 0..200 {
            window(&route, w(&route), 0);
        }
        assert!(route.limit() > 100, "{}", route.limit());
        // A little contention (under 5 %) holds it; more lowers it by a quarter.
        let before = route.limit();
        let n = w(&route);
        window(&route, n, n / 50);
        assert_eq!(route.limit(), before);
        let held = hold(&route, before as usize);
        window(&route, n, n / 5);
        assert_eq!(route.limit(), before * 3 / 4);
        drop(held);
        assert_eq!(
            route.semaphore.available_permits(),
            (before * 3 / 4) as usize,
            "the slots held while it was lowered retire as they come back"
        );
    }

    #[test]
    fn never_below_one_nor_above_the_maximum() {
        let route = limited();
        for _ in 0..100 {
            route.record(true);
        }
        assert_eq!(route.limit(), 1);
        route.waiting.fetch_add(1, Ordering::Relaxed);
        for _ in 0..(MAX_LIMIT as usize + 10) * 4 * MAX_LIMIT as usize {
            route.record(false);
        }
        assert_eq!(route.limit(), MAX_LIMIT);
        assert_eq!(route.semaphore.available_permits(), MAX_LIMIT as usize);
    }
}
