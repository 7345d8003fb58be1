//! A review of `exec`'s job supervision after the watcher learned to find orphans in a container
//! (session ID 0, orphans of a PID 1 in lockctl's session) and lockctl learned to stop the job when
//! its watcher is gone. Each test is a reproduction of what the review found:
//!
//! - **False kills.** The watcher of a SIGKILLed lockctl takes for the job's orphans processes that
//!   are not the job's: another lockctl's watcher started just before, in the same session (that
//!   lockctl then stops its own job and exits 76); in a container, the children of the container's
//!   first process, whose parent is PID 1 without their being orphans, and whose process group reads
//!   0 (the group's leader is outside the namespace), as does the forgotten group's ID; and the
//!   caller's own orphans, once a member of the job has joined the caller's process group.
//! - **lockctl as PID 1 of a PID namespace** (`unshare -pf`, a container without an init): the
//!   watcher, forked twice to leave lockctl's children, comes back to it, since PID 1 adopts every
//!   orphan of the namespace; lockctl waits for its last child, the watcher for lockctl's "done", and
//!   the lock is renewed forever after the command ended.
//! - **Both guards out of the way.** The watcher SIGKILLed and lockctl SIGKILLed before its next
//!   renewal (which is when it noticed), or the watcher stopped (which lockctl never noticed) and
//!   lockctl SIGKILLed at any time after: nothing was left to stop the job, which ran on while
//!   another client held the lock. lockctl now notices at once. With both stopped nothing can act
//!   until one resumes (a stated limit); the test checks what happens then.
//! - **A blocking write.** A stopped watcher's pipe fills with deadlines; lockctl's renewal thread
//!   then blocks writing to it while it holds the deadline's lock, and the deadline timer with it:
//!   a running lockctl lets its job run on after the lease ran out.
//! - **A forgotten group.** Once lockctl has reaped the command's first process, the watcher forgets
//!   the job's group: a member that re-forks inside that group, each copy living less than the
//!   watcher's tenth of a second, outlives a SIGKILLed lockctl without ever leaving the group.
//!
//! The container is `unshare -pf --kill-child --mount-proc` (root and util-linux's `unshare`;
//! where the kernel does not permit it, those tests say so and check nothing); the
//! servers are started by each test, so the restart quarantine is off for them (`lockctl()` sets
//! `LOCKCTL_QUARANTINE=0`, and the scripts run inside the container set it the same way).

mod support;

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::watchers::watchers_of;
use support::*;

/// Loops: appends a line to `$1/log` every 50 ms until `$1/stop` appears.
const LOOP: &str = r#"i=0
while [ $i -lt 2000 ] && [ ! -e "$1/stop" ]; do echo "$$" >> "$1/log"; sleep 0.05; i=$((i+1)); done
"#;

