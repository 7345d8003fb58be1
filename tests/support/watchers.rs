//! Helpers of the tests of `exec`'s watcher (`lockctl-guard`): finding the watchers of a lockctl,
//! holding one as a debugger would.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::{alive, eventually, lockctl_on, wait_output, Server};

/// The watchers of the lockctl `pid`, found by their command line.
pub fn watchers_of(pid: u32) -> Vec<i32> {
    let prefix = format!("lockctl-guard\0--lockctl-guard\0{pid}:");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(prefix.as_bytes()))
        })
        .filter(|&p| alive(p))
        .collect()
}

/// The one watcher of the lockctl `pid`, once it runs as `lockctl-guard`.
pub fn watcher_of(pid: u32) -> i32 {
    let mut found = Vec::new();
    eventually(Duration::from_secs(30), || {
        found = watchers_of(pid);
        found.len() == 1
            && std::fs::read_to_string(format!("/proc/{}/comm", found[0]))
                .is_ok_and(|c| c.trim() == "lockctl-guard")
    });
    assert_eq!(found.len(), 1, "lockctl {pid} has one watcher: {found:?}");
    found[0]
}

/// A lockctl the test started: killed and reaped when dropped, should the test fail before it
/// ends (reaped, its PID is not signalled again).
pub struct Started(pub Option<Child>);

impl Started {
    pub fn id(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// SIGKILL, and reaped.
    pub fn kill(mut self) {
        let mut child = self.0.take().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
    }

    pub fn output(mut self, limit: Duration) -> std::process::Output {
        wait_output(self.0.take().unwrap(), limit)
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(child) = self.0.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `exec NAME FLAGS -- PROGRAM...` on a held lock and returns once it says it waits.
pub fn start_waiting(
    s: &Server,
    name: &str,
    flags: &[&str],
    program: &[&str],
) -> (Started, ChildStderr) {
    let mut child = lockctl_on(s)
        .args(["exec", name])
        .args(flags)
        .arg("--")
        .args(program)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let child = Started(Some(child));
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains(&format!("waiting for lock '{name}'")),
        "{line}"
    );
    (child, err.into_inner())
}

/// A debugger's hold on a process (`gdb -p`): attached with `PTRACE_ATTACH`, so it sits at a
/// tracer's stop (`t`) until the hold is dropped. ptrace is per thread: a thread of its own
/// attaches, waits, and detaches.
pub struct Traced(
    Option<mpsc::Sender<()>>,
    Option<std::thread::JoinHandle<()>>,
);

impl Traced {
    /// None where ptrace is not permitted.
    pub fn attach(pid: i32) -> Option<Traced> {
        let (ok_tx, ok_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // SAFETY: ptrace and waitpid on a process the test started (a watcher).
            let attached = unsafe {
                libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0) == 0 && {
                    let mut status = 0;
                    libc::waitpid(pid, &mut status, libc::__WALL) == pid
                }
            };
            let _ = ok_tx.send(attached);
            if attached {
                let _ = done_rx.recv();
                // SAFETY: detaches from a tracee stopped by this thread's attach.
                unsafe { libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0) };
            }
        });
        if ok_rx.recv().unwrap_or(false) {
            Some(Traced(Some(done_tx), Some(thread)))
        } else {
            let _ = thread.join();
            None
        }
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        drop(self.0.take());
        if let Some(t) = self.1.take() {
            let _ = t.join();
        }
    }
}

/// Continues a stopped process when dropped, also when the test fails.
pub struct Resume(pub i32);

impl Drop for Resume {
    fn drop(&mut self) {
        super::kill(self.0, libc::SIGCONT);
    }
}

/// The state letter of `pid` in `/proc/PID/stat` (`T` stopped by a signal, `t` at a tracer's stop).
pub fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')').next()?.trim_start().chars().next()
}

