//! One route's slots: its learned limit, the slots held under it and the requests waiting for
//! one, all behind one lock.
//!
//! The accounting has no other state: a slot is taken (`held += 1`) only while
//! `held < limit` and nobody waits ahead, and given back (`held -= 1`) by exactly one path, the
//! drop of [`Admitted`] or of an [`Acquire`] granted a slot it never delivered; each give-back
//! hands slots to the front of the queue for as long as `held < limit`. Lowering the limit only
//! sets `limit`: the slots held above it are not owed to anyone, they simply are not handed on
//! when they come back. Raising it hands the new slots to the waiters at once. So, whatever
//! the interleaving, `free = limit − held` when `held ≤ limit` (and none free while it exceeds
//! a lowered limit), a waiting request is never passed over while a slot is free, and once
//! every slot is back, `limit` requests can take one.
//!
//! An operation outside HTTP (`crate::operation`) also says *who* holds each slot: an owner,
//! a number standing for a task or a thread (its call chain). A call chain that holds a slot
//! and asks for another of the same limit (a retried function called from a retried caller)
//! is let through at once under the slot it holds ([`RouteLimit::enter`]): no try ever waits
//! for a slot its own call chain holds. The layer's requests name no owner.
//!
//! The file uses nothing but `super::sync::{Arc, Mutex}` (the standard library's in the crate,
//! the model checker's in `tests/admission_model.rs`, which includes this file as is) and
//! plain data, so the model checks the very code the crate runs.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use super::sync::{Arc, Mutex};

/// The most attempts in flight a learned limit grows to.
pub(crate) const MAX_LIMIT: u32 = 256;
/// The fewest admitted attempts a window holds; a window is four times the limit, at least.
pub(crate) const WINDOW_MIN: u32 = 16;
/// Lower the limit when more than this share of a window's attempts collide.
const LOWER_ABOVE: f64 = 0.05;
/// The most clean windows between two probes of a higher limit (the wait doubles after each
/// probe that collides, from one window).
const PROBE_MAX: u32 = 256;

/// One route's learned limit and its queue.
pub(crate) struct RouteLimit {
    state: Mutex<State>,
}

/// Everything about a route's slots, behind its one lock.
struct State {
    /// Attempts allowed in flight: `1..=MAX_LIMIT`.
    limit: u32,
    /// Slots taken and not given back: admitted requests, and waiters granted a slot whose
    /// future has not collected it yet. Above `limit` only after a lowering, until enough come
    /// back.
    held: u32,
    /// Requests waiting for a slot, in arrival order (their ids increase front to back).
    waiting: VecDeque<Waiter>,
    /// Waiters granted a slot (counted in `held`) that their future has not collected yet.
    granted: Vec<u64>,
    /// The next waiter's id: from `FRESH` up for a first try, from 0 up for a retry (a streak
    /// under way), which queues ahead of every first try (a retry never goes to the back).
    next_id: u64,
    next_retry_id: u64,
    /// Who holds the slots that named an owner (an operation's tries): each owner once, with
    /// how many slots it holds.
    owners: Vec<(u64, u32)>,
    aimd: Aimd,
}

struct Waiter {
    id: u64,
    /// Set by the first poll; a waiter granted before it is polled needs no wake.
    waker: Option<Waker>,
}

/// The first id of a first try's wait: every retry's id is below it.
const FRESH: u64 = 1 << 63;

/// What [`RouteLimit::enter`] gives.
pub(crate) enum Entry {
    /// The caller's own call chain holds a slot of this limit: go on under it, take none.
    Nested,
    /// A slot at once.
    Admitted(Admitted),
    /// In the queue.
    Queued(Acquire),
}