fn lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// One attempt at `name`: true if busy (75), false if granted (0).
fn busy(s: &Server, name: &str) -> bool {
    for _ in 0..50 {
        let o = run(lockctl_on(s).args(["acquire", name, "-n", "--ttl", "60s"]));
        match code(&o) {
            75 => return true,
            0 => return false,
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    panic!("no attempt at '{name}' came to a verdict");
}

/// `exec NAME --ttl TTL --kill-after 1s -- sh -c SCRIPT`, waiting for the script's `ready` line.
fn start(s: &Server, name: &str, ttl: &str, script: &str) -> std::process::Child {
    let mut child = lockctl_on(s)
        .args(["exec", name, "--ttl", ttl, "--kill-after", "1s", "--"])
        .args(["sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    child
}

/// A PID namespace with its own `/proc`, as in a container: `unshare -pf --kill-child
/// --mount-proc PROGRAM ARGS`, whose first process is PROGRAM (PID 1), with every process of the
/// namespace killed when `unshare` dies. `None`, said on stderr, where the kernel does not let this
/// process create one (not root, or inside a container that forbids it): that is a permission of
/// the machine, not a missing part of the suite, so the test has nothing to check there.
fn container(program: &str, args: &[&str]) -> Option<Command> {
    let probe = Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "NOT RUN HERE: the PID-namespace case needs `unshare -pf --mount-proc`, which this \
             machine does not permit ({why})"
        );
        return None;
    }
    let mut c = Command::new("unshare");
    c.args(["-pf", "--kill-child", "--mount-proc", program])
        .args(args)
        .stdin(Stdio::null());
    Some(c)
}

/// A line `KEY VALUE` of the output `out`, by key.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no '{key}' line in:\n{out}"))
}

/// Two `lockctl exec` in one session, the second started just before the first is killed by
/// SIGKILL: the first one's watcher took the second one's watcher (an orphan of init in the same
/// session, leading a group of its own, started since its last look) for an orphan of its job and
/// killed it; the second lockctl then stopped its command and exited 76.
#[test]
fn one_lockctl_s_death_spares_the_watcher_of_another_in_the_same_session() {
    let s = Server::start();
    let mut first = start(&s, "first", "10s", "echo ready; exec sleep 30");
    let second = lockctl_on(&s)
        .args(["exec", "second", "--ttl", "2s", "--", "sleep", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut watcher = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            watcher = watchers_of(second.id()).first().copied();
            watcher.is_some()
        }),
        "the second lockctl has a watcher"
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let second = wait_output(second, Duration::from_secs(60));
    assert_eq!(
        code(&second),
        0,
        "the second lockctl's command was stopped when the first lockctl died: {}",
        stderr(&second)
    );
}

/// The container's first process (a shell without job control) started two `lockctl exec`. The
/// first one's command left a process behind and exited, so its watcher forgot the group; the
/// first lockctl is then killed by SIGKILL. The second lockctl's process group reads 0 (its leader
/// is outside the namespace), as does the forgotten group: its watcher took the second lockctl, a
/// child of PID 1, for an orphan of its job, and killed its command.
const PGID_ZERO: &str = r#"L=$1
$L exec first --ttl 10s -- sh -c 'sleep 30 & exit 0' & first=$!
sleep 1
$L exec second --ttl 2s -- sleep 3 & second=$!
sleep 1
kill -9 $first
wait $second
echo "second $?"
"#;

#[test]
fn in_a_container_one_lockctl_s_death_spares_another_lockctl_s_command() {
    let s = Server::start();
    let script = s.dir().join("pgid0.sh");
    std::fs::write(&script, PGID_ZERO).unwrap();
    let Some(mut container) = container(
        "sh",
        &[script.to_str().unwrap(), env!("CARGO_BIN_EXE_lockctl")],
    ) else {
        return;
    };
    let out = wait_output(
        container
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    );
    let text = stdout(&out);
    assert_eq!(
        field(&text, "second"),
        "0",
        "the second lockctl's command was killed when the first lockctl died: {}",
        stderr(&out)
    );
}

/// The container's first process, a shell with job control, starts a background command (a group
/// of its own, whose parent is PID 1) just before the `lockctl exec` it started earlier is killed
/// by SIGKILL: the watcher took that command for a recent orphan of its job and killed it.
const JOB_CONTROL: &str = r#"set -m
L=$1
$L exec first --ttl 10s -- sleep 30 & first=$!
sleep 1
sleep 5 & innocent=$!
kill -9 $first
sleep 1
if kill -0 $innocent 2>/dev/null; then echo "innocent alive"; else echo "innocent killed"; fi
kill $innocent 2>/dev/null
wait $innocent 2>/dev/null
"#;

#[test]
fn in_a_container_a_lockctl_s_death_spares_a_command_the_first_process_just_started() {
    let s = Server::start();
    let script = s.dir().join("jobcontrol.sh");
    std::fs::write(&script, JOB_CONTROL).unwrap();
    let Some(mut container) = container(
        "bash",
        &[script.to_str().unwrap(), env!("CARGO_BIN_EXE_lockctl")],
    ) else {
        return;
    };
    let out = wait_output(
        container
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    );
    let text = stdout(&out);
    assert_eq!(
        field(&text, "innocent"),
        "alive",
        "a process outside the job died with its lockctl: {}",
        stderr(&out)
    );
}

/// lockctl as the first process of a PID namespace (a container without an init process): its
/// watcher, orphaned by the middle process, is adopted by lockctl itself, which then waits for it
/// forever after the command ended, renewing the lock.
#[test]
fn lockctl_as_pid_1_of_a_namespace_exits_when_its_command_does() {
    let s = Server::start();
    let Some(mut container) = container(
        env!("CARGO_BIN_EXE_lockctl"),
        &["exec", "pid1", "--ttl", "2s", "--", "true"],
    ) else {
        return;
    };
    let out = wait_output(
        container
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(20),
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "lockctl did not end with its command (killed after 20 s): {}",
        stderr(&out)
    );
    assert!(!busy(&s, "pid1"), "the lock was released");
}

/// Starts a job whose member loops outside the command's group's leader (`sh loop.sh &`), and
/// returns lockctl and its watcher.
fn looping_job(s: &Server, name: &str, ttl: &str) -> (std::process::Child, i32) {
    std::fs::write(s.dir().join("loop.sh"), LOOP).unwrap();
    let dir = s.dir().display();
    let child = start(
        s,
        name,
        ttl,
        &format!("sh {dir}/loop.sh {dir} & echo ready; wait"),
    );
    let mut watcher = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            watcher = watchers_of(child.id()).first().copied();
            watcher.is_some()
        }),
        "lockctl has a watcher"
    );
    (child, watcher.unwrap())
}

