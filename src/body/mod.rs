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

mod buffer;
mod record;
mod replay;

pub(crate) use self::buffer::{Buffered, Collected, Collector, Held, InFlight};
pub(crate) use self::record::Recording;
pub use self::replay::ReplayBody;

use bytes::{Buf, Bytes};
use http_body::{Frame, SizeHint};

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

/// A frame as read from the client, before its error is boxed.
type FrameResult<E> = Result<Frame<Bytes>, ReadError<E>>;

/// Why a read failed: the client's own error, or the body went to a newer attempt.
enum ReadError<E> {
    Client(E),
    Superseded,
}

fn to_bytes<D: Buf>(frame: Frame<D>) -> Frame<Bytes> {
    frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
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
