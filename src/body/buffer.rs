//! The copy of a body and its account: the bytes one layer holds against its in-flight cap
//! (`InFlight`, `BufferPermit`), a growing copy within the caps (`Held`), and a body read whole
//! before the first attempt (`Collector`, `Buffered`), or, past a cap, passed through to one
//! attempt (`Prefixed`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

use super::{Caps, FrameResult, NotReplayable, ReadError, plus, to_bytes};

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
    fn new(in_flight: Arc<InFlight>) -> Self {
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

/// A growing copy of a body's bytes whose memory is counted against the caps.
///
/// Every frame is copied, the first one too: a frame from hyper (or h2) is a slice of the
/// connection's read buffer, and keeping it would keep that whole buffer alive (up to hundreds
/// of KiB behind a body of a few bytes) while the cap counted only the slice. The copy goes
/// into one buffer that grows geometrically, never beyond the body cap nor beyond the declared
/// length, and whose *capacity* is what the in-flight cap counts.
pub(crate) struct Held {
    buf: BytesMut,
    /// Bytes in `buf`.
    pub(super) len: usize,
    /// Bytes pushed since the start, taken ones included (what the body cap limits).
    total: usize,
    /// `Content-Length`, when the client declared one (never above the body cap here).
    declared: Option<usize>,
    permit: BufferPermit,
    caps: Caps,
}

impl Held {
    pub(crate) fn new(in_flight: Arc<InFlight>, caps: Caps, declared: Option<usize>) -> Self {
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
    pub(super) fn push(&mut self, data: &[u8]) -> Result<(), NotReplayable> {
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
    pub(super) fn take(&mut self) -> Bytes {
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
    pub(super) fn discard(&mut self) {
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

    /// What one attempt reads: a reference count on the same bytes, never a copy (`None`:
    /// nothing at all, an empty body).
    pub(super) fn read(&self) -> Option<BufferedRead> {
        if self.data.is_empty() && self.trailers.is_none() {
            return None;
        }
        Some(BufferedRead {
            data: Some(self.data.clone()).filter(|d| !d.is_empty()),
            trailers: self.trailers.clone(),
        })
    }
}

/// One attempt's read of a [`Buffered`] body.
pub(super) struct BufferedRead {
    data: Option<Bytes>,
    trailers: Option<Box<HeaderMap>>,
}

impl BufferedRead {
    pub(super) fn poll_frame<E>(&mut self) -> Poll<Option<FrameResult<E>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(*t))))
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// What reading a body whole came to.
pub(crate) enum Collected<B: Body> {
    /// Every attempt can have it.
    Replayable(Buffered),
    /// One attempt only: what was read, then the rest (or the error that stopped the reading).
    PassThrough(Prefixed<B>, NotReplayable),
}

/// Reads a body whole, frame by frame, within the caps.
pub(crate) struct Collector<B: Body> {
    body: Option<Pin<Box<B>>>,
    held: Held,
    trailers: Option<Box<HeaderMap>>,
}

impl<B: Body> Collector<B> {
    /// Reads `body` into `held`.
    pub(crate) fn new(body: B, held: Held) -> Self {
        Self {
            body: Some(Box::pin(body)),
            held,
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
        let body = Prefixed {
            permit: prefix.is_some().then_some(permit),
            prefix,
            pending: pending.filter(|b| !b.is_empty()),
            error,
            trailers: self.trailers.take(),
            rest,
        };
        Collected::PassThrough(body, why)
    }
}

/// A body passed through to its one attempt after buffering stopped: what was read, the frame
/// that crossed a cap, the client's error (if that stopped it), then the rest of the stream.
pub(crate) struct Prefixed<B: Body> {
    /// Counts `prefix` until it is read.
    permit: Option<BufferPermit>,
    prefix: Option<Bytes>,
    pending: Option<Bytes>,
    error: Option<B::Error>,
    trailers: Option<Box<HeaderMap>>,
    rest: Option<Pin<Box<B>>>,
}

impl<B: Body> Prefixed<B> {
    pub(super) fn poll_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<FrameResult<B::Error>>> {
        if let Some(data) = self.prefix.take() {
            // Handed over: the attempt holds it now, as it holds any frame it reads.
            self.permit = None;
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(data) = self.pending.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(e) = self.error.take() {
            return Poll::Ready(Some(Err(ReadError::Client(e))));
        }
        if let Some(body) = self.rest.as_mut() {
            match ready!(body.as_mut().poll_frame(cx)) {
                Some(frame) => {
                    return Poll::Ready(Some(frame.map(to_bytes).map_err(ReadError::Client)));
                }
                None => self.rest = None,
            }
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(*t))))
    }

    pub(super) fn is_end_stream(&self) -> bool {
        self.prefix.is_none()
            && self.pending.is_none()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }

    pub(super) fn size_hint(&self) -> SizeHint {
        let known = self.prefix.as_ref().map_or(0, Bytes::len)
            + self.pending.as_ref().map_or(0, Bytes::len);
        let hint = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), |r| r.size_hint());
        plus(hint, known as u64)
    }
}
