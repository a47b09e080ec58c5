//! [`ReplayBody`]: the body an attempt reads, whichever way its request's body is kept.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tower::BoxError;

use super::buffer::{Buffered, BufferedRead, Prefixed};
use super::record::{RecordedRead, Recording, Superseded};
use super::{FrameResult, ReadError, to_bytes};

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
    /// it is read (`Expect: 100-continue`); see the [module docs](super).
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
        Buffered { read: BufferedRead },
        Direct {
            #[pin]
            body: B,
        },
        Prefixed { read: Prefixed<B> },
        Recording { read: RecordedRead<B> },
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

    /// One attempt's copy of a body read whole.
    pub(crate) fn buffered(buffered: &Buffered) -> Self {
        match buffered.read() {
            Some(read) => Self::from_kind(Kind::Buffered { read }),
            None => Self::empty(),
        }
    }

    /// The one attempt's body once buffering stopped: what was read, then the rest.
    pub(crate) fn prefixed(read: Prefixed<B>) -> Self {
        Self::from_kind(Kind::Prefixed { read })
    }

    /// The next attempt's body of a recorded request (`None`: no replay can start, see
    /// `Recording::body`).
    pub(crate) fn recorded(recording: &Recording<B>, last: bool) -> Option<Self> {
        let read = recording.body(last)?;
        Some(Self::from_kind(Kind::Recording { read }))
    }
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
{
    fn poll_client_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<FrameResult<B::Error>>> {
        match self.project().kind.project() {
            KindProj::Empty => Poll::Ready(None),
            KindProj::Buffered { read } => read.poll_frame(),
            KindProj::Direct { body } => body
                .poll_frame(cx)
                .map(|f| f.map(|f| f.map(to_bytes).map_err(ReadError::Client))),
            KindProj::Prefixed { read } => read.poll_frame(cx),
            KindProj::Recording { read } => read.poll_frame(cx),
        }
    }

    fn client_is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Empty => true,
            Kind::Buffered { read } => read.is_end_stream(),
            Kind::Direct { body } => body.is_end_stream(),
            Kind::Prefixed { read } => read.is_end_stream(),
            Kind::Recording { .. } => false,
        }
    }

    fn client_size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Empty => SizeHint::with_exact(0),
            Kind::Buffered { read } => read.size_hint(),
            Kind::Direct { body } => body.size_hint(),
            Kind::Prefixed { read } => read.size_hint(),
            Kind::Recording { read } => read.size_hint(),
        }
    }
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
