//! A model check of writer admission's accounting with `shuttle`: the crate's own
//! `src/admission/queue.rs`, included as is, over shuttle's `Mutex` (the only lock it takes),
//! under thousands of thread schedules chosen at random and by PCT (probabilistic concurrency
//! testing, which finds bugs of a small depth with a known probability).
//!
//! Each schedule runs threads that take slots at once or wait for one in the queue, give up
//! their wait at any point (before it is granted, or after it was granted but before it ran),
//! give slots back, and move the limit down and up (directly and through the learning's
//! windows). Checked throughout: the queue's invariants (nobody waits while a slot is free,
//! arrival order, the limit within `1..=256`, a granted slot is held, and, in the schedules
//! where the limit only rises, never more slots held than the limit); a deadlock (a waiter
//! never woken) fails the schedule. Checked once all threads are done: every wait ended
//! (granted or cancelled), no slot is held, and exactly `limit` requests can take one: no slot
//! lost or minted.
//!
//! Two more check an operation's accounting: call chains that own slots (a nested try is let
//! through, never queued behind its own chain), and a limit that goes away after a quiet time
//! (`src/admission/operation.rs`) while tries hold and wait for it.
//!
//! The last test runs the same check on a model of the earlier design (a semaphore whose
//! lowering retired permits through a debt that their return paid without the lowering's
//! lock) and requires the checker to find it losing slots.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use shuttle::future::block_on;
use shuttle::thread;

/// What `queue.rs` and `operation.rs` lock with: shuttle's, so that the scheduler sees every
/// lock and atomic.
mod sync {
    pub(crate) use shuttle::sync::atomic;
    pub(crate) use shuttle::sync::{Arc, Mutex};
}

#[allow(dead_code, unreachable_pub)]
#[path = "../src/admission/queue.rs"]
mod queue;

#[allow(dead_code, unreachable_pub)]
#[path = "../src/admission/operation.rs"]
mod operation;

use std::time::Duration;

use operation::OperationLimit;
use queue::{Entry, MAX_LIMIT, RouteLimit, WINDOW_MIN};
use sync::Arc;

/// Polls a future once; `Some` if it completed.
struct PollOnce<'a, F>(&'a mut F);

impl<F: Future + Unpin> Future for PollOnce<'_, F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match Pin::new(&mut *self.0).poll(cx) {
            Poll::Ready(out) => Some(out),
            Poll::Pending => None,
        })
    }
}

/// Everything back: no slot held, nobody queued, and `limit` slots free, no more.
fn assert_all_back(route: &Arc<RouteLimit>) {
    route.check();
    let (limit, held, waiting) = route.snapshot();
    assert!((1..=MAX_LIMIT).contains(&limit), "limit {limit}");
    assert_eq!((held, waiting), (0, 0), "every slot back, every wait over");
    let mut taken = Vec::new();
    while let Some(slot) = route.try_admit() {
        taken.push(slot);
    }
    assert_eq!(taken.len() as u32, limit, "no slot lost nor minted");
    drop(taken);
    assert_eq!(route.held(), 0);
}