/// The learning half: windows of admitted attempts and the probes of a higher limit.
struct Aimd {
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

impl Aimd {
    /// Counts one admitted attempt, and at the end of a window returns the limit to move to
    /// (the same one when it holds). See [`RouteLimit::record`].
    fn record(&mut self, collided: bool, limit: u32, waiting: bool) -> u32 {
        self.attempts += 1;
        self.collisions += u32::from(collided);
        if self.attempts < (4 * limit).max(WINDOW_MIN) {
            return limit;
        }
        let share = f64::from(self.collisions) / f64::from(self.attempts);
        let clean = self.collisions == 0;
        self.attempts = 0;
        self.collisions = 0;
        if share > LOWER_ABOVE {
            if self.probing {
                self.probe_every = (self.probe_every * 2).min(PROBE_MAX);
                self.probing = false;
            }
            self.clean = 0;
            return if limit > 1 {
                (limit * 3 / 4).clamp(1, limit - 1)
            } else {
                limit
            };
        }
        if !clean {
            // A little contention: hold, and do not count the window as clean.
            return limit;
        }
        if self.probing {
            // A clean window at the probed limit: keep it, and probe sooner again.
            self.probing = false;
            self.probe_every = (self.probe_every / 2).max(1);
        }
        if !waiting || limit >= MAX_LIMIT {
            return limit;
        }
        self.clean += 1;
        if self.clean < self.probe_every {
            return limit;
        }
        self.clean = 0;
        self.probing = true;
        limit + 1
    }
}

/// Wakers to wake once the lock is released.
type Wakes = Vec<Waker>;

impl State {
    /// Hands free slots to the front of the queue, first come first served.
    fn grant(&mut self, wakes: &mut Wakes) {
        while self.held < self.limit {
            let Some(waiter) = self.waiting.pop_front() else {
                return;
            };
            self.held += 1;
            self.granted.push(waiter.id);
            wakes.extend(waiter.waker);
        }
    }

    /// A slot comes back: the first waiter gets it if the limit allows.
    fn release(&mut self, wakes: &mut Wakes) {
        debug_assert!(self.held > 0, "a slot given back that nobody held");
        self.held = self.held.saturating_sub(1);
        self.grant(wakes);
    }

    /// Moves the limit; a raise hands the new slots on at once, a lowering waits for held
    /// slots to come back (nothing is owed: they are just not handed on).
    fn set_limit(&mut self, limit: u32, wakes: &mut Wakes) {
        self.limit = limit.clamp(1, MAX_LIMIT);
        self.grant(wakes);
    }

    /// Counts one more slot held by `owner`.
    fn own(&mut self, owner: u64) {
        match self.owners.iter_mut().find(|(o, _)| *o == owner) {
            Some((_, n)) => *n = n.saturating_add(1),
            None => self.owners.push((owner, 1)),
        }
    }

    /// One slot of `owner`'s comes back.
    fn disown(&mut self, owner: u64) {
        if let Some(i) = self.owners.iter().position(|(o, _)| *o == owner) {
            self.owners[i].1 -= 1;
            if self.owners[i].1 == 0 {
                self.owners.swap_remove(i);
            }
        }
    }

