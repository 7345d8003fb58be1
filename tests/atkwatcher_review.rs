//! A review of 2052df6 (`src/exec/watcher.rs`): the double fork's middle process writes the
//! watcher's PID on the pipe back, and at the grant a silent watcher whose PID is known is looked
//! at every 10 ms and let go (SIGCONT, or SIGKILL when lockctl is its parent as a PID 1) if it is
//! stopped or held. The attacks stop or kill the watcher, or the middle process, at points of its
//! start, and check what `exec` promises:
//!
//! - the command never starts without a live, unstopped watcher, and a SIGKILLed lockctl takes
//!   its whole job along;
//! - nothing is left behind once `exec` exits, whatever the path: no `lockctl-guard` of it (a
//!   stopped one included), the lock released;
//! - no false failure for a watcher that is merely slow;
//! - every wait is bounded.
//!
//! Six defects it found are fixed (the middle process reaped with a bound and the start made
//! again, a stopped watcher resumed on every exit, signals through a pidfd, a signal during the
//! watcher's readying honoured); their tests stay, marked where they were ignored. One limit
//! stays ignored, with its reason.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use support::watchers::{
    comes_to, hold_at, ppid, start_waiting, state, watcher_of, watchers_of, Started, Stopped,
};
use support::*;

/// Holds `name` for ten minutes from another client (a minute ran out while a scene's tries
/// were slow on a loaded machine, and a waiter got the lock); returns its token.
fn hold(s: &Server, name: &str) -> String {
    let held = acquire_json(&mut lockctl_on(s), name, &["--ttl", "600s"]);
    held["token"].as_str().unwrap().to_string()
}

/// Stops `pid` (SIGSTOP) and waits until it shows stopped.
fn stop(pid: i32) -> Stopped {
    kill(pid, libc::SIGSTOP);
    assert!(
        eventually(Duration::from_secs(20), || state(pid) == Some('T')),
        "{pid} did not stop"
    );
    Stopped::of(pid)
}

/// True if `pid` is gone within a generous bound (a watcher whose pipe closed exits at once).
fn gone(pid: i32) -> bool {
    eventually(Duration::from_secs(10), || !alive(pid))
}

/// `sh -c` that touches `ran`.
fn touch(ran: &Path) -> Vec<String> {
    [
        "sh".to_string(),
        "-c".to_string(),
        format!("touch {}", ran.display()),
    ]
    .into()
}

/// A watcher stopped while lockctl waits (`pkill -STOP lockctl-guard`), then the wait runs out
/// (`-w`): lockctl exits 75 without running the command. Its pipe to the watcher closes, but the
/// watcher is stopped and never reads it: nothing resumes it, and the stopped `lockctl-guard`
/// stays for good. The module docs say "on every path where lockctl runs no command (busy, `-w`
/// run out, a signal ...) nothing is left behind"; only the grant lets go of a stopped watcher.
#[test]
// Fixed: was a defect: a watcher stopped while lockctl waits is left behind, stopped for good, when the -w wait runs out (only the grant lets go of it)
fn a_watcher_stopped_while_waiting_is_not_left_behind_when_the_wait_runs_out() {
    let s = Server::start();
    hold(&s, "runout");
    let ran = s.dir().join("ran");
    let program = touch(&ran);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let (child, err) = start_waiting(&s, "runout", &["-w", "3s"], &program);
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let first = watcher_of(lockctl);
    let stopped = stop(first);
    let out = child.output(Duration::from_secs(60));
    let errs = errs.join().unwrap();
    assert_eq!(code(&out), 75, "{errs}");
    assert!(!ran.exists(), "the command ran");
    let left = !gone(first);
    let how = state(first);
    drop(stopped);
    assert!(
        !left,
        "the watcher {first} of lockctl {lockctl} (state {how:?}) outlived an exec whose -w ran out"
    );
}

/// The same with a signal during the wait (Ctrl-C, SIGTERM): lockctl exits 143, the stopped
/// watcher stays.
#[test]
// Fixed: was a defect: a watcher stopped while lockctl waits is left behind, stopped for good, when a signal ends the wait (only the grant lets go of it)
fn a_watcher_stopped_while_waiting_is_not_left_behind_after_a_signal() {
    let s = Server::start();
    hold(&s, "signal");
    let ran = s.dir().join("ran");
    let program = touch(&ran);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let (child, err) = start_waiting(&s, "signal", &[], &program);
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let first = watcher_of(lockctl);
    let stopped = stop(first);
    kill(lockctl as i32, libc::SIGTERM);
    let out = child.output(Duration::from_secs(60));
    let errs = errs.join().unwrap();
    assert_eq!(out.status.code(), Some(143), "{errs}");
    assert!(!ran.exists(), "the command ran");
    let left = !gone(first);
    let how = state(first);
    drop(stopped);
    assert!(
        !left,
        "the watcher {first} of lockctl {lockctl} (state {how:?}) outlived an exec ended by SIGTERM"
    );
}

