//! The rollback of an attempt that timed out on a stalled node goes on that node's old connection
//! and on a new one, and leaves the attempt's tombstone (the record of its token's release), which
//! the attempt reads should it run late (docs/redlock.md, "Rollback"). These tests try to make
//! that leave something behind, cost more than a node timeout, or get in the way of what else runs.
//!
//! Most of them stand a stalled node by a loopback listener that accepts connections, as a stopped
//! server's kernel does, and keeps what lockctl sends on each without answering; once lockctl has
//! exited, the test plays those bytes to a real server in the order it chooses (as
//! `tests/late_attempt.rs` does). The others stop a real server (SIGSTOP). Every server here is
//! started by its test, so the restart quarantine is off (`support::lockctl`).

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::stopped::{accept, all_closed, keep, name, parse, play, Command, Kept, Stopped};
use support::*;

fn is_script(cmd: &Command) -> bool {
    matches!(name(cmd).as_str(), "EVAL" | "EVALSHA")
}

/// Runs every command of `conn` on `s`, in order; errors are the server's answers to nobody.
fn play_all(s: &Server, conn: &[Command]) {
    for cmd in conn {
        let _ = play(s, cmd);
    }
}

const PEER: &str = "peer-token";

/// The keys of lock `name` on `s`, the release records and the fencing counter aside.
fn left(s: &Server, name: &str) -> Vec<String> {
    let fence = format!("{{lockctl:{name}}}\u{1f}fence");
    s.keys()
        .into_iter()
        .filter(|k| k.contains(name) && *k != fence)
        .collect()
}

/// The records (release records and tombstones) of lock `name` on `s`.
fn records(s: &Server, name: &str) -> Vec<String> {
    let all: Vec<String> = s.cmd(&["KEYS", "*"]);
    all.into_iter()
        .filter(|k| k.contains(name) && is_release_record(k))
        .collect()
}