/// Waits until another client is granted `name`, then says whether the job still writes; stops the
/// job either way.
fn writes_under_the_next_holder(s: &Server, name: &str) -> bool {
    assert!(
        eventually(Duration::from_secs(30), || !busy(s, name)),
        "the lease never ran out in Redis"
    );
    let before = lines(s.dir());
    std::thread::sleep(Duration::from_millis(1000));
    let after = lines(s.dir());
    std::fs::write(s.dir().join("stop"), "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    after > before
}

/// The watcher is killed, then lockctl, before lockctl's next renewal (when it would notice the
/// watcher is gone): nobody is left to stop the job, whose member runs on under the next holder.
#[test]
fn a_job_dies_with_lockctl_killed_just_after_its_watcher() {
    let s = Server::start();
    let (mut child, watcher) = looping_job(&s, "both", "6s");
    std::thread::sleep(Duration::from_millis(500));
    kill(watcher, libc::SIGKILL);
    std::thread::sleep(Duration::from_millis(200));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !writes_under_the_next_holder(&s, "both"),
        "a job member ran on while another client held the lock"
    );
}

/// lockctl and its watcher both stopped (`kill -STOP`, or an unanchored `pkill -STOP lockctl`,
/// which matches both): nothing runs that could stop the job, which runs on while the lease runs
/// out and another client holds the lock (a stated limit: the fencing token is what covers a
/// holder that cannot be stopped in time). Once they resume, the job is stopped at once and
/// lockctl exits 76.
#[test]
fn a_job_is_stopped_once_lockctl_and_its_watcher_resume_from_both_being_stopped() {
    let s = Server::start();
    let (child, watcher) = looping_job(&s, "stopped", "2s");
    std::thread::sleep(Duration::from_millis(500));
    let pid = child.id() as i32;
    kill(pid, libc::SIGSTOP);
    kill(watcher, libc::SIGSTOP);
    let granted = eventually(Duration::from_secs(30), || !busy(&s, "stopped"));
    kill(watcher, libc::SIGCONT);
    kill(pid, libc::SIGCONT);
    let out = wait_output(child, Duration::from_secs(30));
    let before = lines(s.dir());
    std::thread::sleep(Duration::from_millis(1000));
    let after = lines(s.dir());
    std::fs::write(s.dir().join("stop"), "").unwrap();
    assert!(granted, "the lease never ran out in Redis");
    assert_eq!(code(&out), 76, "{}", stderr(&out));
    assert_eq!(before, after, "the job ran on after lockctl ended");
}

/// Hops: appends a line, then starts its next copy in the background and exits; each copy lives a
/// few tens of milliseconds, in the job's group.
const HOP: &str = r#"n=$2
[ "$n" -le 0 ] && exit 0
[ -e "$1/stop" ] && exit 0
echo "$$" >> "$1/log"
sleep 0.02
sh "$1/hop.sh" "$1" $((n-1)) &
exit 0
"#;

/// The command's first process exits and leaves a member in the job's group that re-forks (each
/// copy lives less than the watcher's tenth of a second); lockctl is then killed by SIGKILL. lockctl
/// told the watcher to forget the group when it reaped its leader, so the watcher neither signals
/// the group nor counts its ID among the job's groups when it looks for orphans: the chain, which
/// never left the group, runs on under the next holder. (With the leader alive, the same chain is
/// killed with the group.)
#[test]
fn a_member_re_forking_in_the_job_s_group_after_its_leader_exited_dies_with_lockctl() {
    let s = Server::start();
    std::fs::write(s.dir().join("hop.sh"), HOP).unwrap();
    let dir = s.dir().display();
    let mut child = start(
        &s,
        "hopper",
        "2s",
        &format!("sh {dir}/hop.sh {dir} 400 & echo ready; exit 0"),
    );
    // Long enough for lockctl to have reaped the first process and the watcher to have looked.
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !writes_under_the_next_holder(&s, "hopper"),
        "a job member ran on while another client held the lock"
    );
}