/// Starts `exec NAME FLAGS -- PROGRAM` on a held lock and stops the double fork's middle process
/// of its watcher's start (lockctl's only child before the command) with SIGSTOP as soon as it
/// shows: `pkill -STOP` landing in that moment. Tries up to 50 lockctls, each on `NAME` or, if
/// `fresh`, on `NAME` and the try's number (a lockctl killed after its grant leaves its lock held);
/// returns the lockctl (its stderr piped) and the stopped middle process, or None if none was
/// caught.
fn catch_the_middle(
    s: &Server,
    name: &str,
    fresh: bool,
    flags: &[&str],
    program: &[String],
) -> Option<(Started, Stopped)> {
    support::watchers::catch_the_middle(|attempt| {
        let name = if fresh {
            format!("{name}{attempt}")
        } else {
            name.to_string()
        };
        let mut cmd = lockctl_on(s);
        cmd.args(["exec", &name])
            .args(flags)
            .arg("--")
            .args(program)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        Started(Some(cmd.spawn().unwrap()))
    })
}

/// The middle process of the watcher's double fork stopped before it exits (`pkill -STOP -f
/// 'exec NAME'` matches it: it is a copy of lockctl). When this was found, lockctl waited for it
/// with a `waitpid` without a bound, on the watcher's start thread, and at the grant joined that
/// thread: it waited past the 2 s lease and past the 10 s it gives a watcher's first word, and a
/// SIGTERM did not end it (the signal goes to the waiter's channel, which nobody reads then). Now
/// the middle process is waited for 2 s at most, then killed, and the start made again at the
/// grant: lockctl ends on its own, running the command under the new watcher (exit 0) or, when
/// the lease ran out meanwhile, not at all (76).
#[test]
fn a_stopped_middle_process_does_not_hold_lockctl_at_the_grant_for_good() {
    middle_stopped(true, &["--ttl", "2s"]);
}

/// The same with `-n`: the watcher starts at the grant, on lockctl's main thread.
#[test]
fn a_stopped_middle_process_does_not_hold_a_one_attempt_exec_for_good() {
    middle_stopped(false, &["-n", "--ttl", "2s"]);
}

/// With `-n` the watcher starts at the grant and a failed start is not made again: the middle
/// process stopped past its 2 s bound is killed, and the start counts as failed (`reap_middle`:
/// only an exit 0 is a start), which lockctl says (76, "cannot fork the watcher process"). A
/// killed middle process taken for a start would leave lockctl waiting for a first word that
/// never comes, until the lease runs out ("did not answer"), or replacing the watcher.
#[test]
fn a_one_attempt_exec_whose_middle_process_was_killed_says_the_fork_failed() {
    let s = Server::start();
    let ran = s.dir().join("ran");
    let Some((child, middle)) =
        catch_the_middle(&s, "killed", true, &["-n", "--ttl", "2s"], &touch(&ran))
    else {
        panic!("the middle process was never caught (50 tries)");
    };
    // A try whose middle process was not caught ran its command.
    let _ = std::fs::remove_file(&ran);
    let lockctl = child.id();
    let name = String::from_utf8_lossy(&std::fs::read(format!("/proc/{lockctl}/cmdline")).unwrap())
        .split('\0')
        .nth(2)
        .unwrap()
        .to_string();
    let out = child.output(Duration::from_secs(60));
    drop(middle);
    let errs = stderr(&out);
    assert_eq!(code(&out), 76, "{errs}");
    assert!(!ran.exists(), "the command ran: {errs}");
    assert!(
        errs.contains("cannot fork the watcher process"),
        "a start whose middle process was killed was not counted as failed: {errs}"
    );
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "the lock was not released"
    );
}

/// Stops the middle process of an exec's watcher start (on a held lock, released then, if
/// `held`), and checks that lockctl ends on its own within 15 s of the grant: 0 with the command
/// run, or 76 without it; the lock released, no watcher left, the middle process reaped.
fn middle_stopped(held: bool, flags: &[&str]) {
    let s = Server::start();
    let token = held.then(|| hold(&s, "middle"));
    let ran = s.dir().join("ran");
    let Some((child, middle)) = catch_the_middle(&s, "middle", !held, flags, &touch(&ran)) else {
        panic!("the middle process was never caught (50 tries)");
    };
    // With `-n` on a free lock, a try whose middle process was not caught ran its command.
    let _ = std::fs::remove_file(&ran);
    let lockctl = child.id();
    let name = String::from_utf8_lossy(&std::fs::read(format!("/proc/{lockctl}/cmdline")).unwrap())
        .split('\0')
        .nth(2)
        .unwrap()
        .to_string();
    if let Some(token) = token {
        let o = run(lockctl_on(&s).args(["release", "middle", "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    let ended = eventually(Duration::from_secs(15), || !alive(lockctl as i32));
    let still = state(middle.0);
    let out = child.output(Duration::from_secs(30));
    drop(middle);
    let errs = stderr(&out);
    assert!(
        ended,
        "lockctl {lockctl} still waited 15 s after its grant for the watcher's stopped middle \
         process (state {still:?}): {:?} {errs}",
        out.status
    );
    match out.status.code() {
        Some(0) => assert!(ran.exists(), "exit 0 without the command: {errs}"),
        Some(76) => assert!(!ran.exists(), "the command ran: {errs}"),
        other => panic!("lockctl ended {other:?}: {errs}"),
    }
    assert!(
        eventually(Duration::from_secs(10), || watchers_of(lockctl).is_empty()),
        "a watcher outlived lockctl"
    );
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "the lock was not released"
    );
}

/// A watcher stopped while the command runs (`pkill -STOP lockctl-guard`): lockctl finds it
/// stopped, stops the job and exits 76, as designed. But it tells the stopped watcher "done" on a
/// pipe it does not read, and exits: the stopped `lockctl-guard` stays for good. "Nothing is left
/// behind" holds on the grant's path only (the watcher replaced there is resumed).
#[test]
// Fixed: was a defect: a watcher stopped while the command runs is left behind, stopped for good, once lockctl has stopped the job for it and exited 76
fn a_watcher_stopped_while_the_command_runs_is_not_left_behind() {
    let s = Server::start();
    let mut child = lockctl_on(&s)
        .args(["exec", "running", "--ttl", "5s", "--", "sh", "-c"])
        .arg("echo started; exec sleep 60")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let errs = collect_stderr(child.stderr.take().unwrap());
    let child = Started(Some(child));
    let _out = wait_for_line(out, "started", Duration::from_secs(30));
    let lockctl = child.id();
    let watcher = watcher_of(lockctl);
    let stopped = stop(watcher);
    let out = child.output(Duration::from_secs(60));
    let errs = errs.join().unwrap();
    assert_eq!(code(&out), 76, "{errs}");
    assert!(errs.contains("is stopped"), "{errs}");
    assert_eq!(s.get("lockctl:running"), None, "the lock was not released");
    let left = !gone(watcher);
    let how = state(watcher);
    drop(stopped);
    assert!(
        !left,
        "the watcher {watcher} (state {how:?}) outlived its lockctl {lockctl}, which exited 76 \
         for it: {errs}"
    );
}

/// The first of `pids` that `pred` picks, looked for in a tight loop (at most 20 000 sweeps).
fn catch(pids: std::ops::Range<i32>, pred: impl Fn(i32) -> bool) -> Option<i32> {
    (0..20_000).find_map(|_| pids.clone().find(|&p| pred(p)))
}

/// True if `pid` is a process (not a thread) running lockctl's binary with lockctl's command line
/// `cmdline`, other than lockctl `lockctl` and its children: the watcher after the second fork,
/// before its exec.
fn before_exec(pid: i32, lockctl: i32, cmdline: &[u8]) -> bool {
    pid != lockctl
        && std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == cmdline)
        && std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
            st.lines().any(|l| {
                l.split_whitespace()
                    .eq(["Tgid:".to_string(), pid.to_string()])
            })
        })
        && ppid(pid).is_some_and(|p| p != lockctl)
}

