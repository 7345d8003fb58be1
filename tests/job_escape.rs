//! Processes of an `exec` job that lockctl does not stop before another client holds the lock.
//!
//! - A member that moves to a process group of its own without leaving the session: coreutils
//!   `timeout` does so (it calls `setpgid(0, 0)`), as does a shell with job control (`bash -c
//!   'set -m; ...'`). lockctl is its subreaper, so it becomes lockctl's child, yet lockctl ends the
//!   job, releases the lock, and neither the lease-loss signals nor the watcher reach it.
//! - A stopped lockctl (SIGSTOP): the job runs on in its own group while the lease runs out in
//!   Redis and another client takes the lock; it is stopped only once lockctl resumes.

mod support;

use std::io::BufRead;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

/// Starts `exec NAME --ttl 2s -- sh -c SCRIPT` and returns it with the PID the script printed after
/// `ready `.
fn start(s: &Server, name: &str, script: &str) -> (std::process::Child, i32) {
    let mut child = lockctl_on(s)
        .args(["exec", name, "--ttl", "2s", "--kill-after", "1s", "--"])
        .args(["sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    // The line was consumed; the script prints it again with the PID.
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let pid = line.trim().strip_prefix("pid ").unwrap().parse().unwrap();
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    (child, pid)
}

/// One attempt at `name`: true if busy (75), false if granted (0). Any other outcome (a node timeout
/// on a loaded machine) says nothing about the lock, so the attempt is made again.
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

#[test]
fn a_member_under_timeout_keeps_the_lock_while_it_runs() {
    let s = Server::start();
    let (child, member) = start(
        &s,
        "tmo",
        "timeout 300 sleep 300 & echo ready; echo \"pid $!\"; exit 0",
    );
    std::thread::sleep(Duration::from_millis(500));
    let still_running = alive(member);
    let held = busy(&s, "tmo");
    kill(member, libc::SIGTERM);
    let _ = wait_output(child, Duration::from_secs(30));
    assert!(still_running, "the member under timeout runs");
    assert!(
        held,
        "another client was granted the lock while a job member ran"
    );
}

#[test]
fn sigkill_to_lockctl_kills_a_member_under_timeout() {
    let s = Server::start();
    let (mut child, member) = start(
        &s,
        "tmo9",
        "timeout 300 sleep 300 & echo ready; echo \"pid $!\"; wait",
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let died = eventually(Duration::from_secs(10), || !alive(member));
    kill(member, libc::SIGTERM);
    assert!(died, "a job member outlived its lockctl, killed by SIGKILL");
}

#[test]
fn a_stopped_lockctl_does_not_let_its_job_run_on_under_another_holder() {
    let s = Server::start();
    let (child, member) = start(
        &s,
        "stopped",
        "echo ready; echo \"pid $$\"; while :; do sleep 0.05; done",
    );
    let pid = child.id() as i32;
    kill(pid, libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(20), || !busy(&s, "stopped")),
        "the lease never ran out in Redis"
    );
    // Another client now holds the lock: the job must be stopped or gone.
    let state = std::fs::read_to_string(format!("/proc/{member}/stat")).unwrap_or_default();
    let running = alive(member)
        && !state
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'));
    kill(pid, libc::SIGCONT);
    let _ = wait_output(child, Duration::from_secs(30));
    assert!(
        !running,
        "the job ran on while another client held the lock"
    );
}

/// A stopped lockctl does not stop the lease from running out; its watcher does stop the job at the
/// deadline. The first job appends a line every 50 ms; the second client appends one when granted:
/// in the file, no line of the first job may follow it. The first job does not ignore SIGTERM, so
/// the `--kill-after` window does not apply.
#[test]
fn a_stopped_lockctl_s_job_writes_nothing_after_the_next_grant() {
    let s = Server::start();
    let log = s.dir().join("log");
    let log_arg = log.to_str().unwrap().to_string();
    let mut first = lockctl_on(&s)
        .args(["exec", "wrt", "--ttl", "2s", "--kill-after", "1s", "--"])
        .args([
            "sh",
            "-c",
            "echo ready; while :; do echo first >> \"$0\"; sleep 0.05; done",
            &log_arg,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_for_line(
        first.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    std::thread::spawn(move || std::io::copy(&mut out.into_inner(), &mut std::io::sink()));
    let pid = first.id() as i32;
    kill(pid, libc::SIGSTOP);
    let second = run(lockctl_on(&s)
        .args(["exec", "wrt", "-w", "30s", "--"])
        .args(["sh", "-c", "echo second >> \"$0\"", &log_arg]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    // Whatever the first job could still write, it would within this time.
    std::thread::sleep(Duration::from_millis(1500));
    let lines = std::fs::read_to_string(&log).unwrap();
    kill(pid, libc::SIGCONT);
    let first = wait_output(first, Duration::from_secs(30));
    let after: Vec<&str> = lines
        .lines()
        .skip_while(|l| *l != "second")
        .skip(1)
        .collect();
    assert!(lines.contains("first"), "the first job never ran: {lines}");
    assert!(
        after.is_empty(),
        "the first job wrote {} lines after the second grant",
        after.len()
    );
    assert_eq!(code(&first), 76, "{}", stderr(&first));
}

/// The PIDs of the processes whose command line, arguments joined by spaces, contains `needle`: what
/// `pkill -f` matches.
fn matching(needle: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
        .collect()
}

#[test]
fn pkill_by_command_line_spares_the_watcher_and_the_job_dies() {
    let s = Server::start();
    let (mut child, member) = start(
        &s,
        "pkilled",
        "sleep 300 & echo ready; echo \"pid $!\"; wait",
    );
    let lockctl = child.id() as i32;
    // The watcher tells itself apart by name and command line.
    let needle = format!("lockctl-guard --lockctl-guard {lockctl}:");
    let mut guards = Vec::new();
    // The watcher runs as soon as it has exec'd, which may come after the job's first line.
    eventually(Duration::from_secs(10), || {
        guards = matching(&needle);
        !guards.is_empty()
    });
    assert_eq!(guards.len(), 1, "one watcher for lockctl {lockctl}");
    // It names itself right after its exec (until then its name is the binary's path's).
    let comm = || std::fs::read_to_string(format!("/proc/{}/comm", guards[0])).unwrap_or_default();
    eventually(Duration::from_secs(10), || comm().trim() == "lockctl-guard");
    assert_eq!(comm().trim(), "lockctl-guard");
    // `pkill -9 -f 'exec pkilled'`.
    let hits = matching("exec pkilled");
    assert_eq!(
        hits,
        [lockctl],
        "only lockctl's command line names the lock"
    );
    for pid in hits {
        kill(pid, libc::SIGKILL);
    }
    child.wait().unwrap();
    let died = eventually(Duration::from_secs(10), || !alive(member));
    kill(member, libc::SIGTERM);
    assert!(died, "the job outlived lockctl killed by its command line");
}

/// lockctl as the first process of a container (`unshare -pf --mount-proc`) adopts every orphan
/// there, a visitor's too (`nsenter`, as `docker exec` does), and counts it as the job's: a stated
/// limit (docs/guarantees.md). Such an orphan's process group reads 0 in the container, its leader
/// being outside, as does the job's group once its leader has been reaped. When the lease is lost,
/// lockctl must stop the orphan with the rest, since it waits for it: skipped as a member of the
/// job's group, it would keep lockctl (and its exit 76) waiting for as long as it runs.
#[test]
fn a_lost_lease_stops_an_orphan_whose_group_reads_0_in_a_container() {
    let probe = std::process::Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc", "true"])
        .output();
    need_tool("nsenter", "--version");
    if !probe.is_ok_and(|o| o.status.success()) {
        eprintln!("NOT RUN HERE: this case needs `unshare -pf --mount-proc`");
        return;
    }
    let s = Server::start();
    let unshare = std::process::Command::new("unshare")
        .args([
            "-pf",
            "--kill-child",
            "--mount-proc",
            env!("CARGO_BIN_EXE_lockctl"),
        ])
        .args(["exec", "adopted", "--ttl", "3s", "--kill-after", "1s", "--"])
        // The command's first process exits at once: the job's group is then forgotten.
        .args(["sh", "-c", "sleep 600 & exit 0"])
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
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
            first.is_some() && s.get("lockctl:adopted").is_some()
        }),
        "lockctl did not get the lock in the container"
    );
    // The visitor leaves an orphan behind and prints its process group as the container sees it.
    let visit = run(std::process::Command::new("nsenter")
        .args(["-t", &first.unwrap().to_string(), "-p", "-m", "sh", "-c"])
        .arg("sleep 300 </dev/null >/dev/null 2>&1 & cut -d' ' -f5 /proc/$!/stat"));
    assert_eq!(
        stdout(&visit),
        "0",
        "the visitor's orphan's group: {visit:?}"
    );
    let deleted = Instant::now();
    let _: i64 = s.cmd(&["DEL", "lockctl:adopted"]);
    let out = wait_output(unshare, Duration::from_secs(60));
    assert_eq!(
        out.status.code(),
        Some(76),
        "lockctl did not end within {:?} of the lease's loss (it waited for the orphan it should \
         have stopped): {}",
        deleted.elapsed(),
        stderr(&out)
    );
}

/// While lockctl lives its descendants are the job, exactly: a process of the session that joined
/// the job's group from outside (`setpgid`, after the command's first process exited, so that the
/// group is no longer signalled as a whole) is not the job's. The watcher that stops the job of a
/// stopped lockctl at the deadline must spare it. (Once lockctl is gone, the search for its orphans
/// cannot tell such a process apart: docs/guarantees.md.)
#[test]
fn a_stopped_lockctl_s_watcher_spares_a_process_that_joined_the_job_s_group() {
    need_tool("perl", "-e1");
    let s = Server::start();
    let (child, member) = start(
        &s,
        "joined",
        "sleep 300 & echo ready; echo \"pid $!\"; exit 0",
    );
    let stat = std::fs::read_to_string(format!("/proc/{member}/stat")).unwrap();
    let group: i32 = stat
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(2)
        .unwrap()
        .parse()
        .unwrap();
    // Exited and reaped by lockctl: until lockctl has taken in the exit (a loaded machine can
    // delay it), the group is still the job's as a whole, and signalled as such (docs/guarantees.md).
    assert!(
        eventually(Duration::from_secs(10), || !std::path::Path::new(&format!(
            "/proc/{group}"
        ))
        .exists()),
        "the command's first process exited and was reaped"
    );
    let mut outsider = std::process::Command::new("perl")
        .arg("-e")
        .arg(format!(
            "setpgrp(0, {group}) or die \"setpgrp: $!\"; $| = 1; print \"joined\\n\"; sleep 60"
        ))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        outsider.stdout.take().unwrap(),
        "joined",
        Duration::from_secs(10),
    );
    let pid = child.id() as i32;
    kill(pid, libc::SIGSTOP);
    // The member does not ignore SIGTERM: its death is the watcher's SIGTERM, which reaches every
    // process it takes for the job's in one pass.
    let stopped = eventually(Duration::from_secs(30), || !alive(member));
    std::thread::sleep(Duration::from_millis(500));
    let outsider_ended = outsider.try_wait().unwrap();
    kill(pid, libc::SIGCONT);
    let _ = wait_output(child, Duration::from_secs(30));
    let _ = outsider.kill();
    let _ = outsider.wait();
    assert!(
        stopped,
        "the watcher did not stop the job of the stopped lockctl"
    );
    assert_eq!(
        outsider_ended, None,
        "a process that joined the job's group from outside was killed with the job"
    );
}
