//! `lockctl exec`: run a command while holding the lock.
//!
//! The order of events, and why:
//!
//! 1. Signal handling starts before the first attempt, so a SIGINT/SIGTERM/SIGHUP during the wait ends
//!    it cleanly (a failed attempt is always rolled back, a won one is released) and lockctl exits
//!    128+N without running the command.
//! 2. The watcher (`watcher.rs`: it kills the job's group if lockctl dies) is forked on a thread as
//!    the first attempt is made, so that its start overlaps the attempt and the wait; once the lock
//!    is won, lockctl waits for its first word and sends it the lease's deadline. Then the command
//!    is spawned from the main thread (see `child.rs` for the process group, the parent-death
//!    signal, the subreaper and the terminal), with `LOCKCTL_NAME`, `LOCKCTL_KEY`, `LOCKCTL_TOKEN`,
//!    `LOCKCTL_FENCE` and `LOCKCTL_SLOT` in its environment. From then on, signals are forwarded to
//!    the job (`supervisor.rs`).
//! 3. The renewal thread (`lease.rs`) keeps the lease and a timer enforces its deadline
//!    (`deadline.rs`); when the lease is lost, the job gets SIGTERM, then SIGKILL after
//!    `--kill-after`.
//! 4. When no process of the job is left (the command and every process it started, whatever group
//!    or session it moved to), the watcher stands down, renewal stops and the lock is released, on
//!    every path.
//! 5. Exit status: 76 if the lease was lost at any point (also when the release finds the lock no
//!    longer ours, or the lease ran out before the command could start, which then does not
//!    start; see `watcher.rs`); otherwise the command's exit code, or 128+N if signal N killed
//!    it; 127/126 if it could not be started.

mod child;
mod deadline;
mod lease;
mod procs;
mod supervisor;
mod watcher;

use std::ffi::OsString;
use std::sync::{mpsc::Sender, Arc, Mutex};

use anyhow::Context;

use crate::cli::ExecArgs;
use crate::commands::{report, report_failed_attempt, wait_policy};
use crate::config::{check_name, Settings};
use crate::exit::{Exit, LockError};
use crate::lock::{Engine, Holder, WaitPolicy, Wake, Wakeup};
use crate::{say, signals, trace};
use child::Ended;
use lease::Lease;
use supervisor::Supervisor;

/// When lockctl was started as an `exec`'s watcher (see `watcher.rs`), runs it and never returns.
pub fn guard_mode() {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == watcher::GUARD_ARG) {
        watcher::guard(&args[1..]);
    }
}

/// Where a signal sent to lockctl goes: to the waiter before the command runs, to its group after.
enum Route {
    Waiter(Sender<Wake>),
    Child(Arc<Supervisor>),
}