/// True if `pid` runs as a watcher of `lockctl` (its exec done) but has not taken its name, so
/// has not said its first word.
fn before_first_word(pid: i32, lockctl: i32) -> bool {
    let prefix = format!("lockctl-guard\0--lockctl-guard\0{lockctl}:");
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(prefix.as_bytes()))
        && std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() != "lockctl-guard")
}

/// `sh -c` that writes its PID to `pid`, then waits for the file `go`.
fn job_until(pid: &Path, go: &Path) -> Vec<String> {
    [
        "sh".to_string(),
        "-c".to_string(),
        format!(
            "echo $$ > {pid}; while [ ! -e {go} ]; do sleep 0.05; done",
            pid = pid.display(),
            go = go.display()
        ),
    ]
    .into()
}

fn read_pid(file: &Path) -> Option<i32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// Where the watcher of a one-attempt exec (`-n`, started at the grant) is stopped.
#[derive(Clone, Copy, Debug)]
enum Point {
    /// After the second fork, before its exec: the middle process's word gives its PID.
    BeforeExec,
    /// After its exec, before it takes its name and says its first word.
    BeforeFirstWord,
}

/// `-n` on a free lock: the watcher starts at the grant, and is stopped at `point`. lockctl must
/// replace it (unless the kernel resumed it first, see below), run the command guarded by the new one (lockctl SIGKILLed then: the job dies), and
/// leave nothing: the stopped first watcher is resumed and exits, the replacement exits.
fn one_attempt_with_its_watcher_stopped(point: Point) {
    let s = Server::start();
    let mut caught = None;
    for attempt in 1..=50 {
        let name = format!("n{attempt}");
        let job = s.dir().join(format!("job{attempt}"));
        let go = s.dir().join(format!("go{attempt}"));
        let mut cmd = lockctl_on(&s);
        cmd.args([
            "exec",
            &name,
            "-n",
            "--ttl",
            "6s",
            "--kill-after",
            "1s",
            "--",
        ])
        .args(job_until(&job, &go))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
        let mut child = Started(Some(cmd.spawn().unwrap()));
        let lockctl = child.id() as i32;
        let Ok(cmdline) = std::fs::read(format!("/proc/{lockctl}/cmdline")) else {
            child.kill();
            continue;
        };
        let range = lockctl + 1..lockctl + 64;
        let found = match point {
            Point::BeforeExec => catch(range, |p| before_exec(p, lockctl, &cmdline)),
            Point::BeforeFirstWord => catch(range, |p| before_first_word(p, lockctl)),
        };
        if let Some(first) = found {
            kill(first, libc::SIGSTOP);
            let stopped = Stopped::of(first);
            let is_stopped = eventually(Duration::from_secs(5), || state(first) == Some('T'));
            if !is_stopped {
                eprintln!(
                    "{point:?}: {first} did not stop: state {:?} ppid {:?} cmdline {:?}",
                    state(first),
                    ppid(first),
                    std::fs::read(format!("/proc/{first}/cmdline"))
                        .map(|c| String::from_utf8_lossy(&c).into_owned())
                );
            }
            let still = is_stopped
                && match point {
                    Point::BeforeExec => before_exec(first, lockctl, &cmdline),
                    Point::BeforeFirstWord => before_first_word(first, lockctl),
                };
            if still {
                eprintln!(
                    "{point:?}: caught watcher {first} of lockctl {lockctl} at try {attempt}"
                );
                let err = child.0.as_mut().unwrap().stderr.take().unwrap();
                caught = Some((child, collect_stderr(err), stopped, name, job, go));
                break;
            }
        }
        child.kill();
    }
    let Some((child, errs, first, name, job, go)) = caught else {
        panic!("no watcher was caught at {point:?} (50 tries)");
    };
    let lockctl = child.id();
    let started = eventually(Duration::from_secs(30), || read_pid(&job).is_some());
    if !started {
        let out = child.output(Duration::from_secs(30));
        panic!(
            "{point:?}: the command did not start: {:?} {}",
            out.status,
            errs.join().unwrap()
        );
    }
    let job_pid = read_pid(&job).unwrap();
    // One watcher guards the job, not stopped: a new one, the stopped first one let go (resumed,
    // it exits at its pipe's end); or the first one itself, when the kernel resumed it as its
    // group became orphaned (stopped before the middle process exited: SIGHUP, blocked, and
    // SIGCONT) before lockctl looked at it.
    let mut guards = Vec::new();
    eventually(Duration::from_secs(10), || {
        guards = watchers_of(lockctl);
        guards.len() == 1
    });
    assert_eq!(
        guards.len(),
        1,
        "{point:?}: one watcher guards the job: {guards:?}"
    );
    assert_ne!(
        state(guards[0]),
        Some('T'),
        "the guarding watcher is stopped"
    );
    let first_gone = guards[0] == first.0 || gone(first.0);
    if guards[0] == first.0 {
        eprintln!("{point:?}: the first watcher was resumed by the kernel and guards the job");
    }
    // lockctl dies: the watcher kills the job.
    child.kill();
    let died = eventually(Duration::from_secs(20), || !alive(job_pid));
    std::fs::write(&go, "").unwrap();
    if !died {
        kill(job_pid, libc::SIGKILL);
    }
    let _ = errs.join();
    let left: Vec<i32> = watchers_of(lockctl);
    let no_guard = eventually(Duration::from_secs(20), || watchers_of(lockctl).is_empty());
    drop(first);
    assert!(died, "{point:?}: the job outlived a SIGKILLed lockctl");
    assert!(
        first_gone,
        "{point:?}: the stopped first watcher was not let go"
    );
    assert!(no_guard, "{point:?}: watchers outlived lockctl: {left:?}");
    // The lease is gone once its TTL has passed (lockctl was killed: no release).
    assert!(
        eventually(Duration::from_secs(20), || s
            .get(&format!("lockctl:{name}"))
            .is_none()),
        "the lock outlived its TTL"
    );
}

