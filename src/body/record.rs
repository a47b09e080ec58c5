//! A body recorded as the attempts read it (`Expect: 100-continue`): the one recorder a
//! request's attempts share (`Recorder`), its handle in the response future (`Recording`), and
//! one attempt's read of it (`RecordedRead`).

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, SizeHint};
use tokio::time::{Instant, Sleep};

use super::buffer::Held;
use super::{FrameResult, NotReplayable, ReadError, plus, to_bytes};

/// A body recorded while the attempts read it (`Expect: 100-continue`).
///
/// The attempt whose body is the newest reads the client's stream itself; what it reads is
/// copied (within the caps) for the next attempt, which gets the copy first and then the rest
/// of the stream. An older attempt's body, read after a newer attempt took over, fails with an
/// error frame: it never reads as a clean end of a shorter body.
pub(crate) struct Recording<B: Body> {
    shared: Arc<Mutex<Recorder<B>>>,
}

struct Recorder<B: Body> {
    /// The client's body, until it ends or fails.
    source: Option<Pin<Box<B>>>,
    /// Recorded bytes, in order: frozen segments, then what `held` holds.
    segments: Vec<Bytes>,
    held: Held,
    /// The client's trailers, once read (its stream may still have to say it ended).
    trailers: Option<HeaderMap>,
    /// `None` while a replay is possible; else why not.
    lost: Option<NotReplayable>,
    /// Whether what the newest attempt reads is still copied: not on the last attempt (no
    /// replay could use it), nor once the request is over.
    recording: bool,
    /// The request is over: no attempt is to come.
    stopped: bool,
    /// The newest attempt's body; older bodies read as an error.
    generation: u32,
    /// The newest attempt's reader, when it waits for the client: woken when a newer attempt
    /// takes the body over, so that it hears its error instead of waiting forever.
    parked: Option<Waker>,
    /// When recording stops if the client has not finished its upload (the request's
    /// deadline): a stalled upload must not hold its bytes against the in-flight cap.
    record_until: Option<Instant>,
    /// Its timer, armed the first time a reader waits for the client.
    record_timer: Option<Pin<Box<Sleep>>>,
}

impl<B: Body> Recording<B> {
    /// Records `body` into `held` as the attempts read it. `until`: the request's deadline;
    /// an upload still under way then is no longer recorded (the request is not replayable,
    /// `body_too_slow`), and its bytes are given back.
    pub(crate) fn new(body: B, held: Held, until: Option<Instant>) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Recorder {
                record_until: until,
                record_timer: None,
                source: Some(Box::pin(body)),
                segments: Vec::new(),
                held,
                trailers: None,
                lost: None,
                recording: true,
                stopped: false,
                generation: 0,
                parked: None,
            })),
        }
    }

    /// Why a replay is impossible now, if it is.
    pub(crate) fn not_replayable(&self) -> Option<NotReplayable> {
        lock(&self.shared).lost
    }

    /// The body of the next attempt (`last`: no attempt comes after it): the bytes recorded so
    /// far, then the rest of the stream. Every earlier attempt's body fails from now on.
    ///
    /// `None` when the recording was lost since it was last checked (an earlier attempt's
    /// reader went past a cap, or the client's stream failed): a replay would miss bytes, so
    /// none may start. Call it right before each attempt, and check nothing in between.
    pub(super) fn body(&self, last: bool) -> Option<RecordedRead<B>> {
        let mut rec = lock(&self.shared);
        if rec.stopped || (rec.generation > 0 && rec.lost.is_some()) {
            return None;
        }
        rec.generation += 1;
        if let Some(waker) = rec.parked.take() {
            waker.wake();
        }
        if rec.held.len > 0 {
            let tail = rec.held.take();
            rec.segments.push(tail);
        }
        if last {
            // What this attempt reads could never be replayed: do not copy it.
            rec.recording = false;
        }
        let replay: VecDeque<Bytes> = rec.segments.iter().cloned().collect();
        Some(RecordedRead {
            replay,
            generation: rec.generation,
            trailers_sent: false,
            shared: self.shared.clone(),
        })
    }

    /// The request is over: no more attempts, and the copy is dropped (its memory given
    /// back). The newest attempt's body goes on reading the client's stream: a response that
    /// streams the request body, or a task that reads it after the answer, gets every byte.
    pub(crate) fn stop(&self) {
        let mut rec = lock(&self.shared);
        rec.stopped = true;
        rec.recording = false;
        rec.record_until = None;
        rec.record_timer = None;
        rec.segments = Vec::new();
        rec.held.discard();
    }
}