/// Runs the scripts once on `s` so that a played EVALSHA finds them.
fn warm_up(s: &Server) {
    let o = run(lockctl_on(s).args(["exec", "warm-up", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let _: String = s.cmd(&[
        "SCRIPT",
        "LOAD",
        include_str!("../src/lock/scripts/fence.lua"),
    ]);
}

/// What lockctl sent to a stalled node: the connection of the attempt (the attempt first, then
/// what followed it there) and every other connection (sent without waiting).
struct Sent {
    attempt: Vec<Command>,
    others: Vec<Vec<Command>>,
}

impl Sent {
    fn from(conns: Vec<Vec<Command>>) -> Sent {
        let (attempts, others): (Vec<_>, Vec<_>) = conns
            .into_iter()
            .filter(|c| !c.is_empty())
            .partition(|c| name(&c[0]) == "EVALSHA");
        assert_eq!(attempts.len(), 1, "one attempt: {attempts:?}");
        for c in &others {
            for cmd in c {
                assert_eq!(name(cmd), "EVAL", "sent without waiting: {}", name(cmd));
            }
        }
        Sent {
            attempt: attempts.into_iter().next().unwrap(),
            others,
        }
    }
}

/// `refuse` run until its rollback went on a new connection too (a tombstone was sent), at most
/// three times. Under a loaded machine that connection may not open within the node timeout, the
/// documented case where only the old connection carries the rollback (`docs/redlock.md`): those
/// runs show nothing about the tombstone and are tried again, but one in three must send it.
fn tombstoned(mut refuse: impl FnMut() -> Sent) -> Sent {
    for _ in 0..3 {
        let sent = refuse();
        if !sent.others.is_empty() {
            return sent;
        }
        eprintln!("no new connection for the rollback this time (loaded machine?); again");
    }
    panic!("three refused attempts and not one rollback went on a new connection");
}

/// One refused attempt on lock `name` by Redlock over `s[0]`, `s[1]` (held by a peer) and a
/// stopped node standing for `s[2]`; `args` after `acquire NAME`. Returns what node 2 was sent.
fn refused_with_a_stalled_node(s: &Servers, name: &str, args: &[&str]) -> Sent {
    for i in [0, 1] {
        let _: () = s[i].cmd(&["SET", &format!("lockctl:{name}"), PEER, "PX", "60000"]);
    }
    tombstoned(|| {
        let stopped = Stopped::start();
        let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(["acquire", name, "--verbose"])
            .args(args));
        assert_eq!(code(&o), 75, "{}", stderr(&o));
        Sent::from(stopped.closed())
    })
}

/// The answer's first item: 1 granted.
fn granted(answer: &redis::Value) -> bool {
    match answer {
        redis::Value::Array(items) => matches!(items.first(), Some(redis::Value::Int(1))),
        other => panic!("the acquire script answered {other:?}"),
    }
}

/// A node that runs at its memory limit (`maxmemory-policy noeviction`, the policy `doctor` asks
/// for) refuses writes that add memory once it is over the limit, and a script's first such write
/// aborts the script; a delete is still allowed. The late attempt granted (its writes took the node
/// over, or another client's did), then the rollbacks run: the rollback must still delete the grant.
/// It did before the tombstone (a delete first); a rollback that writes its tombstone before it
/// deletes is refused whole, and the grant stays for the lease's TTL. Both cases: the server had
/// not read the attempt when it stopped (the old connection runs whole), and it had (only the
/// attempt runs there).
#[test]
fn a_rollback_at_the_memory_limit_still_deletes_the_late_grant() {
    for whole in [true, false] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let sent = refused_with_a_stalled_node(&s, "full", &["-n", "--ttl", "60s"]);
        let answer = play(&s[2], &sent.attempt[0]).expect("the late attempt runs");
        assert!(granted(&answer), "{answer:?}");
        // The memory is full from here on.
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        if whole {
            play_all(&s[2], &sent.attempt[1..]);
        }
        for c in &sent.others {
            play_all(&s[2], c);
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        assert_eq!(
            left(&s[2], "full"),
            Vec::<String>::new(),
            "whole {whole}: the late grant outlived its rollback at the memory limit: {:?}",
            snapshot(&s[2])
        );
    }
}

/// The other order at the memory limit: the rollback runs first and deletes nothing. A server over
/// its maxmemory lets the late attempt after it through (the acquire script's first write is one
/// that such a server lets through, and its writes after it go too), so the tombstone must be
/// written there as well, or the late grant stays for its TTL.
#[test]
fn at_the_memory_limit_a_rollback_that_deletes_nothing_still_leaves_its_tombstone() {
    let s = Servers::start(3);
    warm_up(&s[2]);
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    let sent = refused_with_a_stalled_node(&s, "full2", &["-n", "--ttl", "60s"]);
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    for c in &sent.others {
        play_all(&s[2], c);
    }
    let answer = play(&s[2], &sent.attempt[0]);
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    assert_eq!(
        left(&s[2], "full2"),
        Vec::<String>::new(),
        "the late attempt answered {answer:?}"
    );
    assert_eq!(records(&s[2], "full2").len(), 1, "no tombstone");
}

/// The rollback ran (on the new connection), then the server stalled again for longer than the
/// lease's TTL before it ran the old connection: the tombstone is gone by then. If the server had
/// not read the attempt when it first stopped, the old connection carries the rollback behind the
/// attempt and nothing stays. If it had (only the attempt runs), the late grant stays, but for no
/// longer than its TTL: what happened to every such grant before the tombstone.
#[test]
fn a_second_stall_longer_than_the_ttl_leaves_no_more_than_before() {
    for whole in [true, false] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        let sent = refused_with_a_stalled_node(&s, "twice", &["-n", "--ttl", "1s"]);
        for c in &sent.others {
            play_all(&s[2], c);
        }
        assert_eq!(records(&s[2], "twice").len(), 1, "no tombstone");
        assert!(
            eventually(Duration::from_secs(30), || records(&s[2], "twice")
                .is_empty()),
            "the tombstone outlived the TTL"
        );
        let answer = play(&s[2], &sent.attempt[0]).expect("the late attempt runs");
        if whole {
            play_all(&s[2], &sent.attempt[1..]);
            assert_eq!(left(&s[2], "twice"), Vec::<String>::new(), "{answer:?}");
        } else {
            assert!(granted(&answer), "{answer:?}");
            let pttl: i64 = s[2].cmd(&["PTTL", "lockctl:twice"]);
            assert!(pttl > 0 && pttl <= 1000, "{pttl}");
            assert!(
                eventually(Duration::from_secs(30), || left(&s[2], "twice").is_empty()),
                "{:?}",
                snapshot(&s[2])
            );
        }
    }
}

/// `--limit 2`: the late attempt takes a slot (and the limit key) or nothing, whichever order the
/// server runs the connections in; nothing stays, the limit key included.
#[test]
fn a_late_semaphore_attempt_leaves_no_slot_and_no_limit() {
    for attempt_first in [true, false] {
        for whole in [true, false] {
            let s = Servers::start(3);
            warm_up(&s[2]);
            // Both slots held by lockctl grants on nodes 0 and 1, none on node 2.
            for i in [0, 1] {
                for _ in 0..2 {
                    let o =
                        run(lockctl_on(&s[i])
                            .args(["acquire", "sem", "--limit", "2", "--ttl", "60s"]));
                    assert_eq!(code(&o), 0, "{}", stderr(&o));
                }
            }
            let sent = tombstoned(|| {
                let stopped = Stopped::start();
                let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
                let o = run(lockctl()
                    .env("LOCKCTL_REDIS", urls)
                    .env("LOCKCTL_NODE_TIMEOUT", "1s")
                    .args(["acquire", "sem", "--limit", "2", "-n", "--ttl", "60s"]));
                assert_eq!(code(&o), 75, "{}", stderr(&o));
                Sent::from(stopped.closed())
            });
            let mut answer = None;
            if attempt_first {
                answer = Some(play(&s[2], &sent.attempt[0]).unwrap());
                if whole {
                    play_all(&s[2], &sent.attempt[1..]);
                }
            }
            for c in &sent.others {
                play_all(&s[2], c);
            }
            if !attempt_first {
                answer = Some(play(&s[2], &sent.attempt[0]).unwrap());
                if whole {
                    play_all(&s[2], &sent.attempt[1..]);
                }
                assert!(!granted(answer.as_ref().unwrap()), "{answer:?}");
            } else {
                assert!(granted(answer.as_ref().unwrap()), "{answer:?}");
            }
            assert_eq!(
                left(&s[2], "sem"),
                Vec::<String>::new(),
                "attempt first {attempt_first}, whole {whole}: {answer:?}"
            );
        }
    }
}

/// A waiter queued behind another (`-w`, the lock held on every node): its attempts on the stalled
/// node are rolled back and it leaves at its deadline; played in either order, node 2 keeps the
/// first waiter where it stood (its ticket, its record) and nothing of the second.
#[test]
fn a_late_waiter_attempt_keeps_the_queue_as_it_was() {
    for attempt_first in [true, false] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        for i in 0..3 {
            let _: () = s[i].cmd(&["SET", "lockctl:q", PEER, "PX", "60000"]);
        }
        // The first waiter, queued on node 2 directly (on the others it does not matter).
        let mut first = lockctl_on(&s[2])
            .args(["acquire", "q", "-w", "60s"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let queue = "{lockctl:q}\u{1f}queue";
        assert!(eventually(Duration::from_secs(30), || s[2]
            .cmd::<u64>(&["ZCARD", queue])
            == 1));
        let before: Vec<String> = s[2].cmd(&["ZRANGE", queue, "0", "-1", "WITHSCORES"]);
        let stopped = Stopped::start();
        let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(["acquire", "q", "-w", "200ms", "--supersede"]));
        assert_eq!(code(&o), 75, "{}", stderr(&o));
        let conns = stopped.closed();
        let attempts: Vec<&Vec<Command>> = conns
            .iter()
            .filter(|c| c.first().is_some_and(|c| name(c) == "EVALSHA"))
            .collect();
        assert!(!attempts.is_empty(), "{conns:?}");
        let blind: Vec<&Vec<Command>> = conns
            .iter()
            .filter(|c| c.first().is_some_and(|c| name(c) == "EVAL"))
            .collect();
        // Of each attempt's connection only the attempt runs (the worst case).
        if attempt_first {
            for a in &attempts {
                let _ = play(&s[2], &a[0]);
            }
        }
        for c in &blind {
            play_all(&s[2], c);
        }
        if !attempt_first {
            for a in &attempts {
                let _ = play(&s[2], &a[0]);
            }
        }
        let after: Vec<String> = s[2].cmd(&["ZRANGE", queue, "0", "-1", "WITHSCORES"]);
        assert_eq!(
            after,
            before,
            "attempt first {attempt_first}: {:?}",
            snapshot(&s[2])
        );
        let waiters: u64 = s[2].cmd(&["HLEN", "{lockctl:q}\u{1f}waiters"]);
        assert_eq!(waiters, 1, "{:?}", snapshot(&s[2]));
        let superseded: Vec<String> = s[2].cmd(&["KEYS", "*superseded*"]);
        assert!(superseded.is_empty(), "{:?}", snapshot(&s[2]));
        assert_eq!(s[2].get("lockctl:q").as_deref(), Some(PEER));
        kill(first.id() as i32, libc::SIGKILL);
        let _ = first.wait();
    }
}

/// Round 2 (`fence.lua`) rather than round 1 times out: node 2 granted in round 1, then stopped
/// before it ran the raise of its fencing counter. The attempt fails (one node won of three), and
/// the rollback goes on the old connection behind the raise and on a new one. Whichever runs first,
/// node 2 keeps nothing of the attempt.
#[test]
fn a_node_stalled_at_round_two_keeps_nothing() {
    for rollback_first in [false, true] {
        let s = Servers(vec![Server::start(), Server::start(), Server::start_tcp()]);
        warm_up(&s[2]);
        let _: () = s[0].cmd(&["SET", "lockctl:r2", PEER, "PX", "60000"]);
        // Node 1's counter is far ahead, so node 2's round-1 fence is behind and round 2 goes there.
        let _: () = s[1].cmd(&["SET", "{lockctl:r2}\u{1f}fence", "9000000000000000000"]);
        let freeze = Freeze::start(s[2].port.unwrap());
        let urls = format!("{},{},{}", s[0].url(), s[1].url(), freeze.url());
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "1s")
            .args(["acquire", "r2", "-n", "--ttl", "60s", "--verbose"]));
        let e = stderr(&o);
        assert_eq!(code(&o), 75, "{e}");
        assert!(e.contains("raise fence"), "no round 2 timed out: {e}");
        let kept = all_closed(&freeze.kept);
        // The frozen connection: the raise, then the rollback; a new one: the rollback.
        let (frozen, new): (Vec<_>, Vec<_>) = kept
            .into_iter()
            .filter(|c| !c.is_empty())
            .partition(|c| name(&c[0]) == "EVALSHA");
        assert_eq!(frozen.len(), 1, "{frozen:?}");
        assert!(!new.is_empty(), "no rollback on a new connection: {e}");
        // The grant of round 1 is there now.
        assert!(s[2].get("lockctl:r2").is_some());
        if rollback_first {
            for c in &new {
                play_all(&s[2], c);
            }
        }
        // Only the raise runs of the frozen connection (the server had read it when it stopped).
        let _ = play(&s[2], &frozen[0][0]);
        if !rollback_first {
            for c in &new {
                play_all(&s[2], c);
            }
        }
        assert_eq!(
            left(&s[2], "r2"),
            Vec::<String>::new(),
            "rollback first {rollback_first}: {:?}",
            snapshot(&s[2])
        );
        assert_eq!(left(&s[1], "r2"), Vec::<String>::new(), "node 1");
    }
}