/// One execution: four threads around one route. With `lowering`, it starts at a limit of
/// two and one thread moves the limit down and up; without, it starts at one and only goes
/// up, and then no more slots than the limit may ever be held.
fn scenario(lowering: bool) {
    let check = move |route: &RouteLimit| {
        if lowering {
            route.check();
        } else {
            route.check_within_limit();
        }
    };
    let route = Arc::new(RouteLimit::new());
    if lowering {
        route.set_limit(2);
    }
    let mut threads = Vec::new();

    // Waits its turn twice, holding the slot across a yield.
    let r = route.clone();
    threads.push(thread::spawn(move || {
        for _ in 0..2 {
            let slot = block_on(r.admit());
            check(&r);
            thread::yield_now();
            drop(slot);
            check(&r);
        }
    }));

    // Takes a slot at once if it can; then queues and gives up, once before its wait could
    // be granted and once after a yield (granted meanwhile, or not).
    let r = route.clone();
    threads.push(thread::spawn(move || {
        if let Some(slot) = r.try_admit() {
            thread::yield_now();
            drop(slot);
        }
        let mut wait = r.admit();
        let early = block_on(PollOnce(&mut wait));
        drop(wait);
        drop(early);
        check(&r);
        let mut wait = r.admit();
        let got = block_on(PollOnce(&mut wait));
        thread::yield_now();
        drop(got);
        drop(wait);
        check(&r);
    }));

    // Moves the limit: up, down through the learning (a window of collisions), down to one
    // directly, then up again; or, without lowering, from one (three requests may queue
    // behind one slot) up by one twice.
    let r = route.clone();
    threads.push(thread::spawn(move || {
        if lowering {
            r.set_limit(3);
            check(&r);
            for _ in 0..WINDOW_MIN.max(12) {
                r.record(true);
            }
            check(&r);
            r.set_limit(1);
        }
        thread::yield_now();
        r.set_limit(2);
        check(&r);
        if !lowering {
            thread::yield_now();
            r.set_limit(3);
            check(&r);
        }
    }));

    // One more plain waiter, so that hand-offs have someone behind them.
    let r = route.clone();
    threads.push(thread::spawn(move || {
        let slot = block_on(r.admit());
        thread::yield_now();
        drop(slot);
    }));

    for t in threads {
        t.join().unwrap();
    }
    assert_all_back(&route);
}

#[test]
fn random_schedules_never_lose_a_slot() {
    shuttle::check_random(|| scenario(true), 6_000);
}

#[test]
fn pct_schedules_never_lose_a_slot() {
    shuttle::check_pct(|| scenario(true), 6_000, 3);
}

#[test]
fn without_a_lowering_no_more_slots_than_the_limit_are_ever_held() {
    shuttle::check_random(|| scenario(false), 3_000);
    shuttle::check_pct(|| scenario(false), 3_000, 3);
}

/// The earlier design, as far as its accounting goes: a semaphore of permits, a lowering that
/// adds a debt, retires the free permits and subtracts what it retired (under the learning's
/// lock), and a permit's return that pays the debt without that lock.
mod old_design {
    use shuttle::sync::Mutex;
    use shuttle::sync::atomic::{AtomicU32, Ordering};

    pub(super) struct Route {
        pub(super) permits: Mutex<u32>,
        pub(super) debt: AtomicU32,
        pub(super) limit: Mutex<u32>,
    }

    pub(super) struct Permit<'a>(&'a Route);

    impl Route {
        pub(super) fn new(limit: u32) -> Self {
            Self {
                permits: Mutex::new(limit),
                debt: AtomicU32::new(0),
                limit: Mutex::new(limit),
            }
        }

        pub(super) fn try_admit(&self) -> Option<Permit<'_>> {
            let mut p = self.permits.lock().unwrap();
            (*p > 0).then(|| {
                *p -= 1;
                Permit(self)
            })
        }

        pub(super) fn lower(&self, by: u32) {
            let mut limit = self.limit.lock().unwrap();
            self.debt.fetch_add(by, Ordering::AcqRel);
            let retired = {
                let mut p = self.permits.lock().unwrap();
                let retired = by.min(*p);
                *p -= retired;
                retired
            };
            self.debt.fetch_sub(retired, Ordering::AcqRel);
            *limit -= by;
        }
    }

    impl Drop for Permit<'_> {
        fn drop(&mut self) {
            let pay = self
                .0
                .debt
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
                .is_ok();
            if !pay {
                *self.0.permits.lock().unwrap() += 1;
            }
        }
    }
}

#[test]
fn the_model_finds_the_earlier_design_losing_slots() {
    let found = std::panic::catch_unwind(|| {
        shuttle::check_random(
            || {
                let route = std::sync::Arc::new(old_design::Route::new(2));
                let r = route.clone();
                let worker = thread::spawn(move || {
                    let slot = r.try_admit();
                    thread::yield_now();
                    drop(slot);
                });
                route.lower(1);
                worker.join().unwrap();
                let free = *route.permits.lock().unwrap();
                let limit = *route.limit.lock().unwrap();
                assert_eq!(free, limit, "every permit back");
            },
            3000,
        );
    });
    assert!(found.is_err(), "the checker finds the lost slot");
}

