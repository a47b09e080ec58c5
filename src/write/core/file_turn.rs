//! The turn between processes: which process's writers may write a database file now.
//!
//! The in-process turn (`turn.rs`) is a FIFO queue of this process's writers. Between processes
//! only SQLite decided, and its busy handler polls with sleeps of up to 100 ms: a process whose
//! next writer is always ready takes the write lock back within microseconds of its `COMMIT`,
//! while another process's waiting writer sleeps, so one process kept the file for stretches
//! of up to 100 ms and the other's requests waited them out (`BENCHMARKS.md`, "Several
//! processes"). Here each process holds the file's turn, an exclusive lock of the operating
//! system on a file beside the database, while its writers write, and hands it over when
//! another process waits:
//!
//! ```text
//!  <db>-turn   exclusive: the process that holds it writes (its writers one after the
//!              other, in its own FIFO turn); kept while its writers keep coming and no other
//!              process waits, or for a slice (`SLICE`) when one does
//!  <db>-gate   exclusive, held by a process while it waits for `<db>-turn`: the holder sees
//!              that someone waits (it cannot take the gate), and a process that just gave
//!              the turn up cannot take it back before the waiter got it (to wait again it
//!              must pass the gate, which the waiter holds until it has the turn)
//! ```
//!
//! Acquiring: the gate, then the turn, then the gate let go. At once when both are free (two
//! non-blocking tries on the caller's thread); otherwise a thread of this file's (`tsr-turn:`)
//! blocks in the kernel for them, and the writer waits for it within its deadline. The kernel
//! wakes a blocked waiter when the lock is let go: no polling, no sleep.
//!
//! What it keeps:
//! - **The operating system's locks only** (`std::fs::File::lock`, `flock(2)` on Unix), no
//!   lock protocol of the crate's own in shared memory: a process that dies (SIGKILL
//!   included) lets go of everything it held, so it never blocks the others.
//! - **A writer that does not use the crate** (the `sqlite3` shell, a cron job) takes no file
//!   turn: it is waited out by SQLite's busy handler, as before, within the deadline.
//! - **Every wait is bounded** by the writer's deadline (or its pool's `acquire_timeout`); a
//!   wait that gives up leaves the kernel's queue to the file's thread, which lets go of a
//!   turn nobody wants any more.
//! - Unix only: elsewhere (Windows) there is no file turn, and SQLite's busy handler decides
//!   between processes, as before.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, mpsc};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long a process keeps the file's turn for its writers once another process waits for
/// it: long enough that a hand-over (a few tens of µs of wake-ups) costs little of it, short
/// enough that the waiting process's writers wait little (`BENCHMARKS.md`, "Several
/// processes").
pub(crate) const SLICE: Duration = Duration::from_millis(2);

/// The turn of one database file between the processes that write it (see the module docs).
pub(crate) struct FileTurn {
    shared: Arc<Shared>,
    /// The file's thread, started the first time a writer must wait for it.
    thread: Mutex<Option<mpsc::Sender<()>>>,
}

/// What the writers of this process and the file's thread share.
struct Shared {
    turn: File,
    gate: File,
    /// `<db>`, for the thread's name.
    name: String,
    state: Mutex<State>,
}

