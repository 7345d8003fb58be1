//! A review of 91bc28a ("Redlock: a waiter granted after a cut read leaves the nodes where a stray
//! grant's rollback put it back"): after a grant, lockctl leaves the queue on the nodes that did
//! not grant it when any node gave it a ticket, or where `Place::unsure` says it may be queued
//! unawares (a stray or rolled-back grant, an answer never read).
//!
//! The promise attacked: once every lockctl has exited, no node keeps a waiter record (`queue`,
//! `alive`, `waiters`) or a slot, holder or `limit` key of a process that is gone, beyond what
//! docs/queue.md documents (a waiter killed -9, a node stalled: within a front lifetime); and a
//! grant beside a node that is down, stopped or refusing costs no extra node timeout for the
//! leave (read from the `-v` timestamps, compared with the node timeout, not with the clock).

mod support;

use std::time::Duration;

use support::hammer::{warm, Traced};
use support::*;

/// A lockctl run that has hung.
const BOUND: Duration = Duration::from_secs(60);

/// The timestamp of a trace line (`lockctl: [ 2010.106 ms] ...`).
fn ts(line: &str) -> Option<f64> {
    let open = line.find('[')?;
    let close = line[open..].find(" ms]")? + open;
    line[open + 1..close].trim().parse().ok()
}

/// Milliseconds from the trace line of the attempt that won to the trace's last line: what the
/// grant did after it had won (its leave), before lockctl printed the token and exited.
fn after_the_grant(trace: &str) -> f64 {
    let lines: Vec<&str> = trace.lines().filter(|l| ts(l).is_some()).collect();
    let won = lines
        .iter()
        .rposition(|l| l.contains("attempt on '") && l.contains("won, quorum"))
        .expect("no attempt in the trace");
    let last = lines.last().and_then(|l| ts(l)).unwrap();
    last - ts(lines[won]).unwrap()
}

/// The keys of lock `name` on `s` that no exited lockctl may leave: the queue's records (`queue`,
/// `alive`, `waiters`), the slots, their holder records and the `limit`.
fn ghosts(s: &Server, name: &str) -> Vec<(String, String)> {
    snapshot(s)
        .into_iter()
        .filter(|(k, _)| {
            k == &format!("lockctl:{name}")
                || (k.starts_with(&format!("{{lockctl:{name}}}"))
                    && ["queue", "alive", "waiters", "slot", "holder", "limit"]
                        .iter()
                        .any(|a| k.contains(&format!("\u{1f}{a}"))))
        })
        .collect()
}

/// The waiter records of lock `name` on `s` (queue entries and records).
fn queued(s: &Server, name: &str) -> (u64, u64) {
    let q: u64 = s.cmd(&["ZCARD", &support::queue::queue_key(name)]);
    let w: u64 = s.cmd(&["HLEN", &format!("{{lockctl:{name}}}\u{1f}waiters")]);
    (q, w)
}

