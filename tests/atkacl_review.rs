//! Review of the refusal of ACL users without channel rights (docs/security.md, "A user without the
//! channel rules"): rights that differ per channel, a missing `+publish` command right, and rights
//! taken away from a waiter while it waits. Every server here is started by the test itself, so
//! the restart quarantine is off (`lockctl()`).

mod support;

use std::time::Duration;

use support::acl::*;
use support::*;

/// A user may publish on the wake channels but not on the name's `released` channel (a rule that
/// ends in the channel's kind). The queue needs only the wake channels, which the acquire checks;
/// the announcement on `released` is for outside listeners and goes unsent (a pcall). Its release
/// used to publish there first and be refused, so the lock it was granted could never be released
/// by it; now the user holds and releases.
#[test]
fn a_user_who_may_publish_on_the_wake_channels_only_holds_and_releases() {
    let s = Server::start();
    locker(&s, &["&{lockctl:*}?wake?*"]);
    let o = run(as_locker(&[&s]).args(["acquire", "job", "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let r = run(as_locker(&[&s]).args(["release", "job", "--token", token.trim()]));
    assert_eq!(code(&r), 0, "its own release: {}", stderr(&r));
    assert_eq!(s.get("lockctl:job"), None, "the release left the key");
}

/// A user with every channel (`allchannels`) but without the `publish` command: it is refused (78),
/// and the message must name what it lacks, the command, not only the `&` channel rules it has
/// (Redis 6.2's probe names the command PUBLISH; on Redis 7 `redis.acl_check_cmd` says only "no",
/// for the command or the channel alike, so the message names both).
#[test]
fn a_user_without_the_publish_command_is_not_told_it_lacks_the_channel_rules() {
    let s = Server::start();
    locker(&s, &["allchannels", "-publish"]);
    let before = state(&s);
    let o = run(as_locker(&[&s]).args(["acquire", "job", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 78, "{err}");
    assert_eq!(state(&s), before, "the refused acquire changed something");
    assert!(!err.contains(PW), "a password leaked: {err}");
    assert!(
        err.contains("+publish"),
        "does not name the command a user that has every channel lacks: {err}"
    );
}

/// A waiter queued with the rules, whose rules are then taken away: its next attempt is refused
/// (78), and its leave of the queue publishes and is refused too. It exits saying that it changed
/// nothing on the node, yet its entry stays queued (listed by `status`, woken in place of the
/// next waiter) until its heartbeat runs out.
#[test]
fn a_waiter_whose_rules_are_taken_away_leaves_nothing_queued() {
    let s = Server::start();
    locker(&s, CHANNELS);
    let grant = acquire_json(&mut lockctl_on(&s), "held", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let queue = "{lockctl:held}\u{1f}queue";
    let child = as_locker(&[&s])
        .args(["acquire", "held", "-w", "50s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || s.cmd::<i64>(&["ZCARD", queue])
            == 1),
        "the waiter never queued"
    );
    let ok: String = s.cmd(&["ACL", "SETUSER", "locker", "resetchannels"]);
    assert_eq!(ok, "OK");
    let o = wait_output(child, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 78, "{err}");
    let left: Vec<String> = s.cmd(&["ZRANGE", queue, "0", "-1"]);
    let status = run(lockctl_on(&s).args(["status", "held"]));
    assert!(
        left.is_empty(),
        "the refused waiter is still queued {left:?} after it exited with: {err}\nstatus: {}",
        stdout(&status)
    );
    assert_eq!(s.get("lockctl:held").as_deref(), Some(token.as_str()));
}

/// A user whose rules allow the probe's channel (the wake prefix with an empty waiter id) and the
/// `released` channel, but no waiter's own wake channel. Its release passes the probe, publishes
/// `released`, deletes the key, and is refused at the wake of the waiter queued behind it: a
/// release that deleted and then failed at a PUBLISH, reported as 78 with "this command changed
/// nothing on this node, so a lock it was to release ... is still held here".
#[test]
fn a_release_refused_at_a_waiters_wake_does_not_say_the_lock_is_still_held_when_it_is_not() {
    let s = Server::start();
    locker(&s, &["&{lockctl:*}?released", "&{lockctl:*}?wake?"]);
    let grant = acquire_json(&mut as_locker(&[&s]), "job", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let queue = "{lockctl:job}\u{1f}queue";
    let waiter = lockctl_on(&s)
        .args(["acquire", "job", "-w", "50s", "--ttl", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || s.cmd::<i64>(&["ZCARD", queue])
            == 1),
        "the waiter never queued"
    );
    let o = run(as_locker(&[&s]).args(["release", "job", "--token", &token]));
    let err = stderr(&o);
    let key = s.get("lockctl:job");
    let w = wait_output(waiter, Duration::from_secs(60));
    assert_eq!(code(&w), 0, "the waiter: {}", stderr(&w));
    match code(&o) {
        0 => assert_ne!(key.as_deref(), Some(token.as_str()), "{err}"),
        _ => assert_eq!(
            key.as_deref(),
            Some(token.as_str()),
            "the release exited {} saying the lock is still held, but the key is gone: {err}",
            code(&o)
        ),
    }
}

/// Rules that cover one layout of names and not the other (`{lockctl:*` for plain names,
/// `{*}?lockctl:*` for names with braces, under the default and a custom prefix): every acquire
/// the rules do not cover is refused (78) with nothing written, and every one they cover is
/// granted and released by the same user, leaving no lock key.
#[test]
fn per_pattern_rules_refuse_exactly_the_names_they_do_not_cover() {
    let s = Server::start();
    // (rules, name, prefix, covered)
    let cases: &[(&[&str], &str, &str, bool)] = &[
        (&["&{lockctl:*"], "job", "lockctl:", true),
        (&["&{lockctl:*"], "{app}:job", "lockctl:", false),
        (&["&{lockctl:*"], "a{b", "lockctl:", false),
        (&["&{lockctl:*"], "job", "p:", false),
        (&["&{*}?lockctl:*"], "job", "lockctl:", false),
        (&["&{*}?lockctl:*"], "{app}:job", "lockctl:", true),
        (&["&{*}?lockctl:*"], "a{b", "lockctl:", true),
        (&["&{*}?lockctl:*"], "}x", "lockctl:", true),
        (&["&lockctl:*"], "job", "lockctl:", false),
        (&["&__keyspace@*__:lockctl:*"], "job", "lockctl:", false),
        (&["&{p:*", "&{*}?p:*"], "job", "p:", true),
        (&["&{p:*", "&{*}?p:*"], "{app}:job", "p:", true),
        (&["&{p:*", "&{*}?p:*"], "job", "lockctl:", false),
    ];
    for &(rules, name, prefix, covered) in cases {
        let _: String = s.cmd(&["FLUSHALL"]);
        locker(&s, rules);
        let what = format!("{rules:?} {prefix}{name}");
        let o = run(as_locker(&[&s]).args(["--prefix", prefix, "acquire", name, "-n"]));
        if !covered {
            assert_eq!(code(&o), 78, "{what}: {}", stderr(&o));
            assert!(stderr(&o).contains("channel"), "{what}: {}", stderr(&o));
            assert!(s.keys().is_empty(), "{what}: wrote {:?}", s.keys());
            continue;
        }
        assert_eq!(code(&o), 0, "{what}: {}", stderr(&o));
        let token = stdout(&o);
        let r =
            run(as_locker(&[&s]).args(["--prefix", prefix, "release", name, "--token", &token]));
        assert_eq!(code(&r), 0, "{what}: release: {}", stderr(&r));
        assert_eq!(s.get(&format!("{prefix}{name}")), None, "{what}");
    }
}
