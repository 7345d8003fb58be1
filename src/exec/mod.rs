//! exec (stub, being written)
use crate::cli::ExecArgs;
use crate::config::Settings;
use crate::exit::Exit;
pub fn run(_s: &Settings, _a: &ExecArgs) -> anyhow::Result<Exit> { anyhow::bail!("not yet") }
