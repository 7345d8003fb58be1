//! Seventh review of the queue, against the queue keys' floor (acquire.lua, `keep`: a far-back and
//! a front lifetime, 95 s by default): stalls of the node up to that bound keep the arrival order,
//! and what the longer life leaves behind. Real servers, real signals.

mod support;

use std::process::Command;
use std::time::Duration;

use support::queue::{all_succeed, in_order_every_round, order, queue_key, served_after_a_stall};
use support::*;

/// Docs (queue.md, "How long a stall is covered"): "a stall of up to about 93 s keeps the order".
/// The stall tests here held: 94.3-94.5 s left on the keys at the stop, in order in every run.
#[test]
#[ignore = "long (70 s), run by hand with --ignored: the 88 s stall on Redlock 3 below runs in every suite, the ten-second stalls of queue_review4.rs hold the rule and its floor is read there (PTTL)"]
fn a_sixty_second_stall_keeps_the_arrival_order() {
    in_order_every_round(1, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        served_after_a_stall(&[&s], &[&s], &format!("s60_{round}"), 60, || lockctl_on(&s))
    });
}

/// The same near the bound: 88 s, with at least 93 s left on the keys at the stop.
#[test]
#[ignore = "long (100 s), run by hand with --ignored: the 88 s stall on Redlock 3 below runs in every suite, the ten-second stalls of queue_review4.rs hold the rule and its floor is read there (PTTL)"]
fn an_eighty_eight_second_stall_keeps_the_arrival_order() {
    in_order_every_round(1, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        served_after_a_stall(&[&s], &[&s], &format!("s88_{round}"), 88, || lockctl_on(&s))
    });
}

/// Redlock 3, every node stopped for 88 s.
#[test]
fn an_eighty_eight_second_stall_of_every_node_keeps_the_arrival_order_on_redlock() {
    in_order_every_round(1, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for these servers the test started itself.
        let s = Servers::start(3);
        let nodes: Vec<&Server> = s.0.iter().collect();
        served_after_a_stall(&nodes, &nodes, &format!("r88_{round}"), 88, || s.lockctl())
    });
}

/// Redlock 3, one node stopped for 60 s: the other two keep the order, and the stalled one must not
/// let a waiter in out of turn at its resume.
#[test]
#[ignore = "long (70 s), run by hand with --ignored: the 88 s stall of every node on Redlock 3 runs in every suite"]
fn a_sixty_second_stall_of_one_node_keeps_the_arrival_order_on_redlock() {
    in_order_every_round(1, &["1", "2", "3"], |round| {
        // Never restarted: the quarantine is off for these servers the test started itself.
        let s = Servers::start(3);
        let nodes: Vec<&Server> = s.0.iter().collect();
        served_after_a_stall(&nodes, &nodes[..1], &format!("r60_{round}"), 60, || {
            s.lockctl()
        })
    });
}

