//! A review of 93ed0d8 (`src/exec/watcher.rs`): the capacity of the pipe to the watcher is read
//! once, at the watcher's start (`Link`'s third field), and `Link::deadline` keeps the last
//! `PIPE_RESERVE` (8192) bytes of that capacity free of deadlines, so that the words that end the
//! watch (FORGET, DONE) always fit.
//!
//! Three defects, fixed since by `deadline_fits` (42b1bda): the room a deadline must leave now
//! follows the pipe's size, asked with each deadline (two pages free in a pipe of three or more, a
//! page's worth less the words after them in a pipe of two, no deadline in a pipe of one). Their
//! tests stay, with the counts seen before the fix in their comments.

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::Duration;

use support::watchers::{self, exit_within, queued, state, StubbornJob};
use support::*;

/// Sets the capacity of the pipe that `pid` reads on its descriptor `fd`, through a copy of it
/// opened by the test (`/proc/PID/fd/FD`): what any process of the same user can do. Returns
/// F_SETPIPE_SZ's answer (the new capacity, or -1).
fn set_pipe_size(pid: i32, fd: i32, size: i32) -> i32 {
    let pipe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("the watcher's pipe, opened through /proc");
    // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
    unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, size) }
}

/// The capacity of the pipe that `pid` reads on its descriptor `fd`.
fn pipe_size(pid: i32, fd: i32) -> Option<i32> {
    let pipe = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .ok()?;
    // SAFETY: F_GETPIPE_SZ on a descriptor the test owns.
    let n = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_GETPIPE_SZ) };
    (n > 0).then_some(n)
}

/// The PIDs of every `lockctl-guard` whose command line names lockctl `pid`.
fn guards_of(pid: u32) -> Vec<i32> {
    support::watchers::watchers_of(pid)
}

/// The watcher stopped while the job runs (StubbornJob: lockctl sees it stopped, stops the job,
/// which ignores SIGTERM, and renews on, writing every deadline into the stopped watcher's pipe),
/// and the pipe's capacity then lowered to one page by another process of the same user
/// (F_SETPIPE_SZ on a copy opened through `/proc/WATCHER/fd/3`). 93ed0d8 read the capacity once, at
/// the start (64 KiB): lockctl's reserve check now lets deadlines in until the one-page pipe is
/// full (HANDLING + 455 deadlines = 4096 bytes), the write that does not fit counts as a watcher
/// gone and renewal stops; then the job ends, neither FORGET nor DONE fits, `Watcher::done` does
/// not resume the stopped watcher, and it stays behind for good after lockctl's exit. Before
/// 93ed0d8 the capacity was read at every deadline: a one-page pipe (less than the reserve) took
/// no deadline at all, and DONE fitted. 3 runs of 3 at 93ed0d8 (4096 bytes in the pipe, the
/// watcher in state T after lockctl's exit 76); 1 of 1 passed at 93ed0d8^ (10 bytes in the pipe).
/// Any process of the same user (or root) can reach the pipe: the watcher's `/proc/PID/fd/3`,
/// lockctl's own descriptor, and the job's, through `/proc/$PPID/fd`.
///
/// Reproduction: `cargo test --test atk4_review -- --ignored --exact
/// a_watcher_whose_pipe_was_shrunk_is_not_left_behind` (lockctl's own renewals at `--ttl 300ms`,
/// about 50 s).
#[test]
// Fixed by deadline_fits (the room a deadline leaves follows the pipe's size, asked each time): was a defect in 93ed0d8: the pipe's capacity read once goes stale when another process shrinks it (F_SETPIPE_SZ through /proc); renewals fill the pipe, DONE does not fit, the stopped watcher stays behind after lockctl's exit
fn a_watcher_whose_pipe_was_shrunk_is_not_left_behind() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "shrunk", "300ms");
    let before = pipe_size(watcher, 3);
    let set = set_pipe_size(watcher, 3, 4096);
    assert_eq!(set, 4096, "F_SETPIPE_SZ refused ({before:?} before)");
    eprintln!("the watcher's pipe: {before:?} bytes, now {set}");
    // lockctl renews every 0.1 s; the pipe holds 4096 bytes: within 120 s it is full, or lockctl
    // has stopped writing to it (it took a write that did not fit for a watcher gone).
    let mut last = (queued(watcher, 3), std::time::Instant::now());
    let settled = eventually(Duration::from_secs(120), || {
        let q = queued(watcher, 3);
        if q != last.0 {
            last = (q, std::time::Instant::now());
        }
        q.is_some_and(|q| q >= 4096 - 8) || last.1.elapsed() > Duration::from_secs(3)
    });
    let bytes = queued(watcher, 3);
    let still = child
        .0
        .as_mut()
        .unwrap()
        .try_wait()
        .ok()
        .flatten()
        .is_none();
    eprintln!("pipe settled: {settled}, {bytes:?} bytes; lockctl running: {still}");
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let after = queued(watcher, 3);
    drop(stopped);
    assert!(
        eventually(Duration::from_secs(10), || guards_of(lockctl).is_empty()),
        "a lockctl-guard of lockctl {lockctl} is still running after the cleanup"
    );
    assert_eq!(s.get("lockctl:shrunk"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} (state {how:?}, {after:?} bytes in its {set}-byte pipe) outlived \
         its lockctl {lockctl}, which exited 76 for it: {errs}"
    );
}

