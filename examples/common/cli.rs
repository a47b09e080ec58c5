//! Start-up shared by the example binaries: their log filter. (Their command lines are
//! `clap` derives, each in its own binary.)

use tracing_subscriber::EnvFilter;

/// The log filter from `RUST_LOG`, else `default`.
pub(crate) fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}
