//! Fourth review of the queue, against the stall rule that moves only the expiries that passed in a
//! gap, once (`front.lua`, `keep_time`): cases where a live waiter loses its place or a dead one is
//! kept longer than the docs say. Real servers, real signals.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::queue::{
    all_succeed, in_order_every_round, order, queue_key, served_after_a_stall, waiter,
};
use support::*;

/// The `seen` key of lock `name` under the default prefix.
fn seen_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}seen")
}

/// Docs (queue.md, "A node that stalls"): a live waiter keeps its place through a stall of any
/// length. `seen` used to be written only by a script that found the queue's key already there, so
/// the script that created the queue (the first waiter's enqueue) left none until the next script.
/// The node is stopped as soon as the first waiter is queued, for 6 s (longer than its 4 s
/// lifetime), while a second waiter starts; the lease ends during the stall. The window is short
/// (the waiter attempts again right after it subscribes): `seen` was already there at the stop in
/// 10 of 11 rounds, and the one round that found none still kept the order; on a busier machine
/// later, none in 2 of 3 rounds and `2 1` once in 3. The enqueue now writes `seen` too: there at the
/// stop in 6 rounds of 6, all in order.
#[test]
fn a_stall_right_after_the_first_waiter_queued_keeps_the_arrival_order() {
    in_order_every_round(3, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("fresh{round}");
        let o = run(lockctl_on(&s).args(["acquire", &name, "--ttl", "3s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let first = waiter(&mut lockctl_on(&s), &name, &file, "1", &[]);
        let ok = eventually(Duration::from_secs(30), || {
            s.cmd::<u64>(&["ZCARD", &queue_key(&name)]) == 1
        });
        assert!(ok, "the first waiter was not queued");
        let seen = s.get(&seen_key(&name));
        s.pause();
        let paused = Instant::now();
        let second = waiter(&mut lockctl_on(&s), &name, &file, "2", &[]);
        std::thread::sleep(Duration::from_millis(6000));
        s.resume();
        eprintln!(
            "round {round}: seen at the stop {seen:?}, stalled {:?}",
            paused.elapsed()
        );
        all_succeed([first, second]);
        order(&file)
    });
}

/// Docs (queue.md, "A node that stalls"): a live waiter keeps its place through a stall of any
/// length, also one that does not listen on its wake channel. The stall rule (`front.lua`,
/// `moved_expiry`) kept only the waiters that listened at the resume, taking one that did not for
/// dead; but a waiter whose SUBSCRIBE failed (it tries again every 5 s) lives and listens nowhere.
/// It was dropped at the resume, and a waiter that came during the stall took the lock first. (A
/// waiter stopped with the node between its enqueue and its SUBSCRIBE, which the test above met
/// once in a full run, still counts as listening: docs/queue.md.) Here the first waiter's SUBSCRIBE is refused (the
/// server's `maxclients` leaves room for its command connection only), and it is stopped for 1.5 s
/// across the resume, as a loaded machine may do, so that the second one's next attempt comes
/// first: `2 1` in 7 rounds of 8 (two runs) on the code before, `1 2` in 10 of 10 since the record says
/// whether its last attempt listened (`sub`), and only one that listened and no longer does is
/// dropped. Control: with the subscription made, `1 2` in 6 of 6 on the code before.
#[test]
fn a_waiter_not_yet_listening_keeps_its_place_through_a_stall() {
    in_order_every_round(4, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("deaf{round}");
        let o = run(lockctl_on(&s).args(["acquire", &name, "--ttl", "3s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        // This connection and the waiter's command connection; its subscription is refused.
        let mut admin = s.conn();
        let set_max = |c: &mut redis::Connection, n: &str| {
            let _: () = redis::cmd("CONFIG")
                .arg(&["SET", "maxclients", n])
                .query(c)
                .unwrap();
        };
        set_max(&mut admin, "2");
        let first = waiter(&mut lockctl_on(&s), &name, &file, "1", &[]);
        let queued = eventually(Duration::from_secs(30), || {
            redis::cmd("ZCARD")
                .arg(queue_key(&name))
                .query::<u64>(&mut admin)
                .is_ok_and(|n| n == 1)
        });
        assert!(queued, "the first waiter was not queued");
        // Past its SUBSCRIBE, which the server refused.
        std::thread::sleep(Duration::from_millis(500));
        let channels: Vec<String> = redis::cmd("PUBSUB")
            .arg(&["CHANNELS", "*"])
            .query(&mut admin)
            .unwrap();
        assert!(channels.is_empty(), "it subscribed: {channels:?}");
        set_max(&mut admin, "10000");
        s.pause();
        let second = waiter(&mut lockctl_on(&s), &name, &file, "2", &[]);
        std::thread::sleep(Duration::from_millis(6000));
        kill(first.id() as i32, libc::SIGSTOP);
        s.resume();
        std::thread::sleep(Duration::from_millis(1500));
        kill(first.id() as i32, libc::SIGCONT);
        all_succeed([first, second]);
        order(&file)
    });
}

/// Docs (queue.md, "A node that stalls"): a stall shorter than the queue keys' floor keeps the
/// live waiters. The queue's keys used to live only a front lifetime past the longest expiry, and
/// `seen` takes the queue's TTL (front.lua, `keep_time`): 9.5 s left at the stop here, so a 10 s
/// stall outlasted them all, since Redis expires keys by the wall clock. At the resume the node had
/// no queue and no `seen`; the lease ended during the stall, and whichever waiter's attempt the
/// server ran first took the lock, the tickets the waiters carry notwithstanding. Seen: out of
/// order in 4 of 13 rounds over four runs (`2 3 1`, `2 1 3` three times; 3 of them with the file's
/// other tests running beside it), hence six rounds. Since the floor (acquire.lua, `keep`: at least
/// a far-back lifetime and a front lifetime, 94 s left at the stop): in order in every round.
#[test]
fn a_ten_second_stall_keeps_the_arrival_order() {
    in_order_every_round(6, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        served_after_a_stall(&[&s], &[&s], &format!("long{round}"), 10, || lockctl_on(&s))
    });
}

/// The same on Redlock 3, all nodes stopped together: each node keeps its queue and `seen` through
/// the stall and decides alone at its resume.
#[test]
fn a_ten_second_stall_of_every_node_keeps_the_arrival_order_on_redlock() {
    in_order_every_round(3, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for these servers the test started itself.
        let s = Servers::start(3);
        let nodes: Vec<&Server> = s.0.iter().collect();
        served_after_a_stall(&nodes, &nodes, &format!("rlong{round}"), 10, || s.lockctl())
    });
}

/// Docs (queue.md, "Keys" and "A node that stalls"): the queue's keys live at least a far-back
/// lifetime and a front lifetime after the last heartbeat (95 s with the default node timeout), so
/// that a stall shorter than that keeps the order; a queue whose waiters all died (SIGKILL: no
/// leave, and nothing runs a script on it afterwards) must still leave nothing behind after that
/// bound, and `status` must not list the dead meanwhile. One node and Redlock 3.
fn an_abandoned_queue_leaves_no_key_after_the_floor(
    nodes: &[&Server],
    lockctl: impl Fn() -> Command,
) {
    let name = "abandoned";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = support::queue::hold(&mut lockctl(), name);
    let kids = support::queue::queue_in_order(nodes, name, &file, 3, &lockctl);
    // Each waiter's attempt after it subscribed (its last heartbeat here).
    std::thread::sleep(Duration::from_secs(1));
    for k in &kids {
        kill(k.id() as i32, libc::SIGKILL);
    }
    let killed = Instant::now();
    for k in kids {
        support::queue::finish_off(k);
    }
    // The release runs a script on the queue while the dead waiters' expiries are still ahead:
    // nothing is dropped, and nothing runs on the queue after it.
    let o = run(lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for s in nodes {
        let ttl: i64 = s.cmd(&["PTTL", &queue_key(name)]);
        // Set at the waiters' last heartbeats: 90 s, 1 s of slack and a 4 s front lifetime.
        assert!(
            ttl > 60_000 && ttl <= 95_000,
            "the queue's TTL after the kill: {ttl} ms"
        );
    }
    // Their expiries pass within 7 s of their last heartbeats (the third waiter's interval is
    // 2 s), and their subscriptions ended with them.
    std::thread::sleep(Duration::from_secs(9));
    let o = run(lockctl().args(["status", name, "--format", "json"]));
    let st: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("status json");
    assert_eq!(st["waiters"], serde_json::json!([]), "{st}");
    let bound = Duration::from_secs(95);
    let gone = eventually(Duration::from_secs(130), || {
        nodes
            .iter()
            .all(|s| s.keys().iter().all(|k| k.ends_with("\u{1f}fence")))
    });
    let took = killed.elapsed();
    let left: Vec<Vec<String>> = nodes.iter().map(|s| s.keys()).collect();
    assert!(
        gone,
        "keys left 130 s after the waiters were killed: {left:?}"
    );
    eprintln!("the abandoned queue's keys were gone {took:?} after the kill");
    assert!(
        took <= bound + Duration::from_secs(10),
        "the abandoned queue's keys lived {took:?} after the kill (bound: {bound:?} after the last heartbeat)"
    );
}

#[test]
fn an_abandoned_queue_leaves_no_key_after_the_floor_on_one_node() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    an_abandoned_queue_leaves_no_key_after_the_floor(&[&s], || lockctl_on(&s));
}

#[test]
fn an_abandoned_queue_leaves_no_key_after_the_floor_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    an_abandoned_queue_leaves_no_key_after_the_floor(&nodes, || s.lockctl());
}

/// Docs (queue.md, "Liveness"): a dead waiter delays the next one by at most about 5 s when its
/// turn comes, and a stopped one by about one heartbeat more (6 s). `stopped` waiters are
/// SIGSTOPped ahead of a live one and the lock is released. The live waiter stands at place
/// `stopped`, where it heartbeats rarely (26 s at place 6, 30 s from place 7 on), and nothing else
/// runs a script on the queue, so the gap between two scripts is about that long. A stopped waiter
/// still listens on its wake channel, so each one whose expiry passes in such a gap is moved
/// (`front.lua`, `keep_time`): it used to move by the whole gap, up to 30 s a move; now to a front
/// lifetime from now, and the live waiter is told to beat at the front's pace while it is pending.
/// The live waiter is measured against the documented 6 s per stopped waiter, with 10 s to spare;
/// the failure message carries a trace of the expiries and of `seen`.
fn stopped_waiters_hold_up_about_six_seconds_each(stopped: u64) {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = &format!("ctrlz{stopped}");
    let token = support::queue::hold(&mut lockctl_on(&s), name);
    let mut kids =
        support::queue::queue_in_order(&[&s], name, &file, stopped + 1, || lockctl_on(&s));
    // Each waiter's attempt after it subscribed earns its place's interval.
    std::thread::sleep(Duration::from_secs(1));
    let live = kids.pop().unwrap();
    for k in &kids {
        kill(k.id() as i32, libc::SIGSTOP);
    }
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let released = Instant::now();
    let documented = Duration::from_secs(6 * stopped + 10);
    // Each change of the expiries (ms after `seen`'s first value) and of `seen`, to show the moves.
    let alive = format!("{{lockctl:{name}}}\u{1f}alive");
    let mut trace: Vec<String> = Vec::new();
    let mut last = String::new();
    let base: Option<String> = s.get(&seen_key(name));
    let base: i64 = base.and_then(|b| b.parse().ok()).unwrap_or(0);
    let got = eventually(Duration::from_secs(120), || {
        let scores: Vec<(String, f64)> = s.cmd(&["ZRANGE", &alive, "0", "-1", "WITHSCORES"]);
        let seen: Option<String> = s.get(&seen_key(name));
        let seen = seen.and_then(|v| v.parse::<i64>().ok()).map(|v| v - base);
        let now = format!(
            "seen {seen:?} expiries {:?}",
            scores
                .iter()
                .map(|(_, e)| e - base as f64)
                .collect::<Vec<_>>()
        );
        if now != last {
            trace.push(format!("{:.1}s: {now}", released.elapsed().as_secs_f64()));
            last = now;
        }
        !order(&file).is_empty()
    });
    let took = released.elapsed();
    let trace = trace.join("\n");
    for k in kids {
        support::queue::finish_off(k);
    }
    support::queue::finish_off(live);
    assert!(
        got,
        "the live waiter was not served within 120 s of the release"
    );
    eprintln!("the live waiter was served {took:?} after the release");
    assert_eq!(order(&file), [(stopped + 1).to_string()]);
    assert!(
        took <= documented,
        "the live waiter was served {took:?} after the release, behind {stopped} stopped ones \
         (documented: about 6 s each, {documented:?} with the margin); trace:\n{trace}"
    );
}

/// Seen: served 38.8 to 43.8 s after the release in 4 runs when moves were by the gap (36 s
/// documented, 46 s with the margin); 29.0 to 31.9 s in 5 runs since.
#[test]
fn six_stopped_waiters_ahead_of_a_live_one_hold_it_up_about_six_seconds_each() {
    stopped_waiters_hold_up_about_six_seconds_each(6);
}

/// Seen when moves were by the gap: served 66.2 to 74.6 s after the release (48 s documented, 58 s
/// with the margin), 4 runs of 4. The trace of one: the first script came 23.4 s after the release
/// (the live waiter's beat) and moved the four passed expiries by 23.4 s (3.7 s to 27.1 s after
/// the release, the head's); the next long gap (29.0 s to 50.1 s) moved the next one by 21 s.
/// Since: 37.4 to 40.7 s in 6 runs.
#[test]
fn eight_stopped_waiters_ahead_of_a_live_one_hold_it_up_about_six_seconds_each() {
    stopped_waiters_hold_up_about_six_seconds_each(8);
}

/// Docs (queue.md, "A node that stalls"): a live waiter keeps its place through a stall; a moved
/// expiry is marked and its waiter's next heartbeat clears the mark. Two stalls of 6 s (longer than
/// a front lifetime), about 50 ms apart: if the head does not beat in between (its timed-out attempts
/// were rolled back, the connection closed, and it waits before trying again), its expiry, moved
/// once at the first resume, passes again during the second stall and counts as its own: the
/// release right after the second resume drops it and wakes the second waiter. Seen: 50 ms after
/// the first resume both waiters had already beaten (their attempts buffered in the stopped server
/// ran first; integer scores, no mark), and the order held in 4 rounds of 4.
#[test]
fn two_stalls_in_a_row_keep_the_arrival_order() {
    in_order_every_round(4, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("twice{round}");
        let token = support::queue::hold(&mut lockctl_on(&s), &name);
        let kids = support::queue::queue_in_order(&[&s], &name, &file, 2, || lockctl_on(&s));
        std::thread::sleep(Duration::from_millis(1500));
        s.pause();
        std::thread::sleep(Duration::from_secs(6));
        s.resume();
        std::thread::sleep(Duration::from_millis(50));
        let alive = format!("{{lockctl:{name}}}\u{1f}alive");
        let between: Vec<(String, String)> = s.cmd(&["ZRANGE", &alive, "0", "-1", "WITHSCORES"]);
        s.pause();
        std::thread::sleep(Duration::from_secs(6));
        s.resume();
        let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        all_succeed(kids);
        eprintln!("round {round}: between the stalls {between:?}");
        order(&file)
    });
}

