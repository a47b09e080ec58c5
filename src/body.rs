//! The request body each attempt gets: [`ReplayBody`].
//!
//! # How a body is kept for replay
//!
//! A replay needs the request body again, and a request body can be read only once. The layer
//! keeps a copy in one of two ways, chosen per request:
//!
//! - **Buffered first** (the usual case). The body is read whole *before* the first attempt,
//!   and before the inner service's readiness is reserved: a slow or stalled upload never holds
//!   a concurrency limit or a queue slot inside the layer. Every attempt then gets the same
//!   bytes, without a copy.
//! - **Recorded as read**, for requests with `Expect: 100-continue`. Such a client waits for
//!   the server's go-ahead before it uploads, so that a handler can refuse from the headers
//!   alone (a `401`, a `413`) and the upload is never sent. Reading the body first would send
//!   the go-ahead at once; instead the first attempt reads the client's body itself, and the
//!   layer records what it reads. A replay gets the recorded bytes, then whatever the first
//!   attempt left unread. Only the newest attempt's body reads from the client: a body left
//!   from an earlier attempt (a task the handler spawned) then fails with an error frame,
//!   never a clean end of a shorter body; a replay never starts once the recording was lost
//!   (a reader went past a cap, the client's stream failed); the last allowed attempt records
//!   nothing; and when the request is over the last attempt's body goes on reading from the
//!   client (a response that streams the request body, a task that reads it after a `202`).
//!
//! A body that is not in by the request's
//! [`deadline`](crate::RetryPolicy::deadline) is passed through to one attempt (tracing field
//! `retry.not_replayable = "body_too_slow"`); a recorded one is no longer recorded from then on
//! (the attempt reading it reads on, without replays): a stalled or trickling upload never
//! holds its bytes against `max_buffered_bytes`, and so never switches retries off for other
//! requests, for longer than that. The attempts of a buffered body then have the whole
//! deadline of their own.
//!
//! Either way the copy is bounded: per request by
//! [`RetryPolicy::max_body_bytes`](crate::RetryPolicy::max_body_bytes), and for all requests
//! in flight through one layer by
//! [`RetryPolicy::max_buffered_bytes`](crate::RetryPolicy::max_buffered_bytes), counted as the
//! memory really held (the buffer's capacity, not the payload: a body sent in one-byte frames
//! is copied into one buffer, never kept as a handle per frame; and every frame is copied, so
//! that a small body never keeps a connection's much larger read buffer alive). A body that
//! would cross a cap is **passed through whole** to a single attempt (what was read, counted
//! until the attempt has read it, then the rest of the stream), never rejected; so is a body
//! whose stream fails, and the error reaches the handler as it would without the layer (a
//! `LengthLimitError` from tower-http's `RequestBodyLimitLayer` outside the layer still
//! answers `413`).

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker, ready};

use tokio::time::{Instant, Sleep};
use tower::BoxError;

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// The bytes one layer holds in request-body copies now, against its in-flight cap
/// (`RetryPolicy::max_buffered_bytes`), and the most it ever held: the buffer limit's one
/// account, read by the layer's metrics.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    bytes: AtomicUsize,
    peak: AtomicUsize,
}

impl InFlight {
    /// Reserves `n` more buffered bytes if the total stays within `cap`.
    fn try_reserve(&self, n: usize, cap: usize) -> bool {
        let mut cur = self.bytes.load(Relaxed);
        loop {
            let Some(next) = cur.checked_add(n).filter(|next| *next <= cap) else {
                return false;
            };
            match self
                .bytes
                .compare_exchange_weak(cur, next, Relaxed, Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Relaxed);
                    crate::recorder::buffered_bytes(isize::try_from(n).unwrap_or(isize::MAX));
                    return true;
                }
                Err(actual) => cur = actual,
            }
        }
    }

    fn release(&self, n: usize) {
        self.bytes.fetch_sub(n, Relaxed);
        crate::recorder::buffered_bytes(isize::try_from(n).map_or(isize::MIN, |n| -n));
    }

    /// The bytes held now.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes.load(Relaxed)
    }

    /// The most bytes ever held at once.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Relaxed)
    }
}

/// Bytes counted against a layer's in-flight cap; given back on drop (also on panic or
/// cancellation), so the gauge never leaks.
pub(crate) struct BufferPermit {
    in_flight: Arc<InFlight>,
    bytes: usize,
}

impl BufferPermit {
    pub(crate) fn new(in_flight: Arc<InFlight>) -> Self {
        Self {
            in_flight,
            bytes: 0,
        }
    }

