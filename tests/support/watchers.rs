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

    /// SIGTERM, and reaped; SIGKILL if it has not ended within 10 s. A waiter ended so leaves
    /// the lock's queue at once, where a SIGKILLed one stays at its head until its heartbeat runs
    /// out (seconds) and holds up the grant of whoever the test starts next on the same name.
    pub fn end(mut self) {
        let mut child = self.0.take().unwrap();
        super::kill(child.id() as i32, libc::SIGTERM);
        if exit_within(&mut child, Duration::from_secs(10)).is_none() {
            let _ = child.kill();
        }
        child.wait().unwrap();
    }

    /// SIGKILL and reaped now, if still there (a test that gave up waiting for it).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// lockctl as the first process of a PID namespace of the test's own (`unshare -pf --kill-child
/// --mount-proc lockctl ARGS`), so that its watcher is its own child, against `s` (the restart
/// quarantine off: the test has just started that server), its stderr in `err`. Returns the
/// namespace (killed with every process in it when dropped) and lockctl's PID once it is there.
pub fn pid1_lockctl(s: &Server, args: &[&str], err: &std::path::Path) -> (Started, i32) {
    let ns = std::process::Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc"])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .args(args)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(err).unwrap())
        .spawn()
        .map(|c| Started(Some(c)))
        .unwrap();
    let unshare = ns.id() as i32;
    let mut lockctl = 0;
    assert!(
        eventually(Duration::from_secs(20), || {
            lockctl = children_of(unshare).first().copied().unwrap_or(0);
            lockctl > 0
        }),
        "lockctl did not start"
    );
    (ns, lockctl)
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
            child.end();
            continue;
        };
        super::kill(watcher, libc::SIGSTOP);
        let resume = Resume(watcher);
        if !eventually(Duration::from_secs(20), || {
            matches!(state(watcher), Some('T') | Some('Z') | None)
        }) {
            panic!("the watcher did not stop: state {:?}", state(watcher));
        }
        if state(watcher) != Some('T') {
            // Gone before the stop took (lockctl's end ends its watcher too): a scene lost, not
            // the promise; said with what lockctl said, and tried again.
            super::kill(child.id() as i32, libc::SIGKILL);
            let out = child.output(Duration::from_secs(30));
            eprintln!(
                "the watcher {watcher} ended before it stopped; lockctl: {:?} {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            drop(resume);
            continue;
        }
        let name = std::fs::read_to_string(format!("/proc/{watcher}/comm")).unwrap_or_default();
        if name.trim() != "lockctl-guard" {
            return (child, resume);
        }
        drop(resume);
        child.end();
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

/// The parent of `pid`, from `/proc/PID/stat`.
pub fn ppid(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(')')
        .next()?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// True if a thread of `pid` is in `clone`, `clone3` or `vfork` (waiting for a CLONE_VFORK child).
pub fn in_a_clone(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        [libc::SYS_clone, libc::SYS_clone3, libc::SYS_vfork].contains(&syscall_nr(&t.path()))
    })
}

/// True when a thread of `pid` sleeps in a socket read and its connection from local port `local`
/// to 127.0.0.1:`remote` has no unread byte: it has read all it was sent and waits for more. The
/// thread named `signals` (lockctl's signal thread) does not count.
pub fn sleeps_on_a_read_socket(pid: i32, local: u16, remote: u16) -> bool {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let (from, to) = (
        format!("0100007F:{local:04X}"),
        format!("0100007F:{remote:04X}"),
    );
    // The fifth field is `tx_queue:rx_queue`, in hex.
    let unread = table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() > 4 && f[1] == from && f[2] == to)
            .then(|| u64::from_str_radix(f[4].split(':').nth(1)?, 16).ok())
            .flatten()
    });
    let asleep = std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|tasks| {
        tasks.flatten().any(|t| {
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let nr = syscall_nr(&t.path());
            comm.trim() != "signals"
                && stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('S'))
                && (nr == libc::SYS_read || nr == libc::SYS_recvfrom)
        })
    });
    unread == Some(0) && asleep
}

