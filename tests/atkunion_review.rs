//! An adversarial review of caf78b3 ("watcher: a look adds to what earlier looks found instead of
//! replacing it"): `Walker::refresh` now keeps every process an earlier look found that still runs
//! (same PID and start time), and no longer drops a look taken once the pipe hung up. Attacked on
//! real processes and `redis-server`s, against both promises: nothing of the job outlives a
//! SIGKILLed lockctl, and the watcher kills nothing that is not the job's.
//!
//! Scenes:
//!
//! - `members_adopted_all_along_die_with_lockctl` (with the kernel's lists of children) and
//!   `without_lists_members_adopted_all_along_die_with_lockctl` (without them, stood in for as in
//!   `job_escape_review3.rs`): a job that keeps adopting `setsid sleep` members (every 30 ms) while
//!   lockctl is SIGKILLed 300 to 900 ms after it started, every other round with two busy loops in
//!   the job. Every member adopted at least 250 ms before the kill must die (younger ones are a
//!   stated limit; they are counted, not asserted).
//! - `without_lists_under_load_members_adopted_all_along_die_with_lockctl` (ignored, open): the
//!   same without lists, with 4 busy loops and 1500 idle processes of the test's own beside the
//!   job (`ATKUNION_LOAD=BUSY,IDLE` sets that load for every adopting scene). Not caused by
//!   caf78b3: each look walks all of `/proc`, and the looks come far less often than every 100 ms.
//! - `a_reused_pid_with_another_start_is_spared`: a remembered member dies and is reaped; the test
//!   hands its PID (`ns_last_pid`, root only) to a process of its own, in lockctl's session, started
//!   after lockctl, leading a group whose ID is the dead member's old group. Looks keep running for
//!   a while; lockctl is SIGKILLed: the impostor must survive, a live member must die.
//! - `the_normal_end_and_another_lockctl_are_left_alone`: a long job (many short-lived children
//!   in groups of their own, members that exit by themselves) ends; lockctl exits 0 and leaves
//!   nothing, while a bystander and another lockctl's job (same session, started later) run on.
//!   Then the other lockctl is SIGKILLed: its members die, the bystander runs on.
//! - `a_forking_member_s_children_in_the_member_s_group_die_with_lockctl`: a member in a session
//!   of its own that keeps starting children in its own group while lockctl is SIGKILLed: the
//!   watcher's `killpg` of that group reaches every child, also those forked during the kill.
//! - `a_forking_member_s_children_that_leave_its_group_die_with_lockctl`: the same member, but
//!   each child moves to a session of its own (`setsid sleep`) as it starts. Found open here (not
//!   caused by caf78b3): children that did so between the watcher's walk and its `killpg` of the
//!   member's group, or that were forked after the walk, outlived lockctl. Fixed since: the
//!   watcher stops every process it finds before the kill (see the test's doc).
//!
//! `ATKUNION_ROUNDS` multiplies every scene's rounds.

mod support;

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::watchers::{pids_aimable, start_until_ready, stat_field, watchers_of};
use support::*;

fn rounds(default: usize) -> usize {
    support::watchers::rounds_times("ATKUNION_ROUNDS", default)
}

/// A tag unique to this test process and `n`, as the fraction of a `sleep`'s seconds: it names the
/// processes a scene started, and only those.
fn tag(n: usize) -> String {
    support::watchers::process_tag(n, 7)
}

/// The processes running `sleep SECS.TAG` (zombies excluded).
fn tagged(secs: u32, tag: &str) -> Vec<i32> {
    let want = format!("sleep\0{secs}.{tag}\0").into_bytes();
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c == want))
        .filter(|&p| alive(p))
        .collect()
}

