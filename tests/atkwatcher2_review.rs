//! A review of 2c266aa and f9469a6 (`src/exec/watcher.rs`, `src/exec/mod.rs`): the double fork's
//! middle process reaped with a 2 s bound (`reap_middle`), a stopped watcher resumed when lockctl
//! ends without a grant (`Drop for Starting`) or after the job (`Watcher::done`), the watcher held
//! by a pidfd (`Pinned`, with a fallback by PID checked against the command line), and a signal
//! during the watcher's readying keeping the command from starting. The attacks stop the middle
//! process on paths where lockctl ends before its bound, take pidfds away, and kill the watcher
//! while lockctl is held at points of its let-go, with its PID handed out again at once (a PID
//! namespace of the test's own, `ns_last_pid`).
//!
//! It found five defects, fixed since, whose tests stay (marked where they were ignored): a
//! stopped middle process left behind when lockctl ends before `reap_middle`'s bound (two
//! tests; the start thread is now joined when lockctl ends); the fallback without pidfds checked
//! the command line and killed in two steps (no signal goes by PID now, but to lockctl's own
//! child); `Watcher::done` did not resume a stopped watcher whose pipe was full (deadlines now
//! leave the pipe's last bytes free, two pages since the third review); a SIGTERM at the grant waited for a silent watcher's
//! 10 s word timeout (signals are now looked for every 0.1 s of that wait). One limit stays
//! ignored: a watcher frozen by a cgroup freezer (state D) is not seen as stopped. What held: a
//! watcher killed and its PID reused before its pidfd is opened, a SIGTERM while the grant waits
//! for a stopped middle process, healthy execs under `strace -f` and as a PID 1.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use support::watchers::{
    exit_within, ppid, queued, state, writer_of, Started, Stopped, StubbornJob,
};
use support::*;

/// Holds `name` for 10 minutes from another client; returns its token. The scenes may take 50
/// tries to catch a middle process, and on a loaded machine 17 tries took longer than the minute
/// this hold once had, so the lock ran out and the try that caught it was granted.
fn hold(s: &Server, name: &str) -> String {
    let held = acquire_json(&mut lockctl_on(s), name, &["--ttl", "600s"]);
    held["token"].as_str().unwrap().to_string()
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

/// Starts `exec NAME FLAGS -- PROGRAM` (its stderr to `err`) on a held lock and stops the double
/// fork's middle process of its watcher's start with SIGSTOP as soon as it shows (lockctl's only
/// child before the command), as `pkill -STOP` in that moment would. Up to 50 lockctls.
fn catch_the_middle(
    s: &Server,
    name: &str,
    flags: &[&str],
    program: &[String],
    err: &Path,
) -> Option<(Started, Stopped)> {
    support::watchers::catch_the_middle(|_| {
        let mut cmd = lockctl_on(s);
        cmd.args(["exec", name])
            .args(flags)
            .arg("--")
            .args(program)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(err).unwrap());
        Started(Some(cmd.spawn().unwrap()))
    })
}

/// The middle process of the watcher's start stopped while lockctl waits for a held lock, and
/// lockctl ends before `reap_middle`'s 2 s bound: `ending` is `-w 1s` running out (exit 75) or a
/// SIGTERM (143). The start thread's bounded wait dies with lockctl, and nothing kills the
/// stopped middle process: checked 5 s after lockctl's exit (past the bound, and past any
/// kernel's resume of an orphaned group: lockctl shares the test's group, as in a script).
fn middle_stopped_then_lockctl_ends(name: &str, flags: &[&str], sigterm: bool, want: i32) {
    let s = Server::start();
    let token = hold(&s, name);
    let ran = s.dir().join("ran");
    let err = s.dir().join("lockctl.err");
    let Some((mut child, middle)) = catch_the_middle(&s, name, flags, &touch(&ran), &err) else {
        panic!("the middle process was never caught (50 tries)");
    };
    let lockctl = child.id();
    if sigterm {
        kill(lockctl as i32, libc::SIGTERM);
    }
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(30));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(want),
        "lockctl {lockctl}: {errs}"
    );
    child.0.take();
    assert!(!ran.exists(), "the command ran: {errs}");
    // Past the 2 s bound lockctl promises for the middle process.
    std::thread::sleep(Duration::from_secs(5));
    let left = middle.still_there();
    let how = state(middle.0);
    let parent = ppid(middle.0);
    drop(middle);
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        !left,
        "the middle process of lockctl {lockctl}'s watcher start is left behind 5 s after \
         lockctl exited {want} (state {how:?}, parent {parent:?}); it holds copies of lockctl's \
         descriptors (stdout, stderr, Redis sockets): {errs}"
    );
}

