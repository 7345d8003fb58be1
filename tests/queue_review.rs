//! Review of the queue: cases where its promises (arrival order, `--supersede` displacing only the
//! older waiters, `-n` never jumping the queue, clients with another `--limit` refused) do not hold
//! after a node outage, a restart, or a briefly stopped waiter. Real servers, real signals.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::queue::{
    all_succeed, finish_off, hold, order, queue_in_order, queue_key, wait_queued, waiter,
};
use support::*;

/// A lockctl for waiters that talk to a server the test restarts: the restart quarantine stays on,
/// short (2 s) so that the test does not wait a whole TTL.
fn waiter_cmd(s: &Server) -> Command {
    let mut c = lockctl_on(s);
    c.env("LOCKCTL_QUARANTINE", "2s");
    c
}

/// Docs: "Waiting forever through a Redis outage or a restart quarantine keeps the heartbeat: the
/// waiter retries at least once a second, so it keeps its place." Five waiters queue one after
/// another; the node is down for 4 s (longer than a heartbeat's 3 s lifetime) and comes back empty.
/// Every waiter kept retrying the whole time, so each should keep its place.
#[test]
fn an_outage_longer_than_a_heartbeat_keeps_the_arrival_order() {
    let mut s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    // The holder talks to the server only before the restart, which it has just started.
    let _token = hold(&mut lockctl_on(&s), "outage");
    let mut kids = Vec::new();
    for i in 1..=5u64 {
        kids.push(waiter(
            &mut waiter_cmd(&s),
            "outage",
            &file,
            &i.to_string(),
            &[],
        ));
        wait_queued(&s, "outage", i);
        std::thread::sleep(Duration::from_millis(150));
    }
    s.kill();
    std::thread::sleep(Duration::from_secs(4));
    s.restart_empty();
    all_succeed(kids);
    assert_eq!(
        order(&file),
        ["1", "2", "3", "4", "5"],
        "waiters that kept retrying through the outage lost their places"
    );
}

/// Docs: `--supersede` displaces the waiters queued *before* it; "Later waiters without the flag
/// queue behind it as usual." S (--supersede) queues, B queues behind it. The node restarts empty
/// while S is stopped for 1.5 s (less than a heartbeat's lifetime, so S is a live waiter and keeps
/// its ticket). B re-queues first; S's next attempt must not displace B, which arrived after S.
#[test]
fn a_superseding_waiter_requeued_after_a_restart_does_not_displace_newer_waiters() {
    let mut s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    // The holder talks to the server only before the restart, which it has just started.
    let _token = hold(&mut lockctl_on(&s), "sup");
    let sup = waiter(&mut waiter_cmd(&s), "sup", &file, "S", &["--supersede"]);
    wait_queued(&s, "sup", 1);
    std::thread::sleep(Duration::from_millis(300));
    let newer = waiter(&mut waiter_cmd(&s), "sup", &file, "B", &[]);
    wait_queued(&s, "sup", 2);
    kill(sup.id() as i32, libc::SIGSTOP);
    s.restart_empty();
    std::thread::sleep(Duration::from_millis(1500));
    kill(sup.id() as i32, libc::SIGCONT);
    let o = wait_output(sup, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "S: {}", stderr(&o));
    let o = wait_output(newer, Duration::from_secs(60));
    assert_eq!(
        code(&o),
        0,
        "B, which queued after S, was displaced by S: {}",
        stderr(&o)
    );
    assert_eq!(order(&file), ["S", "B"]);
}

