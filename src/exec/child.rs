//! The child process: spawned in a process group of its own, tied to lockctl's life, waited for
//! without being reaped early, and killed with everything it started. The job is every descendant
//! of lockctl (the watcher is not one), not the child alone, and not only the child's group.
//!
//! - **Own process group**: a lease-loss or forwarded signal must reach everything the job started
//!   (`sh -c 'a | b'`, a script's background helpers), and only that; `killpg` on the child's group does
//!   it, and lockctl itself stays out of the blast.
//! - **Tied to lockctl's life**: if lockctl dies, even by SIGKILL, nobody renews the lease, so the
//!   whole job dies: the watcher (`watcher.rs`) kills it, and the child announces its group to the
//!   watcher before exec. Only when the watcher runs as the forked copy, which signals the group and
//!   nothing else, does `PR_SET_PDEATHSIG(SIGKILL)` kill the direct child too; the exec'd watcher
//!   needs the direct child alive until it has stopped the group and followed its parent links (see
//!   there), and lockctl itself stops the job the moment its watcher is gone. The kernel sends the
//!   signal when the *thread* that forked the child exits, so the child is always spawned from the
//!   main thread, which lives until the end.
//! - **The job ends when lockctl has no child left**: lockctl is the child subreaper
//!   (`PR_SET_CHILD_SUBREAPER`), so processes orphaned by the direct child's exit
//!   (`sh -c 'work & exit 0'`) become lockctl's children instead of init's, whatever process group or
//!   session they moved to (`timeout`, `set -m`, `setsid`). lockctl reaps them as they exit and keeps
//!   the lease, renewing, until `waitid` finds no child at all, and then it has no descendant either:
//!   like `flock(1)`, whose lock lasts as long as any process holding the inherited descriptor. A
//!   command that must outlive the job is handed to a service manager (`systemd-run`, `at now`), and
//!   then runs outside the lock.
//! - **Terminal**: in an interactive shell the child's new group would be a background group and stop on
//!   its first read of the terminal, so when lockctl owns the terminal's foreground it hands it to the
//!   child (both sides call `tcsetpgrp`, as shells do, so neither order loses) and takes it back after.
//!   Ctrl-C then goes straight to the child, as it would without lockctl.
//! - **Waiting without reaping** (`waitid(WNOWAIT)`): the process-group ID stays reserved while any
//!   member of the group exists, zombies included, so a late `killpg` from the timer, renewal or signal
//!   thread can never hit a recycled ID. Every child is reaped under the supervisor's lock, which then
//!   checks whether any child is left and, if not, marks the job gone before anyone may signal it.
//!   Descendants that are not lockctl's children are found in `/proc` when a signal goes out
//!   (`procs.rs`).

use std::ffi::{CString, OsString};
use std::io;
use std::os::fd::RawFd;

use crate::clock::Stamp;

/// How the child ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Exited(i32),
    Signaled(i32),
}