/// Two holders of a `--limit 2` semaphore with 60 s leases and a waiter queued behind them that is
/// SIGKILLed; the first slot is released at once (the waiter's expiry is still ahead: it stays
/// queued), then the waiter's expiry passes (a front lifetime, 4 s, after its last heartbeat) with
/// no script run on the queue; with `both`, the second slot is released at once too. Returns the
/// second holder's token.
fn a_semaphore_with_a_dead_waiter(
    nodes: &[&Server],
    name: &str,
    both: bool,
    lockctl: impl Fn() -> Command,
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let ([first, second], w) =
        support::queue::a_full_semaphore_of_two_with_a_waiter(nodes, &lockctl, name, &file, "dead");
    kill(w.id() as i32, libc::SIGKILL);
    support::queue::finish_off(w);
    let early = if both {
        vec![&first, &second]
    } else {
        vec![&first]
    };
    for token in early {
        let o = run(lockctl().args(["release", name, "--token", token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    for s in nodes {
        let queued: u64 = s.cmd(&["ZCARD", &queue_key(name)]);
        assert_eq!(queued, 1, "the dead waiter went before its expiry");
    }
    std::thread::sleep(Duration::from_secs(6));
    assert!(order(&file).is_empty(), "a killed waiter ran");
    second
}

/// What is left of `name` once nothing is held and nobody waits: a plain `acquire -n` must be
/// granted (exit 0), `status` must list no waiter, and no node may keep the `limit` key after that
/// grant (a plain lock keeps none); with `forgotten`, none may keep it before either (the script
/// that ended the last use deleted it, as docs/queue.md says, rather than the next attempt).
fn nothing_held_nobody_waits(
    nodes: &[&Server],
    name: &str,
    after: &str,
    forgotten: bool,
    lockctl: impl Fn() -> Command,
) {
    let limit_key = format!("{{lockctl:{name}}}\u{1f}limit");
    let pttl: Vec<i64> = nodes.iter().map(|s| s.cmd(&["PTTL", &limit_key])).collect();
    if forgotten {
        assert!(
            pttl.iter().all(|&t| t == -2),
            "after {after} the limit key is still there: pttl {pttl:?} ms"
        );
    }
    let o = run(lockctl().args(["status", name, "--format", "json"]));
    let st: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("status json");
    eprintln!(
        "after {after}: limit key pttl {pttl:?} ms; status: state {}, limit {}, waiters {}",
        st["state"], st["limit"], st["waiters"]
    );
    assert_eq!(st["waiters"], serde_json::json!([]), "{st}");
    let o = run(lockctl().args(["acquire", name, "-n", "--ttl", "5s"]));
    assert_eq!(
        code(&o),
        0,
        "a plain acquire after {after}, with nothing held and nobody waiting: {}",
        stderr(&o)
    );
    let pttl: Vec<i64> = nodes.iter().map(|s| s.cmd(&["PTTL", &limit_key])).collect();
    assert!(
        pttl.iter().all(|&t| t == -2),
        "a plain lock's grant left the limit key: pttl {pttl:?} ms"
    );
}

/// Docs (queue.md, "The limit must agree"): the `limit` key records N "while any slot of a
/// semaphore is held", and "the release or break of the last slot deletes it"; ("How long a stall
/// is covered") "a semaphore's dead queue does not refuse a client with another N". The release
/// of the last slot deletes the key only when the queue is empty (release.lua:46), which it checks
/// before it drops the waiters whose expiry passed (release.lua:68): the dead waiter's drop
/// empties the queue after the check, and the key stays for the rest of the holders' lease.
/// Seen: 52.9 s left on the key, `status` says free, no waiters, limit 2, and a plain `acquire -n`
/// exits 2 ("is used with --limit 2").
#[test]
fn the_last_release_forgets_the_limit_when_it_drops_the_last_waiter() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "pool_release";
    let second = a_semaphore_with_a_dead_waiter(&[&s], name, false, || lockctl_on(&s));
    let o = run(lockctl_on(&s).args(["release", name, "--token", &second]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    nothing_held_nobody_waits(&[&s], name, "the last release", true, || lockctl_on(&s));
}

/// The same on Redlock 3: every node keeps the key.
#[test]
fn the_last_release_forgets_the_limit_when_it_drops_the_last_waiter_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    let name = "rpool_release";
    let second = a_semaphore_with_a_dead_waiter(&nodes, name, false, || s.lockctl());
    let o = run(s.lockctl().args(["release", name, "--token", &second]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    nothing_held_nobody_waits(&nodes, name, "the last release", true, || s.lockctl());
}

/// The same through `break` (break.lua:32 checks the queue before break.lua:52 drops the dead).
#[test]
fn a_break_forgets_the_limit_when_it_drops_the_last_waiter() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "pool_break";
    let _second = a_semaphore_with_a_dead_waiter(&[&s], name, false, || lockctl_on(&s));
    let o = run(lockctl_on(&s).args(["break", name, "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    nothing_held_nobody_waits(&[&s], name, "the break", true, || lockctl_on(&s));
}

/// Docs (queue.md, "How long a stall is covered"): past the bound "the queue is lost as a restart
/// without data would lose it: the waiters come back at their tickets with their next attempts, but
/// a free lock goes to the first of them to arrive". Order is not promised then; mutual exclusion
/// and every waiter's turn are. A 98 s stop of the only node, with about 94.4 s left on the keys.
#[test]
#[ignore = "long (110 s), run by hand with --ignored: past the floor the queue is lost as by a restart without data (queue_review.rs holds that), and the lock key alone keeps the holders apart"]
fn a_stall_past_the_bound_loses_only_the_order() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "past";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let guard = dir.path().join("held");
    let o = run(lockctl_on(&s).args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let kids: Vec<_> = (1..=3u64)
        .map(|i| {
            let child = lockctl_on(&s)
                .args(["exec", name, "-c"])
                .arg(format!(
                    "mkdir '{g}' || echo overlap >> '{f}'; echo {i} >> '{f}'; sleep 0.3; rmdir '{g}'",
                    g = guard.display(),
                    f = file.display()
                ))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn waiter");
            support::queue::wait_queued(&s, name, i);
            child
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let ttl: i64 = s.cmd(&["PTTL", &queue_key(name)]);
    s.pause();
    std::thread::sleep(Duration::from_secs(98));
    s.resume();
    all_succeed(kids);
    let got = order(&file);
    eprintln!("queue ttl at the stop {ttl} ms; served {got:?}");
    assert!(
        !got.contains(&"overlap".to_string()),
        "two held at once: {got:?}"
    );
    let mut sorted = got.clone();
    sorted.sort();
    assert_eq!(sorted, ["1", "2", "3"], "{got:?}");
}

/// The same when both slots are released while the killed waiter's expiry is still ahead (the
/// release keeps the key: a waiter is queued), and a plain attempt drops it after its expiry: the
/// attempt empties the queue (acquire.lua:133-141) and then finds the key (acquire.lua:147), set to
/// the holders' 60 s lease at their grants (acquire.lua:388), which no script deletes once the last
/// waiter is dropped with no slot held. Seen: 52.9 s left on the key, `status` free with limit 2 and
/// no waiter, and the plain `acquire -n` exits 2.
#[test]
fn a_plain_attempt_that_drops_the_last_waiter_is_not_refused_by_its_limit() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "pool_attempt";
    let _second = a_semaphore_with_a_dead_waiter(&[&s], name, true, || lockctl_on(&s));
    nothing_held_nobody_waits(&[&s], name, "the releases", false, || lockctl_on(&s));
}

/// Docs (queue.md, "How long a stall is covered"): with the floor, a queue whose only waiter is
/// stopped outlives a quiet minute, and its first script after it takes the gap for a possible
/// stall of the node and moves the stopped waiter once; "a newcomer after a quiet spell of up to
/// 95 s behind a stopped waiter waits about a front lifetime and a heartbeat". Checked with 30 s
/// as the generous bound, and the stopped waiter, resumed after the newcomer was served, is
/// served after it.
#[test]
#[ignore = "long (75 s), run by hand with --ignored: the move of a stopped waiter after a quiet spell is the stall rule's (queue_review4.rs), here after the longest quiet spell the floor allows"]
fn a_newcomer_after_a_quiet_minute_behind_a_stopped_waiter_is_served_soon() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "quiet";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(lockctl_on(&s).args(["acquire", name, "--ttl", "120s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let stopped = support::queue::waiter(&mut lockctl_on(&s), name, &file, "stopped", &[]);
    support::queue::wait_queued(&s, name, 1);
    std::thread::sleep(Duration::from_secs(1));
    kill(stopped.id() as i32, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(60));
    let ttl: i64 = s.cmd(&["PTTL", &queue_key(name)]);
    let newcomer = support::queue::waiter(&mut lockctl_on(&s), name, &file, "newcomer", &[]);
    support::queue::wait_queued(&s, name, 2);
    let released = std::time::Instant::now();
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(newcomer, Duration::from_secs(60));
    let took = released.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    kill(stopped.id() as i32, libc::SIGCONT);
    let o = wait_output(stopped, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    eprintln!(
        "queue ttl after the quiet minute {ttl} ms; the newcomer served {took:?} after the release"
    );
    assert_eq!(order(&file), ["newcomer", "stopped"]);
    assert!(
        took < Duration::from_secs(30),
        "the newcomer waited {took:?} for a stopped waiter"
    );
}

/// The same through a leave: a `--limit 2` waiter is stopped, both slots are released meanwhile
/// (each release keeps the key: a waiter is queued), and the waiter is SIGTERMed as it resumes.
/// When it ends, nothing is held and nobody waits; the key must not outlive that (leave.lua:16
/// deletes the queue's other keys, not `limit`). The waiter ends 143 every time; whether its leave
/// runs before an attempt that takes a slot (whose release then deletes the key) is a race: the key
/// stayed (58.7-59.0 s left, plain `acquire -n` exit 2) in 8 runs of 14.
#[test]
fn a_semaphore_whose_last_waiter_leaves_after_the_last_release_forgets_its_limit() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "pool_leave";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let (tokens, w) = support::queue::a_full_semaphore_of_two_with_a_waiter(
        &[&s],
        || lockctl_on(&s),
        name,
        &file,
        "late",
    );
    kill(w.id() as i32, libc::SIGSTOP);
    for t in &tokens {
        let o = run(lockctl_on(&s).args(["release", name, "--token", t]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    kill(w.id() as i32, libc::SIGTERM);
    kill(w.id() as i32, libc::SIGCONT);
    let o = wait_output(w, Duration::from_secs(60));
    eprintln!(
        "the waiter: {:?} {}; ran: {:?}",
        o.status,
        stderr(&o),
        order(&file)
    );
    nothing_held_nobody_waits(&[&s], name, "the waiter ended", true, || lockctl_on(&s));
}

/// The attempt forgets a limit left behind only when no slot is held: a slot's key without a
/// holder record (written by another client, or a record that expired first) still holds its slot,
/// so a plain `acquire -n` is refused with both numbers and the `limit` key stays.
#[test]
fn a_limit_is_kept_while_a_slot_key_without_a_record_holds_it() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "pool_foreign";
    let limit_key = format!("{{lockctl:{name}}}\u{1f}limit");
    let slot2 = format!("{{lockctl:{name}}}\u{1f}slot\u{1f}2");
    let _: String = s.cmd(&["SET", &limit_key, "3", "PX", "60000"]);
    let _: String = s.cmd(&["SET", &slot2, "someone-else", "PX", "60000"]);
    let o = run(lockctl_on(&s).args(["acquire", name, "-n", "--ttl", "5s"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--limit 3"), "{}", stderr(&o));
    let kept: Option<String> = s.cmd(&["GET", &limit_key]);
    assert_eq!(kept.as_deref(), Some("3"), "the limit was forgotten");
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "slot 1 was granted"
    );
}
