//! list (stub)
use crate::cli::ListArgs;
use crate::config::Settings;
use crate::exit::Exit;
pub fn run(_s: &Settings, _a: &ListArgs) -> anyhow::Result<Exit> { anyhow::bail!("not yet") }
