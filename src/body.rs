//! Buffering the request body for replay, within the caps, and the bodies handed to attempts.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body as HttpBody, Frame, SizeHint};
use tower::BoxError;

use crate::metrics::Counters;

/// Bytes counted against the layer's in-flight cap; given back on drop (also on panic or
/// cancellation), so the gauge never leaks.
pub(crate) struct BufferPermit {
    counters: Arc<Counters>,
    bytes: usize,
}

impl Drop for BufferPermit {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.counters.release(self.bytes);
        }
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
}

impl NotReplayable {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NotReplayable::DeclaredOverCap => "content_length_over_cap",
            NotReplayable::StreamedOverCap => "body_over_cap",
            NotReplayable::InFlightCap => "in_flight_cap",
            NotReplayable::Upgrade => "upgrade_or_connect",
            NotReplayable::BodyError => "body_error",
        }
    }
}

/// A fully buffered body, replayed for every attempt.
pub(crate) struct Buffered {
    pub(crate) data: Bytes,
    pub(crate) trailers: Option<HeaderMap>,
    pub(crate) _permit: Option<BufferPermit>,
}

impl Buffered {
    pub(crate) fn empty() -> Self {
        Self {
            data: Bytes::new(),
            trailers: None,
            _permit: None,
        }
    }

    /// A fresh body for one attempt: a refcount on the same bytes, never a copy.
    pub(crate) fn body(&self) -> Body {
        if self.data.is_empty() && self.trailers.is_none() {
            return Body::empty();
        }
        Body::new(ReplayBody {
            data: Some(self.data.clone()).filter(|d| !d.is_empty()),
            trailers: self.trailers.clone(),
        })
    }
}

/// The outcome of reading the body.
pub(crate) enum Collected {
    Replayable(Buffered),
    PassThrough(Body, NotReplayable),
}

/// Reads a body into memory frame by frame, within the per-request and in-flight caps. When a
/// cap would be crossed it stops and hands back everything read so far plus the rest of the
/// stream, so the handler still receives the body whole.
pub(crate) struct Collector {
    body: Option<Body>,
    chunks: Vec<Bytes>,
    len: usize,
    trailers: Option<HeaderMap>,
    permit: BufferPermit,
    limit: usize,
    in_flight_cap: usize,
}

impl Collector {
    pub(crate) fn new(
        body: Body,
        counters: Arc<Counters>,
        limit: usize,
        in_flight_cap: usize,
    ) -> Self {
        Self {
            body: Some(body),
            chunks: Vec::new(),
            len: 0,
            trailers: None,
            permit: BufferPermit { counters, bytes: 0 },
            limit,
            in_flight_cap,
        }
    }

    pub(crate) fn poll_collect(&mut self, cx: &mut Context<'_>) -> Poll<Collected> {
        loop {
            let body = self.body.as_mut().expect("polled after completion");
            let frame = match ready!(Pin::new(body).poll_frame(cx)) {
                None => return Poll::Ready(Collected::Replayable(self.finish())),
                Some(Ok(frame)) => frame,
                Some(Err(e)) => {
                    return Poll::Ready(self.pass_through(None, Some(e), NotReplayable::BodyError));
                }
            };
            let frame = match frame.into_data() {
                Ok(data) => {
                    let n = data.len();
                    if self.len.saturating_add(n) > self.limit {
                        let frame = Frame::data(data);
                        return Poll::Ready(self.pass_through(
                            Some(frame),
                            None,
                            NotReplayable::StreamedOverCap,
                        ));
                    }
                    if !self.permit.counters.try_reserve(n, self.in_flight_cap) {
                        let frame = Frame::data(data);
                        return Poll::Ready(self.pass_through(
                            Some(frame),
                            None,
                            NotReplayable::InFlightCap,
                        ));
                    }
                    self.permit.bytes += n;
                    self.len += n;
                    if n > 0 {
                        self.chunks.push(data);
                    }
                    continue;
                }
                Err(frame) => frame,
            };
            if let Ok(trailers) = frame.into_trailers() {
                match &mut self.trailers {
                    Some(t) => t.extend(trailers),
                    None => self.trailers = Some(trailers),
                }
            }
        }
    }

    fn finish(&mut self) -> Buffered {
        self.body = None;
        let data = match self.chunks.len() {
            0 => Bytes::new(),
            1 => self.chunks.pop().expect("one chunk"),
            _ => {
                let mut buf = BytesMut::with_capacity(self.len);
                for c in self.chunks.drain(..) {
                    buf.extend_from_slice(&c);
                }
                buf.freeze()
            }
        };
        Buffered {
            data,
            trailers: self.trailers.take(),
            _permit: Some(BufferPermit {
                counters: self.permit.counters.clone(),
                bytes: std::mem::take(&mut self.permit.bytes),
            }),
        }
    }

    fn pass_through(
        &mut self,
        extra: Option<Frame<Bytes>>,
        error: Option<axum::Error>,
        why: NotReplayable,
    ) -> Collected {
        // What was read is no longer held for replay: give it back to the in-flight cap.
        self.permit.counters.release(self.permit.bytes);
        self.permit.bytes = 0;
        let mut prefix: VecDeque<Frame<Bytes>> = self.chunks.drain(..).map(Frame::data).collect();
        prefix.extend(extra);
        let rest = if error.is_some() {
            None
        } else {
            self.body.take()
        };
        let body = Body::new(PrefixedBody {
            prefix,
            trailers: self.trailers.take(),
            error: error.map(Into::into),
            rest,
        });
        Collected::PassThrough(body, why)
    }
}

/// The body of an attempt replayed from memory.
struct ReplayBody {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl HttpBody for ReplayBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if let Some(data) = self.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// A body that was partly read: the frames already read, then the rest of the stream (or the
/// error that stopped the reading).
struct PrefixedBody {
    prefix: VecDeque<Frame<Bytes>>,
    trailers: Option<HeaderMap>,
    error: Option<BoxError>,
    rest: Option<Body>,
}

impl HttpBody for PrefixedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(frame) = self.prefix.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        if let Some(e) = self.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(rest) = self.rest.as_mut() {
            match ready!(Pin::new(rest).poll_frame(cx)) {
                Some(r) => return Poll::Ready(Some(r.map_err(Into::into))),
                None => self.rest = None,
            }
        }
        Poll::Ready(self.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.is_empty()
            && self.error.is_none()
            && self.trailers.is_none()
            && self.rest.as_ref().is_none_or(|r| r.is_end_stream())
    }
}