/// The number of the system call the thread `/proc/PID/task/TID` is in (its `syscall` file's first
/// field), or -1 when it runs or cannot be read.
pub fn syscall_nr(task: &std::path::Path) -> i64 {
    std::fs::read_to_string(task.join("syscall"))
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// Starts a lockctl with `start` (given the try's number, 1 to 50) until the double fork's
/// middle process of its watcher's start is caught: stopped with SIGSTOP as soon as it shows as
/// lockctl's child, `pkill -STOP` landing in that moment. The command's first process is
/// lockctl's child too: before its exec lockctl waits in its clone (CLONE_VFORK), after it its
/// command line is the command's; caught instead, it is let go and the try made again. Returns
/// the lockctl and the stopped middle process, or None if none was caught.
pub fn catch_the_middle(mut start: impl FnMut(u32) -> Started) -> Option<(Started, Stopped)> {
    for attempt in 1..=50 {
        let child = start(attempt);
        let lockctl = child.id() as i32;
        // Its PID is a little above lockctl's (threads take PIDs too).
        let found = (0..20_000)
            .find_map(|_| (lockctl + 1..lockctl + 64).find(|&p| ppid(p) == Some(lockctl)));
        if let Some(middle) = found {
            super::kill(middle, libc::SIGSTOP);
            let stopped = Stopped::of(middle);
            let copy = |p: i32| std::fs::read(format!("/proc/{p}/cmdline")).ok();
            if eventually(Duration::from_secs(5), || state(middle) == Some('T'))
                && ppid(middle) == Some(lockctl)
                && copy(middle).is_some()
                && copy(middle) == copy(lockctl)
                && !in_a_clone(lockctl)
            {
                eprintln!(
                    "caught the middle process {middle} of lockctl {lockctl} at try {attempt}"
                );
                return Some((child, stopped));
            }
        }
        // Not caught: ended by a signal it answers, so that it leaves the lock's queue now and
        // the next try waits behind the holder alone (a SIGKILLed waiter there held up the
        // grants of the tries after it past the middle process's 2 s bound).
        child.end();
    }
    None
}

/// Bytes waiting in the pipe that `pid`'s descriptor `fd` reads (FIONREAD on a copy opened
/// through `/proc`); None if it cannot be opened.
pub fn queued(pid: i32, fd: i32) -> Option<i32> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let pipe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .ok()?;
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD writes an int through a valid pointer, on a descriptor we own.
    let rc = unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) };
    (rc == 0).then_some(n)
}

/// The pipe that `lockctl`'s descriptor shares with `pid`'s descriptor `fd` (the same
/// `pipe:[INODE]`), opened for writing, non-blocking.
pub fn writer_of(lockctl: u32, pid: i32, fd: i32) -> Option<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let target = std::fs::read_link(format!("/proc/{pid}/fd/{fd}")).ok()?;
    let dir = std::fs::read_dir(format!("/proc/{lockctl}/fd")).ok()?;
    let path = dir
        .flatten()
        .map(|e| e.path())
        .find(|p| std::fs::read_link(p).is_ok_and(|t| t == target))?;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()
}