    /// Takes a slot for a request arriving now, if one is free and nobody waits ahead.
    fn take(&mut self) -> bool {
        let free = self.held < self.limit && self.waiting.is_empty();
        self.held += u32::from(free);
        free
    }
}

fn wake_all(wakes: Wakes) {
    for waker in wakes {
        waker.wake();
    }
}

impl RouteLimit {
    /// A new limit: one attempt in flight.
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                limit: 1,
                held: 0,
                waiting: VecDeque::new(),
                granted: Vec::new(),
                next_id: FRESH,
                next_retry_id: 0,
                owners: Vec::new(),
                aimd: Aimd {
                    attempts: 0,
                    collisions: 0,
                    clean: 0,
                    probe_every: 1,
                    probing: false,
                },
            }),
        }
    }

    fn lock(&self) -> impl std::ops::DerefMut<Target = State> + '_ {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The attempts allowed in flight now.
    #[allow(dead_code, reason = "for the response future and the tests")]
    pub(crate) fn limit(&self) -> u32 {
        self.lock().limit
    }

    /// The slots held now (granted to a waiter that has not run yet included).
    #[cfg(test)]
    pub(crate) fn held(&self) -> u32 {
        self.lock().held
    }

    /// The requests queued for a slot now (a request holding a slot backs off briefly only
    /// while some are).
    #[allow(dead_code, reason = "for the response future and the tests")]
    pub(crate) fn waiting(&self) -> u32 {
        u32::try_from(self.lock().waiting.len()).unwrap_or(u32::MAX)
    }

    /// The limit, held slots and queued requests, read together.
    pub(crate) fn snapshot(&self) -> (u32, u32, u32) {
        let s = self.lock();
        let waiting = u32::try_from(s.waiting.len()).unwrap_or(u32::MAX);
        (s.limit, s.held, waiting)
    }

    /// A slot at once, if one is free and nobody waits ahead.
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Admitted> {
        self.lock().take().then(|| Admitted {
            route: Arc::clone(self),
            owner: None,
        })
    }

    /// A slot for a try of `owner`'s call chain: none needed when that chain already holds
    /// one of this limit ([`Entry::Nested`]), else one at once if free and nobody waits
    /// ahead, else a place in the queue (the slot, once delivered, is `owner`'s). Decided
    /// under the one lock: a chain's slot cannot come or go between the look and the queue.
    ///
    /// A `retry` (a try of a streak under way) queues behind the other retries but ahead of
    /// every first try.
    ///
    /// `within` names the chain the caller runs inside (its task or thread), whose slot also
    /// covers it; it is `owner` itself for a caller that is no call of its own.
    pub(crate) fn enter(self: &Arc<Self>, owner: u64, within: u64, retry: bool) -> Entry {
        let mut s = self.lock();
        if s.owners.iter().any(|(o, _)| *o == owner || *o == within) {
            return Entry::Nested;
        }
        if s.take() {
            s.own(owner);
            drop(s);
            return Entry::Admitted(Admitted {
                route: Arc::clone(self),
                owner: Some(owner),
            });
        }
        let id = if retry {
            let id = s.next_retry_id;
            s.next_retry_id = (id + 1).min(FRESH - 1);
            let at = s.waiting.partition_point(|w| w.id < FRESH);
            s.waiting.insert(at, Waiter { id, waker: None });
            id
        } else {
            let id = s.next_id;
            s.next_id = id.saturating_add(1);
            s.waiting.push_back(Waiter { id, waker: None });
            id
        };
        drop(s);
        Entry::Queued(Acquire {
            route: Arc::clone(self),
            stage: Stage::Queued(id),
            owner: Some(owner),
        })
    }

    /// Whether `owner` holds a slot of this limit now.
    #[allow(dead_code, reason = "for the tests")]
    pub(crate) fn held_by(&self, owner: u64) -> bool {
        self.lock().owners.iter().any(|(o, _)| *o == owner)
    }

    /// Waits for a slot, in arrival order: the request joins the queue now (or takes a free
    /// slot now, when nobody waits ahead), not at the first poll. Dropping the future ends the
    /// wait; a slot it was granted but had not delivered goes to the next waiter.
    pub(crate) fn admit(self: &Arc<Self>) -> Acquire {
        let mut s = self.lock();
        let stage = if s.take() {
            Stage::Granted
        } else {
            let id = s.next_id;
            s.next_id = id.saturating_add(1);
            s.waiting.push_back(Waiter { id, waker: None });
            Stage::Queued(id)
        };
        drop(s);
        Acquire {
            route: Arc::clone(self),
            stage,
            owner: None,
        }
    }

    /// How an admitted attempt ended: `collided` when it failed retryably.
    ///
    /// Every window of attempts (four times the limit, at least [`WINDOW_MIN`]): more than
    /// 5 % collided → the limit goes down by a quarter (at least one, never below one), and if
    /// it had just been raised, the next probe waits twice as long; none collided while
    /// requests were waiting → one more clean window, and after `probe_every` of them the
    /// limit goes up by one (a probe; a clean window at the new limit confirms it and halves
    /// the wait again); otherwise it holds.
    ///
    /// Returns the new limit when this attempt moved it.
    pub(crate) fn record(&self, collided: bool) -> Option<u32> {
        self.record_as(collided, None)
    }

    /// [`record`](Self::record), as though requests were waiting (`Some(true)`) or not.
    #[cfg(test)]
    pub(crate) fn record_waiting(&self, collided: bool, waiting: bool) -> Option<u32> {
        self.record_as(collided, Some(waiting))
    }

    fn record_as(&self, collided: bool, waiting: Option<bool>) -> Option<u32> {
        let mut wakes = Wakes::new();
        let moved = {
            let mut s = self.lock();
            let waiting = waiting.unwrap_or(!s.waiting.is_empty());
            let limit = s.limit;
            let next = s.aimd.record(collided, limit, waiting);
            (next != limit).then(|| {
                s.set_limit(next, &mut wakes);
                s.limit
            })
        };
        wake_all(wakes);
        moved
    }

    /// Sets the limit directly (clamped to `1..=MAX_LIMIT`), as the learning does; an
    /// operation's limit that goes away is opened so (its queued tries go at once).
    pub(crate) fn set_limit(&self, limit: u32) {
        let mut wakes = Wakes::new();
        self.lock().set_limit(limit, &mut wakes);
        wake_all(wakes);
    }

    /// Gives a slot back (`owner`'s, when it named one).
    fn release(&self, owner: Option<u64>) {
        let mut wakes = Wakes::new();
        {
            let mut s = self.lock();
            if let Some(owner) = owner {
                s.disown(owner);
            }
            s.release(&mut wakes);
        }
        wake_all(wakes);
    }

    /// A queued request stops waiting: it leaves the queue, or, if it had been granted a
    /// slot meanwhile, gives the slot back (to the next waiter).
    fn cancel(&self, id: u64) {
        let mut wakes = Wakes::new();
        {
            let mut s = self.lock();
            if let Some(i) = s.granted.iter().position(|g| *g == id) {
                s.granted.swap_remove(i);
                s.release(&mut wakes);
            } else if let Ok(i) = s.waiting.binary_search_by_key(&id, |w| w.id) {
                s.waiting.remove(i);
            }
        }
        wake_all(wakes);
    }
}

