//! Sixth review of the queue, against the leave that a signalled waiter sends and the message it
//! prints when a node could not be sent that leave (`mod.rs` `interrupted`, `queue.rs` `leave`,
//! `node.rs` `send_only`). Real servers, real signals, loopback TCP.
//!
//! What breaks:
//! - a node killed -9 over TCP while the waiter keeps its connection: `send_only` (`node.rs:738`)
//!   counts the leave as sent once it is written into the socket's send buffer, which succeeds
//!   (the peer's FIN closes only its side; the RST comes after the write), so `interrupted`
//!   (`mod.rs:616`) finds nothing missed and the waiter says "nothing was left in Redis". The
//!   killed node kept the entry in its AOF and has it again when it restarts (one node, and
//!   Redlock 3 with one node killed). Over a unix socket the write fails (EPIPE) and the waiter
//!   says so (3 of 3 by hand).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::queue::queue_key;
use support::*;

/// A waiter (`acquire -w 60s`) for `name`, its stderr piped.
fn waiting(mut cmd: Command, name: &str) -> Child {
    cmd.args(["acquire", name, "-w", "60s"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter")
}

/// A TCP server that writes every change to its AOF at once, as a crash-safe master does.
fn aof() -> Server {
    Server::tcp_with_args(&["--appendonly", "yes", "--appendfsync", "always"])
}

/// Holds `name` on `servers` (all TCP), queues a waiter on each, kills -9 server `victim`, and at
/// once sends the waiter SIGTERM, then restarts the victim from its AOF. Returns the waiter's exit
/// code and stderr.
fn signalled_after_a_kill(servers: &mut [Server], victim: usize, name: &str) -> (i32, String) {
    let urls = servers
        .iter()
        .map(Server::url)
        .collect::<Vec<_>>()
        .join(",");
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &urls);
        c
    };
    let o = run(cmd().args(["acquire", name, "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let child = waiting(cmd(), name);
    for s in servers.iter() {
        let ok = eventually(Duration::from_secs(30), || {
            s.cmd::<u64>(&["ZCARD", &queue_key(name)]) == 1
        });
        assert!(ok, "the waiter did not queue");
    }
    std::thread::sleep(Duration::from_millis(1200));
    // The waiter is held still across the kill, so that the signal, not the dead node's closed
    // connection, is what it sees first when it runs again.
    kill(child.id() as i32, libc::SIGSTOP);
    servers[victim].kill();
    kill(child.id() as i32, libc::SIGTERM);
    kill(child.id() as i32, libc::SIGCONT);
    let o = wait_output(child, Duration::from_secs(30));
    // No lockctl runs after this restart: it only shows what the killed node kept.
    servers[victim].restart_in_place();
    let kept: u64 = servers[victim].cmd(&["ZCARD", &queue_key(name)]);
    let said = format!(
        "{}[the killed node, restarted from its AOF, has {kept} queued]",
        stderr(&o)
    );
    (code(&o), said)
}

/// Docs (CONTRACT, signals; `mod.rs` `interrupted`): a signalled waiter says what it knows of its
/// leave. A node killed -9 over TCP, with the waiter's connection still open, takes the leave into
/// the dead socket's buffer: nothing will run it, yet the waiter said "nothing was left in Redis"
/// (3 of 3 runs of five rounds). The leave goes out without waiting for the answers, so the waiter
/// cannot tell which node missed it; it now says its place was given up unconfirmed (or, where the
/// write itself failed, on how many nodes it could not be withdrawn), and never that nothing was
/// left.
#[test]
fn a_waiter_signalled_after_its_only_node_was_killed_says_its_place_was_not_withdrawn() {
    // The quarantine is off for this server the test started itself; no lockctl runs after its
    // restart.
    // The waiter may also see the dead node on its own first (its wake connection closes), and
    // then says so: five rounds, each must say it.
    for round in 0..5 {
        let mut servers = vec![aof()];
        let (code, said) = signalled_after_a_kill(&mut servers, 0, &format!("r6-one-{round}"));
        assert_eq!(code, 143, "{said}");
        assert!(
            !said.contains("nothing was left")
                && (said.contains("given up without waiting for the answer")
                    || said.contains("could not be withdrawn on 1 of 1 node(s)")),
            "round {round}: the leave never reached the killed node, but the waiter did not say \
             so: {said}"
        );
    }
}

/// The same with Redlock 3 and one node killed -9.
#[test]
fn a_redlock_waiter_signalled_after_a_node_was_killed_says_its_place_was_not_withdrawn() {
    // The quarantine is off for these servers the test started itself; no lockctl runs after the
    // restart.
    for round in 0..5 {
        let name = format!("r6-three-{round}");
        let mut servers = vec![aof(), aof(), aof()];
        let (code, said) = signalled_after_a_kill(&mut servers, 1, &name);
        assert_eq!(code, 143, "{said}");
        assert!(
            !said.contains("nothing was left")
                && (said.contains("given up without waiting for the answer")
                    || said.contains("could not be withdrawn on 1 of 3 node(s)")),
            "round {round}: the leave never reached the killed node, but the waiter did not say \
             so: {said}"
        );
        for (i, s) in servers.iter().enumerate().filter(|(i, _)| *i != 1) {
            let left: u64 = s.cmd(&["ZCARD", &queue_key(&name)]);
            assert_eq!(left, 0, "node {i} kept the signalled waiter");
        }
    }
}