/// Waits up to `limit` for `child` to exit, without reading its pipes.
pub fn exit_within(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let until = std::time::Instant::now() + limit;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if std::time::Instant::now() >= until {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// An `exec NAME --ttl TTL --kill-after 1h` whose job ignores SIGTERM and runs until the file
/// `go` exists, with its watcher stopped (SIGSTOP) and seen stopped by lockctl (it says "is
/// stopped" and stops the job, which does not go): lockctl renews on, writing each deadline into
/// the stopped watcher's pipe. lockctl's stderr is in the file `err`.
pub struct StubbornJob {
    pub child: Started,
    pub lockctl: u32,
    pub watcher: i32,
    pub stopped: Stopped,
    pub go: std::path::PathBuf,
    pub err: std::path::PathBuf,
}

impl StubbornJob {
    /// The scene, tried again (5 times at most) when lockctl lost the lease in time before it saw
    /// the watcher stopped (a renewal that came late on a loaded machine, with a TTL of tens of
    /// milliseconds: lockctl then says "validity ran out" and stops the job for that reason, not
    /// the watcher's). That is a scene lost, not a verdict: said, and tried again. Any other
    /// silence about the stopped watcher fails.
    pub fn start(s: &Server, name: &str, ttl: &str) -> StubbornJob {
        for _ in 0..5 {
            if let Some(scene) = Self::try_start(s, name, ttl) {
                return scene;
            }
        }
        panic!("lockctl lost its {ttl} lease in time before it saw its watcher stopped, 5 times");
    }

    fn try_start(s: &Server, name: &str, ttl: &str) -> Option<StubbornJob> {
        let job = s.dir().join("job");
        let go = s.dir().join("go");
        let err = s.dir().join("lockctl.err");
        let _ = std::fs::remove_file(&job);
        let _ = std::fs::remove_file(&go);
        let script = format!(
            "trap '' TERM; echo $$ > {job}; while [ ! -e {go} ]; do sleep 0.05; done",
            job = job.display(),
            go = go.display()
        );
        let child = lockctl_on(s)
            .args(["exec", name, "--ttl", ttl, "--kill-after", "1h", "--"])
            .args(["sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let mut child = Started(Some(child));
        assert!(
            eventually(Duration::from_secs(30), || std::fs::read_to_string(&job)
                .is_ok_and(|j| j.ends_with('\n'))),
            "the command did not start"
        );
        let lockctl = child.id();
        let watcher = watcher_of(lockctl);
        super::kill(watcher, libc::SIGSTOP);
        let stopped = Stopped::of(watcher);
        assert!(eventually(Duration::from_secs(10), || state(watcher) == Some('T')));
        let said = || std::fs::read_to_string(&err).unwrap_or_default();
        if !eventually(Duration::from_secs(10), || said().contains("is stopped")) {
            let errs = said();
            assert!(
                errs.contains("validity ran out"),
                "lockctl did not see its watcher stopped: {errs}"
            );
            eprintln!("the lease ran out before lockctl saw its watcher stopped; again: {errs}");
            // The job ends at `go`, lockctl with it; the watcher is killed with `stopped`.
            std::fs::write(&go, "").unwrap();
            let ended = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(30));
            child.stop();
            drop(stopped);
            assert!(
                ended.is_some(),
                "lockctl did not end with its job: {}",
                said()
            );
            let key = format!("lockctl:{name}");
            assert!(
                eventually(Duration::from_secs(10), || s.get(&key).is_none()),
                "the lock was not released"
            );
            return None;
        }
        Some(StubbornJob {
            child,
            lockctl,
            watcher,
            stopped,
            go,
            err,
        })
    }
}

/// The scene of a watcher left stopped behind lockctl in a PID namespace of the test's own
/// (`unshare -pf --mount-proc`): `lockctl exec --ttl TTL` of a job that ignores SIGTERM; the
/// test stops the watcher, waits until lockctl has seen it stopped, and calls `fill(watcher)`
/// (which resizes or fills the watcher's pipe and says what it did, or panics without a
/// verdict); the job then ends, and lockctl must exit 76 and release the lock. If the watcher is
/// still there, stopped, the job's old group ID is handed to a `setsid sleep 60`
/// (`ns_last_pid`), the watcher is resumed, and it must exit without killing that unrelated group.
/// Needs root and `unshare`; a test that is not root says so and returns.
pub fn left_watcher_scene(ttl: &str, fill: impl FnOnce(i32) -> String) {
    use super::{kill, need_tool};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no PID namespace of the test's own; skipped");
        return;
    }
    need_tool("unshare", "--version");
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let at = |f: &str| d.join(f);
    let read = |f: &str| std::fs::read_to_string(d.join(f)).ok();
    let script = LEFT_SCRIPT.replace("TTL", ttl);
    let ns = std::process::Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc", "bash", "-c", &script])
        .arg("left")
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .arg("left")
        .arg(&d)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(at("ns.err")).unwrap())
        .spawn()
        .unwrap();
    let ns = Started(Some(ns));
    let unshare = ns.id() as i32;
    // The namespace's first process (bash), the child of unshare's fork.
    let mut init = None;
    assert!(eventually(Duration::from_secs(30), || {
        init = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
            .ok()
            .and_then(|c| c.split_whitespace().next()?.parse::<i32>().ok());
        init.is_some() && read("job").is_some() && read("lockctl").is_some()
    }));
    let init = init.unwrap();
    let lockctl: u32 = read("lockctl").unwrap().trim().parse().unwrap();
    let prefix = format!("lockctl-guard\0--lockctl-guard\0{lockctl}:");
    let mut found = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            found = in_namespace_of(init, prefix.as_bytes());
            found.len() == 1
        }),
        "lockctl {lockctl}'s watcher not found: {found:?}"
    );
    let watcher = found[0];
    kill(watcher, libc::SIGSTOP);
    let stopped = Stopped::of(watcher);
    assert!(eventually(Duration::from_secs(10), || state(watcher) == Some('T')));
    assert!(
        eventually(Duration::from_secs(10), || read("lockctl.err")
            .is_some_and(|e| e.contains("is stopped"))),
        "lockctl did not see its watcher stopped"
    );
    let filled = fill(watcher);
    std::fs::write(at("go"), "").unwrap();
    assert!(
        eventually(Duration::from_secs(60), || read("status").is_some()),
        "lockctl did not exit"
    );
    let status = read("status").unwrap();
    let errs = read("lockctl.err").unwrap_or_default();
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    eprintln!(
        "lockctl exited {} after {filled}; watcher {watcher} left: {left} ({:?}, {:?} bytes)",
        status.trim(),
        state(watcher),
        queued(watcher, 3)
    );
    assert_eq!(status.trim(), "76", "{errs}");
    assert_eq!(s.get("lockctl:left"), None, "the lock was not released");
    std::fs::write(at("reuse"), "").unwrap();
    assert!(
        eventually(Duration::from_secs(30), || read("victim").is_some()),
        "no victim started: {:?}",
        read("ns.err")
    );
    let job = read("job").unwrap().trim().to_string();
    let victim = read("victim").unwrap();
    let reused = victim.split_whitespace().all(|v| v == job);
    eprintln!(
        "the job's group was {job}; now pid and group {}",
        victim.trim()
    );
    if !left {
        // Nothing to resume: the watcher is gone, as it should be.
        drop(stopped);
        return;
    }
    assert!(
        reused,
        "no verdict: the job's old ID {job} was not handed to the victim ({victim})"
    );
    kill(watcher, libc::SIGCONT);
    let ended = eventually(Duration::from_secs(10), || read("victim_status").is_some());
    let gone = eventually(Duration::from_secs(10), || !stopped.still_there());
    drop(stopped);
    drop(ns);
    assert!(gone, "the resumed watcher {watcher} did not exit");
    assert!(
        !ended,
        "the watcher left stopped, once resumed, killed the process group {job} that took the \
         job's old ID after lockctl's exit 76 (victim ended with status {:?}): {errs}",
        read("victim_status")
    );
}

