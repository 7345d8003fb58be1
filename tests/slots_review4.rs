//! Fourth review of the semaphore's limit, against the Redlock rule that lets the nodes keeping
//! another limit count as busy once a quorum of other nodes answered with a grant or a busy reply
//! (src/lock/mod.rs:886-917): a plain lock and a semaphore, or two semaphores of different N, must
//! never hold at the same time, and fences strictly increase. Here the minorities that disagree
//! are made the way they arise in use: round-1 requests that reach a stopped node late, after
//! their client moved on. Real servers, loopback only.

mod support;

use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::*;

/// Clients of one name with N of 1, 2 and 3, each an `exec -w` that notes its start and end (with
/// its fence) in a file, while a minority of the nodes is stopped (SIGSTOP) and resumed over and
/// over, with a short node timeout: requests reach the stopped nodes late and leave there grants
/// and queue entries of one limit beside the others' grants. No two of different N may overlap, no
/// more than N of limit N may hold, and a grant of another limit comes with a larger fence than
/// every grant that ended before it.
fn mixed_limits_with_stalls(servers: &Servers, name: &str, rounds: usize) {
    let n_nodes = servers.0.len();
    let pids: Vec<i32> = servers.0.iter().map(Server::pid).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let nemesis = {
        let stop = stop.clone();
        let pids = pids.clone();
        std::thread::spawn(move || {
            let mut r = 0usize;
            while !stop.load(Ordering::SeqCst) {
                // A minority: one node, or two of five.
                let k = if n_nodes >= 5 { 1 + r % 2 } else { 1 };
                let chosen: Vec<i32> = (0..k).map(|j| pids[(r * 3 + j * 2) % n_nodes]).collect();
                for &p in &chosen {
                    kill(p, libc::SIGSTOP);
                }
                std::thread::sleep(Duration::from_millis((150 + (r * 37) % 300) as u64));
                for &p in &chosen {
                    kill(p, libc::SIGCONT);
                }
                std::thread::sleep(Duration::from_millis((50 + (r * 53) % 200) as u64));
                r += 1;
            }
        })
    };
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut codes = std::collections::BTreeMap::new();
    // How often the rule under review decided an attempt (its trace line), so that a pass says
    // whether the rule was exercised at all.
    let mut outvoted = 0usize;
    for r in 0..rounds {
        let kids: Vec<_> = (0..6)
            .map(|i| {
                let n = (r * 7 + i * 5) % 3 + 1;
                std::thread::sleep(Duration::from_millis(((r * 13 + i * 29) % 7 * 15) as u64));
                let child = servers
                    .lockctl()
                    .args(["exec", name, "--limit", &n.to_string(), "-w", "20s"])
                    .args(["--ttl", "10s", "--node-timeout", "100ms", "--verbose"])
                    .arg("-c")
                    .arg(format!(
                        "echo \"+ {n} $LOCKCTL_FENCE\" >> '{l}'; sleep 0.1; echo \"- {n} $LOCKCTL_FENCE\" >> '{l}'",
                        l = log.display(),
                    ))
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn");
                (n, child)
            })
            .collect::<Vec<_>>();
        for (n, k) in kids {
            let o = wait_output(k, Duration::from_secs(90));
            let c = code(&o);
            outvoted += stderr(&o).matches("the others decide").count();
            if c != 0 && c != 2 {
                eprintln!("limit {n}: exit {c}: {}", stderr(&o));
            }
            *codes.entry((n, c)).or_insert(0u32) += 1;
        }
    }
    stop.store(true, Ordering::SeqCst);
    nemesis.join().unwrap();
    for &p in &pids {
        kill(p, libc::SIGCONT);
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    eprintln!(
        "{rounds} rounds on {n_nodes}: (limit, exit) -> count {codes:?}; attempts where a \
         minority keeping another limit was outvoted: {outvoted}"
    );
    let mut held = [0usize; 4];
    let mut ended = [0u64; 4];
    let mut fences = std::collections::BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n: usize = f[1].parse().unwrap();
        if f[0] == "+" {
            assert!(
                fences.insert(f[2].to_string()),
                "fence {} twice:\n{text}",
                f[2]
            );
            for (m, h) in held.iter().enumerate() {
                assert!(
                    m == n || *h == 0,
                    "limit {n} granted while {h} of limit {m} hold:\n{text}"
                );
            }
            let fence: u64 = f[2].parse().unwrap();
            for (m, e) in ended.iter().enumerate() {
                assert!(
                    (m == n && n > 1) || fence > *e,
                    "limit {n} granted fence {fence} after a limit {m} grant of fence {e} \
                     ended:\n{text}"
                );
            }
            held[n] += 1;
            assert!(held[n] <= n, "{} holders of limit {n}:\n{text}", held[n]);
        } else {
            held[n] -= 1;
            ended[n] = ended[n].max(f[2].parse().unwrap());
        }
    }
    assert!(
        codes.iter().any(|((_, c), k)| *c == 0 && *k > 0),
        "no grant at all: {codes:?}"
    );
}