/// `-w 1s` on a held lock, the watcher's middle process stopped: lockctl exits 75 after 1 s, while
/// its start thread still waits (2 s) for the middle process. The stopped middle stays.
#[test]
// Fixed: was a defect: a middle process stopped while lockctl waits is left behind, stopped, when -w runs out before reap_middle's 2 s bound (the start thread dies with lockctl)
fn a_stopped_middle_process_is_not_left_behind_when_a_short_wait_runs_out() {
    middle_stopped_then_lockctl_ends("short", &["-w", "1s"], false, 75);
}

/// The same ended by a SIGTERM during the wait (exit 143).
#[test]
// Fixed: was a defect: a middle process stopped while lockctl waits is left behind, stopped, when a signal ends the wait before reap_middle's 2 s bound
fn a_stopped_middle_process_is_not_left_behind_after_a_signal() {
    middle_stopped_then_lockctl_ends("sigmid", &[], true, 143);
}

/// Run by [`pid_reuse_at`] as the first process of a PID namespace of its own (so that it picks
/// the next PID, `ns_last_pid`, and reaps the orphaned watcher): `$1` lockctl, `$2` the lock's
/// name, `$3` a directory with the holder's `token`, `$4` the mode. lockctl waits, its watcher
/// is stopped, strace holds lockctl's main thread 5 s at the entry of a chosen system call on the
/// watcher's PID, the lock is released; while lockctl is held there, the watcher is SIGKILLed,
/// reaped by this PID 1, and its PID handed to another process, stopped. Modes:
/// - `fallback`: `pidfd_open` fails (ENOSYS, as under a seccomp profile that denies it or a kernel
///   before 5.3), and the hold is at the let-go's `kill(W, SIGCONT)`, after its command-line check;
/// - `open`: the hold is at `Pinned::new`'s `pidfd_open(W)`, before the pidfd is taken.
///
/// Every wait is bounded.
const REUSE_SCRIPT: &str = r#"
set -u
L=$1; NAME=$2; DIR=$3; MODE=$4
"$L" exec "$NAME" -- touch "$DIR/ran" 2>"$DIR/lockctl.err" &
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
hexw=$(printf '0x%x' $W)
case $MODE in
  fallback)
    strace -p $LP -o "$DIR/strace.log" -e trace=kill,pidfd_open,pidfd_send_signal \
      -e inject=pidfd_open:error=ENOSYS \
      -e inject=kill:delay_enter=5000000:when=1 2>"$DIR/strace.err" &
    AT="62 $hexw ";;
  open)
    strace -p $LP -o "$DIR/strace.log" -e trace=pidfd_open,kill,pidfd_send_signal \
      -e inject=pidfd_open:delay_enter=5000000:when=1 2>"$DIR/strace.err" &
    AT="434 $hexw ";;
esac
for i in $(seq 1 200); do grep -q attached "$DIR/strace.err" 2>/dev/null && break; sleep 0.05; done
grep -q attached "$DIR/strace.err" || exit 4
kill -STOP $W
"$L" release "$NAME" --token "$(cat $DIR/token)" >/dev/null 2>&1 || exit 5
at=
for i in $(seq 1 2000); do
  case "$(cat /proc/$LP/syscall 2>/dev/null)" in "$AT"*) at=yes; break;; esac
  sleep 0.01
done
echo "lockctl held at '$AT': ${at:-no}"
[ -n "$at" ] || exit 6
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
echo "other alive: $([ -e /proc/$I ] && echo yes || echo no)"
echo "ran: $([ -e "$DIR/ran" ] && echo yes || echo no)"
kill -KILL $I
"#;

