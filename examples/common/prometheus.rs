//! `GET /metrics` for the example app, in Prometheus' text format: the application installs
//! `metrics-exporter-prometheus` as the process' recorder, and the layers emit into it through
//! the `metrics` facade (the crate's `metrics` feature). Shared by `examples/app.rs` and
//! `tests/app.rs` (`#[path = "..."] mod prometheus;`).

use std::time::Duration;

use axum::Router;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{BuildError, PrometheusBuilder, PrometheusHandle};

/// The exporter, with bucket bounds for the layer's histograms (Prometheus histograms, which
/// aggregate across instances, rather than the exporter's default summaries).
pub(crate) fn builder() -> PrometheusBuilder {
    let builder = PrometheusBuilder::new();
    #[cfg(feature = "metrics")]
    let builder = {
        use metrics_exporter_prometheus::Matcher;
        use tower_sqlite_retry::metrics::recorder;
        builder
            .set_buckets_for_metric(
                Matcher::Full(recorder::ATTEMPTS.to_owned()),
                recorder::ATTEMPTS_BUCKETS,
            )
            .expect("bucket bounds are not empty")
            .set_buckets_for_metric(
                Matcher::Suffix("_seconds".to_owned()),
                recorder::SECONDS_BUCKETS,
            )
            .expect("bucket bounds are not empty")
    };
    builder
}

/// Installs the exporter as the process' recorder and runs its upkeep (draining histogram
/// samples) every 5 s. Call it before building the layers: they describe their metrics (help
/// text, units) to the recorder installed then.
pub(crate) fn install() -> Result<PrometheusHandle, BuildError> {
    let handle = builder().install_recorder()?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(5));
        loop {
            every.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `app` with `GET /metrics` added, outside the retry layers: a scrape is not one of the
/// requests they count. `extra` is called at every scrape for series the app computes then
/// (already in the text format, appended after the recorder's; `String::new` for none): the
/// write path's utilization, `Db::write_utilization_metrics`.
pub(crate) fn route<F>(app: Router, handle: PrometheusHandle, extra: F) -> Router
where
    F: Fn() -> String + Clone + Send + Sync + 'static,
{
    app.route(
        "/metrics",
        get(move || {
            let (handle, extra) = (handle.clone(), extra.clone());
            async move { scrape(&handle, &extra()) }
        }),
    )
}

fn scrape(handle: &PrometheusHandle, extra: &str) -> Response {
    let mut text = String::new();
    if cfg!(not(feature = "metrics")) {
        text.push_str(
            "# tower-sqlite-retry was built without its `metrics` feature, so the retry layers \
             emit nothing: run the app with `--features metrics`.\n",
        );
    }
    text.push_str(&handle.render());
    text.push_str(extra);
    (
        [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        text,
    )
        .into_response()
}
