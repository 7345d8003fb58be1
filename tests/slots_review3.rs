//! Third review of the semaphore's limit, against the Redlock rule that lets a minority of nodes
//! keeping another limit count as busy instead of refusing the attempt (src/lock/mod.rs:886-898):
//! a plain lock and a semaphore, or two semaphores of different N, must never hold at the same
//! time, and a client that disagrees with the limit in use gets exit 2 naming both numbers.
//! Real servers, loopback only.

mod support;

use support::*;

/// Contract ("Queues and slots"): clients that disagree on N get a clear error (exit 2). A
/// `--limit 2` holder is granted on a bare majority of the nodes (the others stopped, SIGSTOP,
/// during its attempt) and holds a valid lease. The stopped nodes come back and one node of the
/// holder's majority stops. A plain attempt now hears the holder's other nodes say "used with
/// --limit 2, held by ...", the nodes that missed the grant free, one node silent: a minority
/// against, and `n - against >= quorum` counts the silent node as one that could agree
/// (src/lock/mod.rs:891), so the mismatch is turned into "busy" (src/lock/mod.rs:896-898) and
/// the client is told the name is held (exit 75, "lock '...' is busy", no holder named) instead
/// of that it uses the wrong limit. The disagreement is certain: every node that answered with a
/// holder answered with a `--limit 2` one whose lease is valid. Before the rule (a61414b) it was
/// exit 2. With `-w` the plain client is queued on the free nodes (a change in Redis, which exit 2
/// must come before) and waits out its deadline, its wait line naming "an unknown holder" though
/// a node named the `--limit 2` one. Seen in every run (4 of 4 on 3 nodes, 4 of 4 on 5, 4 of 4
/// waiting): exit 75; all three pass on a61414b.
fn told_the_limit_with_a_node_silent(n: usize, extra: &[&str]) -> std::process::Output {
    // Quarantine off (lockctl() sets 0): servers this test started and never restarts; it only
    // pauses them.
    let servers = Servers::start(n);
    let quorum = n / 2 + 1;
    let name = "silent_node";
    for s in &servers.0[quorum..] {
        s.pause();
    }
    let o = run(servers.lockctl().args([
        "acquire",
        name,
        "--limit",
        "2",
        "--ttl",
        "60s",
        "--node-timeout",
        "200ms",
    ]));
    for s in &servers.0[quorum..] {
        s.resume();
    }
    assert_eq!(code(&o), 0, "granted on a bare majority: {}", stderr(&o));
    let token = stdout(&o);
    servers[quorum - 1].pause();
    let o = run(servers
        .lockctl()
        .args(["acquire", name, "--ttl", "5s", "--node-timeout", "200ms"])
        .args(extra));
    servers[quorum - 1].resume();
    eprintln!(
        "plain acquire {extra:?} against a valid --limit 2 lease on {quorum} of {n}, one of them \
         silent: exit {}, stderr {:?}",
        code(&o),
        stderr(&o)
    );
    for s in &servers.0[quorum..] {
        assert_eq!(
            s.get(&format!("lockctl:{name}")),
            None,
            "no plain key left on a free node"
        );
    }
    let r = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    o
}

fn assert_told_the_limit(o: &std::process::Output) {
    assert_eq!(
        code(o),
        2,
        "a plain client beside a valid --limit 2 holder: {}",
        stderr(o)
    );
    assert!(
        stderr(o).contains("--limit 2") && stderr(o).contains("--limit 1"),
        "both numbers: {}",
        stderr(o)
    );
}

#[test]
fn a_plain_attempt_beside_a_valid_semaphore_is_told_the_limit_with_a_node_silent() {
    assert_told_the_limit(&told_the_limit_with_a_node_silent(3, &["-n"]));
}

#[test]
fn a_plain_attempt_beside_a_valid_semaphore_is_told_the_limit_with_a_node_silent_on_5() {
    assert_told_the_limit(&told_the_limit_with_a_node_silent(5, &["-n"]));
}

#[test]
fn a_plain_waiter_beside_a_valid_semaphore_is_told_the_limit_with_a_node_silent() {
    assert_told_the_limit(&told_the_limit_with_a_node_silent(3, &["-w", "3s"]));
}
