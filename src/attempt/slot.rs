//! A request's fence and writer-admission slot: the part of its state that several threads
//! touch at once (the handler's tasks fence, the response future ends or is dropped, an inner
//! layer's future records and releases). It uses only the types of `super::sync`, so that
//! `tests/request_state_model.rs` includes this file as is over `shuttle`'s, and model-checks
//! it under thousands of schedules.
//!
//! Generic over what holds it (`P`, the request's whole state, whose outer layers' states the
//! fence reaches), the slot `P::Admitted` (dropping it gives the slot back) and the limit
//! `P::Limit` it was taken under, so that the model can count slots without the admission
//! queue. The outer chain is the request states themselves: no allocation of its own.

use super::sync::{Arc, AtomicBool, Mutex, MutexGuard, Ordering};

/// Where a request's writer-admission slot is: the one home of that fact.
pub(crate) enum Slot<A, L> {
    /// None: the route had no limit when the request queued, or admission is off.
    None,
    /// A slot of `limit`, until given back (the fence, the end, the drop): `admitted` is then
    /// `None`, and `limit` stays, so that an attempt that ends after the fence is still
    /// counted in the route's window.
    Held { limit: L, admitted: Option<A> },
    /// An outer clone of this very layer holds the request's slot (in `outer`): this one
    /// neither waits for another nor gives it back, but its attempts count in its window.
    Outer,
}

/// A request's whole state, which holds its [`SlotState`].
pub(crate) trait HoldsSlot: Sized {
    /// A slot: dropping it gives it back.
    type Admitted;
    /// The limit a slot is taken under.
    type Limit: Clone;

    fn slot_state(&self) -> &SlotState<Self>;
}

/// The fence and the slot of one request, and the state of the outer layer it was taken
/// over from.
pub(crate) struct SlotState<P: HoldsSlot> {
    /// The layer that made this state (the address of its shared state).
    layer: usize,
    fenced: AtomicBool,
    slot: Mutex<Slot<P::Admitted, P::Limit>>,
    outer: Option<Arc<P>>,
}

impl<P: HoldsSlot> SlotState<P> {
    /// The state of a request of the layer `layer`, taken over from `outer` if any: when
    /// `outer` is a clone of the same layer that holds (or held) a slot for this request,
    /// this one holds it through `outer`.
    pub(crate) fn new(layer: usize, outer: Option<Arc<P>>) -> Self {
        let slot = match outer.as_deref().map(HoldsSlot::slot_state) {
            Some(o) if o.layer == layer && !matches!(*o.lock(), Slot::None) => Slot::Outer,
            _ => Slot::None,
        };
        Self {
            layer,
            fenced: AtomicBool::new(false),
            slot: Mutex::new(slot),
            outer,
        }
    }

    /// The state of the outer layer this request was taken over from.
    pub(crate) fn outer(&self) -> Option<&Arc<P>> {
        self.outer.as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, Slot<P::Admitted, P::Limit>> {
        self.slot.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Declares a replay unsafe from here on and gives back the request's slot and those of
    /// the outer layers it was taken over from: its transaction is over.
    pub(crate) fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
        let mut state = Some(self);
        while let Some(s) = state {
            s.release();
            state = s.outer.as_deref().map(HoldsSlot::slot_state);
        }
    }

    /// Whether the request has yet to queue for a slot (it holds none, and no outer clone of
    /// its layer holds one for it).
    pub(crate) fn needs_slot(&self) -> bool {
        matches!(*self.lock(), Slot::None)
    }

    /// Keeps the request's slot until the fence or the end of the request. A request already
    /// fenced gives it back at once (the fence may have come while it waited).
    pub(crate) fn hold(&self, limit: P::Limit, admitted: P::Admitted) {
        let previous = std::mem::replace(
            &mut *self.lock(),
            Slot::Held {
                limit,
                admitted: Some(admitted),
            },
        );
        // Dropped outside the lock.
        drop(previous);
        // The fence stores before it locks; this loads after it unlocked: one of the two sees
        // the other, so a slot taken as the fence lands is never kept.
        if self.is_fenced() {
            self.release();
        }
    }

    /// Gives the slot back, if the request still holds it. Idempotent.
    pub(crate) fn release(&self) {
        let admitted = match &mut *self.lock() {
            Slot::Held { admitted, .. } => admitted.take(),
            Slot::None | Slot::Outer => None,
        };
        // Dropped outside the lock: that wakes the next request in the queue.
        drop(admitted);
    }

    /// The limit whose slot this request holds or held (its own, or an outer clone's).
    pub(crate) fn limit(&self) -> Option<P::Limit> {
        match &*self.lock() {
            Slot::Held { limit, .. } => Some(limit.clone()),
            Slot::None => None,
            Slot::Outer => self.outer.as_ref().and_then(|o| o.slot_state().limit()),
        }
    }

    /// The limit whose slot this request holds now (its own, or an outer clone's), if it
    /// still holds it.
    pub(crate) fn holding(&self) -> Option<P::Limit> {
        match &*self.lock() {
            Slot::Held {
                limit,
                admitted: Some(_),
            } => Some(limit.clone()),
            Slot::Held { admitted: None, .. } | Slot::None => None,
            Slot::Outer => self.outer.as_ref().and_then(|o| o.slot_state().holding()),
        }
    }
}
