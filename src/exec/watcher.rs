//! The watcher (`lockctl-guard`): a small process that kills the job if lockctl dies, and stops it
//! when the lease's deadline passes while lockctl cannot (it was stopped, SIGSTOP or a debugger).
//!
//! When lockctl dies, nobody renews the lease any more, and after the TTL another client may hold the
//! lock; no process of the job may run on then. A parent-death signal would reach only the direct
//! child: `sh -c 'sleep 30 | cat'` would leave `sleep` and `cat` running. A process group has no
//! parent-death signal, so a watcher does it:
//!
//! - lockctl forks it before the child, with a pipe whose write end only lockctl holds (close-on-exec,
//!   so the job never inherits it). The watcher blocks reading the other end. The kernel closes the
//!   write end when lockctl exits, however it exits (even SIGKILL), and the read returns end-of-file.
//! - **Started before the lock is won.** lockctl starts it on a thread of its own as it makes its
//!   first attempt, so that its start (two forks, an exec, a dynamic loading) overlaps the
//!   attempt's round trip and, under contention, the wait, instead of lying between the grant and
//!   the command, on every handoff's critical path. With `-n` (one attempt, nothing to overlap
//!   but its round trip, and often busy) it starts at the grant instead. Until lockctl sends the
//!   lease's first deadline, at the grant, and the job announces its group, it enforces nothing and
//!   looks for nothing: it sleeps in `poll` on its pipe without a timeout, so a lockctl that waits for hours
//!   costs nothing more than the process. End-of-file before any group was announced means no job
//!   was started (its first process holds the pipe's write end until it has announced its group
//!   and exec'd), so it exits at once: on every path where lockctl runs no command (busy, `-w` run
//!   out, a signal or an error during the wait, lockctl killed while waiting) nothing is left
//!   behind. A watcher stopped while lockctl waited would never read that end-of-file: lockctl
//!   resumes it first (`Drop for Starting`), and likewise one stopped while the job ran, once
//!   "done" is in its pipe ([`Watcher::done`]). Only a lockctl killed with SIGKILL leaves a
//!   stopped watcher stopped. A watcher gone, stopped or held by a debugger while lockctl waited (an unanchored
//!   `pkill lockctl`, `pkill -STOP lockctl-guard`, `gdb -p`) is replaced at the grant, once,
//!   before the job starts; so is one that has not said its first word by then (below).
//! - **Nothing starts past the lease.** lockctl can be stopped at any instruction between the
//!   grant and the command's exec, for longer than the lease, and another client then holds the
//!   lock. So the deadline is checked once the watcher is ready (exit 76, the command not run),
//!   and again by the command's first process, with `clock_gettime` alone, after it announced its
//!   group and just before its exec: a spawn that fails there (`ETIME`) is exit 76 too. From that
//!   last check on, the watcher has both the deadline and the group, and stops the job should the
//!   deadline pass with lockctl stopped.
//! - The child announces its process-group ID (its own PID) on the pipe itself, between fork and exec,
//!   before the job can start anything, so there is no moment when the job runs and the watcher does
//!   not know whom to kill.
//! - On end-of-file without a "done" byte first, the watcher waits until lockctl has finished
//!   exiting (the group becomes orphaned then, and an orphaned group with a stopped member gets
//!   SIGHUP and SIGCONT from the kernel), then stops the group (SIGSTOP, so that no
//!   member can leave it or die and cut the parent links the search follows), sends SIGKILL to every
//!   other process of the job it can find (below), then to the group, and exits. lockctl writes
//!   "done" once the whole job has exited, as soon as it knows, before the release. The command's
//!   first process has no parent-death signal while this watcher runs (it says so, see below): a
//!   first process killed by the kernel at lockctl's death, before the watcher stopped the group,
//!   would cut the parent links to what it started in other groups (`sh -c 'timeout 300 cmd'`),
//!   and those could no longer be told apart from other processes.
//! - **Processes that left the group** (`timeout`, `set -m`, `setsid`) are lockctl's descendants, not
//!   the group's members. While lockctl lives the watcher looks at lockctl's descendants in `/proc`
//!   every tenth of a second and remembers them; when lockctl dies they become init's orphans, the
//!   parent links that led to lockctl are gone, and the watcher kills what it remembers, their
//!   descendants, and the processes in the job's groups (`procs.rs`, [`Walker`]). It never takes a
//!   process for the job's on a guess (an orphan, a recent group leader): killing another command is
//!   as bad as missing one of the job. Its limit: a process that moved to a group of its own less
//!   than a tenth of a second before lockctl's death, and whose parent exited before the watcher
//!   stopped the job's group, is not found.
//! - **A name of its own.** It is not a fork of lockctl left running but lockctl's binary started
//!   again (`/proc/self/exe`) with the command line
//!   `lockctl-guard --lockctl-guard PID:START KILL_AFTER_NS`
//!   and the process name `lockctl-guard`, which `main` recognises before parsing anything. So
//!   `pkill -f 'exec NAME'` and `killall lockctl` kill lockctl and not its watcher, which then kills
//!   the job. An unanchored `pkill lockctl` matches both. Should the exec fail (no `/proc`), the
//!   forked copy watches by itself, without looking for processes that left the group; the command's
//!   first process then keeps the parent-death signal (SIGKILL).
//! - **A pipe back** whose write end only the watcher holds. Its first word says how the watcher
//!   runs (exec'd or the forked copy) and its PID; lockctl waits for it, after the grant, before
//!   starting the command, up to [`READY_WAIT_MS`] after the watcher's start and never past the
//!   lease's deadline. The middle process of the double fork writes the watcher's PID there too
//!   before it exits, so that one stopped before its own first word (`pkill -STOP lockctl-guard`
//!   just as it starts) is seen stopped and replaced at once, not waited for until the lease runs
//!   out. A watcher still silent at the end of the wait counts as gone. At the grant one stopped by
//!   a signal counts as stopped at once, and one at a tracer's stop after [`HELD_LOOKS`] looks in a
//!   row. Then a thread of lockctl polls
//!   the read end: it hangs up the moment the watcher is gone, however it went, and every tenth of
//!   a second the thread checks that the watcher is not stopped. Either way the watcher no longer
//!   guards the job (lockctl's death would leave it running), so lockctl stops the job as for a
//!   lost lease and exits 76. lockctl's writes to the watcher never block (the pipe is
//!   non-blocking, and a full one, a watcher that does not read, counts as gone): the renewal
//!   thread writes each deadline while it holds the deadline's lock, which the deadline timer
//!   needs to stop the job.
//! - **The deadline backstop.** lockctl's deadline timer is a thread inside lockctl: a stopped lockctl
//!   runs no threads, while its job, in a group of its own, runs on after the key expires in Redis and
//!   another client holds the lock. So the watcher enforces the deadline too. lockctl sends it each
//!   new deadline (boot-time nanoseconds) *before* extending its own, and only while the old one has
//!   not passed, checked again after the write; the watcher reads the clock, then drains the pipe,
//!   then decides, so a new deadline always reaches it before it could act on the old one. When the
//!   deadline passes with no extension it applies the same policy as lockctl: SIGTERM to the group,
//!   SIGKILL `--kill-after` later. When lockctl handles a lost lease itself it says so, and the
//!   watcher sends no SIGTERM, only a SIGKILL a little after lockctl's, as a backstop should lockctl
//!   be stopped in between. Both may send the SIGTERM when both see the same deadline pass; the
//!   watcher's SIGKILL then waits for `--kill-after` after lockctl's SIGTERM too. `poll`'s
//!   timeout runs on the monotonic clock, which stops during a suspend, so no wait is longer than a
//!   second before the boot-time clock is read again.
//! - Between fork and exec (and in the fallback copy) the watcher only makes async-signal-safe calls
//!   (lockctl has threads, and only the forking thread exists in the copy): `fork`, `sigprocmask`,
//!   `setpgid`, `dup2`/`fcntl`, `close_range`/`close`, `execve`, `getpid`, `write`, `poll`, `read`,
//!   `clock_gettime`, `killpg`, `_exit`; it allocates nothing (the exec's arguments are built before
//!   the fork). It blocks every signal, closes every other
//!   descriptor (it must not hold the terminal, lockctl's output pipes or its Redis connections), and
//!   sits in a process group of its own, so a signal sent to lockctl's job (a shell's `kill %1`,
//!   Ctrl-C) does not take it along.
//! - It is forked twice, the middle process exiting at once (lockctl reaps it through a pidfd, and
//!   kills it if it has not exited within [`MIDDLE_WAIT_MS`]: a stopped one would hold lockctl for
//!   good; the start then counts as failed and is made again at the grant), so that it is not
//!   lockctl's child:
//!   lockctl's children are the job's processes only, whoever lists them, and lockctl's reaper never
//!   meets it. (lockctl becomes a subreaper only after this, or the watcher would come back to it.)
//!   One exception: a lockctl that is the first process of a PID namespace (a container without an
//!   init) adopts every orphan there, its watcher too. It then knows the watcher's PID from its
//!   first word, and neither waits for it nor signals it (`child::has_children`,
//!   `procs::signal_descendants`).
//!
//! **Why the group ID cannot be another process's.** Linux keeps a PID number allocated while any
//! process uses it as its PID, process-group ID or session ID, zombies included. The job's group `P` is
//! the direct child's PID, so `P` cannot be reused while any member of the group exists, even one that
//! has exited and awaits reaping. lockctl reaps the direct child itself and, just before, tells the
//! watcher to forget the group: from then on it never signals `P` as a group, and finds the group's
//! members by looking, matching their group ID against `P` (which stays reserved while any of them
//! exists; once none does, a process matched against a recycled `P` must also have started after
//! lockctl in its session). So a `killpg(P)` from the watcher can only reach a recycled `P` if the
//! kernel handed out the freed number again, as a group ID, between the watcher reading its pipe and
//! its `killpg`: PIDs are allocated cyclically, so that needs the whole PID space to wrap around in
//! that moment.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::procs::{pidfd_open, pidfd_signal, Walker};
use crate::clock::Stamp;

