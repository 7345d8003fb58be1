//! A canonical peer's plain lock (`SET key token NX PX`, compare-and-delete: redis-py `Lock`,
//! node-redlock, pottery) beside `--limit N`: a semaphore is refused (exit 2) while the peer holds the
//! lock key, a refusal leaves nothing behind, and a plain client and the peer exclude each other as
//! before. Attacked with races against a peer loop, a peer on exactly half of Redlock 4, a node in
//! its restart quarantine, a `--supersede` waiter (refused for a peer or for another limit, it
//! displaces nobody on any node), a peer beside a semaphore's slot 2 (renewals, `status`, `list`,
//! release) and the other key layout (braces, an empty prefix).

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use support::*;

fn aux(name: &str, kind: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}{kind}")
}

/// The peer takes `key` on `s` for `ms`; true when it got it.
fn peer_set(s: &Server, key: &str, token: &str, ms: u64) -> bool {
    let r: Option<String> = s.cmd(&["SET", key, token, "NX", "PX", &ms.to_string()]);
    r.as_deref() == Some("OK")
}

/// The peer's release: compare-and-delete (redis-py `Lock.release`).
const UNLOCK: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn refused_for_a_peer(o: &std::process::Output, name: &str) {
    let e = stderr(o);
    assert_eq!(code(o), 2, "{e}");
    assert!(
        e.contains(&format!("{name} is held by a client that is not lockctl")),
        "{e}"
    );
}

