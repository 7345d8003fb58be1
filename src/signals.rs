//! Terminating signals (SIGINT, SIGTERM, SIGHUP, and SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM), received on
//! a thread of their own.
//!
//! lockctl must never die between setting a key and reporting it, nor leave a child unsupervised, so
//! these signals are never left to their default action: a dedicated thread receives them (through
//! signal-hook's self-pipe, which is async-signal-safe) and hands each one to the command, which decides
//! what it means: end a wait cleanly, or forward it to the job.
//!
//! The last four are not a user's usual way to stop a command, but their default action kills too:
//! left to it, a `kill -USR1` meant for the job (or a stray `alarm`) would kill lockctl, strand the
//! key until its TTL runs out, and leave the job running without a lease. So they are handled like
//! the others: a wait ends (exit 128+N), a running job gets the signal forwarded, under the same
//! policy (`exec/supervisor.rs`).
//!
//! **Why signal-hook and not `ctrlc`.** The first design named the `ctrlc` crate. It does not fit:
//! `exec` must forward *every* terminating signal to the job, SIGTERM (from `kill`, systemd, a CI
//! runner cancelling the job) and SIGHUP (a closed terminal) as well as Ctrl-C's SIGINT, and forward
//! each *with its own number*, because the job may treat them differently (`trap 'reload' HUP`) and
//! its exit status (128+N) must say which one it got. `ctrlc` gives one callback without the signal's
//! number, and covers SIGTERM and SIGHUP only behind a feature flag, folded into that same callback.
//! signal-hook's iterator hands over each signal with its number, on an ordinary thread where any
//! code may run (locks, `killpg`, waking a waiter), while the handler itself only writes to a pipe.
//!
//! A command that makes one attempt and never waits (`acquire -n`) needs no thread: [`catch`]
//! installs the same handlers, and the command reads what arrived once its attempt is over, which
//! spares such an invocation a thread it would never use (`bench/RESULTS.md`).

use signal_hook::consts::{SIGALRM, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;

/// The signals lockctl handles.
pub const HANDLED: [i32; 7] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM];

/// Starts receiving the handled signals; `on_signal` runs on the receiving thread for each one.
pub fn listen(mut on_signal: impl FnMut(i32) + Send + 'static) -> std::io::Result<()> {
    let mut signals = Signals::new(HANDLED)?;
    std::thread::Builder::new()
        .name("signals".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            for signal in signals.forever() {
                on_signal(signal);
            }
        })?;
    Ok(())
}

/// The handled signals caught, without a thread: they only mark themselves pending.
pub struct Caught(Signals);

/// Catches the handled signals without starting a thread; see [`Caught::first`].
pub fn catch() -> std::io::Result<Caught> {
    Ok(Caught(Signals::new(HANDLED)?))
}

impl Caught {
    /// A signal that arrived since [`catch`] (or since the last call), if any.
    pub fn first(&mut self) -> Option<i32> {
        self.0.pending().next()
    }
}