/// The announcement the child writes: this tag, then its group ID as 4 native-endian bytes.
pub const GROUP_TAG: u8 = b'g';
/// A new lease deadline: this tag, then boot-time nanoseconds as 8 native-endian bytes.
const DEADLINE_TAG: u8 = b't';
/// Written by lockctl when it stops the job for a lost lease itself.
const HANDLING: u8 = b'l';
/// Written by lockctl once the group has exited.
const DONE: u8 = b'd';
/// Written by lockctl before it reaps the job's first process: the group's ID may be reused once
/// the group is empty, so it is no longer signalled as a whole.
const FORGET: u8 = b'f';
/// The watcher's first argument after exec; `main` looks for it before parsing the command line.
pub const GUARD_ARG: &str = "--lockctl-guard";
/// Its process name (`comm`) and `argv[0]`: not lockctl's, so `killall lockctl` and
/// `pkill -f 'exec NAME'` spare it.
const GUARD_NAME: &[u8] = b"lockctl-guard\0";
/// The descriptor the exec'd watcher reads its pipe from.
const GUARD_FD: RawFd = 3;
/// The descriptor of the watcher's pipe back to lockctl: only the watcher holds its write end, so
/// lockctl sees it hang up the moment the watcher is gone.
const BACK_FD: RawFd = 4;
/// Sent back once the watcher runs as `lockctl-guard`, able to find the job's processes.
const READY_EXEC: u8 = b'x';
/// Sent back by the forked copy when the exec failed: it can only signal the job's group.
const READY_COPY: u8 = b'c';
/// Sent back by the middle process of the double fork, with the watcher's PID, before it exits:
/// lockctl knows whom to look at even if the watcher is stopped before its own first word.
const SPAWNED: u8 = b'p';
/// How long after its start lockctl waits for the watcher's first word, and never past the lease's
/// deadline; a watcher silent by then counts as gone.
const READY_WAIT_MS: libc::c_int = 10_000;
/// Looks at the grant, [`HELD_LOOK_MS`] apart, that must all find the watcher at a tracer's stop
/// before it counts as held by a debugger: `strace -f` stops it for a moment at each system call.
const HELD_LOOKS: u32 = 20;
/// The pause between two of those looks (a fifth of a second in all).
const HELD_LOOK_MS: u64 = 10;
/// How often lockctl checks that its watcher is not stopped.
const CHECK_MS: libc::c_int = 100;
/// While lockctl waits for a silent watcher's first word at the grant, how often it looks for a
/// signal that came meanwhile (which ends the wait, and lockctl, without the command).
const SIGNAL_LOOK_MS: u64 = 100;
/// The bytes the words that may follow the last deadline take at most: the job's group (5), then
/// FORGET, HANDLING and DONE (1 each), with room to spare.
const WORDS_AFTER: libc::c_int = 16;
/// How long lockctl waits for the double fork's middle process to exit (it does at once, unless
/// it is stopped).
const MIDDLE_WAIT_MS: u64 = 2000;
/// Looks in a row that must find the watcher at a tracer's stop before it counts as stopped (a
/// second): `strace -f` stops it for a moment at each system call.
const TRACED_LOOKS: u32 = 10;
/// How often the exec'd watcher looks for the job's processes while lockctl lives.
const WALK_MS: u64 = 100;
/// The longest wait in one `poll`: its timeout runs on the monotonic clock, which stops during a
/// suspend, so the boot-time clock is read again at least this often.
const RECHECK_MS: u64 = 1000;
/// When lockctl handles a lost lease itself, the watcher's SIGKILL comes this much after lockctl's,
/// should lockctl be stopped or gone by then.
const BACKSTOP_GRACE: Duration = Duration::from_secs(1);

/// The lockctl side of the pipe to the watcher, shared by the threads that report to it, and the
/// PID that lockctl's looks for its job's processes must spare: the watcher's while it lives, if it
/// is lockctl's own child (lockctl is the first process of a PID namespace), else 0 (see
/// [`Link::pid`]).
#[derive(Clone)]
pub struct Link(Arc<OwnedFd>, Arc<AtomicI32>);

