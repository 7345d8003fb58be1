//! An attempt that times out on a stalled node and is refused must leave nothing there, whenever that
//! node runs it. Redlock 3: nodes 0 and 1 are held by a plain client, node 2 is free (the late
//! attempt would be a grant there) or held too (it would queue a waiter there).
//!
//! Node 2 sits behind a loopback "stopped server": a listener that accepts connections (a stopped
//! server's kernel does) and keeps what lockctl sends on each, answering nothing. Once lockctl has
//! exited, the test plays those bytes to node 2 in a chosen order, as the server would at its resume:
//! of the attempt's connection only the attempt itself runs, since a server that read the attempt
//! before it stopped cannot write the answer to the connection lockctl closed on exit and drops it
//! unread, rollback included (`tests/slots_review5.rs` meets that with SIGSTOP, by chance); every
//! other connection (the rollback lockctl sent on a new one) runs whole. The order between the two is
//! the server's to choose, so both are played. The last two tests stop node 2 for real, the second
//! one a node whose connections need a password (no new connection can be opened to it then).
//!
//! The servers are started here, so the restart quarantine is off (`support::lockctl`).

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::stopped::{name, play, Stopped};
use support::*;

/// The keys of `pool` on `s` (release records aside, see `Server::keys`).
fn pool_keys(s: &Server) -> Vec<String> {
    s.keys()
        .into_iter()
        .filter(|k| k.contains("pool"))
        .collect()
}

const PEER: &str = "peer-token";
const FENCE: &str = "{lockctl:pool}\u{1f}fence";

/// Which of node 2's connections runs first at its resume.
#[derive(Clone, Copy, Debug, PartialEq)]
enum First {
    /// The late attempt, then the new connection's rollback.
    Attempt,
    /// The new connection's rollback, then the late attempt.
    Rollback,
}