/// A proxy in front of a real server that passes its first connection through until it sends its
/// second script (round 2 after round 1), then stands for a stopped server: from that command on,
/// and on every later connection (an acquire with `-n` opens one for its attempt; a later one is
/// the rollback's), it keeps what the client sends and answers nothing.
struct Freeze {
    port: u16,
    kept: Arc<Mutex<Vec<Kept>>>,
}

impl Freeze {
    fn start(upstream: u16) -> Freeze {
        let (port, kept) = accept(move |client, mine, i| {
            if i > 0 {
                keep(client, mine);
                return;
            }
            let server = TcpStream::connect(("127.0.0.1", upstream)).unwrap();
            proxy::one_way(server.try_clone().unwrap(), client.try_clone().unwrap());
            std::thread::spawn(move || {
                let (mut c_in, mut s_out) = (client, server);
                let mut pending = Vec::new();
                let mut scripts = 0;
                let mut buf = [0u8; 16384];
                let mut held = false;
                while let Ok(n @ 1..) = c_in.read(&mut buf) {
                    if held {
                        mine.lock().unwrap().0.extend_from_slice(&buf[..n]);
                        continue;
                    }
                    pending.extend_from_slice(&buf[..n]);
                    let (cmds, used) = parse(&pending);
                    // Where the second script starts, if it came.
                    let mut at = 0;
                    let mut cut = None;
                    for cmd in &cmds {
                        if is_script(cmd) {
                            scripts += 1;
                            if scripts == 2 {
                                cut = Some(at);
                                break;
                            }
                        }
                        at += encoded_len(cmd);
                    }
                    let pass = cut.unwrap_or(used);
                    let _ = s_out.write_all(&pending[..pass]);
                    if cut.is_some() {
                        held = true;
                        mine.lock().unwrap().0.extend_from_slice(&pending[pass..]);
                        pending.clear();
                    } else {
                        pending.drain(..pass);
                    }
                }
                mine.lock().unwrap().1 = true;
                let _ = s_out.shutdown(std::net::Shutdown::Write);
            });
        });
        Freeze { port, kept }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

/// The bytes of one command as a client sends it (RESP array of bulk strings).
fn encoded_len(cmd: &Command) -> usize {
    let mut n = format!("*{}\r\n", cmd.len()).len();
    for a in cmd {
        n += format!("${}\r\n", a.len()).len() + a.len() + 2;
    }
    n
}

/// Redlock over five nodes, two of them stopped for real (SIGSTOP) while the attempt is refused:
/// the acquire ends within a bound of a few node timeouts, and once the two run again neither keeps
/// anything of the attempt, and each has the attempt's tombstone.
#[test]
fn five_nodes_two_stopped_keep_nothing() {
    let s = Servers::start(5);
    for i in [3, 4] {
        warm_up(&s[i]);
    }
    for i in 0..3 {
        let _: () = s[i].cmd(&["SET", "lockctl:five", PEER, "PX", "60000"]);
    }
    s[3].pause();
    s[4].pause();
    let started = Instant::now();
    let o = run(s
        .lockctl()
        .env("LOCKCTL_NODE_TIMEOUT", "500ms")
        .args(["acquire", "five", "-n", "--ttl", "20s"]));
    let took = started.elapsed();
    s[3].resume();
    s[4].resume();
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    // One node timeout for the attempt, and the rollbacks go without waiting.
    assert!(took < Duration::from_secs(10), "{took:?}");
    for i in [3, 4] {
        assert!(
            eventually(Duration::from_secs(10), || records(&s[i], "five").len()
                == 1),
            "node {i}: no tombstone: {:?}",
            snapshot(&s[i])
        );
        assert!(
            eventually(Duration::from_secs(10), || left(&s[i], "five").is_empty()),
            "node {i}: {:?}",
            snapshot(&s[i])
        );
    }
}

/// A listener's pending connections past its backlog wait in connect(2) (a unix socket), or their
/// SYN is dropped (TCP). A server that stops with its accept queue all but full takes the attempt's
/// connection, then none: the rollback's new connection cannot be made. It gives up within the node
/// timeout (the acquire ends within a bound of a few node timeouts, not hanging), and the old
/// connection still carries the rollback, which the server, not having read the attempt, runs
/// after it: nothing stays. On TCP the node is named `localhost`, whose connect runs on a helper
/// thread.
#[test]
fn a_full_accept_queue_costs_the_rollback_no_more_than_a_node_timeout() {
    for tcp in [false, true] {
        let s = Servers(vec![
            Server::start(),
            Server::start(),
            if tcp {
                Server::tcp_with_args(&["--tcp-backlog", "4"])
            } else {
                Server::with_args(&["--tcp-backlog", "4"])
            },
        ]);
        warm_up(&s[2]);
        for i in [0, 1] {
            let _: () = s[i].cmd(&["SET", "lockctl:backlog", PEER, "PX", "60000"]);
        }
        let target = if tcp {
            Target::Tcp(s[2].port.unwrap())
        } else {
            Target::Unix(s[2].socket())
        };
        let accepted = || -> usize {
            let info: String = s[2].cmd(&["INFO", "stats"]);
            info.lines()
                .find_map(|l| l.strip_prefix("total_connections_received:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("total_connections_received")
        };
        // The queue's capacity: fill it while the server is stopped, then let it take them all.
        let base = accepted();
        s[2].pause();
        let filled = target.fill(usize::MAX);
        let capacity = filled.len();
        drop(filled);
        s[2].resume();
        assert!(
            eventually(Duration::from_secs(30), || accepted() > base + capacity),
            "the server did not take the {capacity} connections"
        );
        // Stopped again with one place left, for the attempt's connection.
        s[2].pause();
        let held = target.fill(capacity - 1);
        assert_eq!(held.len(), capacity - 1, "tcp {tcp}");
        let node2 = match &target {
            Target::Tcp(port) => format!("redis://localhost:{port}"),
            Target::Unix(_) => s[2].url(),
        };
        let started = Instant::now();
        let o = run(lockctl()
            .env(
                "LOCKCTL_REDIS",
                format!("{},{},{node2}", s[0].url(), s[1].url()),
            )
            .env("LOCKCTL_NODE_TIMEOUT", "2s")
            .args(["acquire", "backlog", "-n", "--ttl", "60s", "--verbose"]));
        let took = started.elapsed();
        s[2].resume();
        drop(held);
        let e = stderr(&o);
        assert_eq!(code(&o), 75, "tcp {tcp}: {e}");
        eprintln!("tcp {tcp}: capacity {capacity}, acquire took {took:?}");
        // Two node timeouts at most (the attempt's, the rollback's connect), and a generous margin.
        assert!(took < Duration::from_secs(12), "tcp {tcp}: {took:?}: {e}");
        assert!(
            e.contains("sent without waiting"),
            "tcp {tcp}: no rollback went out on the old connection: {e}"
        );
        assert!(
            !e.contains("sent on a new connection too"),
            "tcp {tcp}: the new connection was made, so the queue was not full: {e}"
        );
        assert!(
            eventually(Duration::from_secs(10), || left(&s[2], "backlog")
                .is_empty()),
            "tcp {tcp}: {:?}; {e}",
            snapshot(&s[2])
        );
    }
}

/// Where a stopped server listens, for filling its accept queue.
enum Target {
    Unix(std::path::PathBuf),
    Tcp(u16),
}

/// Connections a test holds open; closed on drop.
enum Held {
    Fds(Vec<i32>),
    Streams(Vec<TcpStream>),
}

impl Held {
    fn len(&self) -> usize {
        match self {
            Held::Fds(f) => f.len(),
            Held::Streams(s) => s.len(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::Fds(fds) = self {
            close_all(std::mem::take(fds));
        }
    }
}

impl Target {
    /// Up to `most` connections (fewer when the queue fills).
    fn fill(&self, most: usize) -> Held {
        match self {
            Target::Unix(path) => Held::Fds(fill(path, most)),
            Target::Tcp(port) => {
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], *port));
                let mut streams = Vec::new();
                while streams.len() < most {
                    match TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                        Ok(c) => streams.push(c),
                        Err(_) => break,
                    }
                    assert!(streams.len() < 100_000, "the accept queue never filled");
                }
                Held::Streams(streams)
            }
        }
    }
}

/// Up to `most` connections to the unix socket at `path` (fewer when its queue fills).
fn fill(path: &std::path::Path, most: usize) -> Vec<i32> {
    let mut fds = Vec::new();
    while fds.len() < most {
        match connect_nonblocking(path) {
            Some(fd) => fds.push(fd),
            None => break,
        }
        assert!(fds.len() < 100_000, "the accept queue never filled");
    }
    fds
}

fn close_all(fds: Vec<i32>) {
    for fd in fds {
        // SAFETY: closing a descriptor this test opened.
        unsafe { libc::close(fd) };
    }
}

/// A non-blocking connect(2) to a unix socket: the descriptor, or `None` when the listener's queue
/// is full (EAGAIN).
fn connect_nonblocking(path: &std::path::Path) -> Option<i32> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain socket(2)/connect(2) on a sockaddr_un built here; the descriptor is returned.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_NONBLOCK, 0);
        assert!(fd >= 0);
        let mut addr: libc::sockaddr_un = std::mem::zeroed();
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
        if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) == 0 {
            Some(fd)
        } else {
            libc::close(fd);
            None
        }
    }
}