impl Link {
    /// One message, written whole or not at all: shorter than PIPE_BUF, so atomic among writers, on a
    /// non-blocking pipe. False if the watcher is gone (EPIPE, with SIGPIPE ignored by the Rust
    /// runtime) or does not read (EAGAIN: its pipe is full, it is stopped); a caller never blocks,
    /// whatever lock it holds.
    ///
    /// EPIPE says the pipe has no reader left: the watcher is gone ([`Link::gone`]), even when a
    /// process of the user holds another write end of its pipe back, which keeps that pipe from
    /// hanging up. errno is left as the write set it.
    fn send(&self, msg: &[u8]) -> bool {
        // SAFETY: a write from a live buffer on our own pipe.
        let written = unsafe { libc::write(self.0.as_raw_fd(), msg.as_ptr().cast(), msg.len()) };
        if written < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EPIPE) {
            self.gone();
        }
        written == msg.len() as isize
    }

    /// The watcher's PID while it is lockctl's child and lives, which lockctl's waits for the job
    /// and its kills must spare; 0 when there is none to spare. The watcher is lockctl's child only
    /// when lockctl is the first process of a PID namespace, which adopts every orphan there, the
    /// double-forked watcher too. Anywhere else the watcher is never among lockctl's descendants,
    /// so a child of lockctl with the watcher's PID can only be a process of the job that took it
    /// once the watcher died (unseen yet: lockctl's monitor no longer looks once it has reported
    /// the watcher stopped, and wakes to a hang-up only when scheduled), and must not be spared.
    pub fn pid(&self) -> libc::pid_t {
        self.1.load(Ordering::SeqCst)
    }

    /// The watcher is gone (its pipe back hung up, or lockctl reaped it): its PID is no longer
    /// its own, and the process that takes it next, a member of the job that lockctl adopted
    /// perhaps, is no longer spared as the watcher ([`Link::pid`] is 0 from now on).
    pub fn gone(&self) {
        self.1.store(0, Ordering::SeqCst);
    }

    /// Tells the watcher the lease now runs until `at`, if the deadline leaves room in the pipe for
    /// the words that end the watcher's watch ([`deadline_fits`]): a stopped watcher does not read,
    /// and renewals through a long stop of the job would fill its pipe ([`Watcher::done`] resumes
    /// a stopped watcher only once "done" is in it). A deadline not written counts as failed: the
    /// watcher does not read. The pipe's capacity is asked each time: a process of the same user
    /// may resize it through `/proc/PID/fd`.
    pub fn deadline(&self, at: Stamp) -> bool {
        let fd = self.0.as_raw_fd();
        let mut queued: libc::c_int = 0;
        // SAFETY: F_GETPIPE_SZ and FIONREAD on our own pipe, the latter into a live integer; and
        // sysconf, which reads a value the kernel gave the process.
        let (capacity, asked, page) = unsafe {
            (
                libc::fcntl(fd, libc::F_GETPIPE_SZ),
                libc::ioctl(fd, libc::FIONREAD, &mut queued),
                libc::sysconf(libc::_SC_PAGESIZE),
            )
        };
        if capacity > 0 && asked == 0 && !deadline_fits(capacity, queued, page as libc::c_int) {
            return false;
        }
        let mut msg = [DEADLINE_TAG; 9];
        msg[1..].copy_from_slice(&(at.since_boot().as_nanos() as u64).to_ne_bytes());
        self.send(&msg)
    }

    /// The job's first process, whose PID is the group's ID, is about to be reaped: the ID may be
    /// reused from then on, so the watcher stops signalling it as a group (the walker still finds
    /// the group's members).
    pub fn forget_group(&self) {
        self.send(&[FORGET]);
    }

    /// lockctl is stopping the job for a lost lease itself: the watcher sends no SIGTERM of its own.
    pub fn handling(&self) {
        self.send(&[HANDLING]);
    }
}

/// Whether a 9-byte deadline may go into a pipe of `capacity` bytes that holds `queued` unread
/// bytes, so that the [`WORDS_AFTER`] bytes of words after it still fit whatever the reader did.
///
/// A pipe's room is allotted by the page, not the byte: a write that does not fit whole in the last
/// page's rest takes a new page, and a page partly read stays taken until it is read to its end. So
/// with three pages or more, two pages' worth of bytes stay free, one for a head page partly read
/// and one for the last page's rest, and 8 bytes more for each page, the most a page can lose at its
/// end (a 9-byte deadline that did not fit there). A pipe of two pages
/// (what an unprivileged user past `fs.pipe-user-pages-soft` gets) keeps its deadlines within one
/// page's worth, less the words: a head page partly read then leaves the second page with room for
/// them, and otherwise the first has it. A pipe of one page (only a resize through `/proc` makes
/// one) takes no deadline: a page partly read can be full with any count of bytes.
fn deadline_fits(capacity: libc::c_int, queued: libc::c_int, page: libc::c_int) -> bool {
    let page = page.max(1);
    let room = match capacity / page {
        0 | 1 => return false,
        2 => page - WORDS_AFTER,
        pages => capacity - 2 * page - 8 * pages,
    };
    queued + 9 <= room
}

/// A running watcher.
pub struct Watcher {
    link: Link,
    /// The read end of the watcher's pipe back.
    back: Arc<OwnedFd>,
    /// The watcher runs as `lockctl-guard` (it said so), not as the forked copy.
    exec: bool,
    /// The watcher itself, for the signals that let it go.
    pinned: Option<Pinned>,
    /// The watcher's PID, for the monitor's looks at its state.
    pid: libc::pid_t,
}

/// A watcher started before the lock is won, whose first word lockctl has not read yet: it
/// enforces nothing until it is sent the lease's deadline, and looks for no process until the job
/// announces its group.
pub struct Starting {
    link: Link,
    back: Arc<OwnedFd>,
    /// When it was started: its first word is awaited until [`READY_WAIT_MS`] after this.
    since: Instant,
    kill_after: Duration,
    /// The watcher, once a word on the pipe back gave its PID.
    spawned: Option<Pinned>,
    /// Handed over as a [`Watcher`], or already let go: dropping it does nothing more.
    settled: bool,
}

