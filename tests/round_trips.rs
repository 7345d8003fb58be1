//! One round trip per node per operation, seen on the wire: a loopback proxy between lockctl and a
//! real server records what each write carries (`support/proxy.rs`). The server's own statistics
//! cannot show it: a command sent in the same write as another and one sent after its reply count
//! the same there.
//!
//! The case that matters is the kept connection: a waiting `exec`'s grant and every renewal of a
//! running one. Their replicas are read afresh each time (a failover can take one away), and that
//! read must travel with the script, not after its reply. `WAIT` for the replicas is the one
//! documented second round trip (the price of failover safety).

mod support;

use std::process::{Child, Stdio};
use std::time::Duration;

use support::proxy::{Proxy, Turns};
use support::*;

fn exec_through(proxy: &Proxy, name: &str, secs: &str) -> Child {
    lockctl()
        .env("LOCKCTL_REDIS", proxy.url())
        .args(["exec", name, "--ttl", "1s", "--", "sleep", secs])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn finish(child: Child) {
    let o = wait_output(child, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// The turns that ran a script: a grant, a renewal, a release, a queue beat.
fn script_turns(turns: &[Turns]) -> Vec<Vec<String>> {
    turns
        .iter()
        .flatten()
        .filter(|t| t.iter().any(|c| c.starts_with("EVAL")))
        .cloned()
        .collect()
}

/// No turn is an `INFO` alone (a second round trip to read what could have come with the script),
/// no turn runs two scripts, and none loads one.
fn assert_no_extra_round_trip(turns: &[Turns]) {
    for t in turns.iter().flatten() {
        assert!(
            !t.iter().all(|c| c.starts_with("INFO")),
            "an INFO on its own round trip: {turns:#?}"
        );
        assert!(
            t.iter().filter(|c| c.starts_with("EVAL")).count() <= 1,
            "two scripts in one turn: {t:?}"
        );
        // A server that never saw a script gets its source at once (EVAL), not a load and a retry.
        assert!(!t.iter().any(|c| c.starts_with("SCRIPT")), "{turns:#?}");
    }
}

#[test]
fn renewals_and_a_grant_after_a_wait_take_one_round_trip_each() {
    let server = Server::start_tcp();
    let proxy = Proxy::start(server.port.unwrap());
    // A 1 s lease renews about every third of a second: several renewals on a kept connection.
    let first = exec_through(&proxy, "rt", "2");
    assert!(eventually(Duration::from_secs(30), || server
        .get("lockctl:rt")
        .is_some()));
    // The second waits on its connection and is granted on it when the first releases.
    let second = exec_through(&proxy, "rt", "1.5");
    finish(first);
    finish(second);

    let turns = proxy.turns();
    assert_no_extra_round_trip(&turns);
    let scripts = script_turns(&turns);
    // Two grants and releases, the second's first attempt, and the renewals of 3.5 s of 1 s leases.
    assert!(scripts.len() >= 9, "{turns:#?}");
    // Renewals and the grant after the wait read the replicas afresh, in the script's write.
    let fresh = scripts
        .iter()
        .filter(|t| t.iter().any(|c| c == "INFO replication"))
        .count();
    assert!(fresh >= 5, "{turns:#?}");
}

#[test]
fn with_a_replica_a_renewal_is_the_script_then_wait() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let _replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(eventually(Duration::from_secs(30), || {
        let info: String = master.cmd(&["INFO", "replication"]);
        info.contains("state=online")
    }));
    assert!(eventually(Duration::from_secs(30), || {
        replicas_acknowledge(&mut master.conn(), "replicas-ready", 1)
    }));
    let proxy = Proxy::start(master.port.unwrap());
    finish(exec_through(&proxy, "rw", "1.5"));

    let turns = proxy.turns();
    assert_no_extra_round_trip(&turns);
    // Every grant and renewal waits for the replica, in a round trip of its own right after on the
    // same connection. A script whose reply did not come within the node timeout (a loaded machine)
    // ends its connection's use, so it may be the connection's last turn, with no WAIT after it.
    let mut durable = 0;
    for conn in &turns {
        for (i, t) in conn.iter().enumerate() {
            if !(t.iter().any(|c| c.starts_with("EVAL")) && t.iter().any(|c| c.starts_with("INFO")))
            {
                continue;
            }
            // A server that had not seen the script yet is sent its source first (NOSCRIPT).
            let next = conn[i + 1..]
                .iter()
                .find(|n| !(n.len() == 1 && n[0].starts_with("EVAL ")));
            if let Some(next) = next {
                assert_eq!(next.as_slice(), &["WAIT 1".to_string()][..], "{turns:#?}");
                durable += 1;
            }
        }
    }
    // The grant and renewals of a 1 s lease over 1.5 s (about every third of a second): at least
    // two of them answered in time however loaded the machine.
    assert!(durable >= 3, "{turns:#?}");
}