/// `exec` whose first attempts time out on a stopped node and are refused (the lock is held
/// elsewhere for a few seconds), each leaving its tombstone there, gets the lock once the node runs
/// again and the holder's key expires: a later attempt has a token of its own, which no tombstone
/// stops, so it wins all three nodes. Once it released, node 2 keeps nothing but tombstones.
#[test]
fn exec_wins_every_node_after_its_tombstoned_attempts() {
    let s = Servers::start(3);
    warm_up(&s[2]);
    // Both keys end at the same instant (PXAT): with PX, set one after the other, an attempt
    // between their two ends won node 0 or 1 with node 2 and got 2 of 3 (a full run, loaded).
    let ends = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3000;
    for i in [0, 1] {
        let _: () = s[i].cmd(&["SET", "lockctl:later", PEER, "PXAT", &ends.to_string()]);
    }
    s[2].pause();
    let mut child = s
        .lockctl()
        .env("LOCKCTL_NODE_TIMEOUT", "300ms")
        .args(["exec", "later", "-w", "60s", "--verbose", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        let n = std::io::BufRead::read_line(&mut err, &mut line).unwrap();
        assert!(
            n > 0,
            "exec ended before a rollback on a new connection: {seen}"
        );
        seen.push_str(&line);
        if line.contains("sent on a new connection too") {
            break;
        }
    }
    s[2].resume();
    let rest = collect_stderr_of(err);
    let o = wait_output(child, Duration::from_secs(60));
    seen.push_str(&rest.join().unwrap());
    assert_eq!(code(&o), 0, "{seen}");
    assert!(seen.contains("3/3 node(s) won"), "{seen}");
    assert!(!records(&s[2], "later").is_empty(), "no tombstone: {seen}");
    for i in 0..3 {
        assert_eq!(left(&s[i], "later"), Vec::<String>::new(), "node {i}");
    }
}

fn collect_stderr_of(
    mut err: std::io::BufReader<std::process::ChildStderr>,
) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    })
}

