//! doctor (stub)
use crate::cli::DoctorArgs;
use crate::config::Settings;
use crate::exit::Exit;
pub fn run(_s: &Settings, _a: &DoctorArgs) -> anyhow::Result<Exit> { anyhow::bail!("not yet") }