    /// Counts `n` more bytes if the layer's total stays within `cap`.
    fn grow(&mut self, n: usize, cap: usize) -> bool {
        if n == 0 {
            return true;
        }
        if !self.in_flight.try_reserve(n, cap) {
            return false;
        }
        self.bytes += n;
        true
    }

    fn shrink(&mut self, n: usize) {
        let n = n.min(self.bytes);
        if n > 0 {
            self.in_flight.release(n);
            self.bytes -= n;
        }
    }

    fn release_all(&mut self) {
        self.shrink(self.bytes);
    }
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        self.release_all();
    }
}

/// Why a request is not replayable (tracing field `retry.not_replayable`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotReplayable {
    DeclaredOverCap,
    StreamedOverCap,
    InFlightCap,
    Upgrade,
    BodyError,
    /// The body was not in by the deadline (a stalled or trickling upload).
    BodyTooSlow,
}

impl NotReplayable {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotReplayable::DeclaredOverCap => "content_length_over_cap",
            NotReplayable::StreamedOverCap => "body_over_cap",
            NotReplayable::InFlightCap => "in_flight_cap",
            NotReplayable::Upgrade => "upgrade_or_connect",
            NotReplayable::BodyError => "body_error",
            NotReplayable::BodyTooSlow => "body_too_slow",
        }
    }
}

/// The caps a copy of one body is held within.
#[derive(Clone, Copy)]
pub(crate) struct Caps {
    /// The most payload one request may buffer (`max_body_bytes`).
    pub(crate) body: usize,
    /// The most memory all requests through the layer may hold (`max_buffered_bytes`).
    pub(crate) in_flight: usize,
}

/// A growing copy of a body's bytes whose memory is counted against the caps.
///
/// Every frame is copied, the first one too: a frame from hyper (or h2) is a slice of the
/// connection's read buffer, and keeping it would keep that whole buffer alive (up to hundreds
/// of KiB behind a body of a few bytes) while the cap counted only the slice. The copy goes
/// into one buffer that grows geometrically, never beyond the body cap nor beyond the declared
/// length, and whose *capacity* is what the in-flight cap counts.
struct Held {
    buf: BytesMut,
    /// Bytes in `buf`.
    len: usize,
    /// Bytes pushed since the start, taken ones included (what the body cap limits).
    total: usize,
    /// `Content-Length`, when the client declared one (never above the body cap here).
    declared: Option<usize>,
    permit: BufferPermit,
    caps: Caps,
}

impl Held {
    fn new(in_flight: Arc<InFlight>, caps: Caps, declared: Option<usize>) -> Self {
        Self {
            buf: BytesMut::new(),
            len: 0,
            total: 0,
            declared,
            permit: BufferPermit::new(in_flight),
            caps,
        }
    }

    /// Appends `data`; on `Err` nothing was appended, and the reason says which cap refused.
    fn push(&mut self, data: &[u8]) -> Result<(), NotReplayable> {
        let n = data.len();
        if n == 0 {
            return Ok(());
        }
        let total = self.total.saturating_add(n);
        if total > self.caps.body {
            return Err(NotReplayable::StreamedOverCap);
        }
        let needed = self.len + n;
        if needed > self.buf.capacity() {
            // Grow geometrically (amortised copies), never past what this buffer can still be
            // asked to hold (the declared length, else the body cap), and count the new
            // buffer's capacity before it is allocated.
            let taken = self.total - self.len;
            let ceiling = self
                .declared
                .map(|d| d.saturating_sub(taken))
                .filter(|d| *d >= needed)
                .unwrap_or(self.caps.body - taken);
            let cap = needed
                .max(self.buf.capacity().saturating_mul(2))
                .min(ceiling);
            // The old buffer is freed as soon as it is copied: count the difference.
            let was = self.buf.capacity();
            if !self
                .permit
                .grow(cap.saturating_sub(was), self.caps.in_flight)
            {
                return Err(NotReplayable::InFlightCap);
            }
            let mut grown = BytesMut::with_capacity(cap);
            grown.extend_from_slice(&self.buf);
            self.buf = grown;
        }
        self.buf.extend_from_slice(data);
        self.len = needed;
        self.total = total;
        Ok(())
    }

    /// What was pushed since the last `take`, as one `Bytes`. Its memory stays counted until
    /// the permit drops (or `discard`).
    fn take(&mut self) -> Bytes {
        self.len = 0;
        std::mem::take(&mut self.buf).freeze()
    }