pub fn run(settings: &Settings, args: &ExecArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    check_proc()?;
    // A SIGCHLD that lockctl's parent left ignored (`trap '' CHLD`) would have the kernel reap
    // every child at its exit: the watcher's start and the job's status would be lost (waits fail
    // with ECHILD). Its default action is to do nothing, which the job inherits too.
    // SAFETY: SIG_DFL is a valid disposition for SIGCHLD; no child of lockctl exists yet.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_DFL) };
    let (program, program_args) = match (&args.command, args.program.split_first()) {
        (Some(c), _) => (OsString::from("sh"), vec![OsString::from("-c"), c.clone()]),
        (None, Some((p, rest))) => (p.clone(), rest.to_vec()),
        (None, None) => {
            return Err(LockError::Usage(
                "exec needs a command: -c 'COMMAND' or -- PROGRAM ARGS...".into(),
            )
            .into())
        }
    };
    let note = crate::config::check_note(args.wait.note.as_deref())?;
    let (policy, busy) = wait_policy(&args.wait);
    let mut engine = Engine::new(settings)?;
    engine.supersede(args.wait.supersede);
    let keys = engine.keys(&args.name);
    let command_line = std::iter::once(&program)
        .chain(&program_args)
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let holder = Holder::new(std::process::id(), &command_line).with_note(note);

    let wake = Wakeup::new();
    let route = Arc::new(Mutex::new(Route::Waiter(wake.sender())));
    let route2 = Arc::clone(&route);
    signals::listen(
        move |signal| match &*route2.lock().unwrap_or_else(|e| e.into_inner()) {
            Route::Waiter(tx) => {
                let _ = tx.send(Wake::Signal(signal));
            }
            Route::Child(sup) => sup.forward(signal),
        },
    )
    .context("cannot install signal handlers")?;

    // The watcher starts while the lock is asked for, not after it is won: its start (two forks
    // and an exec of lockctl's binary) would otherwise lie between the grant and the command's.
    // On every path where no command runs, the pipe to it closes and it exits.
    let starting = match policy {
        WaitPolicy::NoWait => watcher::Launch::at_grant(args.kill_after),
        WaitPolicy::For(d) if d.is_zero() => watcher::Launch::at_grant(args.kill_after),
        _ => watcher::Launch::new(args.kill_after),
    };

    let grant = match engine.acquire(
        &keys,
        args.wait.ttl,
        policy,
        &holder,
        usize::from(args.wait.limit),
        &wake,
    ) {
        Ok(g) => g,
        Err(e) => return Ok(report_failed_attempt(e, wake.pending_signal(), busy)),
    };
    trace!(
        "acquired '{}' with fence {}; starting {command_line}",
        keys.name,
        grant.fence
    );

    // A signal that came after the grant and before the command starts: do not start it.
    if let Some(signal) = wake.pending_signal() {
        let _ = engine.release(&keys, &grant.token);
        return Ok(report(&LockError::Interrupted(signal, None), busy));
    }
    let env = grant.env();
    let deadline = grant.started.add(grant.validity);
    // The lease ran out before the command could start (lockctl was stopped, or its watcher
    // silent, that long): another client may hold the lock, so nothing starts.
    let late = |engine: &mut Engine, why: &str| {
        let _ = engine.release(&keys, &grant.token);
        say!(
            "lease on '{}' lost before the command started: {why}; another client may hold the \
             lock, so the command did not run; exit 76",
            keys.name
        );
        Ok(Exit::Lost)
    };
    // The subreaper only once the watcher is ready: it must not be adopted by lockctl (see
    // watcher.rs).
    // A signal while a slow watcher is awaited ends the wait at once.
    let signalled = std::cell::Cell::new(None);
    let mut stop = || {
        if signalled.get().is_none() {
            signalled.set(wake.pending_signal());
        }
        signalled.get().is_some()
    };
    let watcher = match starting.ready(deadline, &mut stop).and_then(|w| {
        child::become_subreaper()?;
        Ok(w)
    }) {
        Ok(w) => w,
        Err(_) if signalled.get().is_some() => {
            let _ = engine.release(&keys, &grant.token);
            let signal = signalled.get().unwrap_or(libc::SIGTERM);
            return Ok(report(&LockError::Interrupted(signal, None), busy));
        }
        Err(e) if deadline.passed() => return late(&mut engine, &e.to_string()),
        Err(e) => {
            let _ = engine.release(&keys, &grant.token);
            return Err(e).context(
                "cannot start the watcher process or become the command's subreaper; the \
                 command did not run",
            );
        }
    };
    // The child checks the deadline again after it announced its group to the watcher, which
    // covers a stop after that (see watcher.rs).
    if deadline.passed() {
        watcher.done();
        return late(&mut engine, "the lease ran out before the command's spawn");
    }
    // A signal that came while the watcher was made ready (which may wait for a slow one): the
    // command has not started, so it does not start. One after this is forwarded to it.
    if let Some(signal) = wake.pending_signal() {
        watcher.done();
        let _ = engine.release(&keys, &grant.token);
        return Ok(report(&LockError::Interrupted(signal, None), busy));
    }
    let spawned = child::spawn(
        &program,
        &program_args,
        &env,
        watcher.fd(),
        !watcher.exec(),
        deadline,
    );
    let child = match spawned {
        Ok(c) => c,
        Err(e) if e.raw_os_error() == Some(child::LATE) => {
            watcher.done();
            return late(&mut engine, "the lease ran out before the command's exec");
        }
        // The watcher died after it was found ready (the OOM killer, a `pkill` in that moment):
        // the command would run unguarded, so it does not run, as when the watcher cannot start.
        Err(e) if e.raw_os_error() == Some(child::WATCHER_GONE) => {
            watcher.done();
            let _ = engine.release(&keys, &grant.token);
            return Err(anyhow::anyhow!(
                "its watcher process (lockctl-guard) is gone, so the command could outlive \
                 lockctl; the command did not run and the lock was released"
            ))
            .context(format!("cannot run {}", program.to_string_lossy()));
        }
        Err(e) => {
            watcher.done();
            let _ = engine.release(&keys, &grant.token);
            crate::complain!("cannot run {}: {e}", program.to_string_lossy());
            return Ok(Exit::Raw(if e.kind() == std::io::ErrorKind::NotFound {
                127
            } else {
                126
            }));
        }
    };
    let pid = child.id();
    let supervisor = Supervisor::new(pid, args.kill_after, watcher.link());
    {
        let mut r = route.lock().unwrap_or_else(|e| e.into_inner());
        *r = Route::Child(Arc::clone(&supervisor));
    }
    // A signal that came between the grant and the switch above is still in the waiter's channel.
    if let Some(signal) = wake.pending_signal() {
        supervisor.forward(signal);
    }
    // A watcher that is gone or stopped guards nothing: lockctl's death would leave the job running.
    let sup = Arc::clone(&supervisor);
    let name = keys.name.clone();
    let monitored = watcher.monitor(move |gone| match gone {
        None => !sup.over(),
        Some(why) => {
            let reason = format!(
                "its watcher process (lockctl-guard) {why}, so the command could outlive lockctl"
            );
            if sup.watcher_lost(reason.clone()) {
                crate::say!("lease on '{name}' lost: {reason}; stopping the command");
            }
            false
        }
    });
    if let Err(e) = monitored {
        abandon(&supervisor, child, watcher);
        let _ = engine.release(&keys, &grant.token);
        return Err(e)
            .context("cannot start the thread that checks the watcher; the command was killed");
    }

    let lease = match Lease::start(
        engine,
        grant.clone(),
        holder,
        Arc::clone(&supervisor),
        watcher.link(),
    ) {
        Ok(lease) => lease,
        Err(e) => {
            // No renewal: the command must not run on; the engine went with the thread that never
            // started, so a fresh one gives the lock back.
            abandon(&supervisor, child, watcher);
            if let Ok(mut engine) = Engine::new(settings) {
                let _ = engine.release(&keys, &grant.token);
            }
            return Err(e).context("cannot start the renewal thread; the command was killed");
        }
    };
    let ended = match supervisor.wait_job(pid) {
        Ok(ended) => ended,
        Err(e) => {
            abandon(&supervisor, child, watcher);
            let (mut engine, _) = lease.stop();
            let _ = engine.release(&keys, &grant.token);
            return Err(e).context("cannot wait for the command; it was killed");
        }
    };
    // Nothing of the job is left: the watcher stands down before anything else (see its docs).
    watcher.done();
    child::reclaim_terminal();
    let (mut engine, lost_by_deadline) = lease.stop();
    let lost_while_running = supervisor.lost();
    let lost_reported = lost_while_running.is_some();
    let mut lost = lost_while_running.or(lost_by_deadline);

    match engine.release(&keys, &grant.token) {
        Ok(_) => {}
        Err(LockError::Lost { .. }) => {
            lost.get_or_insert_with(|| "the release found the lock no longer ours".into());
        }
        Err(e) => say!(
            "could not release '{}' ({e}); it expires within its TTL",
            keys.name
        ),
    }
    let status = match ended {
        Ended::Exited(code) => Exit::Raw(code as u8),
        Ended::Signaled(signal) => Exit::from_signal(signal),
    };
    match (lost, lost_reported) {
        (Some(reason), false) => {
            say!("lease on '{}' was lost: {reason}; exit 76", keys.name);
            Ok(Exit::Lost)
        }
        (Some(reason), true) => {
            // The thread that stopped the command says why only after stopping it, and may not
            // have written its line yet: the reason goes here too.
            say!(
                "exit 76 (lease lost: {reason}) instead of the command's {}",
                status.code()
            );
            Ok(Exit::Lost)
        }
        (None, _) => Ok(status),
    }
}

