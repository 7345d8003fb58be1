//! Second review of the semaphore's limit, against the rule that forgets the `limit` key once no
//! slot is held and nobody waits: a plain lock and a semaphore, or two semaphores of different N,
//! must never hold at the same time. Real servers, loopback only.

mod support;

use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

/// Contract ("Queues and slots"): with `--limit 1` the lock key stays the canonical plain string,
/// so peers (redis-py `Lock`, node-redlock, pottery) still exclude with lockctl; clients that
/// disagree on N get a clear error, never a silent mix. A peer's plain lock is the lock key alone:
/// no holder record, no `limit` key. A `--limit 3` attempt must not take slot 2 beside it. The
/// attempt learned the limit in use only from the `limit` key, the head waiter's record or slot 1's
/// holder record; slot 1's key without a record left it unknown, and the semaphore was granted
/// slot 2 while the plain lock was held (exit 0 and slot 2 taken, on one node and on Redlock 3, in
/// every run). Slot 1's key without a record is now a plain lock's, limit 1: exit 2, naming it, and
/// nothing of the attempt is left on any node.
fn a_semaphore_beside_a_peers_plain_lock(nodes: &[&Server], attempt: &mut std::process::Command) {
    let name = "peer_plain";
    let lock_key = format!("lockctl:{name}");
    let slot2 = format!("{{lockctl:{name}}}\u{1f}slot\u{1f}2");
    for s in nodes {
        let set: Option<String> = s.cmd(&[
            "SET",
            &lock_key,
            "0123456789abcdef0123456789abcdef",
            "NX",
            "PX",
            "60000",
        ]);
        assert_eq!(set.as_deref(), Some("OK"));
    }
    let o = run(attempt.args(["acquire", name, "-n", "--limit", "3", "--ttl", "30s"]));
    let slot2_held: Vec<Option<String>> = nodes.iter().map(|s| s.get(&slot2)).collect();
    eprintln!(
        "--limit 3 beside a plain lock: exit {}, stdout {:?}, stderr {:?}, slot 2 {:?}",
        code(&o),
        stdout(&o),
        stderr(&o),
        slot2_held
    );
    assert_ne!(
        code(&o),
        0,
        "a --limit 3 semaphore was granted while a plain lock holds the name: {}",
        stdout(&o)
    );
    assert!(
        slot2_held.iter().all(Option::is_none),
        "slot 2 taken beside the plain lock: {slot2_held:?}"
    );
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("peer_plain is held by a client that is not lockctl")
            && stderr(&o).contains("you asked for --limit 3"),
        "{}",
        stderr(&o)
    );
    for s in nodes {
        assert_eq!(
            s.keys(),
            vec![lock_key.clone()],
            "only the peer's key stays (no holder record, limit key or waiter)"
        );
        assert_eq!(
            s.get(&lock_key).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
    }
}

#[test]
fn a_semaphore_is_not_granted_beside_a_peers_plain_lock() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    a_semaphore_beside_a_peers_plain_lock(&[&s], &mut lockctl_on(&s));
}

#[test]
fn a_semaphore_is_not_granted_beside_a_peers_plain_lock_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    a_semaphore_beside_a_peers_plain_lock(&nodes, &mut s.lockctl());
}