/// `-n`, the watcher stopped between its fork and its exec (its command line is still lockctl's):
/// the middle process's word names it, lockctl sees it stopped at the grant and replaces it.
#[test]
fn a_one_attempt_exec_replaces_a_watcher_stopped_before_its_exec() {
    one_attempt_with_its_watcher_stopped(Point::BeforeExec);
}

/// `-n`, the watcher stopped after its exec, before its first word.
#[test]
fn a_one_attempt_exec_replaces_a_watcher_stopped_before_its_first_word() {
    one_attempt_with_its_watcher_stopped(Point::BeforeFirstWord);
}

/// Run by [`a_watcher_killed_while_lockctl_lets_it_go_does_not_lend_its_pid`] as the first process
/// of a PID namespace of its own (so that it can pick the next PID, `ns_last_pid`, and reaps the
/// orphaned watcher): `$1` lockctl, `$2` the lock's name, `$3` a directory with the holder's
/// `token`. Every wait is bounded.
const LEND_SCRIPT: &str = r#"
set -u
L=$1; NAME=$2; DIR=$3
"$L" exec "$NAME" -- true 2>"$DIR/lockctl.err" &
LP=$!
W=
for i in $(seq 1 400); do
  for p in /proc/[0-9]*; do
    case "$(tr '\0' ' ' < $p/cmdline 2>/dev/null)" in
      "lockctl-guard --lockctl-guard $LP:"*) W=${p#/proc/};;
    esac
  done
  [ -n "$W" ] && grep -q lockctl-guard /proc/$W/comm 2>/dev/null && break
  sleep 0.05
done
echo "lockctl=$LP watcher=$W"
[ -n "$W" ] || exit 3
# lockctl's main thread held at the entry of its first kill(2) or pidfd_send_signal(2), as a
# SIGSTOP there would.
strace -p $LP -o "$DIR/strace.log" -e trace=kill,pidfd_send_signal \
  -e inject=kill,pidfd_send_signal:delay_enter=5000000:when=1 2>"$DIR/strace.err" &
for i in $(seq 1 200); do grep -q attached "$DIR/strace.err" 2>/dev/null && break; sleep 0.05; done
grep -q attached "$DIR/strace.err" || exit 4
kill -STOP $W
"$L" release "$NAME" --token "$(cat $DIR/token)" >/dev/null 2>&1 || exit 5
# lockctl found the watcher stopped at the grant and is in kill(W, SIGCONT) (syscall 62, W) or
# pidfd_send_signal(its pidfd of W, SIGCONT) (syscall 424).
hexw=$(printf '0x%x' $W)
at=
for i in $(seq 1 2000); do
  case "$(cat /proc/$LP/syscall 2>/dev/null)" in "62 $hexw "*|"424 "*) at=yes; break;; esac
  sleep 0.01