/// The same chain while the first process lives (the watcher still knows the group): it is killed
/// with the group, so the failure above is the forgotten group's.
#[test]
fn a_member_re_forking_in_the_job_s_group_dies_with_lockctl_while_its_leader_lives() {
    let s = Server::start();
    std::fs::write(s.dir().join("hop.sh"), HOP).unwrap();
    let dir = s.dir().display();
    let mut child = start(
        &s,
        "hopper2",
        "2s",
        &format!("sh {dir}/hop.sh {dir} 400 & echo ready; sleep 100"),
    );
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !writes_under_the_next_holder(&s, "hopper2"),
        "a job member ran on while another client held the lock"
    );
}

/// The watcher stopped (SIGSTOP) used to go unnoticed: lockctl's writes to its pipe still
/// succeeded, so lockctl renewed on, and once lockctl was killed by SIGKILL, however much later,
/// nothing stopped the job. lockctl now checks its watcher every tenth of a second: a stopped one
/// guards nothing, so lockctl stops the job and exits 76, before the SIGKILL.
#[test]
fn a_job_dies_with_lockctl_killed_while_its_watcher_is_stopped() {
    let s = Server::start();
    let (mut child, watcher) = looping_job(&s, "paused", "2s");
    std::thread::sleep(Duration::from_millis(500));
    kill(watcher, libc::SIGSTOP);
    // Several renewals (every TTL/3) would go by with the watcher stopped.
    std::thread::sleep(Duration::from_millis(2000));
    let ended = child.try_wait().unwrap();
    let _ = child.kill();
    let status = child.wait().unwrap();
    let ran_on = writes_under_the_next_holder(&s, "paused");
    kill(watcher, libc::SIGCONT);
    assert!(
        ended.is_some() && status.code() == Some(76),
        "lockctl ran on with its watcher stopped ({status:?})"
    );
    assert!(
        !ran_on,
        "a job member ran on while another client held the lock"
    );
}

/// A member of the job joins the process group of lockctl's caller (`setpgid` into an existing
/// group of the session), and the caller has an orphan of its own in that group, started after
/// lockctl. When lockctl is killed by SIGKILL, the watcher counts the caller's group among the
/// job's groups and kills every orphan in it: the caller's process, which was never the job's.
#[test]
fn one_lockctl_s_death_spares_its_caller_s_orphan_in_a_group_a_member_joined() {
    let s = Server::start();
    // SAFETY: getpgrp has no preconditions.
    let caller_group = unsafe { libc::getpgrp() };
    let mut child = start(
        &s,
        "joiner",
        "2s",
        &format!(
            "perl -e 'setpgrp(0, {caller_group}) or die; exec \"sleep\", \"30\"' & echo ready; wait"
        ),
    );
    // The caller's orphan: its parent exits at once, leaving it in the caller's group.
    let out = run(Command::new("sh").args(["-c", "sleep 30 >/dev/null 2>&1 & echo $!"]));
    let orphan: i32 = stdout(&out).parse().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let survived = alive(orphan);
    kill(orphan, libc::SIGKILL);
    assert!(survived, "the caller's own process died with lockctl's job");
}

/// The watcher stopped: lockctl's deadline messages fill its pipe (shrunk here to one page, so
/// that it fills in seconds rather than the hour a 64 KiB pipe takes at this TTL), and the renewal
/// thread blocks in the write, inside the deadline's lock. The deadline timer then waits for that
/// lock, so nothing stops the job: lockctl runs, not stopped, while another client is granted the
/// lock and the job writes on.
#[test]
fn a_stopped_watcher_does_not_keep_lockctl_from_stopping_its_job() {
    let s = Server::start();
    let (mut child, watcher) = looping_job(&s, "fullpipe", "200ms");
    kill(watcher, libc::SIGSTOP);
    let fd_path = std::ffi::CString::new(format!("/proc/{watcher}/fd/3")).unwrap();
    // SAFETY: open and fcntl on a path and descriptor of our own; the descriptor is closed after.
    unsafe {
        let fd = libc::open(fd_path.as_ptr(), libc::O_RDONLY | libc::O_NONBLOCK);
        assert!(fd >= 0, "the watcher's pipe can be opened");
        assert!(libc::fcntl(fd, libc::F_SETPIPE_SZ, 4096) >= 0);
        libc::close(fd);
    }
    let granted = eventually(Duration::from_secs(120), || !busy(&s, "fullpipe"));
    let running = child.try_wait().unwrap().is_none();
    let before = lines(s.dir());
    std::thread::sleep(Duration::from_millis(1000));
    let after = lines(s.dir());
    std::fs::write(s.dir().join("stop"), "").unwrap();
    kill(watcher, libc::SIGCONT);
    let _ = wait_output(child, Duration::from_secs(30));
    assert!(granted, "the lease never ran out in Redis");
    assert!(
        !(running && after > before),
        "lockctl ran, and so did its job, while another client held the lock"
    );
}