/// Makes lockctl the subreaper of its descendants (see the module docs).
pub fn become_subreaper() -> io::Result<()> {
    // SAFETY: prctl with plain integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The error a spawn fails with when the lease's deadline passed before the exec (`ETIME`, which
/// no exec returns).
pub const LATE: i32 = libc::ETIME;

/// The error a spawn fails with when the watcher was gone as the child told it its group (the
/// pipe had no reader left, EPIPE). Not an errno: an exec that fails with EPIPE (a file on a FUSE
/// filesystem can) stays that, and is not taken for a gone watcher.
pub const WATCHER_GONE: i32 = 1 << 20;

/// The job's first process, as [`spawn`] started it. Dropping it reaps nothing.
pub struct Spawned(u32);

impl Spawned {
    pub fn id(&self) -> u32 {
        self.0
    }

    /// Reaps it, waiting for it to exit.
    pub fn wait(self) {
        reap(self.0);
    }
}

/// What the spawned process needs, all of it built before the clone: it shares lockctl's memory
/// and may not allocate.
struct Plan {
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    watcher: RawFd,
    pdeathsig: bool,
    parent: libc::pid_t,
    deadline_ns: u64,
    take_terminal: bool,
    /// The signal mask the job starts with (see `signals::job_mask`).
    mask: libc::sigset_t,
    /// Set by the spawned process when it cannot exec: the errno, read by lockctl after the clone.
    err: libc::c_int,
}

/// Spawns `program args` in its own process group, with the parent-death signal set if `pdeathsig`;
/// the group is announced to the watcher on `watcher` before exec. Fails with [`LATE`], starting
/// nothing, if the lease's `deadline` has passed by then (see the module docs).
///
/// The process is cloned with `CLONE_VM | CLONE_VFORK`, as `posix_spawn` does: it borrows lockctl's
/// memory until its exec, so neither lockctl's page tables are copied nor its pages copied on
/// write, and the calling thread sleeps until the exec (or the failure). A plain `fork`, which
/// `std::process::Command` falls back to when it has a `pre_exec` step, cost about a third of a
/// millisecond more per spawn here, on every handoff's critical path (`bench/RESULTS.md`). Every
/// signal is blocked across the clone, and the handled ones are set back to their default action
/// before anything else, so no handler of lockctl's can run in a process that shares its memory.
pub fn spawn(
    program: &OsString,
    args: &[OsString],
    env: &[(&str, String)],
    watcher: RawFd,
    pdeathsig: bool,
    deadline: Stamp,
) -> io::Result<Spawned> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let nul = |_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "nul byte found in provided data",
        )
    };
    let cstr = |s: &std::ffi::OsStr| CString::new(s.as_bytes()).map_err(nul);
    let file = cstr(program)?;
    let mut strings = vec![file.clone()];
    for a in args {
        strings.push(cstr(a)?);
    }
    let mut envs = Vec::new();
    for (k, v) in std::env::vars_os() {
        if env.iter().any(|(name, _)| k == *name) {
            continue;
        }
        let mut kv = k.into_vec();
        kv.push(b'=');
        kv.extend_from_slice(v.as_bytes());
        envs.push(CString::new(kv).map_err(nul)?);
    }
    for (k, v) in env {
        envs.push(CString::new(format!("{k}={v}")).map_err(nul)?);
    }
    let argv: Vec<*const libc::c_char> = strings
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let envp: Vec<*const libc::c_char> = envs
        .iter()
        .map(|c| c.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    // execvpe searches PATH with buffers on this stack, and a script without `#!` gets a copy of
    // the arguments there too.
    let path_len = std::env::var_os("PATH").map_or(0, |p| p.len());
    let stack = Stack::new(64 * 1024 + path_len + file.as_bytes().len() + argv.len() * 8)?;
    let mut plan = Plan {
        file: file.as_ptr(),
        argv: argv.as_ptr(),
        envp: envp.as_ptr(),
        watcher,
        pdeathsig,
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
        deadline_ns: deadline.since_boot().as_nanos().min(u64::MAX as u128) as u64,
        take_terminal: owns_terminal(),
        // SAFETY: sigset_t is plain data; filled below.
        mask: unsafe { std::mem::zeroed() },
        err: 0,
    };
    // SAFETY: sigfillset on a local set; pthread_sigmask changes this thread's mask, restored below.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        plan.mask = crate::signals::job_mask(&old);
        // SAFETY: `job` only makes async-signal-safe calls on `plan`, which outlives the clone
        // (CLONE_VFORK: this thread resumes once the child has exec'd or exited), on a stack of
        // its own.
        let pid = libc::clone(
            job,
            stack.top(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::SIGCHLD,
            (&mut plan as *mut Plan).cast(),
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        pid
    };
    drop(stack);
    // SAFETY: the child wrote it, if at all, before it exited; it has by now (CLONE_VFORK).
    let err = unsafe { std::ptr::read_volatile(&plan.err) };
    if err != 0 {
        reap(pid as u32);
        return Err(io::Error::from_raw_os_error(err));
    }
    if plan.take_terminal {
        // SAFETY: plain syscalls on our own terminal and child.
        unsafe { set_foreground(pid) };
    }
    Ok(Spawned(pid as u32))
}

/// The spawned process until its exec: async-signal-safe calls only, no allocation, no return.
extern "C" fn job(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the `Plan` of `spawn`, whose thread sleeps until this process execs or
    // exits; every call below is async-signal-safe.
    unsafe {
        let plan = arg.cast::<Plan>();
        let fail = |err: libc::c_int| -> ! {
            std::ptr::write_volatile(&mut (*plan).err, err);
            libc::_exit(127)
        };
        let errno = || *libc::__errno_location();
        // First, with every signal still blocked: no handler of lockctl's may run here.
        crate::signals::for_the_job();
        if libc::setpgid(0, 0) != 0 {
            fail(errno());
        }
        if (*plan).pdeathsig
            && libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0,
                0,
                0,
            ) != 0
        {
            fail(errno());
        }
        if libc::getppid() != (*plan).parent {
            // lockctl died between the clone and prctl: nobody holds the lease for us.
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
        if let Err(e) = super::watcher::announce((*plan).watcher) {
            fail(match e.raw_os_error() {
                Some(libc::EPIPE) => WATCHER_GONE,
                other => other.unwrap_or(libc::EIO),
            });
        }
        // After the announcement: a stop from here on is the watcher's to cover, which has the
        // deadline and now the group.
        if super::watcher::boottime_ns() >= (*plan).deadline_ns {
            fail(LATE);
        }
        if (*plan).take_terminal {
            set_foreground(libc::getpid());
        }
        // Last: the mask lockctl was started with, so that a signal that came since the clone acts
        // now, with its default action.
        libc::pthread_sigmask(libc::SIG_SETMASK, &(*plan).mask, std::ptr::null_mut());
        libc::execvpe((*plan).file, (*plan).argv, (*plan).envp);
        fail(errno())
    }
}

/// The spawned process's stack until its exec: its own mapping, with a guard page below.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new(size: usize) -> io::Result<Stack> {
        const PAGE: usize = 4096;
        let len = size.div_ceil(PAGE) * PAGE + PAGE;
        // SAFETY: an anonymous private mapping of our own.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let stack = Stack { base, len };
        // SAFETY: the lowest page of our own mapping.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The top of the stack (it grows down), 16-byte aligned.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the end of our own mapping, whose length is a multiple of the page.
        unsafe { self.base.cast::<u8>().add(self.len).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: our own mapping, no longer used (the child has exec'd or exited).
        unsafe { libc::munmap(self.base, self.len) };
    }
}

/// True when stdin is a terminal whose foreground process group is ours.
fn owns_terminal() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp only read process state.
    unsafe { libc::isatty(0) == 1 && libc::tcgetpgrp(0) == libc::getpgrp() }
}