/// Holds `name` with `--limit limit` on `s` alone, for a minute; returns the token.
fn hold_on(s: &Server, name: &str, limit: usize) -> String {
    let o = run(lockctl_on(s)
        .args(["acquire", name, "-n", "--ttl", "60s", "--limit"])
        .arg(limit.to_string()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    stdout(&o)
}

fn release_on(s: &Server, name: &str, token: &str) {
    let o = run(lockctl_on(s).args(["release", name, "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A waiting acquire (`-w 20s`) on three nodes, one of them made faulty by `fault` (index 2), with a
/// 2 s node timeout: the grant (on the other two) must not wait for the faulty node a second time
/// for its leave. Returns the trace.
fn first_try_beside(servers: &Servers, name: &str, limit: usize) -> (String, String) {
    let o = run(servers.lockctl().args([
        "-v",
        "--node-timeout",
        "2s",
        "acquire",
        name,
        "-w",
        "20s",
        "--ttl",
        "30s",
        "--limit",
        &limit.to_string(),
    ]));
    let trace = stderr(&o);
    assert_eq!(code(&o), 0, "{trace}");
    (stdout(&o), trace)
}

/// An uncontended grant beside a stopped server (SIGSTOP): its round 1 there times out (2 s), and
/// the leave that `Place::unsure` sends there goes without waiting, behind the attempt.
fn beside_a_stopped_node(limit: usize) {
    let servers = Servers::start(3);
    let name = "beside-stopped";
    servers[2].pause();
    let (token, trace) = first_try_beside(&servers, name, limit);
    let c = servers[2].url();
    let after = after_the_grant(&trace);
    eprintln!("limit {limit}: {after:.1} ms after the grant\n{trace}");
    assert!(
        after < 1000.0,
        "the grant waited {after:.1} ms after it had won (node timeout 2 s): {trace}"
    );
    assert!(
        !trace.contains(&format!("{c}: leave the queue")),
        "a leave waited for the stopped node: {trace}"
    );
    servers[2].resume();
    // The late attempt ran at the resume (a stray grant there, the slot being free), then the leave;
    // the release takes the stray.
    let o = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for s in &servers.0 {
        assert!(
            eventually(Duration::from_secs(3), || ghosts(s, name).is_empty()),
            "left on {}: {:?}",
            s.url(),
            ghosts(s, name)
        );
    }
}

#[test]
fn a_first_try_grant_beside_a_stopped_node_does_not_wait_for_its_leave() {
    beside_a_stopped_node(1);
}

#[test]
fn a_first_try_semaphore_grant_beside_a_stopped_node_does_not_wait_for_its_leave() {
    beside_a_stopped_node(2);
}

/// A node down (killed): nothing went there, so nothing is left to leave, and no time is spent.
#[test]
fn a_first_try_grant_beside_a_node_down_sends_no_leave() {
    let mut servers = Servers::start(3);
    let name = "beside-down";
    let c = servers[2].url();
    servers[2].kill();
    for limit in [1, 2] {
        let (token, trace) = first_try_beside(&servers, name, limit);
        let after = after_the_grant(&trace);
        eprintln!("limit {limit}: {after:.1} ms after the grant\n{trace}");
        assert!(after < 1000.0, "{after:.1} ms after the grant: {trace}");
        let after_won = &trace[trace.rfind("won, quorum").unwrap()..];
        assert!(
            !after_won.contains(&c),
            "something went to the node that is down after the grant: {trace}"
        );
        let o = run(servers.lockctl().args(["release", name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
}

/// A node that refuses (a password lockctl lacks: NOAUTH): it ran nothing, so no leave goes there
/// after the grant, and none waits.
#[test]
fn a_first_try_grant_beside_a_refusing_node_sends_no_leave() {
    let servers = Servers::start(3);
    let name = "beside-refusing";
    let c = servers[2].url();
    let ok: String = servers[2].cmd(&["CONFIG", "SET", "requirepass", "not-given"]);
    assert_eq!(ok, "OK");
    for limit in [1, 2] {
        let (token, trace) = first_try_beside(&servers, name, limit);
        let after = after_the_grant(&trace);
        eprintln!("limit {limit}: {after:.1} ms after the grant\n{trace}");
        assert!(after < 1000.0, "{after:.1} ms after the grant: {trace}");
        let after_won = &trace[trace.rfind("won, quorum").unwrap()..];
        assert!(
            !after_won.contains(&c),
            "something went to the refusing node after the grant: {trace}"
        );
        let o = run(servers.lockctl().args(["release", name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
}

/// A node whose ACL refuses a command in the middle of the grant (`HSET`, after the slot's `SET`):
/// the script stopped there (maybe applied), so `Place::unsure` sends the leave there; the node
/// answers at once, so it costs a round trip and no node timeout.
#[test]
fn a_first_try_grant_beside_a_node_refusing_mid_script_leaves_in_one_round_trip() {
    let servers = Servers::start(3);
    let name = "beside-acl";
    for s in &servers.0 {
        support::acl::locker(s, support::acl::CHANNELS);
    }
    let ok: String = servers[2].cmd(&["ACL", "SETUSER", "locker", "-hset"]);
    assert_eq!(ok, "OK");
    let on: Vec<&Server> = servers.0.iter().collect();
    for limit in [1, 2] {
        let o = run(support::acl::as_locker(&on).args([
            "-v",
            "--node-timeout",
            "2s",
            "acquire",
            name,
            "-w",
            "20s",
            "--ttl",
            "30s",
            "--limit",
            &limit.to_string(),
        ]));
        let trace = stderr(&o);
        assert_eq!(code(&o), 0, "{trace}");
        let after = after_the_grant(&trace);
        eprintln!("limit {limit}: {after:.1} ms after the grant\n{trace}");
        assert!(after < 1000.0, "{after:.1} ms after the grant: {trace}");
        let o = run(support::acl::as_locker(&on).args(["release", name, "--token", &stdout(&o)]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        for s in &servers.0 {
            assert!(
                ghosts(s, name).is_empty(),
                "left on {}: {:?}",
                s.url(),
                ghosts(s, name)
            );
        }
    }
}

/// A grant whose round 1 timed out on a stopped node whose slots are all held: the attempt waits
/// in that server's socket and queues the waiter when it resumes, after the waiter has exited with
/// the lock. No answer gave a ticket, so only `Place::unsure` (an answer never read) sends the
/// leave there, behind the attempt on the same connection: the queue is empty right after the
/// resume, not a front lifetime later.
#[test]
fn a_grant_beside_a_stopped_full_node_leaves_its_queue_at_the_resume() {
    let servers = Servers::start(3);
    let name = "stopped-full";
    let c = &servers[2];
    warm(c);
    let held = [hold_on(c, name, 2), hold_on(c, name, 2)];
    c.pause();
    let o = run(servers.lockctl().args([
        "-v",
        "--node-timeout",
        "1s",
        "acquire",
        name,
        "--ttl",
        "30s",
        "--limit",
        "2",
    ]));
    let trace = stderr(&o);
    assert_eq!(code(&o), 0, "{trace}");
    let token = stdout(&o);
    c.resume();
    // The attempt ran at the resume: the waiter was queued there (both slots held), and the leave
    // behind it took it out again. Its record would live 3 s and its slack (2 s) after the resume.
    let gone = eventually(Duration::from_millis(1500), || queued(c, name) == (0, 0));
    assert!(
        gone,
        "the holder is still queued on the stopped node after its resume: {:?}\n{trace}",
        snapshot(c)
    );
    let o = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for t in &held {
        release_on(c, name, t);
    }
    for s in &servers.0 {
        assert!(
            eventually(Duration::from_secs(2), || ghosts(s, name).is_empty()),
            "left on {}: {:?}",
            s.url(),
            ghosts(s, name)
        );
    }
}

/// A split vote of a `--limit 3` semaphore with a cut read: the first node grants slot 1, the
/// second slot 2 (its slot 1 is held), the third queues the waiter (all its slots held), one of its
/// slots frees while lockctl is stopped in its read, and the resend there is granted slot 3. Three
/// slots with one vote each: everything is rolled back (the third node puts the waiter back where
/// its grant took it from), and the retry asks for slot 1. The waiter ends granted once the second
/// node's slot 1 frees, and must then be queued nowhere.
#[test]
fn a_split_vote_after_a_cut_read_leaves_no_waiter_behind() {
    let servers = Servers::start(3);
    for s in &servers.0 {
        warm(s);
    }
    let (a, b, c) = (&servers[0], &servers[1], &servers[2]);
    let name = "split";
    let on_b = hold_on(b, name, 3);
    let on_c = [
        hold_on(c, name, 3),
        hold_on(c, name, 3),
        hold_on(c, name, 3),
    ];
    c.pause();
    let waiter = Traced::spawn(
        servers.lockctl().args([
            "-v",
            "--node-timeout",
            "20s",
            "acquire",
            name,
            "--ttl",
            "60s",
            "--limit",
            "3",
        ]),
        BOUND,
    );
    waiter.wait_for(&format!("{}: acquire in", a.url()), 1);
    waiter.wait_for(&format!("{}: acquire in", b.url()), 1);
    waiter.cut_once(c, || {
        support::queue::wait_queued(c, name, 1);
        release_on(c, name, &on_c[2]);
    });
    waiter.wait_for("split vote, asking for slot", 1);
    waiter.wait_for("waiting up to", 1);
    release_on(b, name, &on_b);
    let (exit, token, trace) = waiter.finish();
    assert_eq!(exit, 0, "{trace}");
    assert!(trace.contains("reconnecting"), "no read was cut: {trace}");
    for s in [a, b] {
        assert_eq!(
            s.get(&slot_key(name, 1)).as_deref(),
            Some(token.as_str()),
            "{trace}"
        );
    }
    assert_eq!(
        queued(c, name),
        (0, 0),
        "the holder is still queued on the third node: {:?}\n{trace}",
        snapshot(c)
    );
    let o = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for t in &on_c[..2] {
        release_on(c, name, t);
    }
    for s in &servers.0 {
        assert!(
            eventually(Duration::from_secs(2), || ghosts(s, name).is_empty()),
            "left on {}: {:?}",
            s.url(),
            ghosts(s, name)
        );
    }
}
