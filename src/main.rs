//! `lockctl`: parse the command line, run, turn the outcome into an exit status.
//!
//! One tuning comes first: glibc gives every thread that allocates a malloc arena of its own (a
//! 128 MiB reservation, trimmed, plus page faults), and lockctl's threads are short-lived and light
//! (one per Redlock node, a connect helper, the signal and renewal threads). Sharing the main arena
//! makes a five-node acquire measurably cheaper (see `bench/RESULTS.md`) and costs nothing here.
//!
//! `lockctl --version` (or `-V`) alone is answered before clap builds its command tree, which is
//! most of the user-space work of a start-up; it prints what clap prints (`tests/bad_input.rs` checks
//! that), so scripts that probe for lockctl pay only for loading the binary.

use std::process::ExitCode;

fn main() -> ExitCode {
    // An `exec`'s watcher, started again from this binary, never reaches the command line parser.
    lockctl::exec::guard_mode();
    if version_only() {
        return ExitCode::SUCCESS;
    }
    share_one_malloc_arena();
    lockctl::run(lockctl::cli::parse()).into()
}

/// Prints the version and returns true when the only argument asks for it.
fn version_only() -> bool {
    let mut args = std::env::args_os().skip(1);
    match (args.next(), args.next()) {
        (Some(a), None) if a == "--version" || a == "-V" => {
            use std::io::Write;
            // As clap does, a failed write still exits 0.
            let _ = std::io::stdout().write_all(lockctl::cli::VERSION_LINE.as_bytes());
            true
        }
        _ => false,
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn share_one_malloc_arena() {
    // SAFETY: mallopt only sets an allocator parameter; no thread exists yet.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn share_one_malloc_arena() {}
