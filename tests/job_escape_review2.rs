//! A second review of `exec`'s job supervision, after the watcher learned to wait for lockctl's
//! exit, to match a forgotten group's members by session and start time, and lockctl learned to
//! check that its watcher is not stopped. Each test is a reproduction of what the review found:
//!
//! - **lockctl as PID 1 of a namespace whose `/proc` is not its own** (`unshare -pf` without
//!   `--mount-proc`): `/proc` then shows the parent namespace, where the watcher's PID and
//!   lockctl's own are other processes'. lockctl cannot tell its watcher from the job's processes
//!   by reading `/proc`, waits for it as for a member of the job, and renews the lock forever after
//!   the command ended.
//! - **A recycled group ID.** Once the command's first process has been reaped and no member of its
//!   group is left, the group's ID is free; a later process of the caller's session that gets that
//!   PID and leads a group of its own (another `lockctl exec`'s command always does) is started
//!   after lockctl and sits in a group with the job's old ID, and the watcher of a SIGKILLed
//!   lockctl kills it. The PID is recycled on purpose here (`ns_last_pid` in a PID namespace); on a
//!   machine it takes a wrap-around of the PID space (`pid_max` is 32768 on many systems) during a
//!   long job.
//! - **A traced watcher is a stopped watcher.** Under `strace -f` every process of the job, the
//!   watcher too, sits in tracing stops (`t` in `/proc/PID/stat`) between its system calls; lockctl
//!   reads that as a stopped watcher, kills its command and exits 76 though the lease was never
//!   lost.
//! - **lockctl as PID 1 adopts what is not its job's.** A process that enters the container from
//!   outside (`nsenter`, `docker exec`) and leaves a background process behind: the orphan is
//!   adopted by the namespace's PID 1, lockctl, which counts it as the job's, keeps the lock until
//!   it exits, and stops it when the lease is lost.
//!
//! The namespaces are made with `unshare` (root and util-linux); where the kernel does not permit
//! it, those tests say so and check nothing. The servers are started by each test, so the restart
//! quarantine is off for them (`lockctl()` sets `LOCKCTL_QUARANTINE=0`, and the scripts run inside
//! the namespaces set it the same way).

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// `unshare -pf --kill-child EXTRA PROGRAM ARGS`: a PID namespace whose every process dies with
/// `unshare`. `None`, said on stderr, where the kernel does not let this process create one (not
/// root, or inside a container that forbids it): a permission of the machine, so the test has
/// nothing to check there.
fn namespace(extra: &[&str], program: &str, args: &[&str]) -> Option<Command> {
    let probe = Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "NOT RUN HERE: this case needs `unshare -pf --mount-proc`, which this machine does \
             not permit ({why})"
        );
        return None;
    }
    let mut c = Command::new("unshare");
    c.args(["-pf", "--kill-child"])
        .args(extra)
        .arg(program)
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

/// `unshare -pf lockctl exec NAME -- true`, without `--mount-proc`: lockctl is PID 1 of the new
/// namespace, `/proc` is the parent namespace's. Its watcher (PID 3 or so in the namespace) is
/// adopted by lockctl, and `has_children` would read the watcher's PID in a `/proc` where it names
/// another process, take the watcher for the job's, and wait for it forever, renewing the lock
/// (a known limit until lockctl checked its `/proc`). lockctl now refuses before it asks for the
/// lock: exit 1, a message that says how to mount the namespace's own, nothing written to Redis.
#[test]
fn lockctl_as_pid_1_with_the_parent_namespace_s_proc_is_refused_before_the_lock() {
    let s = Server::start();
    let Some(mut ns) = namespace(
        &[],
        env!("CARGO_BIN_EXE_lockctl"),
        &["exec", "pid1proc", "--ttl", "2s", "--", "true"],
    ) else {
        return;
    };
    let out = wait_output(
        ns.env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/proc here belongs to another PID namespace")
            && stderr(&out).contains("--mount-proc"),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.keys(), Vec::<String>::new(), "Redis was written to");
}

