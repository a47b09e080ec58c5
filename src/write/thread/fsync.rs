//! Group commit's fsync thread, for a writer thread whose connection runs at `NORMAL` with
//! the fsync shared: it takes every committed closure waiting, fsyncs the WAL once, and answers
//! them all. A closure that commits alone is synced by the writer thread itself
//! ([`Fsync::committed`]); past `MAX_UNANSWERED` committed closures unanswered, the writer
//! thread begins no other ([`Fsync::room_before`]).
//!
//! It ends after the writer thread: told to close, it answers whatever waits (one last fsync),
//! and the writer thread closes its connection only once it has ([`Fsync::finish`]), so that
//! the WAL it syncs is still there (closing SQLite's last connection deletes it).

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use tokio::time::Instant;

use crate::write::core::failed::GroupCommitFailed;
use crate::write::core::turn::Queue;
use crate::write::durable::report::{MAX_UNANSWERED, report_stop, report_sync, stop_reason};
use crate::write::durable::wal::Wal;

/// What a committed closure's caller is told once its fsync ran.
pub(super) type Deliver = Box<dyn FnOnce(Result<(), GroupCommitFailed>) + Send>;

/// Group commit's fsync thread: takes every committed closure waiting, fsyncs the WAL once,
/// answers them all.
pub(super) struct Fsync {
    state: Mutex<FsyncState>,
    pub(super) wake: Condvar,
    /// The writer thread waits on it while `MAX_UNANSWERED` commits wait for an answer.
    room: Condvar,
    wal: Wal,
    path: PathBuf,
    queue: Arc<Queue>,
}

#[derive(Default)]
pub(super) struct FsyncState {
    waiting: Vec<Deliver>,
    /// Committed closures in the fsync under way, not answered yet.
    in_flight: usize,
    /// Why nothing is acknowledged any more (a sync of the WAL failed).
    stopped: Option<Arc<str>>,
    /// The writer thread is gone: answer what waits, then end.
    closing: bool,
    /// Test seam: no fsync starts while held.
    pub(super) held: bool,
}

impl Fsync {
    /// The fsync of the WAL at `path` (opened now), for `queue`'s database.
    pub(super) fn open(path: PathBuf, queue: Arc<Queue>) -> Result<Self, String> {
        let wal = Wal::open(&path).map_err(|e| {
            format!(
                "the WAL ({}) could not be opened for group commit's fsync: {e}",
                path.display()
            )
        })?;
        Ok(Self {
            state: Mutex::default(),
            wake: Condvar::new(),
            room: Condvar::new(),
            wal,
            path,
            queue,
        })
    }

    /// Starts the fsync thread.
    pub(super) fn spawn(self: &Arc<Self>) -> std::io::Result<JoinHandle<()>> {
        let fsync = Arc::clone(self);
        std::thread::Builder::new()
            .name(format!("tsr-fsync:{}", self.queue.database()))
            .spawn(move || fsync.run())
    }

    /// The writer thread is done: whatever waits is answered (after one last fsync), and the
    /// fsync thread ends; returns once it has, so that the writer connection, closed next,
    /// never deletes the WAL under a pending fsync.
    pub(super) fn finish(&self, thread: JoinHandle<()>) {
        self.close();
        if thread.join().is_err() {
            tracing::error!(
                db.namespace = %self.queue.database(),
                "group commit's fsync thread panicked"
            );
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, FsyncState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A closure's `COMMIT` returned: its place in the next fsync (which therefore starts
    /// after it). Told at once once group commit stopped.
    ///
    /// `alone`: no other closure waits for the writer thread. Then, if no fsync is under way
    /// or waiting either, there is nothing to share it with: the writer thread syncs here,
    /// as SQLite's own `COMMIT` at `FULL` would, without the hand-off to the fsync thread and
    /// back (the next closure, if one comes meanwhile, waits for this fsync, as it would for
    /// a `COMMIT` at `FULL`).
    pub(super) fn committed(&self, deliver: Deliver, alone: bool) {
        let mut state = self.lock();
        if let Some(why) = state.stopped.clone() {
            drop(state);
            deliver(Err(GroupCommitFailed::new(why.to_string())));
            return;
        }
        if alone
            && state.waiting.is_empty()
            && state.in_flight == 0
            && !state.held
            && !state.closing
        {
            state.in_flight = 1;
            drop(state);
            self.sync_for(std::iter::once(deliver));
            return;
        }
        state.waiting.push(deliver);
        drop(state);
        self.wake.notify_one();
    }

    /// Whether a closure may begin: at once while fewer than `MAX_UNANSWERED` committed
    /// closures wait for an answer (or nothing will be acknowledged any more: the closure is
    /// refused after its turn); otherwise once the fsync answered some. `false`: `deadline`
    /// passed first.
    pub(super) fn room_before(&self, deadline: Option<Instant>) -> bool {
        let mut state = self.lock();
        while state.waiting.len() + state.in_flight >= MAX_UNANSWERED
            && state.stopped.is_none()
            && !state.closing
        {
            state = match deadline {
                None => self.room.wait(state).unwrap_or_else(|e| e.into_inner()),
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        return false;
                    }
                    self.room
                        .wait_timeout(state, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
        true
    }

    /// A sync of the WAL failed: the file is refused, what waits is told why.
    pub(super) fn stop(&self, why: &str) -> Arc<str> {
        let (first, waiting, stopped) = {
            let mut state = self.lock();
            let first = state.stopped.is_none();
            if first {
                state.stopped = Some(stop_reason(why));
            }
            let stopped = state.stopped.clone().expect("set above");
            (first, std::mem::take(&mut state.waiting), stopped)
        };
        self.queue.refuse(&stopped);
        self.room.notify_all();
        for deliver in waiting {
            deliver(Err(GroupCommitFailed::new(stopped.to_string())));
        }
        if first {
            report_stop(&self.queue, &self.path, why);
        }
        stopped
    }

    fn close(&self) {
        self.lock().closing = true;
        self.wake.notify_one();
    }

    /// The thread: one fsync for whatever committed since the last one began.
    pub(super) fn run(&self) {
        loop {
            let batch = {
                let mut state = self.lock();
                while (state.waiting.is_empty() || state.held) && !state.closing {
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                if state.waiting.is_empty() {
                    return;
                }
                let batch = std::mem::take(&mut state.waiting);
                state.in_flight = batch.len();
                batch
            };
            self.sync_for(batch);
        }
    }

    /// One fsync of the WAL for `batch` (counted `in_flight`), each told its outcome; then
    /// room for the writer thread.
    fn sync_for<I>(&self, batch: I)
    where
        I: IntoIterator<Item = Deliver>,
        I::IntoIter: ExactSizeIterator,
    {
        let batch = batch.into_iter();
        let started = std::time::Instant::now();
        let synced = self.wal.sync();
        let took = started.elapsed();
        let group = report_sync(&self.queue, batch.len(), took, synced.is_ok());
        let told: Result<(), Arc<str>> = match synced {
            Err(error) if error.is_the_disks() => {
                Err(self.stop(&format!("group {group}: {error}")))
            }
            Err(error) => Err(Arc::from(format!("group {group}: {error}"))),
            // A sync of the file's WAL that failed elsewhere meanwhile fails this group too.
            Ok(()) => match self.queue.refused() {
                Some(why) => Err(why),
                None => Ok(()),
            },
        };
        for deliver in batch {
            deliver(
                told.clone()
                    .map_err(|why| GroupCommitFailed::new(why.to_string())),
            );
        }
        self.lock().in_flight = 0;
        self.room.notify_all();
    }
}
