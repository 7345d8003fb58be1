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
//! **Only the receiving thread takes them.** The kernel hands a signal sent to the process to any
//! thread that does not block it, and a blocking call on that thread fails with `EINTR`: a socket
//! read with a timeout (`SO_RCVTIMEO`, which every Redis connection has) does so even under
//! `SA_RESTART` (signal(7)). A release whose reply was being read when the job's SIGTERM came then
//! looked like a dropped connection, was sent again, and found its own deletion ("the release found
//! the lock no longer ours", exit 76, with the lease held throughout). So [`listen`] blocks the
//! signals in the calling thread before it starts the receiving one, and only that one unblocks
//! them: every thread started later (node calls, renewals, the subscriber, timers) inherits the mask
//! and is never interrupted. It must be called before any other thread is started. A job must not
//! inherit the mask (a `Command` keeps it across exec): [`for_the_job`] gives it back the mask
//! lockctl was started with.
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
//! **A signal lockctl's parent left ignored is taken all the same.** The contract forwards SIGINT,
//! SIGTERM and SIGHUP sent to lockctl, and a script's `lockctl exec -- job &` starts with SIGINT and
//! SIGQUIT ignored (a non-interactive shell does that to background commands): were lockctl to leave
//! them ignored, that script's `kill -INT $!` would reach neither lockctl nor the job. So under
//! `nohup lockctl exec -- job` a hangup reaches the job too; to spare the job, put `nohup` in front
//! of the job (`lockctl exec -- nohup job`), not of lockctl.
//!
//! A command that makes one attempt and never waits (`acquire -n`) needs no thread: [`catch`] blocks
//! the signals in every thread, so they wait as pending, interrupt nothing and kill nothing, and the
//! command takes what arrived once its attempt is over. That spares such an invocation a thread it
//! would never use (`bench/RESULTS.md`).

use std::sync::OnceLock;

use signal_hook::consts::{SIGALRM, SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1, SIGUSR2};
use signal_hook::iterator::Signals;

/// The signals lockctl handles.
pub const HANDLED: [i32; 7] = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM];

/// The handled signals that lockctl's parent had not blocked: those lockctl blocks, and unblocks
/// again where they are to arrive (the receiving thread, a job).
static OURS: OnceLock<libc::sigset_t> = OnceLock::new();

/// Blocks the handled signals in the calling thread (those its parent had not blocked already) and
/// returns them.
fn block() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigemptyset, sigaddset and sigismember on local sets; pthread_sigmask changes the
    // calling thread's mask only.
    unsafe {
        let mut handled: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut handled);
        for s in HANDLED {
            libc::sigaddset(&mut handled, s);
        }
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &handled, &mut old);
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(*OURS.get_or_init(|| {
            let mut ours: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut ours);
            for s in HANDLED {
                if libc::sigismember(&old, s) != 1 {
                    libc::sigaddset(&mut ours, s);
                }
            }
            ours
        }))
    }
}

/// Unblocks `set` in the calling thread. Async-signal-safe.
fn unblock(set: &libc::sigset_t) {
    // SAFETY: a valid set; pthread_sigmask changes the calling thread's mask only.
    unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, set, std::ptr::null_mut()) };
}

/// Starts receiving the handled signals; `on_signal` runs on the receiving thread for each one. The
/// calling thread, and every thread it starts afterwards, no longer takes them (see the module docs).
pub fn listen(mut on_signal: impl FnMut(i32) + Send + 'static) -> std::io::Result<()> {
    let mut signals = Signals::new(HANDLED)?;
    let ours = block()?;
    let spawned = std::thread::Builder::new()
        .name("signals".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // Those that came since the mask was set are pending and arrive here now.
            unblock(&ours);
            for signal in signals.forever() {
                on_signal(signal);
            }
        });
    if let Err(e) = spawned {
        unblock(&ours);
        return Err(explain_thread_error(e));
    }
    Ok(())
}

/// A thread refused with EINVAL to a process whose children go to another PID namespace than its
/// own (it called `unshare(CLONE_NEWPID)` and did not fork, as `unshare --pid` without `--fork`
/// does to the program it runs): Linux starts no thread there, and the bare error says nothing.
pub fn explain_thread_error(e: std::io::Error) -> std::io::Error {
    let moved = || {
        let ns = |p| std::fs::read_link(p).ok();
        ns("/proc/self/ns/pid") != ns("/proc/self/ns/pid_for_children")
    };
    if e.raw_os_error() == Some(libc::EINVAL) && moved() {
        return std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "cannot start a thread: lockctl runs in a process whose children go to a new PID \
             namespace (`unshare --pid` without `--fork`), where Linux starts none; run it with \
             `unshare --pid --fork`",
        );
    }
    e
}

/// The handled signals held pending, without a thread: see [`Caught::first`].
pub struct Caught(libc::sigset_t);

/// Blocks the handled signals in the calling thread and every thread it starts afterwards, so that
/// they wait, pending, until [`Caught::first`] takes them; see the module docs. No handler is
/// needed: the kernel keeps a blocked signal pending even when lockctl's parent had it ignored.
pub fn catch() -> std::io::Result<Caught> {
    Ok(Caught(block()?))
}

impl Caught {
    /// A signal that arrived since [`catch`] (or since the last call), if any.
    pub fn first(&mut self) -> Option<i32> {
        let none = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid set and timeout; a null info pointer is allowed.
        let s = unsafe { libc::sigtimedwait(&self.0, std::ptr::null_mut(), &none) };
        (s > 0).then_some(s)
    }
}

/// The signal mask a job starts with, given the mask of the thread that spawns it: the handled
/// signals unblocked as lockctl's parent had them, so that the job starts as if lockctl had never
/// handled them (exec resets a handler, but keeps the mask).
pub fn job_mask(spawner: &libc::sigset_t) -> libc::sigset_t {
    let mut mask = *spawner;
    if let Some(ours) = OURS.get() {
        for s in HANDLED {
            // SAFETY: sigismember and sigdelset on valid sets.
            unsafe {
                if libc::sigismember(ours, s) == 1 {
                    libc::sigdelset(&mut mask, s);
                }
            }
        }
    }
    mask
}

/// For a job's process before exec: the handled signals back to their default action, and the
/// connect alarm's (every signal lockctl gives a handler), so that none of lockctl's handlers can
/// run in a process that shares its memory; SIGPIPE too (the Rust runtime ignores it, and an
/// ignored signal stays ignored across exec). The mask is the caller's to set, from [`job_mask`].
///
/// # Safety
/// Async-signal-safe; only in a spawned child before exec.
pub unsafe fn for_the_job() {
    let alarm = crate::lock::node::alarm_signal();
    for s in HANDLED.into_iter().chain([libc::SIGPIPE, alarm]) {
        // SAFETY: async-signal-safe; the default action replaces lockctl's handler in this copy.
        unsafe { libc::signal(s, libc::SIG_DFL) };
    }
}