/// Inside a PID namespace with its own `/proc` and a session of its own: the job's first process
/// (group `P`) starts a member in a group of its own and exits; lockctl reaps it, and `P` is free.
/// The next PID is set to `P` (`ns_last_pid`), and an innocent process of the same session takes
/// it and leads its own group `P`, as another `lockctl exec`'s command would. lockctl is then
/// killed by SIGKILL; its watcher must kill the job's member, and nothing else.
const RECYCLED: &str = r#"L=$1
D=$2
$L exec recycled --ttl 30s -- sh -c "echo \$\$ > $D/leader; perl -e 'setpgrp(0,0); sleep 60' & echo \$! > $D/member; exit 0" &
A=$!
i=0
while [ ! -s $D/member ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done
P=$(cat $D/leader)
M=$(cat $D/member)
while [ -e /proc/$P ] && [ $i -lt 800 ]; do sleep 0.05; i=$((i+1)); done
echo $((P-1)) > /proc/sys/kernel/ns_last_pid
perl -e 'setpgrp(0,0); sleep 60' &
I=$!
echo "leader $P"
echo "innocent_pid $I"
sleep 0.5
kill -9 $A
sleep 2
if kill -0 $M 2>/dev/null; then echo "member alive"; else echo "member killed"; fi
if kill -0 $I 2>/dev/null; then echo "innocent alive"; else echo "innocent killed"; fi
kill -9 $I $M 2>/dev/null
"#;

#[test]
#[ignore = "known limit (docs/guarantees.md): after lockctl's death the watcher matches the job's first group ID even once it was freed and handed to another process of the session (needs the PID space to wrap during the job); found by review, not fixed"]
fn a_process_that_got_the_job_s_freed_group_id_survives_lockctl_s_death() {
    need_tool("perl", "-e1");
    let s = Server::start();
    let script = s.dir().join("recycled.sh");
    std::fs::write(&script, RECYCLED).unwrap();
    let Some(mut ns) = namespace(
        &["--mount-proc"],
        "setsid",
        &[
            "sh",
            script.to_str().unwrap(),
            env!("CARGO_BIN_EXE_lockctl"),
            s.dir().to_str().unwrap(),
        ],
    ) else {
        return;
    };
    let out = wait_output(
        ns.env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
        Duration::from_secs(60),
    );
    let text = stdout(&out);
    if field(&text, "leader") != field(&text, "innocent_pid") {
        eprintln!("NOT RUN HERE: the kernel did not hand out the freed PID again: {text}");
        return;
    }
    assert_eq!(
        field(&text, "member"),
        "killed",
        "the job's member outlived lockctl: {text}"
    );
    assert_eq!(
        field(&text, "innocent"),
        "alive",
        "a process of the session that got the job's freed group ID died with lockctl: {text}{}",
        stderr(&out)
    );
}

/// `strace -f lockctl exec NAME -- sleep 4`: nothing loses the lease, yet lockctl finds its traced
/// watcher in a tracing stop, kills the command and exits 76.
#[test]
fn a_traced_watcher_does_not_lose_the_lease() {
    need_tool("strace", "-V");
    let s = Server::start();
    let probe = Command::new("strace")
        .args(["-f", "-o", "/dev/null", "true"])
        .output()
        .unwrap();
    if !probe.status.success() {
        eprintln!(
            "NOT RUN HERE: ptrace is not permitted: {}",
            String::from_utf8_lossy(&probe.stderr)
        );
        return;
    }
    // Each look of lockctl's may or may not land in a tracing stop: a few seconds of looks.
    for _ in 0..2 {
        let out = run(Command::new("strace")
            .args(["-f", "-o", "/dev/null", env!("CARGO_BIN_EXE_lockctl")])
            .args(["exec", "traced", "--ttl", "10s", "--", "sleep", "4"])
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdin(Stdio::null()));
        assert_eq!(
            code(&out),
            0,
            "lockctl under strace -f stopped its command for a lost lease: {}",
            stderr(&out)
        );
    }
}

/// lockctl as PID 1 of a container (`unshare -pf --mount-proc`), running `sleep 3`; a process
/// entering the container from outside (`nsenter`, as `docker exec` does) starts `sleep 40` in the
/// background and exits. That orphan is adopted by PID 1, lockctl, which takes it for the job's:
/// it keeps the lock until the visitor ends (and stops it, SIGTERM then SIGKILL, when the lease is
/// lost), although the visitor never descended from the command.
#[test]
#[ignore = "known limit (docs/guarantees.md): lockctl as PID 1 of a container adopts every orphan of the namespace (a docker exec visitor's) as part of its job; run it under an init (docker --init, tini); found by review, not fixed"]
fn lockctl_as_pid_1_does_not_take_a_visitor_s_orphan_for_its_job() {
    need_tool("nsenter", "--version");
    let s = Server::start();
    let Some(mut ns) = namespace(
        &["--mount-proc"],
        env!("CARGO_BIN_EXE_lockctl"),
        &["exec", "visited", "--ttl", "30s", "--", "sleep", "3"],
    ) else {
        return;
    };
    let unshare = ns
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let upid = unshare.id();
    let mut first = None;
    assert!(
        eventually(Duration::from_secs(20), || {
            first = std::fs::read_to_string(format!("/proc/{upid}/task/{upid}/children"))
                .ok()
                .and_then(|l| l.split_whitespace().next()?.parse::<i32>().ok());
            first.is_some_and(|p| {
                std::fs::read_to_string(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| c.contains("visited"))
            })
        }),
        "lockctl did not start in the namespace"
    );
    let first = first.unwrap().to_string();
    let visit = Command::new("nsenter")
        .args(["-t", &first, "-p", "-m", "sh", "-c", "sleep 40 & exit 0"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(visit.success(), "nsenter: {visit:?}");
    let out = wait_output(unshare, Duration::from_secs(30));
    assert_eq!(
        out.status.code(),
        Some(0),
        "lockctl did not end with its command (killed after 30 s, the visitor sleeps 40 s): {}",
        stderr(&out)
    );
}
