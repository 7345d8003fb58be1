//! Third review of the semaphore's limit, against the Redlock rule that lets a minority of nodes
//! keeping another limit count as busy instead of refusing the attempt (src/lock/mod.rs:886-898):
//! a plain lock and a semaphore, or two semaphores of different N, must never hold at the same
//! time, and a client that disagrees with the limit in use gets exit 2 naming both numbers.
//! Real servers, loopback only.

mod support;

use support::*;

/// Contract ("Queues and slots"): clients that disagree on N get a clear error (exit 2). A
/// `--limit 2` holder is granted on nodes 1 and 2 of three (node 3 stopped, SIGSTOP, during its
/// attempt) and holds a valid lease. Node 3 comes back and node 2 stops. A plain `acquire -n` now
/// hears node 1 say "used with --limit 2, held by ...", node 3 free, node 2 silent: one node
/// against, and `n - against >= quorum` counts the silent node as one that could agree
/// (src/lock/mod.rs:891), so the mismatch is turned into "busy" and the client is told the name is
/// held (exit 75) instead of that it uses the wrong limit. Before the rule (HEAD~1) it was exit 2.
/// The disagreement is certain here: no node answered with the plain limit, and the only holder
/// that answered is a `--limit 2` one with a valid lease.
#[test]
fn a_plain_attempt_against_a_valid_semaphore_is_told_the_limit_when_a_node_is_silent() {
    // Quarantine off (lockctl() sets 0): servers this test started and never restarts; it only
    // pauses them.
    let servers = Servers::start(3);
    let name = "silent_node";
    servers[2].pause();
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
    servers[2].resume();
    assert_eq!(code(&o), 0, "granted on two of three: {}", stderr(&o));
    let token = stdout(&o);
    servers[1].pause();
    let o = run(servers.lockctl().args([
        "acquire",
        name,
        "-n",
        "--ttl",
        "5s",
        "--node-timeout",
        "200ms",
    ]));
    servers[1].resume();
    eprintln!(
        "plain acquire -n against a valid --limit 2 lease, one node silent: exit {}, stderr {:?}",
        code(&o),
        stderr(&o)
    );
    assert_eq!(
        servers[2].get(&format!("lockctl:{name}")),
        None,
        "no plain key left on the free node"
    );
    assert_eq!(
        code(&o),
        2,
        "a plain client beside a valid --limit 2 holder: {}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("--limit 2") && stderr(&o).contains("--limit 1"),
        "both numbers: {}",
        stderr(&o)
    );
    let o = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}
