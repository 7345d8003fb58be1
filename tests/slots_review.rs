//! Reviewed attacks on `--limit N` that broke a promise: each test here reproduces one with real
//! servers and real faults (SIGSTOP, kill -9 and a restart without data under the restart quarantine)
//! and asserts what the promise says.
//!
//! `renew NAME --token T` looks for T in every slot of every node and counts each node where it finds
//! it, whatever the slot. A grant's round-1 request to a paused node runs when the node wakes, after
//! the grant won elsewhere, and takes whatever slot is free there then: the holder of slot 1 can own a
//! stray slot 2 key on that node. Counting it, a renewal keeps a lease on slot 1 that no quorum holds
//! any more, while another client is granted slot 1. Renewal and release now count per slot; the
//! other tests here check that a renewal extends the quorum slot alone, that a release is judged by
//! it and deletes the stray, and that a key put back after a restart never joins a semaphore of
//! another limit.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

#[test]
fn a_stray_slot_key_does_not_keep_a_lost_slot_renewed() {
    let mut s = Servers::start(3);
    // Before the restart the quarantine is off (support's default, for servers the test just
    // started); from the restart on every command keeps it on.
    let quiet = || {
        let mut c = s.lockctl();
        c.args(["--node-timeout", "300ms"]);
        c
    };

    // The nodes know lockctl's scripts (EVALSHA finds them), as nodes in use do.
    let warm = acquire_json(&mut quiet(), "warm-up", &[]);
    let o = run(quiet().args([
        "release",
        "warm-up",
        "--token",
        warm["token"].as_str().unwrap(),
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    // W's grant (slot 1 on nodes 0 and 1) reaches the paused node 2 only as a queued request; W's
    // job dies without releasing and its keys on nodes 0, 1 expire.
    s[2].pause();
    let w = acquire_json(&mut quiet(), "pool", &["--limit", "2", "--ttl", "1s", "-n"]);
    assert_eq!(w["slot"], 1, "{w}");
    std::thread::sleep(Duration::from_millis(1300));
    // H wins slot 1 on nodes 0 and 1; its request to node 2 queues behind W's.
    let h = acquire_json(&mut quiet(), "pool", &["--limit", "2", "--ttl", "3s", "-n"]);
    assert_eq!(h["slot"], 1, "{h}");
    let h_token = h["token"].as_str().unwrap().to_string();
    s[2].resume();
    // Node 2 ran W's request (slot 1), then H's, which found slot 1 taken and took slot 2.
    let stray = eventually(Duration::from_secs(5), || {
        s[2].get(&slot_key("pool", 2)).as_deref() == Some(h_token.as_str())
    });
    assert!(stray, "node 2 holds {:?}", s[2].keys());
    assert_eq!(
        s[2].get(&slot_key("pool", 1)),
        w["token"].as_str().map(String::from)
    );

    // Node 0 restarts without data; its quarantine (the 3 s TTL) stays on.
    s[0].restart_empty();
    let renew_h = |s: &Servers| {
        run(s
            .lockctl()
            .env_remove("LOCKCTL_QUARANTINE")
            .args(["renew", "pool", "--token", &h_token]))
    };
    let mut x = s
        .lockctl()
        .env_remove("LOCKCTL_QUARANTINE")
        .args([
            "acquire", "pool", "--limit", "2", "--ttl", "3s", "-w", "30s",
        ])
        .args(["--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // H renews every 700 ms, as a holder's script would, while X waits for slot 1.
    let started = Instant::now();
    while x.try_wait().unwrap().is_none() && started.elapsed() < Duration::from_secs(30) {
        let _ = renew_h(&s);
        std::thread::sleep(Duration::from_millis(700));
    }
    let xo = wait_output(x, Duration::from_secs(30));
    assert_eq!(code(&xo), 0, "X: {}", stderr(&xo));
    let xg: serde_json::Value = serde_json::from_str(&stdout(&xo)).unwrap();
    assert_eq!(xg["slot"], 1, "{xg}");
    // H's stray slot-2 key on node 2 is no longer extended by H's renewals; Y waits out its TTL.
    let y = acquire_json(
        s.lockctl().env_remove("LOCKCTL_QUARANTINE"),
        "pool",
        &["--limit", "2", "--ttl", "3s", "-w", "10s"],
    );
    assert_eq!(y["slot"], 2, "{y}");

    // X holds slot 1 and Y slot 2, both within their validity: H's renewal must not say it holds.
    let o = renew_h(&s);
    assert_eq!(
        code(&o),
        76,
        "H renewed its slot-1 lease (validity {} ms) while X holds slot 1 and Y slot 2 of a \
         --limit 2 semaphore: three holders; nodes: {:?}",
        stdout(&o),
        (0..3)
            .map(|i| (
                s[i].get(&slot_key("pool", 1)),
                s[i].get(&slot_key("pool", 2))
            ))
            .collect::<Vec<_>>()
    );
}

/// Three fresh nodes where H holds slot 1 of `pool` (--limit 2, 10 s TTL) on nodes 0 and 1 and a stray
/// slot-2 key on node 2: H's round-1 request ran there late, after W's (slot 1, W's job gone), once
/// the paused node woke. Returns the servers and H's token.
fn holder_with_a_stray() -> (Servers, String) {
    let s = Servers::start(3);
    let quiet = || {
        let mut c = s.lockctl();
        c.args(["--node-timeout", "300ms"]);
        c
    };
    // Scripts loaded first, so that the paused node's queue holds only the two grants' requests.
    let warm = acquire_json(&mut quiet(), "warm-up", &[]);
    let o = run(quiet().args([
        "release",
        "warm-up",
        "--token",
        warm["token"].as_str().unwrap(),
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    s[2].pause();
    let w = acquire_json(&mut quiet(), "pool", &["--limit", "2", "--ttl", "1s", "-n"]);
    assert_eq!(w["slot"], 1, "{w}");
    std::thread::sleep(Duration::from_millis(1300));
    let h = acquire_json(
        &mut quiet(),
        "pool",
        &["--limit", "2", "--ttl", "10s", "-n"],
    );
    assert_eq!(h["slot"], 1, "{h}");
    let h_token = h["token"].as_str().unwrap().to_string();
    s[2].resume();
    let stray = eventually(Duration::from_secs(5), || {
        s[2].get(&slot_key("pool", 2)).as_deref() == Some(h_token.as_str())
    });
    assert!(stray, "node 2 holds {:?}", s[2].keys());
    (s, h_token)
}

fn holds(s: &Servers, token: &str) -> Vec<(usize, usize)> {
    (0..3)
        .flat_map(|i| [1, 2].map(|slot| (i, slot)))
        .filter(|&(i, slot)| s[i].get(&slot_key("pool", slot)).as_deref() == Some(token))
        .collect()
}

#[test]
fn a_renewal_extends_the_quorum_slot_alone_and_a_release_deletes_the_stray() {
    let (s, h) = holder_with_a_stray();
    let o = run(s
        .lockctl()
        .args(["renew", "pool", "--token", &h, "--ttl", "20s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let pttl = |i: usize, slot: usize| -> i64 { s[i].cmd(&["PTTL", &slot_key("pool", slot)]) };
    for i in [0, 1] {
        assert!(
            pttl(i, 1) > 10_000,
            "node {i} slot 1 not extended: {}",
            pttl(i, 1)
        );
    }
    // The stray keeps at most the 10 s it was set with; a renewal of it would have made it 20 s.
    let stray = pttl(2, 2);
    assert!(
        stray <= 10_000,
        "the stray slot-2 key was extended: {stray} ms"
    );

    let o = run(s.lockctl().args(["release", "pool", "--token", &h]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(holds(&s, &h), vec![], "keys of the released token remain");
}

#[test]
fn a_release_is_judged_by_the_slot_with_a_quorum() {
    let (mut s, h) = holder_with_a_stray();
    // Node 0 restarts without data (the quarantine stays on): H keeps slot 1 on node 1 alone, and
    // its stray slot 2 on node 2. No slot has a quorum.
    s[0].restart_empty();
    assert_eq!(holds(&s, &h), vec![(1, 1), (2, 2)]);
    let o = run(s
        .lockctl()
        .env_remove("LOCKCTL_QUARANTINE")
        .args(["release", "pool", "--token", &h]));
    assert_eq!(
        code(&o),
        76,
        "release counted slot 1 on node 1 and the stray slot 2 on node 2 as a quorum: {}",
        stderr(&o)
    );
    // Every key of the token is gone all the same: they were all the caller's.
    assert_eq!(holds(&s, &h), vec![], "keys of the released token remain");
}

/// A renewal that would put back a slot key lost in a restart leaves it out where the node now
/// records another limit for the name: a semaphore of 3 started there meanwhile (by a client that
/// reached that node alone), and the key of a limit-2 grant would fill one of its slots.
#[test]
fn a_renewal_puts_back_no_key_into_a_semaphore_of_another_limit() {
    use std::io::{BufRead, Write};
    let mut s = Servers::start(3);
    // Servers just started: wait out the exec's quarantine (on below) so that they vote.
    assert!(eventually(Duration::from_secs(15), || s.0.iter().all(
        |n| {
            let info: String = n.cmd(&["INFO", "server"]);
            info.lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .is_some_and(|u| u.trim().parse::<u64>().unwrap() >= 8)
        }
    )));
    // Slot 1 taken with the quarantine off (support's default: servers the test just started).
    let first = acquire_json(&mut s.lockctl(), "pool", &["--limit", "2", "--ttl", "60s"]);
    assert_eq!(first["slot"], 1);
    let mut child = s
        .lockctl()
        .env_remove("LOCKCTL_QUARANTINE")
        .args(["exec", "pool", "--limit", "2", "--ttl", "6s"])
        .args(["--node-timeout", "1s", "--", "sh", "-c"])
        .arg("echo \"ready $LOCKCTL_SLOT $LOCKCTL_TOKEN\"; read _")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let parts: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(parts[..2], ["ready", "2"], "{line:?}");
    let token = parts[2].to_string();

    s[1].restart_empty();
    let restarted = Instant::now();
    // Another client of node 1 alone, with a quarantine of its own (1 s, shorter than the exec's
    // 6 s), makes the name a semaphore of 3 there.
    let other = acquire_json(
        lockctl_on(&s[1]).env_remove("LOCKCTL_QUARANTINE"),
        "pool",
        &[
            "--limit",
            "3",
            "--ttl",
            "60s",
            "--quarantine",
            "1s",
            "-w",
            "10s",
        ],
    );
    assert_eq!(other["slot"], 1, "{other}");
    assert!(
        restarted.elapsed() < Duration::from_secs(6),
        "granted after the exec's quarantine: nothing to test"
    );
    // The exec renews every 2 s; past its quarantine (6 s) it would have put the key back.
    std::thread::sleep(Duration::from_secs(6).saturating_sub(restarted.elapsed()));
    let put_back = eventually(Duration::from_secs(5), || {
        s[1].get(&slot_key("pool", 2)).as_deref() == Some(token.as_str())
    });
    let limit = s[1].get("{lockctl:pool}\u{1f}limit");
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"done\n");
    drop(stdin);
    let o = wait_output(child, Duration::from_secs(60));
    assert!(
        !put_back,
        "slot 2 of the limit-2 grant put back into node 1's semaphore of 3"
    );
    assert_eq!(limit.as_deref(), Some("3"));
    // Nodes 0 and 2 kept the lease. (Not the exit status: see the restart test in slots.rs.)
    assert!(!stderr(&o).contains("no longer ours"), "{}", stderr(&o));
}
