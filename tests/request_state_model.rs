//! A model check of a request's fence and admission slot with `shuttle`: the crate's own
//! `src/attempt/slot.rs`, included as is, over shuttle's `Mutex` and atomics, under thousands
//! of thread schedules chosen at random and by PCT.
//!
//! The races it covers are those of a real request: a task the handler spawned fences while
//! the response future ends (or is dropped) and gives the slot back; a slot is granted just as
//! the fence lands; an inner clone of the layer, whose slot the outer clone holds, fences,
//! records its attempt and ends while the outer one ends. Checked: a slot is given back
//! exactly once (never twice, never kept), never held after the fence, and an inner clone
//! always finds the limit it records against.

use shuttle::sync::atomic::AtomicIsize;
use shuttle::thread;

/// What `slot.rs` synchronizes with: shuttle's, so that the scheduler sees every access.
mod sync {
    pub(crate) use shuttle::sync::atomic::{AtomicBool, Ordering};
    pub(crate) use shuttle::sync::{Arc, Mutex, MutexGuard};
}

#[allow(dead_code, unreachable_pub)]
#[path = "../src/attempt/slot.rs"]
mod slot;

use slot::{HoldsSlot, SlotState};
use sync::{Arc, Ordering};

/// A request's whole state, in the model: its slot state only.
struct Request(SlotState<Request>);

impl HoldsSlot for Request {
    type Admitted = Token;
    type Limit = Limit;

    fn slot_state(&self) -> &SlotState<Self> {
        &self.0
    }
}

fn request(layer: usize, outer: Option<Arc<Request>>) -> Arc<Request> {
    Arc::new(Request(SlotState::new(layer, outer)))
}

/// Slots held now, across the model.
#[derive(Clone, Default)]
struct Held(Arc<AtomicIsize>);

/// One slot: counted while it lives, given back when dropped.
struct Token(Held);

impl Token {
    fn take(held: &Held) -> Self {
        let now = held.0.fetch_add(1, Ordering::SeqCst) + 1;
        assert_eq!(now, 1, "one slot in the model");
        Token(held.clone())
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        let before = self.0.0.fetch_sub(1, Ordering::SeqCst);
        assert_eq!(before, 1, "a slot given back twice");
    }
}

/// The limit a slot was taken under: its route's name.
type Limit = &'static str;

const LAYER: usize = 1;

fn held(h: &Held) -> isize {
    h.0.load(Ordering::SeqCst)
}

/// A slot granted as the fence lands: whichever comes first, the slot is not kept.
fn grant_against_fence() {
    let h = Held::default();
    let request = request(LAYER, None);
    let granted = {
        let (r, h) = (request.clone(), h.clone());
        thread::spawn(move || r.0.hold("/w", Token::take(&h)))
    };
    let fence = {
        let r = request.clone();
        thread::spawn(move || r.0.fence())
    };
    granted.join().unwrap();
    fence.join().unwrap();
    assert!(request.0.is_fenced());
    assert_eq!(held(&h), 0, "the slot is not kept past the fence");
    assert_eq!(
        request.0.limit(),
        Some("/w"),
        "the limit stays for the window"
    );
    assert!(!request.0.needs_slot(), "never queued again");
}

/// The fence (a spawned task), the end (the future) and the drop of the last reference (the
/// future and the `Attempt`s going away) race: the slot comes back exactly once.
fn fence_end_and_drop() {
    let h = Held::default();
    let request = request(LAYER, None);
    request.0.hold("/w", Token::take(&h));
    let fence = {
        let r = request.clone();
        thread::spawn(move || r.0.fence())
    };
    let end = {
        let r = request.clone();
        thread::spawn(move || r.0.release())
    };
    let dropped = {
        let r = request.clone();
        thread::spawn(move || drop(r))
    };
    drop(request);
    fence.join().unwrap();
    end.join().unwrap();
    dropped.join().unwrap();
    assert_eq!(held(&h), 0);
}

/// Two clones of one layer, nested: the outer one holds the slot; the inner one (taken over
/// from it) fences, records and ends while the outer one ends.
fn nested_clones() {
    let h = Held::default();
    let outer = request(LAYER, None);
    outer.0.hold("/w", Token::take(&h));
    let inner = request(LAYER, Some(outer.clone()));
    assert!(!inner.0.needs_slot(), "the outer clone holds it");
    let fence = {
        let i = inner.clone();
        thread::spawn(move || i.0.fence())
    };
    let record = {
        let i = inner.clone();
        thread::spawn(move || {
            assert_eq!(
                i.0.limit(),
                Some("/w"),
                "the inner clone records in the same window"
            );
            i.0.release();
        })
    };
    let outer_end = {
        let o = outer.clone();
        thread::spawn(move || o.0.release())
    };
    fence.join().unwrap();
    record.join().unwrap();
    outer_end.join().unwrap();
    assert_eq!(held(&h), 0);
    assert!(inner.0.holding().is_none() && outer.0.holding().is_none());
    // A different layer nested inside does not hold through the outer one.
    let other = request(LAYER + 1, Some(outer));
    assert!(other.0.needs_slot());
}

#[test]
fn a_slot_granted_as_the_fence_lands_is_not_kept() {
    shuttle::check_random(grant_against_fence, 3_000);
    shuttle::check_pct(grant_against_fence, 3_000, 3);
}

#[test]
fn fence_end_and_drop_give_the_slot_back_once() {
    shuttle::check_random(fence_end_and_drop, 3_000);
    shuttle::check_pct(fence_end_and_drop, 3_000, 3);
}

#[test]
fn nested_clones_share_one_slot() {
    shuttle::check_random(nested_clones, 3_000);
    shuttle::check_pct(nested_clones, 3_000, 3);
}

/// The known-bad variant the model must catch: `hold` that asks whether the request is
/// fenced *before* it stores the slot (`slot.rs` asks after, outside the lock the fence
/// takes). A fence landing between the two finds no slot to give back, and the slot is kept
/// past the fence.
mod checks_first {
    use shuttle::sync::Mutex;
    use shuttle::sync::atomic::{AtomicBool, Ordering};

    #[derive(Default)]
    pub(super) struct State {
        fenced: AtomicBool,
        slot: Mutex<Option<super::Token>>,
    }

    impl State {
        pub(super) fn hold(&self, slot: super::Token) {
            if self.fenced.load(Ordering::Acquire) {
                return; // dropped: given back
            }
            *self.slot.lock().unwrap() = Some(slot);
        }

        pub(super) fn fence(&self) {
            self.fenced.store(true, Ordering::Release);
            drop(self.slot.lock().unwrap().take());
        }
    }
}

#[test]
fn the_model_finds_a_slot_kept_when_hold_asks_for_the_fence_first() {
    let found = std::panic::catch_unwind(|| {
        shuttle::check_random(
            || {
                let h = Held::default();
                let request = Arc::new(checks_first::State::default());
                let granted = {
                    let (r, h) = (request.clone(), h.clone());
                    thread::spawn(move || r.hold(Token::take(&h)))
                };
                let fence = {
                    let r = request.clone();
                    thread::spawn(move || r.fence())
                };
                granted.join().unwrap();
                fence.join().unwrap();
                assert_eq!(held(&h), 0, "the slot is not kept past the fence");
            },
            3_000,
        );
    });
    assert!(
        found.is_err(),
        "the checker finds the slot kept past the fence"
    );
}
