//! `lockctl`: parse the command line, run, turn the outcome into an exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    lockctl::run(lockctl::cli::parse()).into()
}
