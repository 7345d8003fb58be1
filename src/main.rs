//! `lockctl`: parse the command line, run, turn the outcome into an exit status.
//!
//! lockctl starts itself, without the standard library's start-up (`#![no_main]`: the C library
//! calls [`main`] directly). A start-up is most of what a cron job or a script pays for lockctl,
//! and the standard one spent a tenth of an `acquire -n` on what lockctl does not use: it reads
//! `/proc/self/maps` to find the main thread's stack, maps an alternate signal stack for every
//! thread and installs SIGSEGV and SIGBUS handlers, only to print "has overflowed its stack" in
//! place of a plain SIGSEGV (`bench/RESULTS.md`, "The runtime's start-up"). The two parts of it
//! that lockctl relies on are done here, as the standard library does them:
//!
//! - descriptors 0, 1 and 2 are opened on `/dev/null` when closed, so that no Redis socket or lock
//!   file can become stdout or stderr and receive a token or a message;
//! - SIGPIPE is ignored, so that a closed pipe is an error to report (and a lock to give back)
//!   rather than a silent death. `std::process::Command` still gives children its default action,
//!   and `exec` sets every child's dispositions itself.
//!
//! At the end, `std::process::exit` flushes stdout, as a return from a standard `main` does.
//!
//! One tuning comes first: glibc gives every thread that allocates a malloc arena of its own (a
//! 128 MiB reservation, trimmed, plus page faults), and lockctl's threads are short-lived and light
//! (one per Redlock node, a connect helper, the signal and renewal threads). Sharing the main arena
//! makes a five-node acquire measurably cheaper (see `bench/RESULTS.md`) and costs nothing here.
//!
//! `lockctl --version` (or `-V`) alone is answered before clap builds its command tree, which is
//! most of the user-space work of a start-up; it prints what clap prints (`tests/bad_input.rs` checks
//! that), so scripts that probe for lockctl pay only for loading the binary.
#![no_main]

use std::ffi::{c_char, c_int};

/// Called by the C library's start-up with the process's arguments, which the standard library
/// also finds by itself (`std::env::args_os`).
#[no_mangle]
extern "C" fn main(_argc: c_int, _argv: *const *const c_char) -> c_int {
    hold_standard_descriptors_open();
    ignore_sigpipe();
    // A panic must not unwind into the C library's frames: as after a standard `main`, it exits
    // 101 (the release profile aborts at the panic already). The message names the thread
    // '<unnamed>': only the standard start-up names it 'main'.
    let code = std::panic::catch_unwind(|| {
        // An `exec`'s watcher, started again from this binary, never reaches the command line
        // parser.
        lockctl::exec::guard_mode();
        if version_only() {
            return 0;
        }
        share_one_malloc_arena();
        lockctl::run(lockctl::cli::parse()).code().into()
    });
    std::process::exit(code.unwrap_or(101))
}

/// Opens `/dev/null` on each of descriptors 0, 1 and 2 that is closed, as the standard library's
/// start-up does; aborts if it cannot.
fn hold_standard_descriptors_open() {
    let mut fds = [0, 1, 2].map(|fd| libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    });
    loop {
        // SAFETY: poll(2) on a valid array of three pollfd, with no wait.
        if unsafe { libc::poll(fds.as_mut_ptr(), 3, 0) } != -1 {
            break;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            // A limit on descriptors or memory: ask each descriptor instead.
            _ => {
                for fd in &mut fds {
                    // SAFETY: F_GETFD only reads the descriptor's flags.
                    let closed = unsafe { libc::fcntl(fd.fd, libc::F_GETFD) } == -1
                        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EBADF);
                    fd.revents = if closed { libc::POLLNVAL } else { 0 };
                }
                break;
            }
        }
    }
    for fd in fds {
        if fd.revents & libc::POLLNVAL != 0 {
            // SAFETY: open(2) of a constant path; the lowest free descriptor is the closed one.
            if unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDWR, 0) } == -1 {
                std::process::abort();
            }
        }
    }
}

fn ignore_sigpipe() {
    // SAFETY: SIG_IGN is a valid disposition for SIGPIPE; no other thread exists yet.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
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
