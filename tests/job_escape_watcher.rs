//! A job must not outlive a lockctl killed by SIGKILL while its watcher (`lockctl-guard`) is up, nor
//! run on when the watcher itself was killed:
//!
//! - a job whose watcher was killed first: lockctl used not to notice, and when lockctl then died
//!   nobody killed the job; now lockctl stops the job at its next renewal and exits 76;
//! - a member whose process name is `lockctl-guard`: the watcher used to take it for another
//!   lockctl's watcher and spare it; a name now proves nothing.
//!
//! (A member that left the job's group or session long before lockctl's death and keeps re-forking
//! faster than the watcher looks can still escape a SIGKILLed lockctl: a stated limit, see
//! docs/guarantees.md. While lockctl lives, such a member is its descendant and is stopped.)
//!
//! Each job appends a line to a file every few tens of milliseconds, and stops when a stop file
//! appears, so nothing outlives the test.

mod support;

use std::io::BufRead;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use support::watchers::watchers_of;
use support::*;

/// Hops: appends a line, then starts its next copy in the background and exits.
const HOP: &str = r#"n=$2
[ "$n" -le 0 ] && exit 0
[ -e "$1/stop" ] && exit 0
echo "$$" >> "$1/log"
sleep 0.02
sh "$1/hop.sh" "$1" $((n-1)) &
exit 0
"#;

/// Loops: appends a line every 50 ms.
const LOOP: &str = r#"i=0
while [ $i -lt 2000 ] && [ ! -e "$1/stop" ]; do echo "$$" >> "$1/log"; sleep 0.05; i=$((i+1)); done
"#;

fn scripts(dir: &Path) {
    std::fs::write(dir.join("hop.sh"), HOP).unwrap();
    std::fs::write(dir.join("loop.sh"), LOOP).unwrap();
}

