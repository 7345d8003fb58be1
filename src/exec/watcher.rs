//! The watcher: a tiny process that kills the job's process group if lockctl dies.
//!
//! When lockctl dies, nobody renews the lease any more, and after the TTL another client may hold the
//! lock; no process of the job may run on then. The parent-death signal (`child.rs`) reaches only the
//! direct child: `sh -c 'sleep 30 | cat'` would leave `sleep` and `cat` running. A process group has
//! no parent-death signal, so a watcher does it:
//!
//! - lockctl forks it before the child, with a pipe whose write end only lockctl holds (close-on-exec,
//!   so the job never inherits it). The watcher blocks reading the other end. The kernel closes the
//!   write end when lockctl exits, however it exits (even SIGKILL), and the read returns end-of-file.
//! - The child announces its process-group ID (its own PID) on the pipe itself, between fork and exec,
//!   before the job can start anything, so there is no moment when the job runs and the watcher does
//!   not know whom to kill.
//! - On end-of-file without a "done" byte first, the watcher sends SIGKILL to the group and exits.
//!   lockctl writes "done" once the whole group has exited, as soon as it knows, before the release.
//! - Between fork and exit the watcher only makes async-signal-safe calls (lockctl has threads, and
//!   only the forking thread exists in the copy): `fork`, `sigprocmask`, `setpgid`,
//!   `close_range`/`close`, `read`, `killpg`, `_exit`. It blocks every signal, closes every other
//!   descriptor (it must not hold the terminal, lockctl's output pipes or its Redis connections), and
//!   sits in a process group of its own, so a signal sent to lockctl's job (a shell's `kill %1`,
//!   Ctrl-C) does not take it along.
//! - It is forked twice, the middle process exiting at once, so that it is not lockctl's child:
//!   lockctl's children are the job's processes only, whoever lists them, and lockctl's reaper never
//!   meets it. (lockctl becomes a subreaper only after this, or the watcher would come back to it.)
//!
//! **Why the group ID cannot be another process's.** Linux keeps a PID number allocated while any
//! process uses it as its PID, process-group ID or session ID, zombies included. The job's group `P` is
//! the direct child's PID, so `P` cannot be reused while any member of the group exists, even one that
//! has exited and awaits reaping. lockctl reaps the group's members itself (it is their subreaper) and
//! says "done" right after the last of them, before doing anything else. So a `killpg(P)` from the
//! watcher can only reach a recycled `P` if lockctl died in the few instructions between reaping the
//! last member and writing "done", and the kernel then handed out the freed number again, as a group
//! ID, before the watcher's next read: PIDs are allocated cyclically, so that needs the whole PID
//! space to wrap around in that moment. The same holds, with a window of up to a tenth of a second,
//! when the last members leave the group (`setsid`) instead of exiting: lockctl notices that by
//! looking (see `supervisor.rs`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The announcement the child writes: this tag, then its group ID as 4 native-endian bytes.
pub const GROUP_TAG: u8 = b'g';
/// Written by lockctl once the group has exited.
const DONE: u8 = b'd';

/// A running watcher.
pub struct Watcher {
    write: OwnedFd,
}

impl Watcher {
    /// Forks the watcher.
    pub fn start() -> io::Result<Watcher> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 writes two descriptors into the array.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: both descriptors were just created and are owned here.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fork has no preconditions; the child only forks the watcher and exits (below).
        let middle = unsafe { libc::fork() };
        if middle == 0 {
            // SAFETY: in the forked copy, async-signal-safe calls only; `watch` never returns.
            unsafe {
                match libc::fork() {
                    0 => watch(read.as_raw_fd()),
                    -1 => libc::_exit(1),
                    _ => libc::_exit(0),
                }
            }
        }
        if middle < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut status = 0;
        // SAFETY: waitpid on the child just forked, which exits at once.
        while unsafe { libc::waitpid(middle, &mut status, 0) } < 0 {
            let err = io::Error::last_os_error();
            if err.kind() != io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
        if !(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0) {
            return Err(io::Error::other("cannot fork the watcher process"));
        }
        Ok(Watcher { write })
    }

    /// The descriptor on which the child announces its group (see [`announce`]).
    pub fn fd(&self) -> RawFd {
        self.write.as_raw_fd()
    }

    /// The group has exited: the watcher stands down.
    pub fn done(self) {
        // SAFETY: a one-byte write on our own pipe; a watcher that is gone makes it fail (EPIPE,
        // with SIGPIPE ignored by the Rust runtime), which changes nothing.
        unsafe { libc::write(self.write.as_raw_fd(), [DONE].as_ptr().cast(), 1) };
    }
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

/// The watcher's whole life, in the forked copy of lockctl.
///
/// # Safety
/// Only for the child of a fork; never returns.
unsafe fn watch(read: RawFd) -> ! {
    // SAFETY: async-signal-safe calls on process state and our own descriptors.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_SETMASK, &all, std::ptr::null_mut());
        libc::setpgid(0, 0);
        close_all_but(read);

        let mut msg = [0u8; 5];
        let mut got = 0usize;
        let mut group: libc::pid_t = 0;
        loop {
            let mut byte = 0u8;
            let n = libc::read(read, (&mut byte as *mut u8).cast(), 1);
            if n == 0 {
                // lockctl is gone without saying "done".
                if group > 0 {
                    libc::killpg(group, libc::SIGKILL);
                }
                libc::_exit(0);
            }
            if n < 0 {
                if *libc::__errno_location() == libc::EINTR {
                    continue;
                }
                libc::_exit(1);
            }
            if got == 0 && byte == DONE {
                libc::_exit(0);
            }
            msg[got] = byte;
            got += 1;
            if got == msg.len() {
                if msg[0] == GROUP_TAG {
                    group = libc::pid_t::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]);
                }
                got = 0;
            }
        }
    }
}

/// Closes every descriptor except `keep`.
///
/// # Safety
/// Async-signal-safe.
unsafe fn close_all_but(keep: RawFd) {
    // SAFETY: close_range and close only drop descriptors of this (forked) process.
    unsafe {
        let keep = keep as libc::c_uint;
        let below = keep == 0 || libc::syscall(libc::SYS_close_range, 0, keep - 1, 0) == 0;
        let above = libc::syscall(libc::SYS_close_range, keep + 1, libc::c_uint::MAX, 0) == 0;
        if !(below && above) {
            // Kernels before 5.9: close the usual range by hand.
            for fd in 0..4096 {
                if fd != keep as RawFd {
                    libc::close(fd);
                }
            }
        }
    }
}