done
echo "lockctl at kill($W): ${at:-no}"
[ -n "$at" ] || exit 6
# The stopped watcher is killed (the OOM killer, an admin), reaped by this PID 1, and its PID
# handed out again: here at once, elsewhere after the PIDs wrap around.
kill -KILL $W
for i in $(seq 1 500); do [ -e /proc/$W ] || break; sleep 0.01; done
echo $((W-1)) > /proc/sys/kernel/ns_last_pid
sh -c "kill -STOP \$\$; touch $DIR/continued; exec sleep 30" &
I=$!
for i in $(seq 1 500); do [ "$(awk '{print $3}' /proc/$I/stat 2>/dev/null)" = T ] && break; sleep 0.01; done
echo "other=$I stopped=$(awk '{print $3}' /proc/$I/stat)"
[ "$I" = "$W" ] || exit 7
wait $LP
echo "lockctl exit $?"
for i in $(seq 1 100); do [ -e "$DIR/continued" ] && break; sleep 0.05; done
echo "continued: $([ -e "$DIR/continued" ] && echo yes || echo no)"
kill -KILL $I
"#;

/// lockctl finds its watcher stopped at the grant and lets it go (`let_go`: SIGCONT), but is
/// itself stopped between its look and the kill (here held at the kill's entry by `strace
/// -e inject`, as a SIGSTOP there would). Meanwhile the stopped watcher is SIGKILLed and reaped by
/// its parent (init, not lockctl), and its PID goes to another process, stopped. When lockctl
/// resumes, its SIGCONT reaches that other process. `let_go`'s docs: "Its PID stays its own while
/// it is stopped, and until lockctl reaps it" (lockctl does not reap it; anyone may kill it). The
/// PID is reused at once here (a PID namespace of the test's own, `ns_last_pid`); elsewhere it
/// takes the PIDs wrapping around while lockctl is stopped. The same `let_go` serves the silent
/// watcher of 2052df6, whose PID comes from the middle process.
#[test]
// Fixed: was a defect: let_go's SIGCONT goes to whatever process has the watcher's PID by then: a stopped watcher killed and reaped by init while lockctl is stopped before the kill, its PID reused, gets another process continued
fn a_watcher_killed_while_lockctl_lets_it_go_does_not_lend_its_pid() {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    let tools = ["strace", "unshare", "bash"].iter().all(|t| {
        std::process::Command::new(t)
            .arg("--version")
            .output()
            .is_ok()
    });
    if !root || !tools {
        panic!("this case needs root, strace, unshare and bash");
    }
    let s = Server::start();
    let token = hold(&s, "lend");
    std::fs::write(s.dir().join("token"), &token).unwrap();
    let child = std::process::Command::new("unshare")
        .args([
            "-pf",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            LEND_SCRIPT,
            "lend",
        ])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .arg("lend")
        .arg(s.dir())
        .env("LOCKCTL_REDIS", s.url())
        // The server was just started by this test.
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, Duration::from_secs(90));
    let said = format!(
        "{}{}\nlockctl: {}",
        stdout(&out),
        stderr(&out),
        std::fs::read_to_string(s.dir().join("lockctl.err")).unwrap_or_default()
    );
    if !said.contains("continued:") {
        panic!("the scene was not set up: {said}");
    }
    assert!(
        said.contains("continued: no"),
        "lockctl's SIGCONT for its stopped watcher reached another process that took its PID: \
         {said}"
    );
}