/// Where this process stands with the file's turn: one state, changed under one lock.
enum State {
    /// Not held; the file's thread is idle (it holds neither file).
    Free,
    /// The file's thread is taking the turn, for the writer that waits for it (`None`: it gave
    /// up, and the turn is let go once taken). NOTE: the writers of this process touch
    /// neither file meanwhile: a lock of this process's is one its own thread may hold
    /// (`flock(2)` locks belong to the open file, not to a thread).
    Taking(Option<oneshot::Sender<()>>),
    /// Held by this process, since then (or since it last found nobody waiting for it).
    Held(Instant),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl FileTurn {
    /// The turn of the database file at `path` (canonical), by the two files beside it
    /// (created if missing). `None` where there is none (not Unix, or the files cannot be
    /// opened: a read-only directory): SQLite's busy handler decides between processes then.
    pub(crate) fn open(path: &Path) -> Option<FileTurn> {
        if !cfg!(unix) {
            return None;
        }
        let beside = |suffix: &str| {
            let mut name = path.as_os_str().to_owned();
            name.push(suffix);
            PathBuf::from(name)
        };
        let open = |path: PathBuf| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|e| (path, e))
        };
        match (open(beside("-turn")), open(beside("-gate"))) {
            (Ok(turn), Ok(gate)) => Some(FileTurn {
                shared: Arc::new(Shared {
                    turn,
                    gate,
                    name: path
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                        .unwrap_or_default(),
                    state: Mutex::new(State::Free),
                }),
                thread: Mutex::new(None),
            }),
            (Err((path, error)), _) | (_, Err((path, error))) => {
                tracing::debug!(
                    target: "tower_sqlite_retry",
                    file = %path.display(),
                    error.message = %error,
                    "no turn between processes for this database (its lock file could not be \
                     opened): SQLite's busy handler decides between them"
                );
                None
            }
        }
    }

    /// Takes the file's turn for the writer of this process that holds the in-process turn:
    /// at once if this process holds it already, or if nobody holds or waits for it;
    /// otherwise waits for the file's thread to take it. Cancel-safe: dropped, the wait gives
    /// up, and a turn taken for it is let go.
    pub(crate) async fn take(&self) {
        let taken = {
            let mut state = lock(&self.shared.state);
            match &mut *state {
                State::Held(_) => return,
                State::Free => {
                    if self.shared.try_take() {
                        *state = State::Held(Instant::now());
                        return;
                    }
                    let (granted, taken) = oneshot::channel();
                    *state = State::Taking(Some(granted));
                    drop(state);
                    if !self.wake_thread() {
                        // No thread (it could not be started): as without a file turn.
                        *lock(&self.shared.state) = State::Free;
                        return;
                    }
                    taken
                }
                // The thread takes it already (for a writer that gave up): for this one now.
                State::Taking(wanted) => {
                    let (granted, taken) = oneshot::channel();
                    *wanted = Some(granted);
                    taken
                }
            }
        };
        let mut waiting = Waiting {
            shared: &self.shared,
            taken,
            answered: false,
        };
        // (The thread answers every writer it took the turn for while it runs; it ends only
        // with this `FileTurn`.)
        let _ = (&mut waiting.taken).await;
        waiting.answered = true;
    }

    /// The turn without waiting: `true` if this process holds it already, or took it now
    /// (nobody held or waited for it).
    pub(crate) fn take_now(&self) -> bool {
        let mut state = lock(&self.shared.state);
        match *state {
            State::Held(_) => true,
            State::Taking(_) => false,
            State::Free => {
                let took = self.shared.try_take();
                if took {
                    *state = State::Held(Instant::now());
                }
                took
            }
        }
    }

    /// Starts the file's thread if it is not running, and tells it to take the turn; `false`
    /// if it cannot be started.
    fn wake_thread(&self) -> bool {
        let mut thread = lock(&self.thread);
        if let Some(wake) = thread.as_ref()
            && wake.send(()).is_ok()
        {
            return true;
        }
        let (wake, woken) = mpsc::channel::<()>();
        let shared = Arc::clone(&self.shared);
        let spawned = std::thread::Builder::new()
            .name(format!("tsr-turn:{}", shared.name))
            .spawn(move || shared.serve(&woken));
        if spawned.is_err() || wake.send(()).is_err() {
            return false;
        }
        *thread = Some(wake);
        true
    }

    /// Whether this process holds the file's turn now.
    #[cfg(test)]
    pub(crate) fn holds(&self) -> bool {
        matches!(*lock(&self.shared.state), State::Held(_))
    }

    /// Whether another process waits for the turn, which this one holds.
    #[cfg(test)]
    pub(crate) fn others_wait(&self) -> bool {
        self.shared.others_wait()
    }

    /// The in-process turn is being given back: keeps the file's turn for the next writer of
    /// this process (`more` waiting here) unless another process waits for it and this one
    /// has had its slice; lets it go otherwise.
    pub(crate) fn turn_given_back(&self, more: bool) {
        self.shared.given_back(more);
    }
}

