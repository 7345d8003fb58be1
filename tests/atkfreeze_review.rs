//! An adversarial review of bf34d0c ("watcher: the job is frozen before it is killed"):
//! `Walker::signal`, for SIGKILL, now first stops (SIGSTOP, by PID) every process it finds as the
//! job's, waits until they hold still, walks again until nothing new turns up, remembers them, and
//! only then runs its kill rounds; `signal_all` sends a SIGKILL by PID to each member of a group as
//! well as `killpg`. Attacked on real processes and `redis-server`s, against both promises: nothing
//! of the job is left (running *or stopped*) after lockctl's death or the deadline kill, and nothing
//! that is not the job's is stopped or killed.
//!
//! Scenes:
//!
//! - `a_double_forking_member_leaves_nothing_stopped`: a member in a session of its own keeps
//!   starting `(setsid sleep &)` (a middle process that exits at once) every 3 ms while lockctl is
//!   SIGKILLed. Asserted: nothing of the job is left *stopped* (held: 0 of 18 rounds), the watcher
//!   exits. Children that ran on are counted and printed with their start relative to the kill:
//!   every round leaves some (12 of 12, 2 to 18 each), most started less than 100 ms before the
//!   kill (the stated limit), but 18 of them 10 to 20 ms *after* it: their middle process forked
//!   after lockctl's death and exited before the freeze's first walk; the stated limit speaks only
//!   of "before lockctl's death". Not caused by bf34d0c.
//! - `a_traced_job_dies_with_lockctl`: the job runs under `strace -f` and keeps forking `setsid
//!   sleep` children: nothing of it is left running or stopped after lockctl's SIGKILL (held).
//! - `the_deadline_kill_leaves_nothing_running_or_stopped`: lockctl SIGSTOPped past its short TTL
//!   while its job keeps starting `setsid sleep` children; the watcher kills the job (SIGTERM, then
//!   SIGKILL with the freeze); checked while lockctl is still stopped, and again after it is
//!   resumed (exit 76, nothing left). Held.
//! - `a_member_moving_into_a_bystander_s_group_is_left_frozen` (**found here**, fixed since): a
//!   job's process (python) that keeps moving between a group of its own and a bystander's group of
//!   lockctl's session; lockctl SIGKILLed. 15 of 32 rounds (1 of 8 in another run) left it
//!   *stopped* (state T, parent init, in the bystander's group) for good. The freeze's walk saw it
//!   leading its own group; it moved before its SIGSTOP took; the freeze stores the walk's `Proc`
//!   in `seen` (procs.rs:496, new in bf34d0c), and `Walker::members` builds its map from the fresh
//!   snapshot *then* `seen`'s copies (procs.rs:432), so the stale copy wins and the kill round sees
//!   the old group: `killpg` of a group the process has left, and no kill by PID because
//!   `p.pid == p.pgid` in the stale copy (procs.rs:279). Before bf34d0c the same stale group left it
//!   running (looks' copies were stale too); now it is frozen and never killed nor continued.
//! - `a_member_that_joins_the_first_group_after_the_deadline_killpg` (found here, fixed since): the deadline
//!   path (lockctl stopped) with the same process moving between its own group and the job's first
//!   group `P`. 12 of 16, 5 of 8, 3 of 8 rounds: left stopped while lockctl stays stopped (killed
//!   once lockctl is resumed). The watcher's `killpg(P, SIGKILL)` comes before `Walker::signal`,
//!   whose kill rounds skip members whose group is `P` (procs.rs:267, `done`); the member is frozen
//!   by PID (procs.rs:480) and, seen in `P` (now or, stale, by the freeze's walk), never killed.
//!   The skip is older than bf34d0c (then it ran on); the stale copy makes it reach also a member
//!   that is no longer in `P`.
//! - `bystanders_and_another_job_are_neither_stopped_nor_killed`: a bystander of the test's session
//!   (its own group, started after lockctl) and another lockctl's job run while a forking job's
//!   lockctl is SIGKILLed, round after round: none of them is ever seen stopped or dead. Then the
//!   other lockctl is SIGKILLed: its job dies, the bystander runs on. Held.
//! - `the_normal_end_is_unchanged`: a job that starts `setsid` children, which it waits for, and
//!   exits 3: lockctl exits 3, nothing is left, the bystander runs on and was never stopped. Held.
//!
//! The fix of both scenes (the commit after bf34d0c): `Walker::members` takes each remembered
//! process's current `Proc` from the snapshot (not the stored copy), and the SIGKILL that follows a
//! freeze goes to every frozen process by its PID, group leaders and members of `done` included.
//!
//! `ATKFREEZE_ROUNDS` multiplies every scene's rounds. `ATKFREEZE_STRACE=DIR` (the deadline
//! joiner scene) straces the watcher's `kill`s into DIR and samples the joiner's state.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::watchers::{exec_script, watchers_of};
use support::*;