/// Clients of one name with N of 1, 2 and 3 started together, round after round, each an `exec -w`
/// that notes its start and end (with its fence) in a file: no two of different N may overlap, no
/// more than N of limit N may hold, fences must be distinct, and a client is only ever granted
/// (0) or refused for its limit (2).
fn mixed_limits(
    nodes: &[&Server],
    name: &str,
    rounds: usize,
    term: bool,
    lockctl: impl Fn() -> Command,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut codes = std::collections::BTreeMap::new();
    for r in 0..rounds {
        let kids: Vec<_> = (0..6)
            .map(|i| {
                let n = (r * 7 + i * 5) % 3 + 1;
                // Staggered, so that some arrive as others release.
                std::thread::sleep(Duration::from_millis(((r * 13 + i * 29) % 7 * 15) as u64));
                let child = lockctl()
                    .args(["exec", name, "--limit", &n.to_string(), "-w", "20s", "--ttl", "5s"])
                    .arg("-c")
                    .arg(format!(
                        "trap 'echo \"- {n} $LOCKCTL_FENCE\" >> {l}; exit 0' TERM; echo \"+ {n} $LOCKCTL_FENCE\" >> '{l}'; sleep {hold}; echo \"- {n} $LOCKCTL_FENCE\" >> '{l}'",
                        l = log.display(),
                        hold = if term { "0.2" } else { "0.05" },
                    ))
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn");
                (n, child)
            })
            .collect::<Vec<_>>();
        if term {
            // One client stops (a leave if it waits, a release if it holds) as the others run.
            std::thread::sleep(Duration::from_millis((r % 5 * 60 + 30) as u64));
            kill(kids[r % 6].1.id() as i32, libc::SIGTERM);
        }
        for (n, k) in kids {
            let o = wait_output(k, Duration::from_secs(60));
            // SIGTERM before lockctl set its handlers ends it as the signal's default.
            if std::os::unix::process::ExitStatusExt::signal(&o.status) == Some(libc::SIGTERM) {
                *codes.entry((n, 143)).or_insert(0u32) += 1;
                continue;
            }
            let c = code(&o);
            assert!(
                c == 0 || c == 2 || c == 143,
                "limit {n}: exit {c}: {}",
                stderr(&o)
            );
            *codes.entry((n, c)).or_insert(0u32) += 1;
        }
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let mut held = [0usize; 4];
    // The largest fence of a grant of each limit that ended: a grant of another limit (or any
    // plain one) came after it, so its fence is larger.
    let mut ended = [0u64; 4];
    let mut fences = std::collections::BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n: usize = f[1].parse().unwrap();
        if f[0] == "+" {
            assert!(fences.insert(f[2].to_string()), "fence {} twice", f[2]);
            for (m, h) in held.iter().enumerate() {
                assert!(
                    m == n || *h == 0,
                    "limit {n} granted while {h} of limit {m} hold:\n{text}"
                );
            }
            let fence: u64 = f[2].parse().unwrap();
            for (m, e) in ended.iter().enumerate() {
                assert!(
                    (m == n && n > 1) || fence > *e,
                    "limit {n} granted fence {fence} after a limit {m} grant of fence {e} ended:\n{text}"
                );
            }
            held[n] += 1;
            assert!(held[n] <= n, "{} holders of limit {n}:\n{text}", held[n]);
        } else {
            held[n] -= 1;
            ended[n] = ended[n].max(f[2].parse().unwrap());
        }
    }
    let keys: Vec<Vec<String>> = nodes.iter().map(|s| s.keys()).collect();
    eprintln!("{rounds} rounds: (limit, exit) -> count {codes:?}; keys left {keys:?}");
}

#[test]
fn mixed_limits_never_hold_together() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    mixed_limits(&[&s], "mixed", 15, false, || lockctl_on(&s));
}

#[test]
fn mixed_limits_never_hold_together_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    mixed_limits(&nodes, "rmixed", 10, false, || s.lockctl());
}

