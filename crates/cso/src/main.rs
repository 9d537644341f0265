//! `cso`: the cluster stack operator and its tools.

mod chart_credentials;
mod cli;
mod commands;
mod endpoints;
mod leader;
mod logging;
mod renderer_binary;

use clap::Parser;

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