#[test]
fn mixed_limits_never_hold_together_while_nodes_stall_on_redlock() {
    // Never restarted: the quarantine is off for these servers the test started itself (they are
    // only stopped and resumed).
    let s = Servers::start(3);
    mixed_limits_with_stalls(&s, "stall3", 12);
}

#[test]
fn mixed_limits_never_hold_together_while_nodes_stall_on_redlock_5() {
    // Never restarted: the quarantine is off for these servers the test started itself (they are
    // only stopped and resumed).
    let s = Servers::start(5);
    mixed_limits_with_stalls(&s, "stall5", 12);
}

/// A grant made while a minority disagreed, kept by `exec`'s renewals, then released: a plain
/// lock's key left on one node of three by a release that missed that node (down) is outvoted by a
/// `--limit 2` exec (docs/queue.md, "The limit must agree"). While the exec holds and renews, a
/// plain client must be told the limit (exit 2), not be granted beside it, and a second
/// `--limit 2` client is granted with a larger fence; once both are released, the stale plain key
/// counts as a plain holder and a plain client is granted only after it is gone or outvoted.
#[test]
fn a_grant_made_while_a_minority_disagreed_keeps_the_limit_through_renewals_and_release() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let servers = Servers::start(3);
    let name = "minority";
    let p = run(servers.lockctl().args(["acquire", name, "--ttl", "30s"]));
    assert_eq!(code(&p), 0, "{}", stderr(&p));
    let r = run(servers
        .lockctl_missing(&[2])
        .args(["release", name, "--token", &stdout(&p)]));
    eprintln!(
        "release with node 3 missed: exit {} {}",
        code(&r),
        stderr(&r)
    );
    assert!(servers[2].get(&format!("lockctl:{name}")).is_some());

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let x = servers
        .lockctl()
        .args([
            "exec",
            name,
            "--limit",
            "2",
            "-n",
            "--ttl",
            "1s",
            "--verbose",
        ])
        .arg("-c")
        .arg(format!(
            "echo \"+ $LOCKCTL_FENCE\" >> '{l}'; sleep 4; echo \"- $LOCKCTL_FENCE\" >> '{l}'",
            l = log.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(&log).is_ok_and(|t| t.contains('+'))
    }));
    // Past several renewals of the 1 s lease.
    std::thread::sleep(Duration::from_millis(2500));
    let q = run(servers
        .lockctl()
        .args(["acquire", name, "-n", "--ttl", "5s"]));
    eprintln!("plain beside the exec: exit {} {}", code(&q), stderr(&q));
    let y = run(servers.lockctl().args([
        "acquire", name, "--limit", "2", "-n", "--ttl", "5s", "--format", "json",
    ]));
    eprintln!(
        "second --limit 2: exit {} {} {}",
        code(&y),
        stdout(&y),
        stderr(&y)
    );
    let xo = wait_output(x, Duration::from_secs(60));
    eprintln!("exec: exit {} {}", code(&xo), stderr(&xo));
    let text = std::fs::read_to_string(&log).unwrap();
    eprintln!("log {text:?}");
    assert_eq!(code(&xo), 0, "{}", stderr(&xo));
    assert!(
        text.contains('-'),
        "the exec kept its lease to the end: {text}"
    );
    assert_eq!(
        code(&q),
        2,
        "plain beside a valid --limit 2 exec: {}",
        stderr(&q)
    );
    assert_eq!(code(&y), 0, "{}", stderr(&y));
    let yj: serde_json::Value = serde_json::from_str(&stdout(&y)).unwrap();
    let xf: u64 = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let yf = yj["fence"].as_u64().unwrap();
    assert!(yf > xf, "fences {xf} then {yf}");
    let rel =
        run(servers
            .lockctl()
            .args(["release", name, "--token", yj["token"].as_str().unwrap()]));
    assert_eq!(code(&rel), 0, "{}", stderr(&rel));
    let q2 = run(servers
        .lockctl()
        .args(["acquire", name, "-n", "--ttl", "5s"]));
    eprintln!("plain after both: exit {} {}", code(&q2), stderr(&q2));
    assert_eq!(code(&q2), 0, "{}", stderr(&q2));
}

