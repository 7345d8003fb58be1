//! status (stub)
use crate::cli::StatusArgs;
use crate::config::Settings;
use crate::exit::Exit;
pub fn run(_s: &Settings, _a: &StatusArgs) -> anyhow::Result<Exit> { anyhow::bail!("not yet") }