    /// The count of everything taken or held so far, moved out (to live as long as the bytes
    /// it counts); this copy counts nothing from now on.
    fn take_permit(&mut self) -> BufferPermit {
        let in_flight = self.permit.in_flight.clone();
        std::mem::replace(&mut self.permit, BufferPermit::new(in_flight))
    }

    /// Drops the copy and gives its memory back.
    fn discard(&mut self) {
        self.buf = BytesMut::new();
        self.len = 0;
        self.permit.release_all();
    }
}

/// A body read whole before the first attempt; every attempt gets the same bytes.
pub(crate) struct Buffered {
    data: Bytes,
    trailers: Option<Box<HeaderMap>>,
    _permit: Option<BufferPermit>,
}

impl Buffered {
    pub(crate) fn empty() -> Self {
        Self {
            data: Bytes::new(),
            trailers: None,
            _permit: None,
        }
    }

    /// A fresh body for one attempt: a reference count on the same bytes, never a copy.
    pub(crate) fn body<B: Body>(&self) -> ReplayBody<B> {
        if self.data.is_empty() && self.trailers.is_none() {
            return ReplayBody::empty();
        }
        ReplayBody::from_kind(Kind::Buffered {
            data: Some(self.data.clone()).filter(|d| !d.is_empty()),
            trailers: self.trailers.clone(),
        })
    }
}

/// What reading a body whole came to.
pub(crate) enum Collected<B: Body> {
    /// Every attempt can have it.
    Replayable(Buffered),
    /// One attempt only: what was read, then the rest (or the error that stopped the reading).
    PassThrough(ReplayBody<B>, NotReplayable),
}

/// Reads a body whole, frame by frame, within the caps.
pub(crate) struct Collector<B: Body> {
    body: Option<Pin<Box<B>>>,
    held: Held,
    trailers: Option<Box<HeaderMap>>,
}

impl<B: Body> Collector<B>
where
    B::Data: Buf,
{
    pub(crate) fn new(
        body: B,
        in_flight: Arc<InFlight>,
        caps: Caps,
        declared: Option<usize>,
    ) -> Self {
        Self {
            body: Some(Box::pin(body)),
            held: Held::new(in_flight, caps, declared),
            trailers: None,
        }
    }

    pub(crate) fn poll_collect(&mut self, cx: &mut Context<'_>) -> Poll<Collected<B>> {
        loop {
            let body = self.body.as_mut().expect("polled after completion");
            let frame = match ready!(body.as_mut().poll_frame(cx)) {
                None => return Poll::Ready(Collected::Replayable(self.finish())),
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    return Poll::Ready(self.pass_through(None, Some(e), NotReplayable::BodyError));
                }
            };
            match frame.into_data() {
                Ok(mut data) => {
                    let data = data.copy_to_bytes(data.remaining());
                    if let Err(why) = self.held.push(&data) {
                        return Poll::Ready(self.pass_through(Some(data), None, why));
                    }
                }
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        match &mut self.trailers {
                            Some(t) => t.extend(trailers),
                            None => self.trailers = Some(Box::new(trailers)),
                        }
                    }
                }
            }
        }
    }

    /// Stops buffering (the body was not in by the deadline): the one attempt gets what was
    /// read, then the rest of the stream, as the client sends it.
    pub(crate) fn give_up(&mut self, why: NotReplayable) -> Collected<B> {
        self.pass_through(None, None, why)
    }

    fn finish(&mut self) -> Buffered {
        self.body = None;
        Buffered {
            data: self.held.take(),
            trailers: self.trailers.take(),
            _permit: Some(self.held.take_permit()),
        }
    }

    fn pass_through(
        &mut self,
        pending: Option<Bytes>,
        error: Option<B::Error>,
        why: NotReplayable,
    ) -> Collected<B> {
        let prefix = Some(self.held.take()).filter(|b| !b.is_empty());
        // What was read stays counted until the attempt has read it: it is still held.
        let permit = self.held.take_permit();
        let rest = if error.is_some() {
            None
        } else {
            self.body.take()
        };
        let body = ReplayBody::from_kind(Kind::Prefixed {
            permit: prefix.is_some().then_some(permit),
            prefix,
            pending: pending.filter(|b| !b.is_empty()),
            error,
            trailers: self.trailers.take(),
            rest,
        });
        Collected::PassThrough(body, why)
    }
}

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