fn rounds(default: usize) -> usize {
    support::watchers::rounds_times("ATKFREEZE_ROUNDS", default)
}

/// A tag unique to this test process and `n`: it names the processes a scene started, and only
/// those (it appears in their command lines).
fn tag(n: usize) -> String {
    support::watchers::process_tag(n, 9)
}

/// Processes with their state letters.
type Seen = Vec<(i32, char)>;

/// The state letter of `pid` (`None` once it is gone).
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].trim_start().chars().next()
}

/// The live processes (zombies excluded) whose command line holds `tag`, with their state.
fn tagged(tag: &str) -> Vec<(i32, char)> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me)
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .is_ok_and(|c| c.windows(tag.len()).any(|w| w == tag.as_bytes()))
        })
        .filter_map(|p| state(p).filter(|&s| s != 'Z' && s != 'X').map(|s| (p, s)))
        .collect()
}

/// Kills what is left of the test's own tagged processes (stopped ones included).
fn sweep(tag: &str) {
    for _ in 0..5 {
        let left = tagged(tag);
        if left.is_empty() {
            return;
        }
        for (p, _) in left {
            kill(p, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `lockctl exec NAME --ttl TTL --kill-after KA -- sh SCRIPT` and waits for `ready`.
fn start(s: &Server, name: &str, script: &Path, ttl: &str, ka: &str) -> Child {
    exec_script(s, name, script, ttl, ka)
}

/// SIGKILLs lockctl and waits (5 s at most) until it and its watchers are gone; true if they are.
fn kill_lockctl(lockctl: i32) -> bool {
    let watchers = watchers_of(lockctl as u32);
    kill(lockctl, libc::SIGKILL);
    eventually(Duration::from_secs(5), || {
        watchers.iter().all(|&w| !alive(w)) && !alive(lockctl)
    })
}

fn script(dir: &Path, tag: &str, body: &str) -> PathBuf {
    let path = dir.join(format!("freeze-{tag}.sh"));
    std::fs::write(&path, body).unwrap();
    path
}

/// A member in a session of its own that starts `CHILD` every 3 ms (400 at most).
fn forking_body(tag: &str, child: &str) -> String {
    format!(
        "setsid sh -c 'i=0; while [ $i -lt 400 ]; do {child} & i=$((i+1)); sleep 0.003; done; wait' {tag} &\necho ready\nwait\n"
    )
}

/// What is left of the job `tag` 3 s after lockctl's death: (running, stopped).
fn leftovers(tag: &str) -> (Seen, Seen) {
    leftovers_but(tag, 0)
}

/// [`leftovers`], but for `spare` (a stopped lockctl, whose command line holds the tag).
fn leftovers_but(tag: &str, spare: i32) -> (Seen, Seen) {
    let left = || -> Vec<(i32, char)> {
        tagged(tag)
            .into_iter()
            .filter(|&(p, _)| p != spare)
            .collect()
    };
    eventually(Duration::from_secs(3), || left().is_empty());
    left().into_iter().partition(|&(_, s)| s != 'T' && s != 't')
}

#[test]
fn a_double_forking_member_leaves_nothing_stopped() {
    let s = Server::start();
    let n = rounds(6);
    let (mut ran, mut stopped_rounds, mut after_kill) = (0, Vec::new(), 0);
    for round in 0..n {
        let t = tag(100 + round);
        let body = forking_body(&t, &format!("(setsid sleep 300.{t} &)"));
        let path = script(s.dir(), &t, &body);
        let mut child = start(&s, &format!("freeze-dbl-{round}"), &path, "2s", "1s");
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 53) % 300));
        let at = support::watchers::ticks_now();
        let quiet = kill_lockctl(child.id() as i32);
        let (running, stopped) = leftovers(&t);
        let ages: Vec<i64> = running
            .iter()
            .filter_map(|&(p, _)| Some(support::watchers::started_at(p)? as i64 - at as i64))
            .collect();
        after_kill += ages.iter().filter(|&&a| a > 0).count();
        if !ages.is_empty() {
            eprintln!("round {round}: started (ticks after the kill): {ages:?}");
        }
        if !running.is_empty() || !stopped.is_empty() {
            eprintln!(
                "round {round}: {} running, {} stopped: {:?}",
                running.len(),
                stopped.len(),
                running.iter().chain(&stopped).take(4).collect::<Vec<_>>()
            );
        }
        ran += usize::from(!running.is_empty());
        if !stopped.is_empty() {
            stopped_rounds.push((round, stopped.len()));
        }
        sweep(&t);
        let _ = child.wait();
        assert!(quiet, "round {round}: the watcher never exited");
    }
    eprintln!(
        "{ran} of {n} rounds left children running, {after_kill} of them started after the kill"
    );
    assert!(
        stopped_rounds.is_empty(),
        "frozen processes left behind: {stopped_rounds:?}"
    );
}

#[test]
fn a_traced_job_dies_with_lockctl() {
    need_tool("strace", "-V");
    let s = Server::start();
    let n = rounds(4);
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(200 + round);
        let inner = forking_body(&t, &format!("setsid sleep 300.{t}"));
        let inner_path = s.dir().join(format!("inner-{t}.sh"));
        std::fs::write(&inner_path, inner).unwrap();
        let body = format!(
            "exec strace -f -qq -o /dev/null sh {} {t}\n",
            inner_path.display()
        );
        let path = script(s.dir(), &t, &body);
        let mut child = start(&s, &format!("freeze-strace-{round}"), &path, "2s", "1s");
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 71) % 300));
        let quiet = kill_lockctl(child.id() as i32);
        let (running, stopped) = leftovers(&t);
        if !running.is_empty() || !stopped.is_empty() {
            eprintln!("round {round}: running {running:?} stopped {stopped:?}");
            broken.push((round, running.len(), stopped.len()));
        }
        sweep(&t);
        let _ = child.wait();
        assert!(quiet, "round {round}: the watcher never exited");
    }
    eprintln!("{} of {n} rounds broken", broken.len());
    assert!(broken.is_empty(), "traced job outlived lockctl: {broken:?}");
}

