//! The turn: one in-process FIFO queue per database file, and the registry that makes every
//! pool on one file share it.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use tokio::sync::{Semaphore, TryAcquireError};
use tokio::time::Instant;

/// The queues by canonical database path. Weak: a queue lives as long as a `WritePool` (or a
/// turn) on its file does; dead entries are swept when a new queue is made.
static QUEUES: LazyLock<Mutex<HashMap<PathBuf, Weak<Queue>>>> = LazyLock::new(Default::default);

/// The write queue of one database file.
pub(crate) struct Queue {
    /// One permit: the turn. tokio's semaphore is FIFO (a released permit goes to the oldest
    /// waiter), and a waiter that gives up (dropped, or past its bound) leaves the line.
    turn: Semaphore,
    /// Who holds the turn: the address of its request's state, or 0 (no request, or free).
    holder: AtomicUsize,
    path: PathBuf,
}

impl Queue {
    /// The queue of the database file at `path` (canonicalized), shared with every other pool
    /// on that file in this process.
    pub(crate) fn of(path: &Path) -> Arc<Queue> {
        let key = canonical(path);
        let mut queues = QUEUES.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(queue) = queues.get(&key).and_then(Weak::upgrade) {
            return queue;
        }
        queues.retain(|_, q| q.strong_count() > 0);
        let queue = Arc::new(Queue {
            turn: Semaphore::new(1),
            holder: AtomicUsize::new(0),
            path: key.clone(),
        });
        queues.insert(key, Arc::downgrade(&queue));
        queue
    }

    /// The file this queue serializes writers of.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the request `holder` (non-zero) holds the turn now.
    pub(crate) fn is_held_by(&self, holder: usize) -> bool {
        holder != 0 && self.holder.load(Ordering::Acquire) == holder
    }

    /// Waits for the turn, in arrival order, until `until()` (asked only if the turn is not
    /// free at once). `None` when the bound passed first: the wait left the line.
    pub(crate) async fn take(
        self: &Arc<Self>,
        holder: usize,
        until: impl FnOnce() -> Option<Instant>,
    ) -> Option<Turn> {
        let permit = match self.turn.try_acquire() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits) => {
                let acquire = self.turn.acquire();
                let acquired = match until() {
                    Some(until) => tokio::time::timeout_at(until, acquire).await.ok()?,
                    None => acquire.await,
                };
                acquired.expect("the turn's semaphore is never closed")
            }
            Err(TryAcquireError::Closed) => unreachable!("the turn's semaphore is never closed"),
        };
        // NOTE: from here to the `Turn` there is no await: the permit cannot be lost between.
        // The `Turn` gives it back (once, in its `Drop`).
        permit.forget();
        self.holder.store(holder, Ordering::Release);
        Some(Turn {
            queue: Arc::clone(self),
        })
    }
}

impl fmt::Debug for Queue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Queue")
            .field("path", &self.path)
            .field("free", &(self.turn.available_permits() == 1))
            .finish()
    }
}

/// The turn of one write transaction: given back when dropped, to the next in line.
pub(crate) struct Turn {
    queue: Arc<Queue>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.queue.holder.store(0, Ordering::Release);
        self.queue.turn.add_permits(1);
    }
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn")
            .field("path", &self.queue.path)
            .finish()
    }
}

/// The key of a database file: its canonical path (symbolic links and `..` resolved), so that
/// two spellings of one file share a queue. A file not created yet: its directory's canonical
/// path and its name. Anything else (an in-memory database's name): the name as it is.
fn canonical(path: &Path) -> PathBuf {
    if let Ok(p) = std::fs::canonicalize(path) {
        return p;
    }
    if let (Some(parent), Some(name)) = (path.parent(), path.file_name()) {
        let parent = if parent.as_os_str().is_empty() {
            Path::new(".")
        } else {
            parent
        };
        if let Ok(dir) = std::fs::canonicalize(parent) {
            return dir.join(name);
        }
    }
    path.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_spellings_of_one_file_share_a_queue() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.db");
        std::fs::write(&file, b"").unwrap();
        let other = dir.path().join(".").join("sub").join("..").join("a.db");
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let a = Queue::of(&file);
        let b = Queue::of(&other);
        assert!(Arc::ptr_eq(&a, &b));
        let c = Queue::of(&dir.path().join("b.db"));
        assert!(!Arc::ptr_eq(&a, &c));
    }

    #[test]
    fn a_file_not_created_yet_keeps_its_queue_once_created() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("later.db");
        let before = Queue::of(&file);
        std::fs::write(&file, b"").unwrap();
        let after = Queue::of(&file);
        assert!(Arc::ptr_eq(&before, &after));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_turn_is_held_by_one_at_a_time_and_never_lost() {
        let dir = tempfile::tempdir().unwrap();
        let queue = Queue::of(&dir.path().join("stress.db"));
        let inside = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..32usize {
            let queue = queue.clone();
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..200 {
                    // Every third waiter gives up at once (its bound has passed): it must leave
                    // the line without taking or losing the turn.
                    let bound = (i % 3 == 0).then(Instant::now);
                    let Some(turn) = queue.take(i + 1, move || bound).await else {
                        continue;
                    };
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0);
                    assert!(queue.is_held_by(i + 1));
                    tokio::task::yield_now().await;
                    assert_eq!(inside.fetch_sub(1, Ordering::SeqCst), 1);
                    drop(turn);
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(queue.turn.available_permits(), 1);
        assert!(!queue.is_held_by(1));
    }
}