/// The namespace's script for [`left_watcher_scene`]: `$1` lockctl, `$2` the lock's name, `$3` the
/// directory of its files; TTL is replaced by the lease's.
const LEFT_SCRIPT: &str = r#"
set -u
L=$1; NAME=$2; D=$3
"$L" exec "$NAME" --ttl TTL --kill-after 1h -- sh -c "trap '' TERM; echo \$\$ > $D/job.tmp; mv $D/job.tmp $D/job; while [ ! -e $D/go ]; do sleep 0.05; done" 2>"$D/lockctl.err" &
LP=$!
echo $LP > "$D/lockctl.tmp"; mv "$D/lockctl.tmp" "$D/lockctl"
wait $LP
echo $? > "$D/status.tmp"; mv "$D/status.tmp" "$D/status"
for i in $(seq 1 2400); do [ -e "$D/reuse" ] && break; sleep 0.05; done
[ -e "$D/reuse" ] || exit 3
P=$(cat "$D/job")
echo $((P-1)) > /proc/sys/kernel/ns_last_pid
setsid sleep 60 &
V=$!
for i in $(seq 1 200); do [ "$(awk '{print $5}' /proc/$V/stat)" = "$V" ] && break; sleep 0.01; done
echo "$V $(awk '{print $5}' /proc/$V/stat)" > "$D/victim.tmp"; mv "$D/victim.tmp" "$D/victim"
wait $V
echo $? > "$D/victim_status"
"#;