/// One refused attempt with node 2 "stopped", then node 2 running what it kept in the order `first`.
/// `held`: node 2 is held by the peer too (the attempt would queue there; it waits, `-w`), else
/// free (it would grant; one attempt, `-n`). Returns the late attempt's answer there.
fn a_late_attempt(first: First, held: bool) -> redis::Value {
    let s = Servers::start(3);
    // Node 2 runs the attempt when it comes, not NOSCRIPT.
    let o = run(lockctl_on(&s[2]).args(["exec", "warm-up", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let peers: &[usize] = if held { &[0, 1, 2] } else { &[0, 1] };
    for &i in peers {
        let _: () = s[i].cmd(&["SET", "lockctl:pool", PEER, "PX", "60000"]);
    }
    let stopped = Stopped::start();
    let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
    let flags: &[&str] = if held { &["-w", "100ms"] } else { &["-n"] };
    let child = lockctl()
        .env("LOCKCTL_REDIS", urls)
        .env("LOCKCTL_NODE_TIMEOUT", "300ms")
        .args(["acquire", "pool", "--verbose"])
        .args(flags)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = wait_output(child, Duration::from_secs(60));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    // The attempt's connection and each new one lockctl says it sent on. Its exit is seen before
    // the proxy has accepted them all when the machine is busy: a suite run once took the blind
    // rollback for missing and replayed the attempt alone.
    let made = 1 + stderr(&o).matches("on a new connection").count();
    assert!(
        eventually(Duration::from_secs(10), || stopped.accepted() >= made),
        "the stopped node did not get the {made} connections lockctl made: {}",
        stderr(&o)
    );
    let conns = stopped.closed_whole();
    // The attempt goes out as EVALSHA, first on its connection; what lockctl sends without waiting
    // goes as EVAL.
    let (attempts, blind): (Vec<_>, Vec<_>) = conns
        .into_iter()
        .filter(|c| !c.is_empty())
        .partition(|c| name(&c[0]) == "EVALSHA");
    assert_eq!(attempts.len(), 1, "one attempt: {attempts:?}");
    let attempt = &attempts[0][0];
    let run_blind = || {
        for c in &blind {
            for cmd in c {
                assert_eq!(name(cmd), "EVAL", "sent without waiting: {}", name(cmd));
                play(&s[2], cmd).unwrap();
            }
        }
    };
    if first == First::Rollback {
        run_blind();
    }
    let answer = play(&s[2], attempt).expect("the late attempt runs");
    if first == First::Attempt {
        run_blind();
    }
    // Nothing of the attempt stays on node 2: at most the fencing counter a grant raised (and the
    // peer's key where it holds node 2). Before the fix the attempt's grant or waiter stayed.
    let mut allowed = vec![];
    if held {
        allowed.push("lockctl:pool".to_string());
    }
    let keys = pool_keys(&s[2]);
    let expected: Vec<String> = keys
        .iter()
        .filter(|k| allowed.contains(k) || k.as_str() == FENCE)
        .cloned()
        .collect();
    assert_eq!(
        keys,
        expected,
        "{first:?} first: node 2 keeps {:?} after the late attempt answered {answer:?}; {}",
        snapshot(&s[2]),
        stderr(&o)
    );
    if held {
        assert_eq!(s[2].get("lockctl:pool").as_deref(), Some(PEER));
    }
    for i in [0, 1] {
        assert_eq!(
            pool_keys(&s[i]),
            vec!["lockctl:pool".to_string()],
            "node {i}"
        );
    }
    answer
}

/// The answer's first item: 1 granted, 0 not (busy or queued).
fn granted(answer: &redis::Value) -> bool {
    match answer {
        redis::Value::Array(items) => matches!(items.first(), Some(redis::Value::Int(1))),
        other => panic!("the acquire script answered {other:?}"),
    }
}

#[test]
fn a_late_grant_before_the_rollback_on_a_new_connection_is_undone() {
    let answer = a_late_attempt(First::Attempt, false);
    // The attempt did run as a grant there: the rollback after it is what undid it.
    assert!(granted(&answer), "{answer:?}");
}

#[test]
fn a_late_attempt_after_the_rollback_on_a_new_connection_grants_nothing() {
    let answer = a_late_attempt(First::Rollback, false);
    assert!(!granted(&answer), "{answer:?}");
}

#[test]
fn a_late_waiter_before_the_rollback_and_leave_on_a_new_connection_is_taken_out() {
    let answer = a_late_attempt(First::Attempt, true);
    assert!(!granted(&answer), "{answer:?}");
}

#[test]
fn a_late_attempt_after_the_rollback_and_leave_on_a_new_connection_queues_nothing() {
    let answer = a_late_attempt(First::Rollback, true);
    assert!(!granted(&answer), "{answer:?}");
}

/// The same with a real stop: node 2 is SIGSTOPped before the attempt reaches it, lockctl times
/// out there, is refused and exits; at SIGCONT node 2 has the attempt, and the rollback behind it,
/// on one connection and the rollback again on a new one, which it accepted while stopped. Nothing
/// of the attempt stays, and the new connection's rollback ran: its record of the token's rollback
/// is there (without it, nothing would stop the attempt should it run after that rollback).
#[test]
fn a_stopped_node_runs_the_rollback_sent_on_a_new_connection() {
    for tcp in [false, true] {
        let s = Servers(vec![
            Server::start(),
            Server::start(),
            if tcp {
                Server::start_tcp()
            } else {
                Server::start()
            },
        ]);
        let o = run(lockctl_on(&s[2]).args(["exec", "warm-up", "--", "true"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        for i in [0, 1] {
            let _: () = s[i].cmd(&["SET", "lockctl:pool", PEER, "PX", "60000"]);
        }
        s[2].pause();
        let o = run(s
            .lockctl()
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(["acquire", "pool", "-n", "--ttl", "10s"]));
        s[2].resume();
        assert_eq!(code(&o), 75, "{}", stderr(&o));
        let records = || -> Vec<String> {
            let all: Vec<String> = s[2].cmd(&["KEYS", "*"]);
            all.into_iter()
                .filter(|k| k.contains("pool") && is_release_record(k))
                .collect()
        };
        assert!(
            eventually(Duration::from_secs(10), || records().len() == 1),
            "tcp {tcp}: no record of the rollback on node 2: {:?}",
            s[2].cmd::<Vec<String>>(&["KEYS", "*"])
        );
        let keys = pool_keys(&s[2]);
        assert!(
            keys.is_empty() || keys == vec![FENCE.to_string()],
            "tcp {tcp}: node 2 keeps {keys:?}"
        );
        // The record goes with the lease's TTL (the attempt's) and no later.
        let pttl: i64 = s[2].cmd(&["PTTL", &records()[0]]);
        assert!(pttl > 0 && pttl <= 10_000, "tcp {tcp}: {pttl}");
    }
}

/// A node whose connections need a password gets no new connection for a rollback that its old
/// connection carries: a stopped server answers no AUTH, so a new connection would have to send it in
/// the rollback's write unanswered, and the script would run whatever it answers
/// (docs/security.md). The rollback goes on the old connection, behind the attempt, and runs there
/// at the resume: its record (the tombstone) is there. Node 2 is stopped while the waiter sleeps
/// after its first attempt, so that its second times out on the connection the first one
/// authenticated.
#[test]
fn a_node_that_needs_a_password_gets_no_new_connection_for_a_rollback_its_old_one_carries() {
    let s = Servers(vec![Server::start(), Server::start(), Server::start_tcp()]);
    let o = run(lockctl_on(&s[2]).args(["exec", "warm-up", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for i in 0..3 {
        let _: () = s[i].cmd(&["SET", "lockctl:pool", PEER, "PX", "60000"]);
    }
    let _: () = s[2].cmd(&["CONFIG", "SET", "requirepass", "pw"]);
    let port = s[2].port.unwrap();
    let urls = format!("{},{},redis://:pw@127.0.0.1:{port}", s[0].url(), s[1].url());
    let o = change_during_a_sleep(
        lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(["acquire", "pool", "-w", "2s", "--verbose"]),
        || s[2].pause(),
    );
    s[2].resume();
    let e = stderr(&o);
    assert_eq!(code(&o), 75, "{e}");
    assert!(
        e.contains("sent without waiting"),
        "no rollback went out: {e}"
    );
    assert!(
        e.contains("no new connection (the old one carries it)")
            && !e.contains("sent on a new connection too"),
        "a new connection was tried: {e}"
    );
    let mut conn = redis::Client::open(format!("redis://:pw@127.0.0.1:{port}"))
        .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(10)))
        .expect("connect to node 2 with its password");
    let mut records = || -> Vec<String> {
        let all: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        all.into_iter()
            .filter(|k| k.contains("pool") && is_release_record(k))
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(10), || !records().is_empty()),
        "no record of the rollback on node 2"
    );
}
