//! `--limit N`: a counting semaphore of N numbered slots, each a mutex of its own with its own token,
//! and one fencing counter for all of them. Checked against real servers: by a fenced store that
//! counts concurrent holders and refuses a stale fence per slot, on one node and on Redlock 3 and 4;
//! by reading the keys in Redis (the plain lock keeps its layout, mismatches change nothing); and
//! with a canonical peer's plain lock in slot 1, which refuses a semaphore.

mod support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

fn fence_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}fence")
}

fn limit_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}limit")
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

/// The section each worker runs under `exec --limit 3`: the store admits a holder into its slot only
/// with a fence above the slot's last one and while nobody else is in that slot, and counts the
/// holders inside at once.
const SECTION: &str = r#"
q() { sqlite3 -cmd ".timeout 30000" store.db "$1"; }
q "BEGIN IMMEDIATE;
   UPDATE slots SET fence = $LOCKCTL_FENCE, busy = 1
     WHERE slot = $LOCKCTL_SLOT AND busy = 0 AND fence < $LOCKCTL_FENCE;
   INSERT INTO log(fence, slot, admitted) VALUES ($LOCKCTL_FENCE, $LOCKCTL_SLOT, changes());
   UPDATE g SET active = active + 1;
   UPDATE g SET peak = max(peak, active);
   COMMIT;"
sleep 0.2
q "BEGIN IMMEDIATE;
   UPDATE slots SET busy = 0 WHERE slot = $LOCKCTL_SLOT AND fence = $LOCKCTL_FENCE;
   UPDATE g SET active = active - 1;
   COMMIT;"
"#;

/// 8 workers, 3 sections each, through `exec --limit 3` on `lockctl`: never more than 3 inside, every
/// fence distinct, and per slot every fence above the one before.
fn eight_workers_three_slots(mut lockctl: impl FnMut() -> Command) {
    let dir = tempfile::tempdir().unwrap();
    sql(
        dir.path(),
        "CREATE TABLE slots(slot INTEGER PRIMARY KEY, fence INTEGER, busy INTEGER);
         INSERT INTO slots VALUES (1, 0, 0), (2, 0, 0), (3, 0, 0);
         CREATE TABLE log(fence INTEGER, slot INTEGER, admitted INTEGER);
         CREATE TABLE g(active INTEGER, peak INTEGER);
         INSERT INTO g VALUES (0, 0);",
    );
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let script = format!(
                "for i in 1 2 3; do lockctl exec pool --limit 3 --ttl 10s -w 120s -c '{}' || exit; done",
                SECTION.replace('\'', "'\\''")
            );
            let base = lockctl();
            let bin_dir = Path::new(base.get_program()).parent().unwrap();
            let mut cmd = Command::new("sh");
            cmd.arg("-c")
                .arg(script)
                .current_dir(dir.path())
                .env(
                    "PATH",
                    format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
                )
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in base.get_envs() {
                match v {
                    Some(v) => cmd.env(k, v),
                    None => cmd.env_remove(k),
                };
            }
            cmd.spawn().expect("run sh")
        })
        .collect();
    for w in workers {
        let o = wait_output(w, Duration::from_secs(300));
        assert_eq!(code(&o), 0, "worker: {}", stderr(&o));
    }
    let log = sql(
        dir.path(),
        "SELECT fence, slot, admitted FROM log ORDER BY rowid",
    );
    let rows: Vec<(u64, u64, u64)> = log
        .lines()
        .map(|l| {
            let f: Vec<u64> = l.split('|').map(|x| x.parse().unwrap()).collect();
            (f[0], f[1], f[2])
        })
        .collect();
    assert_eq!(rows.len(), 24, "{log}");
    for (fence, slot, admitted) in &rows {
        assert!((1..=3).contains(slot), "slot {slot} out of 1..=3: {log}");
        assert_eq!(
            *admitted, 1,
            "fence {fence} was refused in slot {slot} (slot busy or a stale fence): {log}"
        );
    }
    let mut fences: Vec<u64> = rows.iter().map(|r| r.0).collect();
    fences.sort();
    fences.dedup();
    assert_eq!(fences.len(), 24, "fences repeat: {log}");
    let g = sql(dir.path(), "SELECT active, peak FROM g");
    let (active, peak) = g.split_once('|').unwrap();
    assert_eq!(active, "0", "{g}");
    let peak: u64 = peak.parse().unwrap();
    assert!(peak <= 3, "{peak} holders at once with --limit 3");
    assert!(peak >= 2, "the slots were never used at once (peak {peak})");
}

#[test]
fn eight_workers_never_exceed_three_single_node() {
    let s = Server::start();
    eight_workers_three_slots(|| lockctl_on(&s));
    assert_eq!(s.get(&limit_key("pool")), None, "the limit is forgotten");
}

#[test]
fn eight_workers_never_exceed_three_redlock_3() {
    let s = Servers::start(3);
    eight_workers_three_slots(|| s.lockctl());
}

#[test]
fn eight_workers_never_exceed_three_redlock_4() {
    let s = Servers::start(4);
    eight_workers_three_slots(|| s.lockctl());
}