/// CONTRACT: "-n never jumps the queue" and "Clients that disagree on N get a clear error (exit 2)".
/// W (--limit 1) is queued and is the head when the holder releases; while it is being handed the
/// lock (here: stopped for a moment, well inside its heartbeat), `acquire -n --limit 2` must be
/// refused (busy, or exit 2 for the other limit), and W must get the lock.
#[test]
fn another_limit_with_no_wait_does_not_jump_the_queue() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "mix");
    let head = waiter(&mut lockctl_on(&s), "mix", &file, "W", &[]);
    wait_queued(&s, "mix", 1);
    kill(head.id() as i32, libc::SIGSTOP);
    let o = run(lockctl_on(&s).args(["release", "mix", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let jump = run(lockctl_on(&s).args(["acquire", "mix", "-n", "--limit", "2", "--ttl", "5s"]));
    kill(head.id() as i32, libc::SIGCONT);
    let o = wait_output(head, Duration::from_secs(60));
    assert_ne!(
        code(&jump),
        0,
        "-n --limit 2 was granted while W was queued: {}",
        stdout(&jump)
    );
    assert_eq!(code(&o), 0, "the queued waiter lost: {}", stderr(&o));
    assert_eq!(order(&file), ["W"]);
}

/// Script calls (EVAL and EVALSHA) the server has run since the last `CONFIG RESETSTAT`.
fn script_calls(s: &Server) -> u64 {
    let info: String = s.cmd(&["INFO", "commandstats"]);
    ["evalsha", "eval"]
        .iter()
        .map(|c| {
            let prefix = format!("cmdstat_{c}:calls=");
            info.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse().expect("numeric calls"))
        })
        .sum()
}

/// "N waiters each taking the lock once cost O(N) commands in all": the bound of `tests/queue.rs`
/// (12 script calls per waiter), with holders that run for 1 s instead of 20 ms. Every waiter
/// heartbeats once a second for as long as it waits, and the k-th waits about k holds, so the
/// heartbeats alone grow with N² × the hold time.
#[test]
fn n_handoffs_of_one_second_holds_cost_a_linear_number_of_commands() {
    const N: u64 = 16;
    let s = Server::start();
    let token = hold(&mut lockctl_on(&s), "cost");
    let _: () = s.cmd(&["CONFIG", "RESETSTAT"]);
    let kids: Vec<Child> = (0..N)
        .map(|_| {
            lockctl_on(&s)
                .args(["exec", "cost", "-c", "sleep 1"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn waiter")
        })
        .collect();
    wait_queued(&s, "cost", N);
    let o = run(lockctl_on(&s).args(["release", "cost", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    let calls = script_calls(&s);
    eprintln!("{N} waiters holding 1 s each: {calls} script calls");
    assert!(calls < 12 * N, "{calls} script calls for {N} handoffs");
}

/// The queue promise lists `--supersede -n` as bad input: exit 2, and no change in Redis, whether
/// the lock is free or held with waiters queued.
#[test]
fn supersede_with_no_wait_is_refused_as_bad_input() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["acquire", "free", "--supersede", "-n"]));
    assert_eq!(code(&o), 2, "on a free lock: {}{}", stdout(&o), stderr(&o));
    assert!(
        s.keys().is_empty(),
        "keys after a refused --supersede -n: {:?}",
        s.keys()
    );
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_SUPERSEDE", "1")
        .args(["acquire", "free", "-n"]));
    assert_eq!(
        code(&o),
        2,
        "LOCKCTL_SUPERSEDE=1 with -n: {}{}",
        stdout(&o),
        stderr(&o)
    );
    assert!(s.keys().is_empty(), "keys: {:?}", s.keys());
}

/// The same on Redlock over 3 nodes: one node (a minority, which Redlock is meant to ride out)
/// restarts empty while S is stopped for 1.5 s; B re-queues there first, and S's next attempt there
/// must not displace B.
#[test]
fn a_superseding_waiter_requeued_on_a_restarted_node_does_not_displace_newer_waiters() {
    let mut s = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    // The holder talks to the servers only before the restart, which it has just started.
    let token = hold(&mut s.lockctl(), "sup");
    // The waiters talk to a server the test restarts: the quarantine stays on, short (2 s).
    let waiter_cmd = |s: &Servers| {
        let mut c = s.lockctl();
        c.env("LOCKCTL_QUARANTINE", "2s");
        c
    };
    let sup = waiter(&mut waiter_cmd(&s), "sup", &file, "S", &["--supersede"]);
    wait_queued(&s[0], "sup", 1);
    std::thread::sleep(Duration::from_millis(300));
    let newer = waiter(&mut waiter_cmd(&s), "sup", &file, "B", &[]);
    wait_queued(&s[0], "sup", 2);
    std::thread::sleep(Duration::from_millis(300));
    kill(sup.id() as i32, libc::SIGSTOP);
    s[2].restart_empty();
    std::thread::sleep(Duration::from_millis(1500));
    kill(sup.id() as i32, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(1500));
    let o = run(s.lockctl().args(["release", "sup", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(sup, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "S: {}", stderr(&o));
    let o = wait_output(newer, Duration::from_secs(60));
    assert_eq!(
        code(&o),
        0,
        "B, which queued after S, was displaced by S: {}",
        stderr(&o)
    );
    assert_eq!(order(&file), ["S", "B"]);
}

/// A client with another limit is refused while only a waiter of a plain lock is there (the lock
/// free, its head stopped before taking it): exit 2 naming both limits, with or without waiting,
/// and nothing in Redis changes.
#[test]
fn another_limit_is_refused_while_only_a_plain_waiter_is_queued() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "plain");
    let head = waiter(&mut lockctl_on(&s), "plain", &file, "W", &[]);
    wait_queued(&s, "plain", 1);
    kill(head.id() as i32, libc::SIGSTOP);
    let o = run(lockctl_on(&s).args(["release", "plain", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let dump = |s: &Server| {
        let mut keys = s.keys();
        keys.sort();
        let queue: Vec<String> = s.cmd(&["ZRANGE", &queue_key("plain"), "0", "-1", "WITHSCORES"]);
        (keys, queue)
    };
    let before = dump(&s);
    for extra in [&["-n"][..], &["-w", "1s"][..]] {
        let o = run(lockctl_on(&s)
            .args(["acquire", "plain", "--limit", "2", "--ttl", "5s"])
            .args(extra));
        let e = stderr(&o);
        assert_eq!(code(&o), 2, "{extra:?}: {}{e}", stdout(&o));
        assert!(
            e.contains("plain is used with --limit 1") && e.contains("you asked for --limit 2"),
            "{e}"
        );
        assert_eq!(dump(&s), before, "a refused limit changed Redis");
    }
    kill(head.id() as i32, libc::SIGCONT);
    let o = wait_output(head, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "the queued waiter lost: {}", stderr(&o));
    assert_eq!(order(&file), ["W"]);
}

/// `--supersede` with `-w 0` (which is `-n`) is refused too, for `exec` as well, while the lock is
/// held with a waiter queued: exit 2 saying why, the command not run, the queue untouched.
#[test]
fn supersede_with_a_zero_wait_is_refused_and_says_why() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "held");
    let w = waiter(&mut lockctl_on(&s), "held", &file, "W", &[]);
    wait_queued(&s, "held", 1);
    let queue = || s.cmd::<Vec<String>>(&["ZRANGE", &queue_key("held"), "0", "-1", "WITHSCORES"]);
    let before = queue();
    let ran = dir.path().join("ran");
    for cmd in ["acquire", "exec"] {
        let mut c = lockctl_on(&s);
        c.args([cmd, "held", "--supersede", "-w", "0"]);
        if cmd == "exec" {
            c.args(["--", "touch"]).arg(&ran);
        }
        let o = run(&mut c);
        let e = stderr(&o);
        assert_eq!(code(&o), 2, "{cmd}: {}{e}", stdout(&o));
        assert!(
            e.contains("--supersede cannot be used with -w 0")
                && e.contains("only displaces waiters"),
            "{e}"
        );
        assert_eq!(queue(), before, "{cmd}: the queue changed");
    }
    assert!(!ran.exists(), "exec ran its command");
    let o = run(lockctl_on(&s).args(["release", "held", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// On a single node the head of the queue does not poll while the holder holds: the release wakes it
/// on its own channel, so it runs one attempt per heartbeat (1 s), not an exponential backoff from
/// 10 ms (10, 20, 40 ... ms, about 10 attempts in 3 s).
#[test]
fn the_head_on_one_node_sleeps_until_woken_or_its_heartbeat() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "head");
    let head = waiter(&mut lockctl_on(&s), "head", &file, "W", &[]);
    wait_queued(&s, "head", 1);
    let _: () = s.cmd(&["CONFIG", "RESETSTAT"]);
    std::thread::sleep(Duration::from_secs(3));
    let calls = script_calls(&s);
    eprintln!("the head waiting 3 s: {calls} script calls");
    // One per heartbeat over 3 s is 3 or 4, plus the retry right after subscribing.
    assert!(
        calls <= 5,
        "the head ran {calls} attempts in 3 s of waiting"
    );
    let o = run(lockctl_on(&s).args(["release", "head", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(head, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(order(&file), ["W"]);
}

/// On Redlock the head of the queue backs off between attempts, from 10 ms up to its heartbeat (1
/// s), so that split votes spread out without polling: a head waiting 3 s behind a holder costs a
/// node about ten attempts (seven in its first second), not a steady poll (hundreds). With a node
/// down it tries to subscribe there again at most every 5 s, not before every attempt.
fn the_head_on_redlock_backs_off(node_down: bool) {
    let mut s = Servers::start(3);
    if node_down {
        s.0[2].kill();
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut s.lockctl(), "backoff");
    let head = waiter(&mut s.lockctl(), "backoff", &file, "W", &[]);
    for n in &s.0[..2] {
        wait_queued(n, "backoff", 1);
    }
    let _: () = s[0].cmd(&["CONFIG", "RESETSTAT"]);
    std::thread::sleep(Duration::from_secs(3));
    let calls = script_calls(&s[0]);
    eprintln!("the head waiting 3 s on Redlock: {calls} script calls on node 1");
    assert!(
        calls <= 30,
        "the head ran {calls} attempts in 3 s of waiting"
    );
    let o = run(s.lockctl().args(["release", "backoff", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(head, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(order(&file), ["W"]);
}

#[test]
fn the_head_on_redlock_backs_off_to_its_heartbeat() {
    the_head_on_redlock_backs_off(false);
}

#[test]
fn the_head_on_redlock_backs_off_with_a_node_down() {
    // Killed, never restarted: no quarantine matters.
    the_head_on_redlock_backs_off(true);
}

/// Nanoseconds since the epoch, as written by `date +%s%N` into `file`.
fn stamp_in(file: &Path) -> u128 {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("no time stamp in {}", file.display()))
}

/// A waiter far back heartbeats seldom and is kept three of its intervals (up to 90 s), so one that
/// dies (`sig` SIGKILL) or stops (SIGSTOP) there must not hold up the queue that long when its turn
/// comes: moving to the front brings its expiry down to 3 s. D queues behind ten waiters, its expiry
/// is seen stretched past 10 s, it dies; C behind it must get the lock within the documented bound
/// (about 4 s) of the waiter before D giving it up, bounded here generously (15 s).
fn dead_waiter_far_back_does_not_stall(sig: i32) {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "far");
    let mut kids = queue_in_order(&[&s], "far", &file, 9, || lockctl_on(&s));
    // The last waiter before D notes when it gives the lock up, C when it gets it.
    let (before, after) = (dir.path().join("before"), dir.path().join("after"));
    let stamped = |at: &Path| {
        lockctl_on(&s)
            .args(["exec", "far", "-c"])
            .arg(format!("date +%s%N > '{}'", at.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn waiter")
    };
    kids.push(stamped(&before));
    wait_queued(&s, "far", 10);
    let dead = waiter(&mut lockctl_on(&s), "far", &file, "D", &[]);
    wait_queued(&s, "far", 11);
    let last = stamped(&after);
    wait_queued(&s, "far", 12);
    let waiters_key = "{lockctl:far}\u{1f}waiters";
    let alive_key = "{lockctl:far}\u{1f}alive";
    let records: Vec<String> = s.cmd(&["HGETALL", waiters_key]);
    let id = records
        .chunks(2)
        .find(|kv| kv[1].contains(&format!("\"pid\":\"{}\"", dead.id())))
        .map(|kv| kv[0].clone())
        .expect("D's record");
    let now_ms = || {
        let t: Vec<String> = s.cmd(&["TIME"]);
        t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
    };
    let stretched = eventually(Duration::from_secs(30), || {
        let e: Option<String> = s.cmd(&["ZSCORE", alive_key, &id]);
        e.is_some_and(|e| e.parse::<f64>().unwrap() as u64 > now_ms() + 10_000)
    });
    assert!(stretched, "D's heartbeat did not stretch with its place");
    kill(dead.id() as i32, sig);
    let o = run(lockctl_on(&s).args(["release", "far", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    let o = wait_output(last, Duration::from_secs(120));
    assert_eq!(code(&o), 0, "C: {}", stderr(&o));
    let held_up = Duration::from_nanos((stamp_in(&after) - stamp_in(&before)) as u64);
    eprintln!("C got the lock {held_up:?} after the waiter before the dead D had it");
    assert!(
        held_up < Duration::from_secs(15),
        "a dead waiter far back held the queue up {held_up:?} at its turn"
    );
    assert_eq!(order(&file), ["1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    finish_off(dead);
}

#[test]
fn a_killed_waiter_far_back_does_not_stall_the_queue_at_its_turn() {
    dead_waiter_far_back_does_not_stall(libc::SIGKILL);
}

#[test]
fn a_stopped_waiter_far_back_does_not_stall_the_queue_at_its_turn() {
    dead_waiter_far_back_does_not_stall(libc::SIGSTOP);
}

/// The arrival order on Redlock over 3 nodes when one node restarts empty while six waiters are
/// queued (the ones behind the second heartbeat every 2 to 17 s there): they re-queue on it at their
/// tickets. Then another node dies for good, so that the restarted node's queue decides with the
/// third: the order must still be the arrival order.
#[test]
fn a_node_restarted_empty_keeps_the_arrival_order_on_redlock() {
    let mut s = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    // The holder talks to the servers only before the restart, which it has just started.
    let _token = hold(&mut s.lockctl(), "order");
    // The waiters talk to a server the test restarts: the quarantine stays on, short (2 s).
    let waiter_cmd = |s: &Servers| {
        let mut c = s.lockctl();
        c.env("LOCKCTL_QUARANTINE", "2s");
        c
    };
    let mut kids = Vec::new();
    for i in 1..=6u64 {
        kids.push(waiter(
            &mut waiter_cmd(&s),
            "order",
            &file,
            &i.to_string(),
            &[],
        ));
        for n in 0..3 {
            wait_queued(&s[n], "order", i);
        }
        std::thread::sleep(Duration::from_millis(150));
    }
    s[2].kill();
    std::thread::sleep(Duration::from_secs(4));
    s[2].restart_empty();
    // Past the restarted node's quarantine, and every waiter queued there again.
    wait_queued(&s[2], "order", 6);
    std::thread::sleep(Duration::from_secs(3));
    s[0].kill();
    // The holder's key is on the node that died and the one that kept running: broken there.
    let o = run(s.lockctl().args(["break", "order", "--yes"]));
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    all_succeed(kids);
    assert_eq!(
        order(&file),
        ["1", "2", "3", "4", "5", "6"],
        "waiters served out of their arrival order after a node restarted empty"
    );
}

/// The heartbeats of waiters queued behind a long hold cost a bounded rate, not one call per waiter
/// per second: 30 waiters queued, counted for 20 s. The front (2 waiters) beats every second, the
/// ones behind every 2, 5, 10, 17, 26 s, the rest every 30 s: about 3.7 calls a second in all (30 a
/// second before, 600 in the 20 s). Bounded here by 10 a second.
#[test]
fn the_heartbeats_of_a_long_queue_cost_a_bounded_rate() {
    const N: u64 = 30;
    let s = Server::start();
    let token = hold(&mut lockctl_on(&s), "rate");
    let kids: Vec<Child> = (0..N)
        .map(|_| {
            lockctl_on(&s)
                .args(["exec", "rate", "-c", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn waiter")
        })
        .collect();
    wait_queued(&s, "rate", N);
    // Every waiter past its enqueue and the retry after subscribing.
    std::thread::sleep(Duration::from_secs(2));
    let _: () = s.cmd(&["CONFIG", "RESETSTAT"]);
    std::thread::sleep(Duration::from_secs(20));
    let calls = script_calls(&s);
    eprintln!("{N} waiters queued for 20 s: {calls} script calls");
    let o = run(lockctl_on(&s).args(["release", "rate", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    assert!(
        calls < 200,
        "{calls} script calls in 20 s for {N} queued waiters"
    );
}

/// Waiters keep their places through a hold of many heartbeats: each beats within its interval
/// (jittered between 0.8 and 1 of it), far inside the three intervals and the slack for which a
/// node keeps it and its own loop keeps its ticket. Four waiters queue one after another behind a
/// holder that keeps the lock 12 s (twelve heartbeats of the front, six of the third waiter); none
/// may leave the queue meanwhile, and they are served in arrival order. A beat that came up to five
/// intervals late would make the waiter give up its ticket and queue again at the back (and the node
/// drop it when its expiry passed, with the others' heartbeats running there).
#[test]
fn waiters_keep_their_places_through_a_hold_of_many_heartbeats() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "long");
    let kids = queue_in_order(&[&s], "long", &file, 4, || lockctl_on(&s));
    let queued = |s: &Server| s.cmd::<u64>(&["ZCARD", &queue_key("long")]);
    let start = std::time::Instant::now();
    let mut fewest = queued(&s);
    while start.elapsed() < Duration::from_secs(12) {
        fewest = fewest.min(queued(&s));
        std::thread::sleep(Duration::from_millis(100));
    }
    let o = run(lockctl_on(&s).args(["release", "long", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    assert_eq!(fewest, 4, "a waiter left the queue while it waited");
    assert_eq!(
        order(&file),
        ["1", "2", "3", "4"],
        "waiters lost their places while they waited"
    );
}

/// A signalled waiter exits without waiting for Redis (`queue.rs` `leave`, blind): its leave goes
/// out on every node without waiting for the answers, so a node that stopped after its last answer
/// costs the exit nothing; the stopped server runs the leave when it resumes. The waiter stands
/// fifth (its heartbeat interval 10 s), so the signal comes while it sleeps, not during an attempt
/// (which waits for its node timeout in any case); its node timeout is 20 s, which a leave that
/// waited for the stopped node's answer would spend before the exit. The server was started by
/// the test and is only stopped, never restarted.
#[test]
fn a_signalled_waiter_exits_without_waiting_for_a_stopped_node() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "blind");
    let kids = queue_in_order(&[&s], "blind", &file, 4, || lockctl_on(&s));
    let mut fifth = lockctl_on(&s)
        .args([
            "--node-timeout",
            "20s",
            "--verbose",
            "acquire",
            "blind",
            "-w",
            "120s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter");
    let (seen, reader) = stderr_so_far(fifth.stderr.take().unwrap());
    let sleeping = eventually(Duration::from_secs(30), || {
        seen.lock()
            .unwrap()
            .lines()
            .filter_map(|l| l.split("waiting up to ").nth(1))
            .filter_map(|l| l.split(" ms").next()?.parse::<f64>().ok())
            .any(|ms| ms >= 3000.0)
    });
    assert!(sleeping, "no long sleep: {}", seen.lock().unwrap());
    s.pause();
    kill(fifth.id() as i32, libc::SIGTERM);
    let signalled = std::time::Instant::now();
    let o = wait_output(fifth, Duration::from_secs(60));
    let took = signalled.elapsed();
    s.resume();
    reader.join().unwrap();
    let said = seen.lock().unwrap().clone();
    // The resumed server runs the leave. The others are served before any verdict, so that a
    // failure leaves no waiter behind.
    let left = eventually(Duration::from_secs(30), || {
        s.cmd::<u64>(&["ZCARD", &queue_key("blind")]) == 4
    });
    let released = run(lockctl_on(&s).args(["release", "blind", "--token", &token]));
    all_succeed(kids);
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    assert_eq!(code(&o), 143, "{said}");
    assert!(left, "the signalled waiter is still queued: {said}");
    assert!(
        took < Duration::from_secs(10),
        "the signalled waiter took {took:?} to exit: {said}"
    );
    assert!(
        said.contains("given up without waiting for the answer"),
        "{said}"
    );
    assert_eq!(order(&file), ["1", "2", "3", "4"]);
}

/// A Redlock waiter that queues anew after a lapse puts one ticket on every node before it waits:
/// the nodes give it tickets from their own clocks, which differ, and docs/queue.md has it send the
/// largest at once ("which puts it on a quorum before it waits"). X, second in the queue (1 s
/// heartbeats, node timeout 500 ms: dropped 4 s after its last attempt), is stopped (SIGSTOP)
/// until six later waiters have queued and every node dropped it; resumed, it gives up its ticket
/// and queues again, eighth, where its heartbeat is 30 s. Within 10 s of the resume every node
/// must hold it at the same ticket. (The stop also drops its wake subscriptions: their reads fail
/// with EINTR at the SIGCONT, see signal(7). So its first wait subscribes again and retries at
/// once, which evens the tickets even without `Engine::acquire`'s own resend.)
#[test]
fn a_waiter_queued_anew_after_a_lapse_has_one_ticket_on_every_node() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "relapse";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let lc = || {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", "500ms");
        c
    };
    let members = |n: &Server| n.cmd::<Vec<String>>(&["ZRANGE", &queue_key(name), "0", "-1"]);
    let token = hold(&mut lc(), name);
    let mut kids = vec![waiter(&mut lc(), name, &file, "W1", &[])];
    for n in &all {
        wait_queued(n, name, 1);
    }
    let w1 = members(&s[0]);
    let x = waiter(&mut lc(), name, &file, "X", &[]);
    for n in &all {
        wait_queued(n, name, 2);
    }
    let x_id = members(&s[0])
        .into_iter()
        .find(|m| !w1.contains(m))
        .unwrap();
    kill(x.id() as i32, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(5));
    for k in 2..=7 {
        kids.push(waiter(&mut lc(), name, &file, &format!("W{k}"), &[]));
    }
    let dropped = eventually(Duration::from_secs(30), || {
        all.iter()
            .all(|n| n.cmd::<u64>(&["ZCARD", &queue_key(name)]) == 7 && !members(n).contains(&x_id))
    });
    kill(x.id() as i32, libc::SIGCONT);
    let resumed = std::time::Instant::now();
    let score = |n: &Server| n.cmd::<Option<String>>(&["ZSCORE", &queue_key(name), &x_id]);
    let mut scores = Vec::new();
    let even = eventually(Duration::from_secs(10), || {
        scores = all.iter().map(|n| score(n)).collect();
        scores[0].is_some() && scores.iter().all(|t| *t == scores[0])
    });
    let took = resumed.elapsed();
    let o = run(lc().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    kids.push(x);
    all_succeed(kids);
    assert!(
        dropped,
        "X was not dropped on every node while it was stopped"
    );
    assert!(
        even,
        "X's tickets still differ {took:?} after the resume: {scores:?}"
    );
}
