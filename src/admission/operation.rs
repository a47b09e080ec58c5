//! An operation's admission limit (outside HTTP): none until the operation meets a retryable
//! error, one [`RouteLimit`] from then on, and none again after a quiet time.
//!
//! A route's limit lives as long as its layer; an operation's goes away once no try has
//! collided for the quiet time: the operation's tries then run at once again, as before its
//! first error (the tries still queued for it are let go at once), and the next retryable
//! error starts a fresh limit at one. This is also how a limit that probes ever more rarely
//! (the AIMD's probes back off to 256 clean windows apart, as a route's) recovers: by time,
//! not by thousands of clean tries. A retryable error of any kind counts as a collision (a pool time-out included):
//! without this, one time-out made the operation queue its tries for the life of the process.
//!
//! The times are given by the caller as durations since the operation was made (plain data:
//! `tests/admission_model.rs` includes this file as is, over the model checker's locks).

use std::time::Duration;

use super::queue::{MAX_LIMIT, RouteLimit};
use super::sync::atomic::{AtomicBool, Ordering};
use super::sync::{Arc, Mutex};

/// The limit, if any, and when a try last collided.
pub(crate) struct OperationLimit {
    /// Whether there is a limit: the one thing a try reads while there is none.
    on: AtomicBool,
    current: Mutex<Current>,
}

struct Current {
    limit: Option<Arc<RouteLimit>>,
    /// When a try last failed retryably (since the operation was made).
    last_collision: Duration,
}

/// What [`OperationLimit::get`] found.
pub(crate) struct Lookup {
    pub(crate) limit: Option<Arc<RouteLimit>>,
    /// The limit went away at this look (quiet long enough): report it.
    pub(crate) decayed: bool,
}

impl OperationLimit {
    pub(crate) fn new() -> Self {
        Self {
            on: AtomicBool::new(false),
            current: Mutex::new(Current {
                limit: None,
                last_collision: Duration::ZERO,
            }),
        }
    }

    fn lock(&self) -> impl std::ops::DerefMut<Target = Current> + '_ {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether there is a limit now (one relaxed load: the success path's only cost).
    pub(crate) fn is_on(&self) -> bool {
        self.on.load(Ordering::Acquire)
    }

    /// The limit tries queue for now, if any; `now` is asked only when there is one. A limit
    /// whose last collision is `quiet` or more ago goes away here, its queued tries let go.
    pub(crate) fn get(&self, now: impl FnOnce() -> Duration, quiet: Duration) -> Lookup {
        if !self.is_on() {
            return Lookup {
                limit: None,
                decayed: false,
            };
        }
        let now = now();
        let mut current = self.lock();
        let Some(limit) = &current.limit else {
            return Lookup {
                limit: None,
                decayed: false,
            };
        };
        if now.saturating_sub(current.last_collision) >= quiet {
            limit.set_limit(MAX_LIMIT);
            current.limit = None;
            self.on.store(false, Ordering::Release);
            return Lookup {
                limit: None,
                decayed: true,
            };
        }
        Lookup {
            limit: Some(Arc::clone(limit)),
            decayed: false,
        }
    }

    /// A try failed retryably at `now`: the limit (made now, at one, if there was none), and
    /// whether it was made now.
    pub(crate) fn collided(&self, now: Duration) -> (Arc<RouteLimit>, bool) {
        let mut current = self.lock();
        current.last_collision = current.last_collision.max(now);
        if let Some(limit) = &current.limit {
            return (Arc::clone(limit), false);
        }
        let limit = Arc::new(RouteLimit::new());
        current.limit = Some(Arc::clone(&limit));
        self.on.store(true, Ordering::Release);
        (limit, true)
    }

    /// The limit, the slots held and the tries queued, if there is a limit.
    pub(crate) fn snapshot(&self) -> Option<(u32, u32, u32)> {
        self.lock().limit.as_ref().map(|limit| limit.snapshot())
    }
}
