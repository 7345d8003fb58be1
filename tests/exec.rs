//! `lockctl exec` against a real redis-server with real processes and real signals: exit statuses,
//! renewal, lease loss (key deleted, lockctl paused, server killed), the deadline alone (the holder
//! cut off from Redis by a relay that stops forwarding, while its key stands), signal forwarding to
//! the whole process group, the signal-at-the-grant race, the job as a whole process group
//! (background members keep the lock, everything dies with lockctl), and mutual exclusion of
//! concurrent workers.

mod support;

use std::io::{BufRead, Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::watchers::watcher_of;
use support::*;

fn exec_on(server: &Server, name: &str) -> std::process::Command {
    let mut c = lockctl_on(server);
    c.args(["exec", name]);
    c
}

/// Starts `exec` with `flags` running `sh -c script`, and returns once the script printed `ready`
/// (the lock is held and the child runs); the reader keeps the child's stdout open.
fn start_ready(
    mut cmd: std::process::Command,
    flags: &[&str],
    script: &str,
    ready: &str,
) -> (
    std::process::Child,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = cmd
        .args(flags)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_for_line(child.stdout.take().unwrap(), ready, Duration::from_secs(30));
    (child, out)
}

#[test]
fn passes_exit_codes_through() {
    let s = Server::start();
    for want in [0, 1, 7] {
        let o = run(exec_on(&s, "codes").args(["--", "sh", "-c", &format!("exit {want}")]));
        assert_eq!(code(&o), want, "{}", stderr(&o));
    }
    let o = run(exec_on(&s, "codes").args(["-c", "kill -9 $$"]));
    assert_eq!(code(&o), 137, "a child killed by SIGKILL gives 128+9");
    let o = run(exec_on(&s, "codes").args(["-c", "exit 3"]));
    assert_eq!(code(&o), 3, "-c runs the command with sh -c");
    assert_eq!(s.get("lockctl:codes"), None, "released after every run");
}

#[test]
fn child_gets_environment_and_stdin() {
    let s = Server::start();
    let mut child = exec_on(&s, "envy")
        .args(["-c", "read line; echo \"got=$line name=$LOCKCTL_NAME key=$LOCKCTL_KEY token=$LOCKCTL_TOKEN fence=$LOCKCTL_FENCE\"; redis-cli -s \"$SOCK\" get \"$LOCKCTL_KEY\""])
        .env("SOCK", s.socket())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\nworld\n")
        .unwrap();
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    let first = lines.next().unwrap();
    assert!(
        first.starts_with("got=hello name=envy key=lockctl:envy token="),
        "{first}"
    );
    let token = first
        .split("token=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert_eq!(token.len(), 32);
    let fence = first.split("fence=").nth(1).unwrap();
    assert!(fence.parse::<u64>().is_ok_and(|f| f > 0), "{first}");
    assert_eq!(
        lines.next().unwrap(),
        token,
        "the key holds the child's token while it runs"
    );
}

#[test]
fn busy_no_wait_never_runs_the_child() {
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "busy", &["--ttl", "60s"]);
    let marker = s.dir().join("ran");
    let o = run(exec_on(&s, "busy")
        .arg("-n")
        .args(["--", "touch"])
        .arg(&marker));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(
        !marker.exists(),
        "the child must not run when the lock is busy"
    );
    let o = run(exec_on(&s, "busy").args(["-n", "-E", "9", "--", "true"]));
    assert_eq!(code(&o), 9, "-E replaces the busy code");
    assert_eq!(
        s.get("lockctl:busy").as_deref(),
        held["token"].as_str(),
        "holder untouched"
    );
}

#[test]
fn missing_program_gives_127_and_releases() {
    let s = Server::start();
    let o = run(exec_on(&s, "nope").args(["--", "/nonexistent/program"]));
    assert_eq!(code(&o), 127);
    assert!(stderr(&o).contains("cannot run"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:nope"), None);
    let o = run(&mut exec_on(&s, "nope"));
    assert_eq!(code(&o), 2, "exec without a command is a usage error");
}

/// The stop policy kills what is left of the job's process group only when the lease was lost: a
/// member the command left running when it exited normally is not killed.
#[test]
fn a_normal_exit_kills_nothing_left_in_the_group() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("late");
    let o = run(exec_on(&s, "left")
        .env("F", &file)
        .args(["-c", "(sleep 1; echo done > \"$F\") & exit 0"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(30), || std::fs::read_to_string(&file)
            .is_ok_and(|t| t.trim() == "done")),
        "the group's remaining member was killed"
    );
}

/// A lease lost while the command ran: the command is stopped, and lockctl says both why the lease
/// was lost and which status of the command its 76 replaces.
#[test]
fn a_lost_lease_names_its_reason_and_the_status_it_replaces() {
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "replaced"),
        &["--ttl", "1s"],
        "echo ready; exec sleep 30",
        "ready",
    );
    let _: i64 = s.cmd(&["DEL", "lockctl:replaced"]);
    let o = wait_output(child, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("no longer ours"), "the reason: {err}");
    assert!(
        err.contains("instead of the command's 143"),
        "the status replaced (SIGTERM): {err}"
    );
}

#[test]
#[ignore = "depends on the machine's speed: the retry must land in the 0.5 s between the server's resume and the lease's deadline (it cannot be wider and still tell a 150 ms retry from a 1 s one); failed once in a full run under load (Valkey matrix). Run it by hand for the retry-gap mutant (docs/testing.md)"]
fn a_renewal_that_fails_is_retried_until_the_server_answers() {
    // TTL 3 s: renewals every second, a failed one retried every 150 ms until the deadline, about
    // 2.96 s after the last renewal's start. The server is stopped right after a renewal (its PTTL
    // jumps back) for 2.45 s: the renewal due at 1 s and its retries wait on it, and the retry
    // pending when it resumes renews the lease half a second before the deadline. (Retried only a
    // second later, the lease would be lost: the retry at 2.2 s times out at 2.4 s, the next is at
    // the deadline.)
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "retried"),
        &["--ttl", "3s", "--node-timeout", "200ms"],
        "echo ready; sleep 6",
        "ready",
    );
    let pttl = || s.cmd::<i64>(&["PTTL", "lockctl:retried"]);
    let mut last = pttl();
    let renewed = eventually(Duration::from_secs(10), || {
        let now = pttl();
        let jumped = now > last + 300;
        last = now;
        jumped
    });
    s.pause();
    std::thread::sleep(Duration::from_millis(2450));
    s.resume();
    assert!(renewed, "no renewal seen");
    let o = wait_output(child, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("lost"), "{}", stderr(&o));
}

#[test]
fn short_ttl_survives_a_longer_child() {
    let s = Server::start();
    let o = run(exec_on(&s, "renewed").args(["--ttl", "1s", "--", "sleep", "3"]));
    assert_eq!(
        code(&o),
        0,
        "a 1 s lease must be renewed through a 3 s child: {}",
        stderr(&o)
    );
    assert!(!stderr(&o).contains("lost"));
    assert_eq!(s.get("lockctl:renewed"), None);
}