#[test]
fn each_slot_has_its_own_token_and_a_larger_fence() {
    let s = Server::start();
    let grants: Vec<serde_json::Value> = (0..3)
        .map(|_| acquire_json(&mut lockctl_on(&s), "pool", &["--limit", "3", "-n"]))
        .collect();
    for (i, g) in grants.iter().enumerate() {
        assert_eq!(g["slot"], i + 1, "{g}");
        assert_eq!(g["limit"], 3, "{g}");
        assert_eq!(
            s.get(&slot_key("pool", i + 1)).as_deref(),
            g["token"].as_str()
        );
        if i > 0 {
            assert!(g["fence"].as_u64() > grants[i - 1]["fence"].as_u64());
            assert_ne!(g["token"], grants[i - 1]["token"]);
        }
    }
    assert_eq!(s.get(&limit_key("pool")).as_deref(), Some("3"));
    let fourth = run(lockctl_on(&s).args(["acquire", "pool", "--limit", "3", "-n"]));
    assert_eq!(code(&fourth), 75, "{}", stderr(&fourth));
    assert!(stderr(&fourth).contains("busy"), "{}", stderr(&fourth));

    // env output names the slot.
    let t2 = grants[1]["token"].as_str().unwrap();
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", t2]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["acquire", "pool", "--limit", "3", "-n", "--format", "env"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("export LOCKCTL_SLOT='2'"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn release_and_renew_of_one_slot_leave_the_others() {
    let s = Server::start();
    let grants: Vec<serde_json::Value> = (0..3)
        .map(|_| {
            acquire_json(
                &mut lockctl_on(&s),
                "pool",
                &["--limit", "3", "-n", "--ttl", "20s"],
            )
        })
        .collect();
    let token = |i: usize| grants[i]["token"].as_str().unwrap().to_string();

    // Renew slot 2 by its token alone: only slot 2's lease (and the limit) grows.
    let o = run(lockctl_on(&s).args(["renew", "pool", "--token", &token(1), "--ttl", "90s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let pttl = |k: &str| -> i64 { s.cmd(&["PTTL", k]) };
    assert!(pttl(&slot_key("pool", 2)) > 60_000);
    assert!(pttl(&slot_key("pool", 1)) <= 20_000);
    assert!(pttl(&slot_key("pool", 3)) <= 20_000);
    assert!(
        pttl(&limit_key("pool")) > 60_000,
        "the limit outlives the longest lease"
    );

    // Release slot 2: slots 1 and 3 stay with their tokens.
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", &token(1)]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get(&slot_key("pool", 2)), None);
    assert_eq!(s.get(&slot_key("pool", 1)), Some(token(0)));
    assert_eq!(s.get(&slot_key("pool", 3)), Some(token(2)));
    // A second release of the same token is not the owner's any more.
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", &token(1)]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["renew", "pool", "--token", &token(1)]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));

    // The last release forgets the limit, so the name is free for any limit again.
    for i in [0, 2] {
        let o = run(lockctl_on(&s).args(["release", "pool", "--token", &token(i)]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    assert_eq!(s.get(&limit_key("pool")), None);
    let o = run(lockctl_on(&s).args(["acquire", "pool", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn exec_tells_the_command_its_slot_and_renews_it() {
    let s = Server::start();
    let first = acquire_json(&mut lockctl_on(&s), "pool", &["--limit", "2", "-n"]);
    assert_eq!(first["slot"], 1);
    // A TTL of 1.5 s renewed every 0.5 s outlives a 3 s command only by renewing slot 2.
    let o = run(lockctl_on(&s)
        .args([
            "exec",
            "pool",
            "--limit",
            "2",
            "--ttl",
            "1500ms",
            "-n",
            "-c",
            "echo slot=$LOCKCTL_SLOT; sleep 3; redis-cli -s \"$SOCK\" GET \"$KEY\"",
        ])
        .env("SOCK", s.socket())
        .env("KEY", slot_key("pool", 2)));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("slot=2"), "{out}");
    assert_eq!(
        lines.next().map(str::len),
        Some(32),
        "slot 2 still held: {out}"
    );
    assert_eq!(
        s.get(&slot_key("pool", 2)),
        None,
        "released after the command"
    );
    assert_eq!(
        s.get(&slot_key("pool", 1)).as_deref(),
        first["token"].as_str()
    );
}

#[test]
fn limit_one_keeps_the_plain_layout() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "deploy", &["--limit", "1"]);
    assert_eq!(g["slot"], 1);
    let mut keys = s.keys();
    keys.sort();
    assert_eq!(
        keys,
        vec![
            "lockctl:deploy".to_string(),
            "{lockctl:deploy}\u{1f}fence".to_string(),
            "{lockctl:deploy}\u{1f}holder".to_string(),
        ]
    );
    assert_eq!(s.get("lockctl:deploy").as_deref(), g["token"].as_str());
    // The default is --limit 1.
    let o = run(lockctl_on(&s).args(["acquire", "deploy", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
}

/// A full semaphore's busy message names every holder as a plain lock's names its one (host, pid,
/// command, note), each with its slot, and changes nothing in Redis: with `-n`, and at the end of
/// `-w`.
#[test]
fn a_full_semaphore_names_every_holder_when_busy() {
    let s = Server::start();
    for i in 1..=3 {
        let note = format!("job {i}");
        let g = acquire_json(
            &mut lockctl_on(&s),
            "full",
            &["--limit", "3", "--ttl", "60s", "--note", &note],
        );
        assert_eq!(g["slot"], i, "{g}");
    }
    let before = snapshot(&s);
    for wait in [&["-n"][..], &["-w", "1s"][..]] {
        let o = run(lockctl_on(&s)
            .args(["acquire", "full", "--limit", "3"])
            .args(wait));
        assert_eq!(code(&o), 75, "{wait:?}: {}{}", stdout(&o), stderr(&o));
        let e = stderr(&o);
        let last = e.lines().last().unwrap_or_default();
        assert!(last.contains("lock 'full' is busy (held by "), "{e}");
        // Each holder's record names this process (the one that ran `acquire`) and its command.
        let pid = format!(" pid {} (", std::process::id());
        assert_eq!(last.matches(&pid).count(), 3, "{last:?}");
        for i in 1..=3 {
            assert!(
                last.contains(&format!("), note: job {i}, slot {i}")),
                "holder of slot {i} not named in {last:?}"
            );
        }
        assert_eq!(snapshot(&s), before, "a busy attempt changed Redis");
    }
}

#[test]
fn a_limit_mismatch_is_refused_both_ways_and_changes_nothing() {
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "three", &["--limit", "3"]);
    acquire_json(&mut lockctl_on(&s), "one", &[]);
    let before = snapshot(&s);
    for (name, limit, theirs) in [("three", "2", "3"), ("three", "1", "3"), ("one", "3", "1")] {
        for cmd in ["acquire", "exec"] {
            let mut c = lockctl_on(&s);
            c.args([cmd, name, "--limit", limit, "-n"]);
            if cmd == "exec" {
                c.args(["--", "true"]);
            }
            let o = run(&mut c);
            assert_eq!(code(&o), 2, "{cmd} {name} --limit {limit}: {}", stderr(&o));
            let e = stderr(&o);
            assert!(
                e.contains(&format!("{name} is used with --limit {theirs}"))
                    && e.contains(&format!("you asked for --limit {limit}"))
                    && e.contains("held by"),
                "{e}"
            );
        }
        assert_eq!(snapshot(&s), before, "a refused limit changed Redis");
    }
    // LOCKCTL_LIMIT is the same option.
    let o = run(lockctl_on(&s)
        .args(["acquire", "three", "-n"])
        .env("LOCKCTL_LIMIT", "3"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn a_limit_mismatch_is_refused_on_redlock_and_rolled_back() {
    let s = Servers::start(3);
    acquire_json(&mut s.lockctl(), "pool", &["--limit", "3"]);
    let before: Vec<_> = s.0.iter().map(snapshot).collect();
    let o = run(s.lockctl().args(["acquire", "pool", "--limit", "2", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--limit 3"), "{}", stderr(&o));
    let after: Vec<_> = s.0.iter().map(snapshot).collect();
    assert_eq!(after, before);
}

/// A refusal for another `--limit` names the holder that some node names, whichever node answers
/// last: nodes 1 and 3 keep `--limit 2` for a slot another client holds (its key without a lockctl
/// record: no holder to name), node 2 for a lockctl holder.
#[test]
fn a_limit_mismatch_names_the_holder_that_one_node_names() {
    let s = Servers::start(3);
    for i in [0, 2] {
        let _: String = s[i].cmd(&["SET", &limit_key("mixed"), "2", "PX", "60000"]);
        let _: String = s[i].cmd(&["SET", &slot_key("mixed", 2), "theirs", "PX", "60000"]);
    }
    acquire_json(
        &mut lockctl_on(&s[1]),
        "mixed",
        &["--limit", "2", "--ttl", "60s"],
    );
    let before: Vec<_> = s.0.iter().map(snapshot).collect();
    let o = run(s.lockctl().args(["acquire", "mixed", "--limit", "3", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 2, "{err}");
    assert!(
        err.contains("mixed is used with --limit 2 (held by "),
        "names node 2's holder: {err}"
    );
    let after: Vec<_> = s.0.iter().map(snapshot).collect();
    assert_eq!(after, before);
}

/// An outvoted node that keeps another limit still answered: an attempt that won a quorum beside it,
/// too slowly for its TTL (a stopped fifth node holds it up for the node timeout), is unavailable
/// with that answer counted, 4 of the 5 nodes.
#[test]
fn an_outvoted_limit_counts_as_an_answer() {
    // Never restarted: the quarantine is off for these servers the test started itself (one is
    // only stopped and resumed).
    let s = Servers::start(5);
    let on = |nodes: &[usize]| {
        let mut c = lockctl();
        let urls: Vec<String> = nodes.iter().map(|&i| s[i].url()).collect();
        c.env("LOCKCTL_REDIS", urls.join(","));
        c
    };
    // A first grant makes the three counters equal, so the attempt below needs no round 2 (which
    // would find its keys expired and call the lock busy).
    let g = acquire_json(&mut on(&[0, 1, 2]), "slow", &[]);
    let o = run(on(&[0, 1, 2]).args(["release", "slow", "--token", g["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    acquire_json(&mut on(&[3]), "slow", &["--limit", "2", "--ttl", "60s"]);
    s[4].pause();
    let o = run(s.lockctl().args([
        "acquire",
        "slow",
        "-n",
        "--ttl",
        "100ms",
        "--node-timeout",
        "300ms",
    ]));
    s[4].resume();
    let err = stderr(&o);
    assert_eq!(code(&o), 69, "{err}");
    assert!(err.contains("no validity"), "the message says why: {err}");
    assert!(err.contains("4 of 5 node(s) answered"), "{err}");
}

/// The nodes that keep another limit are outvoted and refuse like a holder (docs/queue.md, "The
/// limit must agree"), and the agreeing nodes stay holders too: a change to the lock key there
/// wakes the head waiter. On three nodes, a plain holder's key is left on node 3 by a release
/// that missed that node (down); two `--limit 2` holders fill the semaphore on nodes 1 and 2. A
/// `--limit 2` waiter is refused there (node 3 outvoted); slot 1's key deleted on nodes 1 and 2
/// without a release, while the waiter sleeps, must wake it through the keyspace events and let
/// it win. A deletion that lands during an attempt is simply won by it, so the wake-up must show
/// in one try of three.
#[test]
fn a_waiter_beside_an_outvoted_limit_is_woken_by_a_deletion_on_the_agreeing_nodes() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let s = Servers::start(3);
    for n in &s.0 {
        let _: String = n.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Kg"]);
    }
    let mut tries = Vec::new();
    for t in 0..3 {
        let name = format!("outvoted{t}");
        let p = run(s.lockctl().args([
            "acquire",
            &name,
            "--ttl",
            "60s",
            "--format",
            "json",
            "--verbose",
        ]));
        assert_eq!(code(&p), 0, "{}", stderr(&p));
        // The trace names the rule only where a node keeps another limit.
        assert!(!stderr(&p).contains("another --limit"), "{}", stderr(&p));
        let plain: serde_json::Value = serde_json::from_str(&stdout(&p)).unwrap();
        let r = run(s.lockctl_missing(&[2]).args([
            "release",
            &name,
            "--token",
            plain["token"].as_str().unwrap(),
        ]));
        assert_eq!(code(&r), 0, "{}", stderr(&r));
        assert!(s[2].get(&slot_key(&name, 1)).is_some(), "node 3 kept it");
        let held: Vec<u64> = (0..2)
            .map(|_| {
                let g = acquire_json(
                    &mut s.lockctl(),
                    &name,
                    &["--limit", "2", "-n", "--ttl", "60s"],
                );
                g["fence"].as_u64().unwrap()
            })
            .collect();
        let o = change_during_a_sleep(
            s.lockctl()
                .args(["acquire", &name, "--limit", "2", "-w", "30s", "--verbose"])
                .args(["--format", "json"]),
            || {
                for n in &s.0[..2] {
                    let _: i64 = n.cmd(&["DEL", &slot_key(&name, 1)]);
                }
            },
        );
        let e = stderr(&o);
        assert_eq!(code(&o), 0, "{e}");
        assert!(e.contains("keep another --limit; the others decide"), "{e}");
        let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        assert!(
            held.iter().all(|&f| g["fence"].as_u64().unwrap() > f),
            "{g} after {held:?}"
        );
        if e.contains("woken by a keyspace event") {
            return;
        }
        tries.push(e);
    }
    panic!("the deletion never woke the waiter: {tries:#?}");
}

#[test]
fn bad_limits_are_usage_errors_naming_the_option() {
    let s = Server::start();
    for bad in ["0", "1001", "-1", "three", "1.5", ""] {
        let o = run(lockctl_on(&s).args(["acquire", "x", "-n", "--limit", bad]));
        assert_eq!(code(&o), 2, "--limit {bad:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--limit"), "{}", stderr(&o));
    }
    let o = run(lockctl_on(&s)
        .args(["exec", "x", "-n", "--", "true"])
        .env("LOCKCTL_LIMIT", "0"));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--limit"), "{}", stderr(&o));
    assert!(s.keys().is_empty(), "{:?}", s.keys());
}

/// A `--limit 2` attempt refused for a canonical peer's plain lock as the contract asks: exit 2, and
/// a message that says what is wrong and how to fix it.
fn refused_for_a_peer(o: &std::process::Output) {
    let e = stderr(o);
    assert_eq!(code(o), 2, "{e}");
    assert!(
        e.contains("pool is held by a client that is not lockctl (a plain lock")
            && e.contains("limit 1")
            && e.contains("you asked for --limit 2")
            && e.contains("use --limit 1 (the default)"),
        "{e}"
    );
}

/// A canonical peer (`SET key token NX PX`: redis-py `Lock`, node-redlock, pottery) holds the lock
/// key with no lockctl record: a plain lock, a client of limit 1. A semaphore is refused beside it
/// (exit 2), one attempt or waiting, `acquire` or `exec`, as beside a plain lockctl holder, and
/// changes nothing: no slot, holder record, limit key or waiter, and the peer's key and TTL as they
/// were. A plain client is busy.
#[test]
fn a_canonical_peers_plain_lock_refuses_a_semaphore() {
    let s = Server::start();
    let _: String = s.cmd(&["SET", "lockctl:pool", "peer-token", "NX", "PX", "30000"]);
    let before = snapshot(&s);
    let pttl = || -> i64 { s.cmd(&["PTTL", "lockctl:pool"]) };
    for flags in [&["-n"][..], &["-w", "2s"]] {
        for cmd in ["acquire", "exec"] {
            let mut c = lockctl_on(&s);
            c.args([cmd, "pool", "--limit", "2"]).args(flags);
            if cmd == "exec" {
                c.args(["--", "true"]);
            }
            let left = pttl();
            let o = run(&mut c);
            refused_for_a_peer(&o);
            assert_eq!(snapshot(&s), before, "{cmd} {flags:?} changed Redis");
            let now = pttl();
            assert!(
                now > 0 && now <= left,
                "{cmd} {flags:?}: the peer's TTL went from {left} to {now} ms"
            );
        }
    }
    let o = run(lockctl_on(&s).args(["acquire", "pool", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert_eq!(snapshot(&s), before, "a busy plain attempt changed Redis");
}

/// A peer knows nothing of slots: while a semaphore holds only slots 2..N the lock key is free and
/// a peer takes it, which lockctl cannot stop (docs/queue.md). No semaphore client is granted beside
/// it then, whatever the `limit` key says: one of the same N is refused (exit 2) while the other
/// holder of the semaphore stays, and again once that one released; the peer gone, slot 1 is granted.
#[test]
fn a_peer_in_slot_one_refuses_a_semaphore_whatever_the_limit_key_says() {
    let s = Server::start();
    let grant = || pool_slot(&s);
    let (a, b) = (grant(), grant());
    assert_eq!((&a["slot"], &b["slot"]), (&1.into(), &2.into()));
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", a["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let set: Option<String> = s.cmd(&["SET", "lockctl:pool", "peer-token", "NX", "PX", "30000"]);
    assert_eq!(
        set.as_deref(),
        Some("OK"),
        "the peer takes the free lock key"
    );
    assert_eq!(s.get(&limit_key("pool")).as_deref(), Some("2"));
    let before = snapshot(&s);
    refused_for_a_peer(&run(
        lockctl_on(&s).args(["acquire", "pool", "--limit", "2", "-n"])
    ));
    assert_eq!(snapshot(&s), before, "a refused attempt changed Redis");
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", b["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    refused_for_a_peer(&run(
        lockctl_on(&s).args(["acquire", "pool", "--limit", "2", "-n"])
    ));
    assert_eq!(
        s.get(&slot_key("pool", 2)),
        None,
        "slot 2 granted beside the peer"
    );
    assert_eq!(s.get("lockctl:pool").as_deref(), Some("peer-token"));
    let _: i64 = s.cmd(&["DEL", "lockctl:pool"]);
    assert_eq!(grant()["slot"], 1);
}

/// A `-w --limit 2` waiter queued behind a full semaphore, when a peer takes the lock key as slot 1
/// frees (the waiter is stopped meanwhile, so the peer is first): its next attempt is refused
/// (exit 2) and it leaves the queue, instead of waiting for slot 2 beside the peer.
#[test]
fn a_queued_semaphore_waiter_is_refused_once_a_peer_holds_slot_one() {
    let s = Server::start();
    let grant = || pool_slot(&s);
    let (a, b) = (grant(), grant());
    let w = lockctl_on(&s)
        .args([
            "acquire", "pool", "--limit", "2", "-w", "30s", "--ttl", "30s",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let queue = support::queue::queue_key("pool");
    let queued = eventually(Duration::from_secs(30), || {
        s.cmd::<u64>(&["ZCARD", &queue]) == 1
    });
    kill(w.id() as i32, libc::SIGSTOP);
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", a["token"].as_str().unwrap()]));
    let set: Option<String> = s.cmd(&["SET", "lockctl:pool", "peer-token", "NX", "PX", "30000"]);
    kill(w.id() as i32, libc::SIGCONT);
    let out = wait_output(w, Duration::from_secs(60));
    assert!(queued, "the waiter queued");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        set.as_deref(),
        Some("OK"),
        "the peer takes the free lock key"
    );
    refused_for_a_peer(&out);
    assert_eq!(
        s.cmd::<u64>(&["ZCARD", &queue]),
        0,
        "the waiter left the queue"
    );
    assert_eq!(s.get("lockctl:pool").as_deref(), Some("peer-token"));
    assert_eq!(s.get(&slot_key("pool", 2)).as_deref(), b["token"].as_str());
}

/// On Redlock a peer's key on a minority of the nodes is outvoted (the minority rule of
/// docs/queue.md, "The limit must agree"): those nodes refuse like a holder and the others decide,
/// free or held by lockctl with the same N, and the minority keeps the peer's key alone. A peer's key
/// on a majority refuses the semaphore (exit 2), and the grant made on the free node is rolled back.
#[test]
fn redlock_outvotes_a_peer_on_a_minority_and_refuses_one_on_a_majority() {
    let s = Servers::start(3);
    let peer_on = |nodes: &[usize]| {
        for &i in nodes {
            let _: String = s[i].cmd(&["SET", "lockctl:pool", "peer-token", "NX", "PX", "30000"]);
        }
    };
    let clear = || {
        for node in &s.0 {
            let _: String = node.cmd(&["FLUSHALL"]);
        }
    };
    let attempt = || {
        run(s
            .lockctl()
            .args(["acquire", "pool", "--limit", "2", "-n", "--format", "json"]))
    };
    let only_the_peer = |i: usize| {
        assert_eq!(s[i].keys(), vec!["lockctl:pool".to_string()], "node {i}");
        assert_eq!(s[i].get("lockctl:pool").as_deref(), Some("peer-token"));
    };

    // The others free: slot 1 on them.
    peer_on(&[0]);
    let o = attempt();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(g["slot"], 1, "{g}");
    for i in [1, 2] {
        assert_eq!(s[i].get("lockctl:pool").as_deref(), g["token"].as_str());
    }
    only_the_peer(0);

    // The others held by lockctl with the same N (slot 1, on those two alone): slot 2 on them.
    clear();
    let mut two = lockctl();
    two.env("LOCKCTL_REDIS", urls_of(&s.0[1..]));
    let first = acquire_json(&mut two, "pool", &["--limit", "2", "-n", "--ttl", "30s"]);
    assert_eq!(first["slot"], 1, "{first}");
    peer_on(&[0]);
    let o = attempt();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(g["slot"], 2, "{g}");
    for i in [1, 2] {
        assert_eq!(s[i].get("lockctl:pool").as_deref(), first["token"].as_str());
        assert_eq!(
            s[i].get(&slot_key("pool", 2)).as_deref(),
            g["token"].as_str()
        );
    }
    only_the_peer(0);

    // A majority: refused, and node 2's grant rolled back (its fencing counter stays).
    clear();
    peer_on(&[0, 1]);
    refused_for_a_peer(&attempt());
    only_the_peer(0);
    only_the_peer(1);
    assert_eq!(
        s[2].keys(),
        vec![fence_key("pool")],
        "node 2 after the rollback"
    );
}

#[test]
fn redlock_rolls_back_a_slot_that_lost_the_vote() {
    let s = Servers::start(3);
    // Node 0 has slot 1 taken by a lockctl holder of the same N (on that node alone), so it grants
    // slot 2; nodes 1 and 2 grant slot 1, which wins.
    let held = hold_on(&s[0], 1);
    let g = acquire_json(&mut s.lockctl(), "pool", &["--limit", "2", "-n"]);
    assert_eq!(g["slot"], 1, "{g}");
    assert_eq!(
        s[0].get(&slot_key("pool", 2)),
        None,
        "the stray grant stays"
    );
    assert_eq!(s[0].get("lockctl:pool"), Some(held[0].clone()));
    assert_eq!(s[1].get("lockctl:pool").as_deref(), g["token"].as_str());
}

/// A grant of `pool` with `--limit 2` (`-n`, a 30 s lease) on `node`, as JSON.
fn pool_slot(node: &Server) -> serde_json::Value {
    acquire_json(
        &mut lockctl_on(node),
        "pool",
        &["--limit", "2", "-n", "--ttl", "30s"],
    )
}

/// Holders of `pool` with `--limit 2` on `node` alone, in slots 1..=`slots`: that node answers a
/// Redlock attempt of the same N with a later slot, or as busy. Their tokens, in slot order.
fn hold_on(node: &Server, slots: usize) -> Vec<String> {
    (1..=slots)
        .map(|i| {
            let g = pool_slot(node);
            assert_eq!(g["slot"], i, "{g}");
            g["token"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn redlock_retries_a_split_vote_on_the_most_voted_slot() {
    let s = Servers::start(5);
    // Slot 1 is taken on nodes 0, 1 (they grant slot 2) and 3, 4 hold both slots (lockctl holders
    // of the same N on each node alone): slot 2 has two votes, slot 1 one (node 2), so round 1 has
    // three wins and no quorum on any slot. Slot 2 is free on nodes 0, 1 and 2: asked for it, they
    // make a quorum.
    for i in [0, 1] {
        hold_on(&s[i], 1);
    }
    for i in [3, 4] {
        hold_on(&s[i], 2);
    }
    let g = acquire_json(&mut s.lockctl(), "pool", &["--limit", "2", "-n"]);
    assert_eq!(g["slot"], 2, "{g}");
    let token = g["token"].as_str().unwrap();
    for i in [0, 1, 2] {
        assert_eq!(s[i].get(&slot_key("pool", 2)).as_deref(), Some(token));
    }
    assert_eq!(
        s[2].get("lockctl:pool"),
        None,
        "slot 1 on node 2 rolled back"
    );
}

#[test]
fn a_failed_attempt_with_a_quorum_on_one_slot_is_no_split_vote() {
    let s = Servers::start(5);
    // A split vote (wins spread over slots, none with a quorum) is retried at once; an attempt whose
    // slot had its quorum and failed for another reason is not. Node 0 has slot 1 taken by a lockctl
    // holder of the same N (on that node alone) and grants slot 2, nodes 1 to 3 grant slot 1 (a
    // quorum), node 4 is stopped: waiting for it past the TTL leaves no validity (the node timeout
    // leaves the others time to answer under load). Every grant raises node 1's counter by one from
    // a value above the clock, so the counter tells how many attempts ran.
    const COUNTER: u64 = 5_000_000_000_000_000;
    for i in 0..5 {
        let _: String = s[i].cmd(&["SET", &fence_key("pool"), &COUNTER.to_string()]);
    }
    let held = hold_on(&s[0], 1);
    s[4].pause();
    let o = run(s.lockctl().args([
        "acquire",
        "pool",
        "--limit",
        "2",
        "-n",
        "--ttl",
        "100ms",
        "--node-timeout",
        "400ms",
    ]));
    s[4].resume();
    let err = stderr(&o);
    assert_eq!(code(&o), 69, "{err}");
    assert!(err.contains("no validity"), "{err}");
    let counter: u64 = s[1].get(&fence_key("pool")).unwrap().parse().unwrap();
    assert_eq!(
        counter,
        COUNTER + 1,
        "one attempt, not retried as a split vote"
    );
    assert_eq!(s[0].get("lockctl:pool"), Some(held[0].clone()));
    for i in 0..4 {
        assert_eq!(s[i].get(&slot_key("pool", 2)), None, "node {i}");
        if i > 0 {
            assert_eq!(s[i].get("lockctl:pool"), None, "rolled back on node {i}");
        }
    }
}

#[test]
fn a_semaphore_grant_does_not_count_a_counter_raised_by_another_grant() {
    let s = Servers::start(3);
    // Counters above the clock, so that each grant adds one: node 0's round 1 gives T = X + 1 and
    // node 1's gives Y + 1 < T, so node 1 needs round 2. Node 2 is stopped: the attempt waits for it
    // (the node timeout) between its two rounds. Meanwhile node 1's counter reaches T the way a grant
    // of another slot raises it (that grant may hold T as its fence): round 2 finds the counter at T
    // without having raised it, and a semaphore's grant must not count that node, or two holders of
    // different slots could hold one fence at the same time.
    const X: u64 = 5_000_000_000_001_000;
    const Y: u64 = 5_000_000_000_000_000;
    for (i, c) in [(0, X), (1, Y), (2, Y)] {
        let _: String = s[i].cmd(&["SET", &fence_key("pool"), &c.to_string()]);
    }
    s[2].pause();
    let child = s
        .lockctl()
        .args([
            "acquire",
            "pool",
            "--limit",
            "2",
            "-n",
            "--ttl",
            "60s",
            "--node-timeout",
            "3s",
            "--format",
            "json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let round1 = eventually(Duration::from_secs(10), || {
        s[1].get("lockctl:pool").is_some() && s[0].get("lockctl:pool").is_some()
    });
    let _: String = s[1].cmd(&["SET", &fence_key("pool"), &(X + 1).to_string()]);
    let o = wait_output(child, Duration::from_secs(60));
    s[2].resume();
    assert!(round1, "round 1 reached nodes 0 and 1");
    assert_ne!(
        code(&o),
        0,
        "granted with node 1 counted: {}{}",
        stdout(&o),
        stderr(&o)
    );
    for i in [0, 1] {
        assert_eq!(s[i].get("lockctl:pool"), None, "rolled back on node {i}");
    }
}

/// Three holders of `pool` (`--limit 3`) on `lockctl`; their tokens in slot order.
fn three_holders(mut lockctl: impl FnMut() -> Command) -> Vec<String> {
    (0..3)
        .map(|i| {
            let g = acquire_json(
                &mut lockctl(),
                "pool",
                &["--limit", "3", "-n", "--ttl", "60s"],
            );
            assert_eq!(g["slot"], i + 1, "{g}");
            g["token"].as_str().unwrap().to_string()
        })
        .collect()
}

#[test]
fn status_shows_every_slot_and_stays_held_while_slot_one_is_free() {
    let s = Server::start();
    let tokens = three_holders(|| lockctl_on(&s));
    let o = run(lockctl_on(&s).args(["status", "pool"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("3 (3 of 3 slot(s) held)"), "{out}");
    for (i, t) in tokens.iter().enumerate() {
        assert!(
            out.contains(&format!("slot {}", i + 1)) && out.contains(t.as_str()),
            "{out}"
        );
    }
    let o = run(lockctl_on(&s).args(["release", "pool", "--token", &tokens[0]]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["status", "pool", "--format", "json"]));
    assert_eq!(code(&o), 0, "held while slots 2 and 3 are: {}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["state"], "held", "{j}");
    assert_eq!(j["limit"], 3, "{j}");
    let holders = j["holders"].as_array().unwrap();
    let slots: Vec<u64> = holders
        .iter()
        .map(|h| h["slot"].as_u64().unwrap())
        .collect();
    assert_eq!(slots, vec![2, 3], "{j}");
    assert_eq!(holders[0]["token"], tokens[1].as_str());
    assert!(holders
        .iter()
        .all(|h| h["fence"].is_u64() && h["holder"]["pid"].is_u64()));

    // A plain lock's status has its one holder in `holders` and limit 1.
    acquire_json(&mut lockctl_on(&s), "plain", &[]);
    let o = run(lockctl_on(&s).args(["status", "plain", "--format", "json"]));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["limit"], 1, "{j}");
    assert_eq!(j["holders"].as_array().unwrap().len(), 1, "{j}");
    let o = run(lockctl_on(&s).args(["status", "plain"]));
    assert!(
        !stdout(&o)
            .lines()
            .any(|l| l.starts_with("slot") || l.starts_with("limit")),
        "{}",
        stdout(&o)
    );
}

fn listed(o: &std::process::Output) -> Vec<serde_json::Value> {
    assert_eq!(code(o), 0, "{}", stderr(o));
    let j: serde_json::Value = serde_json::from_str(&stdout(o)).unwrap();
    j["locks"].as_array().unwrap().clone()
}

#[test]
fn list_shows_a_semaphore_once_also_while_slot_one_is_free() {
    let s = Servers::start(3);
    let tokens = three_holders(|| s.lockctl());
    let rows = listed(&run(s.lockctl().args(["list", "--format", "json"])));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(
        (&rows[0]["name"], &rows[0]["held_slots"], &rows[0]["limit"]),
        (&"pool".into(), &3.into(), &3.into())
    );
    let o = run(s.lockctl().args(["release", "pool", "--token", &tokens[0]]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let rows = listed(&run(s.lockctl().args(["list", "--format", "json"])));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["held_slots"], 2, "{rows:?}");
    assert_eq!(rows[0]["slots"][0]["slot"], 2, "{rows:?}");
    let o = run(s.lockctl().args(["list"]));
    assert!(stdout(&o).contains("2/3 held"), "{}", stdout(&o));
    // The pattern applies to semaphores found by their limit too.
    assert!(listed(&run(s
        .lockctl()
        .args(["list", "other*", "--format", "json"])))
    .is_empty());
}

/// `list` counts a semaphore's waiters as it does a plain lock's (its row is drawn from a slot's
/// survey, which carries no queue): plain and JSON, one node and Redlock 3.
fn list_counts_a_full_semaphore_s_waiters(s: &[&Server], mut lockctl: impl FnMut() -> Command) {
    three_holders(&mut lockctl);
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            lockctl()
                .args(["exec", "pool", "--limit", "3", "-w", "60s", "--", "true"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for n in s {
        support::queue::wait_queued(n, "pool", 2);
    }
    let rows = listed(&run(lockctl().args(["list", "--format", "json"])));
    let plain = stdout(&run(lockctl().args(["list"])));
    for w in waiters {
        support::queue::finish_off(w);
    }
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["waiters"], 2, "{rows:?}");
    let row = plain
        .lines()
        .find(|l| l.starts_with("pool "))
        .unwrap_or_else(|| panic!("no row for pool: {plain}"));
    let head = plain.lines().next().unwrap_or_default();
    let column = head
        .split_whitespace()
        .position(|c| c == "WAITING")
        .unwrap_or_else(|| panic!("no WAITING column: {plain}"));
    assert_eq!(
        row.split_whitespace().nth(column),
        Some("2"),
        "the waiters of a full semaphore: {plain}"
    );
}

#[test]
fn list_counts_a_semaphore_s_waiters() {
    let s = Server::start();
    list_counts_a_full_semaphore_s_waiters(&[&s], || lockctl_on(&s));
}

#[test]
fn list_counts_a_semaphore_s_waiters_on_redlock() {
    let s = Servers::start(3);
    list_counts_a_full_semaphore_s_waiters(&[&s[0], &s[1], &s[2]], || s.lockctl());
}

#[test]
fn break_takes_one_holder_by_token_or_all() {
    let s = Server::start();
    let tokens = three_holders(|| lockctl_on(&s));
    let counter = || s.get("{lockctl:pool}\u{1f}fence");
    let fence = counter();
    let o = run(lockctl_on(&s).args(["break", "pool", "--token", &tokens[1], "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&tokens[1]) && stdout(&o).contains("slot 2"),
        "{}",
        stdout(&o)
    );
    assert_eq!(s.get(&slot_key("pool", 2)), None);
    assert_eq!(s.get(&slot_key("pool", 1)), Some(tokens[0].clone()));
    assert_eq!(s.get(&slot_key("pool", 3)), Some(tokens[2].clone()));
    // A token that holds nothing breaks nothing.
    let o = run(lockctl_on(&s).args(["break", "pool", "--token", &tokens[1], "--yes"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(s.get(&slot_key("pool", 1)), Some(tokens[0].clone()));

    let o = run(lockctl_on(&s).args(["break", "pool", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for t in [&tokens[0], &tokens[2]] {
        assert!(stdout(&o).contains(t.as_str()), "{}", stdout(&o));
    }
    assert_eq!(s.get(&slot_key("pool", 1)), None);
    assert_eq!(s.get(&slot_key("pool", 3)), None);
    assert_eq!(s.get(&limit_key("pool")), None, "nothing held: no limit");
    assert_eq!(counter(), fence, "break leaves the fencing counter");
    let o = run(lockctl_on(&s).args(["break", "pool", "--yes"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    // A bad token is a usage error before anything is touched.
    let o = run(lockctl_on(&s).args(["break", "pool", "--token", "", "--yes"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

/// Round 2 of a semaphore's Redlock grant confirms the fence T on a node only when our own raise
/// takes the counter there from below T to T: two holders of different slots can both hold a node,
/// and had another grant raised the counter to T first, T could be its fence too.
#[test]
fn round_two_of_a_semaphore_confirms_only_its_own_raise() {
    let s = Server::start();
    let source = include_str!("../src/lock/scripts/fence.lua");
    let counter = "{lockctl:pool}\u{1f}fence";
    let holder = "{lockctl:pool}\u{1f}holder\u{1f}2";
    let key = slot_key("pool", 2);
    let _: String = s.cmd(&["SET", &key, "ours", "PX", "30000"]);
    let round2 = |t: &str, strict: &str| -> i64 {
        s.cmd(&[
            "EVAL", source, "3", &key, counter, holder, "ours", t, strict,
        ])
    };
    let _: String = s.cmd(&["SET", counter, "500"]);
    assert_eq!(round2("600", "1"), 1, "raised from below by us");
    assert_eq!(s.get(counter).as_deref(), Some("600"));
    // Another grant took the counter to 700 meanwhile: 700 is not confirmed for us.
    let _: String = s.cmd(&["SET", counter, "700"]);
    assert_eq!(round2("700", "1"), 2);
    assert_eq!(round2("650", "1"), 2);
    // A plain lock's round 2 (its key excludes every other holder) only needs the counter >= T.
    assert_eq!(round2("700", ""), 1);
    // Not our key any more: no raise at all.
    let _: String = s.cmd(&["SET", &key, "theirs"]);
    assert_eq!(round2("900", "1"), 0);
    assert_eq!(s.get(counter).as_deref(), Some("700"));
}

/// On Redis Cluster every slot key is in the lock key's hash slot, so the scripts reach them all
/// through a node that does not own it (MOVED is followed), and `list` finds the semaphore.
#[test]
fn slots_work_on_redis_cluster() {
    use support::topology::{lockctl_on_url, Cluster};
    let cluster = Cluster::start();
    let url = format!("redis://127.0.0.1:{}", cluster.not_owner("lockctl:pool"));
    let tokens: Vec<String> = (0..2)
        .map(|i| {
            let g = acquire_json(&mut lockctl_on_url(&url), "pool", &["--limit", "2", "-n"]);
            assert_eq!(g["slot"], i + 1, "{g}");
            g["token"].as_str().unwrap().to_string()
        })
        .collect();
    let o = run(lockctl_on_url(&url).args(["acquire", "pool", "--limit", "2", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let o = run(lockctl_on_url(&url).args(["renew", "pool", "--token", &tokens[1]]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on_url(&url).args(["release", "pool", "--token", &tokens[0]]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on_url(&url).args(["status", "pool", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["holders"][0]["token"], tokens[1].as_str(), "{j}");
    let rows = listed(&run(lockctl_on_url(&url).args(["list", "--format", "json"])));
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["held_slots"], 1, "{rows:?}");
    let o = run(lockctl_on_url(&url).args(["break", "pool", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on_url(&url).args(["status", "pool"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
}

/// A holder of slot 2 whose key a minority node lost in a restart gets *that slot's* key back there
/// once the node's restart quarantine (on here, the TTL) has passed, with the limit beside it.
#[test]
fn renewal_recreates_the_slot_key_after_a_restart_and_its_quarantine() {
    use std::io::{BufRead, Write};
    let mut servers = Servers::start(3);
    // Servers just started: wait out the quarantine so that they vote.
    assert!(eventually(Duration::from_secs(15), || servers
        .0
        .iter()
        .all(|s| {
            let info: String = s.cmd(&["INFO", "server"]);
            info.lines()
                .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
                .is_some_and(|u| u.trim().parse::<u64>().unwrap() >= 5)
        })));
    // This grant runs with the quarantine off (support's default, for servers the test just
    // started); the exec below and the restart keep it on.
    let first = acquire_json(
        &mut servers.lockctl(),
        "pool",
        &["--limit", "2", "--ttl", "60s"],
    );
    assert_eq!(first["slot"], 1);
    let mut child = servers
        .lockctl()
        .env_remove("LOCKCTL_QUARANTINE")
        .args([
            "exec",
            "pool",
            "--limit",
            "2",
            "--ttl",
            "3s",
            "--node-timeout",
            "1s",
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo \"ready $LOCKCTL_SLOT $LOCKCTL_TOKEN\"; read _",
        ])
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
    let restarted = std::time::Instant::now();
    servers[1].restart_empty();
    let back = eventually(Duration::from_secs(15), || {
        servers[1].get(&slot_key("pool", 2)).is_some()
    });
    // Read before the command ends: its release deletes them.
    let seen_back = (
        servers[1].get(&slot_key("pool", 2)),
        servers[1].get(&limit_key("pool")),
    );
    let mut stdin = child.stdin.take().unwrap();
    let _ = stdin.write_all(b"done\n");
    drop(stdin);
    let o = wait_output(child, Duration::from_secs(60));
    assert!(
        back,
        "slot 2 not put back: exec exited {}: {}",
        code(&o),
        stderr(&o)
    );
    assert!(
        restarted.elapsed() >= Duration::from_secs(3),
        "before the quarantine ended"
    );
    assert_eq!(seen_back, (Some(token), Some("2".to_string())));
    assert_eq!(
        servers[1].get(&slot_key("pool", 1)),
        None,
        "slot 1 is not ours"
    );
    // The renewals kept the lease throughout. (Not the exit status: a renewal that completes after
    // the command ended and its watcher stood down is taken for a lost lease, an exec race outside
    // slots, seen here about once in ten runs.)
    assert!(!stderr(&o).contains("no longer ours"), "{}", stderr(&o));
}

/// On a terminal, break names every holder of a semaphore, with its slot, and breaks those it named.
#[test]
fn break_on_a_terminal_names_each_holder() {
    let s = Server::start();
    let tokens: Vec<String> = (0..2)
        .map(|_| {
            let g = acquire_json(&mut lockctl_on(&s), "pool", &["--limit", "2", "-n"]);
            g["token"].as_str().unwrap().to_string()
        })
        .collect();
    // `script` gives lockctl a pseudo-terminal as stdin; the answer is typed into it.
    let on_tty = |answer: &str| {
        let c = lockctl_on(&s);
        let mut cmd = Command::new("script");
        cmd.args([
            "-qec",
            &format!("{} break pool", env!("CARGO_BIN_EXE_lockctl")),
            "/dev/null",
        ]);
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run script(1) from util-linux");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        wait_output(child, Duration::from_secs(60))
    };
    let o = on_tty("n\n");
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let shown = format!("{}{}", stdout(&o), stderr(&o));
    for (i, t) in tokens.iter().enumerate() {
        assert!(
            shown.contains(&format!("slot {}", i + 1)) && shown.contains(t.as_str()),
            "{shown}"
        );
    }
    assert_eq!(s.get(&slot_key("pool", 2)), Some(tokens[1].clone()));
    let o = on_tty("y\n");
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert_eq!(s.get(&slot_key("pool", 1)), None);
    assert_eq!(s.get(&slot_key("pool", 2)), None);
}