/// A user ID no account and no process of this machine uses, for the unprivileged test whose
/// user is past its pipe limit.
const OTHER_UID: u32 = 47_123;
/// Another, for its control (tests run in parallel: this one must not share the first's pipes).
const CONTROL_UID: u32 = 47_124;

/// A process of [`OTHER_UID`] (`sleep 300`) that holds pipes enlarged to 1 MiB until that user's
/// pipe pages pass `/proc/sys/fs/pipe-user-pages-soft` (16384 pages by default: 1024 pipes of the
/// default 64 KiB, or 65 of 1 MiB): the kernel then creates that user's new pipes with two pages
/// (8 KiB) instead of sixteen. What a user with many processes (a desktop, a CI runner's builds)
/// reaches without trying. Killed and reaped when dropped.
struct PipeHog {
    _sleep: watchers::Started,
}

impl PipeHog {
    fn start() -> PipeHog {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("300").uid(OTHER_UID).gid(OTHER_UID);
        // SAFETY: pipe2 and fcntl only (async-signal-safe), after std set the user ID.
        unsafe {
            cmd.pre_exec(|| {
                for _ in 0..200 {
                    let mut fds = [0; 2];
                    if libc::pipe2(fds.as_mut_ptr(), 0) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if libc::fcntl(fds[0], libc::F_SETPIPE_SZ, 1 << 20) < 0 {
                        // EPERM: past the soft limit.
                        return Ok(());
                    }
                }
                Err(std::io::Error::other("the soft limit was never reached"))
            });
        }
        let sleep = cmd
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("sleep as another user, with its pipes");
        PipeHog {
            _sleep: watchers::Started(Some(sleep)),
        }
    }
}

/// The size of a pipe that a process of `uid` creates now.
fn new_pipe_size_for(uid: u32) -> i32 {
    // Measured in a fork of the test that takes the user ID and reports through its exit code.
    // SAFETY: fork, then only setgid/setuid/pipe2/fcntl/_exit in the child.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            if libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(255);
            }
            let mut fds = [0; 2];
            if libc::pipe2(fds.as_mut_ptr(), 0) != 0 {
                libc::_exit(254);
            }
            let size = libc::fcntl(fds[0], libc::F_GETPIPE_SZ);
            libc::_exit((size / 4096).min(253));
        }
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        libc::WEXITSTATUS(status) * 4096
    }
}

/// The PIDs of the processes that run as `uid`.
fn processes_of(uid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/status")).is_ok_and(|s| {
                s.lines().any(|l| {
                    l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some(&uid.to_string())
                })
            })
        })
        .filter(|&p| alive(p))
        .collect()
}

