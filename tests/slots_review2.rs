//! Second review of the semaphore's limit, against the rule that forgets the `limit` key once no
//! slot is held and nobody waits: a plain lock and a semaphore, or two semaphores of different N,
//! must never hold at the same time. Real servers, loopback only.

mod support;

use support::*;

/// Contract ("Queues and slots"): with `--limit 1` the lock key stays the canonical plain string,
/// so peers (redis-py `Lock`, node-redlock, pottery) still exclude with lockctl; clients that
/// disagree on N get a clear error, never a silent mix. A peer's plain lock is the lock key alone:
/// no holder record, no `limit` key. A `--limit 3` attempt must not take slot 2 beside it. The
/// attempt learns the limit in use from the `limit` key, the head waiter's record or slot 1's
/// holder record (acquire.lua:147-165); slot 1's key without a record leaves it unknown
/// (acquire.lua:161-164), so the check of the slot keys (acquire.lua:177-182, which
/// queue_review7's a_limit_is_kept_while_a_slot_key_without_a_record_holds_it relies on) never
/// runs, and the semaphore is granted slot 2 while the plain lock is held. Seen: exit 0 and slot 2
/// taken, on one node and on Redlock 3 (every run).
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
