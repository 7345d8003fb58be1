//! Second review of the channel rights (docs/security.md, "A user without the channel rules"):
//! users whose rules pass the probe (the wake prefix with an empty waiter id) but cover no waiter's
//! own wake channel, so that every wake they would send goes unsent (a pcall). The queue must still
//! serve its waiters in order, each within its heartbeat, and lose nobody's place; a refused user
//! must change nothing also when the script cache was flushed; `doctor` and a Redis Cluster with
//! the ACL user on every node. Every server here is started by the test itself, so the restart
//! quarantine is off (`lockctl()`).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::acl::*;
use support::queue::{all_succeed, finish_off, order, queue_in_order, queue_key, wait_queued};
use support::*;

/// Rules that pass the probe (`{lockctl:NAME}<US>wake<US>`) and cover `released`, but no waiter's
/// wake channel (`?` is one character, the waiter id is many).
const PROBE_ONLY: &[&str] = &["&{lockctl:*}?wake?", "&{lockctl:*}?released"];

/// A waiting `acquire` of `name` (not reaped).
fn waiting(mut c: Command, name: &str) -> Child {
    c.args(["acquire", name, "-w", "100s", "--ttl", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl")
}

/// Waits until the queue of `name` on `s` is empty.
fn queue_drains(s: &Server, name: &str) -> bool {
    eventually(Duration::from_secs(30), || {
        s.cmd::<u64>(&["ZCARD", &queue_key(name)]) == 0
    })
}

/// A holder whose release cannot wake anyone (rules: the probe's channel only) and five waiters
/// of a user with every right queued behind it: they are served in arrival order, each within a
/// bounded time (their heartbeat), and the queue is empty at the end. Then the same behind an
/// `exec` of that user, whose final release cannot wake either.
#[test]
fn a_queue_behind_a_holder_that_cannot_wake_is_served_in_order() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    for round in 0..2 {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("job{round}");
        let holder: Option<Child> = if round == 0 {
            let o = run(as_locker(&[&s]).args(["acquire", &name, "-n", "--ttl", "60s"]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            std::fs::write(dir.path().join("token"), stdout(&o)).unwrap();
            None
        } else {
            let c = as_locker(&[&s])
                .args(["exec", &name, "--ttl", "60s", "--", "sleep", "3"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            assert!(
                eventually(Duration::from_secs(20), || s
                    .get(&format!("lockctl:{name}"))
                    .is_some()),
                "the exec never held"
            );
            Some(c)
        };
        let kids = queue_in_order(&[&s], &name, &file, 5, || lockctl_on(&s));
        let released = Instant::now();
        match holder {
            None => {
                let token = std::fs::read_to_string(dir.path().join("token")).unwrap();
                let r = run(as_locker(&[&s]).args(["release", &name, "--token", token.trim()]));
                assert_eq!(code(&r), 0, "the release: {}", stderr(&r));
            }
            Some(c) => {
                let o = wait_output(c, Duration::from_secs(60));
                assert_eq!(code(&o), 0, "the exec: {}", stderr(&o));
            }
        }
        all_succeed(kids);
        let took = released.elapsed();
        eprintln!("round {round}: served in {took:?}");
        assert_eq!(order(&file), ["1", "2", "3", "4", "5"], "round {round}");
        // Five handoffs, the first at the head's heartbeat (1 s), the others woken: far below this.
        assert!(took < Duration::from_secs(30), "round {round}: {took:?}");
        assert!(queue_drains(&s, &name), "round {round}: the queue stayed");
    }
}

/// A `--limit 3` semaphore fully held by that user, six waiters with every right behind it: all
/// three release (no wake sent), and every waiter is served, the queue and the slots empty after.
#[test]
fn a_semaphore_held_by_a_user_that_cannot_wake_serves_every_waiter() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    let tokens: Vec<String> = (0..3)
        .map(|_| {
            let o = run(
                as_locker(&[&s]).args(["acquire", "sem", "-n", "--limit", "3", "--ttl", "60s"])
            );
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            stdout(&o)
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let kids = queue_in_order(&[&s], "sem", &file, 6, || {
        let mut c = lockctl_on(&s);
        c.env("LOCKCTL_LIMIT", "3");
        c
    });
    for t in &tokens {
        let r = run(as_locker(&[&s]).args(["release", "sem", "--token", t]));
        assert_eq!(code(&r), 0, "{}", stderr(&r));
    }
    all_succeed(kids);
    let mut got = order(&file);
    got.sort();
    assert_eq!(got, ["1", "2", "3", "4", "5", "6"]);
    assert!(queue_drains(&s, "sem"), "the queue stayed");
    let left: Vec<String> = s
        .keys()
        .into_iter()
        .filter(|k| !is_release_record(k) && !k.contains("fence"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// The expiry (server ms) of waiter `id` of `name`, if it is queued.
fn expiry(s: &Server, name: &str, id: &str) -> Option<f64> {
    let key = format!("{{lockctl:{name}}}\u{1f}alive");
    s.cmd::<Option<f64>>(&["ZSCORE", &key, id])
}

/// One run of the case below; `None` when the far-back waiter beat earlier than its interval
/// allows for (the run proves nothing then).
fn dropped_case(s: &Server, woken: bool, by_waiter: bool) -> Option<(bool, String)> {
    let _: String = s.cmd(&["FLUSHALL"]);
    let name = "job";
    let holder = stdout(&run(lockctl_on(s).args(["acquire", name, "--ttl", "120s"])));
    assert!(!holder.is_empty());
    // Four waiters of the probe-only user at the front, then X, with every right, at place 4.
    let mut rs: Vec<Child> = Vec::new();
    for i in 1..=4 {
        rs.push(waiting(as_locker(&[s]), name));
        wait_queued(s, name, i);
    }
    let x = waiting(lockctl_on(s), name);
    wait_queued(s, name, 5);
    let ids: Vec<String> = s.cmd(&["ZRANGE", &queue_key(name), "4", "4"]);
    let id = ids[0].clone();
    // X listens on its wake channel, so it heartbeats at its place's interval (10 s here).
    let now_ms = || s.clock_us() as f64 / 1000.0;
    assert!(
        eventually(Duration::from_secs(30), || expiry(s, name, &id)
            .is_some_and(|e| e - now_ms() > 20_000.0)),
        "X never got a long interval: {:?}",
        expiry(s, name, &id).map(|e| e - now_ms())
    );
    // Right after one of X's heartbeats (its expiry moves), the four leave at once: X moves to the
    // head, its expiry comes down to a front lifetime (4 s), and the wake that was to make it beat
    // at once is theirs to send, which their rules refuse.
    let before = expiry(s, name, &id);
    assert!(
        eventually(Duration::from_secs(20), || expiry(s, name, &id) != before),
        "X never beat"
    );
    let beat = Instant::now();
    let beat_score = expiry(s, name, &id);
    for r in &rs {
        kill(r.id() as i32, libc::SIGTERM);
    }
    for r in rs {
        let _ = wait_output(r, Duration::from_secs(30));
    }
    let clamped = expiry(s, name, &id).map(|e| e - now_ms());
    // Scripts within two front heartbeats of X's expiry, so that the node knows it did not stall:
    // a `-n` attempt (refused: the lock is held), or waiter Y, queued after X, that heartbeats
    // every second. Then the holder releases after X's expiry.
    let y = if by_waiter {
        std::thread::sleep(Duration::from_millis(1000).saturating_sub(beat.elapsed()));
        let y = waiting(lockctl_on(s), name);
        wait_queued(s, name, 2);
        Some(y)
    } else {
        std::thread::sleep(Duration::from_millis(3000).saturating_sub(beat.elapsed()));
        let busy = run(lockctl_on(s).args(["acquire", name, "-n"]));
        assert_ne!(code(&busy), 0, "{}", stderr(&busy));
        None
    };
    std::thread::sleep(Duration::from_millis(5200).saturating_sub(beat.elapsed()));
    let r = run(lockctl_on(s).args(["release", name, "--token", &holder]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let queued_at_release = expiry(s, name, &id).is_some();
    // Another client's one attempt, or Y's grant, while X, still waiting, came long before it.
    let (jumped, what) = match y {
        None => {
            let jump = run(lockctl_on(s).args(["acquire", name, "-n", "--ttl", "60s"]));
            (
                code(&jump) == 0,
                format!("the -n attempt exited {}: {}", code(&jump), stderr(&jump)),
            )
        }
        Some(mut y) => {
            assert!(
                eventually(Duration::from_secs(3), || s
                    .get(&format!("lockctl:{name}"))
                    .is_some()),
                "nobody took the lock after the release"
            );
            std::thread::sleep(Duration::from_millis(200));
            let done = y.try_wait().unwrap();
            let granted = done.is_some_and(|st| st.success());
            finish_off(y);
            (granted, format!("Y, queued after X, granted: {granted}"))
        }
    };
    let since = beat.elapsed();
    let x_beat = expiry(s, name, &id).is_some_and(|e| Some(e) != beat_score);
    let still_waiting = alive(x.id() as i32);
    let detail = format!(
        "X's expiry after the leaves: {clamped:?} ms ahead; X queued at the release: \
         {queued_at_release}; {since:.1?} after X's heartbeat, {what}"
    );
    finish_off(x);
    // Only a jump can be a break, and only one that X's own beat or exit did not explain: with the
    // clamp kept for a wake that went out, X keeps its long expiry and is granted at the release.
    if jumped && ((!woken && (x_beat || !still_waiting)) || since > Duration::from_millis(7500)) {
        eprintln!("inconclusive run (X beat or left): {detail}");
        return None;
    }
    Some((jumped, detail))
}

/// Waiters of the probe-only user leave from the front of the queue; the waiter behind them, with
/// every right and listening, far enough back to heartbeat every 10 s, moves to the head. Its
/// expiry is brought down to a front lifetime (front.lua) on the promise of a wake that makes it
/// beat at once, and that wake is a pcall the leavers' rules refuse. So a live waiter is dropped
/// as dead before its next heartbeat, and a `-n` attempt of another client is granted ahead of it
/// (no_wait never jumps the queue, docs/queue.md): it waited, was heard from within its interval,
/// and lost its place to a client that came seconds ago.
#[test]
fn a_live_waiter_whose_front_wake_went_unsent_keeps_its_place() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    for attempt in 0..3 {
        if let Some((jumped, detail)) = dropped_case(&s, false, false) {
            eprintln!("attempt {attempt}: {detail}");
            assert!(
                !jumped,
                "a -n attempt was granted while a live waiter queued long before it waited: {detail}"
            );
            return;
        }
    }
    panic!("three inconclusive runs");
}

/// The same case, overtaken by a waiter: Y queues behind X a second after the leaves and
/// heartbeats at the front; X is dropped before its next heartbeat, and the release lets Y in:
/// a waiter that arrived seconds ago is served before one that waited since long before.
#[test]
fn a_waiter_whose_front_wake_went_unsent_is_not_overtaken_by_a_later_waiter() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    for attempt in 0..3 {
        if let Some((jumped, detail)) = dropped_case(&s, false, true) {
            eprintln!("attempt {attempt}: {detail}");
            assert!(!jumped, "a later waiter was served before X: {detail}");
            return;
        }
    }
    panic!("three inconclusive runs");
}

/// The same with leavers that have the recipe's rules: their leave wakes X, which beats at once
/// and keeps its place, so the `-n` attempt is refused (the case above differs only in the rules).
#[test]
fn a_live_waiter_woken_to_the_front_keeps_its_place() {
    let s = Server::start();
    locker(&s, &["&lockctl:*", "&{lockctl:*", "&{*}?lockctl:*"]);
    for by_waiter in [false, true] {
        woken_case(&s, by_waiter);
    }
}

fn woken_case(s: &Server, by_waiter: bool) {
    for attempt in 0..3 {
        if let Some((jumped, detail)) = dropped_case(s, true, by_waiter) {
            eprintln!("attempt {attempt}: {detail}");
            assert!(!jumped, "{detail}");
            return;
        }
    }
    panic!("three inconclusive runs");
}

/// After `SCRIPT FLUSH` the scripts go by `EVAL` (NOSCRIPT): a user without channels is still
/// refused (78) with nothing written, and a probe-only user still holds and releases.
#[test]
fn after_a_script_flush_the_refusal_still_changes_nothing() {
    let s = Server::start();
    for round in 0..3 {
        let _: String = s.cmd(&["SCRIPT", "FLUSH"]);
        locker(&s, &[]);
        let o = run(as_locker(&[&s]).args(["acquire", "job", "-n"]));
        assert_eq!(code(&o), 78, "round {round}: {}", stderr(&o));
        assert!(s.keys().is_empty(), "round {round}: wrote {:?}", s.keys());
        let _: String = s.cmd(&["SCRIPT", "FLUSH"]);
        locker(&s, PROBE_ONLY);
        let o = run(as_locker(&[&s]).args(["acquire", "job", "-n", "--ttl", "60s"]));
        assert_eq!(code(&o), 0, "round {round}: {}", stderr(&o));
        let _: String = s.cmd(&["SCRIPT", "FLUSH"]);
        let r = run(as_locker(&[&s]).args(["release", "job", "--token", &stdout(&o)]));
        assert_eq!(code(&r), 0, "round {round}: {}", stderr(&r));
        assert_eq!(s.get("lockctl:job"), None, "round {round}");
        let _: String = s.cmd(&["FLUSHALL"]);
    }
}

/// `doctor` as a user without channels fails its permission check, naming the channel rules; as
/// a user with the recipe's rules it passes it.
#[test]
fn doctor_tells_a_user_without_channels_from_one_with_them() {
    let s = Server::start();
    locker(&s, &[]);
    let o = run(as_locker(&[&s]).args(["doctor"]));
    let out = format!("{}{}", stdout(&o), stderr(&o));
    eprintln!("without channels: exit {}\n{out}", code(&o));
    assert_ne!(code(&o), 0, "{out}");
    assert!(out.contains("refused") || out.contains("channel"), "{out}");
    locker(
        &s,
        &[
            "&lockctl:*",
            "&{lockctl:*",
            "&{*}?lockctl:*",
            "&__keyspace@*__:lockctl:*",
        ],
    );
    let o = run(as_locker(&[&s]).args(["doctor"]));
    let out = format!("{}{}", stdout(&o), stderr(&o));
    eprintln!("with the recipe: exit {}\n{out}", code(&o));
    assert!(!out.contains("refused"), "{out}");
}

/// Rules that pass the probe but cover no waiter's own wake channel: such a user's releases,
/// breaks and departures wake nobody (and its waiters cannot listen), which the docs call missing
/// required rules (docs/security.md: `doctor` reports the missing rules as a failed permission
/// check). `doctor` must not call its permissions fine.
#[test]
fn doctor_does_not_pass_rules_that_cover_no_waiters_wake_channel() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    let o = run(as_locker(&[&s]).args(["doctor"]));
    let out = format!("{}{}", stdout(&o), stderr(&o));
    let line = out
        .lines()
        .find(|l| l.contains("permissions"))
        .unwrap_or_default()
        .to_string();
    eprintln!("probe-only rules: exit {}: {line}", code(&o));
    assert!(
        !line.trim_start().starts_with("ok"),
        "doctor passes rules under which no wake reaches a waiter (exit {}): {line}",
        code(&o)
    );
}

/// A Redis Cluster with user `locker` on every node: without channels every lock command is
/// refused (78) with nothing written on any master; with the probe-only rules a holder releases,
/// and a waiter with every right behind it is served.
#[test]
fn a_cluster_with_the_user_on_every_node() {
    use support::topology::{lockctl_on_url, Cluster};
    let cluster = Cluster::start();
    let set = |rules: &[&str]| {
        for n in &cluster.nodes {
            let args = setuser(rules);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let ok: String = n.cmd(&args).unwrap();
            assert_eq!(ok, "OK");
        }
    };
    let m = cluster.masters();
    let url = format!("redis://locker:{PW}@127.0.0.1:{}", m[0]);
    let full = format!("redis://127.0.0.1:{}", m[0]);
    let keys = |port: u16| -> Vec<String> {
        let n = cluster.nodes.iter().find(|n| n.port == port).unwrap();
        n.cmd(&["KEYS", "*"]).unwrap()
    };
    set(&[]);
    for name in ["job", "{app}:job"] {
        let o = run(lockctl_on_url(&url).args(["acquire", name, "-n"]));
        assert_eq!(code(&o), 78, "{name}: {}", stderr(&o));
        for p in &m {
            let k: Vec<String> = keys(*p)
                .into_iter()
                .filter(|k| !k.starts_with("cluster-ready"))
                .collect();
            assert!(k.is_empty(), "{name}: node {p} has {k:?}");
        }
    }
    set(PROBE_ONLY);
    let o = run(lockctl_on_url(&url).args(["acquire", "job", "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let w = lockctl_on_url(&full)
        .args(["acquire", "job", "-w", "60s", "--ttl", "5s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let owner = cluster.owner("{lockctl:job}\u{1f}queue");
    let on = cluster.nodes.iter().find(|n| n.port == owner).unwrap();
    assert!(
        eventually(Duration::from_secs(20), || on
            .cmd::<u64>(&["ZCARD", "{lockctl:job}\u{1f}queue"])
            .is_ok_and(|n| n == 1)),
        "the waiter never queued"
    );
    let started = Instant::now();
    let r = run(lockctl_on_url(&url).args(["release", "job", "--token", &token]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let o = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "the waiter: {}", stderr(&o));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
}

/// A `--supersede` waiter of the probe-only user displaces four older waiters with every right:
/// its wakes to them go unsent, so each learns it was displaced at its next heartbeat, and exits
/// busy (75) saying so within a bounded time; the holder is untouched, and its release lets the
/// superseder in, with nothing queued after.
#[test]
fn a_supersede_whose_wakes_go_unsent_still_displaces_within_a_heartbeat() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    let holder = stdout(&run(
        lockctl_on(&s).args(["acquire", "sup", "--ttl", "120s"])
    ));
    let older: Vec<Child> = (1..=4)
        .map(|i| {
            let c = waiting(lockctl_on(&s), "sup");
            wait_queued(&s, "sup", i);
            c
        })
        .collect();
    let started = Instant::now();
    let sup = as_locker(&[&s])
        .args([
            "acquire",
            "sup",
            "--supersede",
            "-w",
            "100s",
            "--ttl",
            "60s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    for (i, c) in older.into_iter().enumerate() {
        let o = wait_output(c, Duration::from_secs(90));
        let err = stderr(&o);
        eprintln!(
            "waiter {i}: exit {} after {:?}",
            code(&o),
            started.elapsed()
        );
        assert_eq!(code(&o), 75, "waiter {i}: {err}");
        assert!(err.contains("superseded"), "waiter {i}: {err}");
    }
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(s.get("lockctl:sup").as_deref(), Some(holder.as_str()));
    let r = run(lockctl_on(&s).args(["release", "sup", "--token", &holder]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let o = wait_output(sup, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "the superseder: {}", stderr(&o));
    assert!(queue_drains(&s, "sup"), "the queue stayed");
}

/// Waiters of both users in one queue (every second one probe-only: it cannot listen on its own
/// wake channel, nor wake the next), behind a holder with every right: they are served in arrival
/// order, and the queue is empty after.
#[test]
fn a_mixed_queue_is_served_in_arrival_order() {
    let s = Server::start();
    locker(&s, PROBE_ONLY);
    for round in 0..2 {
        let name = format!("mixed{round}");
        let token = stdout(&run(lockctl_on(&s).args(["acquire", &name, "--ttl", "60s"])));
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let mut n = 0;
        let kids = queue_in_order(&[&s], &name, &file, 6, || {
            n += 1;
            if n % 2 == 0 {
                as_locker(&[&s])
            } else {
                lockctl_on(&s)
            }
        });
        let started = Instant::now();
        let r = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&r), 0, "{}", stderr(&r));
        all_succeed(kids);
        eprintln!("round {round}: served in {:?}", started.elapsed());
        assert_eq!(
            order(&file),
            ["1", "2", "3", "4", "5", "6"],
            "round {round}"
        );
        assert!(queue_drains(&s, &name), "round {round}: the queue stayed");
    }
}