/// A waiter queued on the agreeing nodes only: on five nodes, two keep a `--limit 3` holder's keys
/// that its release missed (down), and a full `--limit 2` semaphore holds everywhere else. A
/// `--limit 2` waiter is queued on the three agreeing nodes (the two others outvoted) and must be
/// served once a slot frees there, with a fence above the released holder's; meanwhile a
/// `--limit 3` client, which agrees with the stale minority alone, is told the limit (exit 2).
#[test]
fn a_waiter_queued_on_the_agreeing_nodes_is_served_there_and_the_minoritys_limit_is_refused() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let servers = Servers::start(5);
    let name = "queued_minority";
    let s3 = acquire_json(
        &mut servers.lockctl(),
        name,
        &["--limit", "3", "--ttl", "30s"],
    );
    let r = run(servers.lockctl_missing(&[3, 4]).args([
        "release",
        name,
        "--token",
        s3["token"].as_str().unwrap(),
    ]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let a = acquire_json(
        &mut servers.lockctl(),
        name,
        &["--limit", "2", "--ttl", "30s", "-n"],
    );
    let b = acquire_json(
        &mut servers.lockctl(),
        name,
        &["--limit", "2", "--ttl", "30s", "-n"],
    );
    let w = servers
        .lockctl()
        .args(["acquire", name, "--limit", "2", "--ttl", "30s", "-w", "20s"])
        .args(["--format", "json", "--verbose"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let c3 = run(servers
        .lockctl()
        .args(["acquire", name, "--limit", "3", "-n", "--ttl", "5s"]));
    eprintln!("--limit 3 beside them: exit {} {}", code(&c3), stderr(&c3));
    let r = run(servers
        .lockctl()
        .args(["release", name, "--token", a["token"].as_str().unwrap()]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let wo = wait_output(w, Duration::from_secs(60));
    eprintln!("waiter: exit {} {} {}", code(&wo), stdout(&wo), stderr(&wo));
    assert_eq!(code(&wo), 0, "{}", stderr(&wo));
    let wj: serde_json::Value = serde_json::from_str(&stdout(&wo)).unwrap();
    assert!(
        wj["fence"].as_u64() > a["fence"].as_u64() && wj["fence"].as_u64() > b["fence"].as_u64()
    );
    assert_eq!(code(&c3), 2, "{}", stderr(&c3));
    assert!(stderr(&c3).contains("--limit 2") && stderr(&c3).contains("--limit 3"));
}