/// lockctl as the first process of a PID namespace (its watcher is then its own child, and so
/// among the processes the watcher's walker finds under lockctl), `--ttl 2s --kill-after 1s`. The
/// command starts ten processes that leave its group (`setsid`) and ignore SIGTERM, then waits.
/// The test stops lockctl (SIGSTOP): once the lease's deadline passes, the watcher stops the job
/// on its own, SIGTERM and, a second later, SIGKILL to the group and to every process its walker
/// finds, in the order of a hash map. It must never signal itself: were it among the processes it
/// signals, its SIGKILL to its own group would end it part-way, and the escaped processes after
/// it would run on under no lease. All ten must be gone within 20 s of lockctl's stop, while
/// lockctl is still stopped, and the watcher still there. Written for the walker's `p.pid != self.me && p.pid != self.lockctl`
/// → `||` (`src/exec/procs.rs`, `Walker::signal`), which an earlier mutation round left without a
/// test (docs/testing.md, twentieth round).
#[test]
fn a_pid1_lockctl_s_watcher_kills_every_escaped_process_and_not_itself_first() {
    let s = Server::start();
    let dir = s.dir().display();
    let job = format!(
        "for i in 1 2 3 4 5 6 7 8 9 10; do setsid sh -c \"trap '' TERM; echo \\$\\$ >> {dir}/escaped; exec sleep 600\" & done; wait"
    );
    let Some(mut container) = container(
        env!("CARGO_BIN_EXE_lockctl"),
        &[
            "exec",
            "escapees",
            "--ttl",
            "2s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            &job,
        ],
    ) else {
        return;
    };
    let mut ns = support::watchers::Started(Some(
        container
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    ));
    let unshare = ns.id() as i32;
    let mut lockctl = 0;
    assert!(
        eventually(Duration::from_secs(20), || {
            lockctl = support::watchers::children_of(unshare)
                .first()
                .copied()
                .unwrap_or(0);
            lockctl > 0
        }),
        "lockctl did not start"
    );
    let mut escaped = Vec::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            escaped = support::watchers::in_namespace_of(lockctl, b"sleep\x00600");
            escaped.len() == 10
        }),
        "the ten escaped processes did not start: {escaped:?}"
    );
    let watcher = support::watchers::in_namespace_of(lockctl, b"lockctl-guard\x00");
    assert_eq!(watcher.len(), 1, "no single watcher: {watcher:?}");
    assert_eq!(
        support::watchers::ppid(watcher[0]),
        Some(lockctl),
        "the watcher is not the child of lockctl, the namespace's first process"
    );
    kill(lockctl, libc::SIGSTOP);
    let resume = support::watchers::Resume(lockctl);
    let gone = eventually(Duration::from_secs(20), || {
        escaped.iter().all(|&p| !alive(p))
    });
    let left: Vec<i32> = escaped.iter().copied().filter(|&p| alive(p)).collect();
    let watcher_alive = alive(watcher[0]);
    drop(resume);
    let status = support::watchers::exit_within(ns.0.as_mut().unwrap(), Duration::from_secs(20));
    ns.0.take();
    eprintln!("left: {left:?}; the watcher alive: {watcher_alive}; lockctl {status:?}");
    assert!(
        gone,
        "escaped processes {left:?} outlived the lease while lockctl was stopped (the watcher \
         alive: {watcher_alive})"
    );
    assert!(
        watcher_alive,
        "the watcher signalled itself with the job (it is gone while lockctl is stopped)"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(76));
}