impl Shared {
    /// The turn at once, if nobody holds or waits for it: the gate, the turn, the gate let go,
    /// each without waiting. Called in `Free` only (the thread holds neither file).
    fn try_take(&self) -> bool {
        match self.gate.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return false,
            // (A file that cannot be locked at all: as without a file turn.)
            Err(TryLockError::Error(_)) => return true,
        }
        let took = !matches!(self.turn.try_lock(), Err(TryLockError::WouldBlock));
        let _ = self.gate.unlock();
        took
    }

    /// See [`FileTurn::turn_given_back`].
    fn given_back(&self, more: bool) {
        let mut state = lock(&self.state);
        let State::Held(since) = *state else {
            return;
        };
        if more {
            if since.elapsed() < SLICE {
                return;
            }
            if !self.others_wait() {
                // Nobody waits: a new slice, asked again at its end.
                *state = State::Held(Instant::now());
                return;
            }
        }
        *state = State::Free;
        let _ = self.turn.unlock();
    }

    /// Whether another process waits for the file's turn (it holds the gate while it does).
    /// Called in `Held` only.
    fn others_wait(&self) -> bool {
        match self.gate.try_lock() {
            Ok(()) => {
                let _ = self.gate.unlock();
                false
            }
            Err(TryLockError::WouldBlock) => true,
            Err(TryLockError::Error(_)) => false,
        }
    }

    /// The file's thread: each time it is woken (in `Taking`), the gate, then the turn,
    /// blocking in the kernel; the gate let go; then the turn handed to the writer that waits,
    /// or let go if it gave up.
    fn serve(&self, woken: &mpsc::Receiver<()>) {
        while woken.recv().is_ok() {
            let took = self.gate.lock().is_ok() && {
                let took = self.turn.lock().is_ok();
                let _ = self.gate.unlock();
                took
            };
            let mut state = lock(&self.state);
            let State::Taking(wanted) = &mut *state else {
                continue;
            };
            match wanted.take().map(|granted| granted.send(())) {
                // Handed over (a lock that failed outright: the writer goes on as without a
                // file turn, and nothing is held).
                Some(Ok(())) => {
                    *state = if took {
                        State::Held(Instant::now())
                    } else {
                        State::Free
                    };
                }
                // Nobody wants it any more.
                Some(Err(())) | None => {
                    *state = State::Free;
                    if took {
                        let _ = self.turn.unlock();
                    }
                }
            }
        }
    }
}

impl std::fmt::Debug for FileTurn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileTurn")
            .field("file", &self.shared.name)
            .field("held", &matches!(*lock(&self.shared.state), State::Held(_)))
            .finish()
    }
}

/// A writer's wait for the file's thread: gives up when dropped before it was answered.
struct Waiting<'a> {
    shared: &'a Shared,
    taken: oneshot::Receiver<()>,
    answered: bool,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            return;
        }
        let mut state = lock(&self.shared.state);
        match &mut *state {
            // Still taking it: for nobody now (the thread lets it go once taken).
            State::Taking(wanted) => *wanted = None,
            // NOTE: taken and handed to this writer, who is gone before it heard (the answer
            // was sent under this lock): the in-process turn goes on without it, so it is let
            // go here, for the next writer of this process to take again.
            State::Held(_) if self.taken.try_recv().is_ok() => {
                *state = State::Free;
                let _ = self.shared.turn.unlock();
            }
            _ => {}
        }
    }
}