impl Watcher {
    /// Starts the watcher, which will enforce the lease's deadlines with the stop policy (SIGTERM,
    /// then SIGKILL `kill_after` later) once it is told the first one ([`Starting::ready`]);
    /// returns as soon as it runs, without waiting for its first word.
    pub fn start(kill_after: Duration) -> io::Result<Starting> {
        let since = Instant::now();
        let (read, write) = pipe()?;
        let (back, back_write) = pipe()?;
        // SAFETY: fcntl on our own descriptor.
        if unsafe { libc::fcntl(write.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let link = Link(Arc::new(write), Arc::new(AtomicI32::new(0)));
        let ns = kill_after.as_nanos().min(u64::MAX as u128) as u64;
        // Everything exec needs is built before the clone: the copy may not allocate.
        let exe = c"/proc/self/exe";
        let me = std::process::id() as i32;
        let start = super::procs::read(me).map_or(0, |p| p.start);
        let pid = std::ffi::CString::new(format!("{me}:{start}")).map_err(io::Error::other)?;
        let ns_arg = std::ffi::CString::new(ns.to_string()).map_err(io::Error::other)?;
        let argv = [
            GUARD_NAME.as_ptr().cast::<libc::c_char>(),
            c"--lockctl-guard".as_ptr(),
            pid.as_ptr(),
            ns_arg.as_ptr(),
            std::ptr::null(),
        ];
        let envp = [std::ptr::null::<libc::c_char>()];
        // SAFETY: fork has no preconditions; the copy only forks the watcher and exits (below).
        let middle = unsafe { libc::fork() };
        if middle == 0 {
            // SAFETY: in the forked copy, async-signal-safe calls only; `watch` never returns.
            unsafe {
                match libc::fork() {
                    pid @ 1.. => {
                        // Before any word of the watcher's in the common case, not always (the
                        // reader takes both orders). A write of 5 bytes, less than PIPE_BUF, on a
                        // pipe nobody has filled: whole, at once.
                        let mut word = [SPAWNED; 5];
                        word[1..].copy_from_slice(&pid.to_ne_bytes());
                        libc::write(back_write.as_raw_fd(), word.as_ptr().cast(), word.len());
                        libc::_exit(0)
                    }
                    0 => {
                        isolate(read.as_raw_fd(), back_write.as_raw_fd());
                        libc::execve(exe.as_ptr(), argv.as_ptr(), envp.as_ptr());
                        // No exec (no /proc?): watch from this copy, without looking for
                        // processes that left the group.
                        say_ready(READY_COPY);
                        watch(GUARD_FD, ns, None)
                    }
                    _ => libc::_exit(1),
                }
            }
        }
        if middle < 0 {
            return Err(io::Error::last_os_error());
        }
        drop(back_write);
        if !reap_middle(middle)? {
            return Err(io::Error::other("cannot fork the watcher process"));
        }
        Ok(Starting {
            link,
            back: Arc::new(back),
            since,
            kill_after,
            spawned: None,
            settled: false,
        })
    }

    /// The descriptor on which the child announces its group (see [`announce`]).
    pub fn fd(&self) -> RawFd {
        self.link.0.as_raw_fd()
    }

    /// A handle for the threads that report deadlines and lease losses.
    pub fn link(&self) -> Link {
        self.link.clone()
    }

    /// True if the watcher runs as `lockctl-guard`: it then stops the job's group and finds every
    /// process it can tell is the job's when lockctl dies, so the command's first process must not
    /// die before it (no parent-death signal, see `child.rs`).
    pub fn exec(&self) -> bool {
        self.exec
    }

    /// Watches the watcher on a thread of its own: `report(Some(why))` once, the moment it is gone
    /// or found stopped (it no longer guards the job then), and `report(None)` every
    /// [`CHECK_MS`], which returns false once the thread is no longer needed.
    pub fn monitor(
        &self,
        mut report: impl FnMut(Option<&str>) -> bool + Send + 'static,
    ) -> io::Result<()> {
        let back = Arc::clone(&self.back);
        let link = self.link.clone();
        let pid = self.pid;
        // Consecutive looks that found the watcher at a tracer's stop: a traced process passes
        // through one at every system call, so only one that lasts counts (a debugger's).
        let mut traced = 0u32;
        std::thread::Builder::new()
            .name("watcher-check".into())
            .stack_size(64 * 1024)
            .spawn(move || loop {
                let mut pfd = libc::pollfd {
                    fd: back.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: poll on our own descriptor.
                let ready = unsafe { libc::poll(&mut pfd, 1, CHECK_MS) };
                let mut gone = None;
                if ready > 0 {
                    let mut buf = [0u8; 16];
                    // SAFETY: a read into a live buffer from our own pipe.
                    let n =
                        unsafe { libc::read(back.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                    if n == 0
                        || (n < 0
                            && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted)
                    {
                        link.gone();
                        gone = Some("is gone");
                    }
                } else {
                    match super::procs::stop_state(pid) {
                        Some('T') => gone = Some("is stopped"),
                        Some(_) => {
                            traced += 1;
                            if traced >= TRACED_LOOKS {
                                gone = Some("is stopped by a debugger");
                            }
                        }
                        None => traced = 0,
                    }
                }
                if let Some(why) = gone {
                    report(Some(why));
                    return;
                }
                if !report(None) {
                    return;
                }
            })?;
        Ok(())
    }

    /// The group has exited: the watcher stands down. One stopped while the job ran (lockctl then
    /// stopped the job for it) would read the word only once resumed, and would stay behind for
    /// good: it is resumed once the word is in its pipe (killed, as lockctl's own child, when
    /// lockctl is a PID 1). A word that does not fit (a pipe left full: resized by another process
    /// of the user through `/proc` while the watcher was stopped) has the watcher killed instead:
    /// with the group gone it has nothing left to guard, and resumed without the word it would take
    /// the pipe's end for lockctl's death and signal the group's ID, which another process may hold
    /// by then. The signal goes through the pidfd, never by PID ([`Pinned::signal`]).
    ///
    /// Only a full pipe (EAGAIN: its read end still open) has it killed. A write that fails for a
    /// watcher gone (EPIPE) signals nothing: gone, and reaped by lockctl when lockctl is a PID 1,
    /// its PID may already be another process's, one of lockctl's children too.
    pub fn done(self) {
        let told = self.link.send(&[DONE]);
        let full = !told && io::Error::last_os_error().raw_os_error() == Some(libc::EAGAIN);
        if let Some(w) = &self.pinned {
            if told {
                w.let_go_if_stopped();
            } else if full {
                w.signal(libc::SIGKILL);
            }
        }
    }
}

/// A watcher being started while lockctl asks for the lock: on a thread of its own, so that its
/// forks overlap the first attempt's round trip, or, where no thread could be started, already
/// started on the calling one.
pub enum Launch {
    Thread(StartThread, Duration),
    Here(io::Result<Starting>, Duration),
    /// Not started yet: it starts at the grant.
    Later(Duration),
}

/// The thread a watcher is started on while lockctl asks for the lock. Dropped without being
/// joined (lockctl ends without a grant), it is joined all the same: a start still waiting for a
/// stopped middle process ends within [`MIDDLE_WAIT_MS`] by killing it, which a thread that died
/// with lockctl's exit would not do (the stopped middle process, a copy of lockctl, would stay).
/// The start's result is then dropped, which lets go of the watcher (`Drop for Starting`).
pub struct StartThread(Option<std::thread::JoinHandle<io::Result<Starting>>>);

impl StartThread {
    fn join(&mut self) -> io::Result<Starting> {
        match self.0.take() {
            Some(thread) => thread
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("the watcher's start failed"))),
            None => Err(io::Error::other("the watcher's start was already taken")),
        }
    }
}

impl Drop for StartThread {
    fn drop(&mut self) {
        let _ = self.join();
    }
}

impl Launch {
    /// Starts the watcher (see [`Watcher::start`]).
    pub fn new(kill_after: Duration) -> Launch {
        let spawned = std::thread::Builder::new()
            .name("watcher-start".into())
            .stack_size(64 * 1024)
            .spawn(move || Watcher::start(kill_after));
        match spawned {
            Ok(thread) => Launch::Thread(StartThread(Some(thread)), kill_after),
            Err(_) => Launch::Here(Watcher::start(kill_after), kill_after),
        }
    }

    /// For one attempt (`-n`): the watcher starts only once the lock is won. A start that overlaps
    /// the attempt gains its round trip on a free lock (0.95x) but is thrown away on a busy one,
    /// which then costs 1.33x (`bench/RESULTS.md`), and a cron job's `-n` is often busy.
    pub fn at_grant(kill_after: Duration) -> Launch {
        Launch::Later(kill_after)
    }

    /// Once the lock is won: the watcher, started, ready and told the lease's `deadline` (see
    /// [`Starting::ready`]). A start made while lockctl waited that failed (its middle process
    /// stopped past [`MIDDLE_WAIT_MS`], a fork refused) is made again, once.
    pub fn ready(self, deadline: Stamp, stop: &mut dyn FnMut() -> bool) -> io::Result<Watcher> {
        let starting = match self {
            Launch::Thread(mut thread, kill_after) => {
                thread.join().or_else(|_| Watcher::start(kill_after))?
            }
            Launch::Here(started, kill_after) => started.or_else(|_| Watcher::start(kill_after))?,
            Launch::Later(kill_after) => Watcher::start(kill_after)?,
        };
        starting.ready(deadline, stop)
    }
}

impl Starting {
    /// Once the lock is won: waits for the watcher's first word (it has mostly come by then), and
    /// sends it the lease's `deadline`, before the job can start. A watcher that went away, was
    /// stopped or held by a debugger while lockctl waited for the lock, or is still silent, is
    /// replaced by a new one, started now, once; neither is waited for past the deadline.
    /// `stop` is asked between the waits for a silent watcher, at least every [`SIGNAL_LOOK_MS`]:
    /// true (a signal came) ends the wait with an error of kind `Interrupted`.
    pub fn ready(self, deadline: Stamp, stop: &mut dyn FnMut() -> bool) -> io::Result<Watcher> {
        let kill_after = self.kill_after;
        if let Some(watcher) = self.answer(deadline, stop)? {
            return Ok(watcher);
        }
        if deadline.passed() {
            return Err(io::Error::other(
                "the watcher process did not answer before the lease ran out",
            ));
        }
        crate::trace!("the watcher process is gone, stopped or silent; starting another");
        Watcher::start(kill_after)?
            .answer(deadline, stop)?
            .ok_or_else(|| {
                io::Error::other("the watcher process ended, stopped or stayed silent at its start")
            })
    }

    /// The watcher, ready and told the deadline; `None` if it is gone, stopped, held by a debugger,
    /// or has not said its first word by [`READY_WAIT_MS`] after its start or by the deadline.
    fn answer(
        mut self,
        deadline: Stamp,
        stop: &mut dyn FnMut() -> bool,
    ) -> io::Result<Option<Watcher>> {
        let until = self.since + Duration::from_millis(READY_WAIT_MS as u64);
        // The watcher's PID, from the middle process's word, which comes first but for a rare
        // preemption: from then on a silent watcher is looked at every [`HELD_LOOK_MS`], and one
        // stopped before its own first word (`pkill -STOP lockctl-guard` as it starts) is
        // replaced at once, not waited for until the lease runs out.
        let word = loop {
            let left = until
                .saturating_duration_since(Instant::now())
                .min(deadline.remaining());
            if stop() {
                return Err(io::ErrorKind::Interrupted.into());
            }
            let wait = match self.spawned {
                Some(_) => left.min(Duration::from_millis(HELD_LOOK_MS)),
                None => left.min(Duration::from_millis(SIGNAL_LOOK_MS)),
            };
            match self.word(wait)? {
                Heard::Word(word) if word[0] == SPAWNED => self.learn(word),
                Heard::Word(word) => break word,
                Heard::Gone => return Ok(None),
                Heard::Silent => match &self.spawned {
                    Some(w) if held(w.pid, deadline) => {
                        w.let_go();
                        self.settled = true;
                        return Ok(None);
                    }
                    // Silent until now, and until the end of the wait: still starting (a
                    // loaded machine), or stopped before its exec with its PID unknown. Nothing
                    // could check on it once the job runs; it counts as gone, and exits at the
                    // end-of-file once it reads its pipe (this value closes it).
                    _ if wait >= left => return Ok(None),
                    _ => {}
                },
            }
        };
        let pid = pid_in(word);
        self.learn(word);
        if held(pid, deadline) {
            // Stopped, or held by a debugger, while lockctl waited: it would guard nothing, and
            // the job would be stopped for it a moment after it started.
            if let Some(w) = &self.spawned {
                w.let_go();
            }
            self.settled = true;
            return Ok(None);
        }
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        let child = super::procs::read(pid).is_some_and(|w| w.ppid == me);
        let link = Link(
            Arc::clone(&self.link.0),
            Arc::new(AtomicI32::new(if child { pid } else { 0 })),
        );
        // A write that fails finds the watcher gone (EPIPE): nobody reads the pipe.
        if !link.deadline(deadline) {
            return Ok(None);
        }
        self.settled = true;
        Ok(Some(Watcher {
            link,
            back: Arc::clone(&self.back),
            exec: word[0] == READY_EXEC,
            pinned: self.spawned.take(),
            pid,
        }))
    }
}

/// A watcher lockctl gives up without running a command (busy, `-w` run out, a signal during the
/// wait) exits at the end-of-file of its pipe, which closes right after this; one stopped while
/// lockctl waited (`pkill -STOP lockctl-guard`) would never read it, and would stay behind for
/// good: it is resumed first (killed, as lockctl's own child, when lockctl is a PID 1). Only a
/// process that is stopped and still runs as this lockctl's watcher is touched.
impl Drop for Starting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        while self.spawned.is_none() {
            match self.word(Duration::ZERO) {
                Ok(Heard::Word(word)) => self.learn(word),
                _ => return,
            }
        }
        if let Some(w) = &self.spawned {
            w.let_go_if_stopped();
        }
    }
}

impl Starting {
    /// Takes the watcher's PID from a word on the pipe back (the middle process's or its own),
    /// once.
    fn learn(&mut self, word: [u8; 5]) {
        if self.spawned.is_none() {
            self.spawned = Some(Pinned::new(pid_in(word), &self.back));
        }
    }
}

/// The watcher, held by a pidfd (Linux 5.3 and later) so that a signal lockctl sends it never
/// reaches another process: a stopped watcher may be killed by anyone and reaped by init while
/// lockctl is itself stopped, and its PID handed out again. The pidfd is opened once the PID is
/// known and kept only if the pipe back had not hung up by then: the watcher, that pipe's only
/// writer, was alive, so the PID was still its own when the pidfd took it. Where pidfds are
/// missing (Linux before 5.3, a seccomp profile that denies them), a signal by PID could reach a
/// process that took the PID between any check and the signal, so none is sent, but to a watcher
/// that is lockctl's own unreaped child (lockctl a PID 1), whose PID nobody else can have: a
/// stopped watcher then stays stopped.
struct Pinned {
    pid: libc::pid_t,
    fd: Option<OwnedFd>,
    /// The pipe back had hung up: the watcher is gone, and nothing is signalled.
    gone: bool,
}

impl Pinned {
    fn new(pid: libc::pid_t, back: &OwnedFd) -> Pinned {
        let fd = pidfd_open(pid).ok();
        let mut pfd = libc::pollfd {
            fd: back.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll on our own descriptor, without waiting.
        let hung_up = unsafe { libc::poll(&mut pfd, 1, 0) } > 0 && pfd.revents & libc::POLLHUP != 0;
        Pinned {
            pid,
            fd,
            gone: hung_up,
        }
    }

    /// Sends `signal` to the watcher, and to no other process.
    fn signal(&self, signal: libc::c_int) {
        if self.gone {
            return;
        }
        match &self.fd {
            Some(fd) => pidfd_signal(fd, signal),
            None => {
                // SAFETY: getpid has no preconditions.
                let me = unsafe { libc::getpid() };
                if super::procs::read(self.pid).is_some_and(|w| w.ppid == me) {
                    // SAFETY: kill on lockctl's own child, not reaped yet: its PID is its own.
                    unsafe { libc::kill(self.pid, signal) };
                }
            }
        }
    }

    /// Lets go of a watcher found stopped or held at the grant, which is replaced, or left when
    /// lockctl ends. It is resumed, and exits at the end-of-file of its pipe, which closes as
    /// lockctl drops it (nothing else would resume it: a stopped one would stay for good); a
    /// debugger's hold ends when the debugger lets go. lockctl's child (lockctl is a PID 1, see the
    /// module docs) is killed instead, or lockctl would wait for it as for the job.
    fn let_go(&self) {
        // SAFETY: getpid has no preconditions.
        let me = unsafe { libc::getpid() };
        if super::procs::read(self.pid).is_some_and(|w| w.ppid == me) {
            self.signal(libc::SIGKILL);
        } else {
            self.signal(libc::SIGCONT);
        }
    }

    /// [`Pinned::let_go`] if the watcher is stopped by a signal.
    fn let_go_if_stopped(&self) {
        if !self.gone && super::procs::stop_state(self.pid) == Some('T') {
            self.let_go();
        }
    }
}

/// Reaps the double fork's middle process, which exits as soon as it has forked the watcher;
/// true if it exited 0. Its exit is awaited for [`MIDDLE_WAIT_MS`] at most: one stopped (a `kill
/// -STOP` of lockctl's children) would otherwise hold lockctl for good, past the lease and deaf to
/// signals. It is killed then (lockctl's own unreaped child: its PID is its own), and the start
/// counts as failed. SIGKILL ends a stopped process at once, but a frozen one (a cgroup freezer)
/// only once it thaws: that exit is awaited as long again, and past it the process is left
/// unreaped (a zombie of lockctl's once it thaws) rather than lockctl held.
fn reap_middle(middle: libc::pid_t) -> io::Result<bool> {
    // lockctl's own child, not reaped yet: the PID is still its own.
    let pidfd = pidfd_open(middle).ok();
    let wait = Duration::from_millis(MIDDLE_WAIT_MS);
    let status = match reaped_within(middle, pidfd.as_ref(), wait)? {
        Some(status) => status,
        None => {
            // SAFETY: kill on lockctl's own child, not reaped yet.
            unsafe { libc::kill(middle, libc::SIGKILL) };
            match reaped_within(middle, pidfd.as_ref(), wait)? {
                Some(status) => status,
                None => return Ok(false),
            }
        }
    };
    Ok(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0)
}

/// The wait status of lockctl's child `pid` once it has exited and is reaped, within `wait`; None
/// if it has not exited by then. Woken by its pidfd; without one (Linux before 5.3) it looks every
/// 10 ms.
fn reaped_within(
    pid: libc::pid_t,
    pidfd: Option<&OwnedFd>,
    wait: Duration,
) -> io::Result<Option<libc::c_int>> {
    let until = Instant::now() + wait;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on lockctl's own child, without blocking.
        match unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } {
            p if p == pid => return Ok(Some(status)),
            0 => {}
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
            _ => return Err(io::Error::last_os_error()),
        }
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        match pidfd {
            Some(fd) => {
                let mut pfd = libc::pollfd {
                    fd: fd.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                let ms = left.as_nanos().div_ceil(1_000_000) as libc::c_int;
                // SAFETY: poll on our own descriptor, bounded; an interruption looks again.
                unsafe { libc::poll(&mut pfd, 1, ms) };
            }
            None => std::thread::sleep(left.min(Duration::from_millis(10))),
        }
    }
}

/// What one wait on the pipe back brought.
enum Heard {
    /// A whole word: the middle process's ([`SPAWNED`]) or the watcher's first.
    Word([u8; 5]),
    /// Hung up, with or without a word: the watcher is gone.
    Gone,
    /// Nothing within the wait.
    Silent,
}

impl Starting {
    /// The next word on the pipe back, waited for up to `wait` (rounded up to the millisecond, so
    /// that a wait bounded by the deadline does not end just before it).
    fn word(&self, wait: Duration) -> io::Result<Heard> {
        let mut pfd = libc::pollfd {
            fd: self.back.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = wait.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int;
        loop {
            // SAFETY: poll on our own descriptor, bounded.
            match unsafe { libc::poll(&mut pfd, 1, ms) } {
                0 => return Ok(Heard::Silent),
                n if n > 0 => break,
                _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => continue,
                _ => return Err(io::Error::last_os_error()),
            }
        }
        let mut word = [0u8; 5];
        // SAFETY: a read into a live buffer from our own pipe, which has data or hung up. Each
        // word is shorter than PIPE_BUF, so it was written, and is read, whole.
        let n = unsafe { libc::read(self.back.as_raw_fd(), word.as_mut_ptr().cast(), word.len()) };
        if n != word.len() as isize || pfd.revents & libc::POLLHUP != 0 {
            return Ok(Heard::Gone);
        }
        Ok(Heard::Word(word))
    }
}

/// The PID a word on the pipe back carries.
fn pid_in(word: [u8; 5]) -> libc::pid_t {
    libc::pid_t::from_ne_bytes([word[1], word[2], word[3], word[4]])
}

/// True if the watcher `pid` is stopped by a signal (`T`), or sits at a tracer's stop (`t`) on
/// every look for [`HELD_LOOKS`] looks, or until `deadline`: a debugger's hold, not a traced
/// system call's moment.
fn held(pid: libc::pid_t, deadline: Stamp) -> bool {
    for look in 0..HELD_LOOKS {
        match super::procs::stop_state(pid) {
            Some('T') => return true,
            Some(_) if look + 1 == HELD_LOOKS || deadline.passed() => return true,
            Some(_) => std::thread::sleep(Duration::from_millis(HELD_LOOK_MS)),
            None => return false,
        }
    }
    false
}

/// Tells lockctl, on the pipe back, how the watcher runs and its PID (lockctl's child when lockctl
/// is a PID namespace's first process: it must not wait for it).
///
/// # Safety
/// Async-signal-safe.
unsafe fn say_ready(how: u8) {
    // SAFETY: getpid has no preconditions; a write of 5 bytes, less than PIPE_BUF, is atomic.
    unsafe {
        let mut word = [how; 5];
        word[1..].copy_from_slice(&libc::getpid().to_ne_bytes());
        libc::write(BACK_FD, word.as_ptr().cast(), word.len());
    }
}

/// A pipe, both ends close-on-exec.
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 writes two descriptors into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Tells the watcher behind `fd` which group to kill: the calling process's own.
///
/// # Safety
/// Async-signal-safe; meant for the child between fork and exec.
pub unsafe fn announce(fd: RawFd) -> io::Result<()> {
    // SAFETY: getpid has no preconditions; the write of 5 bytes, less than PIPE_BUF, is atomic.
    unsafe {
        let pgid = libc::getpid();
        let mut msg = [GROUP_TAG; 5];
        msg[1..].copy_from_slice(&pgid.to_ne_bytes());
        if libc::write(fd, msg.as_ptr().cast(), msg.len()) != msg.len() as isize {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Nanoseconds on the boot-time clock.
///
/// # Safety
/// Async-signal-safe.
pub(super) unsafe fn boottime_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_BOOTTIME always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// What the watcher knows, from the messages read so far.
struct Known {
    group: libc::pid_t,
    /// The group's leader is not reaped yet: its ID is surely the job's group's, and `killpg` on it
    /// reaches the job only. Afterwards the ID still names the job's group to match processes
    /// against (it stays reserved while a member exists), but is not signalled as a whole.
    live: bool,
    /// The lease's deadline (boot-time ns); 0 before the first.
    deadline: u64,
    /// lockctl handles a lost lease itself.
    handling: bool,
    /// When the SIGKILL is due (boot-time ns); 0 while none is.
    kill_at: u64,
    killed: bool,
}

/// Readies the forked copy to be the watcher: every signal blocked (the mask survives exec), a
/// process group of its own, and no descriptor but its pipe from lockctl, on [`GUARD_FD`], and its
/// pipe back, on [`BACK_FD`].
///
/// # Safety
/// Async-signal-safe; only for the child of a fork.
unsafe fn isolate(read: RawFd, back: RawFd) {
    // SAFETY: async-signal-safe calls on process state and our own descriptors.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        libc::setpgid(0, 0);
        // Copies above both targets first, so neither dup2 overwrites the other's source; dup2
        // leaves its copy without close-on-exec.
        let read = libc::fcntl(read, libc::F_DUPFD_CLOEXEC, BACK_FD + 1);
        let back = libc::fcntl(back, libc::F_DUPFD_CLOEXEC, BACK_FD + 1);
        libc::dup2(read, GUARD_FD);
        libc::dup2(back, BACK_FD);
        close_all_above(BACK_FD);
        libc::close(0);
        libc::close(1);
        libc::close(2);
    }
}

/// The exec'd watcher (`lockctl-guard`): `args` are what follows [`GUARD_ARG`]. Never returns.
pub fn guard(args: &[std::ffi::OsString]) -> ! {
    let arg = |i: usize| args.get(i)?.to_str();
    let lockctl = arg(0).and_then(|a| {
        let (pid, start) = a.split_once(':')?;
        Some((pid.parse::<i32>().ok()?, start.parse::<u64>().ok()?))
    });
    let kill_after = arg(1).and_then(|a| a.parse::<u64>().ok());
    let (Some((lockctl, start)), Some(kill_after)) = (lockctl, kill_after) else {
        eprintln!("lockctl: {GUARD_ARG} is internal to `lockctl exec`");
        std::process::exit(64);
    };
    // SAFETY: PR_SET_NAME with a NUL-terminated name.
    unsafe { libc::prctl(libc::PR_SET_NAME, GUARD_NAME.as_ptr(), 0, 0, 0) };
    let mut walker = Walker::new(lockctl, start);
    // SAFETY: a write to our own pipe back to lockctl.
    unsafe { say_ready(READY_EXEC) };
    // SAFETY: this process is the watcher; the walker may allocate, since it was exec'd.
    unsafe { watch(GUARD_FD, kill_after, Some(&mut walker)) }
}

/// The watcher's whole life: in the exec'd `lockctl-guard` with a walker, or in the forked copy of
/// lockctl without one.
///
/// # Safety
/// Only in the watcher; never returns. Without a walker, async-signal-safe.
unsafe fn watch(read: RawFd, kill_after: u64, mut walker: Option<&mut Walker>) -> ! {
    // SAFETY: async-signal-safe calls on process state and our own descriptors; no allocation
    // except in the walker.
    unsafe {
        let mut known = Known {
            group: 0,
            live: false,
            deadline: 0,
            handling: false,
            kill_at: 0,
            killed: false,
        };
        let mut msg = [0u8; 9];
        let mut got = 0usize;
        let mut timeout: libc::c_int = 0;
        loop {
            // Read the clock first, then take in everything in the pipe: a deadline lockctl sent
            // before the old one passed was written before `now`, so it is read before any verdict.
            let now = boottime_ns();
            let mut pfd = libc::pollfd {
                fd: read,
                events: libc::POLLIN,
                revents: 0,
            };
            let ready = libc::poll(&mut pfd, 1, timeout);
            if ready < 0 {
                if *libc::__errno_location() != libc::EINTR {
                    libc::_exit(1);
                }
                timeout = 0;
                continue;
            }
            if ready > 0 {
                let mut buf = [0u8; 64];
                let n = libc::read(read, buf.as_mut_ptr().cast(), buf.len());
                if n == 0 && known.group == 0 {
                    // lockctl is gone, or gave up, before any job announced itself: there is
                    // nothing to kill (a job's first process holds this pipe's write end until it
                    // has announced its group and exec'd).
                    libc::_exit(0);
                }
                if n == 0 {
                    // lockctl is gone without saying "done". The group is stopped first, then
                    // walked, then killed: stopped, its processes can neither leave it nor die,
                    // so the parent links from them to the processes that already left it still
                    // stand during the walk (once they die, those become orphans of init or of a
                    // subreaper in lockctl's session, such as a container's first process, and
                    // are harder to tell apart from other processes).
                    let live = known.live && known.group > 0;
                    if let Some(w) = walker.as_deref() {
                        w.await_lockctl_exit();
                    }
                    if live {
                        libc::killpg(known.group, libc::SIGSTOP);
                    }
                    if let Some(w) = walker.as_deref_mut() {
                        w.signal(known.group, known.live, libc::SIGKILL, true);
                    }
                    if live {
                        libc::killpg(known.group, libc::SIGKILL);
                    }
                    libc::_exit(0);
                }
                if n < 0 {
                    if *libc::__errno_location() == libc::EINTR {
                        continue;
                    }
                    libc::_exit(1);
                }
                for &byte in &buf[..n as usize] {
                    if got == 0 && byte == DONE {
                        libc::_exit(0);
                    }
                    if got == 0 && byte == FORGET {
                        known.live = false;
                        continue;
                    }
                    if got == 0 && byte == HANDLING {
                        // Also after a SIGTERM of our own: lockctl's may come later, and the job
                        // is owed `--kill-after` from it.
                        known.handling = true;
                        known.kill_at = known.kill_at.max(
                            boottime_ns()
                                .saturating_add(kill_after)
                                .saturating_add(BACKSTOP_GRACE.as_nanos() as u64),
                        );
                        continue;
                    }
                    msg[got] = byte;
                    got += 1;
                    let whole = match msg[0] {
                        GROUP_TAG => 5,
                        DEADLINE_TAG => 9,
                        _ => 1,
                    };
                    if got == whole {
                        if msg[0] == GROUP_TAG {
                            known.group =
                                libc::pid_t::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
                            known.live = true;
                        } else if msg[0] == DEADLINE_TAG {
                            let mut ns = [0u8; 8];
                            ns.copy_from_slice(&msg[1..9]);
                            known.deadline = known.deadline.max(u64::from_ne_bytes(ns));
                        }
                        got = 0;
                    }
                }
                // Drain whatever else is there before deciding.
                timeout = 0;
                continue;
            }
            if timeout > 0 {
                // The wait ended: read the clock again before deciding.
                timeout = 0;
                continue;
            }
            if known.group == 0 && known.deadline == 0 && known.kill_at == 0 {
                // Started while lockctl waits for the lock, maybe for hours: no lease and no job
                // yet, so nothing to enforce or look for until lockctl writes or is gone.
                timeout = -1;
                continue;
            }
            timeout = enforce(&mut known, now, kill_after, walker.as_deref_mut());
            if let Some(w) = walker.as_deref_mut().filter(|_| known.group > 0) {
                // Adds to what earlier looks found (see `Walker::refresh` for why nothing found
                // is dropped while it runs).
                w.refresh();
                timeout = timeout.min(WALK_MS as libc::c_int);
            }
        }
    }
}

/// Applies the stop policy as of `now` (the pipe drained); returns how long to wait next, in ms.
///
/// # Safety
/// Async-signal-safe.
unsafe fn enforce(
    known: &mut Known,
    now: u64,
    kill_after: u64,
    mut walker: Option<&mut Walker>,
) -> libc::c_int {
    let expired = known.deadline != 0 && now >= known.deadline;
    if expired && !known.handling && known.kill_at == 0 {
        // SAFETY: killpg on the job's group (see the module docs for why the ID is not recycled).
        if known.live && known.group > 0 {
            unsafe { libc::killpg(known.group, libc::SIGTERM) };
        }
        if let Some(w) = walker.as_deref_mut() {
            w.signal(known.group, known.live, libc::SIGTERM, false);
        }
        known.kill_at = now.saturating_add(kill_after).max(1);
    }
    if known.kill_at != 0 && !known.killed && now >= known.kill_at {
        if known.live && known.group > 0 {
            // SAFETY: as above.
            unsafe { libc::killpg(known.group, libc::SIGKILL) };
        }
        if let Some(w) = walker {
            w.signal(known.group, known.live, libc::SIGKILL, false);
        }
        known.killed = true;
    }
    let mut wait = RECHECK_MS * 1_000_000;
    if !expired && known.deadline != 0 {
        wait = wait.min(known.deadline - now);
    }
    if known.kill_at != 0 && !known.killed {
        wait = wait.min(known.kill_at.saturating_sub(now));
    }
    // Round up, so the next look comes at or after the moment, not just before it.
    wait.div_ceil(1_000_000) as libc::c_int
}

/// Closes every descriptor above `last`.
///
/// # Safety
/// Async-signal-safe.
unsafe fn close_all_above(last: RawFd) {
    // SAFETY: close_range and close only drop descriptors of this (forked) process.
    unsafe {
        let from = last as libc::c_uint + 1;
        if libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) != 0 {
            // Kernels before 5.9: close the usual range by hand.
            for fd in from as RawFd..4096 {
                libc::close(fd);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real non-blocking pipe of `pages` pages: (read end, write end).
    fn pipe_of(pages: libc::c_int, page: libc::c_int) -> (OwnedFd, OwnedFd) {
        let mut fds = [0; 2];
        // SAFETY: pipe2 into a live array; F_SETPIPE_SZ on the pipe just made.
        unsafe {
            assert_eq!(libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK), 0);
            let (read, write) = (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]));
            // The kernel keeps a power of two of pages.
            let set = libc::fcntl(write.as_raw_fd(), libc::F_SETPIPE_SZ, pages * page);
            assert_eq!(set, pages * page, "{}", io::Error::last_os_error());
            (read, write)
        }
    }

    fn write(fd: &OwnedFd, msg: &[u8]) -> bool {
        // SAFETY: a write from a live buffer on the test's own pipe.
        unsafe { libc::write(fd.as_raw_fd(), msg.as_ptr().cast(), msg.len()) == msg.len() as isize }
    }

    fn read(fd: &OwnedFd, n: usize) {
        let mut buf = vec![0u8; n];
        // SAFETY: a read into a live buffer of `n` bytes from the test's own pipe.
        let got = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), n) };
        assert_eq!(got, n as isize);
    }