/// Runs [`REUSE_SCRIPT`] in `mode` in a PID namespace of its own; returns what it said.
fn pid_reuse_at(mode: &str) -> String {
    // SAFETY: getuid has no preconditions.
    let root = unsafe { libc::getuid() } == 0;
    need_tool("strace", "-V");
    need_tool("unshare", "--version");
    assert!(root, "this case needs root (a PID namespace, ns_last_pid)");
    let s = Server::start();
    let name = format!("reuse{mode}");
    let token = hold(&s, &name);
    std::fs::write(s.dir().join("token"), &token).unwrap();
    let child = std::process::Command::new("unshare")
        .args([
            "-pf",
            "--kill-child",
            "--mount-proc",
            "bash",
            "-c",
            REUSE_SCRIPT,
            "reuse",
        ])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .arg(&name)
        .arg(s.dir())
        .arg(mode)
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
        "{}{}\nlockctl: {}\nstrace: {}",
        stdout(&out),
        stderr(&out),
        std::fs::read_to_string(s.dir().join("lockctl.err")).unwrap_or_default(),
        std::fs::read_to_string(s.dir().join("strace.log")).unwrap_or_default()
    );
    // Without pidfds lockctl sends its watcher no signal by PID at all (but as a PID 1, to its
    // own child): it never comes to the kill the scene waits for.
    let no_kill = mode == "fallback" && said.contains("': no");
    if !said.contains("continued:") && !no_kill {
        panic!("the scene was not set up: {said}");
    }
    assert_eq!(s.get(&format!("lockctl:{name}")), None, "{said}");
    said
}

/// Without pidfds (`pidfd_open` fails: ENOSYS injected by strace, as a seccomp profile that
/// denies it, such as older container runtimes' defaults, or a kernel before 5.3 would), `Pinned`
/// signals by PID, "only to a process whose command line is this lockctl's watcher's". The check
/// reads `/proc/W/cmdline`, then calls `kill(W, SIGCONT)`: lockctl held between the two (at the
/// kill's entry, as a SIGSTOP there would), the stopped watcher is killed and reaped by init,
/// and its PID handed to another stopped process, which lockctl then continues. The same attack
/// as the review of 2052df6's, with the check made before the window instead of closing it.
#[test]
// Fixed: was a defect: without pidfds, Pinned's command-line check and its kill(2) were two
// steps; now no signal goes by PID but to lockctl's own child.
fn without_pidfds_a_watcher_killed_while_lockctl_lets_it_go_does_not_lend_its_pid() {
    let said = pid_reuse_at("fallback");
    assert!(
        said.contains("continued: no") || said.contains("': no"),
        "lockctl's SIGCONT for its stopped watcher (by PID, pidfds missing) reached another \
         process that took its PID after the command-line check: {said}"
    );
}

/// The watcher's PID learnt at the grant (the middle process's word), lockctl held at
/// `Pinned::new`'s `pidfd_open` of it; the stopped watcher is killed and reaped meanwhile, and
/// its PID goes to another stopped process, so the pidfd names that one. The pipe back has hung
/// up by the time `Pinned::new` looks: nothing may be signalled through that pidfd, the watcher
/// counts as gone and is replaced, the command runs, the other process stays stopped and alive.
#[test]
fn a_watcher_killed_before_its_pidfd_is_opened_does_not_lend_its_pid() {
    let said = pid_reuse_at("open");
    assert!(
        said.contains("continued: no") && said.contains("other alive: yes"),
        "a signal of lockctl's reached the process that took its watcher's PID before the \
         pidfd was opened: {said}"
    );
    assert!(
        said.contains("lockctl exit 0") && said.contains("ran: yes"),
        "lockctl did not run its command under a new watcher: {said}"
    );
}

