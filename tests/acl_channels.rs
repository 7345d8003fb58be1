//! An ACL user that may touch the keys but not publish or subscribe on lockctl's channels (Redis 7's
//! default for a new user, `acl-pubsub-default resetchannels`): every lock command it runs is refused
//! with exit 78, naming the channel rules, before anything changes on any node. Without the probe
//! the grant path succeeded (it publishes nothing), a release deleted the key and then failed at its
//! PUBLISH (a script is not rolled back), and a waiter's refused SUBSCRIBE was taken for a
//! subscription.
//!
//! The users are made with an explicit `resetchannels`, so the servers of the compatibility matrix
//! (Redis 6.2 gives a new user `allchannels`) see the same user as Redis 7 does.

mod support;

use std::time::{Duration, Instant};

use support::acl::*;
use support::*;

/// A refusal for want of the channel rules: 78, the `&` rules named, the recipe pointed at, and no
/// password in the message.
fn assert_channel_refusal(what: &str, o: &std::process::Output) {
    let err = stderr(o);
    assert_eq!(code(o), 78, "{what}: {err}");
    assert!(err.contains("channel"), "{what}: names a channel: {err}");
    assert!(
        err.contains("&{lockctl:*") && err.contains("docs/security.md"),
        "{what}: names the channel rules and the recipe: {err}"
    );
    assert!(!err.contains(PW), "{what}: a password leaked: {err}");
    assert!(stdout(o).is_empty(), "{what}: {}", stdout(o));
}

/// A lock held by the default user (which has every channel), for 60 s; its token.
fn held_by_default(servers: &[&Server], name: &str) -> String {
    let mut c = lockctl();
    let urls: Vec<String> = servers.iter().map(|s| s.url()).collect();
    c.env("LOCKCTL_REDIS", urls.join(","));
    let grant = acquire_json(&mut c, name, &["-n", "--ttl", "60s"]);
    grant["token"].as_str().unwrap().to_string()
}

#[test]
fn every_lock_command_of_a_user_without_channels_is_refused_and_changes_nothing() {
    let s = Server::start();
    locker(&s, &[]);
    let token = held_by_default(&[&s], "held");
    let before = state(&s);
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");

    for verbose in [false, true] {
        let v: &[&str] = if verbose { &["-v"] } else { &[] };
        let cases: Vec<(&str, Vec<String>)> = vec![
            ("acquire", vec!["acquire".into(), "job".into(), "-n".into()]),
            (
                "acquire --limit 3",
                vec![
                    "acquire".into(),
                    "sem".into(),
                    "-n".into(),
                    "--limit".into(),
                    "3".into(),
                ],
            ),
            (
                "exec",
                vec![
                    "exec".into(),
                    "job".into(),
                    "-n".into(),
                    "--".into(),
                    "touch".into(),
                    marker.display().to_string(),
                ],
            ),
            (
                "release",
                vec![
                    "release".into(),
                    "held".into(),
                    "--token".into(),
                    token.clone(),
                ],
            ),
            (
                "renew",
                vec![
                    "renew".into(),
                    "held".into(),
                    "--token".into(),
                    token.clone(),
                    "--ttl".into(),
                    "600s".into(),
                ],
            ),
            ("break", vec!["break".into(), "held".into(), "--yes".into()]),
        ];
        for (what, args) in cases {
            let o = run(as_locker(&[&s]).args(v).args(&args));
            assert_channel_refusal(what, &o);
            assert_eq!(state(&s), before, "{what} changed something");
            // The one node refused before any grant: no rollback to speak of.
            let err = stderr(&o);
            assert!(!err.contains("rolled back"), "{what}: {err}");
        }
        // A waiter behind the holder: refused at once, never queued (a refusal waits for nothing).
        let started = Instant::now();
        let o = run(as_locker(&[&s])
            .args(v)
            .args(["acquire", "held", "-w", "5s"]));
        assert_channel_refusal("a waiter", &o);
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the waiter waited before it was refused: {:?}",
            started.elapsed()
        );
        assert_eq!(state(&s), before, "the waiter changed something");
    }
    assert!(!marker.exists(), "exec ran its command without a lock");
    let ttl: i64 = s.cmd(&["PTTL", "lockctl:held"]);
    assert!(ttl <= 60_000, "renewed: {ttl} ms");
    assert_eq!(s.get("lockctl:held").as_deref(), Some(token.as_str()));
}

