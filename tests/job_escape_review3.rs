//! Members that left the session and lost their parent, against a lockctl killed by SIGKILL at
//! varying moments: lockctl is multi-threaded, and one of its threads may hand its children on
//! while another still holds the descriptor table (the watcher's pipe not yet hung up). A look
//! taken in that moment must not be kept in place of an earlier, complete one.
//!
//! Each round starts a job whose first process starts `setsid sleep` members and exits (lockctl,
//! the subreaper, adopts them), kills lockctl after a varying delay, and checks in `/proc` that no
//! member runs 3 s later. Variants: on a kernel without lists of children (stood in for as in
//! `job_escape_watcher.rs`), and with the job forking and exiting quickly in a loop at the kill,
//! so that lockctl reaps orphans then; and with the kill timed to fall inside one of the
//! watcher's looks (the watcher seen running in `/proc`). `REVIEW3_ROUNDS` sets the number of
//! rounds; `REVIEW3_HOGS` adds four busy loops to every job.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::watchers::{start_until_ready, watchers_of};
use support::*;

fn rounds(default: usize) -> usize {
    std::env::var("REVIEW3_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The job: three members in sessions of their own, adopted by lockctl once their parent exits;
/// with `forker`, a loop that keeps starting short-lived orphans for lockctl to reap.
/// With `hogs` (or `REVIEW3_HOGS`), four busy loops in the job's group as well.
fn job(dir: &Path, round: usize, forker: bool, hogs: bool) -> String {
    let d = dir.display();
    let hogs = if hogs || std::env::var("REVIEW3_HOGS").is_ok() {
        "for i in 1 2 3 4; do sh -c 'while [ ! -e \"$0/stop\" ]; do :; done' \"$D\" & done;"
    } else {
        ""
    };
    let spin = if forker {
        "while [ ! -e \"$D/stop\" ]; do sh -c 'true & exit 0'; done &"
    } else {
        ""
    };
    format!(
        "D={d}; sh -c 'for i in 1 2 3; do setsid sleep 300 & echo $! >> {d}/members.{round}; done; exit 0'; {spin} {hogs} echo ready; wait"
    )
}

fn members(dir: &Path, round: usize) -> Vec<i32> {
    std::fs::read_to_string(dir.join(format!("members.{round}")))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// A member still running: its PID is a `sleep 300` that is not a zombie.
fn runs(pid: i32) -> bool {
    let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rfind(')')
        .and_then(|c| stat[c + 1..].split_whitespace().next());
    cmd == b"sleep\x00300\x00" && !matches!(state, Some("Z") | Some("X") | None)
}

/// Starts lockctl for one round; returns it and its PID once the job is ready, or None if the
/// stand-in for a kernel without lists cannot be set up here.
fn start(
    s: &Server,
    round: usize,
    unlisted: bool,
    forker: bool,
    hogs: bool,
) -> Option<(std::process::Child, i32)> {
    let name = format!("review3-{round}");
    let job = job(s.dir(), round, forker, hogs);
    let fake = s.dir().join(format!("fake{round}"));
    let args = [
        "exec",
        &name,
        "--ttl",
        "2s",
        "--kill-after",
        "1s",
        "--",
        "sh",
        "-c",
        &job,
    ]
    .map(std::ffi::OsStr::new);
    start_until_ready(s, &args, unlisted.then_some(fake.as_path()))
}

/// Runs `n` rounds; returns the rounds in which a member outlived lockctl by 3 s (the members
/// are killed then, so nothing outlives the test), or None if the variant cannot run here.
fn attack(n: usize, unlisted: bool, forker: bool) -> Option<Vec<(usize, u64, Vec<i32>)>> {
    attack_with(n, unlisted, forker, false, false)
}

/// The scheduler state of `pid` ('R' running, 'S' asleep, ...).
fn state(pid: i32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rfind(')')
        .and_then(|c| stat[c + 1..].split_whitespace().next())
        .and_then(|s| s.chars().next())
        .unwrap_or('?')
}

/// Waits for the watcher to wake (a look begins), for at most 2 s; returns when it did.
fn next_wake(w: i32) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(2);
    while state(w) == 'R' {
        if Instant::now() > deadline {
            return None;
        }
    }
    loop {
        if state(w) == 'R' {
            return Some(Instant::now());
        }
        if Instant::now() > deadline {
            return None;
        }
    }
}

/// Kills `lockctl` at a moment inside one of its watcher's looks: the look before is timed, and
/// the kill comes `frac` of that look's length after the next one begins.
fn kill_inside_a_look(lockctl: i32, frac: f64) -> String {
    let Some(w) = watchers_of(lockctl as u32).first().copied() else {
        kill(lockctl, libc::SIGKILL);
        return "no watcher found".into();
    };
    let Some(start) = next_wake(w) else {
        kill(lockctl, libc::SIGKILL);
        return "no look seen".into();
    };
    while state(w) == 'R' && start.elapsed() < Duration::from_secs(1) {}
    let look = start.elapsed();
    let at = look.mul_f64(frac);
    let Some(start) = next_wake(w) else {
        kill(lockctl, libc::SIGKILL);
        return "no look seen".into();
    };
    while start.elapsed() < at {}
    kill(lockctl, libc::SIGKILL);
    format!("look {look:?}, killed {at:?} into the next")
}

fn attack_with(
    n: usize,
    unlisted: bool,
    forker: bool,
    aligned: bool,
    hogs: bool,
) -> Option<Vec<(usize, u64, Vec<i32>)>> {
    if unlisted
        && !std::process::Command::new("unshare")
            .args(["-m", "true"])
            .output()
            .is_ok_and(|o| o.status.success())
    {
        eprintln!("NOT RUN HERE: no mount namespace for this process");
        return None;
    }
    let s = Server::start();
    let mut broken = Vec::new();
    // A fixed sequence of delays, spread over the watcher's looks (100 ms apart) and a renewal
    // (every third of the 2 s TTL); never under 250 ms, so that the watcher has looked at the
    // members at least twice (a member adopted less than a look before the kill is a stated limit).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for round in 0..n {
        let Some((mut child, lockctl)) = start(&s, round, unlisted, forker, hogs) else {
            eprintln!("NOT RUN HERE: cannot mount over /proc/PID/task");
            return None;
        };
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let delay = if round % 4 == 3 {
            // Around a renewal (2 s / 3).
            600 + (seed >> 33) % 200
        } else {
            250 + (seed >> 33) % 250
        };
        std::thread::sleep(Duration::from_millis(delay));
        let pids = members(s.dir(), round);
        assert_eq!(pids.len(), 3, "round {round}: the members never started");
        let how = if aligned {
            kill_inside_a_look(lockctl, 0.5 + 0.6 * ((seed >> 20) % 1000) as f64 / 1000.0)
        } else {
            kill(lockctl, libc::SIGKILL);
            String::new()
        };
        let gone = eventually(Duration::from_secs(3), || !pids.iter().any(|&p| runs(p)));
        let left: Vec<i32> = pids.iter().copied().filter(|&p| runs(p)).collect();
        for &p in &pids {
            if runs(p) {
                kill(p, libc::SIGKILL);
            }
        }
        std::fs::write(s.dir().join("stop"), "").unwrap();
        let _ = child.kill();
        let _ = wait_output(child, Duration::from_secs(30));
        std::thread::sleep(Duration::from_millis(100));
        let _ = std::fs::remove_file(s.dir().join("stop"));
        if round < 3 && aligned {
            eprintln!("round {round}: {how}");
        }
        if !gone {
            eprintln!("round {round}: killed {delay} ms after ready {how}; members left: {left:?}");
            broken.push((round, delay, left));
        }
    }
    eprintln!("{} of {n} rounds broken", broken.len());
    Some(broken)
}

#[test]
fn without_lists_adopted_members_die_with_lockctl_killed_inside_a_look() {
    if let Some(broken) = attack_with(rounds(12), true, false, true, false) {
        assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
    }
}

#[test]
fn adopted_members_die_with_lockctl_killed_at_varying_moments() {
    let broken = attack(rounds(12), false, false).unwrap();
    assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
}

#[test]
fn adopted_members_die_with_lockctl_killed_while_the_job_forks() {
    let broken = attack(rounds(12), false, true).unwrap();
    assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
}

#[test]
fn without_lists_adopted_members_die_with_lockctl_killed_at_varying_moments() {
    if let Some(broken) = attack(rounds(12), true, false) {
        assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
    }
}

#[test]
fn without_lists_adopted_members_die_with_lockctl_killed_while_the_job_forks() {
    if let Some(broken) = attack(rounds(12), true, true) {
        assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
    }
}

/// The forking job with four busy loops on two cores, without lists of children: all three
/// members, adopted at least 250 ms before the kill, ran on in 1 of 220 rounds on main.
#[test]
#[ignore = "open: without lists of children, under CPU load, with the job forking, members adopted 250 ms before lockctl's SIGKILL outlived it (1 of 220 rounds: 1 of 60, then 0 of 80 twice); likely the looks, which walk all of /proc without the lists and came 250-560 ms apart under load in atkunion_review.rs"]
fn without_lists_adopted_members_die_with_lockctl_killed_while_the_job_forks_under_load() {
    if let Some(broken) = attack_with(rounds(200), true, true, false, true) {
        assert!(broken.is_empty(), "members outlived lockctl: {broken:?}");
    }
}
