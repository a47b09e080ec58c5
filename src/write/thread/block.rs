//! Waiting on the writer thread, which is no task of any runtime: a future (the file's turn,
//! held elsewhere in the process) polled on this thread, parked between polls, until its
//! bound. No runtime is needed for it: a writer thread opened before (or outside) tokio's waits
//! the same way, and its bound is the deadline's, not a timer's of some runtime.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

use tokio::time::Instant;

/// Wakes the thread that parked.
struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// `future`'s output, polled on this thread until `deadline` (`None`: as long as it takes);
/// `None` when the deadline passed first (the future is dropped: a wait for a semaphore leaves
/// the line).
pub(super) fn block_until<F: Future>(future: F, deadline: Option<Instant>) -> Option<F::Output> {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
            return Some(output);
        }
        // (A wake-up between the poll and the park is kept by the thread's token: the park
        // returns at once.)
        match deadline {
            None => std::thread::park(),
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::Semaphore;

    use super::*;

    #[test]
    fn waits_outside_any_runtime_until_woken_or_its_deadline() {
        let semaphore = Arc::new(Semaphore::new(0));
        let past = Instant::now();
        assert!(
            block_until(semaphore.acquire(), Some(past)).is_none(),
            "past its deadline"
        );
        assert_eq!(semaphore.available_permits(), 0);
        let giver = {
            let semaphore = Arc::clone(&semaphore);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(5));
                semaphore.add_permits(1);
            })
        };
        let permit = block_until(semaphore.acquire(), None).expect("no bound");
        assert!(permit.is_ok());
        giver.join().unwrap();
    }
}