/// The processes of the PID namespace of `init` (an outer PID) whose command line starts with
/// `prefix`, by their outer PIDs.
pub fn in_namespace_of(init: i32, prefix: &[u8]) -> Vec<i32> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else {
        return Vec::new();
    };
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read_link(format!("/proc/{p}/ns/pid")).is_ok_and(|n| n == ns))
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter(|&p| alive(p))
        .collect()
}

/// The namespace's script for [`orphan_scene`], run
/// by bash as the first process of a PID namespace of its own (`$1` lockctl, `$2` the lock's name,
/// `$3` a directory): lockctl (not the namespace's first process: its watcher is not its child)
/// runs `$3/job.sh`. lockctl's exit code goes to `$3/status`, and the state of the job's orphan
/// (its PID in `$3/orphan`) 0.5 s later to `$3/orphan_after` (`gone` if it is gone).
const ORPHAN_SCRIPT: &str = r#"
set -u
L=$1; NAME=$2; D=$3
"$L" exec "$NAME" --ttl 2s --kill-after 1s -- sh "$D/job.sh" 2>"$D/lockctl.err" &
LP=$!
echo $LP > "$D/lockctl.tmp"; mv "$D/lockctl.tmp" "$D/lockctl"
wait $LP
echo $? > "$D/status.tmp"; mv "$D/status.tmp" "$D/status"
sleep 0.5
O=$(cat "$D/orphan" 2>/dev/null || echo 0)
S=gone; [ -e /proc/$O/stat ] && S=$(awk '{print $3}' /proc/$O/stat)
echo $S > "$D/orphan_after.tmp"; mv "$D/orphan_after.tmp" "$D/orphan_after"
"#;

/// The job: on SIGTERM (the lease lost), it waits 0.5 s, then starts a process with the PID in
/// `$D/reuse` (the dead watcher's: `ns_last_pid`; any PID if it holds 0) that outlives it, and exits: the process, an
/// orphan of the job, comes to lockctl, its subreaper.
const ORPHAN_JOB: &str = r#"
D=$(dirname "$0")
trap 'sleep 0.5; W=$(cat $D/reuse); [ "$W" -gt 0 ] && echo $((W-1)) > /proc/sys/kernel/ns_last_pid; sh $D/orphan.sh & exit 0' TERM
echo $$ > $D/job.tmp; mv $D/job.tmp $D/job
while :; do sleep 0.05; done
"#;

const ORPHAN: &str = r#"
D=$(dirname "$0")
echo $$ > $D/orphan.tmp; mv $D/orphan.tmp $D/orphan
exec sleep 30
"#;

