//! STAND-IN (to be replaced by the `current_request` of `attempt.rs`): the state of the request
//! whose handler is being polled right now on this thread.
//!
//! The layer sets it around each poll of the inner future ([`enter`]); code below the handler
//! (the write path) reads it with [`current_request`]. A task the handler spawned does not see
//! it: it is polled elsewhere, outside the layer's poll.
//!
//! The interface the write path uses, and the replacement must keep:
//! `current_request() -> Option<Arc<RequestState>>`, `RequestState::fence(&self)`,
//! `RequestState::deadline(&self) -> Option<tokio::time::Instant>`. Here `fence` and
//! `deadline` come from the [`StandIn`] trait (the real ones are inherent methods, which win
//! over a trait's, so the call sites stay as they are).

use std::cell::RefCell;
use std::sync::Arc;

use tokio::time::Instant;

use crate::attempt::Attempt;
pub(crate) use crate::attempt::RequestState;

thread_local! {
    static CURRENT: RefCell<Option<(Arc<RequestState>, Option<Instant>)>> =
        const { RefCell::new(None) };
}

/// The state of the request whose handler is being polled on this thread, if any.
pub(crate) fn current_request() -> Option<Arc<RequestState>> {
    CURRENT.with(|c| c.borrow().as_ref().map(|(r, _)| r.clone()))
}

/// Makes `request` (with its deadline) the current request until the guard drops; the guard
/// puts back whatever was current before (an outer layer's request).
pub(crate) fn enter(request: Option<&Arc<RequestState>>, deadline: Option<Instant>) -> Entered {
    let previous = CURRENT.with(|c| c.replace(request.map(|r| (r.clone(), deadline))));
    Entered { previous }
}

/// Restores the previous current request when dropped.
pub(crate) struct Entered {
    previous: Option<(Arc<RequestState>, Option<Instant>)>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        let previous = self.previous.take();
        // The value replaced is dropped outside the borrow.
        let _mine = CURRENT.with(|c| c.replace(previous));
    }
}

/// `fence` and `deadline` of the stand-in (inherent methods of `RequestState` in the real one).
pub(crate) trait StandIn {
    /// The request committed: no replay after this point.
    fn fence(&self);
    /// The request's deadline, if it has one.
    fn deadline(&self) -> Option<Instant>;
}

impl StandIn for Arc<RequestState> {
    fn fence(&self) {
        Attempt::new(1, 1, Some(self.clone())).fence();
    }

    fn deadline(&self) -> Option<Instant> {
        CURRENT.with(|c| {
            c.borrow()
                .as_ref()
                .filter(|(r, _)| Arc::ptr_eq(r, self))
                .and_then(|(_, d)| *d)
        })
    }
}