impl<B: Body> Recording<B>
where
    B::Data: Buf,
{
    /// `until`: the request's deadline; an upload still under way then is no longer recorded
    /// (the request is not replayable, `body_too_slow`), and its bytes are given back.
    pub(crate) fn new(
        body: B,
        in_flight: Arc<InFlight>,
        caps: Caps,
        declared: Option<usize>,
        until: Option<Instant>,
    ) -> Self {
        Self {
            shared: Arc::new(Mutex::new(Recorder {
                record_until: until,
                record_timer: None,
                source: Some(Box::pin(body)),
                segments: Vec::new(),
                held: Held::new(in_flight, caps, declared),
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
    pub(crate) fn body(&self, last: bool) -> Option<ReplayBody<B>> {
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
        Some(ReplayBody::from_kind(Kind::Recording {
            replay,
            generation: rec.generation,
            trailers_sent: false,
            shared: self.shared.clone(),
        }))
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
struct Superseded;

impl fmt::Display for Superseded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the request body went to a newer attempt of this request")
    }
}

impl std::error::Error for Superseded {}

/// A frame as read from the client, before its error is boxed.
type FrameResult<E> = Result<Frame<Bytes>, ReadError<E>>;

/// Why a read failed: the client's own error, or the body went to a newer attempt.
enum ReadError<E> {
    Client(E),
    Superseded,
}

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

pin_project! {
    /// The request body an attempt gets from [`SqliteRetry`](crate::SqliteRetry).
    ///
    /// It reads as the client's body did: the same bytes, the same trailers, the same
    /// `size_hint` where the layer knows it, and the client body's own errors, boxed (they
    /// downcast to their own type). Inside an axum `Router` (the request has a `MatchedPath`),
    /// an `axum::Error` is unwrapped first: the `Router` wraps the errors of this body in an
    /// `axum::Error` again, so the handler's extractors see the error exactly as without the
    /// layer (a `LengthLimitError` still answers `413`). Elsewhere (a plain `service_fn`, the
    /// layer outside any `Router`) the error is the client body's own, `axum::Error` included.
    /// The one mismatch left: a service mounted with `Router::route_service` under the layer
    /// reads the body itself and sees the unwrapped error.
    ///
    /// Depending on the request, it is a copy of a body buffered before the first attempt, the
    /// client's body itself (requests that are not replayed), or the client's body recorded as
    /// it is read (`Expect: 100-continue`); see the [module docs](self).
    ///
    /// axum's `Router` and handlers accept it as they accept any body.
    pub struct ReplayBody<B>
    where
        B: Body,
    {
        #[pin]
        kind: Kind<B>,
        // axum's `Router` boxes this body again: take one `axum::Error` off its errors.
        unwrap_axum: bool,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B>
    where
        B: Body,
    {
        Empty,
        Buffered {
            data: Option<Bytes>,
            trailers: Option<Box<HeaderMap>>,
        },
        Direct {
            #[pin]
            body: B,
        },
        Prefixed {
            // Counts `prefix` until it is read.
            permit: Option<BufferPermit>,
            prefix: Option<Bytes>,
            pending: Option<Bytes>,
            error: Option<B::Error>,
            trailers: Option<Box<HeaderMap>>,
            rest: Option<Pin<Box<B>>>,
        },
        Recording {
            replay: VecDeque<Bytes>,
            generation: u32,
            trailers_sent: bool,
            shared: Arc<Mutex<Recorder<B>>>,
        },
    }
}

impl<B: Body> ReplayBody<B> {
    fn from_kind(kind: Kind<B>) -> Self {
        Self {
            kind,
            unwrap_axum: false,
        }
    }

    /// Marks the body as read through axum's routing (the request was routed by a `Router`,
    /// which boxes the body again): its errors lose one `axum::Error`, see [`transparent`].
    pub(crate) fn routed(mut self, routed: bool) -> Self {
        self.unwrap_axum = routed;
        self
    }

    pub(crate) fn empty() -> Self {
        Self::from_kind(Kind::Empty)
    }

    /// The client's body, untouched (a request that is not replayed).
    pub(crate) fn direct(body: B) -> Self {
        Self::from_kind(Kind::Direct { body })
    }
}

fn to_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
}

/// The client body's error as the handler would have seen it without the layer.
///
/// NOTE: axum's `Router` boxes every request body that is not its own `Body` again, wrapping its
/// errors in one more `axum::Error`, and axum's extractors look only two `axum::Error`s deep
/// for the `LengthLimitError` that answers `413` (`FailedToBufferBody::from_err`). The layer
/// is such a hop, so it takes one `axum::Error` off: what the handler gets is then exactly
/// what it would have got without the layer. Only then, though: a service that reads this
/// body itself (not re-boxed) gets the client body's error as it is.
fn transparent<E: Into<BoxError>>(error: E, unwrap_axum: bool) -> BoxError {
    let error = error.into();
    if !unwrap_axum {
        return error;
    }
    #[cfg(feature = "axum")]
    let error = match error.downcast::<axum::Error>() {
        Ok(axum_error) => axum_error.into_inner(),
        Err(error) => error,
    };
    error
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Data: Buf,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let unwrap_axum = self.unwrap_axum;
        self.poll_client_frame(cx).map(|frame| {
            frame.map(|r| {
                r.map_err(|e| match e {
                    ReadError::Client(e) => transparent(e, unwrap_axum),
                    ReadError::Superseded => Box::new(Superseded) as BoxError,
                })
            })
        })
    }

    fn is_end_stream(&self) -> bool {
        self.client_is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.client_size_hint()
    }
}

impl<B> ReplayBody<B>
where
    B: Body,
    B::Data: Buf,
{
    fn poll_client_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<FrameResult<B::Error>>> {
        match self.project().kind.project() {
            KindProj::Empty => Poll::Ready(None),
            KindProj::Buffered { data, trailers } => {
                if let Some(data) = data.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            KindProj::Direct { body } => body
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(to_bytes).map_err(ReadError::Client))),
            KindProj::Prefixed {
                permit,
                prefix,
                pending,
                error,
                trailers,
                rest,
            } => {
                if let Some(data) = prefix.take() {
                    // Handed over: the attempt holds it now, as it holds any frame it reads.
                    *permit = None;
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(data) = pending.take() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                if let Some(e) = error.take() {
                    return Poll::Ready(Some(Err(ReadError::Client(e))));
                }
                if let Some(body) = rest.as_mut() {
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(frame) => {
                            return Poll::Ready(Some(
                                frame.map(to_bytes).map_err(ReadError::Client),
                            ));
                        }
                        None => *rest = None,
                    }
                }
                Poll::Ready(trailers.take().map(|t| Ok(Frame::trailers(*t))))
            }
            KindProj::Recording {
                replay,
                generation,
                trailers_sent,
                shared,
            } => {
                if let Some(data) = replay.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                let mut rec = lock(shared);
                if rec.generation != *generation {
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
                                *trailers_sent = true;
                            }
                            return Poll::Ready(Some(Ok(frame)));
                        }
                    }
                }
                // The client's stream has ended: its trailers, unless this attempt read them
                // from the stream itself (an earlier attempt may have read them and not the end).
                if *trailers_sent {
                    return Poll::Ready(None);
                }
                *trailers_sent = true;
                Poll::Ready(rec.trailers.clone().map(|t| Ok(Frame::trailers(t))))
            }
        }
    }

    fn client_is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
            Kind::Direct { body } => body.is_end_stream(),
            Kind::Prefixed {
                prefix,
                pending,
                error,
                trailers,
                rest,
                ..
            } => {
                prefix.is_none()
                    && pending.is_none()
                    && error.is_none()
                    && trailers.is_none()
                    && rest.as_ref().is_none_or(|r| r.is_end_stream())
            }
            Kind::Recording { .. } => false,
        }
    }

    fn client_size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
            Kind::Direct { body } => body.size_hint(),
            Kind::Prefixed {
                prefix,
                pending,
                rest,
                ..
            } => {
                let known =
                    prefix.as_ref().map_or(0, Bytes::len) + pending.as_ref().map_or(0, Bytes::len);
                let hint = rest
                    .as_ref()
                    .map_or(SizeHint::with_exact(0), |r| r.size_hint());
                plus(hint, known as u64)
            }
            Kind::Recording {
                replay,
                generation,
                shared,
                ..
            } => {
                let replayed: usize = replay.iter().map(Bytes::len).sum();
                let rec = lock(shared);
                let hint = match rec.source.as_ref() {
                    Some(s) if rec.generation == *generation => s.size_hint(),
                    _ => SizeHint::with_exact(0),
                };
                plus(hint, replayed as u64)
            }
        }
    }
}

/// `hint` moved up by `n` bytes already known (the upper bound first: `set_lower` asserts that
/// the lower bound stays below it).
fn plus(hint: SizeHint, n: u64) -> SizeHint {
    let mut out = SizeHint::new();
    if let Some(upper) = hint.upper() {
        out.set_upper(upper.saturating_add(n));
    }
    out.set_lower(hint.lower().saturating_add(n));
    out
}

impl<B: Body> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Empty => "empty",
            Kind::Buffered { .. } => "buffered",
            Kind::Direct { .. } => "direct",
            Kind::Prefixed { .. } => "prefixed",
            Kind::Recording { .. } => "recording",
        };
        f.debug_struct("ReplayBody").field("kind", &kind).finish()
    }
}