/// Starts `exec` with a child that starts a grandchild and prints "ready <child> <grandchild>".
fn start_with_grandchild(
    mut cmd: std::process::Command,
) -> (
    std::process::Child,
    i32,
    i32,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = cmd
        .args(["--", "sh", "-c", "sleep 300 & echo \"ready $$ $!\"; wait"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut reader = std::io::BufReader::new(out);
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    assert_eq!(parts.next(), Some("ready"), "{line}");
    let c: i32 = parts.next().unwrap().parse().unwrap();
    let g: i32 = parts.next().unwrap().parse().unwrap();
    (child, c, g, reader)
}

#[test]
fn deleted_key_terminates_child_and_grandchild() {
    let s = Server::start();
    let mut cmd = exec_on(&s, "stolen");
    cmd.args(["--ttl", "1s"]);
    let (child, c, g, _r) = start_with_grandchild(cmd);
    assert!(alive(c) && alive(g));
    let _: i64 = s.cmd(&["DEL", "lockctl:stolen"]);
    let started = Instant::now();
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "noticed within a renewal interval or so"
    );
    assert!(
        eventually(Duration::from_secs(5), || !alive(c) && !alive(g)),
        "child and grandchild terminated"
    );
}

#[test]
fn paused_past_ttl_loses_lease_and_leaves_new_holder_alone() {
    let s = Server::start();
    let mut cmd = exec_on(&s, "paused");
    cmd.args(["--ttl", "1s"]);
    let (child, c, _g, _r) = start_with_grandchild(cmd);
    let pid = child.id() as i32;
    kill(pid, libc::SIGSTOP);
    // Another client takes the lock once ours has expired in Redis.
    let mut other = None;
    assert!(eventually(Duration::from_secs(10), || {
        let o = run(lockctl_on(&s).args(["acquire", "paused", "-n", "--ttl", "60s"]));
        if code(&o) == 0 {
            other = Some(stdout(&o));
        }
        other.is_some()
    }));
    let other = other.unwrap();
    kill(pid, libc::SIGCONT);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert_eq!(
        s.get("lockctl:paused"),
        Some(other.clone()),
        "the other holder's lock is untouched"
    );
    let ttl: i64 = s.cmd(&["PTTL", "lockctl:paused"]);
    assert!(ttl > 50_000, "and keeps its TTL: {ttl}");
    assert!(eventually(Duration::from_secs(5), || !alive(c)));
}

#[test]
fn killed_server_loses_lease_without_hanging() {
    let mut s = Server::start();
    let mut cmd = exec_on(&s, "gone");
    cmd.args([
        "--ttl",
        "2s",
        "--kill-after",
        "1s",
        "--node-timeout",
        "200ms",
    ]);
    let (child, c, g, _r) = start_with_grandchild(cmd);
    s.kill();
    let started = Instant::now();
    let o = wait_output(child, Duration::from_secs(60));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    // TTL + kill-after is the promise; leave room for a loaded machine.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "took {:?}",
        started.elapsed()
    );
    assert!(eventually(Duration::from_secs(5), || !alive(c) && !alive(g)));
}

#[test]
fn sigterm_is_forwarded_and_the_child_status_returned() {
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "fwd"),
        &[],
        "trap 'exit 42' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    assert!(s.get("lockctl:fwd").is_some());
    kill(child.id() as i32, libc::SIGTERM);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(
        code(&o),
        42,
        "the child's own exit code comes back: {}",
        stderr(&o)
    );
    assert_eq!(s.get("lockctl:fwd"), None, "the lock is released");
}

#[test]
fn second_signal_escalates_to_sigkill() {
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "stubborn"),
        &["--kill-after", "60s"],
        "trap '' INT TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    let pid = child.id() as i32;
    kill(pid, libc::SIGINT);
    std::thread::sleep(Duration::from_millis(200));
    kill(pid, libc::SIGINT);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 137, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:stubborn"), None);
}

#[test]
fn kill_after_escalates_when_lease_lost_and_child_ignores_sigterm() {
    let s = Server::start();
    let term = s.dir().join("term");
    let mut cmd = exec_on(&s, "ignorer");
    cmd.env("TERM_AT", &term);
    // The child notes when SIGTERM came, and goes on.
    let (child, pid, _out) = start_pid(
        cmd,
        &["--ttl", "1s", "--kill-after", "1s"],
        "trap 'date +%s%N > \"$TERM_AT\"' TERM; while :; do sleep 0.05; done",
    );
    let _: i64 = s.cmd(&["DEL", "lockctl:ignorer"]);
    let deleted = Instant::now();
    let o = wait_output(child, Duration::from_secs(60));
    let killed = epoch_ns();
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(!alive(pid));
    let term: u128 = std::fs::read_to_string(&term)
        .expect("the child got SIGTERM first")
        .trim()
        .parse()
        .unwrap();
    let after_term = Duration::from_nanos((killed - term) as u64);
    // SIGKILL --kill-after after SIGTERM (the child's note comes a little after the signal, so
    // allow a little less); the loss is noticed within a renewal interval, and a generous margin
    // stands for a loaded machine.
    assert!(
        after_term >= Duration::from_millis(900),
        "SIGKILL {after_term:?} after SIGTERM"
    );
    assert!(
        deleted.elapsed() < Duration::from_secs(7),
        "SIGKILL only {:?} after the key was deleted",
        deleted.elapsed()
    );
}

/// A lease lost while a forwarded signal's stop is under way adds no SIGTERM: the job gets what the
/// user sent, then SIGKILL `--kill-after` after it, as it would without the loss.
#[test]
fn a_lease_lost_during_a_forwarded_stop_sends_no_sigterm() {
    let s = Server::start();
    let term = s.dir().join("term");
    let mut cmd = exec_on(&s, "stopping");
    cmd.env("TERM_AT", &term);
    // TTL 12 s: the deleted key is found at the first renewal, about 4 s after the grant; SIGKILL
    // comes 7 s after the SIGINT, and the lease's deadline (which the watcher enforces with a
    // SIGTERM of its own) 12 s after the grant: 3 s and 5 s of margin either way.
    let (child, _out) = start_ready(
        cmd,
        &["--ttl", "12s", "--kill-after", "7s"],
        "trap '' INT; trap 'date +%s%N > \"$TERM_AT\"' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    kill(child.id() as i32, libc::SIGINT);
    let _: i64 = s.cmd(&["DEL", "lockctl:stopping"]);
    let o = wait_output(child, Duration::from_secs(60));
    let err = stderr(&o);
    assert!(
        err.contains("lease on 'stopping' lost"),
        "the loss is seen while the job runs: {err}"
    );
    assert_eq!(code(&o), 76, "{err}");
    assert!(
        !term.exists(),
        "the child got a SIGTERM on top of the forwarded SIGINT: {err}"
    );
}

#[test]
fn sigkill_to_lockctl_kills_the_child() {
    let s = Server::start();
    let mut child = exec_on(&s, "orphan")
        .args(["--", "sh", "-c", "echo \"ready $$\"; exec sleep 300"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let c: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    assert!(alive(c));
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || !alive(c)),
        "the child dies with lockctl"
    );
}

#[test]
fn signal_while_waiting_leaves_nothing() {
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "queue", &["--ttl", "60s"]);
    let marker = s.dir().join("ran");
    let mut child = exec_on(&s, "queue")
        .args(["--", "touch"])
        .arg(&marker)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("waiting for lock 'queue'"), "{line}");
    kill(child.id() as i32, libc::SIGINT);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    assert_eq!(status.code(), Some(130), "{rest}");
    assert!(!marker.exists());
    assert_eq!(s.get("lockctl:queue").as_deref(), held["token"].as_str());
    let keys = s.keys();
    assert_eq!(
        keys.len(),
        3,
        "lock, holder and fence of the first holder only: {keys:?}"
    );
}