/// A SIGTERM to lockctl after the grant, while it looks at its watcher before starting the
/// command (here its main thread held 3 s at the look's `openat` of `/proc/W/stat` by `strace
/// -e inject`, as a stop or a slow machine would; with 2052df6 a silent watcher is looked at
/// every 10 ms for as long as it stays silent). mod.rs: "A signal that came after the grant and
/// before the command starts: do not start it." The check is made once, before the watcher is
/// waited for: a signal during that wait is only forwarded to the job once it runs. The command
/// (`env --ignore-signal=TERM touch`, so that the forwarded SIGTERM does not hide its start) runs,
/// and lockctl exits 0 (in 8 of 10 runs; in the others the forwarded SIGTERM killed `env` before
/// it ignored it: 143, without lockctl's "interrupted").
#[test]
// Fixed: was a defect: a SIGTERM that reaches lockctl after the grant, while it waits for or looks at its watcher, does not keep the command from starting (it is only forwarded to the job)
fn a_signal_while_lockctl_looks_at_its_watcher_at_the_grant_keeps_the_command_from_starting() {
    need_tool("strace", "-V");
    let s = Server::start();
    let token = hold(&s, "sigready");
    let ran = s.dir().join("ran");
    let ran_arg = ran.display().to_string();
    let (child, err) = start_waiting(
        &s,
        "sigready",
        &["--ttl", "30s"],
        &["env", "--ignore-signal=TERM", "touch", &ran_arg],
    );
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let watcher = watcher_of(lockctl);
    // Only the main thread, which runs the grant's look at the watcher, and only its `openat` of
    // `/proc/W/stat`.
    let strace = hold_at(lockctl, &[("openat", 3_000_000)]);
    let o = run(lockctl_on(&s).args(["release", "sigready", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let held = comes_to(lockctl, &[libc::SYS_openat], Duration::from_secs(20));
    assert!(
        held,
        "lockctl was not held at its look at the watcher {watcher}"
    );
    kill(lockctl as i32, libc::SIGTERM);
    let out = child.output(Duration::from_secs(60));
    drop(strace);
    let errs = errs.join().unwrap();
    // Not started: lockctl says it was interrupted. Started, the command may still die of the
    // forwarded SIGTERM before `env` ignores it (143 then too, but nothing said).
    assert!(
        !ran.exists() && errs.contains("interrupted by signal 15"),
        "the command started after lockctl got SIGTERM (exit {:?}, ran: {}): {errs}",
        out.status.code(),
        ran.exists()
    );
    assert_eq!(out.status.code(), Some(143), "{errs}");
    assert_eq!(s.get("lockctl:sigready"), None, "the lock was not released");
}

/// lockctl as the first process of a PID namespace (`unshare -pf --mount-proc`: a container
/// without an init), `-n` on a free lock, its watcher stopped before its first word. The
/// watcher is lockctl's child there (it adopts every orphan): `let_go` kills it rather than
/// resumes it, and lockctl must not then wait for it as for the job. The command runs, lockctl
/// exits with it, the lock is released.
#[test]
fn lockctl_as_pid_1_replaces_a_watcher_stopped_before_its_first_word() {
    let probe = std::process::Command::new("unshare")
        .args(["-pf", "--kill-child", "--mount-proc", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        panic!("the PID-namespace case needs `unshare -pf --mount-proc`");
    }
    let s = Server::start();
    let mut caught = None;
    for attempt in 1..=50 {
        let name = format!("pid1n{attempt}");
        let ran = s.dir().join(format!("ran{attempt}"));
        let container = Started(Some(
            std::process::Command::new("unshare")
                .args(["-pf", "--kill-child", "--mount-proc"])
                .arg(env!("CARGO_BIN_EXE_lockctl"))
                .args([
                    "exec",
                    &name,
                    "-n",
                    "--verbose",
                    "--ttl",
                    "6s",
                    "--",
                    "touch",
                ])
                .arg(&ran)
                .env("LOCKCTL_REDIS", s.url())
                // The server was just started by this test.
                .env("LOCKCTL_QUARANTINE", "0")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        ));
        let outer = container.id() as i32;
        // lockctl is PID 1 inside: its watchers' command lines name it `1:`.
        let found = catch(outer + 1..outer + 64, |p| before_first_word(p, 1));
        if let Some(first) = found {
            kill(first, libc::SIGSTOP);
            let stopped = Stopped::of(first);
            if eventually(Duration::from_secs(5), || state(first) == Some('T'))
                && before_first_word(first, 1)
            {
                eprintln!("caught watcher {first} (outside PID) at try {attempt}");
                caught = Some((container, stopped, name, ran));
                break;
            }
        }
        container.kill();
    }
    let Some((container, first, name, ran)) = caught else {
        panic!("no watcher was caught before its first word (50 tries)");
    };
    // Well within the 6 s lease: a replaced watcher costs a few looks, not the lease.
    let out = container.output(Duration::from_secs(30));
    let first_gone = !alive(first.0);
    drop(first);
    assert_eq!(
        out.status.code(),
        Some(0),
        "lockctl (PID 1) did not end with its command: {}",
        stderr(&out)
    );
    assert!(ran.exists(), "the command did not run");
    assert!(
        first_gone,
        "the stopped first watcher outlived its namespace"
    );
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "the lock was not released"
    );
}

/// A watcher merely slow to start: `strace -f` stops it for a moment at every system call
/// (and lockctl's own threads too), and the grant now looks at a silent watcher every 10 ms. No
/// run may end in a false failure: 10 one-attempt execs (watcher started at the grant) and 10
/// waiting ones (started with the first attempt), each must run its command and exit 0.
#[test]
fn strace_f_does_not_fail_a_healthy_exec() {
    need_tool("strace", "-V");
    let s = Server::start();
    let mut failed = Vec::new();
    for (i, flags) in std::iter::repeat_n(&["-n"][..], 10)
        .chain(std::iter::repeat_n(&["-w", "30s"][..], 10))
        .enumerate()
    {
        let name = format!("strace{i}");
        let ran = s.dir().join(format!("ran{i}"));
        let child = std::process::Command::new("strace")
            .args(["-f", "-o", "/dev/null"])
            .arg(env!("CARGO_BIN_EXE_lockctl"))
            .args(["exec", &name, "--ttl", "10s"])
            .args(flags)
            .args(["--", "touch"])
            .arg(&ran)
            .env("LOCKCTL_REDIS", s.url())
            // The server was just started by this test.
            .env("LOCKCTL_QUARANTINE", "0")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = wait_output(child, Duration::from_secs(60));
        if out.status.code() != Some(0) || !ran.exists() {
            failed.push(format!("{flags:?}: {:?} {}", out.status, stderr(&out)));
        }
    }
    assert!(
        failed.is_empty(),
        "healthy execs failed under strace -f: {failed:#?}"
    );
}

/// The first watcher stopped while lockctl waits; the holder releases; lockctl is SIGKILLed a
/// little later each round (0 to 64 ms after the release, then once the job runs). Whatever
/// point of the grant it died at (before the look, between the let-go and the replacement,
/// before or after the command's spawn), no process of the job may survive it. A first watcher
/// still stopped once lockctl is dead (killed before it let it go) is only counted: nothing but
/// lockctl could resume it.
#[test]
fn a_lockctl_killed_at_the_grant_with_its_watcher_stopped_takes_its_job_along() {
    let s = Server::start();
    let mut started = 0;
    let mut stuck = Vec::new();
    for (round, delay_ms) in [0u64, 1, 2, 4, 8, 16, 32, 64, u64::MAX]
        .into_iter()
        .enumerate()
    {
        let name = format!("grant{round}");
        let token = hold(&s, &name);
        let job = s.dir().join(format!("job{round}"));
        let go = s.dir().join(format!("go{round}"));
        let program = job_until(&job, &go);
        let program: Vec<&str> = program.iter().map(String::as_str).collect();
        let (child, _err) = start_waiting(&s, &name, &["--ttl", "6s"], &program);
        let lockctl = child.id();
        let first = stop(watcher_of(lockctl));
        let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        if delay_ms == u64::MAX {
            assert!(
                eventually(Duration::from_secs(30), || read_pid(&job).is_some()),
                "the command did not start"
            );
        } else {
            std::thread::sleep(Duration::from_millis(delay_ms));
        }
        child.kill();
        // Whatever job there is was started by then (lockctl is dead).
        let job_pid = read_pid(&job);
        let died = job_pid.is_none_or(|p| eventually(Duration::from_secs(20), || !alive(p)));
        std::fs::write(&go, "").unwrap();
        if let Some(p) = job_pid {
            started += 1;
            if !died {
                kill(p, libc::SIGKILL);
            }
        }
        assert!(died, "round {round}: the job outlived a SIGKILLed lockctl");
        let others_gone = eventually(Duration::from_secs(20), || {
            watchers_of(lockctl).iter().all(|&w| w == first.0)
        });
        assert!(
            others_gone,
            "round {round}: a replacement watcher outlived lockctl"
        );
        if !gone(first.0) {
            stuck.push((round, state(first.0)));
        }
        drop(first);
    }
    eprintln!("{started} rounds got as far as the job; first watcher left stopped in {stuck:?}");
    assert!(started >= 1, "no round got as far as the job");
}

/// The middle process of the watcher's double fork killed (SIGKILL, caught as for the stop
/// above): the waiting exec's start of its watcher failed. When this was found, lockctl ended at
/// the grant without the command (exit 1); a start that failed while lockctl waited is now made
/// again at the grant, as a killed watcher is replaced. The command runs, guarded by the new
/// watcher, the lock is released, and no watcher is left (a grandchild forked before the kill
/// exits at its pipe's end).
#[test]
fn a_killed_middle_process_is_started_again_at_the_grant() {
    let s = Server::start();
    let token = hold(&s, "midkill");
    let ran = s.dir().join("ran");
    let Some((child, middle)) =
        catch_the_middle(&s, "midkill", false, &["--ttl", "6s"], &touch(&ran))
    else {
        panic!("the middle process was never caught (50 tries)");
    };
    let lockctl = child.id();
    kill(middle.0, libc::SIGKILL);
    std::mem::forget(middle);
    let o = run(lockctl_on(&s).args(["release", "midkill", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = child.output(Duration::from_secs(30));
    let errs = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{errs}");
    assert!(ran.exists(), "the command did not run: {errs}");
    assert!(
        eventually(Duration::from_secs(10), || watchers_of(lockctl).is_empty()),
        "a watcher outlived lockctl"
    );
    assert_eq!(s.get("lockctl:midkill"), None, "the lock was not released");
}

/// The PID the kernel handed out last (in this test's PID namespace).
fn last_pid() -> i32 {
    std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1)
}

/// Both watchers stopped before their first word: the first while lockctl waits, the
/// replacement as it starts at the grant (caught by its command line among the PIDs handed out
/// after the release began). lockctl must give up without the command (exit 1, the watcher
/// named), let both go, release the lock, and leave no watcher.
#[test]
fn a_replacement_stopped_before_its_first_word_leaves_nothing_behind() {
    let s = Server::start();
    let mut tries = 0;
    let caught = loop {
        tries += 1;
        if tries > 20 {
            break None;
        }
        let name = format!("both{tries}");
        let token = hold(&s, &name);
        let job = s.dir().join(format!("job{tries}"));
        let go = s.dir().join(format!("go{tries}"));
        let program = job_until(&job, &go);
        let program: Vec<&str> = program.iter().map(String::as_str).collect();
        let (child, err) = start_waiting(&s, &name, &["--ttl", "6s"], &program);
        let errs = collect_stderr(err);
        let lockctl = child.id() as i32;
        let first = stop(watcher_of(lockctl as u32));
        let from = last_pid() + 1;
        let other = first.0;
        let catcher = std::thread::spawn(move || {
            let found = catch(from..from + 256, |p| {
                p != other && before_first_word(p, lockctl)
            })?;
            kill(found, libc::SIGSTOP);
            Some(found)
        });
        let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let second = catcher.join().unwrap();
        let second = second.map(Stopped::of);
        let silent = second.as_ref().is_some_and(|w| {
            eventually(Duration::from_secs(5), || state(w.0) == Some('T'))
                && before_first_word(w.0, lockctl)
        });
        if silent {
            eprintln!("caught the replacement at try {tries}");
            break Some((child, errs, first, second.unwrap(), name, job, go));
        }
        std::fs::write(&go, "").unwrap();
        drop(second);
        let _ = child.output(Duration::from_secs(30));
        drop(first);
    };
    let Some((child, errs, first, second, name, job, go)) = caught else {
        panic!("no replacement was caught before its first word (20 tries)");
    };
    let lockctl = child.id();
    let out = child.output(Duration::from_secs(30));
    std::fs::write(&go, "").unwrap();
    let errs = errs.join().unwrap();
    let ran = read_pid(&job).is_some();
    let left: Vec<i32> = [first.0, second.0]
        .into_iter()
        .filter(|&w| !gone(w))
        .collect();
    let states: Vec<_> = left.iter().map(|&w| state(w)).collect();
    drop((first, second));
    assert!(!ran, "the command ran: {errs}");
    assert_eq!(out.status.code(), Some(1), "{errs}");
    assert!(errs.contains("watcher"), "{errs}");
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "the lock was not released"
    );
    assert!(
        left.is_empty(),
        "watchers {left:?} (states {states:?}) outlived lockctl {lockctl}: {errs}"
    );
}

/// lockctl found its watcher stopped at the grant and is held (`strace -e inject`, as a SIGSTOP
/// there) at the entry of the let-go's kill, 4 s, past its 1 s lease; another client takes the
/// lock meanwhile. Resumed, lockctl must not start a replacement and the command: the lease ran
/// out (76), and the other client's lock stays.
#[test]
fn a_lockctl_held_while_it_lets_its_watcher_go_past_its_lease_does_not_start_the_command() {
    need_tool("strace", "-V");
    let s = Server::start();
    let token = hold(&s, "letgo");
    let ran = s.dir().join("ran");
    let program = touch(&ran);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let (child, err) = start_waiting(
        &s,
        "letgo",
        &["--ttl", "1s", "--kill-after", "5s"],
        &program,
    );
    let errs = collect_stderr(err);
    let lockctl = child.id();
    let first = stop(watcher_of(lockctl));
    let strace = hold_at(
        lockctl,
        &[("kill", 4_000_000), ("pidfd_send_signal", 4_000_000)],
    );
    let o = run(lockctl_on(&s).args(["release", "letgo", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // kill(2) on the watcher's PID, or pidfd_send_signal(2) on a pidfd of it.
    let at_kill = comes_to(
        lockctl,
        &[libc::SYS_kill, libc::SYS_pidfd_send_signal],
        Duration::from_secs(20),
    );
    assert!(
        at_kill,
        "lockctl did not come to let its stopped watcher go"
    );
    // The 1 s lease runs out while lockctl is held; another client takes the lock.
    let other = acquire_json(&mut lockctl_on(&s), "letgo", &["--ttl", "60s", "-w", "20s"]);
    let out = child.output(Duration::from_secs(60));
    drop(strace);
    drop(first);
    let errs = errs.join().unwrap();
    assert!(
        !ran.exists() && !errs.contains("instead of the command's"),
        "the command started after another client (fence {}) was granted the lock: {errs}",
        other["fence"]
    );
    assert_eq!(code(&out), 76, "{errs}");
    assert!(
        s.get("lockctl:letgo").is_some(),
        "the other client's lock is gone"
    );
}

/// The watcher is looked at once, at the grant; it is stopped after that look and before the
/// command's fork (here lockctl's main thread held 2 s at that fork's `clone` by `strace -e
/// inject`, as a stop or a preemption there would; in the wild the window is the few
/// instructions between `held` and the fork, plus the 100 ms before the first check). The
/// command starts with a stopped watcher; lockctl is SIGKILLed before its check thread runs
/// (held at its `clone3`): the job runs on, unguarded, for as long as the watcher stays stopped.
/// Promise: the command never starts without a live, unstopped watcher.
#[test]
#[ignore = "limit: a watcher stopped between the grant's look and the command's fork guards nothing; lockctl SIGKILLed before its first check (100 ms) leaves the job running while the watcher stays stopped"]
fn a_watcher_stopped_between_the_look_and_the_fork_does_not_let_the_job_outlive_lockctl() {
    need_tool("strace", "-V");
    let s = Server::start();
    let token = hold(&s, "between");
    let job = s.dir().join("job");
    let go = s.dir().join("go");
    let program = job_until(&job, &go);
    let program: Vec<&str> = program.iter().map(String::as_str).collect();
    let (child, _err) = start_waiting(&s, "between", &["--ttl", "10s"], &program);
    let lockctl = child.id();
    let watcher = watcher_of(lockctl);
    // The main thread only: its first `clone` from here on is the command's fork, its first
    // `clone3` the first thread it starts after it.
    let strace = hold_at(lockctl, &[("clone", 2_000_000), ("clone3", 20_000_000)]);
    let o = run(lockctl_on(&s).args(["release", "between", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let at_fork = comes_to(lockctl, &[libc::SYS_clone], Duration::from_secs(20));
    assert!(at_fork, "lockctl did not come to the command's fork");
    let stopped = stop(watcher);
    assert!(
        eventually(Duration::from_secs(20), || read_pid(&job).is_some()),
        "the command did not start"
    );
    let job_pid = read_pid(&job).unwrap();
    child.kill();
    // The job should die with lockctl; with its watcher stopped, nothing kills it.
    let died = eventually(Duration::from_secs(5), || !alive(job_pid));
    // Resumed, the watcher does what it is there for.
    kill(watcher, libc::SIGCONT);
    let died_after = died || eventually(Duration::from_secs(20), || !alive(job_pid));
    std::fs::write(&go, "").unwrap();
    if !died_after {
        kill(job_pid, libc::SIGKILL);
    }
    drop(stopped);
    drop(strace);
    assert!(
        died,
        "the job {job_pid} outlived its SIGKILLed lockctl by 5 s: its watcher was stopped before \
         the command's fork (it died once the watcher was resumed: {died_after})"
    );
}