/// Docs (queue.md, "A node that stalls"): an expiry that passes while scripts keep running on the
/// node is the waiter's own, not a stall's. A stopped head with a live waiter right behind it, which
/// beats every second at the front: when the head's expiry passes, the live one's last heartbeat ran
/// within two heartbeats before it, so the head is dropped, not moved (a moved score ends in half a
/// millisecond), and the live one is served after the release. Before, every expiry that passed
/// between two scripts was moved once, so a stopped waiter at the front cost a move more.
#[test]
fn a_stopped_head_with_a_live_waiter_behind_it_is_dropped_not_moved() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = "stophead";
    let token = support::queue::hold(&mut lockctl_on(&s), name);
    let mut kids = support::queue::queue_in_order(&[&s], name, &file, 2, || lockctl_on(&s));
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key(name), "0", "-1"]);
    let live = kids.pop().unwrap();
    let stopped = kids.pop().unwrap();
    kill(stopped.id() as i32, libc::SIGSTOP);
    let alive = format!("{{lockctl:{name}}}\u{1f}alive");
    let mut scores: Vec<String> = Vec::new();
    let gone = eventually(Duration::from_secs(60), || {
        let score: Option<String> = s.cmd(&["ZSCORE", &alive, &ids[0]]);
        match score {
            Some(v) => {
                if scores.last() != Some(&v) {
                    scores.push(v);
                }
                false
            }
            None => true,
        }
    });
    support::queue::finish_off(stopped);
    assert!(
        gone,
        "the stopped head was never dropped: scores {scores:?}"
    );
    eprintln!("the stopped head's scores until it was dropped: {scores:?}");
    assert!(
        scores.iter().all(|v| !v.contains('.')),
        "the stopped head was moved instead of dropped: scores {scores:?}"
    );
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed([live]);
    assert_eq!(order(&file), ["2"]);
}