/// The fencing counters of `state`, by key, as numbers.
fn counters(state: &[String]) -> Vec<(String, u128)> {
    state
        .iter()
        .filter(|l| l.contains("\\u{1f}fence\""))
        .map(|l| {
            let (key, rest) = l.split_once(' ').unwrap();
            (
                key.to_string(),
                rest.rsplit(' ').next().unwrap().parse().unwrap(),
            )
        })
        .collect()
}

/// `state` without the fencing counters.
fn without_counters(state: &[String]) -> Vec<String> {
    state
        .iter()
        .filter(|l| !l.contains("\\u{1f}fence\""))
        .cloned()
        .collect()
}

/// Redlock: the node that refuses changes nothing. An acquire is refused as a whole (78): its round
/// 1 is rolled back on the nodes that granted, and only their fencing counters may have risen (a
/// counter only rises; any rolled-back attempt leaves the same). A release, renewal or break is
/// judged by its quorum, with no round of its own to check the rights first: the two other nodes do
/// it, the refusing node keeps its copy, and stderr says so.
#[test]
fn a_redlock_with_one_node_without_channels_refuses_a_grant_and_says_so_otherwise() {
    let servers = Servers::start(3);
    for (i, s) in servers.0.iter().enumerate() {
        locker(s, if i == 1 { &[] } else { CHANNELS });
    }
    let all: Vec<&Server> = servers.0.iter().collect();
    let token = held_by_default(&all, "held");
    let states = || -> Vec<Vec<String>> { all.iter().map(|s| state(s)).collect() };
    let refusing = servers[1].socket().display().to_string();
    let cases: [&[&str]; 3] = [
        &["acquire", "job", "-n"],
        &["acquire", "held", "-w", "5s"],
        &["exec", "job", "-n", "--", "true"],
    ];
    for args in cases {
        let before = states();
        let o = run(as_locker(&all).args(args));
        assert_channel_refusal(args[0], &o);
        let err = stderr(&o);
        assert!(
            err.contains(&refusing),
            "{args:?}: names the node that refuses: {err}"
        );
        let after = states();
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(without_counters(a), without_counters(b), "{args:?}: {err}");
            for (key, was) in counters(b) {
                let now = counters(a).into_iter().find(|(k, _)| *k == key);
                assert!(
                    now.as_ref().is_some_and(|(_, n)| *n >= was),
                    "{args:?}: {key} {now:?}"
                );
            }
        }
        // A free lock: the other two nodes granted, and their grants went back. A held one: they
        // refused, so nothing is said to have been rolled back.
        if args[1] == "job" {
            assert!(
                err.contains("the grants of the other 2 node(s) were rolled back"),
                "{args:?}: {err}"
            );
        } else {
            assert!(!err.contains("rolled back"), "{args:?}: {err}");
        }
    }
    assert_eq!(servers[0].get("lockctl:held"), Some(token.clone()));

    // Each on a lock of its own, held by the default user on all three nodes.
    for what in ["release", "renew", "break"] {
        let name = format!("held-{what}");
        let key = format!("lockctl:{name}");
        let t = held_by_default(&all, &name);
        let refusing_before = state(&servers[1]);
        let mut c = as_locker(&all);
        match what {
            "release" => c.args(["release", &name, "--token", &t]),
            "renew" => c.args(["renew", &name, "--token", &t, "--ttl", "600s"]),
            _ => c.args(["break", &name, "--yes"]),
        };
        let o = run(&mut c);
        let err = stderr(&o);
        assert_eq!(code(&o), 0, "{what}: done on a quorum: {err}");
        // `break` reports every node's answer itself; the others warn.
        assert!(
            (what == "break" || err.contains("warning:"))
                && err.contains(&refusing)
                && err.contains("channel"),
            "{what}: says which node refused: {err}"
        );
        assert!(!err.contains(PW), "{what}: a password leaked: {err}");
        assert_eq!(
            state(&servers[1]),
            refusing_before,
            "{what}: the refusing node changed"
        );
        for i in [0, 2] {
            let pttl: i64 = servers[i].cmd(&["PTTL", &key]);
            match what {
                "renew" => assert!(pttl > 60_000, "{what}: node {i} not renewed: {pttl} ms"),
                _ => assert_eq!(servers[i].get(&key), None, "{what}: node {i} kept the key"),
            }
        }
        let pttl: i64 = servers[1].cmd(&["PTTL", &key]);
        assert!(
            (1..=60_000).contains(&pttl),
            "{what}: the refusing node's copy: {pttl} ms"
        );
    }

    // With the rules on that node too, the same user works.
    locker(&servers[1], CHANNELS);
    let grant = acquire_json(&mut as_locker(&all), "job", &["-n"]);
    let t = grant["token"].as_str().unwrap();
    let o = run(as_locker(&all).args(["release", "job", "--token", t]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("warning"), "{}", stderr(&o));
}