impl<B: Body> Recorder<B> {
    fn record(&mut self, data: &Bytes) {
        if !self.recording || self.lost.is_some() {
            return;
        }
        if let Err(why) = self.held.push(data) {
            self.give_up(why);
        }
    }

    fn give_up(&mut self, why: NotReplayable) {
        self.lost = Some(why);
        self.segments = Vec::new();
        self.held.discard();
        self.record_until = None;
        self.record_timer = None;
    }

    /// The reader waits for the client: past the deadline, stop recording (this attempt reads
    /// on; no other attempt will).
    fn stop_recording_if_too_slow(&mut self, cx: &mut Context<'_>) {
        let Some(until) = self.record_until else {
            return;
        };
        if !self.recording || self.lost.is_some() {
            self.record_until = None;
            self.record_timer = None;
            return;
        }
        let timer = self
            .record_timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(until)));
        if timer.as_mut().poll(cx).is_ready() {
            self.give_up(NotReplayable::BodyTooSlow);
        }
    }
}

/// The error an attempt's body reads once a newer attempt has the client's body: the request
/// body was handed over, so what this reader got is not the whole body.
#[derive(Debug)]
pub(super) struct Superseded;

impl fmt::Display for Superseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body went to a newer attempt of this request")
    }
}

impl std::error::Error for Superseded {}

fn lock<B: Body>(m: &Mutex<Recorder<B>>) -> MutexGuard<'_, Recorder<B>> {
    m.lock().unwrap_or_else(|poisoned| {
        // A panic while the lock was held (inside the client body's own `poll_frame`) may
        // have left a frame unrecorded: never replay from a recording that may be incomplete.
        let mut rec = poisoned.into_inner();
        if rec.lost.is_none() {
            rec.give_up(NotReplayable::BodyError);
        }
        rec
    })
}

/// One attempt's read of a recorded body: the bytes recorded before it began, then the
/// client's stream (while it is the newest attempt).
pub(super) struct RecordedRead<B: Body> {
    replay: VecDeque<Bytes>,
    generation: u32,
    trailers_sent: bool,
    shared: Arc<Mutex<Recorder<B>>>,
}

impl<B: Body> RecordedRead<B> {
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<FrameResult<B::Error>>> {
        if let Some(data) = self.replay.pop_front() {
            return Poll::Ready(Some(Ok(http_body::Frame::data(data))));
        }
        let mut rec = lock(&self.shared);
        if rec.generation != self.generation {
            // A newer attempt has the body now: what this one read is not the whole.
            return Poll::Ready(Some(Err(ReadError::Superseded)));
        }
        if let Some(source) = rec.source.as_mut() {
            match source.as_mut().poll_frame(cx) {
                Poll::Pending => {
                    rec.parked = Some(cx.waker().clone());
                    rec.stop_recording_if_too_slow(cx);
                    return Poll::Pending;
                }
                Poll::Ready(None) => rec.source = None,
                Poll::Ready(Some(Err(e))) => {
                    rec.source = None;
                    rec.give_up(NotReplayable::BodyError);
                    return Poll::Ready(Some(Err(ReadError::Client(e))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    let frame = to_bytes(frame);
                    if let Some(data) = frame.data_ref() {
                        rec.record(data);
                    } else if let Some(t) = frame.trailers_ref() {
                        match &mut rec.trailers {
                            Some(all) => all.extend(t.clone()),
                            None => rec.trailers = Some(t.clone()),
                        }
                        self.trailers_sent = true;
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
            }
        }
        // The client's stream has ended: its trailers, unless this attempt read them from the
        // stream itself (an earlier attempt may have read them and not the end).
        if self.trailers_sent {
            return Poll::Ready(None);
        }
        self.trailers_sent = true;
        Poll::Ready(
            rec.trailers
                .clone()
                .map(|t| Ok(http_body::Frame::trailers(t))),
        )
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        let replayed: usize = self.replay.iter().map(Bytes::len).sum();
        let rec = lock(&self.shared);
        let hint = match rec.source.as_ref() {
            Some(s) if rec.generation == self.generation => s.size_hint(),
            _ => SizeHint::with_exact(0),
        };
        plus(hint, replayed as u64)
    }
}
