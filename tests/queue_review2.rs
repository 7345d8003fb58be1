//! Second review of the queue, after the heartbeat interval started growing with a waiter's place:
//! cases where the arrival order or the liveness bound does not hold. Real servers, real signals.

mod support;

use std::time::{Duration, Instant};

use support::queue::{
    all_succeed, finish_off, hold, order, queue_in_order, queue_key, wait_queued, waiter,
};
use support::*;

/// Docs (guarantees): a live waiter keeps its place; "an outage is no such pause: the waiter keeps
/// trying through it, keeps its ticket, and the nodes put it back at that ticket". The single node
/// is stopped (SIGSTOP) for 8 s, longer than a front waiter's 3 s lifetime, while five waiters queue
/// behind a holder whose lease ends during the stop. Every waiter kept retrying the whole time; the
/// first one should still be granted first. (Seen: 4 and 5 first, 3 runs of 3: the front waiters'
/// 3 s expiries pass during the stop while the far-back ones' 15 s and 30 s do not, so the first
/// script after it drops 1 to 3 and finds 4 at the head.)
#[test]
fn a_stopped_node_keeps_the_arrival_order() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(lockctl_on(&s).args(["acquire", "paused", "--ttl", "6s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let kids = queue_in_order(&[&s], "paused", &file, 5, || lockctl_on(&s));
    let pttl: i64 = s.cmd(&["PTTL", "lockctl:paused"]);
    assert!(
        pttl > 0,
        "the holder's lease ended before the node was stopped"
    );
    let alive: Vec<String> = s.cmd(&[
        "ZRANGE",
        "{lockctl:paused}\u{1f}alive",
        "0",
        "-1",
        "WITHSCORES",
    ]);
    let now: Vec<String> = s.cmd(&["TIME"]);
    eprintln!("before the stop: now {now:?}, expiries {alive:?}");
    s.pause();
    std::thread::sleep(Duration::from_secs(8));
    s.resume();
    all_succeed(kids);
    assert_eq!(order(&file), ["1", "2", "3", "4", "5"]);
}

/// The same on Redlock over 3 nodes when the host of all three stalls (every node stopped 8 s at
/// once, a quorum of them is what the order rests on): the arrival order should survive. (Seen:
/// 1 3 4 5 2, 1 4 2 5 3, 1 4 5 3 2.)
#[test]
fn three_nodes_stopped_at_once_keep_the_arrival_order() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(s.lockctl().args(["acquire", "stall", "--ttl", "6s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let kids = queue_in_order(&[&s[0], &s[1], &s[2]], "stall", &file, 5, || s.lockctl());
    let pttl: i64 = s[0].cmd(&["PTTL", "lockctl:stall"]);
    assert!(
        pttl > 0,
        "the holder's lease ended before the nodes were stopped"
    );
    for n in 0..3 {
        s[n].pause();
    }
    std::thread::sleep(Duration::from_secs(8));
    for n in 0..3 {
        s[n].resume();
    }
    all_succeed(kids);
    assert_eq!(order(&file), ["1", "2", "3", "4", "5"]);
}

/// Docs (guarantees): a live waiter keeps its place through a heartbeat "delayed by a paused node".
/// On Redlock over 3 nodes with `--node-timeout 3s` (far below the TTL, as `--help` asks), one node
/// is stopped while four waiters queue behind a holder: every attempt now lasts the 3 s timeout, so
/// a front waiter's heartbeats on the two live nodes come more than its 3 s lifetime apart. The two
/// live nodes still form a quorum and nobody stopped waiting; the holder releases after 6 s and the
/// waiters should get the lock in their arrival order, each within 90 s. (Seen, 6 runs of 6: the
/// order 1 2 4 3, and in 4 runs a waiter still waiting after 90 s with the lock free on both live
/// nodes: two waiters each dropped between two of their heartbeats, each re-queued behind the
/// other, each told "position 2 of 2".)
#[test]
fn a_stopped_node_with_a_long_node_timeout_keeps_the_arrival_order() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let slow = || {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", "3s");
        c
    };
    let o = run(slow().args(["acquire", "slow", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let kids = queue_in_order(&[&s[0], &s[1], &s[2]], "slow", &file, 4, slow);
    s[2].pause();
    std::thread::sleep(Duration::from_secs(6));
    let o = run(slow().args(["release", "slow", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let started = std::time::Instant::now();
    let mut failed = Vec::new();
    for (i, k) in kids.into_iter().enumerate() {
        let o = wait_output(k, Duration::from_secs(90));
        if o.status.code() != Some(0) {
            let e = stderr(&o);
            let tail = &e[e.len().saturating_sub(1500)..];
            failed.push(format!(
                "waiter {}: {:?} after {:?}: {tail}",
                i + 1,
                o.status,
                started.elapsed()
            ));
        }
    }
    s[2].resume();
    let got = order(&file);
    assert!(failed.is_empty(), "order so far {got:?}; {failed:#?}");
    assert_eq!(got, ["1", "2", "3", "4"]);
}

/// The other side of a node's stall: a waiter that dies (`sig` SIGKILL) or stops (SIGSTOP) while
/// the node is stopped is still dropped after the resume. The stall moves its expiry forward with
/// the others' (a stopped one still listens on its wake channel; a killed one may too, until the
/// server sees its connection close), but it never beats again, so it goes within a front lifetime
/// (4 s with the default node timeout) and the waiters behind it are served in their order. Bounded
/// generously from above: a waiter kept forever would hold the others up for good.
fn a_waiter_lost_during_a_stall_is_dropped(sig: i32) {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "lost");
    let mut kids = queue_in_order(&[&s], "lost", &file, 3, || lockctl_on(&s));
    let first = kids.remove(0);
    s.pause();
    kill(first.id() as i32, sig);
    std::thread::sleep(Duration::from_secs(8));
    s.resume();
    let resumed = Instant::now();
    let o = run(lockctl_on(&s).args(["release", "lost", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    let took = resumed.elapsed();
    eprintln!(
        "signal {sig}: the waiters behind the lost one were served {took:?} after the resume"
    );
    assert!(took < Duration::from_secs(20), "took {took:?}");
    assert_eq!(order(&file), ["2", "3"]);
    let left: u64 = s.cmd(&["ZCARD", &queue_key("lost")]);
    assert_eq!(left, 0, "the lost waiter is still queued");
    finish_off(first);
}

#[test]
fn a_waiter_killed_during_a_node_stall_is_dropped_after_the_resume() {
    a_waiter_lost_during_a_stall_is_dropped(libc::SIGKILL);
}

#[test]
fn a_waiter_stopped_during_a_node_stall_is_dropped_after_the_resume() {
    a_waiter_lost_during_a_stall_is_dropped(libc::SIGSTOP);
}

/// What tells a node's stall from dead waiters is the waiters' own beats, so a quiet spell with no
/// live waiter must not keep dead ones queued: the only waiter dies (`sig` SIGKILL: its wake
/// subscription ends with it; SIGSTOP: it still listens) and nobody calls for 6 s, longer than a
/// front lifetime (4 s). The call after the spell takes it for a stall only if the waiter still
/// listens: so `-n` gets the free lock right after the release (SIGKILL), or after one more quiet
/// spell (SIGSTOP; here the queue's keys have expired by then too: the rule that a stall counts
/// once is `a_second_quiet_spell_with_no_heartbeat_is_no_stall`).
fn a_quiet_spell_keeps_no_dead_waiter(sig: i32) {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let token = hold(&mut lockctl_on(&s), "quiet");
    let w = waiter(
        &mut lockctl_on(&s),
        "quiet",
        &dir.path().join("order"),
        "1",
        &[],
    );
    wait_queued(&s, "quiet", 1);
    kill(w.id() as i32, sig);
    std::thread::sleep(Duration::from_secs(6));
    let o = run(lockctl_on(&s).args(["release", "quiet", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    if sig == libc::SIGSTOP {
        std::thread::sleep(Duration::from_secs(6));
    }
    let o = run(lockctl_on(&s).args(["acquire", "quiet", "-n"]));
    assert_eq!(code(&o), 0, "a dead waiter was kept: {}", stderr(&o));
    finish_off(w);
}

#[test]
fn a_quiet_spell_after_a_waiter_was_killed_keeps_no_dead_waiter() {
    a_quiet_spell_keeps_no_dead_waiter(libc::SIGKILL);
}

#[test]
fn a_quiet_spell_after_a_waiter_was_stopped_keeps_no_dead_waiter() {
    a_quiet_spell_keeps_no_dead_waiter(libc::SIGSTOP);
}

/// A stall is taken as such once per quiet spell: four waiters all stopped (they still listen), the
/// queue kept by the far-back one's long expiry. The first call after 6 s of quiet (the release)
/// moves every expiry forward by the gap; the next call, 6 s later with no heartbeat between, is no
/// stall, so it drops the head, whose expiry has passed again, while the far-back one is kept
/// (16 s lifetime). Moving them again would keep a stopped waiter at the head for as long as
/// something calls more than a front lifetime apart.
#[test]
fn a_second_quiet_spell_with_no_heartbeat_is_no_stall() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "spell");
    let kids = queue_in_order(&[&s], "spell", &file, 4, || lockctl_on(&s));
    // Each waiter's attempt after it subscribed earns its place's interval.
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key("spell"), "0", "-1"]);
    assert_eq!(ids.len(), 4);
    for k in &kids {
        kill(k.id() as i32, libc::SIGSTOP);
    }
    std::thread::sleep(Duration::from_secs(6));
    let o = run(lockctl_on(&s).args(["release", "spell", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    std::thread::sleep(Duration::from_secs(6));
    let o = run(lockctl_on(&s).args(["acquire", "spell", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let queued: Vec<String> = s.cmd(&["ZRANGE", &queue_key("spell"), "0", "-1"]);
    assert!(
        !queued.contains(&ids[0]),
        "the stopped head was kept: {queued:?} of {ids:?}"
    );
    assert!(
        queued.contains(&ids[3]),
        "the far-back waiter went early: {queued:?} of {ids:?}"
    );
    for k in kids {
        kill(k.id() as i32, libc::SIGCONT);
        kill(k.id() as i32, libc::SIGKILL);
        let _ = wait_output(k, Duration::from_secs(10));
    }
}

/// The front clamp keeps a stall's mark, so a stopped waiter is moved once, also when it reaches
/// the front between two quiet spells. Five waiters; the fourth and fifth (far back: about 16 s and
/// 31 s expiries) are stopped (they still listen), the first three killed. The call after the
/// fourth's expiry passed takes the quiet spell for a stall: it moves the fourth forward by the gap
/// (marked), drops the dead three, and brings the fourth and fifth, now at the front, down to a
/// front lifetime. The call after that lifetime passed, with no heartbeat between, drops the
/// fourth: its expiry passed again unbeaten. Had the clamp cleared the mark, it would be moved
/// again, and kept at the head for as long as something calls more than a front lifetime apart. The
/// fifth, moved for the first time, stays.
#[test]
fn a_stopped_waiter_clamped_at_the_front_after_a_stall_is_moved_once() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "clamp");
    let kids = queue_in_order(&[&s], "clamp", &file, 5, || lockctl_on(&s));
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key("clamp"), "0", "-1"]);
    assert_eq!(ids.len(), 5);
    let now_ms = || {
        let t: Vec<String> = s.cmd(&["TIME"]);
        t[0].parse::<f64>().unwrap() * 1000.0 + t[1].parse::<f64>().unwrap() / 1000.0
    };
    let alive = "{lockctl:clamp}\u{1f}alive";
    let expiry = |id: &str| -> Option<f64> { s.cmd(&["ZSCORE", alive, id]) };
    // Each waiter's attempt after it subscribed earns its place's interval: the fourth's expiry
    // is then more than twice a front lifetime (4 s) away, and the fifth's beyond it.
    let far = eventually(Duration::from_secs(30), || {
        let now = now_ms();
        let (d, e) = (expiry(&ids[3]), expiry(&ids[4]));
        d.is_some_and(|d| d > now + 8000.0) && e.is_some_and(|e| Some(e) > d)
    });
    assert!(far, "the waiters far back did not get a longer heartbeat");
    for k in &kids[3..] {
        kill(k.id() as i32, libc::SIGSTOP);
    }
    for k in &kids[..3] {
        kill(k.id() as i32, libc::SIGKILL);
    }
    let fourth = expiry(&ids[3]).unwrap();
    assert!(eventually(Duration::from_secs(60), || now_ms() > fourth + 200.0));
    let o = run(lockctl_on(&s).args(["acquire", "clamp", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let queued: Vec<String> = s.cmd(&["ZRANGE", &queue_key("clamp"), "0", "-1"]);
    assert_eq!(queued, ids[3..], "after the first quiet spell");
    let clamped = expiry(&ids[3]).unwrap();
    assert!(
        clamped < now_ms() + 4000.0 + 1000.0,
        "the fourth was not brought down to a front lifetime: {clamped}, now {}",
        now_ms()
    );
    assert!(eventually(Duration::from_secs(60), || now_ms() > clamped + 200.0));
    let o = run(lockctl_on(&s).args(["acquire", "clamp", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let queued: Vec<String> = s.cmd(&["ZRANGE", &queue_key("clamp"), "0", "-1"]);
    assert_eq!(
        queued,
        ids[4..],
        "a stopped waiter moved by a stall, then clamped at the front, was moved again"
    );
    let o = run(lockctl_on(&s).args(["release", "clamp", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for k in kids {
        finish_off(k);
    }
}

/// A waiter's front lifetime counts its own node timeout (its record keeps it), whoever brings the
/// front's expiries down: a waiter with `--node-timeout 3s` (a 9 s front lifetime), stopped right
/// after a heartbeat, keeps its expiry when the head, a waiter with the default node timeout (a 4 s
/// front lifetime), leaves ahead of it. Brought down to 4 s, a live waiter whose attempts wait out
/// its node timeout on a stopped node would be dropped between two of its beats.
#[test]
fn a_waiter_keeps_its_own_front_lifetime_when_another_leaves_ahead_of_it() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "own");
    let head = waiter(&mut lockctl_on(&s), "own", &file, "1", &[]);
    wait_queued(&s, "own", 1);
    let slow = waiter(
        &mut lockctl_on(&s),
        "own",
        &file,
        "2",
        &["--node-timeout", "3s"],
    );
    wait_queued(&s, "own", 2);
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key("own"), "0", "-1"]);
    let now_ms = || {
        let t: Vec<String> = s.cmd(&["TIME"]);
        t[0].parse::<f64>().unwrap() * 1000.0 + t[1].parse::<f64>().unwrap() / 1000.0
    };
    let expiry = || -> Option<f64> { s.cmd(&["ZSCORE", "{lockctl:own}\u{1f}alive", &ids[1]]) };
    // More than the head's 4 s lifetime away (8 to 9 s after each of its beats).
    let long = eventually(Duration::from_secs(30), || {
        expiry().is_some_and(|e| e > now_ms() + 7000.0)
    });
    assert!(long, "the slow waiter's expiry: {:?}", expiry());
    kill(slow.id() as i32, libc::SIGSTOP);
    let before = expiry().unwrap();
    kill(head.id() as i32, libc::SIGTERM);
    let o = wait_output(head, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", stderr(&o));
    let queued: Vec<String> = s.cmd(&["ZRANGE", &queue_key("own"), "0", "-1"]);
    assert_eq!(queued, ids[1..]);
    let after = expiry().unwrap();
    assert_eq!(
        after,
        before,
        "the slow waiter's expiry was brought down to the leaving head's lifetime ({} ms left)",
        after - now_ms()
    );
    let o = run(lockctl_on(&s).args(["release", "own", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    finish_off(slow);
}
