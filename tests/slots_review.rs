//! Reviewed attacks on `--limit N` that broke a promise: each test here reproduces one with real
//! servers and real faults (SIGSTOP, kill -9 and a restart without data under the restart quarantine)
//! and asserts what the promise says.
//!
//! `renew NAME --token T` looks for T in every slot of every node and counts each node where it finds
//! it, whatever the slot. A grant's round-1 request to a paused node runs when the node wakes, after
//! the grant won elsewhere, and takes whatever slot is free there then: the holder of slot 1 can own a
//! stray slot 2 key on that node. Counting it, a renewal keeps a lease on slot 1 that no quorum holds
//! any more, while another client is granted slot 1.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::*;

fn slot_key(name: &str, i: usize) -> String {
    if i == 1 {
        format!("lockctl:{name}")
    } else {
        format!("{{lockctl:{name}}}\u{1f}slot\u{1f}{i}")
    }
}

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