#[test]
fn the_deadline_kill_leaves_nothing_running_or_stopped() {
    let s = Server::start();
    let n = rounds(3);
    for round in 0..n {
        let t = tag(300 + round);
        let body = forking_body(&t, &format!("setsid sleep 300.{t}"));
        let path = script(s.dir(), &t, &body);
        let child = start(&s, &format!("freeze-dl-{round}"), &path, "1s", "300ms");
        let lockctl = child.id() as i32;
        std::thread::sleep(Duration::from_millis(100 + (round as u64 * 61) % 200));
        kill(lockctl, libc::SIGSTOP);
        // The deadline (1 s at most away) and the kill-after pass while lockctl is stopped.
        std::thread::sleep(Duration::from_millis(2500));
        let (running, stopped) = leftovers_but(&t, lockctl);
        for &(p, _) in running.iter().chain(&stopped) {
            eprintln!(
                "round {round}: lockctl {lockctl}: left {p}: {:?} {:?}",
                std::fs::read_to_string(format!("/proc/{p}/stat")),
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            );
        }
        kill(lockctl, libc::SIGCONT);
        let out = wait_output(child, Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(300));
        let after = tagged(&t);
        sweep(&t);
        assert!(
            running.is_empty() && stopped.is_empty(),
            "round {round}: while lockctl was stopped, running {running:?} stopped {stopped:?}"
        );
        assert_eq!(code(&out), 76, "round {round}: {}", stderr(&out));
        assert!(
            after.is_empty(),
            "round {round}: left after the end: {after:?}"
        );
    }
}