/// Whether `unshare -m` works here (the stand-in for a kernel without lists of children).
fn can_unshare() -> bool {
    std::process::Command::new("unshare")
        .args(["-m", "true"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Starts `lockctl exec NAME -- sh SCRIPT` and waits for the job's `ready` line; returns lockctl's
/// child (lockctl itself, or the `unshare` around it) and lockctl's PID. `unlisted`: lockctl's
/// `/proc/PID/task` is covered by an empty directory but for the main thread's entry, in a mount
/// namespace of its own that the watcher shares, so the watcher walks all of `/proc` instead.
fn start(s: &Server, name: &str, script: &Path, unlisted: bool) -> Option<(Child, i32)> {
    let fake = s.dir().join(format!("fake-{name}"));
    let head = [
        "exec",
        name,
        "--ttl",
        "2s",
        "--kill-after",
        "1s",
        "--",
        "sh",
    ]
    .map(OsStr::new);
    let args: Vec<&OsStr> = head.into_iter().chain([script.as_os_str()]).collect();
    start_until_ready(s, &args, unlisted.then_some(fake.as_path()))
}

/// SIGKILLs lockctl and waits (5 s at most) until its watchers have exited; true if they did.
fn kill_lockctl(lockctl: i32) -> bool {
    kill_lockctl_at(lockctl).0
}

/// [`kill_lockctl`], also telling the clock tick just before the kill.
fn kill_lockctl_at(lockctl: i32) -> (bool, u64) {
    let watchers = watchers_of(lockctl as u32);
    let at = support::watchers::ticks_now();
    kill(lockctl, libc::SIGKILL);
    let quiet = eventually(Duration::from_secs(5), || {
        watchers.iter().all(|&w| !alive(w)) && !alive(lockctl)
    });
    (quiet, at)
}

/// Kills (SIGKILL) every process running `sleep SECS.TAG`: the test's own, by their unique tag.
fn sweep(secs: u32, tag: &str) -> usize {
    let left = tagged(secs, tag);
    for &p in &left {
        kill(p, libc::SIGKILL);
    }
    left.len()
}

fn finish(child: Child, dir: &Path) {
    std::fs::write(dir.join("stop"), "").unwrap();
    let mut child = child;
    let _ = child.kill();
    let _ = wait_output(child, Duration::from_secs(30));
}

/// The job of `members_adopted_all_along_die_with_lockctl`: every 30 ms a `setsid sleep` member
/// whose parent exits at once (lockctl adopts it), 300 at most; with `hogs`, two busy loops.
fn adopting_job(dir: &Path, tag: &str, hogs: bool) -> std::path::PathBuf {
    let d = dir.display();
    let hogs = if hogs {
        "for i in 1 2; do sh -c 'while [ ! -e \"$0/stop\" ]; do :; done' \"$D\" & done"
    } else {
        ""
    };
    let script = format!(
        r#"D={d}
i=0
while [ $i -lt 300 ] && [ ! -e "$D/stop" ]; do
  sh -c 'setsid sleep 300.{tag} & exit 0'
  i=$((i+1))
  sleep 0.03
done &
{hogs}
echo ready
wait
"#
    );
    let path = dir.join(format!("adopting-{tag}.sh"));
    std::fs::write(&path, script).unwrap();
    path
}

/// Runs `n` rounds of the adopting job, killing lockctl 300 to 900 ms after ready; returns
/// (rounds, rounds where a member adopted >= 250 ms before the kill ran on, young members left).
fn adopting_rounds(
    n: usize,
    unlisted: bool,
    first: usize,
    load: Option<&str>,
) -> Option<(usize, Vec<String>, usize)> {
    if unlisted && !can_unshare() {
        eprintln!("NOT RUN HERE: no mount namespace for this process");
        return None;
    }
    let s = Server::start();
    let _load = Load::start(s.dir(), first, load);
    let mut broken = Vec::new();
    let mut young = 0;
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d ^ first as u64;
    for round in 0..n {
        let t = tag(first + round);
        let script = adopting_job(s.dir(), &t, round % 2 == 1);
        let name = format!("union-adopt-{}", first + round);
        let Some((child, lockctl)) = start(&s, &name, &script, unlisted) else {
            eprintln!("NOT RUN HERE: cannot mount over /proc/PID/task");
            return None;
        };
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(300 + seed % 600));
        let before = tagged(300, &t).len();
        let t0 = Instant::now();
        let (quiet, at) = kill_lockctl_at(lockctl);
        let watcher_took = t0.elapsed();
        eventually(Duration::from_secs(3), || tagged(300, &t).is_empty());
        let left: Vec<(i32, u64)> = tagged(300, &t)
            .into_iter()
            .filter_map(|p| Some((p, stat_field(p, 19)?)))
            .collect();
        sweep(300, &t);
        finish(child, s.dir());
        let _ = std::fs::remove_file(s.dir().join("stop"));
        let old: Vec<_> = left.iter().filter(|(_, st)| st + 25 <= at).collect();
        young += left.len() - old.len();
        if !left.is_empty() {
            eprintln!(
                "round {round} (unlisted {unlisted}): left, started this many ticks before the \
                 kill (negative: after it): {:?}; the watcher exited {watcher_took:?} after it",
                left.iter()
                    .map(|(_, st)| at as i64 - *st as i64)
                    .collect::<Vec<_>>()
            );
        }
        if !old.is_empty() || !quiet {
            broken.push(format!(
                "round {round} (unlisted {unlisted}, hogs {}): {} of {before} members ran on, \
                 started {:?} ticks before the kill; watcher exited: {quiet}",
                round % 2 == 1,
                old.len(),
                old.iter()
                    .map(|(_, st)| at as i64 - *st as i64)
                    .collect::<Vec<_>>()
            ));
        }
    }
    Some((n, broken, young))
}

/// Load outside the job, with `ATKUNION_LOAD=BUSY,IDLE`: BUSY busy loops and IDLE sleeping
/// processes (which make every walk of `/proc` longer), all the test's own, gone when dropped.
struct Load(Vec<Child>, std::path::PathBuf);

impl Load {
    fn start(dir: &Path, n: usize, spec: Option<&str>) -> Load {
        let spec = std::env::var("ATKUNION_LOAD")
            .ok()
            .or(spec.map(str::to_string))
            .unwrap_or_default();
        let mut it = spec.split(',').map(|v| v.parse::<usize>().unwrap_or(0));
        let (busy, idle) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        let stop = dir.join(format!("load-stop-{n}"));
        let mut procs = Vec::new();
        for _ in 0..busy {
            procs.push(
                std::process::Command::new("sh")
                    .args(["-c", "while [ ! -e \"$0\" ]; do :; done"])
                    .arg(&stop)
                    .spawn()
                    .unwrap(),
            );
        }
        for _ in 0..idle {
            procs.push(
                std::process::Command::new("sleep")
                    .arg("300")
                    .stdin(Stdio::null())
                    .spawn()
                    .unwrap(),
            );
        }
        Load(procs, stop)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.1, "");
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn members_adopted_all_along_die_with_lockctl() {
    let (n, broken, young) = adopting_rounds(rounds(8), false, 0, None).unwrap();
    eprintln!("with lists: {n} rounds, {young} young members left (a stated limit)");
    assert!(broken.is_empty(), "members outlived lockctl: {broken:#?}");
}

/// On a quiet machine 0 of 66 rounds broke; beside a full run of the suite (load about 4.7) 2 of 30,
/// members 260 and 520 ms old: the same slow looks as the loaded scene below.
#[test]
#[ignore = "open: without lists of children, on a machine loaded by the suite itself, members \
            adopted 260-520 ms before lockctl's SIGKILL outlived it (2 of 30 rounds; 0 of 66 \
            quiet): each look walks all of /proc and the looks come far less often than every \
            100 ms"]
fn without_lists_members_adopted_all_along_die_with_lockctl() {
    if let Some((n, broken, young)) = adopting_rounds(rounds(8), true, 500, None) {
        eprintln!("without lists: {n} rounds, {young} young members left (a stated limit)");
        assert!(broken.is_empty(), "members outlived lockctl: {broken:#?}");
    }
}

/// Without lists every look walks all of `/proc`; with 1500 other processes and 4 busy loops on
/// 2 cores, members adopted 250 to 560 ms before the kill ran on in 3 of 18 and 5 of 18 rounds (0
/// of 18 with the lists under the same load), and members started up to 130 ms after the kill
/// (before the watcher stopped the job's group) in most rounds. Not caused by caf78b3.
#[test]
#[ignore = "open: without lists of children, under load (4 busy loops, 1500 idle processes), \
            members adopted 250-560 ms before lockctl's SIGKILL outlive it (3 and 5 of 18 rounds): \
            the looks come far less often than every 100 ms"]
fn without_lists_under_load_members_adopted_all_along_die_with_lockctl() {
    if let Some((n, broken, young)) = adopting_rounds(rounds(18), true, 700, Some("4,1500")) {
        eprintln!("without lists, loaded: {n} rounds, {young} young members left");
        assert!(broken.is_empty(), "members outlived lockctl: {broken:#?}");
    }
}

/// Writes `last` to `/proc/sys/kernel/ns_last_pid` and starts `sleep 300.TAG` in a group of its
/// own: it gets `want` as its PID unless another process forked in between. Returns it if it did.
fn spawn_as(want: i32, tag: &str) -> Option<Child> {
    for _ in 0..200 {
        if std::fs::write("/proc/sys/kernel/ns_last_pid", (want - 1).to_string()).is_err() {
            return None;
        }
        let mut c = std::process::Command::new("sleep")
            .arg(format!("300.{tag}"))
            .process_group(0)
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        if c.id() as i32 == want {
            return Some(c);
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    None
}

#[test]
fn a_reused_pid_with_another_start_is_spared() {
    if !pids_aimable() {
        return;
    }
    let s = Server::start();
    let mut spared = 0;
    let mut tried = 0;
    for round in 0..rounds(4) {
        let unlisted = round % 2 == 1;
        if unlisted && !can_unshare() {
            continue;
        }
        let t = tag(100 + round);
        let d = s.dir().display();
        // x: the member whose PID is handed on; y: one that must die with lockctl. Both in
        // sessions of their own, adopted by lockctl.
        let script = format!(
            r#"D={d}
sh -c 'setsid sleep 300.{t} & echo $! > "$0/x.{round}"; setsid sleep 301.{t} & exit 0' "$D"
echo ready
wait
"#
        );
        let path = s.dir().join(format!("reuse-{round}.sh"));
        std::fs::write(&path, script).unwrap();
        let Some((child, lockctl)) = start(&s, &format!("union-reuse-{round}"), &path, unlisted)
        else {
            continue;
        };
        let x: i32 = std::fs::read_to_string(s.dir().join(format!("x.{round}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let x_start = stat_field(x, 19).unwrap();
        // Three looks at x, then x dies and lockctl reaps it.
        std::thread::sleep(Duration::from_millis(350));
        kill(x, libc::SIGKILL);
        assert!(
            eventually(Duration::from_secs(5), || !Path::new(&format!("/proc/{x}"))
                .exists()),
            "round {round}: lockctl never reaped {x}"
        );
        let impostor = spawn_as(x, &format!("9{t}"));
        let Some(mut impostor) = impostor else {
            eprintln!("round {round}: could not hand {x} on (other forks in between)");
            assert!(kill_lockctl(lockctl));
            sweep(301, &t);
            finish(child, s.dir());
            continue;
        };
        tried += 1;
        let i_start = stat_field(x, 19).unwrap();
        assert_ne!(i_start, x_start, "round {round}: the same start tick");
        // The impostor is in lockctl's session, started after it, and leads the group that was
        // the dead member's.
        assert_eq!(stat_field(x, 2), Some(x as u64));
        // Looks go on for a while with the impostor under the dead member's PID.
        std::thread::sleep(Duration::from_millis(400));
        let quiet = kill_lockctl(lockctl);
        let y_gone = eventually(Duration::from_secs(3), || tagged(301, &t).is_empty());
        let survived = alive(x) && stat_field(x, 19) == Some(i_start);
        let _ = impostor.kill();
        let _ = impostor.wait();
        sweep(301, &t);
        finish(child, s.dir());
        assert!(quiet, "round {round}: the watcher never exited");
        assert!(
            y_gone,
            "round {round} (unlisted {unlisted}): a member ran on"
        );
        assert!(
            survived,
            "round {round} (unlisted {unlisted}): the process that got the dead member's PID \
             {x} (another start) was killed"
        );
        spared += 1;
    }
    eprintln!("{spared} of {tried} impostors spared");
}

#[test]
fn the_normal_end_and_another_lockctl_are_left_alone() {
    let s = Server::start();
    let t = tag(200);
    let d = s.dir().display();
    // The other lockctl's job: two members in sessions of their own, adopted, and one in its group.
    let other = format!(
        r#"sh -c 'setsid sleep 302.{t} & setsid sleep 302.{t} & exit 0'
sleep 302.{t} &
echo ready
wait
"#
    );
    // The job that ends: 1.5 s of short-lived children in groups and sessions of their own (each
    // leaves a grandchild for lockctl to adopt and reap), members that exit by themselves.
    let ending = format!(
        r#"D={d}
sh -c 'setsid sleep 1.5 & setsid sleep 1.{t} & exit 0'
i=0
while [ $i -lt 150 ]; do
  setsid sh -c 'sleep 0.0$(( $$ % 9 )) & exit 0' &
  i=$((i+1))
  sleep 0.01
done
echo ready
wait
"#
    );
    let other_path = s.dir().join("other.sh");
    let ending_path = s.dir().join("ending.sh");
    std::fs::write(&other_path, other).unwrap();
    std::fs::write(&ending_path, ending).unwrap();
    let mut bystander = std::process::Command::new("sleep")
        .arg(format!("303.{t}"))
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let ending_lockctl = lockctl_on(&s)
        .args(["exec", "union-ending", "--ttl", "2s", "--"])
        .arg("sh")
        .arg(&ending_path)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let (other_child, other_lockctl) = start(&s, "union-other", &other_path, false).unwrap();
    let out = wait_output(ending_lockctl, Duration::from_secs(30));
    let took = started.elapsed();
    assert!(out.status.success(), "{out:?}");
    assert!(took >= Duration::from_millis(1400), "ended in {took:?}");
    std::thread::sleep(Duration::from_millis(300));
    assert!(tagged(1, &t).is_empty(), "the ended job left something");
    let others = tagged(302, &t);
    assert_eq!(others.len(), 3, "the other job lost members: {others:?}");
    assert!(alive(bystander.id() as i32), "the bystander was killed");
    // The other lockctl killed: its job dies, the bystander does not.
    assert!(kill_lockctl(other_lockctl));
    let gone = eventually(Duration::from_secs(3), || tagged(302, &t).is_empty());
    let by = alive(bystander.id() as i32);
    sweep(302, &t);
    let _ = bystander.kill();
    let _ = bystander.wait();
    finish(other_child, s.dir());
    assert!(gone, "the other job outlived its lockctl");
    assert!(by, "the bystander was killed with the other job");
}

/// The job of the forking-member scenes: a member in a session of its own that starts a child
/// every 3 ms (400 at most), each a `sleep 300.TAG`, moving to a session of its own first when
/// `leave`.
fn forking_job(dir: &Path, tag: &str, leave: bool) -> std::path::PathBuf {
    let d = dir.display();
    let child = if leave { "setsid sleep" } else { "sleep" };
    let script = format!(
        r#"D={d}
setsid sh -c 'i=0; while [ $i -lt 400 ] && [ ! -e "$0/stop" ]; do {child} 300.{tag} & i=$((i+1)); sleep 0.003; done' "$D" &
echo ready
wait
"#
    );
    let path = dir.join(format!("forking-{tag}.sh"));
    std::fs::write(&path, script).unwrap();
    path
}

/// Rounds of the forking member, lockctl SIGKILLed 300 to 600 ms after ready; returns the rounds
/// with children left 3 s after the kill, and how many.
fn forking_rounds(n: usize, leave: bool, first: usize) -> Vec<(usize, usize)> {
    let s = Server::start();
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(first + round);
        let script = forking_job(s.dir(), &t, leave);
        let name = format!("union-fork-{}", first + round);
        let (child, lockctl) = start(&s, &name, &script, false).unwrap();
        std::thread::sleep(Duration::from_millis(300 + (round as u64 * 37) % 300));
        let quiet = kill_lockctl(lockctl);
        eventually(Duration::from_secs(3), || tagged(300, &t).is_empty());
        let left = tagged(300, &t);
        if !left.is_empty() {
            let how: Vec<_> = left
                .iter()
                .take(3)
                .map(|&p| (p, stat_field(p, 1), stat_field(p, 3)))
                .collect();
            eprintln!(
                "round {round}: {} children ran on (pid, ppid, session): {how:?}",
                left.len()
            );
        }
        sweep(300, &t);
        finish(child, s.dir());
        let _ = std::fs::remove_file(s.dir().join("stop"));
        assert!(quiet, "round {round}: the watcher never exited");
        if !left.is_empty() {
            broken.push((round, left.len()));
        }
    }
    eprintln!("{} of {n} rounds broken", broken.len());
    broken
}

#[test]
fn a_forking_member_s_children_in_the_member_s_group_die_with_lockctl() {
    let broken = forking_rounds(rounds(5), false, 300);
    assert!(broken.is_empty(), "children outlived lockctl: {broken:?}");
}

/// Broke 7 of 8 and 8 of 8 rounds on a 2-core machine (and 6 of 8 with caf78b3^'s lockctl, by
/// hand): after lockctl's SIGKILL the watcher stopped only the job's first group; `Walker::signal`
/// then killed, without stopping them first, the members outside it: a member in a group of its
/// own was sent one `killpg`, and its children that moved to a session of their own after the walk
/// saw them in the member's group were not reached by it but were marked done, while those forked
/// after the walk were not in it at all; the member died, they were init's, and the next rounds
/// found neither. Fixed: the watcher freezes the job (every process found stopped by its PID,
/// walked again until nothing new turns up behind processes that hold still) before the kill, and
/// a SIGKILL goes to each member by its PID as well as to its group. On the fix: 0 of 96 rounds
/// (`ATKUNION_ROUNDS=3`, four runs); with the freeze alone and no wait for the stops to be taken,
/// 2 of 24 twice; with that wait but without the kill by PID, 4 of 144.
#[test]
fn a_forking_member_s_children_that_leave_its_group_die_with_lockctl() {
    let broken = forking_rounds(rounds(8), true, 400);
    assert!(broken.is_empty(), "children outlived lockctl: {broken:?}");
}
