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
/// docs/benchmarks.md, session 30). Two of its settings keep it near musl's size: arenas are committed as they
/// are used (a build setting, .cargo/config.toml) and freed memory goes back to the system at once (the image
/// sets `MIMALLOC_PURGE_DELAY=0`; mimalloc's default keeps it a second, 2-3 MiB more at 1000 Clusters).
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
