//! `lockctl exec` against a real redis-server with real processes and real signals: exit statuses,
//! renewal, lease loss (key deleted, lockctl paused, server killed), signal forwarding, the
//! parent-death signal, and mutual exclusion of concurrent workers.

mod support;

use std::io::{BufRead, Read, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

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
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
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
    assert!(first.ends_with("fence=1"), "{first}");
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
    let (child, _out) = start_ready(
        exec_on(&s, "ignorer"),
        &["--ttl", "1s", "--kill-after", "500ms"],
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    let _: i64 = s.cmd(&["DEL", "lockctl:ignorer"]);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
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
fn forwarded_signal_is_followed_by_sigkill_after_kill_after() {
    let s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "deaf"),
        &["--kill-after", "300ms"],
        "trap '' TERM; echo ready; while :; do sleep 0.05; done",
        "ready",
    );
    kill(child.id() as i32, libc::SIGTERM);
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 137, "SIGKILL after --kill-after: {}", stderr(&o));
    assert_eq!(s.get("lockctl:deaf"), None, "released");
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

#[test]
fn renewal_restores_the_key_on_a_node_restarted_right_after_the_grant() {
    let mut s = Server::start();
    let (child, _out) = start_ready(
        exec_on(&s, "phoenix"),
        &["--ttl", "2s"],
        "echo \"ready $LOCKCTL_FENCE\"; sleep 3",
        "ready 1",
    );
    // Well within a second of the grant: the node's run id, not its uptime, tells it restarted.
    s.restart_empty();
    assert!(
        eventually(Duration::from_secs(10), || s
            .get("lockctl:phoenix")
            .is_some()),
        "the renewal puts the key back on the restarted node"
    );
    let fence: Option<String> = s.cmd(&["GET", "{lockctl:phoenix}\u{1f}fence"]);
    assert_eq!(
        fence.as_deref(),
        Some("1"),
        "and raises the lost counter to the holder's fence"
    );
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(
        code(&o),
        0,
        "the lease survived the restart: {}",
        stderr(&o)
    );
    let o = run(lockctl_on(&s).args(["acquire", "phoenix", "--format", "json"]));
    let next: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(next["fence"], 2, "the next grant's fence is still larger");
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