/// The middle process stopped while lockctl waits; the holder releases and lockctl, at the grant,
/// joins its start thread (still in `reap_middle`'s 2 s wait); a SIGTERM comes then. lockctl must
/// not run the command (143, "interrupted"), release the lock, and leave no watcher and no middle
/// process (it kills the stopped one at the bound).
#[test]
fn a_signal_while_the_grant_waits_for_a_stopped_middle_process_keeps_the_command_from_starting() {
    let s = Server::start();
    // The grant must come within the 2 s the middle process is waited for (from lockctl's start):
    // a try where it came later (a loaded machine) is let run and made again.
    for attempt in 1..=5 {
        let name = format!("midsig{attempt}");
        let token = hold(&s, &name);
        let ran = s.dir().join(format!("ran{attempt}"));
        let err = s.dir().join(format!("lockctl{attempt}.err"));
        let Some((mut child, middle)) = catch_the_middle(&s, &name, &[], &touch(&ran), &err) else {
            panic!("the middle process was never caught (50 tries)");
        };
        let lockctl = child.id();
        let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        // Granted, and the main thread joins the start thread (a futex wait) while the middle
        // process is still stopped.
        let futex = format!("{} ", libc::SYS_futex);
        let key = format!("lockctl:{name}");
        let joined = eventually(Duration::from_secs(3), || {
            s.get(&key).is_some()
                && std::fs::read_to_string(format!("/proc/{lockctl}/syscall"))
                    .is_ok_and(|s| s.starts_with(&futex))
                && middle.still_there()
        });
        if !joined {
            eprintln!("try {attempt}: the grant came after the middle process's bound");
            let _ = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(30));
            child.0.take();
            continue;
        }
        kill(lockctl as i32, libc::SIGTERM);
        let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(30));
        child.0.take();
        let errs = std::fs::read_to_string(&err).unwrap_or_default();
        let left = eventually(Duration::from_secs(10), || !middle.still_there());
        drop(middle);
        assert!(!ran.exists(), "the command ran after the SIGTERM: {errs}");
        assert_eq!(status.and_then(|s| s.code()), Some(143), "{errs}");
        assert!(errs.contains("interrupted by signal 15"), "{errs}");
        assert!(left, "the stopped middle process outlived lockctl: {errs}");
        assert!(
            eventually(Duration::from_secs(10), || support::watchers::watchers_of(
                lockctl
            )
            .is_empty()),
            "a watcher outlived lockctl"
        );
        assert_eq!(s.get(&key), None, "the lock was not released");
        return;
    }
    panic!("no grant came while the middle process was waited for (5 tries)");
}

/// A watcher stopped while the job runs: lockctl stops the job (SIGTERM; the job ignores it, and
/// `--kill-after` is long) and keeps renewing the lease, writing each deadline (9 bytes) to the
/// stopped watcher's pipe, which fills after about 7300 renewals (seen in a run with a 30 ms
/// lease: 65521 bytes within 240 s; a run on a loaded machine lost its lease first and stopped
/// writing, so here the test writes the same harmless words, `t` and a deadline of 0, into the
/// pipe through lockctl's descriptor until it is full). The job then ends by itself: lockctl
/// reaps its first process (FORGET, 1 byte, takes the last free byte) and calls
/// `Watcher::done`, which resumes the stopped watcher only if its DONE byte was written; the pipe
/// is full, so it is not, and the watcher stays stopped for good.
#[test]
// Fixed: was a defect: Watcher::done resumes a stopped watcher only if its DONE byte fits; a pipe full of renewals' deadlines (a job run on through --kill-after) leaves the watcher stopped for good
fn a_watcher_stopped_while_the_job_runs_is_not_left_behind_when_its_pipe_is_full() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "full", "5s");
    // The renewals' deadline words, as far as lockctl writes them: it leaves the pipe's last
    // 8192 bytes free (`deadline_fits`: two pages of a pipe of sixteen). Written through lockctl's own descriptor, so that the test
    // need not wait for thousands of renewals.
    let mut pipe = writer_of(lockctl, watcher, 3).expect("lockctl's end of the watcher's pipe");
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    let mut words = 0;
    // SAFETY: F_GETPIPE_SZ on a descriptor the test owns.
    let size = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&pipe), libc::F_GETPIPE_SZ) };
    while queued(watcher, 3).is_some_and(|q| q + 9 <= size - 8192)
        && std::io::Write::write(&mut pipe, &word).is_ok_and(|n| n == word.len())
    {
        words += 1;
    }
    drop(pipe);
    let bytes = queued(watcher, 3);
    eprintln!("{words} words written; {bytes:?} bytes in the stopped watcher's pipe");
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let bytes = queued(watcher, 3);
    drop(stopped);
    assert_eq!(s.get("lockctl:full"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} (state {how:?}, {bytes:?} bytes in its pipe) outlived its lockctl \
         {lockctl}, which exited 76 for it: {errs}"
    );
}

/// A freezer cgroup (v1) of the test's own, holding one process; thawed and removed when dropped.
struct Frozen(std::path::PathBuf);