/// `rounds` runs of `lockctl exec NAME -- sh -c 'exit 3'` as `uid`: each one's exit code, whether
/// its lock was released, and its stderr.
fn exec_as(uid: u32, s: &Server, tag: &str, rounds: usize) -> Vec<(Option<i32>, bool, String)> {
    use std::os::unix::process::CommandExt;
    (0..rounds)
        .map(|round| {
            let name = format!("{tag}{round}");
            let mut cmd = lockctl_on(s);
            cmd.uid(uid).gid(uid).env("HOME", "/tmp");
            let o = run(cmd.args(["exec", &name, "--", "sh", "-c", "exit 3"]));
            let released = s.get(&format!("lockctl:{name}")).is_none();
            (o.status.code(), released, stderr(&o))
        })
        .collect()
}

/// The control for [`an_unprivileged_user_past_its_pipe_soft_limit_runs_its_command`]: the same
/// user (another ID), not past its limit (64 KiB pipes), runs its command and gets its exit code (3 runs).
#[test]
fn an_unprivileged_user_runs_its_command() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot take another user ID; skipped");
        return;
    }
    assert_eq!(
        processes_of(CONTROL_UID),
        Vec::<i32>::new(),
        "uid {CONTROL_UID} is in use"
    );
    let s = Server::start_tcp();
    let size = new_pipe_size_for(CONTROL_UID);
    let results = exec_as(CONTROL_UID, &s, "free", 3);
    eprintln!("new pipes of uid {CONTROL_UID}: {size} bytes; {results:#?}");
    for (code, released, err) in &results {
        assert!(released, "the lock was not released: {err}");
        assert_eq!(
            *code,
            Some(3),
            "the command's exit code did not come back: {err}"
        );
    }
    assert!(
        eventually(Duration::from_secs(10), || processes_of(CONTROL_UID)
            .is_empty()),
        "processes of uid {CONTROL_UID} left: {:?}",
        processes_of(CONTROL_UID)
    );
}

/// `lockctl exec NAME -- sh -c 'exit 3'` run by an unprivileged user whose pipe pages are past
/// the soft limit (fs.pipe-user-pages-soft), so that the kernel gives its new pipes two pages
/// (8192 bytes) of capacity. The reserve (8192 bytes, 93ed0d8 and before it since 226aae7) leaves
/// `size - PIPE_RESERVE = 0` bytes for deadlines: the first deadline, at the grant, counts as a
/// watcher that does not read, the watcher is replaced once and refused again, and exec fails
/// (exit 1, "cannot start the watcher process ...: the watcher process ended, stopped or stayed
/// silent at its start") without running the command, on every run, for as long as that user
/// holds its pipes. The lock is released. 3 execs of 3 in each of 4 runs at 93ed0d8, 3 of 3 at
/// 93ed0d8^; at cf62c68 (a 16-byte reserve) all 3 ran their command and passed its exit code
/// through: the two-page reserve of 226aae7 brought it. The control, the same exec as a user not
/// past its limit, passes (`an_unprivileged_user_runs_its_command`).
///
/// Reproduction: `cargo test --test atk4_review -- --ignored --exact
/// an_unprivileged_user_past_its_pipe_soft_limit_runs_its_command` (as root: it takes uid 47123
/// for the pipes and for lockctl).
#[test]
// Fixed by deadline_fits (the room a deadline leaves follows the pipe's size, asked each time): was a defect (since the two-page reserve of 226aae7, kept by 93ed0d8): a user past fs.pipe-user-pages-soft gets 8 KiB pipes, the 8 KiB reserve leaves no room for any deadline, and exec never runs the command
fn an_unprivileged_user_past_its_pipe_soft_limit_runs_its_command() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: cannot take another user ID; skipped");
        return;
    }
    assert_eq!(
        processes_of(OTHER_UID),
        Vec::<i32>::new(),
        "uid {OTHER_UID} is in use"
    );
    let s = Server::start_tcp();
    let hog = PipeHog::start();
    let small = eventually(Duration::from_secs(10), || {
        new_pipe_size_for(OTHER_UID) == 8192
    });
    let size = new_pipe_size_for(OTHER_UID);
    let results = exec_as(OTHER_UID, &s, "hog", 3);
    drop(hog);
    eprintln!("new pipes of uid {OTHER_UID}: {size} bytes (small: {small}); {results:#?}");
    assert!(
        eventually(Duration::from_secs(10), || processes_of(OTHER_UID)
            .is_empty()),
        "processes of uid {OTHER_UID} left: {:?}",
        processes_of(OTHER_UID)
    );
    assert!(small, "the user's pipes never became small ({size})");
    for (code, released, err) in &results {
        assert!(released, "the lock was not released: {err}");
        assert_eq!(
            *code,
            Some(3),
            "the command's exit code did not come back: {err}"
        );
    }
}