/// A holder whose channel rules are taken away while it holds: its release is refused (78) and
/// leaves the lock as it was, held until its TTL ends or until a release once the rules are back;
/// it never deletes the key and then reports a failure.
#[test]
fn a_release_after_the_channels_were_taken_away_is_refused_and_keeps_the_lock() {
    let s = Server::start();
    locker(&s, CHANNELS);
    let grant = acquire_json(&mut as_locker(&[&s]), "job", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let ok: String = s.cmd(&["ACL", "SETUSER", "locker", "resetchannels"]);
    assert_eq!(ok, "OK");
    let before = state(&s);
    let o = run(as_locker(&[&s]).args(["release", "job", "--token", &token]));
    assert_channel_refusal("release", &o);
    assert!(
        stderr(&o).contains("still held"),
        "says the lock is still held: {}",
        stderr(&o)
    );
    assert_eq!(state(&s), before);
    assert_eq!(s.get("lockctl:job").as_deref(), Some(token.as_str()));

    // The rules back: the same release goes through.
    locker(&s, CHANNELS);
    let o = run(as_locker(&[&s]).args(["release", "job", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:job"), None);
}

/// Without `&__keyspace@*__:lockctl:*` a waiter still listens on its own wake channel (the keyspace
/// events are an extra, subscribed to on their own), says so under `-v`, and the release wakes it.
#[test]
fn a_waiter_without_the_keyspace_rule_is_woken_on_its_wake_channel() {
    let s = Server::with_args(&["--notify-keyspace-events", "Kgx"]);
    let rules: Vec<&str> = CHANNELS
        .iter()
        .copied()
        .filter(|r| !r.starts_with("&__keyspace"))
        .collect();
    locker(&s, &rules);
    let grant = acquire_json(&mut as_locker(&[&s]), "wait", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let mut waiter = as_locker(&[&s]);
    let child = waiter
        .args(["-v", "acquire", "wait", "-w", "50s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || {
            let wake: Vec<String> =
                s.cmd(&["PUBSUB", "CHANNELS", "{lockctl:wait}\u{1f}wake\u{1f}*"]);
            wake.len() == 1
        }),
        "the waiter is not subscribed to its wake channel"
    );
    // Let it settle into its sleep: a waiter on one node sleeps until woken or its heartbeat.
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let o = run(as_locker(&[&s]).args(["release", "wait", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(child, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 0, "{err}");
    assert!(
        err.contains("woken by a release"),
        "woken on its wake channel: {err}"
    );
    assert!(
        err.contains("keyspace") && err.contains("refused"),
        "says the keyspace subscription was refused: {err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}