    fn queued(fd: &OwnedFd) -> libc::c_int {
        let mut q: libc::c_int = 0;
        // SAFETY: FIONREAD on the test's own pipe into a live integer.
        assert_eq!(
            unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONREAD, &mut q) },
            0
        );
        q
    }

    /// The promise of [`deadline_fits`], on real pipes of 2, 4, 8 and 16 pages: the reader reads
    /// some bytes at some point (a head page partly read, or read to its end), then stops; the
    /// writer writes deadlines while they fit; the words that end the watch still fit after them.
    #[test]
    fn the_words_after_the_deadlines_always_fit() {
        // SAFETY: sysconf reads a value the kernel gave the process.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as libc::c_int;
        let deadline = [DEADLINE_TAG; 9];
        for pages in [2, 4, 8, 16] {
            for before in [0, 1, 2, 200, 455, 456, 911] {
                // Bytes read: a few, all but the last of a page (the head page stays taken for
                // one byte), a page whole, or all but the last byte queued.
                for taken in [
                    0,
                    1,
                    8,
                    9,
                    100,
                    4086,
                    4094,
                    4095,
                    4096,
                    4097,
                    8190,
                    usize::MAX,
                ] {
                    let (r, w) = pipe_of(pages, page);
                    let mut written = 0;
                    while written < before && deadline_fits(pages * page, queued(&r), page) {
                        assert!(write(&w, &deadline), "a deadline that fits is written");
                        written += 1;
                    }
                    let there = queued(&r) as usize;
                    let taken = taken.min(there.saturating_sub(1));
                    if taken > 0 {
                        read(&r, taken);
                    }
                    let mut more = 0;
                    while deadline_fits(pages * page, queued(&r), page) {
                        assert!(write(&w, &deadline), "a deadline that fits is written");
                        more += 1;
                    }
                    let case = format!(
                        "{pages} pages, {written} deadlines, {taken} bytes read, {more} more"
                    );
                    assert!(more > 0 || written > 0, "no deadline at all: {case}");
                    let group = [GROUP_TAG, 1, 2, 3, 4];
                    for word in [&group[..], &[FORGET], &[HANDLING], &[DONE]] {
                        assert!(write(&w, word), "a word did not fit: {case}");
                    }
                }
            }
        }
    }

    /// The kernel's allotment of a pipe's pages, as a model: a write of at most a page merges into
    /// the last page if it fits whole in its rest, else takes a free page; reads take from the head
    /// page, which is freed once read to its end. For pipes larger than the tests may make (above
    /// `fs.pipe-max-size` without CAP_SYS_RESOURCE).
    struct Model {
        page: usize,
        slots: usize,
        /// (start, end) of the bytes of each page in use, head first.
        pages: std::collections::VecDeque<(usize, usize)>,
        /// The bytes in them.
        queued: usize,
    }

    impl Model {
        fn queued(&self) -> libc::c_int {
            self.queued as libc::c_int
        }

        fn write(&mut self, n: usize) -> bool {
            self.queued += n;
            if let Some(last) = self.pages.back_mut() {
                if last.1 + n <= self.page {
                    last.1 += n;
                    return true;
                }
            }
            if self.pages.len() == self.slots {
                self.queued -= n;
                return false;
            }
            self.pages.push_back((0, n));
            true
        }

        fn read(&mut self, mut n: usize) {
            self.queued -= n;
            while n > 0 {
                let head = self.pages.front_mut().expect("bytes to read");
                let take = n.min(head.1 - head.0);
                head.0 += take;
                n -= take;
                if head.0 == head.1 {
                    self.pages.pop_front();
                }
            }
        }
    }

    /// The same promise on the model, up to 65536 pages (256 MiB): the bytes pages lose at their
    /// ends add up past two pages in a pipe of 16384 (a byte a page), and the rule allows for them.
    #[test]
    fn the_words_fit_in_pipes_of_any_size_in_the_model() {
        let page = 4096;
        for pages in [2usize, 3, 16, 256, 4096, 16384, 65536] {
            for taken in [0usize, 1, 4094, 4095] {
                let capacity = (pages * page) as libc::c_int;
                let mut m = Model {
                    page,
                    slots: pages,
                    pages: Default::default(),
                    queued: 0,
                };
                // HANDLING first, then a page of deadlines, part of it read, then deadlines again.
                assert!(m.write(1));
                for _ in 0..455 {
                    if deadline_fits(capacity, m.queued(), page as libc::c_int) {
                        assert!(m.write(9));
                    }
                }
                m.read(taken.min(m.queued() as usize - 1));
                while deadline_fits(capacity, m.queued(), page as libc::c_int) {
                    assert!(m.write(9), "{pages} pages: a deadline that fits is written");
                }
                for word in [5, 1, 1, 1] {
                    assert!(
                        m.write(word),
                        "{pages} pages, {taken} read: a word did not fit"
                    );
                }
            }
        }
    }

    /// A pipe of one page takes no deadline (a page partly read may be full at any byte count),
    /// and a pipe of two takes a page's worth less the words after them.
    #[test]
    fn small_pipes_keep_their_room() {
        assert!(!deadline_fits(4096, 0, 4096));
        assert!(deadline_fits(8192, 4096 - WORDS_AFTER - 9, 4096));
        assert!(!deadline_fits(8192, 4096 - WORDS_AFTER - 8, 4096));
        assert!(deadline_fits(65536, 65536 - 8192 - 128 - 9, 4096));
        assert!(!deadline_fits(65536, 65536 - 8192 - 128 - 8, 4096));
    }
}