/// Makes `pgrp` the terminal's foreground group, with SIGTTOU blocked so a background caller is not
/// stopped for asking.
///
/// # Safety
/// Async-signal-safe; callable between fork and exec.
unsafe fn set_foreground(pgrp: libc::pid_t) {
    // SAFETY: sigset operations on a local set; tcsetpgrp on fd 0, which the caller checked is a tty.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTTOU);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        libc::tcsetpgrp(0, pgrp);
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
}

/// Takes the terminal back after the child, if the child had it.
pub fn reclaim_terminal() {
    // SAFETY: isatty/getpgrp/tcgetpgrp read state; set_foreground is safe on a tty.
    unsafe {
        if libc::isatty(0) == 1 {
            let ours = libc::getpgrp();
            let fg = libc::tcgetpgrp(0);
            if fg != ours && fg > 0 {
                set_foreground(ours);
            }
        }
    }
}

/// Blocks until a child of lockctl has exited and returns it, leaving it unreaped (a zombie) so that
/// its PID, and the group ID it uses, stay reserved. `Ok(None)`: lockctl has no child at all.
pub fn exited() -> io::Result<Option<(u32, Ended)>> {
    loop {
        // SAFETY: siginfo_t is plain data; waitid writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid out-pointer.
        let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            // SAFETY: after a successful waitid with WEXITED, si_pid and si_status are valid.
            let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
            let ended = match info.si_code {
                libc::CLD_EXITED => Ended::Exited(status),
                _ => Ended::Signaled(status),
            };
            return Ok(Some((pid as u32, ended)));
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ECHILD) => return Ok(None),
            _ => return Err(err),
        }
    }
}

/// Reaps `pid`, a child that has exited.
pub fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid on our own exited child.
    while unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) } < 0
        && io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
}

/// Sends `signal` to the job: its process group `pgid` (if still known), and every other descendant
/// of lockctl but its watcher `spare` (see `procs.rs`). Quietly skips what is gone.
pub fn kill_job(pgid: Option<u32>, signal: i32, spare: i32) {
    if let Some(pgid) = pgid {
        // SAFETY: killpg on a group we created; the caller guarantees the ID is not recycled.
        unsafe { libc::killpg(pgid as libc::pid_t, signal) };
    }
    super::procs::signal_descendants(signal, pgid.map_or(0, |g| g as i32), spare);
}

/// True while lockctl has a child other than its watcher `spare`, exited or not. Without one it has no
/// descendant in the job: it is their subreaper, so an orphan of the job becomes its child. The
/// watcher is lockctl's child only when lockctl is the first process of a PID namespace, which
/// adopts every orphan there; the kernel's lists of lockctl's children then tell it apart (where
/// the kernel keeps none, it counts as a child of the job, and lockctl waits for it). They are read
/// only then; a child is removed from them only when lockctl reaps it, which it does under the lock
/// its caller holds, so none is missed.
pub fn has_children(spare: i32) -> bool {
    // SAFETY: siginfo_t is plain data; waitid with WNOHANG | WNOWAIT only looks.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: waitid with a valid out-pointer.
    let rc = unsafe {
        libc::waitid(
            libc::P_ALL,
            0,
            &mut info,
            libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
        )
    };
    if rc < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ECHILD) {
        return false;
    }
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    if spare <= 0 || super::procs::read(spare).is_none_or(|w| w.ppid != me) {
        return true;
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return true;
    };
    let mut others = false;
    for task in tasks.flatten() {
        let Ok(list) = super::procs::read_proc(task.path().join("children")) else {
            return true;
        };
        others |= list
            .split_whitespace()
            .any(|c| !c.parse::<i32>().is_ok_and(|c| c == spare));
    }
    others
}