/// A full `--limit 2` semaphore with a waiter W queued behind it on every node; W is stopped (its own
/// refusal has not come yet), slot 1 is released, and `refuse` changes the nodes of `on` so that
/// they refuse the semaphore. A `--supersede` waiter then arrives: it is refused (exit 2, as
/// `refused` checks) and must change nothing, on any node: W keeps its place and no `superseded`
/// record is left. W, resumed, is refused too.
fn a_refused_supersede(
    s: &Servers,
    on: &[usize],
    refuse: impl Fn(&Server),
    refused: impl Fn(&std::process::Output),
) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let nodes: Vec<&Server> = s.0.iter().collect();
    let (tokens, w) = support::queue::a_full_semaphore_of_two_with_a_waiter(
        &nodes,
        || s.lockctl(),
        "pool",
        &file,
        "w",
    );
    kill(w.id() as i32, libc::SIGSTOP);
    let o = run(s.lockctl().args(["release", "pool", "--token", &tokens[0]]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for &i in on {
        refuse(&s[i]);
    }
    let queues = || -> Vec<Vec<(String, String)>> {
        s.0.iter()
            .map(|n| {
                snapshot(n)
                    .into_iter()
                    .filter(|(k, _)| k == &aux("pool", "queue") || k == &aux("pool", "superseded"))
                    .collect()
            })
            .collect()
    };
    let before = queues();
    let o = run(s
        .lockctl()
        .args(["acquire", "pool", "--limit", "2", "-w", "5s", "--supersede"]));
    let after = queues();
    kill(w.id() as i32, libc::SIGCONT);
    let out = wait_output(w, Duration::from_secs(60));
    refused(&o);
    assert_eq!(
        after, before,
        "the queues after the refused --supersede attempt"
    );
    refused(&out);
}

/// A peer's key on the nodes of `peer_on` refuses the `--supersede` waiter, and stays.
fn a_refused_supersede_beside_a_peer(s: &Servers, peer_on: &[usize]) {
    a_refused_supersede(
        s,
        peer_on,
        |n| assert!(peer_set(n, "lockctl:pool", "peer-token", 30_000)),
        |o| refused_for_a_peer(o, "pool"),
    );
    for &i in peer_on {
        assert_eq!(s[i].get("lockctl:pool").as_deref(), Some("peer-token"));
    }
}

/// The nodes of `on` record the name's limit as 3 (what a node that missed a release of a
/// semaphore of 3 would keep), so they refuse the `--supersede` waiter's `--limit 2`.
fn a_refused_supersede_for_another_limit(s: &Servers, on: &[usize]) {
    a_refused_supersede(
        s,
        on,
        |n| {
            let r: String = n.cmd(&["SET", &aux("pool", "limit"), "3", "PX", "30000"]);
            assert_eq!(r, "OK");
        },
        |o| {
            let e = stderr(o);
            assert_eq!(code(o), 2, "{e}");
            assert!(e.contains("pool is used with --limit 3"), "{e}");
        },
    );
}

/// On one node the peer check comes before the supersede: nothing changes. (Held.)
#[test]
fn a_supersede_refused_for_a_peer_displaces_nobody() {
    a_refused_supersede_beside_a_peer(&Servers::start(1), &[0]);
}

/// On Redlock 3 with the peer on nodes 0 and 1 (its Redlock missed node 2), the same refused
/// `--supersede` attempt used to displace W on node 2 and leave a `superseded` record there naming
/// a client that never waited: acquire.lua superseded on node 2 in the script that granted it
/// there, before the client heard the majority's refusal (4 of 4 runs, node 2: W's queue entry
/// gone, a `superseded` key). A Redlock attempt now displaces only in a round after a quorum
/// queued or granted it.
#[test]
fn a_supersede_refused_for_a_peer_displaces_nobody_on_redlock() {
    a_refused_supersede_beside_a_peer(&Servers::start(3), &[0, 1]);
}

/// Another `--limit` recorded on the one node refuses the attempt before it displaces. (Held.)
#[test]
fn a_supersede_refused_for_another_limit_displaces_nobody() {
    a_refused_supersede_for_another_limit(&Servers::start(1), &[0]);
}

/// Another `--limit` recorded on nodes 0 and 1 of Redlock 3: the majority refuses (exit 2), and
/// node 2, which agrees, must not have displaced W meanwhile.
#[test]
fn a_supersede_refused_for_another_limit_displaces_nobody_on_redlock() {
    a_refused_supersede_for_another_limit(&Servers::start(3), &[0, 1]);
}

/// A node in its restart quarantine queues a waiter (it may not vote, but keeps the order): a
/// `-w --limit 2` attempt refused for a peer on the other two nodes must take its place, its
/// tickets and the limit key it wrote there back. (Held: nothing stays.) The quarantine is on for
/// the whole test; the node restarted without data is one this test started itself.
#[test]
fn a_quarantined_node_keeps_nothing_of_a_semaphore_refused_for_a_peer() {
    let mut s = Servers::start(3);
    s[2].restart_empty();
    for i in [0, 1] {
        assert!(peer_set(&s[i], "lockctl:pool", "peer-token", 30_000));
    }
    let before: Vec<_> = s.0.iter().map(snapshot).collect();
    for flags in [&["-w", "3s"][..], &["-w", "3s", "--supersede"], &["-n"]] {
        let mut c = s.lockctl();
        c.env("LOCKCTL_QUARANTINE", "60s")
            .args(["acquire", "pool", "--limit", "2"])
            .args(flags);
        refused_for_a_peer(&run(&mut c), "pool");
        let after: Vec<_> = s.0.iter().map(snapshot).collect();
        assert_eq!(after, before, "{flags:?} changed Redis");
        for i in [0, 1] {
            let pttl: i64 = s[i].cmd(&["PTTL", "lockctl:pool"]);
            assert!(pttl > 0 && pttl <= 30_000, "node {i}: peer's TTL {pttl}");
        }
    }
}

/// Redlock 4 with the peer's key on exactly two nodes: neither side has a majority (3), so the two
/// free nodes do not outvote the peer; the semaphore is refused (exit 2) with `-n` and `-w`, with
/// `acquire` and `exec`, and only the fencing counter of a rolled-back grant stays on those nodes.
/// A plain client is busy there (75) and changes nothing. (Held.)
#[test]
fn a_peer_on_half_of_redlock_four_refuses_a_semaphore() {
    let s = Servers::start(4);
    for i in [0, 1] {
        assert!(peer_set(&s[i], "lockctl:pool", "peer-token", 30_000));
    }
    let fence = aux("pool", "fence");
    for flags in [&["-n"][..], &["-w", "3s"]] {
        for cmd in ["acquire", "exec"] {
            let mut c = s.lockctl();
            c.args([cmd, "pool", "--limit", "2"]).args(flags);
            if cmd == "exec" {
                c.args(["--", "true"]);
            }
            refused_for_a_peer(&run(&mut c), "pool");
            for i in [0, 1] {
                assert_eq!(s[i].keys(), vec!["lockctl:pool".to_string()], "node {i}");
            }
            for i in [2, 3] {
                let keys = s[i].keys();
                assert!(
                    keys.is_empty() || keys == vec![fence.clone()],
                    "{cmd} {flags:?}: node {i} keeps {keys:?}"
                );
            }
        }
    }
    let o = run(s.lockctl().args(["acquire", "pool", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    for i in [0, 1] {
        assert_eq!(s[i].get("lockctl:pool").as_deref(), Some("peer-token"));
    }
}

/// The other key layout: names with braces (their own hash tag, or none usable) and an empty
/// prefix, where the lock key is the bare name a peer uses. The semaphore is refused beside the
/// peer and changes nothing; without the peer it is granted slot 1, and a peer is then busy.
/// (Held.)
#[test]
fn a_peer_refuses_a_semaphore_under_every_key_layout() {
    let s = Server::start();
    for (prefix, name) in [
        ("lockctl:", "{pool}"),
        ("lockctl:", "a{b}c"),
        ("lockctl:", "x{}y"),
        ("", "pool"),
        ("", "{pool}"),
    ] {
        let key = format!("{prefix}{name}");
        assert!(peer_set(&s, &key, "peer-token", 30_000));
        let before = snapshot(&s);
        for flags in [&["-n"][..], &["-w", "2s"]] {
            let o = run(lockctl_on(&s)
                .args(["acquire", name, "--prefix", prefix, "--limit", "3"])
                .args(flags));
            refused_for_a_peer(&o, name);
            assert_eq!(snapshot(&s), before, "{prefix:?} {name:?} {flags:?}");
        }
        let _: i64 = s.cmd(&["DEL", &key]);
        let g = acquire_json(
            &mut lockctl_on(&s),
            name,
            &["--prefix", prefix, "--limit", "3", "-n"],
        );
        assert_eq!(g["slot"], 1, "{prefix:?} {name:?}: {g}");
        assert_eq!(s.get(&key).as_deref(), g["token"].as_str());
        assert!(!peer_set(&s, &key, "peer-token", 30_000), "{key:?}");
        let o = run(lockctl_on(&s).args([
            "release",
            name,
            "--prefix",
            prefix,
            "--token",
            g["token"].as_str().unwrap(),
        ]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let _: String = s.cmd(&["FLUSHALL"]);
    }
}

/// A peer takes the lock key while an `exec --limit 2` holds slot 2 alone (the documented limit:
/// lockctl cannot keep it out). The holder's renewals (a 2 s TTL, held for at least 3 s) go on
/// without touching the peer's key or TTL, and its release leaves the peer's key as it was; `status`
/// shows both holders and `list` the name; meanwhile a new semaphore client is refused for the peer,
/// a client of another limit for the holder of slot 2, and neither changes anything. (Held.)
#[test]
fn a_peer_beside_a_semaphores_slot_two() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let first = acquire_json(
        &mut lockctl_on(&s),
        "pool",
        &["--limit", "2", "-n", "--ttl", "30s"],
    );
    assert_eq!(first["slot"], 1);
    let holder = lockctl_on(&s)
        .args([
            "exec", "pool", "--limit", "2", "-n", "--ttl", "2s", "--", "sh", "-c",
        ])
        .arg(format!(
            "while [ ! -e '{}' ]; do sleep 0.05; done",
            go.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let slot2 = slot_key("pool", 2);
    assert!(eventually(Duration::from_secs(30), || s
        .get(&slot2)
        .is_some()));
    let o = run(lockctl_on(&s).args([
        "release",
        "pool",
        "--token",
        first["token"].as_str().unwrap(),
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(peer_set(&s, "lockctl:pool", "peer-token", 60_000));
    let pttl = || -> i64 { s.cmd(&["PTTL", "lockctl:pool"]) };

    let st = run(lockctl_on(&s).args(["status", "pool", "--format", "json"]));
    let st: serde_json::Value = serde_json::from_str(&stdout(&st)).expect("status JSON");
    assert_eq!(st["holders"].as_array().map(Vec::len), Some(2), "{st}");
    let list = run(lockctl_on(&s).args(["list", "--format", "json"]));
    assert_eq!(code(&list), 0, "{}", stderr(&list));
    assert!(stdout(&list).contains("pool"), "{}", stdout(&list));

    let snap = snapshot(&s);
    refused_for_a_peer(
        &run(lockctl_on(&s).args(["acquire", "pool", "--limit", "2", "-w", "2s"])),
        "pool",
    );
    // A plain client disagrees with the semaphore's holder of slot 2; one of limit 3 is refused too.
    for limit in ["1", "3"] {
        let o = run(lockctl_on(&s).args(["acquire", "pool", "--limit", limit, "-n"]));
        assert_eq!(code(&o), 2, "--limit {limit}: {}", stderr(&o));
    }
    assert_eq!(snapshot(&s), snap, "refusals changed Redis");

    // Past a lease and a half of renewals, then released.
    while started.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        s.get(&slot2),
        snap.iter()
            .find(|(k, _)| k == &slot2)
            .map(|(_, v)| v.clone())
    );
    let before = pttl();
    std::fs::write(&go, "").unwrap();
    let out = wait_output(holder, Duration::from_secs(60));
    assert_eq!(
        code(&out),
        0,
        "the slot-2 holder kept its lease: {}",
        stderr(&out)
    );
    assert_eq!(s.get("lockctl:pool").as_deref(), Some("peer-token"));
    let after = pttl();
    assert!(
        after > 0 && after <= before,
        "peer's TTL {before} -> {after}"
    );
    assert_eq!(s.get(&slot2), None, "slot 2 released");
    refused_for_a_peer(
        &run(lockctl_on(&s).args(["acquire", "pool", "--limit", "2", "-n"])),
        "pool",
    );
}

/// Lockctl clients of limits 1, 2 and 3 and a canonical peer loop (SET NX PX, compare-and-delete)
/// race on one name. Whatever the interleaving, no lockctl grant happens while the peer holds the
/// lock key: the peer reads the fencing counter right after its SET and right before its delete,
/// and no fence a lockctl holder ran with lies between the two (the counter only rises, so such a
/// fence was granted inside the peer's hold). Every fence is distinct, and the peer's key is never
/// deleted or extended by lockctl (its delete always finds its token). (Held.)
#[test]
fn no_lockctl_grant_while_a_racing_peer_holds() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(8);
    let fence_key = aux("race", "fence");
    let log = dir.path().join("log");
    std::thread::scope(|scope| {
        let peer = scope.spawn(|| {
            let mut holds = Vec::new();
            let mut lost = 0;
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let token = format!("peer-{n}");
                if peer_set(&s, "lockctl:race", &token, 10_000) {
                    let c1: Option<String> = s.cmd(&["GET", &fence_key]);
                    std::thread::sleep(Duration::from_millis(15));
                    let c2: Option<String> = s.cmd(&["GET", &fence_key]);
                    let del: i64 = s.cmd(&["EVAL", UNLOCK, "1", "lockctl:race", &token]);
                    if del != 1 {
                        lost += 1;
                    }
                    let num = |c: Option<String>| c.map_or(0u128, |v| v.parse().unwrap());
                    holds.push((num(c1), num(c2)));
                }
                std::thread::sleep(Duration::from_millis(3));
            }
            (holds, lost)
        });
        let workers: Vec<_> = [1, 1, 2, 2, 2, 3]
            .iter()
            .map(|&n| {
                let mut c = lockctl_on(&s);
                let bin = Path::new(c.get_program()).parent().unwrap().to_path_buf();
                let script = format!(
                    "while [ $(date +%s) -lt {end} ]; do lockctl exec race --limit {n} -w 300ms --ttl 5s -- \
                     sh -c 'echo $LOCKCTL_FENCE {n} $LOCKCTL_SLOT >> {log}; sleep 0.01'; \
                     case $? in 0|2|75) ;; *) echo bad $? >> {log}; exit 1;; esac; done",
                    end = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_secs()
                        + 8,
                    log = log.display(),
                );
                c.env(
                    "PATH",
                    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
                );
                let mut sh = Command::new("sh");
                sh.arg("-c").arg(script).stdin(Stdio::null());
                for (k, v) in c.get_envs() {
                    match v {
                        Some(v) => sh.env(k, v),
                        None => sh.env_remove(k),
                    };
                }
                sh.stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let outs: Vec<_> = workers
            .into_iter()
            .map(|w| wait_output(w, Duration::from_secs(60)))
            .collect();
        stop.store(true, Ordering::Relaxed);
        let (holds, lost) = peer.join().unwrap();
        for o in &outs {
            assert_eq!(code(o), 0, "{}", stderr(o));
        }
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        assert!(!text.contains("bad"), "{text}");
        let grants: Vec<(u128, u32)> = text
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f[0].parse().unwrap(), f[1].parse().unwrap())
            })
            .collect();
        let mut fences: Vec<u128> = grants.iter().map(|g| g.0).collect();
        fences.sort();
        let len = fences.len();
        fences.dedup();
        assert_eq!(fences.len(), len, "a fence handed out twice");
        assert_eq!(lost, 0, "the peer's key went while it held");
        assert!(
            !holds.is_empty() && !grants.is_empty(),
            "{} peer holds, {} grants",
            holds.len(),
            grants.len()
        );
        for &(c1, c2) in &holds {
            for &(f, n) in &grants {
                assert!(
                    !(c1 < f && f <= c2),
                    "a --limit {n} grant (fence {f}) while the peer held ({c1}..{c2})"
                );
            }
        }
        eprintln!(
            "{} peer holds, {} lockctl grants",
            holds.len(),
            grants.len()
        );
    });
}

fn sql(dir: &Path, query: &str) -> String {
    let o = Command::new("sqlite3")
        .args(["-cmd", ".timeout 30000", "store.db", query])
        .current_dir(dir)
        .output()
        .expect("sqlite3 is required by the tests (apt-get install sqlite3, or ./scripts/test)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The section of a lockctl holder in the Redlock race: a holder of slot 1 (any limit) is counted
/// in `one`, and a breach is noted when it finds the peer inside or another holder of slot 1.
const HOLDER_SECTION: &str = r#"
q() { sqlite3 -cmd ".timeout 30000" store.db "$1"; }
if [ "$LOCKCTL_SLOT" = 1 ] || [ -z "$LOCKCTL_SLOT" ]; then
q "BEGIN IMMEDIATE; UPDATE g SET one = one + 1;
   INSERT INTO bad SELECT 'lockctl $N in', peer, one FROM g WHERE peer > 0 OR one > 1;
   INSERT INTO grants VALUES ($N, 1); COMMIT;"
sleep 0.02
q "UPDATE g SET one = one - 1;"
else
q "INSERT INTO grants VALUES ($N, $LOCKCTL_SLOT);"
fi
"#;

/// Redlock 3: two canonical peers (SET NX PX on every node in turn, holding with a majority and
/// deleting their keys by compare-and-delete either way) race lockctl clients of the `limits` given.
/// A store counts who is inside: a peer and a lockctl holder of slot 1 (a plain client, or a
/// semaphore's slot 1) are never inside at once, nor two holders of slot 1. A semaphore's slot 2
/// is not counted: a peer may take the lock key beside it, the documented limit. (Held.)
fn peers_race_lockctl_on_redlock(limits: &[usize]) {
    let s = Servers::start(3);
    let dir = tempfile::tempdir().unwrap();
    sql(
        dir.path(),
        "CREATE TABLE g(peer INTEGER, one INTEGER); INSERT INTO g VALUES (0, 0);
         CREATE TABLE bad(who TEXT, peer INTEGER, one INTEGER);
         CREATE TABLE grants(n INTEGER, slot INTEGER);",
    );
    let secs = 8;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + secs;
    std::thread::scope(|scope| {
        let peers: Vec<_> = (0..2)
            .map(|p| {
                let (s, dir) = (&s, dir.path());
                scope.spawn(move || {
                    let mut held = 0;
                    let mut n = 0u64;
                    while Instant::now() < deadline {
                        n += 1;
                        let token = format!("peer-{p}-{n}");
                        let got =
                            s.0.iter()
                                .filter(|node| peer_set(node, "lockctl:race", &token, 10_000))
                                .count();
                        if got >= 2 {
                            held += 1;
                            sql(
                                dir,
                                "BEGIN IMMEDIATE; UPDATE g SET peer = peer + 1;
                                 INSERT INTO bad SELECT 'peer in', peer, one FROM g
                                   WHERE one > 0 OR peer > 1; COMMIT;",
                            );
                            std::thread::sleep(Duration::from_millis(20));
                            sql(dir, "UPDATE g SET peer = peer - 1;");
                        }
                        for node in &s.0 {
                            let _: i64 = node.cmd(&["EVAL", UNLOCK, "1", "lockctl:race", &token]);
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    held
                })
            })
            .collect();
        let workers: Vec<_> = limits
            .iter()
            .map(|&n| {
                let base = s.lockctl();
                let bin = Path::new(base.get_program())
                    .parent()
                    .unwrap()
                    .to_path_buf();
                let script = format!(
                    "while [ $(date +%s) -lt {end} ]; do lockctl exec race --limit {n} -w 300ms \
                     --ttl 5s -c '{section}'; case $? in 0|2|75) ;; *) exit 1;; esac; done",
                    section = HOLDER_SECTION.replace('\'', "'\\''"),
                );
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(script)
                    .current_dir(dir.path())
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                for (k, v) in base.get_envs() {
                    match v {
                        Some(v) => sh.env(k, v),
                        None => sh.env_remove(k),
                    };
                }
                sh.env("N", n.to_string()).env(
                    "PATH",
                    format!("{}:{}", bin.display(), std::env::var("PATH").unwrap()),
                );
                sh.spawn().unwrap()
            })
            .collect();
        let outs: Vec<_> = workers
            .into_iter()
            .map(|w| wait_output(w, Duration::from_secs(120)))
            .collect();
        let held: usize = peers.into_iter().map(|p| p.join().unwrap()).sum();
        for o in &outs {
            assert_eq!(code(o), 0, "{}", stderr(o));
        }
        let bad = sql(dir.path(), "SELECT * FROM bad;");
        assert_eq!(
            bad, "",
            "breaches (who, peers inside, slot-1 holders inside)"
        );
        let grants = sql(
            dir.path(),
            "SELECT n || ':' || slot || ':' || count(*) FROM grants GROUP BY n, slot;",
        );
        eprintln!("peer holds {held}; lockctl grants (limit:slot:count) {grants:?}");
        assert!(held > 0 && !grants.is_empty(), "{held} {grants:?}");
    });
}

#[test]
fn peers_and_plain_clients_exclude_each_other_on_redlock() {
    peers_race_lockctl_on_redlock(&[1, 1, 1, 2]);
}

#[test]
fn peers_and_semaphores_never_share_slot_one_on_redlock() {
    peers_race_lockctl_on_redlock(&[2, 2, 2, 2]);
}

/// Redlock 3 with the peer on nodes 0 and 1 and node 2 stopped (SIGSTOP) during the attempt, at
/// varying moments: the attempt is refused (exit 2) without node 2's answer; a round-1 request that
/// already sat in node 2's socket runs at the resume, granting or queueing there. The rollback and
/// the leave sent after it must undo that: once node 2 runs again it keeps at most the fencing
/// counter, no slot key, holder record, limit key or waiter (a waiter record would stay for its 3 s
/// lifetime, so a look within the first second after the resume sees it). Under load it failed:
/// 4 of 4 runs of the whole file before the rollback that times out was followed by its text, 2 of
/// 10 runs since, when node 2 had read the attempt (or not yet written its answer) as it stopped:
/// at the resume it cannot write that answer to the connection lockctl closed on exit, and drops
/// the connection unread, rollback included. The rollback now goes on a new connection too, with
/// the attempt's tombstone (docs/redlock.md, "Rollback"); `tests/late_attempt.rs` plays both
/// orders of the two connections deterministically, which this test reaches only by chance (it
/// failed 1 of 17 runs on the code before, whatever the load).
#[test]
fn a_late_answer_of_a_stopped_node_leaves_nothing_after_a_refusal() {
    let s = Servers::start(3);
    for i in [0, 1] {
        assert!(peer_set(&s[i], "lockctl:pool", "peer-token", 60_000));
    }
    let fence = aux("pool", "fence");
    let mut late = 0;
    for round in 0..12 {
        let flags: &[&str] = match round % 3 {
            0 => &["-n"],
            1 => &["-w", "2s"],
            _ => &["-w", "2s", "--supersede"],
        };
        let child = s
            .lockctl()
            .env("LOCKCTL_NODE_TIMEOUT", "200ms")
            .args(["acquire", "pool", "--limit", "2", "--verbose"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(2 * round as u64));
        s[2].pause();
        let o = wait_output(child, Duration::from_secs(60));
        s[2].resume();
        refused_for_a_peer(&o, "pool");
        let _: String = s[2].cmd(&["PING"]);
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            let keys = s[2].keys();
            assert!(
                keys.is_empty() || keys == vec![fence.clone()],
                "{flags:?}: node 2 keeps {keys:?}; {}",
                stderr(&o)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        if s[2].keys() == vec![fence.clone()] {
            late += 1;
            let _: i64 = s[2].cmd(&["DEL", &fence]);
        }
        for i in [0, 1] {
            assert_eq!(s[i].keys(), vec!["lockctl:pool".to_string()], "node {i}");
        }
    }
    eprintln!("{late} of 12 attempts ran round 1 on node 2 (it has a fencing counter)");
}

/// Redlock 3: an `exec --limit 2` holds slot 1 everywhere when node 2 restarts without data (the
/// restart quarantine on, 3 s, as long as the lease) and a peer takes the lock key there (its own
/// Redlock fails on the other two). Past the quarantine the holder's renewals would put back its
/// key on node 2 (docs/quarantine.md): they must find the peer's key and leave it, its TTL
/// included, and write no key of another slot there; the holder keeps its lease on nodes 0 and 1
/// and exits 0. (Held.)
#[test]
fn an_exec_renewal_after_a_restart_leaves_a_peers_key_alone() {
    let mut s = Servers::start(3);
    // The grant must reach all three nodes, or node 2 has nothing to restart without. The holder's
    // quarantine applies to its grant too, and servers started one after the other under load
    // pass their uptime steps a second apart: a grant from nodes 0 and 1 while node 2 still waits
    // out its own left node 2 without a key (two CI runs). So the grant comes once all three vote,
    // and with a node timeout no loaded machine outlasts.
    s.wait_out_quarantine(3);
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let holder = s
        .lockctl()
        .env("LOCKCTL_QUARANTINE", "3s")
        .env("LOCKCTL_NODE_TIMEOUT", "5s")
        .args(["exec", "pool", "--limit", "2", "-w", "30s", "--ttl", "3s"])
        .args(["--", "sh", "-c"])
        .arg(format!(
            "echo $LOCKCTL_TOKEN > '{}'; while [ ! -e '{}' ]; do sleep 0.05; done",
            dir.path().join("token").display(),
            go.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The holder's own token, as its command sees it.
    let token_file = dir.path().join("token");
    assert!(eventually(Duration::from_secs(60), || {
        std::fs::read_to_string(&token_file).is_ok_and(|t| t.ends_with('\n'))
    }));
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    // Every node holds it (if not, show what node 2 keeps).
    let everywhere = (0..3).all(|i| s[i].get("lockctl:pool").as_deref() == Some(token.as_str()));
    assert!(
        everywhere,
        "token {token}: nodes hold {:?}; node 2 keeps {:?}",
        (0..3).map(|i| s[i].get("lockctl:pool")).collect::<Vec<_>>(),
        support::snapshot(&s[2])
    );
    s[2].restart_empty();
    assert!(peer_set(&s[2], "lockctl:pool", "peer-token", 60_000));
    let restarted = Instant::now();
    let mut last = i64::MAX;
    // Past the quarantine and a few renewals.
    while restarted.elapsed() < Duration::from_secs(6) {
        assert_eq!(s[2].keys(), vec!["lockctl:pool".to_string()]);
        assert_eq!(s[2].get("lockctl:pool").as_deref(), Some("peer-token"));
        let pttl: i64 = s[2].cmd(&["PTTL", "lockctl:pool"]);
        assert!(pttl > 0 && pttl <= last, "peer's TTL {last} -> {pttl}");
        last = pttl;
        std::thread::sleep(Duration::from_millis(50));
    }
    for i in [0, 1] {
        assert_eq!(s[i].get("lockctl:pool").as_deref(), Some(token.as_str()));
    }
    std::fs::write(&go, "").unwrap();
    let out = wait_output(holder, Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(s[2].get("lockctl:pool").as_deref(), Some("peer-token"));
}

/// The moment that loses the rollback, made on purpose: node 0 is stopped so that round 1 waits for
/// it; node 2 answers round 1 (a grant of slot 1, the name being free there) and is stopped right
/// after; node 0 resumes and answers with the peer's key, so the attempt is refused (exit 2) and its
/// grant on node 2 rolled back while node 2 is stopped. That rollback went out as EVALSHA and timed
/// out; node 2, resumed, had never run the release script and answered NOSCRIPT to nobody, so the
/// grant stayed there (slot key, holder record and limit key until the lease's TTL) after the exit
/// 2. Node 2 is stopped only once its answer is written out (an answer still pending at the stop
/// is the open case of the test above). Before the fix it failed 3 of 3 runs; the rollback that
/// times out is now followed by the script's text on the same connection.
#[test]
fn a_rollback_that_times_out_still_reaches_a_node_that_never_ran_the_release_script() {
    let s = Servers::start(3);
    for i in [0, 1] {
        assert!(peer_set(&s[i], "lockctl:pool", "peer-token", 60_000));
    }
    let fence = aux("pool", "fence");
    for flags in [&["-n"][..], &["-w", "3s"]] {
        s[0].pause();
        let child = s
            .lockctl()
            .env("LOCKCTL_NODE_TIMEOUT", "5s")
            .args(["acquire", "pool", "--limit", "2", "--verbose"])
            .args(flags)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Granted there, and the answer written out: no client of node 2 has output pending.
        let granted = eventually(Duration::from_secs(30), || {
            let clients: String = s[2].cmd(&["CLIENT", "LIST"]);
            s[2].get("lockctl:pool").is_some()
                && clients
                    .lines()
                    .all(|l| l.contains(" obl=0 ") && l.contains(" oll=0 "))
        });
        s[2].pause();
        s[0].resume();
        let o = wait_output(child, Duration::from_secs(60));
        s[2].resume();
        assert!(granted, "node 2 answered round 1: {}", stderr(&o));
        refused_for_a_peer(&o, "pool");
        let _: String = s[2].cmd(&["PING"]);
        let settled = eventually(Duration::from_secs(2), || {
            s[2].keys().iter().all(|k| k == &fence)
        });
        assert!(
            settled,
            "{flags:?}: node 2 keeps {:?}; {}",
            s[2].keys(),
            stderr(&o)
        );
        for i in [0, 1] {
            assert_eq!(s[i].keys(), vec!["lockctl:pool".to_string()], "node {i}");
        }
    }
}
