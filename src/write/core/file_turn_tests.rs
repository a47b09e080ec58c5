//! The turn between processes, with two `FileTurn`s on one file in this process: each opens
//! the lock files itself, and the operating system's locks belong to the open file, so the two
//! stand for two processes.

use std::time::Duration;

use super::file_turn::{FileTurn, SLICE};

fn two(dir: &tempfile::TempDir) -> (FileTurn, FileTurn) {
    let path = dir.path().join("db.sqlite");
    (
        FileTurn::open(&path).expect("a file turn"),
        FileTurn::open(&path).expect("a file turn"),
    )
}

/// Polls `done` (a condition of the other "process") until it holds.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..15_000 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    panic!("{what}: not within 30 s");
}

/// A process keeps the turn for its next writers while nobody else waits, even past its
/// slice; once another waits (at the gate), it lets go past its slice, and cannot take it back
/// before the other had it: to wait again it must pass the gate, which the other holds until
/// it has the turn. A process whose writers are done lets go at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_process_gets_the_turn_after_the_holders_slice_and_it_cannot_barge_back() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two(&dir);
    assert!(a.take_now(), "nobody holds it: at once");
    assert!(a.take_now(), "held already");
    assert!(!b.take_now(), "held by the other");
    std::thread::sleep(SLICE);
    a.turn_given_back(true);
    assert!(a.holds(), "nobody waits: kept past the slice");
    let b = std::sync::Arc::new(b);
    let waiting = {
        let b = std::sync::Arc::clone(&b);
        tokio::spawn(async move { b.take().await })
    };
    until("b waits at the gate", || a.others_wait()).await;
    std::thread::sleep(SLICE);
    a.turn_given_back(true);
    assert!(!a.holds(), "b waits: let go past the slice");
    waiting.await.unwrap();
    assert!(b.holds());
    assert!(!a.take_now(), "b holds it");
    let a = std::sync::Arc::new(a);
    let a_waits = {
        let a = std::sync::Arc::clone(&a);
        tokio::spawn(async move { a.take().await })
    };
    until("a waits at the gate", || b.others_wait()).await;
    // b's writers are done: it lets go at once, whatever its slice.
    b.turn_given_back(false);
    a_waits.await.unwrap();
    assert!(a.holds());
    a.turn_given_back(false);
    assert!(b.take_now(), "free again");
    b.turn_given_back(false);
}

/// A wait that gives up (dropped) leaves no turn held by nobody: the file's thread lets go of
/// the turn it took for it, and the other "process" takes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_given_up_leaves_nothing_held() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two(&dir);
    assert!(a.take_now());
    let gave_up = tokio::time::timeout(Duration::from_millis(20), b.take()).await;
    assert!(gave_up.is_err(), "a holds it");
    a.turn_given_back(false);
    // b's thread takes the turn for nobody, then lets it go: a gets it back.
    until("the turn let go by b's thread", || {
        let took = a.take_now();
        if took {
            a.turn_given_back(false);
        }
        took
    })
    .await;
    assert!(!b.holds());
}
