//! Shared by the benches: the fairest `tower::retry` competitor for an axum router.
//!
//! tower's [`Retry`] cannot replay an axum request by itself (`Request<Body>` is not `Clone`),
//! so the competitor does what a careful user would write by hand, and no more:
//!
//! 1. [`BufferedRetry`] reads the body into [`Bytes`] once (skipped when the body is already at
//!    its end, as `SqliteRetryLayer` skips it), in a named future (no box);
//! 2. tower's [`Retry`] drives the attempts with [`ReplayPolicy`], whose `clone_request` copies
//!    the head (method, URI, version, headers, extensions) and the `Bytes` (a refcount, never a
//!    copy), and whose `retry` replays a response carrying the [`Retryable`] marker after a
//!    delay from tower's own [`ExponentialBackoff`];
//! 3. a `map_request` turns `Request<Bytes>` back into the `Request<Body>` the router wants.
#![allow(dead_code)]

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode};
use http_body::Body as _;
use http_body_util::BodyExt;
use http_body_util::combinators::Collect;
use pin_project_lite::pin_project;
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::{Policy, Retry};
use tower::util::MapRequest;
use tower::util::rng::HasherRng;
use tower::{Layer, Service};
use tower_sqlite_retry::Retryable;

/// tower's retry policy, made to replay buffered HTTP requests.
#[derive(Clone)]
pub(crate) struct ReplayPolicy {
    backoff: ExponentialBackoff,
    /// Attempts made so far by the request this clone belongs to (tower clones the policy for
    /// every request).
    attempts: u32,
    max_attempts: u32,
}

impl fmt::Debug for ReplayPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplayPolicy")
            .field("attempts", &self.attempts)
            .field("max_attempts", &self.max_attempts)
            .finish_non_exhaustive()
    }
}

impl ReplayPolicy {
    /// tower's `ExponentialBackoff`: `min · 2^n` capped at `max`, plus up to `jitter · base`
    /// of random jitter (clamped so the sum stays within `max`), at most `max_attempts` in all.
    pub(crate) fn new(min: Duration, max: Duration, jitter: f64, max_attempts: u32) -> Self {
        let backoff = ExponentialBackoffMaker::new(min, max, jitter, HasherRng::default())
            .expect("valid tower backoff")
            .make_backoff();
        Self {
            backoff,
            attempts: 1,
            max_attempts,
        }
    }
}

impl Policy<Request<Bytes>, Response<Body>, Infallible> for ReplayPolicy {
    type Future = tokio::time::Sleep;

    fn retry(
        &mut self,
        _req: &mut Request<Bytes>,
        result: &mut Result<Response<Body>, Infallible>,
    ) -> Option<Self::Future> {
        let res = match result {
            Ok(res) => res,
            Err(never) => match *never {},
        };
        if res.extensions().get::<Retryable>().is_none() || self.attempts >= self.max_attempts {
            return None;
        }
        self.attempts += 1;
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, req: &Request<Bytes>) -> Option<Request<Bytes>> {
        let mut copy = Request::new(req.body().clone());
        *copy.method_mut() = req.method().clone();
        *copy.uri_mut() = req.uri().clone();
        *copy.version_mut() = req.version();
        *copy.headers_mut() = req.headers().clone();
        *copy.extensions_mut() = req.extensions().clone();
        Some(copy)
    }
}

type ToBody = fn(Request<Bytes>) -> Request<Body>;

fn to_body(req: Request<Bytes>) -> Request<Body> {
    req.map(|bytes| {
        if bytes.is_empty() {
            Body::empty()
        } else {
            Body::from(bytes)
        }
    })
}

type Inner<S> = Retry<ReplayPolicy, MapRequest<S, ToBody>>;

/// The layer: `Router::layer(BufferedRetryLayer::new(policy))`.
#[derive(Clone, Debug)]
pub(crate) struct BufferedRetryLayer {
    policy: ReplayPolicy,
}

impl BufferedRetryLayer {
    pub(crate) fn new(policy: ReplayPolicy) -> Self {
        Self { policy }
    }
}

impl<S> Layer<S> for BufferedRetryLayer {
    type Service = BufferedRetry<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BufferedRetry {
            inner: Retry::new(
                self.policy.clone(),
                MapRequest::new(inner, to_body as ToBody),
            ),
        }
    }
}

/// Buffers the body, then hands the request to tower's `Retry`.
#[derive(Clone)]
pub(crate) struct BufferedRetry<S> {
    inner: Inner<S>,
}

impl<S> fmt::Debug for BufferedRetry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufferedRetry").finish_non_exhaustive()
    }
}

impl<S> Service<Request<Body>> for BufferedRetry<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BufferedRetryFuture<S>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        // NOTE: take the instance that was polled ready; leave a clone for the next call.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let (parts, body) = req.into_parts();
        let state = if body.is_end_stream() {
            State::Calling {
                future: inner.call(Request::from_parts(parts, Bytes::new())),
            }
        } else {
            State::Collecting {
                collect: body.collect(),
                rest: Some((parts, inner)),
            }
        };
        BufferedRetryFuture { state }
    }
}

pin_project! {
    /// The named future of [`BufferedRetry`].
    pub(crate) struct BufferedRetryFuture<S>
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
        S: Clone,
    {
        #[pin]
        state: State<S>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S>
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
        S: Clone,
    {
        Collecting {
            #[pin]
            collect: Collect<Body>,
            rest: Option<(Parts, Inner<S>)>,
        },
        Calling {
            #[pin]
            future: <Inner<S> as Service<Request<Bytes>>>::Future,
        },
    }
}

impl<S> Future for BufferedRetryFuture<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone,
{
    type Output = Result<Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Collecting { collect, rest } => {
                    let collected = ready!(collect.poll(cx));
                    let (parts, mut inner) = rest.take().expect("polled after completion");
                    let Ok(collected) = collected else {
                        let mut res = Response::new(Body::from("cannot read the request body"));
                        *res.status_mut() = StatusCode::BAD_REQUEST;
                        return Poll::Ready(Ok(res));
                    };
                    let req = Request::from_parts(parts, collected.to_bytes());
                    let future = inner.call(req);
                    this.state.set(State::Calling { future });
                }
                StateProj::Calling { future } => return future.poll(cx),
            }
        }
    }
}
