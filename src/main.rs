//! `lockctl`: parse the command line, run, turn the outcome into an exit status.
//!
//! One tuning comes first: glibc gives every thread that allocates a malloc arena of its own (a
//! 128 MiB reservation, trimmed, plus page faults), and lockctl's threads are short-lived and light
//! (one per Redlock node, a connect helper, the signal and renewal threads). Sharing the main arena
//! makes a five-node acquire measurably cheaper (see `bench/RESULTS.md`) and costs nothing here.

use std::process::ExitCode;

fn main() -> ExitCode {
    // An `exec`'s watcher, started again from this binary, never reaches the command line parser.
    lockctl::exec::guard_mode();
    share_one_malloc_arena();
    lockctl::run(lockctl::cli::parse()).into()
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn share_one_malloc_arena() {
    // SAFETY: mallopt only sets an allocator parameter; no thread exists yet.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn share_one_malloc_arena() {}
