//! A model check of the writer thread's inbox with `shuttle`: the crate's own
//! `src/write/thread/inbox.rs` (and the writer's wait for its next closure, `hand_off.rs`),
//! included as they are, with shuttle's mutex, condition variable and atomics in place of
//! std's, under thousands of schedules chosen at random and by PCT.
//!
//! Each schedule: an inbox with room for two; three callers, each sending one closure and then
//! leaving at once, after a yield, or never (waiting for its answer); a writer thread taking
//! closures until the inbox closes; the last handle dropped (the inbox closed) once every
//! caller is done. Checked:
//!
//! - every closure either ran (the writer took it) or was withdrawn by its caller, never both
//!   and never neither; a caller that withdrew it was told `true` exactly when it never ran;
//! - closures ran in the order they were sent;
//! - what a closure captured is freed exactly once, whichever side dropped it;
//! - afterwards the room is whole again and the inbox empty; no task is left waiting
//!   (shuttle fails a schedule in which every task waits: a lost wake-up of the writer
//!   thread, or a caller waiting for room that never comes).
//!
//! Seen failing with each of these removed from `inbox.rs`: the push's wake-up of a sleeping
//! writer (a lost wake-up: every task waits), the withdrawal's removal from the line (a
//! closure withdrawn and run), the room's permit given back as a closure leaves (a caller waiting for
//! room for ever: every task waits).

#![allow(dead_code, unreachable_pub)]

/// The writer thread's module as `inbox.rs` sees it (`super::`): the wait for the next
/// closure, and shuttle's primitives.
#[path = "../src/write/thread"]
mod thread {
    pub mod hand_off;
    pub mod inbox;

    pub mod sync {
        pub use shuttle::sync::atomic::{AtomicUsize, Ordering};
        pub use shuttle::sync::{Condvar, Mutex, MutexGuard};
    }

    // The model, here: what `inbox.rs` shows its `super`.
    use std::sync::Arc;
    use std::time::Duration;

    use shuttle::sync::Mutex;

    use hand_off::Next;
    use inbox::Inbox;

    /// What a closure captured: counts its drops.
    struct Captured {
        id: usize,
        drops: Arc<Mutex<Vec<usize>>>,
    }

    impl Drop for Captured {
        fn drop(&mut self) {
            self.drops.lock().unwrap().push(self.id);
        }
    }

    /// A closure: its id, and what it captured.
    struct Job {
        id: usize,
        _captured: Captured,
    }

    #[derive(Clone, Copy, Debug)]
    enum Leaves {
        AtOnce,
        AfterAYield,
        Never,
    }

    fn scenario() {
        use shuttle::rand::{Rng, thread_rng};
        const CALLERS: usize = 3;
        let inbox: Arc<Inbox<Job>> = Arc::new(Inbox::with_room(2));
        let ran = Arc::new(Mutex::new(Vec::new()));
        let drops = Arc::new(Mutex::new(Vec::new()));
        let tickets = Arc::new(Mutex::new(Vec::new()));
        let writer = {
            let (inbox, ran) = (Arc::clone(&inbox), Arc::clone(&ran));
            shuttle::thread::spawn(move || {
                let mut next = Next::with_spin(Duration::ZERO);
                while let Some(job) = inbox.take(&mut next, Duration::ZERO) {
                    ran.lock().unwrap().push(job.id);
                }
            })
        };
        let plans: Vec<Leaves> = (0..CALLERS)
            .map(|_| match thread_rng().gen_range(0..3) {
                0 => Leaves::AtOnce,
                1 => Leaves::AfterAYield,
                _ => Leaves::Never,
            })
            .collect();
        let callers: Vec<_> = plans
            .iter()
            .enumerate()
            .map(|(id, &leaves)| {
                let (inbox, drops) = (Arc::clone(&inbox), Arc::clone(&drops));
                let tickets = Arc::clone(&tickets);
                shuttle::future::spawn(async move {
                    let job = Job {
                        id,
                        _captured: Captured { id, drops },
                    };
                    let ticket = inbox.push(job, None).await.expect("the inbox is open");
                    tickets.lock().unwrap().push((ticket, id));
                    match leaves {
                        Leaves::AtOnce => Some(inbox.withdraw(ticket)),
                        Leaves::AfterAYield => {
                            shuttle::future::yield_now().await;
                            Some(inbox.withdraw(ticket))
                        }
                        Leaves::Never => None,
                    }
                })
            })
            .collect();
        let withdrew: Vec<Option<bool>> = callers
            .into_iter()
            .map(|caller| shuttle::future::block_on(caller).expect("caller"))
            .collect();
        // The last handle is gone.
        inbox.close();
        writer.join().expect("writer");
        let ran = ran.lock().unwrap().clone();
        for (id, withdrew) in withdrew.iter().enumerate() {
            let did_run = ran.contains(&id);
            match withdrew {
                Some(true) => assert!(!did_run, "{plans:?}: closure {id} withdrawn and run"),
                Some(false) | None => assert!(did_run, "{plans:?}: closure {id} lost"),
            }
        }
        // In the order sent: by ticket.
        let mut sent = tickets.lock().unwrap().clone();
        sent.sort_unstable();
        let in_order: Vec<usize> = sent
            .iter()
            .map(|&(_, id)| id)
            .filter(|id| ran.contains(id))
            .collect();
        assert_eq!(ran, in_order, "{plans:?}: out of order");
        let mut dropped = drops.lock().unwrap().clone();
        dropped.sort_unstable();
        assert_eq!(
            dropped,
            (0..CALLERS).collect::<Vec<_>>(),
            "{plans:?}: freed once each"
        );
        assert_eq!(inbox.room(), 2, "{plans:?}: room lost");
        assert_eq!(inbox.len(), 0);
    }

    #[test]
    fn random_schedules_run_or_withdraw_each_closure_once() {
        shuttle::check_random(scenario, 10_000);
    }

    #[test]
    fn pct_schedules_run_or_withdraw_each_closure_once() {
        shuttle::check_pct(scenario, 10_000, 3);
    }
}