/// Kills the command's process group and reaps the command, on a path where lockctl cannot supervise.
fn abandon(supervisor: &Supervisor, child: child::Spawned, watcher: watcher::Watcher) {
    supervisor.kill_now();
    child.wait();
    watcher.done();
    child::reclaim_terminal();
}

/// lockctl finds its command's processes, and tells its watcher from them, in `/proc`: a `/proc`
/// of another PID namespace would have it signal other processes under the PIDs of the job's (its
/// own threads among them) and miss the job's own, and a lockctl that adopts orphans (the first
/// process of a PID namespace, or a child subreaper already: the flag survives `execve`) without
/// any `/proc` cannot tell its watcher, then its own child, from the job's processes and would
/// wait for it. Both are refused before the lock is asked for. Without `/proc` elsewhere, lockctl
/// runs as documented (the watcher is the forked copy, the parent-death signal stops the job).
fn check_proc() -> anyhow::Result<()> {
    let mut subreaper: libc::c_int = 0;
    // SAFETY: getpid has no preconditions; PR_GET_CHILD_SUBREAPER writes a live integer.
    let adopts = unsafe {
        libc::getpid() == 1
            || (libc::prctl(libc::PR_GET_CHILD_SUBREAPER, &mut subreaper) == 0 && subreaper != 0)
    };
    match procs::proc_mount() {
        procs::ProcMount::Own => Ok(()),
        procs::ProcMount::Foreign => Err(anyhow::anyhow!(
            "exec: /proc here belongs to another PID namespace than lockctl's, so lockctl \
             cannot find its command's processes there; mount this namespace's own \
             (`unshare --pid --fork --mount-proc`, or `mount -t proc proc /proc` in a mount \
             namespace of its own); the lock was not asked for"
        )),
        procs::ProcMount::Missing if adopts => Err(anyhow::anyhow!(
            "exec: lockctl adopts orphans here (the first process of a PID namespace, or a child \
             subreaper) and there is no /proc, so it cannot tell its watcher from its command's \
             processes; mount /proc, or run lockctl under an init (`docker run --init`, tini); the \
             lock was not asked for"
        )),
        procs::ProcMount::Missing => Ok(()),
    }
}