/// An operation's slots name their call chain (an owner): a chain that holds one is let
/// through at once (`Entry::Nested`), whatever the interleaving; another chain queues, a
/// retry ahead of first tries; the slots an owner holds come back with them. Checked: the
/// queue's invariants throughout (owned slots are held, none listed with none), and at the
/// end every slot back, no owner left, `limit` slots free.
fn owners_scenario() {
    let route = Arc::new(RouteLimit::new());
    let mut threads = Vec::new();
    for chain in 1..=3u64 {
        let r = route.clone();
        threads.push(thread::spawn(move || {
            // a first try of this chain: at once, or in the queue
            let outer = match r.enter(chain, chain, false) {
                Entry::Admitted(slot) => slot,
                Entry::Queued(wait) => block_on(wait),
                Entry::Nested => panic!("chain {chain} holds nothing yet"),
            };
            r.check();
            // a nested try of the same chain (a `run` inside its `run`): never queued
            for _ in 0..2 {
                assert!(
                    matches!(r.enter(chain, 100 + chain, chain == 2), Entry::Nested),
                    "chain {chain} waited for itself"
                );
                thread::yield_now();
            }
            drop(outer);
            r.check();
            // a retry of this chain: ahead of first tries
            let again = match r.enter(chain, chain, true) {
                Entry::Admitted(slot) => Some(slot),
                Entry::Queued(wait) => Some(block_on(wait)),
                Entry::Nested => None,
            };
            assert!(again.is_some(), "chain {chain} held nothing");
            drop(again);
            r.check();
        }));
    }
    // the learning raises and lowers the limit meanwhile
    let r = route.clone();
    threads.push(thread::spawn(move || {
        r.set_limit(2);
        thread::yield_now();
        for _ in 0..WINDOW_MIN {
            r.record_waiting(true, true);
        }
        r.check();
    }));
    for t in threads {
        t.join().unwrap();
    }
    for chain in 1..=3 {
        assert!(!route.held_by(chain), "chain {chain} still listed");
    }
    assert_all_back(&route);
}

#[test]
fn a_call_chain_never_waits_for_its_own_slot() {
    shuttle::check_random(owners_scenario, 3_000);
    shuttle::check_pct(owners_scenario, 3_000, 3);
}

/// An operation's limit that goes away while tries hold and wait for its slots: the tries
/// queued for it are let go (none waits for a limit nobody uses any more: a deadlock fails
/// the schedule), a collision meanwhile makes a fresh limit or keeps the current one, and the
/// old limit's slots all come back.
fn decay_scenario() {
    let op = Arc::new(OperationLimit::new());
    let quiet = Duration::from_secs(1);
    let (first, made) = op.collided(Duration::ZERO);
    assert!(made);
    let held = first.try_admit().expect("a free slot");
    let mut threads = Vec::new();
    // a try queued for the first limit
    let f = first.clone();
    threads.push(thread::spawn(move || {
        let slot = block_on(f.admit());
        thread::yield_now();
        drop(slot);
    }));
    // the look that finds the operation quiet (its limit goes), and a collision
    let o = op.clone();
    threads.push(thread::spawn(move || {
        let lookup = o.get(|| Duration::from_secs(5), quiet);
        if lookup.decayed {
            assert!(lookup.limit.is_none());
        }
    }));
    let o = op.clone();
    threads.push(thread::spawn(move || {
        thread::yield_now();
        let (limit, _) = o.collided(Duration::from_secs(5));
        let slot = limit.try_admit();
        drop(slot);
        limit.check();
    }));
    // the holder goes
    threads.push(thread::spawn(move || {
        thread::yield_now();
        drop(held);
    }));
    for t in threads {
        t.join().unwrap();
    }
    let (limit, held, waiting) = first.snapshot();
    assert_eq!((held, waiting), (0, 0), "every slot of the old limit back");
    assert!((1..=MAX_LIMIT).contains(&limit));
    if let Some((limit, held, waiting)) = op.snapshot() {
        assert_eq!((held, waiting), (0, 0));
        assert!((1..=MAX_LIMIT).contains(&limit));
    }
}

#[test]
fn a_limit_that_goes_away_lets_its_queue_go() {
    shuttle::check_random(decay_scenario, 3_000);
    shuttle::check_pct(decay_scenario, 3_000, 3);
}