/// Starts `exec NAME --ttl 2s -- sh -c SCRIPT`, waiting for the script's `ready` line.
fn start(s: &Server, name: &str, script: &str) -> std::process::Child {
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
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    child
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

fn lines(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

/// Kills lockctl by SIGKILL, waits until another client holds the lock, and says whether the job
/// still writes then; stops the job either way.
fn writes_under_the_next_holder(s: &Server, name: &str, mut child: std::process::Child) -> bool {
    // Long enough for the watcher to have looked many times since the job set itself up.
    std::thread::sleep(Duration::from_millis(1000));
    child.kill().unwrap();
    child.wait().unwrap();
    writes_once_granted(s, name)
}

/// Waits until another client holds the lock, and says whether the job still writes then; stops
/// the job either way.
fn writes_once_granted(s: &Server, name: &str) -> bool {
    assert!(
        eventually(Duration::from_secs(20), || !busy(s, name)),
        "the lease never ran out in Redis"
    );
    let before = lines(s.dir());
    std::thread::sleep(Duration::from_millis(1000));
    let after = lines(s.dir());
    std::fs::write(s.dir().join("stop"), "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    after > before
}

#[test]
fn a_job_whose_watcher_was_killed_dies_with_lockctl() {
    let s = Server::start();
    scripts(s.dir());
    let dir = s.dir().display();
    let child = start(
        &s,
        "noguard",
        &format!("sh {dir}/loop.sh {dir} & echo ready; wait"),
    );
    let watcher = watchers_of(child.id())
        .first()
        .copied()
        .expect("lockctl has a watcher");
    kill(watcher, libc::SIGKILL);
    // Without its watcher the job could outlive lockctl: lockctl notices at its next renewal,
    // stops the job and exits 76, before anyone else can be granted the lock.
    let out = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&out), 76);
    assert!(!busy(&s, "noguard"), "the lock was released");
    let before = lines(s.dir());
    std::thread::sleep(Duration::from_millis(1000));
    let after = lines(s.dir());
    std::fs::write(s.dir().join("stop"), "").unwrap();
    assert_eq!(
        before, after,
        "a job member ran on after lockctl gave the lock up"
    );
}

#[test]
fn a_member_named_like_the_watcher_dies_with_lockctl() {
    let s = Server::start();
    scripts(s.dir());
    let dir = s.dir().display();
    std::fs::copy("/bin/sh", s.dir().join("lockctl-guard")).unwrap();
    let child = start(
        &s,
        "named",
        &format!("setsid {dir}/lockctl-guard {dir}/loop.sh {dir} & echo ready; wait"),
    );
    assert!(
        !writes_under_the_next_holder(&s, "named", child),
        "a job member ran on while another client held the lock"
    );
}

/// The same check on a member the watcher does find: it passes, so the failures above are the job's.
#[test]
fn a_member_in_the_job_s_group_dies_with_lockctl() {
    let s = Server::start();
    scripts(s.dir());
    let dir = s.dir().display();
    let child = start(
        &s,
        "plain",
        &format!("sh {dir}/loop.sh {dir} & echo ready; wait"),
    );
    assert!(
        !writes_under_the_next_holder(&s, "plain", child),
        "a job member ran on while another client held the lock"
    );
}

/// A member that left the job's session (`setsid`) and whose parent exited: lockctl, the
/// subreaper, adopted it, so once lockctl is gone nothing ties it to the job but the watcher's last
/// look (no parent link, no group or session it shares with the job). The watcher must kill it from
/// that look.
#[test]
fn a_member_that_left_the_session_and_lost_its_parent_dies_with_lockctl() {
    let s = Server::start();
    scripts(s.dir());
    let dir = s.dir().display();
    let child = start(
        &s,
        "adopted",
        &format!("sh -c 'setsid sh {dir}/loop.sh {dir} & exit 0'; echo ready; wait"),
    );
    assert!(
        eventually(Duration::from_secs(10), || lines(s.dir()) > 0),
        "the member never ran"
    );
    assert!(
        !writes_under_the_next_holder(&s, "adopted", child),
        "a job member ran on while another client held the lock"
    );
}

/// The same member on a kernel that keeps no lists of children (`/proc/PID/task/TID/children`,
/// `CONFIG_PROC_CHILDREN`): the watcher's looks then walk all of `/proc`. Such a kernel is stood
/// in for by an empty directory mounted over lockctl's `/proc/PID/task`, in a mount namespace
/// of lockctl's own (`unshare -m`, root), where lockctl's threads have no lists either.
#[test]
fn without_the_kernel_s_lists_of_children_a_member_that_lost_its_parent_dies_with_lockctl() {
    let probe = std::process::Command::new("unshare")
        .args(["-m", "true"])
        .output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        eprintln!("NOT RUN HERE: no mount namespace for this process ({probe:?})");
        return;
    }
    let s = Server::start();
    scripts(s.dir());
    std::fs::create_dir(s.dir().join("fake")).unwrap();
    let script = r#"D=$1
"$LOCKCTL" exec unlisted --ttl 2s --kill-after 1s -- sh -c "sh -c 'setsid sh $D/loop.sh $D & exit 0'; echo ready; wait" &
p=$!
if mkdir "$D/fake/$p" && mount --bind "$D/fake" "/proc/$p/task"; then echo "lockctl $p"; else echo "no mount"; kill $p; fi
wait"#;
    let mut cmd = std::process::Command::new("unshare");
    for (k, v) in lockctl_on(&s).get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .args(["-m", "sh", "-c", script, "sh"])
        .arg(s.dir())
        .env("LOCKCTL", env!("CARGO_BIN_EXE_lockctl"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let (mut lockctl, mut ready) = (None, false);
    let mut line = String::new();
    while lockctl.is_none() || !ready {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 || line.trim() == "no mount" {
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "NOT RUN HERE: cannot mount over /proc/PID/task ({})",
                line.trim()
            );
            return;
        }
        ready |= line.trim() == "ready";
        if let Some(pid) = line.trim().strip_prefix("lockctl ") {
            lockctl = pid.parse::<i32>().ok();
        }
    }
    std::thread::spawn(move || {
        let mut line = String::new();
        while out.read_line(&mut line).is_ok_and(|n| n > 0) {
            line.clear();
        }
    });
    let lockctl = lockctl.unwrap();
    let listed = std::fs::read_dir(format!("/proc/{lockctl}/task/{lockctl}")).is_ok();
    assert!(
        eventually(Duration::from_secs(10), || lines(s.dir()) > 0),
        "the member never ran"
    );
    // Long enough for the watcher to have looked many times since the job set itself up.
    std::thread::sleep(Duration::from_millis(1000));
    kill(lockctl, libc::SIGKILL);
    let ran_on = writes_once_granted(&s, "unlisted");
    let _ = wait_output(child, Duration::from_secs(30));
    assert!(listed, "the mount reached outside its namespace");
    assert!(
        !ran_on,
        "a job member ran on while another client held the lock"
    );
}
