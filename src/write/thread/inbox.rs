//! The writer thread's inbox: the closures sent to it and not taken yet, in the order they
//! came; bounded, and each one withdrawn by its caller.
//!
//! ```text
//!   caller                              inbox (FIFO, ≤ MAX_QUEUED)            writer thread
//!   push: room (waits within its  ───►  [ #7 ][ #8 ][ #9 ] ─── take ───────►  runs #7
//!         deadline), then in line         ▲
//!   leaves (dropped, or its deadline) ───┘ withdraw #8: out of line, its closure dropped
//!                                          here and now (what it captured freed); `false`
//!                                          if the writer thread took it already
//! ```
//!
//! Why not a channel: a closure whose caller left must be freed at once, with what it captured,
//! not when the writer thread reaches it (the writer thread may be waiting for another
//! process's lock for seconds); and the callers that wait must be bounded, each waiting for
//! room only as long as its own deadline allows. Each fact is kept once, under one lock: a
//! closure is in the inbox (its caller may withdraw it) or it was taken (it runs, or ran).
//! Room is a tokio semaphore (first come, first served, its waiters bounded by their own
//! timers): one permit per closure in the inbox, given back when it leaves.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::hand_off::Next;
// (The model check, `tests/write_thread_model.rs`, swaps in shuttle's.)
use super::sync::{AtomicUsize, Condvar, Mutex, MutexGuard, Ordering};

/// The most closures the inbox holds: past it, a caller waits for room (within its deadline).
/// The same bound as that on commits waiting for one fsync (`MAX_UNANSWERED`): a writer thread
/// holds at most that many closures waiting to begin and that many waiting for their fsync.
pub(crate) const MAX_QUEUED: usize = 512;

/// Why a closure could not be put in the inbox.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Refused {
    /// No room before the caller's deadline.
    Full,
    /// The writer thread is gone.
    Closed,
}

/// A closure's place in the inbox, for [`Inbox::withdraw`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Ticket(u64);

pub(super) struct Inbox<J> {
    state: Mutex<State<J>>,
    /// The writer thread sleeps on it while the inbox is empty.
    ready: Condvar,
    /// Room: a permit per closure in the inbox.
    room: Arc<Semaphore>,
    /// Closures in the inbox, read without the lock (a hint: the writer thread's spin, and
    /// whether a closure came with nothing ahead of it).
    len: AtomicUsize,
}

struct State<J> {
    jobs: VecDeque<Entry<J>>,
    /// The next ticket's number: tickets rise in the inbox's order.
    next: u64,
    /// No closure comes any more: every sender is gone, or the writer thread is.
    closed: bool,
    /// The writer thread waits on `ready`: a push wakes it.
    sleeping: bool,
}

struct Entry<J> {
    ticket: Ticket,
    job: J,
    /// Given back as the closure leaves the inbox, taken or withdrawn.
    _room: OwnedSemaphorePermit,
}

impl<J> Inbox<J> {
    pub(super) fn new() -> Self {
        Self::with_room(MAX_QUEUED)
    }

    /// An inbox of `room` closures (the tests' seam).
    pub(super) fn with_room(room: usize) -> Self {
        Self {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                next: 0,
                closed: false,
                sleeping: false,
            }),
            ready: Condvar::new(),
            room: Arc::new(Semaphore::new(room)),
            len: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<J>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Room for how many more closures now.
    #[cfg_attr(not(test), allow(dead_code, reason = "the tests ask it"))]
    pub(super) fn room(&self) -> usize {
        self.room.available_permits()
    }

    /// Closures in the inbox now (a hint).
    pub(super) fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// Puts `job` in line, once there is room: at once, or as soon as a closure leaves, until
    /// `deadline` (`None`: as long as it takes). Cancel-safe: dropped while it waits for room,
    /// nothing was put in line.
    pub(super) async fn push(
        &self,
        job: J,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Ticket, Refused> {
        let room = match Arc::clone(&self.room).try_acquire_owned() {
            Ok(permit) => permit,
            Err(tokio::sync::TryAcquireError::Closed) => return Err(Refused::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {
                let acquire = Arc::clone(&self.room).acquire_owned();
                let acquired = match deadline {
                    Some(deadline) => tokio::time::timeout_at(deadline, acquire)
                        .await
                        .map_err(|_| Refused::Full)?,
                    None => acquire.await,
                };
                acquired.map_err(|_| Refused::Closed)?
            }
        };
        let mut state = self.lock();
        if state.closed {
            return Err(Refused::Closed);
        }
        let ticket = Ticket(state.next);
        state.next += 1;
        state.jobs.push_back(Entry {
            ticket,
            job,
            _room: room,
        });
        self.len.fetch_add(1, Ordering::Relaxed);
        let wake = state.sleeping;
        drop(state);
        if wake {
            self.ready.notify_one();
        }
        Ok(ticket)
    }

    /// Takes the closure `ticket` out of line, if the writer thread has not taken it yet:
    /// `true`, and it is dropped here (what it captured freed), its room given back; `false`:
    /// the writer thread took it (it runs, or ran).
    pub(super) fn withdraw(&self, ticket: Ticket) -> bool {
        let mut state = self.lock();
        let Ok(at) = state.jobs.binary_search_by_key(&ticket.0, |e| e.ticket.0) else {
            return false;
        };
        let entry = state.jobs.remove(at);
        self.len.fetch_sub(1, Ordering::Relaxed);
        drop(state);
        // NOTE: dropped outside the lock: what the closure captured may take its time to free.
        drop(entry);
        true
    }

    fn pop(state: &mut State<J>, len: &AtomicUsize) -> Option<J> {
        let entry = state.jobs.pop_front()?;
        len.fetch_sub(1, Ordering::Relaxed);
        Some(entry.job)
    }

    /// The writer thread's next closure, in order; `None` once the inbox is closed and empty.
    /// `ran`: how long the last closure took on the writer thread (see [`Next`]: while
    /// closures come back to back it spins a little before it sleeps).
    pub(super) fn take(&self, next: &mut Next, ran: Duration) -> Option<J> {
        let idle = Instant::now();
        if let Some(spin) = next.spin_for(ran) {
            while idle.elapsed() < spin {
                if self.len() > 0
                    && let Some(job) = Self::pop(&mut self.lock(), &self.len)
                {
                    next.came(idle);
                    return Some(job);
                }
                std::hint::spin_loop();
            }
        }
        let mut state = self.lock();
        loop {
            if let Some(job) = Self::pop(&mut state, &self.len) {
                drop(state);
                next.came(idle);
                return Some(job);
            }
            if state.closed {
                return None;
            }
            state.sleeping = true;
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
            state.sleeping = false;
        }
    }

    /// No closure comes any more (every sender is gone): the writer thread takes what is in
    /// line, then ends.
    pub(super) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        let wake = state.sleeping;
        drop(state);
        self.room.close();
        if wake {
            self.ready.notify_one();
        }
    }

    /// The writer thread is gone: nothing in line will run. Every closure is dropped (its
    /// caller told so: its answer's sender goes with it), and no other comes in.
    pub(super) fn abandon(&self) {
        let jobs = {
            let mut state = self.lock();
            state.closed = true;
            self.len.store(0, Ordering::Relaxed);
            std::mem::take(&mut state.jobs)
        };
        self.room.close();
        drop(jobs);
    }
}
