//! breaking (stub)
use crate::cli::BreakArgs;
use crate::config::Settings;
use crate::exit::Exit;
pub fn run(_s: &Settings, _a: &BreakArgs) -> anyhow::Result<Exit> { anyhow::bail!("not yet") }