const JOINER: &str = r#"import os, signal, sys, time
signal.signal(signal.SIGHUP, signal.SIG_IGN)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
g = int(sys.argv[1])
end = time.time() + 60
while time.time() < end:
    try:
        os.setpgid(0, g)
    except OSError:
        pass
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
"#;

/// Rounds of the joiner scene; returns (round, left while lockctl was stopped, left at the end).
fn joiner_rounds(n: usize) -> Vec<(usize, Seen, Seen)> {
    need_tool("python3", "-V");
    let s = Server::start();
    let py = s.dir().join("joiner.py");
    std::fs::write(&py, JOINER).unwrap();
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(400 + round);
        let body = format!(
            "set -m\npython3 {} $$ {t} &\necho ready\nwait\n",
            py.display()
        );
        let path = script(s.dir(), &t, &body);
        let child = start(&s, &format!("freeze-join-{round}"), &path, "1s", "300ms");
        let lockctl = child.id() as i32;
        let tracer = std::env::var("ATKFREEZE_STRACE").ok().map(|d| {
            let w = support::watchers::watcher_of(lockctl as u32);
            let t = std::process::Command::new("strace")
                .args([
                    "-tt",
                    "-e",
                    "trace=kill,tgkill,openat",
                    "-e",
                    "signal=none",
                    "-o",
                ])
                .arg(format!("{d}/w-{round}.txt"))
                .arg("-p")
                .arg(w.to_string())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(300));
            t
        });
        std::thread::sleep(Duration::from_millis(100 + (round as u64 * 37) % 200));
        kill(lockctl, libc::SIGSTOP);
        let mut trail: Vec<String> = Vec::new();
        let until = Instant::now() + Duration::from_millis(2500);
        while Instant::now() < until {
            if std::env::var("ATKFREEZE_STRACE").is_ok() {
                for (p, _) in tagged(&t) {
                    if p == lockctl
                        || !std::fs::read(format!("/proc/{p}/comm"))
                            .is_ok_and(|c| c.starts_with(b"python"))
                    {
                        continue;
                    }
                    let st = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                    let f: Vec<String> = st
                        .rsplit(')')
                        .next()
                        .unwrap_or("")
                        .split_whitespace()
                        .take(4)
                        .map(String::from)
                        .collect();
                    let now = format!(
                        "{} {}",
                        f.first().cloned().unwrap_or_default(),
                        f.get(2).cloned().unwrap_or_default()
                    );
                    if trail.last().is_none_or(|l| !l.ends_with(&now)) {
                        trail.push(format!("{:?} {now}", until.elapsed()));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        if trail.len() > 1 {
            eprintln!(
                "round {round}: trail {:?}",
                &trail[trail.len().saturating_sub(12)..]
            );
        }
        let during: Vec<_> = tagged(&t)
            .into_iter()
            .filter(|&(p, _)| p != lockctl)
            .collect();
        for &(p, _) in &during {
            eprintln!(
                "round {round}: lockctl {lockctl} stopped: left {p}: {:?}",
                std::fs::read_to_string(format!("/proc/{p}/stat")).map(|s| s
                    .split(' ')
                    .take(8)
                    .collect::<Vec<_>>()
                    .join(" "))
            );
        }
        kill(lockctl, libc::SIGCONT);
        let _ = wait_output(child, Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(500));
        let after = tagged(&t);
        sweep(&t);
        if let Some(mut tr) = tracer {
            let _ = tr.kill();
            let _ = tr.wait();
        }
        if !during.is_empty() || !after.is_empty() {
            eprintln!("round {round}: during {during:?} after {after:?}");
            broken.push((round, during, after));
        }
    }
    eprintln!("{} of {n} rounds broken", broken.len());
    broken
}

/// Found here (see the module docs): the skip of `done` is older than bf34d0c, which froze the
/// member first, so it was left stopped instead of running. Fixed: every process the freeze
/// stopped is sent SIGKILL by its PID after the rounds, and members are taken as the snapshot has
/// them now; 0 of 32 rounds since (`ATKFREEZE_ROUNDS=4`), 12 of 16 before.
#[test]
fn a_member_that_joins_the_first_group_after_the_deadline_killpg() {
    let broken = joiner_rounds(rounds(8));
    assert!(broken.is_empty(), "joiner left behind: {broken:?}");
}

#[test]
fn bystanders_and_another_job_are_neither_stopped_nor_killed() {
    let s = Server::start();
    let t0 = tag(500);
    let other_path = script(
        s.dir(),
        &t0,
        &format!("sleep 302.{t0} &\nsetsid sleep 302.{t0} &\n(set -m; sleep 302.{t0} & wait) &\necho ready\nwait\n"),
    );
    let other = start(&s, "freeze-other", &other_path, "2s", "1s");
    let mut bystander = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg(format!("301.{t0}"))
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let watch = |what: &str| {
        let seen = tagged(&t0);
        let bad: Vec<_> = seen
            .iter()
            .filter(|&&(_, st)| st == 'T' || st == 't')
            .collect();
        assert!(bad.is_empty(), "{what}: stopped: {bad:?}");
        // lockctl's job's three sleeps, the bystander, the job's sh and its subshell.
        let sleeps = seen.len();
        assert!(sleeps >= 4, "{what}: lost some: {seen:?}");
    };
    let n = rounds(4);
    for round in 0..n {
        let t = tag(510 + round);
        let body = forking_body(&t, &format!("setsid sleep 300.{t}"));
        let path = script(s.dir(), &t, &body);
        let mut child = start(&s, &format!("freeze-by-{round}"), &path, "2s", "1s");
        std::thread::sleep(Duration::from_millis(200 + (round as u64 * 43) % 300));
        let quiet = kill_lockctl(child.id() as i32);
        let (running, stopped) = leftovers(&t);
        sweep(&t);
        let _ = child.wait();
        watch(&format!("round {round}"));
        assert!(
            alive(bystander.id() as i32),
            "round {round}: bystander killed"
        );
        assert_eq!(state(bystander.id() as i32), Some('S'));
        assert!(quiet, "round {round}: the watcher never exited");
        assert!(
            running.is_empty() && stopped.is_empty(),
            "round {round}: running {running:?} stopped {stopped:?}"
        );
    }
    let other_pid = other.id() as i32;
    assert!(kill_lockctl(other_pid));
    let gone = eventually(Duration::from_secs(3), || {
        tagged(&t0).iter().all(|&(p, _)| p == bystander.id() as i32)
    });
    let left = tagged(&t0);
    let by = state(bystander.id() as i32);
    let _ = bystander.kill();
    let _ = bystander.wait();
    sweep(&t0);
    let _ = wait_output(other, Duration::from_secs(10));
    assert!(gone, "the other job outlived its lockctl: {left:?}");
    assert_eq!(by, Some('S'), "the bystander after the other kill");
}

#[test]
fn the_normal_end_is_unchanged() {
    let s = Server::start();
    let t = tag(600);
    let mut bystander = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg(format!("301.{t}"))
            .process_group(0)
            .spawn()
            .unwrap()
    };
    for round in 0..rounds(3) {
        let body = format!(
            "echo ready\ni=0\nwhile [ $i -lt 30 ]; do setsid sleep 0.0{round}1 & (setsid sleep 0.02 &) ; i=$((i+1)); done\nwait\nexit 3\n"
        );
        let path = script(s.dir(), &format!("{t}-{round}"), &body);
        let out = run(lockctl_on(&s)
            .args(["exec", &format!("freeze-end-{round}"), "--ttl", "2s", "--"])
            .arg("sh")
            .arg(&path));
        assert_eq!(code(&out), 3, "round {round}: {}", stderr(&out));
        std::thread::sleep(Duration::from_millis(100));
        let left: Vec<_> = tagged(&t)
            .into_iter()
            .filter(|&(p, _)| p != bystander.id() as i32)
            .collect();
        assert!(left.is_empty(), "round {round}: left {left:?}");
        assert_eq!(state(bystander.id() as i32), Some('S'), "round {round}");
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
}

/// Rounds of `a_member_moving_into_a_bystander_s_group_is_left_frozen`; returns the rounds where
/// the joiner was left (pid, state, group) and whether the bystander was ever stopped or killed.
fn bystander_joiner_rounds(n: usize) -> (Vec<(usize, Seen)>, bool) {
    need_tool("python3", "-V");
    let s = Server::start();
    let py = s.dir().join("joiner.py");
    std::fs::write(&py, JOINER).unwrap();
    let t0 = tag(700);
    let mut bystander = {
        use std::os::unix::process::CommandExt;
        std::process::Command::new("sleep")
            .arg(format!("303.{t0}"))
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let b = bystander.id() as i32;
    let mut broken = Vec::new();
    let mut harmed = false;
    for round in 0..n {
        let t = tag(710 + round);
        let body = format!("python3 {} {b} {t} &\necho ready\nwait\n", py.display());
        let path = script(s.dir(), &t, &body);
        let mut child = start(&s, &format!("freeze-byjoin-{round}"), &path, "2s", "1s");
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 41) % 200));
        let quiet = kill_lockctl(child.id() as i32);
        let (running, stopped) = leftovers(&t);
        let left: Seen = running.iter().chain(&stopped).copied().collect();
        for &(p, st) in &left {
            let st2 = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
            let f: Vec<&str> = st2
                .rsplit(')')
                .next()
                .unwrap_or("")
                .split_whitespace()
                .collect();
            eprintln!(
                "round {round}: left {p} state {st} ppid {:?} group {:?} (bystander {b})",
                f.get(1),
                f.get(2)
            );
        }
        harmed |= state(b) != Some('S');
        sweep(&t);
        let _ = child.wait();
        assert!(quiet, "round {round}: the watcher never exited");
        if !left.is_empty() {
            broken.push((round, left));
        }
    }
    let _ = bystander.kill();
    let _ = bystander.wait();
    eprintln!("{} of {n} rounds broken", broken.len());
    (broken, harmed)
}

/// Found here (see the module docs): the joiner was frozen and then `killpg`'d by the group it had
/// when the freeze's walk saw it, which was stale. Fixed: `Walker::members` takes each remembered
/// process as the snapshot has it now, and every frozen process is sent SIGKILL by its PID; 0 of
/// 32 rounds since (`ATKFREEZE_ROUNDS=4`), 15 of 32 before.
#[test]
fn a_member_moving_into_a_bystander_s_group_is_left_frozen() {
    let (broken, harmed) = bystander_joiner_rounds(rounds(8));
    assert!(!harmed, "the bystander was stopped or killed");
    assert!(broken.is_empty(), "joiner left behind: {broken:?}");
}