/// A job whose watcher is killed while it runs, in a PID namespace of the test's own where lockctl
/// is not the first process: lockctl says "is gone" and sends the job SIGTERM; the job's handler
/// starts a process (with the dead watcher's PID if `reuse`, through `ns_last_pid`) that outlives
/// it, and exits, so that process comes to lockctl, its subreaper. lockctl must exit 76 and that
/// process must be gone 0.5 s later. With `hold_back_pipe`, the test holds another write end of the
/// watcher's pipe back, so that the pipe does not hang up at the watcher's death. Needs root and
/// `unshare`; a test that is not root says so and returns.
pub fn orphan_scene(reuse: bool, hold_back_pipe: bool) {
    use super::{kill, need_tool};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no PID namespace of the test's own; skipped");
        return;
    }
    need_tool("unshare", "--version");
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let at = |f: &str| d.join(f);
    let rd = |f: &str| {
        std::fs::read_to_string(d.join(f))
            .ok()
            .filter(|s| s.ends_with('\n'))
    };
    std::fs::write(at("job.sh"), ORPHAN_JOB).unwrap();
    std::fs::write(at("orphan.sh"), ORPHAN).unwrap();
    let ns = std::process::Command::new("unshare")
        .args([
            "-pf",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            ORPHAN_SCRIPT,
            "orphan",
        ])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .arg("orphan")
        .arg(&d)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(at("ns.err")).unwrap())
        .spawn()
        .unwrap();
    let ns = Started(Some(ns));
    assert!(
        eventually(Duration::from_secs(30), || rd("job").is_some()
            && rd("lockctl").is_some()),
        "the job did not start: {:?}",
        std::fs::read_to_string(at("ns.err"))
    );
    let unshare = ns.id() as i32;
    let init = children_of(unshare)[0];
    let lockctl = rd("lockctl").unwrap().trim().to_string();
    let prefix = format!("lockctl-guard\0--lockctl-guard\0{lockctl}:");
    let mut found = Vec::new();
    assert!(
        eventually(Duration::from_secs(30), || {
            found = in_namespace_of(init, prefix.as_bytes());
            found.len() == 1
        }),
        "the watcher not found: {found:?}"
    );
    let watcher = found[0];
    let inner = inner_pid(watcher).unwrap();
    let taken = if reuse { inner } else { 0 };
    std::fs::write(at("reuse"), format!("{taken}\n")).unwrap();
    // Another write end of the watcher's pipe back, held by the test: the pipe does not hang up
    // when the watcher dies.
    let held = hold_back_pipe.then(|| {
        std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{watcher}/fd/4"))
            .expect("a write end of the watcher's pipe back, through /proc")
    });
    kill(watcher, libc::SIGKILL);
    let errs = || std::fs::read_to_string(at("lockctl.err")).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(30), || rd("orphan_after").is_some()),
        "lockctl did not exit: {}",
        errs()
    );
    let code = rd("status").unwrap();
    let orphan = rd("orphan").unwrap_or_default();
    let after = rd("orphan_after").unwrap();
    drop(held);
    drop(ns);
    eprintln!(
        "the watcher was {inner}; the job's orphan {}; lockctl exited {}; the orphan then: {}; \
         lock key {:?}; {}",
        orphan.trim(),
        code.trim(),
        after.trim(),
        s.get("lockctl:orphan"),
        errs()
    );
    assert!(
        !reuse || orphan.trim() == inner.to_string(),
        "no verdict: the job's orphan did not take the watcher's PID"
    );
    assert_eq!(code.trim(), "76", "{}", errs());
    assert_eq!(
        after.trim(),
        "gone",
        "a process of the job (PID {}, the dead watcher's {inner}) outlived lockctl, which \
         released the lock: {}",
        orphan.trim(),
        errs()
    );
}

/// The lockctl that `strace` (`strace ... lockctl ...`, PID `strace`) started: its child whose
/// executable is lockctl's, waited for up to 20 s (the test fails if none came). Not its first
/// child: strace
/// forks short-lived children of its own at start-up to probe the kernel's ptrace features, and
/// under load a look can find one of them alive (seen: the scene then watched a PID that was gone,
/// while lockctl passed its held system call unseen).
pub fn traced_lockctl(strace: i32) -> i32 {
    let bin = std::path::Path::new(env!("CARGO_BIN_EXE_lockctl"));
    let mut lockctl = 0;
    let started = eventually(Duration::from_secs(20), || {
        lockctl = children_of(strace)
            .into_iter()
            .find(|p| std::fs::read_link(format!("/proc/{p}/exe")).is_ok_and(|e| e == bin))
            .unwrap_or(0);
        lockctl > 0
    });
    assert!(started, "lockctl did not start under strace");
    lockctl
}