/// A node whose URL names a database other than 0 gets no new connection for a rollback its old
/// connection carries (a new one would send SELECT unanswered, in the rollback's write): the
/// rollback goes on the old connection alone, in that database, and database 0 gets nothing. The node is stopped while the waiter sleeps, so that its
/// next attempt times out on the connection its first one opened.
#[test]
fn a_node_with_a_database_number_gets_its_rollback_in_that_database() {
    let s = Servers(vec![Server::start(), Server::start(), Server::start()]);
    warm_up(&s[2]);
    for i in [0, 1] {
        let _: () = s[i].cmd(&["SET", "lockctl:db", PEER, "PX", "60000"]);
    }
    let mut c = s[2].conn();
    let _: () = redis::cmd("SELECT").arg(3).query(&mut c).unwrap();
    let _: () = redis::cmd("SET")
        .arg("lockctl:db")
        .arg(PEER)
        .arg("PX")
        .arg(60000)
        .query(&mut c)
        .unwrap();
    drop(c);
    let url = format!("unix://{}?db=3", s[2].socket().display());
    let urls = format!("{},{},{url}", s[0].url(), s[1].url());
    let o = change_during_a_sleep(
        lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(["acquire", "db", "-w", "2s", "--verbose"]),
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
    // Database 0 has nothing of the lock, not even a record.
    let all: Vec<String> = s[2].cmd(&["KEYS", "*db*"]);
    assert!(all.is_empty(), "database 0: {all:?}");
    // Database 3: the peer's key and no grant of ours; the waiter's record, whose leave could not
    // reach a stopped node that needs SELECT answered (as before), is shown by nobody once its
    // lifetime passed (the queue's keys go later).
    let mut c = s[2].conn();
    let _: () = redis::cmd("SELECT").arg(3).query(&mut c).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    assert!(
        !keys.iter().any(|k| k.contains("\u{1f}holder")),
        "database 3: {keys:?}"
    );
    let peer: Option<String> = redis::cmd("GET").arg("lockctl:db").query(&mut c).unwrap();
    assert_eq!(peer.as_deref(), Some(PEER));
    let waiters = || -> usize {
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", &url)
            .args(["status", "db", "--format", "json"]));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("status JSON");
        v["waiters"].as_array().map_or(0, Vec::len)
    };
    assert!(
        eventually(Duration::from_secs(20), || waiters() == 0),
        "database 3 still shows a waiter: {keys:?}; {e}"
    );
}