impl Frozen {
    /// None where the v1 freezer is not mounted or writable.
    fn freeze(pid: i32) -> Option<Frozen> {
        let dir = Path::new("/sys/fs/cgroup/freezer").join(format!("atkwatcher2-{pid}"));
        std::fs::create_dir(&dir).ok()?;
        let frozen = Frozen(dir);
        std::fs::write(frozen.0.join("cgroup.procs"), pid.to_string()).ok()?;
        std::fs::write(frozen.0.join("freezer.state"), "FROZEN").ok()?;
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(frozen.0.join("freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
        })
        .then_some(frozen)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        // A task still in it (the watcher, if it outlived the test) goes back to the root.
        if let Ok(tasks) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for t in tasks.split_whitespace() {
                let _ = std::fs::write("/sys/fs/cgroup/freezer/cgroup.procs", t);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The watcher frozen by a cgroup freezer while the job runs (as `pkill -STOP lockctl-guard`
/// stops it, but the freezer shows it in state D, not T or t): lockctl's check every tenth of a
/// second looks only for T and a lasting t, so it runs the job on with a watcher that guards
/// nothing; lockctl SIGKILLed then, the job outlives it for as long as the watcher stays frozen.
#[test]
#[ignore = "known limit (docs/guarantees.md): a watcher frozen by a cgroup freezer (state D) is not seen as stopped; lockctl SIGKILLed then leaves the job running while it stays frozen"]
fn a_frozen_watcher_is_seen_as_stopped() {
    let s = Server::start();
    let job = s.dir().join("job");
    let err = s.dir().join("lockctl.err");
    let script = format!("echo $$ > {}; exec sleep 60", job.display());
    let child = lockctl_on(&s)
        .args(["exec", "frozen", "--ttl", "30s", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let child = Started(Some(child));
    assert!(
        eventually(Duration::from_secs(30), || std::fs::read_to_string(&job)
            .is_ok_and(|j| j.ends_with('\n'))),
        "the command did not start"
    );
    let job_pid: i32 = std::fs::read_to_string(&job)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let lockctl = child.id();
    let watcher = support::watchers::watcher_of(lockctl);
    let frozen = Frozen::freeze(watcher).expect("this case needs the v1 cgroup freezer");
    let how = state(watcher);
    // Ten of lockctl's checks, and a debugger's second.
    std::thread::sleep(Duration::from_secs(2));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let noticed = errs.contains("watcher");
    child.kill();
    let died = eventually(Duration::from_secs(5), || !alive(job_pid));
    drop(frozen);
    let died_after = died || eventually(Duration::from_secs(20), || !alive(job_pid));
    if !died_after {
        kill(job_pid, libc::SIGKILL);
    }
    assert!(
        noticed || died,
        "the job {job_pid} outlived its SIGKILLed lockctl by 5 s: its watcher {watcher} was \
         frozen (state {how:?}) and lockctl did not notice in 2 s (it died once the watcher was \
         thawed: {died_after}): {errs}"
    );
}

/// No false failure: healthy execs under `strace -f` (every process of lockctl, its middle
/// process and its watcher stopped for a moment at each system call), and as a PID namespace's
/// first process, with `-n`, a wait, `--limit 2` and three Redlock nodes: each runs its command
/// and exits 0, with no watcher left and the lock released.
#[test]
fn healthy_execs_do_not_fail_under_strace_or_as_pid_1() {
    need_tool("strace", "-V");
    need_tool("unshare", "--version");
    let nodes = Servers::start(3);
    let one = Server::start();
    let mut failed = Vec::new();
    let mut runs = 0;
    for wrap in ["strace", "pid1"] {
        for (i, flags) in [
            &["-n"][..],
            &["-w", "30s"][..],
            &["--limit", "2", "-w", "30s"][..],
            &["--limit", "2", "-n"][..],
        ]
        .iter()
        .enumerate()
        {
            for redlock in [false, true] {
                let name = format!("healthy{wrap}{i}{redlock}");
                let ran = one.dir().join(&name);
                let mut cmd = match wrap {
                    "strace" => {
                        let mut c = std::process::Command::new("strace");
                        c.args(["-f", "-o", "/dev/null"]);
                        c
                    }
                    _ => {
                        let mut c = std::process::Command::new("unshare");
                        c.args(["-pf", "--kill-child", "--mount-proc"]);
                        c
                    }
                };
                cmd.arg(env!("CARGO_BIN_EXE_lockctl"))
                    .args(["exec", &name, "--ttl", "10s"])
                    .args(*flags)
                    .args(["--", "touch"])
                    .arg(&ran)
                    .env(
                        "LOCKCTL_REDIS",
                        if redlock { nodes.urls() } else { one.url() },
                    )
                    .env("LOCKCTL_QUARANTINE", "0")
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                let out = wait_output(cmd.spawn().unwrap(), Duration::from_secs(60));
                runs += 1;
                if out.status.code() != Some(0) || !ran.exists() {
                    failed.push(format!(
                        "{wrap} {flags:?} redlock {redlock}: {:?} {}",
                        out.status,
                        stderr(&out)
                    ));
                }
            }
        }
    }
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| c.starts_with(b"lockctl-guard\0--lockctl-guard\0"))
                && std::fs::read_to_string(e.path().join("environ")).is_ok()
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    eprintln!("{runs} runs; watchers alive afterwards (any lockctl's): {left:?}");
    assert!(failed.is_empty(), "healthy execs failed: {failed:#?}");
    for key in one.keys() {
        assert!(!key.starts_with("lockctl:healthy"), "{key} left");
    }
}

/// A watcher frozen (cgroup freezer, state D) before its first word while lockctl waits; the
/// holder releases, and at the grant lockctl waits for the watcher's word (up to 10 s after its
/// start): the watcher is neither stopped (T) nor traced (t), so it is not let go at once. A
/// SIGTERM comes right after the grant; lockctl answers it only when that wait is over.
#[test]
// Fixed: was a defect: a SIGTERM while the grant waits for a frozen (D) silent watcher is answered only after the 10 s wait for its first word
fn a_signal_at_the_grant_is_answered_promptly_with_a_frozen_silent_watcher() {
    let s = Server::start();
    let mut caught = None;
    for attempt in 1..=50 {
        let name = format!("frozenword{attempt}");
        let token = hold(&s, &name);
        let ran = s.dir().join(format!("ran{attempt}"));
        let err = s.dir().join(format!("lockctl{attempt}.err"));
        let child = lockctl_on(&s)
            .args(["exec", &name, "--ttl", "30s", "--"])
            .args(touch(&ran))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).unwrap())
            .spawn()
            .unwrap();
        let child = Started(Some(child));
        let lockctl = child.id() as i32;
        let prefix = format!("lockctl-guard\0--lockctl-guard\0{lockctl}:");
        let silent = |p: i32| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.starts_with(prefix.as_bytes()))
                && std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() != "lockctl-guard")
        };
        let found = (0..20_000).find_map(|_| (lockctl + 1..lockctl + 64).find(|&p| silent(p)));
        if let Some(w) = found {
            let frozen = Frozen::freeze(w).expect("this case needs the v1 cgroup freezer");
            if silent(w) {
                eprintln!(
                    "froze watcher {w} of lockctl {lockctl} before its word at try {attempt}"
                );
                caught = Some((child, frozen, name, token, ran, err));
                break;
            }
        }
        child.kill();
        let _ = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
    }
    let Some((mut child, frozen, name, token, ran, err)) = caught else {
        panic!("no watcher was frozen before its first word (50 tries)");
    };
    let lockctl = child.id();
    let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let key = format!("lockctl:{name}");
    assert!(
        eventually(Duration::from_secs(10), || s.get(&key).is_some()),
        "lockctl was not granted the lock"
    );
    let sent = std::time::Instant::now();
    kill(lockctl as i32, libc::SIGTERM);
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(30));
    let took = sent.elapsed();
    child.0.take();
    drop(frozen);
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert!(!ran.exists(), "the command ran after the SIGTERM: {errs}");
    assert_eq!(status.and_then(|s| s.code()), Some(143), "{errs}");
    assert_eq!(s.get(&key), None, "the lock was not released");
    assert!(
        took < Duration::from_secs(3),
        "lockctl {lockctl} took {took:?} to answer a SIGTERM after its grant, waiting for its \
         frozen watcher's first word: {errs}"
    );
}
