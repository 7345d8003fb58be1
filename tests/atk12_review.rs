//! Attacks on the rollback's tombstone at a memory limit (an evicting policy, a waiter's rollback, a
//! limit-2 semaphore) and on the resend of a read cut by a stop of lockctl on a Redis Cluster.
//!
//! The stalled node is a loopback listener that keeps what lockctl sends (`support::stopped`); the
//! test plays those bytes to a real server in the order it chooses (`tests/tomb_review.rs`). Every
//! server here is started by its test, so the restart quarantine is off (`support::lockctl`).

mod support;

use std::process::{Command as Cmd, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use support::stopped::{name, play, Command, Stopped};
use support::*;

const PEER: &str = "peer-token";
const BOUND: Duration = Duration::from_secs(60);

fn play_all(s: &Server, conn: &[Command]) {
    for cmd in conn {
        let _ = play(s, cmd);
    }
}

/// The keys of lock `name` on `s`, the records and the fencing counter aside.
fn left(s: &Server, name: &str) -> Vec<String> {
    let fence = format!("{{lockctl:{name}}}\u{1f}fence");
    s.keys()
        .into_iter()
        .filter(|k| k.contains(name) && *k != fence)
        .collect()
}

fn warm_up(s: &Server) {
    let o = run(lockctl_on(s).args(["exec", "warm-up", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let _: String = s.cmd(&[
        "SCRIPT",
        "LOAD",
        include_str!("../src/lock/scripts/fence.lua"),
    ]);
}

/// What a stalled node was sent: the attempts' connections and those sent without waiting.
struct Sent {
    attempts: Vec<Vec<Command>>,
    others: Vec<Vec<Command>>,
}

/// Runs `args` against `s[0]`, `s[1]` and a stalled node standing for `s[2]` until the rollback
/// went on a new connection too (at most three times; a loaded machine may not open it in time).
fn refused(s: &Servers, args: &[&str]) -> Sent {
    for _ in 0..3 {
        let stopped = Stopped::start();
        let urls = format!("{},{},{}", s[0].url(), s[1].url(), stopped.url());
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", urls)
            .env("LOCKCTL_NODE_TIMEOUT", "300ms")
            .args(args));
        assert_eq!(code(&o), 75, "{}", stderr(&o));
        let (attempts, others): (Vec<_>, Vec<_>) = stopped
            .closed()
            .into_iter()
            .filter(|c| !c.is_empty())
            .partition(|c| name(&c[0]) == "EVALSHA");
        assert!(!attempts.is_empty(), "no attempt reached the stalled node");
        if !others.is_empty() {
            return Sent { attempts, others };
        }
        eprintln!("no new connection for the rollback this time; again");
    }
    panic!("three refused attempts and not one rollback went on a new connection");
}

fn granted(answer: &redis::Value) -> bool {
    matches!(answer, redis::Value::Array(items) if matches!(items.first(), Some(redis::Value::Int(1))))
}

/// An evicting policy at a tiny maxmemory: the rollback runs first and leaves its tombstone, then
/// the server evicts before it runs the late attempt. Eviction is a documented limit of the
/// guarantees (docs/guarantees.md, "Eviction"): at maxmemory 1 every key goes, the tombstone
/// before the late attempt (which then grants) and that grant at the next command; what stays is
/// at most the late grant, on one node of three.
#[test]
fn an_evicting_policy_at_a_tiny_maxmemory_and_the_late_attempt() {
    let mut outcomes = vec![];
    for policy in [
        "allkeys-lru",
        "volatile-lru",
        "volatile-ttl",
        "allkeys-random",
    ] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        for i in [0, 1] {
            let _: () = s[i].cmd(&["SET", "lockctl:ev", PEER, "PX", "60000"]);
        }
        let sent = refused(&s, &["acquire", "ev", "-n", "--ttl", "60s"]);
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", policy]);
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        for c in &sent.others {
            play_all(&s[2], c);
        }
        let answer = play(&s[2], &sent.attempts[0][0]);
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        let keys = left(&s[2], "ev");
        eprintln!("{policy}: late attempt {answer:?}, left {keys:?}");
        outcomes.push((policy, answer.map(|a| granted(&a)).ok(), keys));
    }
    // A late grant that stays on one node of three is no second holder (a quorum is two), and it
    // ends with its TTL: what eviction can do to any lock key anyway.
    for (policy, _, keys) in &outcomes {
        assert!(
            keys.is_empty() || keys == &vec!["lockctl:ev".to_string()],
            "{policy}: {keys:?}"
        );
    }
}

/// The same under `allkeys-lru` with a limit the server can meet by evicting: the tombstone is
/// older than two filler values (LRU clock: 1 s), and the limit is lowered below what the server
/// uses, so it evicts the oldest keys, the tombstone among them, before the late attempt runs. The
/// late attempt then grants, and that grant stays on node 2 (the fillers go before it): a late grant
/// as before the tombstone, on one node of three, bounded by the lease's TTL.
#[test]
fn allkeys_lru_evicts_the_tombstone_and_the_late_grant_stays_for_its_ttl() {
    let s = Servers::start(3);
    warm_up(&s[2]);
    for i in [0, 1] {
        let _: () = s[i].cmd(&["SET", "lockctl:lru", PEER, "PX", "60000"]);
    }
    let sent = refused(&s, &["acquire", "lru", "-n", "--ttl", "60s"]);
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"]);
    for c in &sent.others {
        play_all(&s[2], c);
    }
    let tomb: Vec<String> = s[2]
        .cmd::<Vec<String>>(&["KEYS", "*"])
        .into_iter()
        .filter(|k| k.contains("lru") && is_release_record(k))
        .collect();
    assert_eq!(
        tomb.len(),
        1,
        "no tombstone: {:?}",
        s[2].cmd::<Vec<String>>(&["KEYS", "*"])
    );
    std::thread::sleep(Duration::from_millis(2100));
    let big = "x".repeat(20_000);
    for f in ["filler1", "filler2"] {
        let _: () = s[2].cmd(&["SET", f, &big]);
    }
    std::thread::sleep(Duration::from_millis(2100));
    let info: String = s[2].cmd(&["INFO", "memory"]);
    let used: u64 = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", &(used - 2000).to_string()]);
    let answer = play(&s[2], &sent.attempts[0][0]).expect("the late attempt runs");
    let tomb_after: i64 = s[2].cmd(&["EXISTS", &tomb[0]]);
    let pttl: i64 = s[2].cmd(&["PTTL", "lockctl:lru"]);
    let keys = left(&s[2], "lru");
    let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    eprintln!("late attempt {answer:?}; tombstone exists {tomb_after}; left {keys:?}; pttl {pttl}");
    if granted(&answer) {
        assert_eq!(tomb_after, 0, "a grant with its tombstone there");
        assert!(pttl > 0 && pttl <= 60_000, "{pttl}");
    }
    for i in [0, 1] {
        assert_eq!(s[i].get("lockctl:lru").as_deref(), Some(PEER));
    }
}

/// A queued attempt (the lock held on every node, `-w`) refused with node 2 stalled, its rollback
/// played on node 2 at the memory limit (noeviction), before and after the late attempt: node 2
/// keeps no waiter of it.
#[test]
fn a_waiter_rollback_at_the_memory_limit_leaves_no_waiter() {
    for attempt_first in [true, false] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        for i in 0..3 {
            let _: () = s[i].cmd(&["SET", "lockctl:wq", PEER, "PX", "60000"]);
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let sent = refused(&s, &["acquire", "wq", "-w", "100ms", "--ttl", "60s"]);
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        let mut answers = vec![];
        if attempt_first {
            for a in &sent.attempts {
                answers.push(play(&s[2], &a[0]));
            }
        }
        for c in &sent.others {
            play_all(&s[2], c);
        }
        if !attempt_first {
            for a in &sent.attempts {
                answers.push(play(&s[2], &a[0]));
            }
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        assert_eq!(
            left(&s[2], "wq"),
            vec!["lockctl:wq".to_string()],
            "attempt first {attempt_first}: {answers:?} {:?}",
            snapshot(&s[2])
        );
        assert_eq!(s[2].get("lockctl:wq").as_deref(), Some(PEER));
    }
}

/// A limit-2 semaphore, both slots held on nodes 0 and 1: the refused attempt's rollback runs at
/// the memory limit (noeviction), in either order with the late attempt; node 2 keeps no slot and
/// no limit.
#[test]
fn a_limit_two_rollback_at_the_memory_limit_leaves_no_slot() {
    for attempt_first in [true, false] {
        let s = Servers::start(3);
        warm_up(&s[2]);
        for i in [0, 1] {
            for _ in 0..2 {
                let o = run(
                    lockctl_on(&s[i]).args(["acquire", "sem2", "--limit", "2", "--ttl", "60s"])
                );
                assert_eq!(code(&o), 0, "{}", stderr(&o));
            }
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let sent = refused(
            &s,
            &["acquire", "sem2", "--limit", "2", "-n", "--ttl", "60s"],
        );
        let mut answers = vec![];
        if attempt_first {
            answers.push(play(&s[2], &sent.attempts[0][0]));
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "1"]);
        for c in &sent.others {
            play_all(&s[2], c);
        }
        if !attempt_first {
            answers.push(play(&s[2], &sent.attempts[0][0]));
        }
        let _: () = s[2].cmd(&["CONFIG", "SET", "maxmemory", "0"]);
        assert_eq!(
            left(&s[2], "sem2"),
            Vec::<String>::new(),
            "attempt first {attempt_first}: {answers:?} {:?}",
            snapshot(&s[2])
        );
    }
}

/// Stops and continues `pid` every few milliseconds until `done` is set.
fn hammer(pid: i32, done: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut rng = fastrand::Rng::new();
        let mut n = 0;
        while !done.load(Ordering::Relaxed) {
            kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(rng.u64(1..=5)));
            kill(pid, libc::SIGCONT);
            n += 1;
            std::thread::sleep(Duration::from_millis(rng.u64(1..=3)));
        }
        n
    })
}