/// The children of `pid`, from the kernel's lists of each of its threads.
pub fn children_of(pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

/// `pid`'s PID in its own (innermost) PID namespace.
pub fn inner_pid(pid: i32) -> Option<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// The watcher among the children of `lockctl` (its own child: lockctl adopts orphans), stopped
/// until lockctl says "is stopped", then killed and reaped by lockctl. The job (in `d`) is then told
/// the dead watcher's PID in its namespace (`d/reuse`) and let go on (`d/go`): it starts a process
/// with that PID and writes it to `d/orphan`. Returns the watcher's PID in the namespace, that
/// process's, and its outer PID once lockctl has adopted it (0 if it has not within 10 s).
pub fn stop_kill_and_reuse(
    lockctl: i32,
    d: &std::path::Path,
    errs: impl Fn() -> String,
) -> (i32, i32, i32) {
    use super::kill;
    let read = |f: &str| {
        std::fs::read_to_string(d.join(f))
            .ok()
            .filter(|s| s.ends_with('\n'))
    };
    let mut watcher = 0;
    assert!(
        eventually(Duration::from_secs(30), || {
            watcher = children_of(lockctl)
                .into_iter()
                .find(|&p| {
                    std::fs::read_to_string(format!("/proc/{p}/comm"))
                        .is_ok_and(|c| c.trim() == "lockctl-guard")
                })
                .unwrap_or(0);
            watcher > 0
        }),
        "no verdict: no watcher among lockctl's children: {}",
        errs()
    );
    let inner = inner_pid(watcher).unwrap();
    kill(watcher, libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(10), || errs().contains("is stopped")),
        "lockctl did not see its watcher stopped: {}",
        errs()
    );
    kill(watcher, libc::SIGKILL);
    assert!(
        eventually(Duration::from_secs(10), || !std::path::Path::new(&format!(
            "/proc/{watcher}"
        ))
        .exists()),
        "lockctl did not reap its killed watcher"
    );
    std::fs::write(d.join("reuse"), format!("{inner}\n")).unwrap();
    std::fs::write(d.join("go"), "").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || read("orphan").is_some()),
        "no orphan started: {}",
        errs()
    );
    let orphan: i32 = read("orphan").unwrap().trim().parse().unwrap();
    let mut outer = 0;
    eventually(Duration::from_secs(10), || {
        outer = children_of(lockctl)
            .into_iter()
            .find(|&p| inner_pid(p) == Some(orphan))
            .unwrap_or(0);
        outer > 0
    });
    (inner, orphan, outer)
}

/// True when the test runs as root and `unshare` is there: the namespaces of the test's own need
/// both. A test that is not root says so and does nothing (CI runs as root).
pub fn as_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no namespace of the test's own; skipped");
        return false;
    }
    super::need_tool("unshare", "--version");
    true
}

/// Runs `PRE... sh -c SCRIPT ns LOCKCTL` (PRE an `unshare` command line, say) against the server at
/// `url`, the restart quarantine off (the test has just started that server); output within
/// `limit`.
pub fn ns_script(url: &str, pre: &[&str], script: &str, limit: Duration) -> std::process::Output {
    let child = std::process::Command::new(pre[0])
        .args(&pre[1..])
        .args(["sh", "-c", script, "ns"])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCKCTL_REDIS", url)
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    Started(Some(child)).output(limit)
}

