//! Start-up shared by the example binaries: their arguments and their log filter.

use std::process::ExitCode;

use tracing_subscriber::EnvFilter;

/// The arguments `parse_args` returned; else the exit code, after printing the usage on stdout
/// (`--help`, success) or `program: error` and the usage on stderr (a usage error, 2).
pub(crate) fn args_or_exit<A>(
    program: &str,
    usage: &str,
    parsed: Result<Option<A>, String>,
) -> Result<A, ExitCode> {
    match parsed {
        Ok(Some(args)) => Ok(args),
        Ok(None) => {
            println!("{usage}");
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{program}: {e}\n{usage}");
            Err(ExitCode::from(2))
        }
    }
}

/// The log filter from `RUST_LOG`, else `default`.
pub(crate) fn env_filter(default: &str) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
}