fn ended(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
        s.rsplit(')')
            .next()
            .is_some_and(|r| r.trim_start().starts_with('Z'))
    })
}

/// Spawns every command, hammers each with stops until all ended; their outputs and the stops.
fn hammered_all(cmds: Vec<Cmd>) -> (Vec<std::process::Output>, u64) {
    let mut children = vec![];
    for mut c in cmds {
        let child = c
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let h = hammer(child.id() as i32, done.clone());
        children.push((child, done, h));
    }
    let mut stops = 0;
    let mut outs = vec![];
    for (child, done, h) in children {
        let pid = child.id() as i32;
        assert!(eventually(BOUND, || ended(pid)), "lockctl never ended");
        done.store(true, Ordering::Relaxed);
        stops += h.join().unwrap();
        outs.push(wait_output(child, BOUND));
    }
    (outs, stops)
}

/// On a Redis Cluster, through a node that does not own the lock's slot (every send and resend is
/// redirected): two contenders under stops, at most one holder, and the holder's release under
/// stops deletes its key.
#[test]
fn on_a_cluster_stops_make_no_two_holders_and_lose_no_release() {
    let cluster = support::topology::Cluster::start();
    let name = "stp";
    let key = format!("lockctl:{name}");
    let owner = cluster.owner(&key);
    let owner_node = cluster.nodes.iter().find(|n| n.port == owner).unwrap();
    let url = format!("redis://127.0.0.1:{}", cluster.not_owner(&key));
    let on = || support::topology::lockctl_on_url(&url);
    let mut total_stops = 0;
    let mut grants = 0;
    for round in 0..15 {
        let mut a = on();
        a.args([
            "--node-timeout",
            "10s",
            "acquire",
            name,
            "-n",
            "--ttl",
            "60s",
        ]);
        let mut b = on();
        b.args([
            "--node-timeout",
            "10s",
            "acquire",
            name,
            "-n",
            "--ttl",
            "60s",
        ]);
        let (outs, stops) = hammered_all(vec![a, b]);
        total_stops += stops;
        let won: Vec<String> = outs.iter().filter(|o| code(o) == 0).map(stdout).collect();
        for o in &outs {
            assert!([0, 75].contains(&code(o)), "round {round}: {}", stderr(o));
        }
        assert!(won.len() <= 1, "round {round}: two holders {won:?}");
        let held: Option<String> = owner_node.cmd(&["GET", &key]).unwrap();
        if let Some(t) = won.first() {
            grants += 1;
            assert_eq!(held.as_deref(), Some(t.as_str()), "round {round}");
            let mut r = on();
            r.args(["--node-timeout", "10s", "release", name, "--token", t]);
            let (outs, stops) = hammered_all(vec![r]);
            total_stops += stops;
            assert_eq!(code(&outs[0]), 0, "round {round}: {}", stderr(&outs[0]));
            let after: Option<String> = owner_node.cmd(&["GET", &key]).unwrap();
            assert_eq!(after, None, "round {round}: a lost release");
        } else if let Some(t) = held {
            // Nobody was told it won, but a grant ran (a cut reply of the last send): no holder
            // stands behind the key; it ends with its TTL. Cleared for the next round.
            eprintln!("round {round}: key {t} with no reported holder");
            let _: i64 = owner_node.cmd(&["DEL", &key]).unwrap();
        }
    }
    eprintln!("{grants} grants of 15 rounds, {total_stops} stops");
    assert!(grants > 0, "no round granted: the attack tried nothing");
}

