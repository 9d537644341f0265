//! `cso`: the cluster stack operator and its tools.

mod chart_credentials;
mod cli;
mod commands;
mod endpoints;
mod leader;
mod logging;
mod renderer_binary;

use clap::Parser;

/// The static image binary allocates with mimalloc: musl's allocator keeps little but costs half as much CPU
/// again (1000 Clusters: 27.5 / 34.5 s of `cso` CPU for install / upgrade against 18.1 / 19.9 s; see
/// docs/benchmarks.md, session 30).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc's `purge_delay` option (its index in `mi_option_t`): how long freed memory stays with the process
/// before it goes back to the system.
#[cfg(target_env = "musl")]
const MIMALLOC_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Freed memory goes back to the system at once, unless `MIMALLOC_PURGE_DELAY` says otherwise (mimalloc's
/// default keeps it for a second; with it and eagerly committed arenas, 1000 Clusters' install peaked at 104
/// MiB, 63 without either). Arenas are committed as used by a build setting (.cargo/config.toml).
#[cfg_attr(
    target_env = "musl",
    expect(
        unsafe_code,
        reason = "mimalloc's options are set through its C interface only"
    )
)]
fn return_freed_memory_at_once() {
    #[cfg(target_env = "musl")]
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it reads atomically; no memory is touched.
        unsafe { libmimalloc_sys::mi_option_set(MIMALLOC_PURGE_DELAY, 0) };
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    return_freed_memory_at_once();
    let cli = cli::Cli::parse_from(cli::go_style_args(std::env::args()));
    match &cli.command {
        cli::Command::Run(run) => logging::init(&run.log_level, run.log_format == "json"),
        // Its output is the result: only errors are logged.
        cli::Command::Render(_) | cli::Command::Status(_) | cli::Command::Rollout(_) => {
            logging::init("error", false)
        }
        _ => logging::init("info", false),
    }
    commands::run(cli.command).await
}