/// What a watcher left stopped by [`a_watcher_whose_pipe_was_shrunk_is_not_left_behind`] does
/// when it is resumed later (any SIGCONT: `pkill -CONT`, a `kill -CONT -1`, a debugger's
/// detach): it reads HANDLING and the deadlines, but neither FORGET (lockctl's "the group's ID
/// may be reused from now on") nor DONE, which did not fit, then end-of-file, and takes lockctl
/// for dead without a "done": it stops and kills the job's group by its old ID. In a PID namespace
/// of the test's own, after lockctl's exit 76 the job's old group ID is handed to a `setsid sleep
/// 60` (`ns_last_pid`), an unrelated process group; the watcher is then resumed. Before 93ed0d8
/// FORGET and DONE fitted (the capacity was read at every deadline), `Watcher::done` resumed the
/// watcher at lockctl's exit and it exited at once. Failed in 4 runs of 4 at 93ed0d8 (each time
/// the watcher left in state T with 4096 bytes in its pipe; in the two runs whose message was
/// read, the `setsid sleep` killed, status 137); passed 1 of 1 at 93ed0d8^ (no watcher left).
///
/// Reproduction: `cargo test --test atk4_review -- --ignored --exact
/// a_left_watcher_resumed_later_does_not_kill_a_group_that_reused_the_jobs_id` (root: a PID
/// namespace and ns_last_pid; about 60 s).
#[test]
// Fixed by deadline_fits (the room a deadline leaves follows the pipe's size, asked each time): was a defect in 93ed0d8: the watcher left stopped by a shrunk pipe (no FORGET, no DONE) kills, once resumed, the process group that took the job's old group ID
fn a_left_watcher_resumed_later_does_not_kill_a_group_that_reused_the_jobs_id() {
    watchers::left_watcher_scene("300ms", |watcher| {
        assert_eq!(set_pipe_size(watcher, 3, 4096), 4096);
        // lockctl's renewals (every 0.1 s) fill the pipe as far as they may; settled once none
        // came for 3 s, or at the page's end.
        let mut last = (queued(watcher, 3), std::time::Instant::now());
        eventually(Duration::from_secs(120), || {
            let q = queued(watcher, 3);
            if q != last.0 {
                last = (q, std::time::Instant::now());
            }
            q.is_some_and(|q| q >= 4096 - 8) || last.1.elapsed() > Duration::from_secs(3)
        });
        format!("{:?} bytes in the 4096-byte pipe", queued(watcher, 3))
    });
}

/// The other way round: the pipe's capacity raised to 1 MiB by another process after the start
/// (the check then works from a capacity smaller than the real one). The stopped watcher's pipe
/// is filled by the test to where lockctl's check stops deadlines (`queued + 9 > 65536 - 8192`,
/// lockctl's own 9-byte words through its descriptor, as atkwatcher3_review does); the job then
/// ends: FORGET and DONE fit, `Watcher::done` resumes the watcher, which exits; lockctl exits 76
/// (its watcher was stopped) and releases the lock. Holds.
#[test]
fn a_pipe_grown_after_the_start_still_takes_done() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "grown", "5s");
    let set = set_pipe_size(watcher, 3, 1 << 20);
    assert_eq!(set, 1 << 20, "F_SETPIPE_SZ refused");
    let mut pipe =
        watchers::writer_of(lockctl, watcher, 3).expect("lockctl's end of the watcher's pipe");
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    let mut words = 0;
    while queued(watcher, 3).is_some_and(|q| q + 9 <= 65536 - 8192)
        && std::io::Write::write(&mut pipe, &word).is_ok_and(|n| n == word.len())
    {
        words += 1;
    }
    drop(pipe);
    // A renewal or two more (every 1.7 s): lockctl's check refuses them.
    std::thread::sleep(Duration::from_secs(4));
    let bytes = queued(watcher, 3);
    eprintln!("{words} words written; {bytes:?} bytes in the stopped watcher's 1 MiB pipe");
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    drop(stopped);
    assert_eq!(s.get("lockctl:grown"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} outlived its lockctl {lockctl}: {errs}"
    );
    assert!(eventually(Duration::from_secs(10), || guards_of(lockctl).is_empty()));
}