/// `status`, `list`, `break` and `doctor` on a node that holds only an attempt's tombstone (the
/// rollback ran, the late attempt after it changed nothing), under the default prefix and an empty
/// one (where a SCAN for lock keys matches every key): the lock is free, nobody waits, nothing is
/// listed, nothing is broken, and `doctor` runs its checks through.
#[test]
fn the_inspecting_commands_see_nothing_in_a_tombstone() {
    for prefix in ["lockctl:", ""] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        for i in [0, 1] {
            let _: () = s[i].cmd(&["SET", &format!("{prefix}insp"), PEER, "PX", "60000"]);
        }
        let sent = tombstoned(|| {
            let stopped = Stopped::start();
            let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
            let o = run(lockctl()
                .env("LOCKCTL_REDIS", urls)
                .env("LOCKCTL_NODE_TIMEOUT", "1s")
                .args(["--prefix", prefix, "acquire", "insp", "-n", "--ttl", "60s"]));
            assert_eq!(code(&o), 75, "{}", stderr(&o));
            Sent::from(stopped.closed())
        });
        for c in &sent.others {
            play_all(&s[2], c);
        }
        let answer = play(&s[2], &sent.attempt[0]).unwrap();
        assert!(!granted(&answer), "{answer:?}");
        let all: Vec<String> = s[2].cmd(&["KEYS", "*insp*"]);
        assert_eq!(all.len(), 1, "prefix {prefix:?}: {all:?}");
        assert!(is_release_record(&all[0]), "{all:?}");
        let on = |args: &[&str]| run(lockctl_on(&s[2]).env("LOCKCTL_PREFIX", prefix).args(args));
        let o = on(&["status", "insp", "--format", "json"]);
        assert_eq!(code(&o), 1, "prefix {prefix:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert!(
            v["holders"].as_array().is_none_or(|h| h.is_empty())
                && v["waiters"].as_array().is_none_or(|w| w.is_empty()),
            "prefix {prefix:?}: {v}"
        );
        let o = on(&["list", "--format", "json"]);
        assert_eq!(code(&o), 0, "prefix {prefix:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let rows = v.as_array().or_else(|| v["locks"].as_array());
        assert!(rows.is_some_and(|r| r.is_empty()), "prefix {prefix:?}: {v}");
        let o = on(&["break", "insp", "--yes"]);
        assert_eq!(code(&o), 1, "prefix {prefix:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("free; nothing to break"),
            "{}",
            stderr(&o)
        );
        let o = on(&["doctor", "--format", "json"]);
        assert!(
            matches!(code(&o), 0 | 1),
            "prefix {prefix:?}: {}",
            stderr(&o)
        );
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let text = v.to_string();
        assert!(
            !text.contains("the acquire script") && !text.contains("the release script"),
            "prefix {prefix:?}: {text}"
        );
        // The tombstone is still there: they ran beside it (beside the break's own record of its
        // answer, `release\x1fbreak.<id>`, which a break sent again reads).
        let all: Vec<String> = s[2].cmd(&["KEYS", "*insp*"]);
        let kept: Vec<&String> = all.iter().filter(|k| !k.contains("\u{1f}break.")).collect();
        assert_eq!(kept.len(), 1, "{all:?}");
    }
}

