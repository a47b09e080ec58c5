//! What names a request in tracing, metrics and admission: its method and route template.

#[cfg(feature = "axum")]
use axum::extract::MatchedPath;
use http::Method;
use http::request::Parts;

/// The method and, under axum, the matched route template (`/orders/{id}`, never the raw
/// path, so that labels stay bounded). Without the `axum` feature there is no template: the
/// route is unknown.
pub(crate) struct Route {
    pub(crate) method: Method,
    #[cfg(feature = "axum")]
    path: Option<MatchedPath>,
}

impl Route {
    pub(crate) fn of(head: &Parts) -> Self {
        Self {
            method: head.method.clone(),
            #[cfg(feature = "axum")]
            path: head.extensions.get::<MatchedPath>().cloned(),
        }
    }

    pub(crate) fn path(&self) -> Option<&str> {
        #[cfg(feature = "axum")]
        return self.path.as_ref().map(MatchedPath::as_str);
        #[cfg(not(feature = "axum"))]
        None
    }
}
