//! The inbox's own tests (a file apart: the model check includes `inbox.rs` with shuttle's
//! primitives, which work only inside its schedules).

use std::sync::Arc;
use std::time::Duration;

use super::hand_off::Next;
use super::inbox::*;

fn inbox(room: usize) -> Inbox<u32> {
    Inbox::with_room(room)
}

#[tokio::test]
async fn in_order_and_a_withdrawn_closure_never_comes() {
    let inbox = inbox(8);
    let mut next = Next::default();
    let a = inbox.push(1, None).await.unwrap();
    let b = inbox.push(2, None).await.unwrap();
    let c = inbox.push(3, None).await.unwrap();
    assert!(a < b && b < c);
    assert!(inbox.withdraw(b), "in line: withdrawn");
    assert!(!inbox.withdraw(b), "once");
    assert_eq!(inbox.len(), 2);
    assert_eq!(inbox.take(&mut next, Duration::ZERO), Some(1));
    assert!(!inbox.withdraw(a), "taken: too late to withdraw");
    assert_eq!(inbox.take(&mut next, Duration::ZERO), Some(3));
    assert_eq!(inbox.len(), 0);
    inbox.close();
    assert_eq!(inbox.take(&mut next, Duration::ZERO), None);
    assert_eq!(inbox.push(4, None).await, Err(Refused::Closed));
}

#[tokio::test(start_paused = true)]
async fn past_the_bound_a_caller_waits_for_room_within_its_deadline() {
    let inbox = Arc::new(inbox(2));
    let mut next = Next::default();
    let first = inbox.push(1, None).await.unwrap();
    inbox.push(2, None).await.unwrap();
    // Full: a caller with a deadline is refused at it.
    let deadline = tokio::time::Instant::now() + Duration::from_millis(10);
    assert_eq!(inbox.push(3, Some(deadline)).await, Err(Refused::Full));
    // One without waits; a withdrawal makes room for it.
    let waiting = {
        let inbox = Arc::clone(&inbox);
        tokio::spawn(async move { inbox.push(3, None).await })
    };
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "no room yet");
    assert!(inbox.withdraw(first));
    waiting.await.unwrap().expect("room once one left");
    assert_eq!(inbox.take(&mut next, Duration::ZERO), Some(2));
    assert_eq!(inbox.take(&mut next, Duration::ZERO), Some(3));
    // Taking makes room too.
    assert_eq!(inbox.room(), 2);
}

#[tokio::test]
async fn a_withdrawn_closure_is_freed_at_once_and_an_abandoned_inbox_frees_all() {
    let inbox: Inbox<Arc<()>> = Inbox::with_room(8);
    let captured = Arc::new(());
    let ticket = inbox.push(Arc::clone(&captured), None).await.unwrap();
    inbox.push(Arc::clone(&captured), None).await.unwrap();
    assert_eq!(Arc::strong_count(&captured), 3);
    assert!(inbox.withdraw(ticket));
    assert_eq!(Arc::strong_count(&captured), 2, "freed as it was withdrawn");
    inbox.abandon();
    assert_eq!(Arc::strong_count(&captured), 1, "freed as the writer went");
    assert_eq!(
        inbox.push(Arc::clone(&captured), None).await,
        Err(Refused::Closed)
    );
}

#[test]
fn the_writer_sleeps_until_a_closure_comes_or_the_inbox_closes() {
    let inbox = Arc::new(inbox(8));
    let writer = {
        let inbox = Arc::clone(&inbox);
        std::thread::spawn(move || {
            let mut next = Next::default();
            let mut got = Vec::new();
            while let Some(job) = inbox.take(&mut next, Duration::ZERO) {
                got.push(job);
            }
            got
        })
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    for i in 0..100 {
        runtime.block_on(inbox.push(i, None)).unwrap();
    }
    inbox.close();
    assert_eq!(writer.join().unwrap(), (0..100).collect::<Vec<_>>());
}