#[test]
fn concurrent_workers_lose_no_update() {
    let s = Server::start();
    let file = s.dir().join("counter");
    std::fs::write(&file, "0").unwrap();
    let script = "n=$(cat \"$F\"); sleep 0.01; echo $((n + 1)) > \"$F\"";
    let workers: Vec<_> = (0..6)
        .map(|_| {
            let mut c = exec_on(&s, "counter");
            c.env("F", &file);
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let o = run(c.args(["--ttl", "5s", "-c", script]));
                    assert_eq!(code(&o), 0, "{}", stderr(&o));
                    // Reuse the command: drop the args added for this run.
                    c = rebuild(&c);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_eq!(std::fs::read_to_string(&file).unwrap().trim(), "60");
}

/// A fresh copy of an `exec NAME` command with the same program and environment.
fn rebuild(c: &std::process::Command) -> std::process::Command {
    let mut n = std::process::Command::new(c.get_program());
    n.args(c.get_args().take(2));
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    n.stdin(Stdio::null());
    n
}

#[test]
fn sighup_and_sigint_are_forwarded() {
    let s = Server::start();
    for (sig, want) in [(libc::SIGHUP, 11), (libc::SIGINT, 12)] {
        let (child, _out) = start_ready(
            exec_on(&s, "fwd2"),
            &[],
            "trap 'exit 11' HUP; trap 'exit 12' INT; echo ready; while :; do sleep 0.05; done",
            "ready",
        );
        kill(child.id() as i32, sig);
        let o = wait_output(child, Duration::from_secs(30));
        assert_eq!(code(&o), want, "signal {sig}: {}", stderr(&o));
        assert_eq!(s.get("lockctl:fwd2"), None);
    }
}

#[test]
fn sigusr1_is_forwarded_and_the_lock_released() {
    // Its default action would kill lockctl and leave the key until its TTL.
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "usr1"),
        &["--ttl", "60s"],
        "trap 'exit 13' USR1; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    kill(child.id() as i32, libc::SIGUSR1);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 13, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:usr1"), None, "released");
}

#[test]
fn forwarded_signal_is_followed_by_sigkill_after_kill_after() {
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "deaf"),
        &["--kill-after", "1s"],
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    let sent = Instant::now();
    kill(child.id() as i32, libc::SIGTERM);
    let o = wait_output(child, Duration::from_secs(60));
    let took = sent.elapsed();
    assert_eq!(code(&o), 137, "SIGKILL after --kill-after: {}", stderr(&o));
    assert_eq!(s.get("lockctl:deaf"), None, "released");
    // Not before --kill-after, and not much after it either (a generous margin for a loaded
    // machine; the escalation must not wait for anything else).
    assert!(
        took >= Duration::from_secs(1),
        "SIGKILL after only {took:?}"
    );
    assert!(took < Duration::from_secs(6), "SIGKILL only after {took:?}");
}

#[test]
fn release_finding_the_lock_gone_gives_76_even_after_success() {
    let s = Server::start();
    // The child exits 0 at once, after the key was taken over behind lockctl's back.
    let o = run(exec_on(&s, "taken")
        .args([
            "--ttl",
            "60s",
            "-c",
            "redis-cli -s \"$SOCK\" set \"$LOCKCTL_KEY\" other >/dev/null",
        ])
        .env("SOCK", s.socket()));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert_eq!(
        s.get("lockctl:taken").as_deref(),
        Some("other"),
        "the other value is untouched"
    );
}

#[test]
fn zero_kill_after_is_a_usage_error() {
    let s = Server::start();
    let o = run(exec_on(&s, "z").args(["--kill-after", "0", "--", "true"]));
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--kill-after"), "{}", stderr(&o));
    assert!(s.keys().is_empty(), "nothing written: {:?}", s.keys());
}