/// A watcher stopped through many quick renewals (`--ttl 60ms`, one every 20 ms, for 5 s: a few
/// thousand bytes of deadlines in its pipe, below the reserve), then resumed while the job (which
/// ignores the SIGTERM lockctl sent when it saw the watcher stopped) still runs: it reads its pipe
/// empty, does not kill the job early (`--kill-after 1h`), and once the job ends it gets DONE and
/// exits; lockctl exits 76 (its watcher was stopped) and releases the lock. A lease lost to a
/// renewal that came late (a loaded machine) ends the renewals early and is no verdict on the
/// watcher: the test then only checks the same ending.
#[test]
fn a_watcher_stopped_through_quick_renewals_then_resumed_gets_done() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "quick", "60ms");
    std::thread::sleep(Duration::from_secs(5));
    let bytes = queued(watcher, 3);
    kill(watcher, libc::SIGCONT);
    assert!(
        eventually(Duration::from_secs(10), || queued(watcher, 3) == Some(0)
            && state(watcher) != Some('T')),
        "the resumed watcher did not empty its pipe"
    );
    // The job still runs a second after the resume: no early kill.
    std::thread::sleep(Duration::from_secs(1));
    let running = child
        .0
        .as_mut()
        .unwrap()
        .try_wait()
        .ok()
        .flatten()
        .is_none();
    eprintln!("{bytes:?} bytes were in the stopped watcher's pipe; lockctl running: {running}");
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(running, "the job was stopped before it ended: {errs}");
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    drop(stopped);
    assert_eq!(s.get("lockctl:quick"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} outlived its lockctl {lockctl}: {errs}"
    );
    assert!(eventually(Duration::from_secs(10), || guards_of(lockctl).is_empty()));
}

/// Renewals racing DONE: 24 execs whose job exits 7 after 0 to 0.46 s (`--ttl 300ms`: a renewal
/// every 0.1 s, so the job's end, FORGET and DONE fall anywhere between two deadlines, and a
/// renewal in flight when DONE is written finds the watcher gone). Each must pass 7 through,
/// release its lock, and leave no `lockctl-guard` of its own. An exec that exits 76 because its
/// lease ran out (a loaded machine; lockctl says "validity ran out") is no verdict and is counted
/// apart; any other outcome fails.
#[test]
fn renewals_racing_done_pass_the_exit_code_and_leave_nothing() {
    let s = Server::start();
    let mut late = 0;
    let mut bad = Vec::new();
    for round in 0..24 {
        let name = format!("race{round}");
        let script = format!("sleep 0.{:02}; exit 7", round * 2);
        let child = lockctl_on(&s)
            .args(["exec", &name, "--ttl", "300ms", "--", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = wait_output(child, Duration::from_secs(60));
        let errs = stderr(&out);
        let released = s.get(&format!("lockctl:{name}")).is_none();
        let clean = eventually(Duration::from_secs(10), || guards_of(pid).is_empty());
        match out.status.code() {
            Some(7) if released && clean => {}
            Some(76) if errs.contains("validity ran out") && released && clean => late += 1,
            code => bad.push(format!(
                "{name}: exit {code:?}, released {released}, no watcher left {clean}: {errs}"
            )),
        }
    }
    eprintln!("24 execs: {late} lost to a late renewal (no verdict)");
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(late < 24, "every exec lost its lease: no verdict");
}