/// Starts `lockctl` on `s` with `args` (`exec NAME ... -- JOB`), its standard output piped and its
/// errors dropped, and reads that output until the job prints a line `ready`; returns the child
/// and lockctl's PID, its output read on by a thread from then on. `unlisted`: lockctl runs in a
/// mount namespace of its own (`unshare -m`, which the watcher shares) where an empty directory
/// `fake` (created here) is mounted over its `/proc/PID/task`, standing in for a kernel without
/// lists of children: the watcher walks all of `/proc` instead. None when that mount cannot be
/// made here; otherwise a job that never says `ready` within 30 s fails the test.
pub fn start_until_ready(
    s: &Server,
    args: &[&std::ffi::OsStr],
    unlisted: Option<&std::path::Path>,
) -> Option<(Child, i32)> {
    let mut cmd = if let Some(fake) = unlisted {
        std::fs::create_dir(fake).unwrap();
        let wrapper = r#"F=$1; shift
"$LOCKCTL" "$@" &
p=$!
if mkdir "$F/$p" && mount --bind "$F" "/proc/$p/task"; then echo "lockctl $p"; else echo "no mount"; kill $p; fi
wait"#;
        let mut cmd = std::process::Command::new("unshare");
        for (k, v) in lockctl_on(s).get_envs() {
            if let Some(v) = v {
                cmd.env(k, v);
            }
        }
        cmd.args(["-m", "sh", "-c", wrapper, "sh"])
            .arg(fake)
            .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
            .stdin(Stdio::null());
        cmd
    } else {
        lockctl_on(s)
    };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut lockctl = unlisted.is_none().then_some(child.id() as i32);
    let (mut ready, mut line) = (false, String::new());
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lockctl.is_none() || !ready {
        line.clear();
        if std::time::Instant::now() > deadline
            || out.read_line(&mut line).unwrap_or(0) == 0
            || line.trim() == "no mount"
        {
            let _ = child.kill();
            let _ = child.wait();
            assert!(unlisted.is_some(), "{args:?}: the job never said ready");
            return None;
        }
        ready |= line.trim() == "ready";
        if let Some(pid) = line.trim().strip_prefix("lockctl ") {
            lockctl = pid.parse().ok();
        }
    }
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    Some((child, lockctl.unwrap()))
}

/// `lockctl exec NAME --ttl TTL --kill-after KILL_AFTER -- sh SCRIPT`, started and awaited until
/// the job says `ready` (see [`start_until_ready`]).
pub fn exec_script(
    s: &Server,
    name: &str,
    script: &std::path::Path,
    ttl: &str,
    kill_after: &str,
) -> Child {
    let args: Vec<&std::ffi::OsStr> = ["exec", name, "--ttl", ttl, "--kill-after", kill_after]
        .into_iter()
        .chain(["--", "sh"])
        .map(std::ffi::OsStr::new)
        .chain([script.as_os_str()])
        .collect();
    start_until_ready(s, &args, None)
        .expect("a job started with the kernel's lists")
        .0
}

/// Field `i` (0-based after the name: 0 state, 1 ppid, 2 pgrp, 3 session, 19 start) of `pid`'s
/// `/proc/PID/stat`.
pub fn stat_field(pid: i32, i: usize) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(i)?
        .parse()
        .ok()
}

/// Whether the kernel's next PID can be aimed here (`/proc/sys/kernel/ns_last_pid` is writable: root
/// in the PID namespace); says so on stderr when not.
pub fn pids_aimable() -> bool {
    let probe = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|v| std::fs::write("/proc/sys/kernel/ns_last_pid", v.trim()).ok());
    if probe.is_none() {
        eprintln!("NOT RUN HERE: /proc/sys/kernel/ns_last_pid is not writable");
    }
    probe.is_some()
}

/// `default` rounds times the whole number in the variable `var` (1 when it is unset or not a
/// number): how a review file's scenes are run longer by hand.
pub fn rounds_times(var: &str, default: usize) -> usize {
    default
        * std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(1)
}

/// A tag unique to this test process, to `n` and to the file (`digit`), fit to follow `sleep SECS.`
/// in a command line: it names the processes a scene started, and only those.
pub fn process_tag(n: usize, digit: u8) -> String {
    format!("{}{:03}{digit}", std::process::id(), n % 1000)
}

/// Clock ticks since boot now (100 a second: the unit of a process's start time in `/proc`).
pub fn ticks_now() -> u64 {
    let up = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs: f64 = up.split_whitespace().next().unwrap().parse().unwrap();
    (secs * 100.0) as u64
}