/// A single server restarted without its data right after the grant ends the lease: the holder
/// exits 76. This test used to expect the opposite (the renewal put the key back at once, because the
/// server's run id had changed), but that re-creation bypassed the restart quarantine: the server
/// could meanwhile grant the lock to someone else after a `break`, and the re-created key then gave
/// the old holder a lease again. Now a key lost in a restart comes back only once the server is past
/// its quarantine (here the 2 s TTL), and by then a single node's holder has long lost its lease.
#[test]
fn a_restart_without_data_right_after_the_grant_ends_the_lease() {
    let mut s = Server::start();
    let mut cmd = exec_on(&s, "phoenix");
    // The quarantine stays on: the fresh server makes this exec wait ~3 s first.
    cmd.env_remove("LOCKCTL_QUARANTINE");
    let (child, _out) = start_ready(
        cmd,
        &["--ttl", "2s", "--kill-after", "1s"],
        "echo ready; sleep 30",
        "ready",
    );
    s.restart_empty();
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(stderr(&o).contains("restart quarantine"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:phoenix"), None, "nothing put back");
}

#[test]
fn a_password_at_the_holder_cmd_length_limit_is_not_stored() {
    let s = Server::start();
    let script = "echo ready; sleep 5";
    // The password starts 4 bytes before the 1024-byte limit of the stored command line: neither
    // the cut nor the redaction may leave any of it behind.
    let prefix = format!("sh -c {script} ");
    let pad = "p".repeat(1020 - prefix.len() - 1 - "redis://:".len());
    let url = "redis://:hunter2secret@127.0.0.1:1";
    let mut child = exec_on(&s, "longcmd")
        .args(["--", "sh", "-c", script, &pad, url])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    let cmd: String = s.cmd(&["HGET", "{lockctl:longcmd}\u{1f}holder", "cmd"]);
    kill(child.id() as i32, libc::SIGTERM);
    let _ = wait_output(child, Duration::from_secs(30));
    assert!(cmd.len() <= 1024, "{}", cmd.len());
    assert!(
        !cmd.contains("hunt"),
        "no part of the password is stored: ...{}",
        &cmd[cmd.len() - 40..]
    );
}

/// A TCP relay between lockctl and a redis-server's unix socket, run by the test. Paused, it
/// forwards nothing and serves no new connection, while the kernel keeps accepting them: the holder's
/// path to Redis is black-holed, as by a stopped relay process, while Redis itself runs on for the
/// other clients. A reply delay holds every reply back for that long.
struct Relay {
    port: u16,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    reply_delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl Relay {
    fn start(server: &Server) -> Relay {
        use std::sync::atomic::{AtomicBool, AtomicU64};
        use std::sync::Arc;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let paused = Arc::new(AtomicBool::new(false));
        let reply_delay_ms = Arc::new(AtomicU64::new(0));
        let target = server.socket();
        let (p, d) = (Arc::clone(&paused), Arc::clone(&reply_delay_ms));
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(client) = conn else { return };
                wait_while_paused(&p);
                let Ok(upstream) = std::os::unix::net::UnixStream::connect(&target) else {
                    continue;
                };
                let (c2, u2) = (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                let no_delay = Arc::new(AtomicU64::new(0));
                pump(client, upstream, Arc::clone(&p), no_delay);
                pump(u2, c2, Arc::clone(&p), Arc::clone(&d));
            }
        });
        Relay {
            port,
            paused,
            reply_delay_ms,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn pause(&self) {
        self.paused.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    fn delay_replies(&self, by: Duration) {
        self.reply_delay_ms
            .store(by.as_millis() as u64, std::sync::atomic::Ordering::SeqCst);
    }
}

fn wait_while_paused(paused: &std::sync::atomic::AtomicBool) {
    while paused.load(std::sync::atomic::Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Copies `from` to `to` on a thread of its own, holding each chunk back while paused and for the
/// delay.
fn pump<R, W>(
    mut from: R,
    mut to: W,
    paused: std::sync::Arc<std::sync::atomic::AtomicBool>,
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
) where
    R: Read + Send + 'static,
    W: Write + ShutdownWrite + Send + 'static,
{
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let delay = delay_ms.load(std::sync::atomic::Ordering::SeqCst);
            if delay > 0 {
                std::thread::sleep(Duration::from_millis(delay));
            }
            wait_while_paused(&paused);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        to.shutdown_write();
    });
}

trait ShutdownWrite {
    fn shutdown_write(&self);
}

impl ShutdownWrite for std::net::TcpStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

impl ShutdownWrite for std::os::unix::net::UnixStream {
    fn shutdown_write(&self) {
        let _ = self.shutdown(std::net::Shutdown::Write);
    }
}

/// Nanoseconds since the epoch, as `date +%s%N` prints them.
fn epoch_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A child script that appends a timestamp to `$LOG` every 10 ms, forever.
const WRITER: &str = "echo ready; while :; do date +%s%N >> \"$LOG\"; sleep 0.01; done";

/// The last timestamp the writer appended.
fn last_write(log: &std::path::Path) -> u128 {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .max()
        .expect("the child wrote at least once")
}

#[test]
fn the_deadline_stops_the_child_before_another_client_is_granted() {
    // Issue 10 item 5: with the holder's path to Redis black-holed, its child must be stopped when
    // the lease's local deadline passes, even while a renewal call is in flight, and so before a
    // client waiting directly on Redis can be granted the lock.
    let s = Server::start();
    let relay = Relay::start(&s);
    let log = s.dir().join("writes");
    let mut a = lockctl();
    a.env("LOCKCTL_REDIS", relay.url())
        .env("LOG", &log)
        .args(["exec", "overlap"]);
    // The TTL and the default node timeout of the report: the deadline falls while a renewal call
    // is in flight. A drift allowance wider than the default (still inside that call) leaves a
    // loaded machine time to reap the child between its deadline and the key's expiry.
    let (holder, _out) = start_ready(
        a,
        &["--ttl", "3.4s", "--drift-factor", "0.05"],
        WRITER,
        "ready",
    );
    // Cut after the first renewal (at TTL/3), so that its deadline is the one that counts.
    std::thread::sleep(Duration::from_millis(1500));
    relay.pause();
    let waiter = lockctl_on(&s)
        .args(["acquire", "overlap", "-w", "60s", "--ttl", "30s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_output(waiter, Duration::from_secs(60));
    let granted = epoch_ns();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    let last = last_write(&log);
    assert!(
        last < granted,
        "the child wrote {} ms after the other client was granted the lock",
        (last - granted) / 1_000_000
    );
    eprintln!(
        "last write {} ms before the other grant was reported",
        (granted - last) / 1_000_000
    );
}

#[test]
fn the_deadline_alone_stops_a_holder_cut_off_while_its_lock_stands() {
    // The holder cannot reach Redis, so it can never find its key gone: only its own deadline can
    // stop the child, and it must do so while the key still stands (before anyone else could get
    // it), and not long before the validity the last renewal earned.
    let s = Server::start();
    let relay = Relay::start(&s);
    let mut a = lockctl();
    a.env("LOCKCTL_REDIS", relay.url()).args(["exec", "cutoff"]);
    // A TTL whose deadline falls while a renewal call (the default node timeout) is in flight. A
    // drift allowance wider than the default (still inside that call) leaves a loaded machine time
    // to reap the child between its deadline and the key's expiry.
    let (holder, child, _out) = start_pid(
        a,
        &["--ttl", "3.4s", "--drift-factor", "0.05"],
        "exec sleep 300",
    );
    let token = s.get("lockctl:cutoff").expect("held");
    // Cut after the first renewal (at TTL/3), so that its deadline is the one that counts.
    std::thread::sleep(Duration::from_millis(1500));
    relay.pause();
    let cut = Instant::now();
    let mut stopped = None;
    while Instant::now() < cut + Duration::from_secs(30) {
        let key = s.get("lockctl:cutoff");
        if !alive(child) {
            stopped = Some((cut.elapsed(), key));
            break;
        }
        assert_eq!(
            key.as_deref(),
            Some(token.as_str()),
            "the key expired while the child still ran"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    let (after, key) = stopped.expect("the child was never stopped");
    assert_eq!(
        key.as_deref(),
        Some(token.as_str()),
        "the child was stopped only after its key had expired in Redis ({after:?} after the cut)"
    );
    // Even if the first renewal was late, the grant's own validity (3.4 s less the drift
    // allowance, from before the ready line) outlasts the 1.5 s before the cut by more than this.
    assert!(
        after > Duration::from_millis(1500),
        "stopped {after:?} after the cut, before its validity ran out"
    );
    let o = wait_output(holder, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("validity ran out"), "{err}");
}

/// Starts `exec` with `flags` running `sh -c 'echo "ready $$"; SCRIPT'`; returns once the lock is
/// held and the child runs, with the child's pid (its process group).
fn start_pid(
    mut cmd: std::process::Command,
    flags: &[&str],
    script: &str,
) -> (
    std::process::Child,
    i32,
    std::io::BufReader<std::process::ChildStdout>,
) {
    let mut child = cmd
        .args(flags)
        .args(["--", "sh", "-c", &format!("echo \"ready $$\"; {script}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let pid = line
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no ready line: {line:?}"));
    (child, pid, reader)
}

struct Stat {
    pgrp: i32,
}

/// Live (not zombie) processes whose /proc stat satisfies `pick`.
fn group_members_where(pick: impl Fn(&Stat) -> bool) -> Vec<i32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(rest) = stat.rsplit(')').next() else {
            continue;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.len() < 3 || f[0] == "Z" {
            continue;
        }
        let st = Stat {
            pgrp: f[2].parse().unwrap_or(0),
        };
        if pick(&st) {
            pids.push(pid);
        }
    }
    pids
}

/// The live processes of process group `pgid`.
fn group_members(pgid: i32) -> Vec<i32> {
    group_members_where(|st| st.pgrp == pgid)
}

#[test]
fn sigkill_to_lockctl_kills_the_whole_group() {
    // Issue 10 item 6a: the parent-death signal reaches only the direct child; `sleep` and `cat` of
    // a pipeline must die too, or they run on without the lock.
    let s = Server::start();
    let (mut holder, group, _out) = start_pid(exec_on(&s, "pipeline"), &[], "sleep 30 | cat");
    assert!(
        eventually(Duration::from_secs(10), || group_members(group).len() >= 3),
        "sh, sleep and cat run: {:?}",
        group_members(group)
    );
    let members = group_members(group);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(5), || members
            .iter()
            .all(|&p| !alive(p))),
        "still running after lockctl was killed: {:?}",
        members.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
    );
    assert!(group_members(group).is_empty());
}

#[test]
fn a_background_member_keeps_the_lock_until_it_exits() {
    // Issue 10 item 6b: the job is the whole process group, as flock(1)'s lock lasts as long as any
    // process holding its descriptor.
    let s = Server::start();
    let done = s.dir().join("done");
    let go = s.dir().join("go");
    // The direct child exits at once; its background member goes on until the test says go (or
    // 30 s, so that nothing is left behind if the test fails), then notes that it finished.
    let script =
        "(i=0; while [ ! -e \"$GO\" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done; \
                  touch \"$DONE\") & exit 3";
    let holder = exec_on(&s, "bg")
        .args(["--ttl", "3s", "--", "sh", "-c", script])
        .env("DONE", &done)
        .env("GO", &go)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || s
        .get("lockctl:bg")
        .is_some()));
    // Longer than the TTL: only renewals can have kept the lock this long. (At a 1 s TTL a renewal
    // late on a loaded machine lost the lease in one CI run.)
    std::thread::sleep(Duration::from_millis(3500));
    let o = run(lockctl_on(&s).args(["acquire", "bg", "-n"]));
    assert_eq!(
        code(&o),
        75,
        "the lock must stay held while the background member runs: {}",
        stderr(&o)
    );
    assert!(!done.exists());
    std::fs::write(&go, "").unwrap();
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(code(&o), 3, "the direct child's code: {}", stderr(&o));
    assert!(done.exists(), "lockctl waited for the background member");
    assert_eq!(s.get("lockctl:bg"), None, "released once it exited");
}

#[test]
fn lease_loss_kills_a_background_member() {
    let s = Server::start();
    let mut holder = exec_on(&s, "bgloss")
        .args(["--ttl", "1s", "--kill-after", "1s", "--"])
        .args(["sh", "-c", "sleep 300 & echo \"ready $!\"; exit 0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let bg: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    assert!(alive(bg));
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(bg), "the background member runs under the lock");
    let _: i64 = s.cmd(&["DEL", "lockctl:bgloss"]);
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(stderr(&o).contains("lost"), "{}", stderr(&o));
    assert!(
        !alive(bg),
        "the background member was stopped with the lease"
    );
}

#[test]
fn a_forwarded_signal_reaches_a_grandchild() {
    // The direct child waits for its own child to handle the signal; sent to the direct child alone,
    // the grandchild would never hear of it.
    let s = Server::start();
    let marker = s.dir().join("grandchild-got-term");
    let script = r#"trap 'wait $g; exit 3' TERM
sh -c 'trap "touch \"$M\"; exit 0" TERM; echo ready; while :; do sleep 0.05; done' &
g=$!
wait $g"#;
    let mut cmd = exec_on(&s, "grand");
    cmd.env("M", &marker);
    let (holder, _out) = start_ready(cmd, &["--kill-after", "5s"], script, "ready");
    kill(holder.id() as i32, libc::SIGTERM);
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(
        code(&o),
        3,
        "the child exits 3 once its own child has handled SIGTERM: {}",
        stderr(&o)
    );
    assert!(marker.exists(), "the grandchild got SIGTERM");
}

/// A forwarded signal reaches a member that left the job's group and session (`setsid`): lockctl
/// sends it to every descendant, not only to the group. The watcher only backs the stop up with a
/// SIGKILL once `--kill-after` has passed, which no trap notes.
#[test]
fn a_forwarded_signal_reaches_a_member_that_left_the_session() {
    let s = Server::start();
    let marker = s.dir().join("member-got-term");
    let script = r#"setsid sh -c 'trap "touch \"$M\"; exit 0" TERM; echo ready; while :; do sleep 0.05; done' &
wait"#;
    let mut cmd = exec_on(&s, "left");
    cmd.env("M", &marker);
    let (holder, _out) = start_ready(cmd, &["--kill-after", "30s"], script, "ready");
    kill(holder.id() as i32, libc::SIGTERM);
    let o = wait_output(holder, Duration::from_secs(60));
    assert!(
        marker.exists(),
        "the member outside the group got no SIGTERM: {}",
        stderr(&o)
    );
    assert_eq!(s.get("lockctl:left"), None, "released");
}

/// `acquire -n` catches signals without a thread of its own and reads them after its one attempt: a
/// signal that lands while the grant's reply is on its way still gives the lock back and exits 128+N,
/// as with a waiting acquire (the relay holds the reply back for a second, within the node timeout, so
/// the signal lands in that window).
#[test]
fn a_signal_at_the_grant_of_one_attempt_releases_the_lock() {
    let s = Server::start();
    let relay = Relay::start(&s);
    relay.delay_replies(Duration::from_secs(1));
    for (sig, status) in [(libc::SIGINT, 130), (libc::SIGTERM, 143)] {
        let one = lockctl()
            .env("LOCKCTL_REDIS", relay.url())
            .args(["acquire", "race-n", "-n", "--node-timeout", "30s"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(
            eventually(Duration::from_secs(30), || s
                .get("lockctl:race-n")
                .is_some()),
            "the attempt never reached Redis"
        );
        kill(one.id() as i32, sig);
        let o = wait_output(one, Duration::from_secs(60));
        assert_eq!(code(&o), status, "{}", stderr(&o));
        assert_eq!(stdout(&o), "", "no token printed");
        assert_eq!(s.get("lockctl:race-n"), None, "the lock is given back");
    }
}

#[test]
fn a_signal_at_the_grant_releases_the_lock() {
    // A signal that lands after the lock was set in Redis, while the reply is on its way: lockctl
    // must give the lock back and exit 128+N; for exec, the command must not start. Replies are
    // held back by the relay so the signal lands in that window every time.
    let s = Server::start();
    let relay = Relay::start(&s);
    relay.delay_replies(Duration::from_secs(1));
    let marker = s.dir().join("ran");
    let cases: [&[&str]; 2] = [
        &["acquire", "race", "-w", "60s"],
        &["exec", "race", "-w", "60s", "--", "touch", "MARKER"],
    ];
    for args in cases {
        let held = acquire_json(&mut lockctl_on(&s), "race", &["--ttl", "60s"]);
        let held = held["token"].as_str().unwrap().to_string();
        let args: Vec<String> = args
            .iter()
            .map(|a| a.replace("MARKER", &marker.to_string_lossy()))
            .collect();
        let mut waiter = lockctl()
            .env("LOCKCTL_REDIS", relay.url())
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = std::io::BufReader::new(waiter.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(line.contains("waiting for lock 'race'"), "{args:?}: {line}");
        let o = run(lockctl_on(&s).args(["release", "race", "--token", &held]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        // The waiter's attempt has reached Redis once the key holds another token.
        assert!(
            eventually(Duration::from_secs(30), || s
                .get("lockctl:race")
                .is_some_and(|t| t != held)),
            "{args:?}: the waiter never won"
        );
        kill(waiter.id() as i32, libc::SIGINT);
        let status = waiter.wait().unwrap();
        let mut rest = String::new();
        err.read_to_string(&mut rest).unwrap();
        let mut out = String::new();
        waiter
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        assert_eq!(status.code(), Some(130), "{args:?}: {rest}");
        assert_eq!(out, "", "{args:?}: no token printed");
        // The reply is held back past the node timeout, so the rollback goes out on the same
        // connection without waiting for its answer (a stopped node must not hold up the exit);
        // it reaches Redis through the relay a moment after lockctl has exited.
        assert!(
            eventually(Duration::from_secs(10), || s.get("lockctl:race").is_none()),
            "{args:?}: the lock won as the signal came is given back"
        );
        assert!(!marker.exists(), "{args:?}: the command never ran");
        // The waiter's leave follows the rollback, as a command of its own: it may reach Redis a
        // moment after the lock key is gone (one CI run under load looked in between).
        let mut keys = Vec::new();
        assert!(
            eventually(Duration::from_secs(10), || {
                keys = s.keys();
                keys.iter().all(|k| k.ends_with("fence"))
            }),
            "{args:?}: nothing but the fence counter left: {keys:?}"
        );
    }
}

#[test]
fn a_job_that_ends_after_its_deadline_is_reported_lost() {
    // The holder is cut off from Redis; its child outlives the deadline (it finishes its work after
    // SIGTERM), then exits 0. The lease ran out first, so the outcome is 76, with the reason.
    let s = Server::start();
    let relay = Relay::start(&s);
    let mut a = lockctl();
    a.env("LOCKCTL_REDIS", relay.url()).args(["exec", "late"]);
    let (holder, _out) = start_ready(
        a,
        &["--ttl", "2s"],
        "trap 'sleep 0.3; exit 0' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    relay.pause();
    let o = wait_output(holder, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("validity ran out"), "{err}");
    assert!(err.contains("instead of the command's 0"), "{err}");
}

#[test]
fn a_child_that_exits_while_lockctl_is_stopped_past_its_deadline_gives_76() {
    // lockctl is stopped (SIGSTOP) past its deadline; its child finishes meanwhile. Whether the timer
    // or the end of the job is seen first on SIGCONT, the deadline had passed: 76, with the reason.
    let s = Server::start();
    let (holder, _out) = start_ready(
        exec_on(&s, "stopped"),
        &["--ttl", "1s"],
        "echo ready; sleep 0.5; exit 0",
        "ready",
    );
    let pid = holder.id() as i32;
    kill(pid, libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(2500));
    kill(pid, libc::SIGCONT);
    let o = wait_output(holder, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("validity ran out"), "{err}");
    // More than a second late: the reason says by how much.
    assert!(err.contains(" ago without"), "{err}");
}

#[test]
fn a_process_that_leaves_the_group_with_setsid_is_still_part_of_the_job() {
    // `setsid` and `setpgid` do not leave the job: every descendant of lockctl belongs to it.
    let s = Server::start();
    let mut holder = exec_on(&s, "daemon")
        .args([
            "--",
            "sh",
            "-c",
            "setsid sleep 30 >/dev/null 2>&1 & echo \"ready $!\"; exit 0",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(holder.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let daemon: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let held_while_it_ran = s.get("lockctl:daemon").is_some();
    let running = holder.try_wait().unwrap().is_none();
    kill(daemon, libc::SIGTERM);
    let o = wait_output(holder, Duration::from_secs(60));
    assert!(
        held_while_it_ran,
        "the lock was released while a job process ran"
    );
    assert!(running, "lockctl ended while a job process ran");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:daemon"), None, "released");
}

/// The path where lockctl cannot supervise the command it started: the renewal thread cannot be
/// created. The limit on processes (`RLIMIT_NPROC`, which counts threads) is the one fault that
/// reaches it from outside, and only for a user other than root, so lockctl runs as an unused
/// numeric uid under `setpriv` and `prlimit` (util-linux). Raising the limit one at a time moves the
/// failure from the watcher's fork to the command's, then to the lease's threads. There lockctl
/// must kill the command (a `sleep` far longer than the test's bound) and reap it before it gives
/// the lock back; left alive, the command would keep lockctl waiting for it, without renewals,
/// until the watcher stops it at the lease's deadline (so the TTL is far longer than the test's
/// bound too).
///
/// A lockctl that gave up without killing the command would still look right afterwards: its
/// watcher kills the job when lockctl exits, milliseconds after the release. So lockctl runs under
/// a child subreaper of the test's (`support/subreaper.py`), which adopts whatever lockctl had not
/// reaped when it exited and names it: the command (`sleep`, exec'd before `spawn` returns) must
/// never be among them, on any path.
#[test]
fn a_command_that_cannot_be_supervised_is_killed_and_the_lock_released() {
    const UID: &str = "64917";
    let s = Server::start_tcp();
    // The other user must reach the binary: a copy in a directory open to all, under /tmp (the
    // build directory, or $TMPDIR, may be private).
    let dir = tempfile::tempdir_in("/tmp").unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let bin = dir.path().join("lockctl");
    std::fs::copy(env!("CARGO_BIN_EXE_lockctl"), &bin).unwrap();
    let subreaper = dir.path().join("subreaper.py");
    std::fs::write(&subreaper, include_str!("support/subreaper.py")).unwrap();
    for limit in 1..=64 {
        let mut cmd = std::process::Command::new("python3");
        cmd.arg(&subreaper)
            .arg("120")
            .args(["setpriv", "--reuid", UID, "--regid", UID, "--clear-groups"])
            .arg("prlimit")
            .arg(format!("--nproc={limit}"))
            .arg(&bin)
            .args([
                "exec",
                "-n",
                "--ttl",
                "10m",
                "unsupervised",
                "--",
                "sleep",
                "600",
            ])
            .env("LOCKCTL_REDIS", s.url())
            .env("LOCKCTL_QUARANTINE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let started = Instant::now();
        let o = wait_output(
            cmd.spawn()
                .expect("run python3 (subreaper.py), setpriv and prlimit"),
            Duration::from_secs(240),
        );
        let err = stderr(&o);
        let report = stdout(&o);
        let status = report
            .lines()
            .find(|l| l.starts_with("exit ") || l.starts_with("signal "));
        // Killed at the bound: lockctl waited for the command instead of killing it (it says why
        // it failed only after the command is gone). Going on would only fail later, for a
        // misleading reason: the command left behind counts against the next limit.
        assert!(
            !report.lines().any(|l| l == "bound") && status.is_some(),
            "lockctl did not end within {:?} of its start (it waited for the command it should \
             have killed): {report:?} {err}",
            started.elapsed()
        );
        let code = status.and_then(|l| l.strip_prefix("exit ")?.parse::<i32>().ok());
        // What lockctl left to the subreaper: its watcher (`lockctl-guard`, or the forked copy
        // and its parent, `lockctl`) may be; the command must not, whatever failed.
        let left: Vec<&str> = report
            .lines()
            .filter(|l| l.starts_with("orphan "))
            .filter(|l| !matches!(l.rsplit(' ').next(), Some("lockctl-guard" | "lockctl")))
            .collect();
        assert!(
            left.is_empty(),
            "the command outlived lockctl (exit {code:?}; it was not reaped by lockctl but \
             adopted by the subreaper): {left:?} {err}"
        );
        // The thread that checks the watcher starts just before the lease's: either one failing
        // leaves a command that nothing supervises.
        if !err.contains("cannot start the renewal thread")
            && !err.contains("cannot start the thread that checks the watcher")
        {
            // A fork or thread before the command's lease failed instead (`-n`: a connection
            // that cannot be made ends the call at once): raise the limit.
            assert_ne!(code, Some(0), "the command ran to its end: {err}");
            // The lease (ten minutes) was never at stake: a watcher that could not be forked is
            // an error (1), not a lost lease (76), and the lock is given back either way.
            assert!(
                code != Some(76) && !err.contains("lost before the command started"),
                "a failure to start was reported as a lost lease: {err}"
            );
            assert_eq!(
                s.get("lockctl:unsupervised"),
                None,
                "the lock was not given back: {err}"
            );
            continue;
        }
        assert_eq!(code, Some(1), "{report:?} {err}");
        assert!(err.contains("the command was killed"), "{err}");
        assert_eq!(
            s.get("lockctl:unsupervised"),
            None,
            "the lock was not given back"
        );
        return;
    }
    panic!("no limit on processes made the lease's threads fail");
}

/// Continues a stopped process when dropped, also when the test fails.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        kill(self.0, libc::SIGCONT);
    }
}

/// The watcher stops the job too when the lease's deadline passes, which can hide a lockctl that
/// no longer does: with the watcher stopped, a lease lost at a renewal (key deleted) must still stop
/// the job, here one that would otherwise sleep for ten minutes.
#[test]
fn a_lost_lease_stops_the_job_while_the_watcher_is_stopped() {
    let s = Server::start();
    let (holder, _out) = start_ready(
        exec_on(&s, "alone"),
        &["--ttl", "2s", "--kill-after", "1s"],
        "echo ready; exec sleep 600",
        "ready",
    );
    let watcher = watcher_of(holder.id());
    kill(watcher, libc::SIGSTOP);
    let _resume = Resume(watcher);
    let _: i64 = s.cmd(&["DEL", "lockctl:alone"]);
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(
        o.status.code(),
        Some(76),
        "lockctl did not stop the job after losing its lease: {}",
        stderr(&o)
    );
}

/// A watcher killed while the job runs guards nothing: lockctl stops the job as soon as it sees the
/// watcher gone, not at its next renewal (30 s after the grant with this TTL), which would find the
/// watcher gone too; also when the watcher dies long after the job started.
#[test]
fn a_killed_watcher_stops_the_job_before_the_next_renewal() {
    let s = Server::start();
    let (holder, _out) = start_ready(
        exec_on(&s, "unguarded"),
        &["--ttl", "90s", "--kill-after", "1s"],
        "echo ready; exec sleep 600",
        "ready",
    );
    // Killed a while after the start, not at once: the check must go on for as long as the job
    // runs, not only see a watcher that was gone by its first look (every 100 ms).
    std::thread::sleep(Duration::from_secs(2));
    kill(watcher_of(holder.id()), libc::SIGKILL);
    let killed = Instant::now();
    let o = wait_output(holder, Duration::from_secs(120));
    let took = killed.elapsed();
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("watcher process (lockctl-guard)"), "{err}");
    // The renewal comes 30 s after the grant; a generous margin stands for a loaded machine.
    assert!(
        took < Duration::from_secs(20),
        "stopped only {took:?} after"
    );
    assert_eq!(s.get("lockctl:unguarded"), None, "released");
}

/// A watcher held by a debugger (`gdb -p`, here `PTRACE_ATTACH`) while the job runs guards nothing,
/// like a stopped one: lockctl finds it at the tracer's stop for a second of looks in a row, stops
/// the job and exits 76, long before its ten minutes or the renewal 30 s in.
#[test]
fn a_watcher_held_by_a_debugger_stops_the_job() {
    let s = Server::start();
    let (mut holder, _out) = start_ready(
        exec_on(&s, "debugged"),
        &["--ttl", "90s", "--kill-after", "1s"],
        "echo ready; exec sleep 600",
        "ready",
    );
    let watcher = watcher_of(holder.id());
    let Some(traced) = support::watchers::Traced::attach(watcher) else {
        eprintln!("NOT RUN HERE: ptrace is not permitted");
        return;
    };
    let ended = eventually(Duration::from_secs(60), || {
        holder.try_wait().unwrap().is_some()
    });
    if !ended {
        kill(holder.id() as i32, libc::SIGKILL);
    }
    // Let go either way: the job holds lockctl's stderr, and only the watcher stops it once
    // lockctl is gone.
    drop(traced);
    let o = wait_output(holder, Duration::from_secs(60));
    let err = stderr(&o);
    assert!(
        ended,
        "lockctl ran on with its watcher held by a debugger: {err}"
    );
    assert_eq!(code(&o), 76, "{err}");
    assert!(err.contains("is stopped by a debugger"), "{err}");
    assert_eq!(s.get("lockctl:debugged"), None, "released");
}

/// A tracer's stop that does not last (a traced process passes through one at every system call,
/// `strace -f`) loses nothing: only a second of looks in a row at it counts. Here the watcher is
/// held five times for 200 ms, with 400 ms between, so that lockctl's looks (a tenth of a second
/// apart) find it at the stop, even when some come late, without ever a second in a row.
#[test]
fn a_watcher_held_by_a_debugger_for_a_moment_keeps_the_lease() {
    let s = Server::start();
    let done = s.dir().join("done");
    let mut cmd = exec_on(&s, "moment");
    cmd.env("D", &done);
    let (holder, _out) = start_ready(
        cmd,
        &["--ttl", "90s"],
        r#"echo ready; while [ ! -e "$D" ]; do sleep 0.05; done"#,
        "ready",
    );
    let watcher = watcher_of(holder.id());
    let mut permitted = true;
    for _ in 0..5 {
        let Some(traced) = support::watchers::Traced::attach(watcher) else {
            // A watcher gone is lockctl's doing, and the assertions below tell it.
            permitted = !alive(watcher);
            break;
        };
        std::thread::sleep(Duration::from_millis(200));
        drop(traced);
        std::thread::sleep(Duration::from_millis(400));
    }
    std::fs::write(&done, "").unwrap();
    let o = wait_output(holder, Duration::from_secs(60));
    if !permitted {
        eprintln!("NOT RUN HERE: ptrace is not permitted");
        return;
    }
    let err = stderr(&o);
    assert_eq!(code(&o), 0, "the job ran to its end: {err}");
    assert!(!err.contains("debugger"), "{err}");
    assert_eq!(s.get("lockctl:moment"), None, "released");
}

/// With lockctl stopped (SIGSTOP) past its deadline, only the watcher can apply the stop policy: a
/// SIGTERM to the whole job at the deadline, then SIGKILL once `--kill-after` has passed. The
/// group's leader and a member that left the group with `setsid` both note SIGTERM and run on, so
/// only the watcher's SIGKILL, to the group and to each process outside it, ends them.
#[test]
fn the_watcher_stops_the_job_while_lockctl_is_stopped() {
    let s = Server::start();
    let marker = s.dir().join("member-got-term");
    let leader_marker = s.dir().join("leader-got-term");
    let member_pid = s.dir().join("member-pid");
    let script = r#"setsid sh -c 'echo $$ > "$P"; trap "touch \"$M\"" TERM; while :; do sleep 0.05; done' &
trap 'touch "$L"' TERM
echo ready
echo $$
while :; do sleep 0.05; done"#;
    let mut cmd = exec_on(&s, "stoppedholder");
    cmd.env("M", &marker)
        .env("P", &member_pid)
        .env("L", &leader_marker);
    let (holder, mut out) =
        start_ready(cmd, &["--ttl", "1s", "--kill-after", "1s"], script, "ready");
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let leader: i32 = line.trim().parse().unwrap();
    let mut member = None;
    eventually(Duration::from_secs(30), || {
        member = std::fs::read_to_string(&member_pid)
            .ok()
            .and_then(|p| p.trim().parse::<i32>().ok());
        member.is_some()
    });
    let member = member.expect("the member wrote its pid");
    let lockctl = holder.id() as i32;
    kill(lockctl, libc::SIGSTOP);
    let _resume = Resume(lockctl);
    let termed = eventually(Duration::from_secs(60), || {
        marker.exists() && leader_marker.exists()
    });
    eventually(Duration::from_secs(60), || !alive(leader) && !alive(member));
    let (leader_alive, member_alive) = (alive(leader), alive(member));
    kill(member, libc::SIGKILL);
    kill(lockctl, libc::SIGCONT);
    let o = wait_output(holder, Duration::from_secs(60));
    assert!(
        termed,
        "no SIGTERM from the watcher: to the group {}, to the member outside it {}",
        leader_marker.exists(),
        marker.exists()
    );
    assert!(
        !leader_alive && !member_alive,
        "the watcher's SIGKILL missed: leader alive {leader_alive}, member outside the group \
         alive {member_alive}"
    );
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}

/// The watcher's SIGTERM at the deadline is followed by its SIGKILL only `--kill-after` later, as
/// lockctl's own is: with lockctl stopped past a 1 s TTL and `--kill-after 10s`, the job's handler
/// of SIGTERM, a one-second clean-up, finishes before the SIGKILL.
#[test]
fn the_watcher_gives_the_job_its_kill_after() {
    let s = Server::start();
    let termed = s.dir().join("termed");
    let cleaned = s.dir().join("cleaned");
    let script = r#"trap 'touch "$T"; sleep 1; touch "$C"; exit 0' TERM
echo ready
echo $$
while :; do sleep 0.05; done"#;
    let mut cmd = exec_on(&s, "graceful");
    cmd.env("T", &termed).env("C", &cleaned);
    let (holder, mut out) = start_ready(
        cmd,
        &["--ttl", "1s", "--kill-after", "10s"],
        script,
        "ready",
    );
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let job: i32 = line.trim().parse().unwrap();
    let lockctl = holder.id() as i32;
    kill(lockctl, libc::SIGSTOP);
    let _resume = Resume(lockctl);
    eventually(Duration::from_secs(60), || cleaned.exists() || !alive(job));
    kill(lockctl, libc::SIGCONT);
    let o = wait_output(holder, Duration::from_secs(60));
    assert!(
        cleaned.exists(),
        "the job was killed before its clean-up after the watcher's SIGTERM (SIGTERM noted: {})",
        termed.exists()
    );
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}

/// A renewal extends the key only while it holds our token. Once another holder's token is in it,
/// the holder's next renewal finds the lease lost: the command is stopped, lockctl exits 76, and the
/// other holder's key keeps its value and its expiry (a renewal that extended it would keep both
/// holders running, each with the other's lease).
#[test]
fn a_renewal_never_extends_another_holder_s_key() {
    let s = Server::start();
    let (holder, _out) = start_ready(
        exec_on(&s, "taken"),
        &["--ttl", "3s"],
        "echo ready; exec sleep 600",
        "ready",
    );
    let _: () = s.cmd(&["SET", "lockctl:taken", "other", "PX", "60000"]);
    let o = wait_output(holder, Duration::from_secs(60));
    assert_eq!(
        o.status.code(),
        Some(76),
        "the holder never found its lease lost to another token: {}",
        stderr(&o)
    );
    assert_eq!(s.get("lockctl:taken").as_deref(), Some("other"));
    let left: i64 = s.cmd(&["PTTL", "lockctl:taken"]);
    assert!(
        left > 30_000,
        "the other holder's key was given the holder's TTL: {left} ms left"
    );
}

/// Where `/proc` is not mounted (a minimal container), `lockctl-guard` cannot be started from
/// `/proc/self/exe`: the watcher watches from a forked copy of lockctl, and the command's first
/// process gets the parent-death signal instead. The command must still run, and die with a
/// lockctl killed by SIGKILL.
#[test]
fn without_proc_the_command_runs_and_dies_with_lockctl() {
    let probe = std::process::Command::new("unshare")
        .args([
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            "umount -l /proc",
        ])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("NOT RUN HERE: this case needs `unshare -m` and umount (root)");
        return;
    }
    let s = Server::start();
    // /proc is unmounted in a mount namespace of lockctl's own; the test still sees its own.
    let mut holder = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c"])
        .arg(r#"umount -l /proc && exec "$0" exec noproc -n -- sh -c 'echo "ran $$"; exec sleep 600'"#)
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let errs = collect_stderr(holder.stderr.take().unwrap());
    let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let Some(pid) = line
        .strip_prefix("ran ")
        .and_then(|p| p.trim().parse::<i32>().ok())
    else {
        let _ = holder.kill();
        let _ = holder.wait();
        panic!("the command did not run: {}", errs.join().unwrap());
    };
    assert!(s.get("lockctl:noproc").is_some(), "the lock is held");
    holder.kill().unwrap();
    holder.wait().unwrap();
    let died = eventually(Duration::from_secs(10), || !alive(pid));
    kill(pid, libc::SIGKILL);
    assert!(died, "the command outlived its lockctl, killed by SIGKILL");
}

/// On a terminal (an interactive shell's; here `script(1)`'s pseudo-terminal) the command runs in a
/// process group of its own, a background group that would stop at its first read of the
/// terminal: lockctl hands it the terminal's foreground, so that it reads its input as it would
/// without lockctl, and takes it back after, so that the shell that ran lockctl reads on.
#[test]
fn a_command_on_a_terminal_reads_from_it() {
    need_tool("script", "--version");
    let s = Server::start();
    let line = format!(
        "{} exec tty -- sh -c 'read x; echo \"got $x\"'; read y; echo \"then $y\"",
        env!("CARGO_BIN_EXE_lockctl")
    );
    let mut child = std::process::Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello\nworld\n")
        .unwrap();
    let o = wait_output(child, Duration::from_secs(60));
    let screen = String::from_utf8_lossy(&o.stdout);
    assert!(
        screen.contains("got hello"),
        "the command did not read the terminal (stopped in the background?): {screen:?} {}",
        stderr(&o)
    );
    assert!(
        screen.contains("then world"),
        "the shell did not get the terminal back (stopped in the background?): {screen:?}"
    );
    assert_eq!(code(&o), 0, "{screen:?}");
    assert_eq!(s.get("lockctl:tty"), None, "released");
}

/// What the shell runs in `a_command_started_in_the_background_leaves_the_terminal_to_the_shell`:
/// `exec` in the background of a shell with job control, a wait for its command with builtins only
/// (`read -t` on a FIFO nobody writes is the sleep), then the terminal's foreground group
/// (`tpgid`) and the shell's own group, read from `/proc/$$/stat`.
const BACKGROUND_JOB: &str = r#"set -m
exec 3<>"$FIFO"
"$LOCKCTL" exec tty-bg -- sh -c ': > "$READY"; exec sleep 600' &
job=$!
i=0
while [ ! -e "$READY" ] && [ "$i" -lt 600 ]; do
    read -r -t 0.1 -u 3 _
    i=$((i + 1))
done
if [ -e "$READY" ]; then ready=yes; else ready=no; fi
read -r stat < /proc/$$/stat
set -- ${stat##*) }
echo "ready=$ready pgrp=$3 tpgid=$6 job=$job" > "$OUT"
kill %1
wait
"#;

/// A lockctl started in the background of a terminal (`&` in a shell with job control) is in a
/// background group, and must leave the terminal's foreground where it is: handing it to its
/// command would take it from the shell (and from the job in the shell's foreground, which would
/// then stop or fail at its next read). Under `script(1)`, a bash with `set -m` starts `exec` in
/// the background and, once the command runs, the shell's group must still be the terminal's
/// foreground group. The shell waits with builtins only: a foreground job would make it set the
/// terminal's foreground group itself, hiding what lockctl did.
#[test]
fn a_command_started_in_the_background_leaves_the_terminal_to_the_shell() {
    for tool in ["script", "bash"] {
        need_tool(tool, "--version");
    }
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let job = dir.path().join("job.sh");
    std::fs::write(&job, BACKGROUND_JOB).unwrap();
    let fifo = dir.path().join("fifo");
    let c_fifo = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_fifo.as_ptr(), 0o600) }, 0, "mkfifo");
    let out = dir.path().join("out");
    let child = std::process::Command::new("script")
        .arg("-qec")
        .arg(format!("bash --noprofile --norc {}", job.display()))
        .arg("/dev/null")
        // script(1) runs its command with $SHELL -c.
        .env("SHELL", "/bin/sh")
        .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
        .env("FIFO", &fifo)
        .env("READY", dir.path().join("ready"))
        .env("OUT", &out)
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_output(child, Duration::from_secs(120));
    let screen = String::from_utf8_lossy(&o.stdout);
    let seen = std::fs::read_to_string(&out).unwrap_or_default();
    let field = |name: &str| {
        seen.split_whitespace()
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {name} in {seen:?}: {screen:?} {}", stderr(&o)))
    };
    assert_eq!(
        field("ready"),
        "yes",
        "the command did not start: {screen:?}"
    );
    // Else the shell had no job control, and lockctl was not in the background.
    assert_ne!(
        field("job"),
        field("pgrp"),
        "exec ran in the shell's own group: {seen:?}"
    );
    assert_eq!(
        field("tpgid"),
        field("pgrp"),
        "the terminal's foreground group is no longer the shell's (the command of the \
         background job {} took it): {seen:?} {screen:?}",
        field("job")
    );
    assert_eq!(s.get("lockctl:tty-bg"), None, "released");
}