/// Docs (queue.md, "Stopped waiters ahead of a live one far back"): while a moved waiter is pending
/// at the front, the waiters behind it are told to beat at the front's pace, so that a script runs
/// when its moved expiry passes. Five stopped waiters ahead of a live one at place 5, which beats
/// every 17 s or so: its first heartbeat after the head's expiry passed moves the head (a score
/// ending in half a millisecond); the head must then be dropped within a front lifetime (4 s) and a
/// heartbeat, bounded here by 10 s, not at the live waiter's next heartbeat of its own (13.6 to 17 s
/// later). So must the next stopped one that its drop brings to the front, woken there (a score
/// ending in a quarter of a millisecond). The live waiter keeps its place.
fn moved_head_dropped_within_a_front_lifetime(nodes: &[&Server], lockctl: impl Fn() -> Command) {
    let s = nodes[0];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = "movedhead";
    let _token = support::queue::hold(&mut lockctl(), name);
    let mut kids = support::queue::queue_in_order(nodes, name, &file, 6, &lockctl);
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key(name), "0", "-1"]);
    let live = kids.pop().unwrap();
    for k in &kids {
        kill(k.id() as i32, libc::SIGSTOP);
    }
    let alive = format!("{{lockctl:{name}}}\u{1f}alive");
    let score = |id: &str| -> Option<String> { s.cmd(&["ZSCORE", &alive, id]) };
    // Nothing runs on the queue as its expiry passes, so it is moved, not dropped.
    let moved = eventually(Duration::from_secs(60), || {
        score(&ids[0]).is_none_or(|v| v.ends_with(".5"))
    });
    let moved_at = Instant::now();
    assert!(
        moved && score(&ids[0]).is_some(),
        "the stopped head was not moved within 60 s (dropped: {})",
        score(&ids[0]).is_none()
    );
    let dropped = eventually(Duration::from_secs(60), || score(&ids[0]).is_none());
    let took = moved_at.elapsed();
    // The stopped waiters brought to the front after it are woken and pending (a quarter).
    let mut clamped = None;
    let woken = eventually(Duration::from_secs(60), || {
        clamped = ids[1..5]
            .iter()
            .find(|id| score(id).is_some_and(|v| v.ends_with(".25")))
            .cloned();
        clamped.is_some()
    });
    let woken_at = Instant::now();
    let gone = woken
        && eventually(Duration::from_secs(60), || {
            score(&ids[0]).is_none() && clamped.as_deref().is_none_or(|id| score(id).is_none())
        });
    let took_woken = woken_at.elapsed();
    let live_score = score(&ids[5]);
    for k in kids {
        support::queue::finish_off(k);
    }
    support::queue::finish_off(live);
    assert!(dropped, "the moved head was not dropped within 60 s");
    eprintln!("the moved head was dropped {took:?} after it was moved; the next woken one {took_woken:?} after it was woken");
    assert!(
        took < Duration::from_secs(10),
        "the moved head was dropped {took:?} after it was moved (a front lifetime and a heartbeat \
         documented)"
    );
    assert!(
        woken,
        "no stopped waiter was woken to the front (a score ending in .25)"
    );
    assert!(
        gone && took_woken < Duration::from_secs(10),
        "the stopped waiter woken to the front was dropped {took_woken:?} after (gone: {gone}; a \
         front lifetime and a heartbeat documented)"
    );
    assert!(live_score.is_some(), "the live waiter lost its place");
}