/// A slot on a limited route, held from admission until the request ends or its handler
/// fences (through its backoffs and replays). Dropping it gives the slot back.
pub(crate) struct Admitted {
    route: Arc<RouteLimit>,
    /// The call chain that holds it (an operation's try), if one was named.
    owner: Option<u64>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.route.release(self.owner);
    }
}

/// The wait for a slot ([`RouteLimit::admit`], [`RouteLimit::enter`]).
pub(crate) struct Acquire {
    route: Arc<RouteLimit>,
    stage: Stage,
    /// Whose the slot will be, once delivered.
    owner: Option<u64>,
}

enum Stage {
    /// A slot is ours (counted in `held`) and not delivered yet.
    Granted,
    /// In the queue under this id (or granted under it, which the lock tells).
    Queued(u64),
    /// The slot went out as an [`Admitted`].
    Done,
}

impl Future for Acquire {
    type Output = Admitted;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Admitted> {
        match self.stage {
            Stage::Granted => {
                if let Some(owner) = self.owner {
                    self.route.lock().own(owner);
                }
            }
            Stage::Queued(id) => {
                let mut s = self.route.lock();
                if let Some(i) = s.granted.iter().position(|g| *g == id) {
                    s.granted.swap_remove(i);
                    if let Some(owner) = self.owner {
                        s.own(owner);
                    }
                } else {
                    // Neither granted nor queued cannot be: only this future's drop removes
                    // its id otherwise.
                    let i = s.waiting.binary_search_by_key(&id, |w| w.id);
                    debug_assert!(i.is_ok(), "a waiter neither queued nor granted");
                    if let Ok(i) = i {
                        let waker = &mut s.waiting[i].waker;
                        match waker {
                            Some(w) if w.will_wake(cx.waker()) => {}
                            _ => *waker = Some(cx.waker().clone()),
                        }
                    }
                    return Poll::Pending;
                }
            }
            Stage::Done => panic!("`Acquire` polled after it completed"),
        }
        self.stage = Stage::Done;
        Poll::Ready(Admitted {
            route: Arc::clone(&self.route),
            owner: self.owner,
        })
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        match self.stage {
            Stage::Granted => self.route.release(None),
            Stage::Queued(id) => self.route.cancel(id),
            Stage::Done => {}
        }
    }
}

/// The accounting's invariants, for the tests: checked under the lock.
#[cfg(test)]
impl RouteLimit {
    pub(crate) fn check(&self) {
        let s = self.lock();
        assert!((1..=MAX_LIMIT).contains(&s.limit), "limit {}", s.limit);
        assert!(
            s.waiting.is_empty() || s.held >= s.limit,
            "a request waits while a slot is free (held {}, limit {})",
            s.held,
            s.limit
        );
        assert!(
            s.waiting
                .iter()
                .zip(s.waiting.iter().skip(1))
                .all(|(a, b)| a.id < b.id),
            "the queue is in arrival order"
        );
        assert!(s.granted.len() as u32 <= s.held, "granted slots are held");
        let owned: u32 = s.owners.iter().map(|(_, n)| *n).sum();
        assert!(
            owned <= s.held,
            "owned slots are held ({owned} > {})",
            s.held
        );
        assert!(
            s.owners.iter().all(|(_, n)| *n > 0),
            "an owner listed with no slot"
        );
    }

    /// [`check`](Self::check), and no more slots held than the limit: true at any moment
    /// unless the limit was just lowered below the slots then held.
    pub(crate) fn check_within_limit(&self) {
        self.check();
        let s = self.lock();
        assert!(s.held <= s.limit, "held {} > limit {}", s.held, s.limit);
    }
}
