//! What names a request in tracing and metrics: its method and route template.

use axum::extract::MatchedPath;
use http::Method;
use http::request::Parts;

/// The method and, under axum, the matched route template (`/orders/{id}`, never the raw
/// path, so that labels stay bounded).
pub(crate) struct Route {
    pub(crate) method: Method,
    path: Option<MatchedPath>,
}

impl Route {
    pub(crate) fn of(head: &Parts) -> Self {
        Self {
            method: head.method.clone(),
            path: head.extensions.get::<MatchedPath>().cloned(),
        }
    }

    pub(crate) fn path(&self) -> Option<&str> {
        self.path.as_ref().map(MatchedPath::as_str)
    }
}
