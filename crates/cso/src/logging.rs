//! Log output: JSON lines (what the Go operator writes, for existing log pipelines) or text, at the level
//! the Go operator's `--log-level` means; `RUST_LOG` overrides the level for debugging.

/// The kube client logs every failed request at ERROR before returning the error to its caller, which
/// reports it; readiness polling would flood the log.
const QUIET: &str = "kube_client::client::builder=off";

/// `--log-level` as the Go operator reads it: `debug`, `error`, anything else is `info`.
pub fn level_filter(log_level: &str) -> String {
    let level = match log_level {
        "debug" => "debug",
        "error" => "error",
        _ => "info",
    };
    format!("{level},{QUIET}")
}

pub fn init(log_level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| level_filter(log_level).into());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().flatten_event(true).with_current_span(false).init();
    } else {
        builder.init();
    }
}
