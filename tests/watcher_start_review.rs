//! A review of the watcher (`lockctl-guard`) started before the lock is won: what happens to a
//! waiting `exec` when its watcher, or lockctl itself, is stopped around the grant.
//!
//! - A watcher held at a debugger's stop while lockctl waits guards nothing, like one stopped by a
//!   signal: it must be replaced at the grant, before the command starts, not found out a second
//!   after the command started and the command killed for it (76).
//! - lockctl stopped between the grant and the command's spawn for longer than the lease: another
//!   client holds the lock by the time it resumes, so the command must not start at all.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::watchers::{
    hold_at, start_waiting, state, stopped_before_its_word, watcher_of, Started, Traced,
};
use support::*;

/// Holds `name` for a minute from another client; returns its token.
fn hold(s: &Server, name: &str) -> String {
    let held = acquire_json(&mut lockctl_on(s), name, &["--ttl", "60s"]);
    held["token"].as_str().unwrap().to_string()
}

/// A watcher held by a debugger while lockctl waits (`gdb -p $(pgrep lockctl-guard)`) guards
/// nothing, like a watcher stopped by a signal, which is replaced at the grant. lockctl checks
/// only for a signal's stop there (`T`), so it starts the command with the traced watcher, finds
/// it at the tracer's stop a second later and kills the command: exit 76 for a lease that was
/// never lost, the command cut short.
#[test]
fn a_watcher_held_by_a_debugger_while_waiting_is_replaced_at_the_grant() {
    let s = Server::start();
    let token = hold(&s, "traced");
    let done = s.dir().join("done");
    let script = format!("sleep 4; touch {}", done.display());
    let (child, err) = start_waiting(&s, "traced", &["--ttl", "2s"], &["sh", "-c", &script]);
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let first = watcher_of(lockctl);
    let Some(traced) = Traced::attach(first) else {
        eprintln!("NOT RUN HERE: ptrace is not permitted");
        return;
    };
    assert!(
        eventually(Duration::from_secs(20), || state(first) == Some('t')),
        "the watcher is not at a tracer's stop"
    );
    let o = run(lockctl_on(&s).args(["release", "traced", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = child.output(Duration::from_secs(60));
    // The replaced watcher is let go (`Pinned::let_go`): resumed, not killed, as it is not
    // lockctl's child; a debugger's hold ends only when the debugger lets go, and it then exits
    // at the end-of-file of its pipe.
    let held_on = alive(first);
    let how = state(first);
    drop(traced);
    let left = !eventually(Duration::from_secs(10), || !alive(first));
    let errs = errs.join().unwrap();
    assert_eq!(
        code(&out),
        0,
        "the command ran with a watcher held by a debugger and was stopped for it: {errs}"
    );
    assert!(done.exists(), "the command was cut short: {errs}");
    assert_eq!(s.get("lockctl:traced"), None, "the lock was not released");
    assert!(
        held_on,
        "the replaced watcher {first}, held by a debugger and no child of lockctl's, was killed \
         (state {how:?}): {errs}"
    );
    assert!(
        !left,
        "the replaced watcher {first} outlived its debugger's hold by 10 s: {errs}"
    );
}

/// lockctl stopped after the grant, before the command's spawn (here: its main thread held at the
/// entry of the spawn's `fork` by `strace -e inject=clone:delay_enter`, the same as a SIGSTOP at
/// that instruction), for longer than the lease: the key expires and another client takes the
/// lock. When lockctl resumes, the command must not start: nothing checks the lease's deadline
/// between the grant and the exec, so the command is exec'd while the other client holds the lock
/// and only then stopped for the lost lease (exit 76 "instead of the command's 143").
#[test]
fn a_lockctl_stopped_between_grant_and_spawn_past_its_lease_does_not_start_the_command() {
    need_tool("strace", "-V");
    let s = Server::start();
    let token = hold(&s, "late");
    let ran = s.dir().join("ran");
    let ran_arg = ran.display().to_string();
    let (child, err) = start_waiting(
        &s,
        "late",
        &["--ttl", "1s", "--kill-after", "5s"],
        &["touch", &ran_arg],
    );
    let errs = collect_stderr(err);
    let lockctl = child.id();
    watcher_of(lockctl);
    // Only the main thread (no -f): the command it forks runs untraced. Its first `clone` after
    // the grant is the command's fork (threads are started with clone3).
    let strace = hold_at(lockctl, &[("clone", 4_000_000)]);
    let o = run(lockctl_on(&s).args(["release", "late", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // The 1 s lease runs out while lockctl is held; another client then takes the lock, and
    // holds it past lockctl's resumption.
    let other = acquire_json(&mut lockctl_on(&s), "late", &["--ttl", "60s", "-w", "20s"]);
    let out = child.output(Duration::from_secs(60));
    drop(strace);
    let errs = errs.join().unwrap();
    assert_eq!(code(&out), 76, "{errs}");
    assert!(
        !ran.exists() && !errs.contains("instead of the command's"),
        "the command started after another client (fence {}) was granted the lock: {errs}",
        other["fence"]
    );
    assert!(
        s.get("lockctl:late").is_some(),
        "the other client's lock is gone"
    );
}

/// A watcher that has not said its first word by the grant (still starting, or held before its
/// exec: here its `close_range`, which nothing else in lockctl calls, is held 15 s by `strace -f
/// -e inject`). When this was found, lockctl waited for the word up to 10 s after the watcher's
/// start, with the lock granted and its 2 s lease running out, then started the command anyway,
/// after the key expired and another client could hold the lock. The command must not start once
/// its lease ran out. Since the double fork's middle process reports the watcher's PID, lockctl
/// sees it held at the grant (at a tracer's stop for a fifth of a second) and replaces it; the
/// replacement is held the same way (every process's first `close_range` is), so lockctl gives up
/// at once, before the lease runs out: exit 1, the watcher named, the lock released at once.
#[test]
fn a_watcher_silent_at_the_grant_does_not_let_the_command_start_past_its_lease() {
    need_tool("strace", "-V");
    let s = Server::start();
    let token = hold(&s, "silent");
    let ran = s.dir().join("ran");
    let mut strace = Command::new("strace");
    strace
        .args(["-f", "-o", "/dev/null", "-e", "trace=close_range"])
        .args(["-e", "inject=close_range:delay_enter=15000000:when=1"])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .args(["exec", "silent", "--ttl", "2s", "--", "touch"])
        .arg(&ran)
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = strace.spawn().unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let child = Started(Some(child));
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    if !line.contains("waiting for lock 'silent'") {
        eprintln!("NOT RUN HERE: lockctl does not run under strace -f: {line}");
        return;
    }
    let errs = collect_stderr(err.into_inner());
    let o = run(lockctl_on(&s).args(["release", "silent", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = child.output(Duration::from_secs(90));
    let errs = errs.join().unwrap();
    assert!(
        !ran.exists() && !errs.contains("instead of the command's"),
        "the command started after its 2 s lease ran out: {errs}"
    );
    // Given up before the lease ran out, so not 76: a watcher that cannot be started is lockctl's
    // own error (1), and says which part failed.
    assert_eq!(out.status.code(), Some(1), "{errs}");
    assert!(
        errs.contains("the watcher process ended, stopped or stayed silent at its start"),
        "the exit does not name the watcher: {errs}"
    );
    assert_eq!(s.get("lockctl:silent"), None, "the lock was not released");
}

/// A watcher stopped by a signal while lockctl waits (`pkill -STOP lockctl-guard`) is replaced
/// at the grant, and its pipe closed; it exits only once resumed. Nothing resumes it: after
/// `exec` has run its command, released the lock and exited, the stopped `lockctl-guard` is still
/// there, for good. `exec` leaves nothing behind, a watcher it replaced included.
#[test]
fn a_watcher_stopped_while_waiting_is_not_left_behind_once_replaced() {
    let s = Server::start();
    let token = hold(&s, "stopped");
    let (child, err) = start_waiting(&s, "stopped", &["--ttl", "5s"], &["true"]);
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let first = watcher_of(lockctl);
    // SAFETY: kill on the watcher of the lockctl this test started.
    unsafe { libc::kill(first, libc::SIGSTOP) };
    assert!(
        eventually(Duration::from_secs(20), || state(first) == Some('T')),
        "the watcher is not stopped"
    );
    let o = run(lockctl_on(&s).args(["release", "stopped", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = child.output(Duration::from_secs(60));
    let errs = errs.join().unwrap();
    assert_eq!(code(&out), 0, "{errs}");
    assert_eq!(s.get("lockctl:stopped"), None, "the lock was not released");
    // Generous: a replaced watcher that was resumed exits at once.
    let gone = eventually(Duration::from_secs(5), || !alive(first));
    if !gone {
        // SAFETY: the watcher this test stopped; resumed and killed so nothing outlives the test.
        unsafe {
            libc::kill(first, libc::SIGKILL);
            libc::kill(first, libc::SIGCONT);
        }
    }
    assert!(
        gone,
        "the replaced watcher {first} (stopped) outlived exec: {errs}"
    );
}

/// lockctl as the first process of a PID namespace (`unshare -pf --mount-proc`, a container
/// without an init) adopts its watcher. A watcher stopped before its first word (here caught by
/// its command line and stopped, `kill -STOP`) is replaced at the grant. When this was found, its
/// PID was unknown, so it was not killed: it stayed lockctl's child, and lockctl, which waits for
/// every child but the watcher it knows, waited for the stopped old watcher for good after the
/// command had exited, renewing the lock all along. The double fork's middle process now reports
/// the watcher's PID, and lockctl kills an adopted watcher it replaces. `exec` must release the
/// lock once its command is done.
#[test]
fn a_pid_1_exec_does_not_wait_for_a_silent_watcher_it_replaced() {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let unshare = Command::new("unshare").arg("-V").output().is_ok();
    if !root || !unshare {
        eprintln!("NOT RUN HERE: this case needs root and unshare");
        return;
    }
    let s = Server::start();
    let token = hold(&s, "pid1");
    let ran = s.dir().join("ran");
    let (mut child, resume) = stopped_before_its_word(
        || {
            let mut cmd = Command::new("unshare");
            cmd.args(["-pf", "--mount-proc"])
                .arg(env!("CARGO_BIN_EXE_lockctl"))
                .args(["exec", "pid1", "-w", "60", "--ttl", "30s", "--", "touch"])
                .arg(&ran)
                .env("LOCKCTL_REDIS", s.url())
                // The server was just started by this test.
                .env("LOCKCTL_QUARANTINE", "0")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped());
            Started(Some(cmd.spawn().unwrap()))
        },
        // lockctl is its namespace's first process.
        |_| 1,
    );
    let first = resume.0;
    let errs = collect_stderr(child.0.as_mut().unwrap().stderr.take().unwrap());
    let o = run(lockctl_on(&s).args(["release", "pid1", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(60), || ran.exists()),
        "the command did not run"
    );
    // Generous: a done exec releases and exits at once.
    let released = eventually(Duration::from_secs(20), || s.get("lockctl:pid1").is_none());
    // Should lockctl still wait for the watcher this test stopped, it is killed so that lockctl
    // ends; only while it is still that watcher (lockctl kills and reaps it, and its PID is free).
    let still = std::fs::read(format!("/proc/{first}/cmdline"))
        .is_ok_and(|c| c.starts_with(b"lockctl-guard\0--lockctl-guard\x001:"));
    if still {
        // SAFETY: the watcher this test stopped.
        unsafe { libc::kill(first, libc::SIGKILL) };
    }
    std::mem::forget(resume);
    let out = child.output(Duration::from_secs(60));
    let errs = errs.join().unwrap();
    assert!(
        released,
        "the command ended but lockctl (PID 1) kept the lock, waiting for the silent watcher it \
         replaced: {errs}"
    );
    assert_eq!(code(&out), 0, "{errs}");
}