/// Starts a lockctl with `start` until its watcher is caught and stopped (SIGSTOP) before its
/// own first word (`pkill -STOP lockctl-guard` just as it starts), 50 tries at most. The watcher
/// shows its command line from its exec on, and takes its name (`comm`, `exe` until then) just
/// before that word: one stopped before the name is surely silent. Its PID is a little above that
/// of the process started, and is looked for there only, so that a look takes a few reads.
/// `known_as` maps the PID of the process started to lockctl's PID as the watcher's command line
/// has it (`lockctl-guard --lockctl-guard PID:START ...`; 1 for a PID namespace's first process).
pub fn stopped_before_its_word(
    mut start: impl FnMut() -> Started,
    known_as: impl Fn(u32) -> u32,
) -> (Started, Resume) {
    for _ in 0..50 {
        let child = start();
        let started = child.id();
        let prefix = format!("lockctl-guard\0--lockctl-guard\0{}:", known_as(started));
        let found = (0..20_000).find_map(|_| {
            (started as i32 + 1..started as i32 + 64).find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.starts_with(prefix.as_bytes()))
            })
        });
        let Some(watcher) = found else {
            child.kill();
            continue;
        };
        super::kill(watcher, libc::SIGSTOP);
        let resume = Resume(watcher);
        assert!(
            eventually(Duration::from_secs(20), || state(watcher) == Some('T')),
            "the watcher did not stop"
        );
        let name = std::fs::read_to_string(format!("/proc/{watcher}/comm")).unwrap_or_default();
        if name.trim() != "lockctl-guard" {
            return (child, resume);
        }
        drop(resume);
        child.kill();
    }
    panic!("no watcher was caught before its first word in 50 tries");
}

/// `strace -p pid` (that thread only, no `-f`) holding the first call of each of `holds`
/// (`(syscall, microseconds)`) at its entry, as a stop there would: a debugger's hold on lockctl
/// at a chosen point. Returns once strace is attached; detaches when dropped.
pub fn hold_at(pid: u32, holds: &[(&str, u64)]) -> Started {
    let names: Vec<&str> = holds.iter().map(|(name, _)| *name).collect();
    let mut cmd = std::process::Command::new("strace");
    cmd.args(["-p", &pid.to_string(), "-o", "/dev/null"])
        .args(["-e", &format!("trace={}", names.join(","))]);
    for (name, us) in holds {
        cmd.args(["-e", &format!("inject={name}:delay_enter={us}:when=1")]);
    }
    let mut strace = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("strace (./scripts/test installs it)");
    let mut line = String::new();
    BufReader::new(strace.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let strace = Started(Some(strace));
    assert!(line.contains("attached"), "strace cannot attach: {line}");
    strace
}

/// True once `pid`'s main thread is in one of the system calls `numbers` (as `/proc/PID/syscall`
/// shows it, the number first), within `bound`.
pub fn comes_to(pid: u32, numbers: &[libc::c_long], bound: Duration) -> bool {
    eventually(bound, || {
        std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| {
            s.split_whitespace()
                .next()
                .and_then(|n| n.parse::<libc::c_long>().ok())
                .is_some_and(|n| numbers.contains(&n))
        })
    })
}

/// A process a test stopped: killed and continued when dropped, only while its PID still names
/// the process stopped (the same start time): a PID that was reaped and handed out again may be
/// anyone's.
pub struct Stopped(pub i32, pub Option<u64>);

impl Stopped {
    pub fn of(pid: i32) -> Stopped {
        Stopped(pid, started_at(pid))
    }

    /// Still the process that was stopped, and not exited.
    pub fn still_there(&self) -> bool {
        self.1.is_some() && started_at(self.0) == self.1 && alive(self.0)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if self.1.is_some() && started_at(self.0) == self.1 {
            super::kill(self.0, libc::SIGKILL);
            super::kill(self.0, libc::SIGCONT);
        }
    }
}

/// When `pid` started (clock ticks after boot, `/proc/PID/stat` field 22).
pub fn started_at(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}