#[test]
fn a_moved_head_is_dropped_within_a_front_lifetime_with_only_a_far_waiter_beating() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    moved_head_dropped_within_a_front_lifetime(&[&s], || lockctl_on(&s));
}

/// The same on Redlock 3: each node moves and drops the head alone, and the hint of any node makes
/// the live waiter beat on all of them (the expiries are looked at on the first node).
#[test]
fn a_moved_head_is_dropped_within_a_front_lifetime_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    moved_head_dropped_within_a_front_lifetime(&nodes, || s.lockctl());
}

/// A waiter for `name` queued behind the holder, then SIGKILLed, and given time for its expiry (a
/// front lifetime, 4 s, from its last heartbeat) to pass: it is dead in the queue, not yet dropped.
fn a_dead_waiter(s: &Server, name: &str, file: &std::path::Path) {
    let k = waiter(&mut lockctl_on(s), name, file, "dead", &[]);
    support::queue::wait_queued(s, name, 1);
    // Its attempt after it subscribed.
    std::thread::sleep(Duration::from_secs(1));
    kill(k.id() as i32, libc::SIGKILL);
    support::queue::finish_off(k);
    std::thread::sleep(Duration::from_secs(6));
}

/// The queue's keys of `name` left on `s` (the lock's own keys and the fence counter aside).
fn queue_keys_left(s: &Server, name: &str) -> Vec<String> {
    let prefix = format!("{{lockctl:{name}}}\u{1f}");
    s.keys()
        .into_iter()
        .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
        .filter(|k| !["fence", "holder"].contains(&k.as_str()))
        .collect()
}

/// Docs (queue.md, "Keys"): the queue's keys live at least 95 s after the last heartbeat (the
/// floor), but a script that drops the last waiter does not leave them to that: an attempt with
/// `-n` on a held lock takes every one along, a release or a break all but the ticket counter
/// (their scripts are not given it; it goes with its TTL).
#[test]
fn a_script_that_drops_the_last_waiter_takes_the_queue_keys_along() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = "emptied";
    let token = support::queue::hold(&mut lockctl_on(&s), name);
    a_dead_waiter(&s, name, &file);
    assert!(
        !queue_keys_left(&s, name).is_empty(),
        "the dead waiter's keys went early"
    );
    let o = run(lockctl_on(&s).args(["acquire", name, "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert_eq!(queue_keys_left(&s, name), Vec::<String>::new(), "after -n");

    a_dead_waiter(&s, name, &file);
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(queue_keys_left(&s, name), ["tickets"], "after the release");

    let _ = support::queue::hold(&mut lockctl_on(&s), name);
    a_dead_waiter(&s, name, &file);
    let o = run(lockctl_on(&s).args(["break", name, "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(queue_keys_left(&s, name), ["tickets"], "after the break");
    assert!(order(&file).is_empty(), "a killed waiter ran");
}