/// Moves `slot` from master `from` to master `to`, its keys with it (MIGRATE), and tells every
/// master the new owner.
fn move_slot(cluster: &support::topology::Cluster, slot: i64, from: u16, to: u16) {
    let node = |p: u16| cluster.nodes.iter().find(|n| n.port == p).unwrap();
    let id = |p: u16| -> String { node(p).cmd(&["CLUSTER", "MYID"]).unwrap() };
    let (from_id, to_id) = (id(from), id(to));
    let s = slot.to_string();
    let _: () = node(to)
        .cmd(&["CLUSTER", "SETSLOT", &s, "IMPORTING", &from_id])
        .unwrap();
    let _: () = node(from)
        .cmd(&["CLUSTER", "SETSLOT", &s, "MIGRATING", &to_id])
        .unwrap();
    let keys: Vec<String> = node(from)
        .cmd(&["CLUSTER", "GETKEYSINSLOT", &s, "100"])
        .unwrap();
    if !keys.is_empty() {
        let port = to.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let _: String = node(from).cmd(&args).unwrap();
    }
    for m in cluster.masters() {
        let _: () = node(m)
            .cmd(&["CLUSTER", "SETSLOT", &s, "NODE", &to_id])
            .unwrap();
    }
}

/// A grant whose reply is cut by a stop of lockctl (the owner paused while lockctl waits, lockctl
/// stopped in that read, the owner continued and runs the grant); meanwhile the slot moves, with
/// its keys, to another master. The resend goes to the same server, which answers MOVED: lockctl
/// follows it, finds its own grant there and reports it (0), the key holding its token on the new
/// owner; its release deletes it there.
#[test]
fn a_grant_cut_by_a_stop_while_its_slot_moves_follows_the_redirect() {
    let cluster = support::topology::Cluster::start();
    let name = "mv";
    let key = format!("lockctl:{name}");
    let owner = cluster.owner(&key);
    let target = cluster.not_owner(&key);
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &key]).unwrap();
    let node = |p: u16| cluster.nodes.iter().find(|n| n.port == p).unwrap();
    let url = format!("redis://127.0.0.1:{owner}");
    let on = || support::topology::lockctl_on_url(&url);
    // The owner caches the scripts: the first send runs, not NOSCRIPT.
    let o = run(on().args(["exec", name, "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let owner_pid = node(owner).pid();
    kill(owner_pid, libc::SIGSTOP);
    let acquire = support::hammer::Traced::spawn(
        on().args([
            "-v",
            "--node-timeout",
            "30s",
            "acquire",
            name,
            "-n",
            "--ttl",
            "60s",
        ]),
        BOUND,
    );
    support::hammer::stop_in_a_read(acquire.pid(), BOUND);
    kill(owner_pid, libc::SIGCONT);
    assert!(
        eventually(BOUND, || node(owner)
            .cmd::<Option<String>>(&["GET", &key])
            .is_ok_and(|v| v.is_some())),
        "the first send never granted"
    );
    move_slot(&cluster, slot, owner, target);
    assert_eq!(cluster.owner(&key), target);
    kill(acquire.pid(), libc::SIGCONT);
    let (exit, out, trace) = acquire.finish();
    eprintln!("exit {exit}\n{trace}");
    let held: Option<String> = node(target).cmd(&["GET", &key]).unwrap();
    assert_eq!(exit, 0, "{trace}");
    assert_eq!(held.as_deref(), Some(out.trim()), "{trace}");
    assert!(trace.contains("moved to"), "no redirect followed: {trace}");
    let o =
        run(support::topology::lockctl_on_url(&url).args(["release", name, "--token", out.trim()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let after: Option<String> = node(target).cmd(&["GET", &key]).unwrap();
    assert_eq!(after, None);
}

/// The release's counterpart: the release runs on the owner, its reply is cut by a stop of
/// lockctl, and the slot moves with its keys (the release's record among them) to another master.
/// The resend follows the MOVED and finds the record of its first send there: the release is
/// reported (0), not as a lock that was no longer held.
#[test]
fn a_release_cut_by_a_stop_while_its_slot_moves_is_still_reported() {
    let cluster = support::topology::Cluster::start();
    let name = "mvr";
    let key = format!("lockctl:{name}");
    let owner = cluster.owner(&key);
    let target = cluster.not_owner(&key);
    let slot: i64 = cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &key]).unwrap();
    let node = |p: u16| cluster.nodes.iter().find(|n| n.port == p).unwrap();
    let url = format!("redis://127.0.0.1:{owner}");
    let on = || support::topology::lockctl_on_url(&url);
    let o = run(on().args(["exec", name, "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(on().args(["acquire", name, "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let owner_pid = node(owner).pid();
    kill(owner_pid, libc::SIGSTOP);
    let release = support::hammer::Traced::spawn(
        on().args([
            "-v",
            "--node-timeout",
            "30s",
            "release",
            name,
            "--token",
            &token,
        ]),
        BOUND,
    );
    support::hammer::stop_in_a_read(release.pid(), BOUND);
    kill(owner_pid, libc::SIGCONT);
    assert!(
        eventually(BOUND, || node(owner)
            .cmd::<Option<String>>(&["GET", &key])
            .is_ok_and(|v| v.is_none())),
        "the first send never released"
    );
    move_slot(&cluster, slot, owner, target);
    assert_eq!(cluster.owner(&key), target);
    kill(release.pid(), libc::SIGCONT);
    let (exit, _, trace) = release.finish();
    eprintln!("exit {exit}\n{trace}");
    assert!(trace.contains("moved to"), "no redirect followed: {trace}");
    assert_eq!(exit, 0, "a release that ran reported otherwise: {trace}");
    let held: Option<String> = node(target).cmd(&["GET", &key]).unwrap();
    assert_eq!(held, None);
}
