//! One module per subcommand.

mod crds;
mod demo;
mod dev;
mod run;

use crate::cli::{Command, DevCommand};

pub async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run(args) => run::run(*args).await,
        Command::Demo { dir, releases } => demo::demo(&dir, releases.as_deref()).await,
        Command::Crds => crds::print(),
        Command::Dev(DevCommand::Up { dir }) => dev::up(&dir).await,
        Command::Dev(DevCommand::Status { dir }) => dev::status(&dir).await,
    }
}
