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
//! - a waiter whose attempts all went unanswered is not known to be queued anywhere, yet its
//!   attempt may queue it when the stopped node resumes: its leave must go out all the same.
//! - a waiter without a connection to a node (its last call there failed, its reconnect was
//!   refused) that is reachable again: the leave opens a connection first, within the node
//!   timeout, or the node keeps the waiter's place until its heartbeat lapses.

mod support;

use std::net::{Shutdown, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::proxy::one_way;
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
    let urls = urls_of(servers);
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

/// A waiter's attempt that got no answer may still queue it when the stopped node resumes, so a
/// signalled waiter leaves also when no node ever said it was queued. Here its only attempt goes
/// into a stopped server and times out; the leave follows on the same connection, and the server,
/// resumed, runs the two in order: nothing of the waiter may be left in its queue. Skipping the
/// leave because no answer said "queued" leaves the entry until its heartbeat lapses.
#[test]
fn a_waiter_signalled_before_any_answer_still_leaves() {
    use std::io::{BufRead, BufReader, Read};
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let name = "r6-unanswered";
    let o = run(lockctl_on(&s).args(["acquire", name, "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let before = script_calls(&s);
    s.pause();
    let mut cmd = lockctl_on(&s);
    cmd.args(["-v", "--node-timeout", "2s"]);
    let mut child = waiting(cmd, name);
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut said = String::new();
    // Connected: its attempt is on its way (a stopped server's kernel accepts and keeps it).
    while !said.contains("connected in") {
        let mut line = String::new();
        let n = err.read_line(&mut line).unwrap();
        assert!(n > 0, "the waiter ended before connecting: {said}");
        said.push_str(&line);
    }
    kill(child.id() as i32, libc::SIGTERM);
    err.read_to_string(&mut said).unwrap();
    let status = child.wait().unwrap();
    s.resume();
    // The attempt, its rollback and the leave came on one connection and run in one go: once the
    // attempt (`EVALSHA`) and the rollback (`EVAL`) show, the leave has run too.
    let ran = eventually(Duration::from_secs(30), || {
        let now = script_calls(&s);
        now.0 > before.0 && now.1 > before.1
    });
    assert!(ran, "the buffered attempt never ran: {said}");
    assert_eq!(status.code(), Some(143), "{said}");
    let queued: u64 = s.cmd(&["ZCARD", &queue_key(name)]);
    assert_eq!(queued, 0, "the signalled waiter stayed queued: {said}");
}

/// The server's count of `EVALSHA` and `EVAL` calls.
fn script_calls(s: &Server) -> (u64, u64) {
    let stats: String = s.cmd(&["INFO", "commandstats"]);
    let calls = |cmd: &str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|v| v.split(',').next()?.parse().ok())
            .unwrap_or(0)
    };
    (calls("evalsha"), calls("eval"))
}

/// A loopback TCP relay to a server that the test can shut (every relayed connection cut, new ones
/// refused: its port closed) and open again on the same port. The server behind it keeps its data
/// and its uptime: a lockctl behind the gate finds its node unreachable and back, with no restart.
struct Gate {
    port: u16,
    /// 0 open, 1 shut, 2 dropped.
    state: Arc<AtomicU8>,
    listening: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
}

impl Gate {
    fn start(upstream: u16) -> Gate {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        let state = Arc::new(AtomicU8::new(0));
        let listening = Arc::new(AtomicBool::new(true));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (st, ls, ss) = (state.clone(), listening.clone(), streams.clone());
        std::thread::spawn(move || {
            let mut listener = Some(first);
            loop {
                match st.load(Ordering::SeqCst) {
                    2 => return,
                    1 => {
                        listener = None;
                        ls.store(false, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(2));
                        continue;
                    }
                    _ => {}
                }
                // std sets SO_REUSEADDR: the port is taken again at once.
                let l = listener.get_or_insert_with(|| {
                    TcpListener::bind(("127.0.0.1", port)).expect("bind the gate's port again")
                });
                l.set_nonblocking(true).unwrap();
                ls.store(true, Ordering::SeqCst);
                match l.accept() {
                    Ok((client, _)) => {
                        client.set_nonblocking(false).unwrap();
                        let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                            continue;
                        };
                        let mut kept = ss.lock().unwrap();
                        kept.push(client.try_clone().unwrap());
                        kept.push(server.try_clone().unwrap());
                        one_way(client.try_clone().unwrap(), server.try_clone().unwrap());
                        one_way(server, client);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        Gate {
            port,
            state,
            listening,
            streams,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Closes the port, then cuts every connection it relays.
    fn shut(&self) {
        self.state.store(1, Ordering::SeqCst);
        assert!(
            eventually(Duration::from_secs(10), || !self
                .listening
                .load(Ordering::SeqCst)),
            "the gate did not close its port"
        );
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    fn open(&self) {
        self.state.store(0, Ordering::SeqCst);
        assert!(
            eventually(Duration::from_secs(10), || self
                .listening
                .load(Ordering::SeqCst)),
            "the gate did not open its port again"
        );
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.state.store(2, Ordering::SeqCst);
        for s in self.streams.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

/// Docs (CONTRACT, signals; `node.rs` `send_only`): a signalled waiter's leave goes to every node,
/// one without a connection too: it opens one first, within the node timeout. A waiter has none
/// to a node whose last call failed and whose reconnect was refused (an unreachable node); the
/// node, reachable again before the waiter's next call there, still keeps its place. Here the node
/// is behind a gate, shut while the waiter waits and opened again while the waiter is held still
/// (SIGSTOP) in a sleep between two attempts; the signal comes before its next attempt. The leave
/// must go out on a new connection: "given up without waiting", and nothing of the waiter left in
/// the queue. Without it the waiter says "could not be withdrawn on 1 of 1 node(s)", and the node
/// keeps the entry until its heartbeat lapses. A `CLIENT KILL` of the waiter's connection alone
/// does not get there: the waiter still has the connection, and its leave is written into the
/// closed socket (which succeeds), or its next call finds the drop and reconnects at once.
#[test]
fn a_waiter_signalled_while_it_has_no_connection_to_a_reachable_node_still_leaves() {
    use std::io::{BufRead, BufReader};
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start_tcp();
    let gate = Gate::start(s.port.unwrap());
    for round in 0..3 {
        let name = format!("r6-gate-{round}");
        let o = run(lockctl_on(&s).args(["acquire", &name, "--ttl", "60s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let mut cmd = lockctl();
        cmd.env("LOCKCTL_REDIS", gate.url()).arg("-v");
        let mut child = waiting(cmd, &name);
        let pid = child.id() as i32;
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut said = String::new();
        // The next line of its stderr, also added to `said`.
        let line = |err: &mut BufReader<_>, said: &mut String| {
            let mut l = String::new();
            let n = err.read_line(&mut l).expect("read the waiter's stderr");
            assert!(n > 0, "round {round}: the waiter ended early: {said}");
            said.push_str(&l);
            l
        };
        // Queued and sleeping until its next heartbeat.
        while !said.contains("waiting up to") {
            line(&mut err, &mut said);
        }
        assert_eq!(s.cmd::<u64>(&["ZCARD", &queue_key(&name)]), 1, "{said}");
        gate.shut();
        // Its next attempt fails and its reconnect is refused: no connection to the node. Once it
        // sleeps at least 300 ms before the next one, it is held still there.
        let mut failed = false;
        loop {
            let l = line(&mut err, &mut said);
            failed |= l.contains("Redis unavailable since");
            let ms = l
                .split("waiting up to ")
                .nth(1)
                .and_then(|r| r.split(' ').next())
                .and_then(|v| v.parse::<f64>().ok());
            if failed && ms.is_some_and(|ms| ms >= 300.0) {
                kill(pid, libc::SIGSTOP);
                break;
            }
        }
        let rest = std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut rest);
            rest
        });
        assert!(
            eventually(Duration::from_secs(10), || support::hammer::stopped(pid)),
            "the waiter did not stop"
        );
        gate.open();
        kill(pid, libc::SIGTERM);
        kill(pid, libc::SIGCONT);
        let status = child.wait().unwrap();
        said.push_str(&rest.join().unwrap());
        assert_eq!(status.code(), Some(143), "round {round}: {said}");
        assert!(
            said.contains("given up without waiting for the answer")
                && !said.contains("could not be withdrawn"),
            "round {round}: the leave was not sent to the node reachable again: {said}"
        );
        let left = eventually(Duration::from_secs(10), || {
            s.cmd::<u64>(&["ZCARD", &queue_key(&name)]) == 0
        });
        assert!(
            left,
            "round {round}: the signalled waiter stayed queued: {said}"
        );
    }
}
