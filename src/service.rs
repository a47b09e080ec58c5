//! [`SqliteRetry`]: the service.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http::{Request, Response};
use tower::BoxError;
use tower_service::Service;

use crate::classify::{ClassifyError, NeverRetryErrors};
use crate::future::ResponseFuture;
use crate::layer::Shared;
use crate::metrics::RetryMetrics;

/// The service built by [`SqliteRetryLayer`](crate::SqliteRetryLayer).
///
/// It accepts any request body (`Data = Bytes`) and hands the inner service an
/// [`axum::body::Body`]: the buffered bytes, fresh for every attempt, or the original stream
/// when the request is passed through without retries.
pub struct SqliteRetry<S, C = NeverRetryErrors> {
    inner: S,
    shared: Arc<Shared>,
    classifier: C,
}

impl<S, C> SqliteRetry<S, C> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, classifier: C) -> Self {
        Self {
            inner,
            shared,
            classifier,
        }
    }

    /// The counters of the layer this service came from.
    pub fn metrics(&self) -> RetryMetrics {
        RetryMetrics {
            counters: self.shared.counters.clone(),
        }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, C: Clone> Clone for SqliteRetry<S, C> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            classifier: self.classifier.clone(),
        }
    }
}

impl<S: fmt::Debug, C> fmt::Debug for SqliteRetry<S, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteRetry")
            .field("inner", &self.inner)
            .field("policy", &self.shared.policy)
            .finish_non_exhaustive()
    }
}

impl<S, C, B, ResBody> Service<Request<B>> for SqliteRetry<S, C>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone,
    C: ClassifyError<S::Error> + Clone,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, C>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        // NOTE: `self.inner` is the instance that was polled ready; a clone may not be. Take
        // the ready one for this request and leave the clone for the next `poll_ready`
        // (tower's rule; see tower's docs on "Be careful when cloning inner services").
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::new(
            inner,
            self.classifier.clone(),
            self.shared.clone(),
            req.map(Body::new),
        )
    }
}