/// A client killed (SIGKILL) while it waits for a stopped node's answer sends no rollback: the late
/// attempt grants there when the node runs it, no tombstone is left, and the grant goes with its
/// TTL, as before the tombstone.
#[test]
fn a_client_killed_before_its_rollback_leaves_a_grant_for_its_ttl_only() {
    let s = Servers::start(3);
    warm_up(&s[2]);
    for i in [0, 1] {
        let _: () = s[i].cmd(&["SET", "lockctl:killed", PEER, "PX", "60000"]);
    }
    let stopped = Stopped::start();
    let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
    let mut child = lockctl()
        .env("LOCKCTL_REDIS", urls)
        .env("LOCKCTL_NODE_TIMEOUT", "20s")
        .args(["acquire", "killed", "-n", "--ttl", "3s"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the attempt has reached the stopped node.
    let sent = || {
        stopped.conns.lock().unwrap().iter().any(|c| {
            parse(&c.lock().unwrap().0)
                .0
                .iter()
                .any(|cmd| name(cmd) == "EVALSHA")
        })
    };
    assert!(eventually(Duration::from_secs(30), sent), "no attempt came");
    kill(child.id() as i32, libc::SIGKILL);
    let _ = child.wait();
    let conns: Vec<Vec<Command>> = stopped
        .closed()
        .into_iter()
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(conns.len(), 1, "{conns:?}");
    // The attempt, and the INFO a new connection sends along with its first command.
    let names: Vec<String> = conns[0].iter().map(name).collect();
    assert!(
        names[0] == "EVALSHA" && names[1..].iter().all(|n| n == "INFO"),
        "a rollback was sent: {names:?}"
    );
    let answer = play(&s[2], &conns[0][0]).unwrap();
    assert!(granted(&answer), "{answer:?}");
    let pttl: i64 = s[2].cmd(&["PTTL", "lockctl:killed"]);
    assert!(pttl > 0 && pttl <= 3000, "{pttl}");
    assert!(records(&s[2], "killed").is_empty());
    assert!(
        eventually(Duration::from_secs(30), || left(&s[2], "killed").is_empty()),
        "{:?}",
        snapshot(&s[2])
    );
}

/// On Redis Cluster the attempt's tombstone must sit in the lock's hash slot, or neither
/// `acquire.lua` (which reads it) nor the rollback (which writes it) could run there (CROSSSLOT).
/// Redlock over two servers held by a peer and a cluster node that owns the lock's slot, stopped
/// (SIGSTOP, well within the cluster's node timeout) while the attempt is refused: once it runs
/// again it has the tombstone and nothing of the attempt, for a plain name and a braced one.
#[test]
fn on_a_cluster_the_tombstone_is_in_the_lock_slot() {
    let cluster = support::topology::Cluster::start();
    let s = Servers::start(2);
    for name in ["plain", "a{b}c"] {
        let key = format!("lockctl:{name}");
        let owner_port = cluster.owner(&key);
        let owner = cluster.nodes.iter().find(|n| n.port == owner_port).unwrap();
        // The late attempt runs there, not NOSCRIPT.
        let _: String = owner
            .cmd(&[
                "SCRIPT",
                "LOAD",
                concat!(
                    include_str!("../src/lock/scripts/front.lua"),
                    include_str!("../src/lock/scripts/acquire.lua")
                ),
            ])
            .unwrap();
        for i in [0, 1] {
            let _: () = s[i].cmd(&["SET", &key, PEER, "PX", "60000"]);
        }
        kill(owner.pid(), libc::SIGSTOP);
        let o = run(lockctl()
            .env(
                "LOCKCTL_REDIS",
                format!("{},redis://127.0.0.1:{owner_port}", s.urls()),
            )
            .env("LOCKCTL_NODE_TIMEOUT", "1s")
            .args(["acquire", name, "-n", "--ttl", "30s", "--verbose"]));
        kill(owner.pid(), libc::SIGCONT);
        let e = stderr(&o);
        assert_eq!(code(&o), 75, "{name}: {e}");
        assert!(e.contains("sent on a new connection too"), "{name}: {e}");
        let on_owner = || -> Vec<String> {
            let all: Vec<String> = owner.cmd(&["KEYS", "*"]).unwrap();
            all.into_iter()
                .filter(|k| k.contains(&key) && !k.ends_with("\u{1f}fence"))
                .collect()
        };
        assert!(
            eventually(Duration::from_secs(10), || {
                let k = on_owner();
                k.len() == 1 && is_release_record(&k[0])
            }),
            "{name}: the owner keeps {:?}; {e}",
            on_owner()
        );
    }
}

/// A release of a token whose rollback left its tombstone (`release --token T`, T the refused
/// attempt's): the tombstone's empty id is no release call's, so it answers "not held" (exit 76)
/// rather than taking the tombstone for its own first send's record; it leaves the tombstone as it
/// was, and the late attempt after it still changes nothing.
#[test]
fn a_release_of_a_tombstoned_token_is_not_fooled() {
    let s = Servers::start(3);
    warm_up(&s[2]);
    let sent = refused_with_a_stalled_node(&s, "tok", &["-n", "--ttl", "60s"]);
    for c in &sent.others {
        play_all(&s[2], c);
    }
    // EVALSHA sha numkeys KEYS... ARGV...: the token is ARGV[1].
    let attempt = &sent.attempt[0];
    let numkeys: usize = String::from_utf8_lossy(&attempt[2]).parse().unwrap();
    let token = String::from_utf8_lossy(&attempt[3 + numkeys]).into_owned();
    let tomb = records(&s[2], "tok");
    assert_eq!(tomb.len(), 1);
    let before = s[2].get(&tomb[0]);
    for urls in [s.urls(), s[2].url()] {
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", urls)
            .args(["release", "tok", "--token", &token]));
        assert_eq!(code(&o), 76, "{}", stderr(&o));
    }
    assert_eq!(s[2].get(&tomb[0]), before);
    let answer = play(&s[2], attempt).unwrap();
    assert!(!granted(&answer), "{answer:?}");
    assert_eq!(left(&s[2], "tok"), Vec::<String>::new());
}
