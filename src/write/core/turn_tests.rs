//! The turn's unit tests (a file of their own, so that the model check includes `turn.rs`
//! without them).

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

use super::turn::*;
use crate::attempt::RequestState;
use crate::route::Route;

/// A request's state, as the layer makes it for a `POST`.
fn request(layer: usize) -> RequestState {
    let (head, ()) = http::Request::post("/").body(()).unwrap().into_parts();
    RequestState::new(layer, 0, None, Route::of(&head))
}

#[test]
fn two_spellings_of_one_file_share_a_queue() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a.db");
    std::fs::write(&file, b"").unwrap();
    let other = dir.path().join(".").join("sub").join("..").join("a.db");
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let a = Queue::of_file(&file);
    let b = Queue::of_file(&other);
    assert!(Arc::ptr_eq(&a, &b));
    let c = Queue::of_file(&dir.path().join("b.db"));
    assert!(!Arc::ptr_eq(&a, &c));
}

#[test]
fn a_file_not_created_yet_keeps_its_queue_once_created() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("later.db");
    let before = Queue::of_file(&file);
    std::fs::write(&file, b"").unwrap();
    let after = Queue::of_file(&file);
    assert!(Arc::ptr_eq(&before, &after));
}

#[test]
fn private_databases_share_a_queue_only_through_their_anchor() {
    let anchor: Arc<dyn Any + Send + Sync> = Arc::new(1u8);
    let a = Queue::of_private(anchor.clone());
    let b = Queue::of_private(anchor);
    assert!(Arc::ptr_eq(&a, &b));
    let c = Queue::of_private(Arc::new(1u8));
    assert!(!Arc::ptr_eq(&a, &c));
    assert_eq!(a.path(), None);
}

#[tokio::test]
async fn a_request_named_by_a_turn_is_never_confused_with_another() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::of_file(&dir.path().join("id.db"));
    let first = Arc::new(request(1));
    let mut turn = queue
        .take(Some(first.clone()), None, || None)
        .await
        .unwrap();
    assert!(queue.is_held_by(Some(&first)));
    // The request lets go (its transaction is being rolled back) and ends; the turn still
    // runs. A request allocated now is not its holder, whatever its address.
    turn.release_request();
    drop(first);
    let later = Arc::new(request(1));
    assert!(!queue.is_held_by(Some(&later)));
    assert!(!later.turns().any());
    drop(turn);
    let turn = queue
        .take(Some(later.clone()), None, || None)
        .await
        .unwrap();
    assert!(later.turns().any());
    drop(turn);
    assert!(!later.turns().any());
}

/// A turn's `Drop` after its request let go un-names nothing more: the request, queued again
/// and holding the turn anew, stays its holder.
#[tokio::test]
async fn a_turn_let_go_of_does_not_un_name_its_request_twice() {
    let dir = tempfile::tempdir().unwrap();
    let a = Queue::of_file(&dir.path().join("a.db"));
    let b = Queue::of_file(&dir.path().join("b.db"));
    let request = Arc::new(request(1));
    let mut first = a.take(Some(request.clone()), None, || None).await.unwrap();
    let second = b.take(Some(request.clone()), None, || None).await.unwrap();
    assert!(a.is_held_by(Some(&request)) && b.is_held_by(Some(&request)));
    first.release_request();
    assert!(!a.is_held_by(Some(&request)));
    assert!(
        b.is_held_by(Some(&request)),
        "the other database's turn is still held"
    );
    drop(first);
    assert!(b.is_held_by(Some(&request)));
    drop(second);
    assert!(!request.turns().any());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_turn_is_held_by_one_at_a_time_and_never_lost() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::of_file(&dir.path().join("stress.db"));
    let inside = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..32usize {
        let queue = queue.clone();
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..200 {
                let request = Arc::new(request(i));
                // Every third waiter gives up at once (its bound has passed): it must leave
                // the line without taking or losing the turn.
                let bound = (i % 3 == 0).then(Instant::now);
                let Some(turn) = queue.take(Some(request.clone()), None, move || bound).await
                else {
                    continue;
                };
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                assert!(queue.is_held_by(Some(&request)));
                tokio::task::yield_now().await;
                assert_eq!(inside.fetch_sub(1, Ordering::SeqCst), 1);
                drop(turn);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert!(queue.is_free());
}

/// The checkpointer takes the turn in line, as a writer does, but is no writer: while it waits
/// nobody counts it waiting (no writer changes level for it, the read limit does not engage),
/// and its turn is not a transaction.
#[tokio::test]
async fn the_checkpointers_turn_is_not_a_writers() {
    let dir = tempfile::tempdir().unwrap();
    let queue = Queue::of_file(&dir.path().join("checkpoint.db"));
    let writer = queue.take(None, None, || None).await.expect("free");
    let checkpointer = tokio::spawn({
        let queue = Arc::clone(&queue);
        async move { queue.take_for_checkpoint().await }
    });
    tokio::task::yield_now().await;
    assert!(
        !checkpointer.is_finished(),
        "it waits in line behind the writer"
    );
    assert_eq!(queue.stats().waiting, 0, "not counted waiting");
    assert!(!queue.counts().has_waiting());
    drop(writer);
    let turn = checkpointer.await.unwrap();
    assert!(!queue.is_free(), "it holds the turn");
    drop(turn);
    assert!(queue.is_free());
    assert_eq!(queue.stats().transactions, 1, "the writer's alone");
}

/// A file's refusal is the file's: every queue on it, now or later, sees it, and no other file.
#[test]
fn a_refusal_belongs_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("refused.db");
    let first = Queue::of_file(&file);
    assert!(first.refused().is_none());
    first.refuse(&Arc::from("the disk refused"));
    first.refuse(&Arc::from("a second reason is not kept"));
    drop(first);
    let later = Queue::of_file(&file);
    assert_eq!(later.refused().as_deref(), Some("the disk refused"));
    assert!(
        Queue::of_file(&dir.path().join("other.db"))
            .refused()
            .is_none()
    );
}