/// A semaphore's limit left behind (docs/queue.md: a dead waiter still queued at the last release
/// keeps the key for the holders' lease, and the next attempt forgets it) must not refuse a plain
/// client once the semaphore is gone: the name is then used as a plain lock by a peer (redis-py
/// `Lock`), and a plain `acquire -n` is busy (75), not told the name "is used with --limit 2".
/// The attempt forgets a limit only when no slot's key exists (acquire.lua:177-182), and slot 1's
/// key is the peer's plain lock, so the leftover key refuses every plain client (exit 2) for the
/// rest of the old holders' lease. Seen: exit 2, the key still "2", in every run.
#[test]
fn a_limit_left_behind_does_not_refuse_a_plain_client_beside_a_peers_plain_lock() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "leftover_peer";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let (tokens, w) = support::queue::a_full_semaphore_of_two_with_a_waiter(
        &[&s],
        || lockctl_on(&s),
        name,
        &file,
        "dead",
    );
    kill(w.id() as i32, libc::SIGKILL);
    support::queue::finish_off(w);
    for t in &tokens {
        let o = run(lockctl_on(&s).args(["release", name, "--token", t]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    // The killed waiter's expiry (a front lifetime, 4 s) passes with no script run.
    std::thread::sleep(Duration::from_secs(6));
    let lock_key = format!("lockctl:{name}");
    let set: Option<String> = s.cmd(&[
        "SET",
        &lock_key,
        "0123456789abcdef0123456789abcdef",
        "NX",
        "PX",
        "60000",
    ]);
    assert_eq!(set.as_deref(), Some("OK"), "the peer's lock");
    let o = run(lockctl_on(&s).args(["acquire", name, "-n", "--ttl", "5s"]));
    let limit_key = format!("{{lockctl:{name}}}\u{1f}limit");
    let left: Option<String> = s.cmd(&["GET", &limit_key]);
    eprintln!(
        "plain acquire -n beside the peer: exit {}, stderr {:?}; limit key {left:?}",
        code(&o),
        stderr(&o)
    );
    assert_eq!(
        code(&o),
        75,
        "a plain client beside a plain lock, the semaphore long gone: {}",
        stderr(&o)
    );
}

/// Redlock: each node decides alone, and a grant needs a quorum, so one node's stale answer must
/// not decide for the name. A `--limit 2` holder releases while one node of three is down (the
/// release reaches the other two: exit 0); that node comes back from its AOF with the holder's slot
/// and `limit` key, in its restart quarantine (it may not vote). A plain `acquire -n` then finds
/// the name free on the two others, yet the restarted node's answer "used with --limit 2"
/// (acquire.lua:166-173, before the quarantine check at acquire.lua:243) is fatal for the whole
/// attempt (src/lock/mod.rs:884, one node's mismatch refuses, exit 2), and stays so for the rest of the
/// old lease: a refusal when nothing of the semaphore is held on a quorum. Seen: exit 2 naming the
/// holder that released, in every run; by hand, again 4 s after the restart, past the quarantine.
#[test]
fn a_restarted_nodes_stale_limit_does_not_refuse_a_free_name_on_redlock() {
    // The quarantine stays on (2 s): one server is restarted; the attempts wait out the others'.
    let mut servers = [
        Server::start_tcp(),
        Server::start_tcp(),
        Server::tcp_with_args(&["--appendonly", "yes", "--appendfsync", "always"]),
    ];
    let urls = urls_of(&servers);
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &urls)
            .env("LOCKCTL_QUARANTINE", "2s");
        c
    };
    std::thread::sleep(Duration::from_millis(3500));
    let name = "stale_node";
    let o = run(cmd().args(["acquire", name, "--limit", "2", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    servers[2].kill();
    let o = run(cmd().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "release on two of three: {}", stderr(&o));
    servers[2].restart_in_place();
    let kept = servers[2].get(&format!("lockctl:{name}"));
    assert_eq!(
        kept.as_deref(),
        Some(token.as_str()),
        "the AOF kept the slot"
    );
    let o = run(cmd().args(["acquire", name, "-n", "--ttl", "5s"]));
    eprintln!(
        "plain acquire -n with two free nodes: exit {}, stderr {:?}",
        code(&o),
        stderr(&o)
    );
    assert_eq!(
        code(&o),
        0,
        "the name is free on two of three nodes: {}",
        stderr(&o)
    );
}

#[test]
fn mixed_limits_never_hold_together_while_clients_stop() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    mixed_limits(&[&s], "mixed_term", 30, true, || lockctl_on(&s));
}

#[test]
fn mixed_limits_never_hold_together_while_clients_stop_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    let nodes: Vec<&Server> = s.0.iter().collect();
    mixed_limits(&nodes, "rmixed_term", 20, true, || s.lockctl());
}
