//! lockctl itself stopped (SIGSTOP) and continued (SIGCONT) while it waits for a node's reply.
//!
//! A socket read with a timeout (`SO_RCVTIMEO`, which redis-rs sets) fails with `EINTR` when its
//! process is stopped and continued, whatever the signal mask (signal(7)); SIGSTOP cannot be blocked.
//! `node.rs` then drops the connection and sends the command again on a new one. These tests stop
//! real lockctl processes, over and over for a few milliseconds (a "hammer" that stops every
//! attacked process at once, then continues them) or once for long, during every kind of call, and
//! check what the contract promises: never more holders than the limit (intervals written by the
//! jobs, fences unique and, for a lock, increasing in the order of the sections), exit codes that
//! tell the truth (no lease held throughout reported lost, no release that ran reported failed), and
//! nothing left on the servers once every lockctl has exited. A stop and continue of a few
//! milliseconds lands inside a read only now and then, so some tests pause the server too: lockctl
//! then waits in its read for as long as the test wants, and each stop of lockctl interrupts it.

mod support;

use std::collections::BTreeMap;
use std::io::Read;
use std::process::{Command, Output, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use support::hammer::{
    cut_on_the_third, holding_proxy, stop_in_a_read, two_scripts, warm, Attacked, Hammer, Traced,
};
use support::watchers::sleeps_on_a_read_socket;
use support::*;

/// A lockctl run that has hung.
const BOUND: Duration = Duration::from_secs(90);

/// One critical section: its start and end (ns, this host's clock) and its fence, as the job writes
/// them once its section is over.
const SECTION: &str = r#"s=$(date +%s%N); sleep "$HOLD"; e=$(date +%s%N)
echo "$LOCKCTL_FENCE $s $e $W" >> "$LOG""#;

#[derive(Debug)]
struct Section {
    fence: u64,
    start: u128,
    end: u128,
    who: String,
}

fn sections(log: &std::path::Path) -> Vec<Section> {
    let mut v: Vec<Section> = std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Section {
                fence: f[0].parse().unwrap(),
                start: f[1].parse().unwrap(),
                end: f[2].parse().unwrap(),
                who: f[3].to_string(),
            }
        })
        .collect();
    v.sort_by_key(|s| s.start);
    v
}

/// Asserts that at no time more than `limit` sections ran, that no two grants shared a fence, and,
/// for a lock, that fences increase in the order the sections ran.
fn check_sections(sections: &[Section], limit: usize) {
    let mut events: Vec<(u128, i32)> = Vec::new();
    for s in sections {
        events.push((s.start, 1));
        events.push((s.end, -1));
    }
    // An end before a start at the same instant: touching sections do not overlap.
    events.sort();
    let mut at = 0i32;
    for (t, d) in &events {
        at += d;
        let running: Vec<&str> = sections
            .iter()
            .filter(|s| s.start <= *t && *t < s.end)
            .map(|s| s.who.as_str())
            .collect();
        assert!(
            at <= limit as i32,
            "{at} sections at once at {t} (limit {limit}; {running:?}): {sections:?}"
        );
    }
    let mut fences: Vec<u64> = sections.iter().map(|s| s.fence).collect();
    if limit == 1 {
        assert!(
            fences.windows(2).all(|w| w[0] < w[1]),
            "fences not increasing in the order of the sections: {sections:?}"
        );
    }
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(
        fences.len(),
        sections.len(),
        "a fence given twice: {sections:?}"
    );
}

/// The keys on `s` that outlive every lockctl: the fencing counters (which never go) only.
fn leftovers(s: &Server) -> Vec<String> {
    s.keys()
        .into_iter()
        .filter(|k| !k.ends_with("\u{1f}fence"))
        .collect()
}

/// Asserts that the servers keep nothing but fencing counters, within `within` (waiter records
/// outlive a waiter that vanished for their documented lifetime).
fn nothing_left(servers: &Servers, within: Duration) {
    let clean = eventually(within, || servers.0.iter().all(|s| leftovers(s).is_empty()));
    let left: Vec<Vec<(String, String)>> = servers.0.iter().map(snapshot).collect();
    assert!(clean, "keys left behind: {left:?}");
}

/// How often lockctl's trace shows a read cut by a stop: sent again, and failed after the resend.
fn interrupted(stderr: &str) -> (usize, usize) {
    let again = stderr
        .lines()
        .filter(|l| l.contains("Interrupted system call") && l.contains("reconnecting"))
        .count();
    let failed = stderr
        .lines()
        .filter(|l| l.contains("Interrupted system call") && l.contains("failed after"))
        .count();
    (again, failed)
}

/// Tallies exit codes and interruptions over many runs.
#[derive(Default, Debug)]
struct Tally {
    codes: BTreeMap<i32, usize>,
    resent: usize,
    failed: usize,
}

impl Tally {
    fn add(&mut self, o: &Output) -> i32 {
        let c = code(o);
        *self.codes.entry(c).or_default() += 1;
        let (a, f) = interrupted(&stderr(o));
        self.resent += a;
        self.failed += f;
        c
    }
}

/// Workers loop on `lockctl exec` of one name under the hammer; every section must complete (exit
/// 0: the stops are far shorter than the TTL, so no lease may be reported lost) within the limit.
fn exec_under_the_hammer(nodes: usize, limit: usize, workers: usize, rounds: usize) {
    let servers = Servers::start(nodes);
    let on: Vec<&Server> = servers.0.iter().collect();
    let label = format!("{nodes} node(s), --limit {limit}");
    hammer_sections(&label, &|| servers.lockctl(), &on, limit, workers, rounds);
}

/// The keys of a held lock on `s`: slot keys, holder records, the limit. Each `exec` releases its
/// own before it exits, so none may be there once they all have.
fn locks_left(s: &Server) -> Vec<String> {
    s.keys()
        .into_iter()
        .filter(|k| {
            !k.contains('\u{1f}')
                || ["slot", "holder", "limit"]
                    .iter()
                    .any(|a| k.contains(&format!("\u{1f}{a}")))
        })
        .collect()
}

fn hammer_sections(
    label: &str,
    lockctl: &(dyn Fn() -> Command + Sync),
    on: &[&Server],
    limit: usize,
    workers: usize,
    rounds: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let name = "hammered";
    let hammer = Hammer::start(20);
    let tally = Mutex::new(Tally::default());
    let bad: Mutex<Vec<String>> = Mutex::default();
    std::thread::scope(|scope| {
        for w in 0..workers {
            let (hammer, tally, bad, log) = (&hammer, &tally, &bad, &log);
            scope.spawn(move || {
                for r in 0..rounds {
                    let mut cmd = lockctl();
                    cmd.args(["-v", "exec", name, "--ttl", "3s", "--limit"])
                        .arg(limit.to_string())
                        .args(["-c", SECTION])
                        .env("HOLD", "0.05")
                        .env("LOG", log)
                        .env("W", format!("{w}.{r}"));
                    let o = hammer.spawn(&mut cmd).output(BOUND);
                    if tally.lock().unwrap().add(&o) != 0 {
                        bad.lock().unwrap().push(stderr(&o));
                    }
                }
            });
        }
    });
    let stops = hammer.finish();
    let locks: Vec<Vec<String>> = on.iter().map(|s| locks_left(s)).collect();
    let tally = tally.into_inner().unwrap();
    let secs = sections(&log);
    eprintln!(
        "{label}: {stops} stops, exits {:?}, {} read(s) sent again, {} call(s) failed after a \
         resend, {} sections",
        tally.codes,
        tally.resent,
        tally.failed,
        secs.len()
    );
    let bad = bad.into_inner().unwrap();
    assert!(bad.is_empty(), "runs that did not exit 0: {bad:#?}");
    assert_eq!(secs.len(), workers * rounds, "a section missing");
    check_sections(&secs, limit);
    assert!(
        locks.iter().all(Vec::is_empty),
        "locks left once every exec exited: {locks:?}"
    );
    let clean = eventually(Duration::from_secs(10), || {
        on.iter().all(|s| leftovers(s).is_empty())
    });
    let left: Vec<Vec<(String, String)>> = on.iter().map(|s| snapshot(s)).collect();
    assert!(clean, "keys left behind: {left:?}");
}

#[test]
fn exec_on_one_node_under_the_hammer() {
    exec_under_the_hammer(1, 1, 4, 12);
}

#[test]
fn exec_on_one_node_with_limit_two_under_the_hammer() {
    exec_under_the_hammer(1, 2, 4, 12);
}

#[test]
fn exec_on_redlock_under_the_hammer() {
    exec_under_the_hammer(3, 1, 4, 12);
}

#[test]
fn exec_on_redlock_with_limit_two_under_the_hammer() {
    exec_under_the_hammer(3, 2, 4, 12);
}

/// `break --yes` whose reply is cut by a stop after the server ran it: lockctl sends it again. A
/// waiter the first send let in must not lose its lock to that second send, which nobody asked for,
/// and the report must name the holder the lock was taken from.
#[test]
fn a_break_sent_again_leaves_the_holder_it_let_in() {
    let s = Server::start();
    let name = "broken";
    let dir = tempfile::tempdir().unwrap();
    let entered = dir.path().join("entered");
    let first = queue::hold(&mut lockctl_on(&s), name);
    let mut waiter = lockctl_on(&s);
    waiter
        .args(["exec", name, "--ttl", "30s", "-c"])
        .arg(format!("touch '{}'; sleep 30", entered.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let waiter = waiter.spawn().unwrap();
    queue::wait_queued(&s, name, 1);
    // The server caches the break script, so that the first EVALSHA runs rather than NOSCRIPT.
    let warm = run(lockctl_on(&s).args(["break", "another", "--yes"]));
    assert_eq!(code(&warm), 1, "{}", stderr(&warm));

    s.pause();
    let mut cmd = lockctl_on(&s);
    let breaker = Traced::spawn(
        cmd.args(["-v", "--node-timeout", "20s", "break", name, "--yes"]),
        BOUND,
    );
    let key = slot_key(name, 1);
    let mut second = None;
    breaker.interrupt(1, || {
        s.resume();
        // The first send ran: the waiter holds the lock now, its job started.
        assert!(
            eventually(BOUND, || entered.exists()),
            "the waiter never got the lock the break freed"
        );
        second = s.get(&key);
    });
    let second = second.expect("the waiter holds the lock");
    assert_ne!(second, first);
    let (code, out, trace) = breaker.finish();
    eprintln!("{trace}\nstdout: {out}");
    assert_eq!(code, 0, "{trace}");
    assert!(
        trace.contains("reconnecting"),
        "the break was not sent again: {trace}"
    );
    let now = s.get(&key);
    kill(waiter.id() as i32, libc::SIGTERM);
    let _ = wait_output(waiter, BOUND);
    assert!(
        !out.contains("sh -c touch"),
        "the break names the holder its first send let in as the one broken: {out}"
    );
    assert_eq!(
        now.as_deref(),
        Some(second.as_str()),
        "the break's second send took the lock from the holder its first send let in"
    );
}

/// Pauses `s`, runs `cmd` (with `-v`; the scripts cached by [`warm`]), interrupts its read `times` times (each on the connection it
/// opened for the resend), resumes `s` and returns lockctl's exit code, stdout and trace.
fn cut_twice(s: &Server, cmd: &mut Command, times: usize) -> (i32, String, String) {
    s.pause();
    let run = Traced::spawn(cmd, BOUND);
    run.interrupt(times, || {});
    s.resume();
    run.finish()
}

/// `lockctl release` whose read is cut twice, its first send's and its resend's: both ran once the
/// server resumed. The lease was held throughout and the release deleted it: exit 0, not 69.
#[test]
fn a_release_cut_twice_still_reports_the_release() {
    let s = Server::start();
    warm(&s);
    let token = queue::hold(&mut lockctl_on(&s), "twice");
    let (code, _, trace) = cut_twice(
        &s,
        lockctl_on(&s).args([
            "-v",
            "--node-timeout",
            "20s",
            "release",
            "twice",
            "--token",
            &token,
        ]),
        2,
    );
    assert_eq!(s.get(&slot_key("twice", 1)), None, "{trace}");
    assert_eq!(code, 0, "a release that ran reported as failed: {trace}");
}

/// `lockctl renew` whose read is cut twice: the renewal ran (the TTL was reset), exit 0 with the
/// validity printed.
#[test]
fn a_renewal_cut_twice_still_reports_the_renewal() {
    let s = Server::start();
    warm(&s);
    let token = queue::hold(&mut lockctl_on(&s), "twice");
    let (code, out, trace) = cut_twice(
        &s,
        lockctl_on(&s).args([
            "-v",
            "--node-timeout",
            "20s",
            "renew",
            "twice",
            "--token",
            &token,
            "--ttl",
            "600s",
        ]),
        2,
    );
    let pttl: i64 = s.cmd(&["PTTL", &slot_key("twice", 1)]);
    assert!(
        pttl > 60_000,
        "the renewal did not run: {pttl} ms left; {trace}"
    );
    assert_eq!(code, 0, "a renewal that ran reported as failed: {trace}");
    assert!(!out.is_empty(), "no validity printed: {trace}");
}

/// `acquire -n` on a free lock whose read is cut twice: it gets the lock (exit 0, its token printed
/// once, held by that token), or it fails and leaves nothing.
#[test]
fn an_acquire_cut_twice_gets_the_lock_or_leaves_nothing() {
    let s = Server::start();
    warm(&s);
    let (code, out, trace) = cut_twice(
        &s,
        lockctl_on(&s).args(["-v", "--node-timeout", "20s", "acquire", "twice", "-n"]),
        2,
    );
    let held = s.get(&slot_key("twice", 1));
    if code == 0 {
        assert_eq!(held.as_deref(), Some(out.as_str()), "{trace}");
    } else {
        assert_eq!(held, None, "a failed acquire left the lock held: {trace}");
        assert!(out.is_empty(), "{trace}");
    }
    assert_eq!(
        code, 0,
        "an acquire whose grant ran reported as failed: {trace}"
    );
}

/// Workers loop on `acquire -n` (free at first, busy when another worker holds), `renew`, `status`
/// and `release` of one name under the hammer. A grant prints its token once and holds it until the
/// release, which deletes it (exit 0); a refused or failed acquire leaves no key of its own; every
/// call tells the truth about a lock the worker held throughout.
fn calls_under_the_hammer(nodes: usize, limit: usize, workers: usize, rounds: usize) {
    let servers = Servers::start(nodes);
    let name = format!("calls-{nodes}-{limit}");
    let hammer = Hammer::start(20);
    let tally: Mutex<BTreeMap<&str, Tally>> = Mutex::default();
    let bad: Mutex<Vec<String>> = Mutex::default();
    let lim = limit.to_string();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            let (servers, hammer, tally, bad, name, lim) =
                (&servers, &hammer, &tally, &bad, &name, &lim);
            scope.spawn(move || {
                let call = |what: &'static str, args: &[&str], want: &[i32]| {
                    let mut cmd = servers.lockctl();
                    cmd.arg("-v").args(args);
                    let o = hammer.spawn(&mut cmd).output(BOUND);
                    let c = tally.lock().unwrap().entry(what).or_default().add(&o);
                    if !want.contains(&c) {
                        bad.lock()
                            .unwrap()
                            .push(format!("{what}: exit {c}: {}", stderr(&o)));
                    }
                    (c, stdout(&o))
                };
                for _ in 0..rounds {
                    let (c, token) = call(
                        "acquire",
                        &["acquire", name, "-n", "--ttl", "20s", "--limit", lim],
                        &[0, 75],
                    );
                    if c != 0 {
                        continue;
                    }
                    if token.lines().count() != 1 || token.len() != 32 {
                        bad.lock()
                            .unwrap()
                            .push(format!("acquire printed {token:?}"));
                        continue;
                    }
                    call("renew", &["renew", name, "--token", &token], &[0]);
                    call("status", &["status", name], &[0]);
                    call("list", &["list"], &[0]);
                    call("release", &["release", name, "--token", &token], &[0]);
                }
            });
        }
    });
    let stops = hammer.finish();
    for (what, t) in tally.into_inner().unwrap() {
        eprintln!(
            "{nodes} node(s), --limit {limit}, {what}: exits {:?}, {} read(s) sent again, {} \
             call(s) failed after a resend",
            t.codes, t.resent, t.failed
        );
    }
    eprintln!("{stops} stops");
    let bad = bad.into_inner().unwrap();
    assert!(bad.is_empty(), "{bad:#?}");
    nothing_left(&servers, Duration::from_secs(10));
}

#[test]
fn calls_on_one_node_under_the_hammer() {
    calls_under_the_hammer(1, 1, 3, 15);
}

#[test]
fn calls_on_one_node_with_limit_two_under_the_hammer() {
    calls_under_the_hammer(1, 2, 3, 15);
}

#[test]
fn calls_on_redlock_under_the_hammer() {
    calls_under_the_hammer(3, 1, 3, 15);
}

#[test]
fn calls_on_redlock_with_limit_two_under_the_hammer() {
    calls_under_the_hammer(3, 2, 3, 15);
}

/// Four waiters queued in order, all under the hammer (their attempts, heartbeats and wake
/// subscriptions cut again and again), are served in arrival order once the holder releases, each
/// exits 0, and nothing is left.
fn waiters_in_order_under_the_hammer(nodes: usize) {
    let servers = Servers::start(nodes);
    let name = "fifo";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = queue::hold(&mut servers.lockctl(), name);
    let on: Vec<&Server> = servers.0.iter().collect();
    let kids = queue::queue_in_order(&on, name, &file, 4, || {
        let mut c = servers.lockctl();
        c.arg("-v");
        c
    });
    let hammer = Hammer::start(20);
    let kids: Vec<Attacked> = kids.into_iter().map(|k| hammer.adopt(k)).collect();
    // Long enough for many stops of every waiter while it waits.
    std::thread::sleep(Duration::from_secs(2));
    let o = run(servers.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut tally = Tally::default();
    let outs: Vec<Output> = kids.into_iter().map(|k| k.output(BOUND)).collect();
    let stops = hammer.finish();
    for o in &outs {
        tally.add(o);
    }
    eprintln!(
        "{nodes} node(s): {stops} stops, exits {:?}, {} read(s) sent again, {} failed after a \
         resend, {} subscription(s) cut",
        tally.codes,
        tally.resent,
        tally.failed,
        outs.iter()
            .map(|o| stderr(o).matches("subscription dropped").count())
            .sum::<usize>()
    );
    for o in &outs {
        assert_eq!(code(o), 0, "{}", stderr(o));
    }
    assert_eq!(queue::order(&file), ["1", "2", "3", "4"]);
    nothing_left(&servers, Duration::from_secs(15));
}

#[test]
fn waiters_on_one_node_keep_their_order_under_the_hammer() {
    waiters_in_order_under_the_hammer(1);
}

#[test]
fn waiters_on_redlock_keep_their_order_under_the_hammer() {
    waiters_in_order_under_the_hammer(3);
}

/// Waiters that give up (`-w`) while under the hammer exit 75 and leave the queue at once: their
/// leave is a node call like any other, cut and sent again.
fn impatient_waiters_under_the_hammer(nodes: usize, limit: usize) {
    let servers = Servers::start(nodes);
    let name = "impatient";
    let lim = limit.to_string();
    let mut holders = Vec::new();
    for _ in 0..limit {
        let g = acquire_json(
            &mut servers.lockctl(),
            name,
            &["--ttl", "120s", "--limit", &lim],
        );
        holders.push(g["token"].as_str().unwrap().to_string());
    }
    let hammer = Hammer::start(20);
    let kids: Vec<Attacked> = (0..4)
        .map(|_| {
            let mut c = servers.lockctl();
            c.args(["-v", "acquire", name, "-w", "1.5s", "--limit", &lim]);
            hammer.spawn(&mut c)
        })
        .collect();
    let outs: Vec<Output> = kids.into_iter().map(|k| k.output(BOUND)).collect();
    // Every waiter has exited: its record must be gone now, not after a heartbeat's lifetime.
    let queued: Vec<u64> = servers
        .0
        .iter()
        .map(|s| s.cmd(&["ZCARD", &queue::queue_key(name)]))
        .collect();
    let stops = hammer.finish();
    let mut tally = Tally::default();
    for o in &outs {
        tally.add(o);
    }
    eprintln!(
        "{nodes} node(s), --limit {limit}: {stops} stops, exits {:?}, {} read(s) sent again, {} \
         failed after a resend, queued after they exited: {queued:?}",
        tally.codes, tally.resent, tally.failed
    );
    for o in &outs {
        assert_eq!(code(o), 75, "{}", stderr(o));
        assert!(stdout(o).is_empty());
    }
    assert!(
        queued.iter().all(|&q| q == 0),
        "waiters left queued: {queued:?}"
    );
    for t in &holders {
        let o = run(servers.lockctl().args(["release", name, "--token", t]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    nothing_left(&servers, Duration::from_secs(15));
}

#[test]
fn impatient_waiters_on_one_node_under_the_hammer() {
    impatient_waiters_under_the_hammer(1, 1);
}

#[test]
fn impatient_waiters_on_redlock_with_limit_two_under_the_hammer() {
    impatient_waiters_under_the_hammer(3, 2);
}

/// A waiter stopped and continued while it listens for its wake (its subscriber blocked in a read)
/// keeps its subscription: the release wakes it on its channel. The cut read used to count as a
/// dropped subscription: the waiter then polled for the release (every heartbeat) and subscribed
/// again only five seconds later.
#[test]
fn a_stopped_waiter_is_still_woken_by_the_release() {
    let s = Server::start();
    let name = "listening";
    let token = queue::hold(&mut lockctl_on(&s), name);
    let waiter = Traced::spawn(
        lockctl_on(&s).args(["-v", "acquire", name, "--ttl", "10s"]),
        BOUND,
    );
    waiter.wait_for("subscribed to releases on 1/1", 1);
    let sleeps = waiter.count("waiting up to");
    waiter.wait_for("waiting up to", sleeps + 1);
    // Its only socket read now is the subscription's (the main thread sleeps on a channel).
    stop_in_a_read(waiter.pid(), BOUND);
    kill(waiter.pid(), libc::SIGCONT);
    // Whatever the cut read did (nothing, or a retry), the waiter sleeps again before the release.
    let sleeps = waiter.count("waiting up to");
    std::thread::sleep(Duration::from_millis(100));
    waiter.wait_for("waiting up to", sleeps.max(1));
    let released_at = std::time::Instant::now();
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (exit, out, trace) = waiter.finish();
    eprintln!("granted {:?} after the release", released_at.elapsed());
    assert_eq!(exit, 0, "{trace}");
    assert_eq!(s.get(&slot_key(name, 1)).as_deref(), Some(out.as_str()));
    assert!(
        !trace.contains("subscription dropped"),
        "a stop cut the waiter's subscription: {trace}"
    );
    assert!(
        trace.contains("woken by a release"),
        "the release did not wake the waiter: {trace}"
    );
    let o = run(lockctl_on(&s).args(["release", name, "--token", &out]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// The replicas in sync, as `master` lists them.
fn online(master: &Server) -> usize {
    let info: String = master.cmd(&["INFO", "replication"]);
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

/// A grant on a master with a replica counts only once the replica acknowledged it (`WAIT`). Its
/// read cut by a stop, the grant is sent again on a new connection, where it finds itself done.
/// Had that send written nothing, a `WAIT` on its connection would wait for nothing of this
/// client's on servers that set a connection's offset only at a write (Valkey 8: it answered at
/// once with the stopped replica counted; Redis 6.2 and 7.0 count from the connection's last
/// command). With the replica stopped throughout, nothing was acknowledged: the grant must fail
/// (and be rolled back), not be reported. Run it with `REDIS_SERVER` naming each server.
#[test]
fn a_grant_sent_again_still_waits_for_its_replica() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(30), || online(&master) == 1),
        "the replica did not come online"
    );
    assert!(
        eventually(Duration::from_secs(30), || replicas_acknowledge(
            &mut master.conn(),
            "replicas-ready",
            1
        )),
        "the replica never acknowledged a write"
    );
    // Cache the scripts on the master (the replica is still running).
    warm(&master);
    replica.pause();
    master.pause();
    let grant = Traced::spawn(
        lockctl_on(&master).args([
            "-v",
            "--node-timeout",
            "3s",
            "acquire",
            "durable",
            "-n",
            "--ttl",
            "60s",
        ]),
        BOUND,
    );
    grant.interrupt(1, || {
        // The first send runs while lockctl is stopped; its resend comes after it, as it does
        // when a stop cuts the read of a reply already on its way.
        master.resume();
        assert!(
            eventually(BOUND, || master.get(&slot_key("durable", 1)).is_some()),
            "the first send never ran"
        );
    });
    let (exit, out, trace) = grant.finish();
    let held = master.get(&slot_key("durable", 1));
    replica.resume();
    eprintln!("exit {exit}\n{trace}");
    assert!(trace.contains("reconnecting"), "{trace}");
    assert_ne!(
        exit, 0,
        "a grant reported with its only replica stopped throughout: {out}\n{trace}"
    );
    assert_eq!(held, None, "the failed grant was not rolled back: {trace}");
}

/// `exec` on a master with a replica under the hammer: the WAIT after each grant and renewal is
/// cut too.
#[test]
fn exec_on_a_master_with_a_replica_under_the_hammer() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(30), || online(&master) == 1),
        "the replica did not come online"
    );
    assert!(
        eventually(Duration::from_secs(30), || replicas_acknowledge(
            &mut master.conn(),
            "replicas-ready",
            1
        )),
        "the replica never acknowledged a write"
    );
    hammer_sections(
        "a master with a replica",
        &|| lockctl_on(&master),
        &[&master],
        1,
        4,
        10,
    );
    drop(replica);
}

/// `lockctl renew` on a master with a replica, cut while it waits for the replica's acknowledgement
/// (WAIT, which blocks on the server while the replica is stopped): the renewal ran and the replica
/// has it once it resumes, so the renewal is reported (exit 0), not "Redis unavailable".
#[test]
fn a_renewal_whose_wait_is_cut_still_reports_the_renewal() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(30), || online(&master) == 1),
        "the replica did not come online"
    );
    assert!(
        eventually(Duration::from_secs(30), || replicas_acknowledge(
            &mut master.conn(),
            "replicas-ready",
            1
        )),
        "the replica never acknowledged a write"
    );
    warm(&master);
    let token = queue::hold(&mut lockctl_on(&master), "acked");
    replica.pause();
    let renew = Traced::spawn(
        lockctl_on(&master).args([
            "-v",
            "--node-timeout",
            "10s",
            "renew",
            "acked",
            "--token",
            &token,
            "--ttl",
            "600s",
        ]),
        BOUND,
    );
    let blocked = || {
        let info: String = master.cmd(&["INFO", "clients"]);
        info.contains("blocked_clients:1")
    };
    assert!(
        eventually(BOUND, blocked),
        "the renewal never waited for the replica"
    );
    renew.interrupt(1, || {
        replica.resume();
        assert!(
            eventually(BOUND, || !blocked()),
            "the WAIT never ended on the server"
        );
    });
    let (exit, out, trace) = renew.finish();
    eprintln!("exit {exit}\n{trace}");
    let pttl: i64 = master.cmd(&["PTTL", &slot_key("acked", 1)]);
    assert!(pttl > 60_000, "the renewal did not run: {trace}");
    assert_eq!(
        exit, 0,
        "a renewal acknowledged by its replica reported as failed: {trace}"
    );
    assert!(!out.is_empty());
}

/// Nanoseconds on this host's clock, as the jobs' `date +%s%N` writes them.
fn now_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// `exec` stopped in a renewal's read (the server paused to hold it there) for longer than its
/// lease and its kill-after: the watcher still stops the job (SIGTERM at the deadline, SIGKILL
/// `--kill-after` later, since this job ignores SIGTERM) while lockctl is stopped, another client
/// gets the lock once it expires, and lockctl, continued, reports the lease lost (76) and leaves
/// the other's lock alone.
#[test]
fn exec_stopped_in_a_renewal_past_its_lease_still_stops_its_job() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let ticks = dir.path().join("ticks");
    let job = format!(
        "trap '' TERM; while :; do date +%s%N >> '{}'; sleep 0.05; done",
        ticks.display()
    );
    let exec = Traced::spawn(
        lockctl_on(&s).args([
            "-v",
            "exec",
            "long",
            "--ttl",
            "2s",
            "--kill-after",
            "1s",
            "-c",
            &job,
        ]),
        BOUND,
    );
    assert!(eventually(BOUND, || ticks.exists()), "the job never ran");
    // The next renewal waits in its read for as long as the server is paused.
    let renewals = exec.count("renew in");
    exec.wait_for("renew in", renewals + 1);
    let paused_at = now_ns();
    s.pause();
    stop_in_a_read(exec.pid(), BOUND);
    s.resume();
    // Another client gets the lock once the lease has run out.
    let o = run(lockctl_on(&s).args(["acquire", "long", "-w", "30s", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let other = stdout(&o);
    // lockctl stays stopped well past its deadline and its kill-after.
    std::thread::sleep(Duration::from_secs(4));
    let last = |p: &std::path::Path| -> u128 {
        std::fs::read_to_string(p)
            .unwrap()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .max()
            .unwrap()
    };
    let last_tick = last(&ticks);
    kill(exec.pid(), libc::SIGCONT);
    let (exit, _, trace) = exec.finish();
    // The deadline comes at most a TTL (2 s) after the last renewal began, before the pause; the
    // job dies at most the kill-after (1 s) later. A generous 3 s more for a loaded machine.
    let bound = paused_at + Duration::from_secs(6).as_nanos();
    assert!(
        last_tick < bound,
        "the job ran {} ms after the pause: {trace}",
        (last_tick - paused_at) / 1_000_000
    );
    eprintln!(
        "the job's last tick came {} ms after the pause",
        (last_tick - paused_at) / 1_000_000
    );
    assert_eq!(exit, 76, "{trace}");
    assert_eq!(s.get(&slot_key("long", 1)).as_deref(), Some(other.as_str()));
    let o = run(lockctl_on(&s).args(["release", "long", "--token", &other]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// A proxy in front of `upstream` whose first connection passes the server's bytes only up to the
/// reply of `INFO` (the bulk string that starts `# Server`), and holds that reply back; the other
/// connections pass everything. The receiver gets the client's local port of that first
/// connection once the bytes before INFO's reply have been written to it.
fn hold_the_first_info(upstream: u16) -> (u16, std::sync::mpsc::Receiver<u16>) {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (written, passed) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut first = true;
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            if !std::mem::take(&mut first) {
                proxy::pass_through(client, server);
                continue;
            }
            proxy::one_way(client.try_clone().unwrap(), server.try_clone().unwrap());
            let written = written.clone();
            std::thread::spawn(move || {
                let (mut from, mut to) = (server, client);
                let mut seen = Vec::new();
                let mut buf = [0u8; 16384];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    seen.extend_from_slice(&buf[..n]);
                    let Some(at) = seen.windows(9).position(|w| w == b"# Server\r") else {
                        continue;
                    };
                    // Back to the `$<length>\r\n` that opens INFO's reply.
                    let start = seen[..at].iter().rposition(|&b| b == b'$').unwrap();
                    let _ = to.write_all(&seen[..start]);
                    if let Ok(peer) = to.peer_addr() {
                        let _ = written.send(peer.port());
                    }
                    // The rest never goes: the client waits for it until its read is cut.
                    let _ = std::io::copy(&mut from, &mut std::io::sink());
                    return;
                }
            });
        }
    });
    (port, passed)
}

/// `lockctl release`: the script's reply read, the read of the `INFO` that follows it on a new
/// connection cut by a stop (as when INFO's reply, several TCP segments long, is still on its way).
/// The release ran: exit 0, not 69.
///
/// lockctl is stopped only once it has read the script's reply and sleeps waiting for INFO's. A
/// CI run stopped it as that reply arrived: its read returned the reply, not EINTR, and the next
/// read, of INFO, waited out the node timeout (69).
#[test]
fn a_release_whose_info_read_is_cut_still_reports_the_release() {
    let s = Server::start_tcp();
    warm(&s);
    let token = queue::hold(&mut lockctl_on(&s), "info");
    let (port, written) = hold_the_first_info(s.port.unwrap());
    // A node timeout the stop always comes within: at the default 500 ms, one CI run stopped
    // lockctl only after the INFO read had timed out (69 for a timeout, not for a cut read).
    let release = Traced::spawn(
        lockctl().args([
            "-v",
            "--node-timeout",
            "20s",
            "-r",
            &format!("redis://127.0.0.1:{port}"),
            "release",
            "info",
            "--token",
            &token,
        ]),
        BOUND,
    );
    // The script ran (the key is gone) and its reply was passed on: lockctl waits for INFO's.
    let local = written
        .recv_timeout(BOUND)
        .expect("the script's reply never reached lockctl");
    assert!(
        s.get(&slot_key("info", 1)).is_none(),
        "the release never ran"
    );
    assert!(
        eventually(BOUND, || sleeps_on_a_read_socket(
            release.pid(),
            local,
            port
        )),
        "lockctl never waited for INFO's reply with the script's read"
    );
    release.interrupt(1, || {});
    let (exit, _, trace) = release.finish();
    eprintln!("exit {exit}\n{trace}");
    assert_eq!(exit, 0, "a release that ran reported as failed: {trace}");
}

/// For each node, how many of its calls named `what` came right after a cut read on that node (so
/// were that call sent again).
fn cut_calls(trace: &str, what: &str) -> usize {
    let mut last: BTreeMap<String, bool> = BTreeMap::new();
    let mut n = 0;
    for line in trace.lines() {
        let Some(rest) = line.split("] ").nth(1) else {
            continue;
        };
        let Some((node, event)) = rest.split_once(": ") else {
            continue;
        };
        if event.contains("Interrupted system call") && event.contains("reconnecting") {
            last.insert(node.to_string(), true);
        } else if event.starts_with(what) && event.contains(" in ") {
            n += usize::from(last.insert(node.to_string(), false) == Some(true));
        } else if event.contains(" in ") && !event.starts_with("connected") {
            last.insert(node.to_string(), false);
        }
    }
    n
}

/// Redlock 3 with node 0's fencing counter raised before every grant, so that every grant runs
/// round 2 (`fence.lua`) on the other two, under the hammer: every grant's fence is above the
/// last, every node won keeps a counter at least at the fence, and each release reports the
/// release.
#[test]
fn round_two_on_redlock_under_the_hammer() {
    let servers = Servers::start(3);
    let name = "fenced";
    let counter = format!("{{lockctl:{name}}}\u{1f}fence");
    let hammer = Hammer::start(20);
    let mut last = 0u64;
    let (mut resent, mut cut_round2, mut tally) = (0, 0, Tally::default());
    for _ in 0..30 {
        let _: u64 = servers[0].cmd(&["INCRBY", &counter, "1000"]);
        let mut cmd = servers.lockctl();
        cmd.args(["-v", "acquire", name, "-n", "--format", "json"]);
        let o = hammer.spawn(&mut cmd).output(BOUND);
        tally.add(&o);
        let trace = stderr(&o);
        resent += interrupted(&trace).0;
        cut_round2 += cut_calls(&trace, "raise fence");
        assert_eq!(code(&o), 0, "{trace}");
        let grant: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let fence = grant["fence"].as_u64().unwrap();
        assert!(fence > last, "fence {fence} after {last}: {trace}");
        last = fence;
        let token = grant["token"].as_str().unwrap();
        // The grant stands on a quorum whose counters are at the fence: every later quorum meets
        // it. A node whose round 2 failed (a raise that found no time left under load) keeps the
        // key from round 1 until the release, with its counter below: it was not counted.
        let (mut at_fence, mut below) = (0, 0);
        for s in &servers.0 {
            if s.get(&slot_key(name, 1)).as_deref() == Some(token) {
                let c: u64 = s.cmd::<String>(&["GET", &counter]).parse().unwrap();
                if c >= fence {
                    at_fence += 1;
                } else {
                    below += 1;
                }
            }
        }
        assert!(
            at_fence >= 2,
            "only {at_fence} node(s) hold the grant with a counter at fence {fence}: {trace}"
        );
        assert!(
            below == 0 || trace.contains("raise fence failed"),
            "{below} node(s) hold the grant below fence {fence} though no round 2 failed: {trace}"
        );
        let mut cmd = servers.lockctl();
        cmd.args(["-v", "release", name, "--token", token]);
        let o = hammer.spawn(&mut cmd).output(BOUND);
        tally.add(&o);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    let stops = hammer.finish();
    eprintln!(
        "{stops} stops, exits {:?}, {} read(s) sent again in the grants, {cut_round2} of them a \
         round 2, {} call(s) failed after a resend",
        tally.codes, resent, tally.failed
    );
    nothing_left(&servers, Duration::from_secs(10));
}

/// Round 2 of a Redlock grant (`fence.lua` on the nodes whose counter is behind), its reply held
/// back on node 1 and the read cut by a stop of lockctl: the raise goes again on a new connection,
/// finds its own raise done, and the grant stands with node 1 counted and its counter at the fence.
#[test]
fn a_round_two_cut_by_a_stop_still_counts() {
    let servers = Servers(vec![
        Server::start_tcp(),
        Server::start_tcp(),
        Server::start_tcp(),
    ]);
    let name = "raised";
    let counter = format!("{{lockctl:{name}}}\u{1f}fence");
    // Node 0 far ahead: round 2 goes to nodes 1 and 2.
    let ahead = servers[0].clock_us() * 2;
    let () = servers[0].cmd(&["SET", &counter, &ahead.to_string()]);
    for s in &servers.0 {
        warm(s);
    }
    let _ = run(servers
        .lockctl()
        .args(["release", "warm-fence", "--token", &"0".repeat(32)]));
    // Node 1 behind a proxy that holds back the reply of a connection's second script (round 1's
    // is the first).
    let port = holding_proxy(servers[1].port.unwrap(), two_scripts);
    let urls = format!(
        "{},redis://127.0.0.1:{port},{}",
        servers[0].url(),
        servers[2].url()
    );
    let mut cmd = lockctl();
    cmd.env("LOCKCTL_REDIS", urls).args([
        "-v",
        "--node-timeout",
        "20s",
        "acquire",
        name,
        "-n",
        "--format",
        "json",
    ]);
    let grant = Traced::spawn(&mut cmd, BOUND);
    grant.wait_for("raise fence in", 1);
    grant.interrupt(1, || {});
    let (exit, out, trace) = grant.finish();
    eprintln!("exit {exit}\n{trace}");
    assert_eq!(exit, 0, "{trace}");
    assert_eq!(cut_calls(&trace, "raise fence"), 1, "{trace}");
    let g: serde_json::Value = serde_json::from_str(&out).unwrap();
    let fence = g["fence"].as_u64().unwrap();
    assert_eq!(fence, ahead + 1, "{trace}");
    let token = g["token"].as_str().unwrap();
    for s in &servers.0 {
        assert_eq!(s.get(&slot_key(name, 1)).as_deref(), Some(token));
        let c: u64 = s.cmd::<String>(&["GET", &counter]).parse().unwrap();
        assert_eq!(c, fence, "a node won keeps another counter than the fence");
    }
    let o = run(servers.lockctl().args(["release", name, "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// `lockctl release` on a server that asks for a password: lockctl's `AUTH` (the handshake of its
/// new connection) waits for the paused server, and a stop of lockctl cuts that read. The
/// handshake is made again, the release runs once the server resumes: exit 0, the lock gone.
#[test]
fn a_handshake_cut_by_a_stop_is_made_again() {
    let s = Server::start_tcp();
    // Set once up: the harness checks readiness without logging in.
    let () = s.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let url = format!("redis://:s3cret@127.0.0.1:{}", s.port.unwrap());
    let on = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let token = queue::hold(&mut on(), "auth");
    let o = run(on().args(["renew", "auth", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let get = |c: &mut redis::Connection| -> Option<String> {
        redis::cmd("GET").arg(slot_key("auth", 1)).query(c).unwrap()
    };
    assert_eq!(get(&mut conn).as_deref(), Some(token.as_str()));
    s.pause();
    let release = Traced::spawn(
        on().args([
            "-v",
            "--node-timeout",
            "20s",
            "release",
            "auth",
            "--token",
            &token,
        ]),
        BOUND,
    );
    stop_in_a_read(release.pid(), BOUND);
    kill(release.pid(), libc::SIGCONT);
    // The cut handshake shows in the trace only as the call's outcome: give it time to be cut.
    std::thread::sleep(Duration::from_millis(300));
    s.resume();
    let (exit, _, trace) = release.finish();
    eprintln!("exit {exit}\n{trace}");
    assert_eq!(get(&mut conn), None, "{trace}");
    assert_eq!(exit, 0, "{trace}");
}

/// A section that also writes its fence to a fenced store (SQLite: accepted only above every fence
/// accepted so far), and logs whether the store took it.
const FENCED_SECTION: &str = r#"f=$LOCKCTL_FENCE; s=$(date +%s%N); sleep "$HOLD"; e=$(date +%s%N)
r=$(sqlite3 -cmd ".timeout 20000" "$DB" "BEGIN IMMEDIATE; INSERT INTO log(fence) SELECT $f WHERE $f > (SELECT COALESCE(MAX(fence), 0) FROM log); SELECT changes(); COMMIT;")
echo "$f $s $e $W $r" >> "$LOG""#;

/// Workers loop on `exec` (sections of 1.5 s, renewed) under a hammer one of whose stops in 300
/// outlasts the TTL (2 s against 1 s): those runs may lose their lease (76, the job stopped by the
/// watcher if it still runs), every other must
/// exit 0. Whatever lost its lease, a run that exited 0 had its section alone (no overlap with any
/// section that ran) and its fenced write accepted, and no fence was given twice.
fn long_stops_under_the_hammer(nodes: usize, every: u64) {
    need_tool("sqlite3", "--version");
    let servers = Servers::start(nodes);
    let dir = tempfile::tempdir().unwrap();
    let (log, db) = (dir.path().join("log"), dir.path().join("store.db"));
    let made = Command::new("sqlite3")
        .arg(&db)
        .arg("CREATE TABLE log(fence INTEGER NOT NULL);")
        .status()
        .unwrap();
    assert!(made.success());
    let hammer = Hammer::with_long_stops(20, every, 2000);
    let runs: Mutex<Vec<(String, i32, String)>> = Mutex::default();
    std::thread::scope(|scope| {
        for w in 0..3 {
            let (servers, hammer, runs, log, db) = (&servers, &hammer, &runs, &log, &db);
            scope.spawn(move || {
                for r in 0..6 {
                    let who = format!("{w}.{r}");
                    let mut cmd = servers.lockctl();
                    cmd.args(["-v", "exec", "long", "--ttl", "1s", "--kill-after", "200ms"])
                        .args(["-c", FENCED_SECTION])
                        .env("HOLD", "1.5")
                        .env("LOG", log)
                        .env("DB", db)
                        .env("W", &who);
                    let o = hammer.spawn(&mut cmd).output(BOUND);
                    runs.lock().unwrap().push((who, code(&o), stderr(&o)));
                }
            });
        }
    });
    let stops = hammer.finish();
    let runs = runs.into_inner().unwrap();
    let mut codes: BTreeMap<i32, usize> = BTreeMap::new();
    for (_, c, _) in &runs {
        *codes.entry(*c).or_default() += 1;
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    let secs = sections(&log);
    eprintln!(
        "{nodes} node(s), one stop in {every} long: {stops} stops, exits {codes:?}, {} sections logged, {} \
         fenced write(s) rejected",
        secs.len(),
        lines.iter().filter(|l| l[4] != "1").count()
    );
    for (who, c, err) in &runs {
        let allowed: &[i32] = if every == 0 { &[0] } else { &[0, 76] };
        assert!(allowed.contains(c), "{who} exited {c}: {err}");
        if *c != 0 {
            continue;
        }
        let line = lines.iter().find(|l| l[3] == who);
        assert_eq!(
            line.map(|l| l[4]),
            Some("1"),
            "{who} exited 0 but its fenced write was not accepted: {line:?}\n{err}"
        );
        let me = secs.iter().find(|s| s.who == *who).unwrap();
        for other in secs.iter().filter(|s| s.who != *who) {
            assert!(
                other.end <= me.start || me.end <= other.start,
                "{who} (exit 0) overlapped {other:?}: {me:?}"
            );
        }
    }
    let mut fences: Vec<u64> = secs.iter().map(|s| s.fence).collect();
    fences.sort_unstable();
    fences.dedup();
    assert_eq!(fences.len(), secs.len(), "a fence given twice: {secs:?}");
    nothing_left(&servers, Duration::from_secs(15));
}

#[test]
fn long_stops_on_one_node() {
    long_stops_under_the_hammer(1, 300);
}

#[test]
fn long_stops_on_redlock() {
    long_stops_under_the_hammer(3, 300);
}

/// The same sections, renewed while they run, under short stops only: every lease holds.
#[test]
fn renewed_sections_under_short_stops() {
    long_stops_under_the_hammer(1, 0);
}

#[test]
fn renewed_sections_on_redlock_under_short_stops() {
    long_stops_under_the_hammer(3, 0);
}

/// A waiter stopped and continued while it subscribes to its wake channel (the proxy holds back
/// the confirmation of its first SUBSCRIBE) subscribes again at once: the release wakes it on its
/// channel. A cut subscribe counted as a failed one, retried only five seconds later.
#[test]
fn a_waiter_stopped_while_it_subscribes_is_still_woken() {
    let s = Server::start_tcp();
    let name = "subscribing";
    let token = queue::hold(&mut lockctl_on(&s), name);
    // The command itself: the acquire script's text (sent with EVAL to a server that has not
    // cached it) mentions subscriptions in its comments, and holding its reply held the attempt.
    let port = holding_proxy(s.port.unwrap(), |seen| {
        seen.windows(15)
            .any(|w| w.eq_ignore_ascii_case(b"$9\r\nSUBSCRIBE\r\n"))
    });
    let mut cmd = lockctl();
    cmd.env("LOCKCTL_REDIS", format!("redis://127.0.0.1:{port}"))
        .args([
            "-v",
            "--node-timeout",
            "5s",
            "acquire",
            name,
            "--ttl",
            "10s",
        ]);
    let waiter = Traced::spawn(&mut cmd, BOUND);
    // Its attempt refused, the waiter subscribes; the confirmation never comes on that connection.
    waiter.wait_for("attempt on", 1);
    stop_in_a_read(waiter.pid(), BOUND);
    kill(waiter.pid(), libc::SIGCONT);
    waiter.wait_for("subscribed to releases on", 1);
    let sleeps = waiter.count("waiting up to");
    waiter.wait_for("waiting up to", sleeps.max(1));
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (exit, out, trace) = waiter.finish();
    eprintln!("exit {exit}\n{trace}");
    assert_eq!(exit, 0, "{trace}");
    assert!(
        trace.contains("subscribed to releases on 1/1"),
        "the cut subscribe was not made again: {trace}"
    );
    assert!(
        trace.contains("woken by a release"),
        "the release did not wake the waiter: {trace}"
    );
    let o = run(lockctl_on(&s).args(["release", name, "--token", &out]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// Three servers with the scripts cached, and both slots of `--limit 2` lock `name` taken on the
/// third alone; the tokens of those two holders.
fn full_on_the_third(name: &str) -> (Servers, Vec<String>) {
    let servers = Servers::start(3);
    for s in &servers.0 {
        warm(s);
    }
    let tokens = (0..2)
        .map(|_| {
            let o = run(lockctl_on(&servers.0[2])
                .args(["acquire", name, "-n", "--ttl", "60s", "--limit", "2"]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            stdout(&o)
        })
        .collect();
    (servers, tokens)
}

/// The waiter holds slot 1 on the first two servers, and is not queued on the third (within a few
/// seconds: a leave sent without waiting runs once the server reads it).
fn held_and_left(servers: &Servers, name: &str, token: &str, trace: &str) {
    for s in &servers.0[..2] {
        assert_eq!(s.get(&slot_key(name, 1)).as_deref(), Some(token), "{trace}");
    }
    let c = &servers.0[2];
    let queue = support::queue::queue_key(name);
    let left = || c.cmd::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"]);
    assert!(
        eventually(Duration::from_secs(10), || left().is_empty()),
        "the holder is still queued on the third node: {:?}\n{trace}",
        snapshot(c)
    );
}

/// A Redlock grant whose read on one node is cut after that node queued the waiter (its slots were
/// full then), and whose resend there is granted another slot than the one the quorum gave: that
/// stray grant is rolled back, and a rollback puts a waiter back at the place its grant took it
/// from. lockctl never saw a ticket (every reply it read was a grant), yet it must leave that
/// node's queue when it holds the lock: a waiter left queued there holds up the waiters behind it
/// on that node, shows in `status`, and keeps the semaphore's limit key, until its heartbeat runs
/// out. The hammer tests found it (`exec_on_redlock_with_limit_two_under_the_hammer`, a waiter
/// record and the limit left on one node in 5 of 80 runs); here the cut is placed by hand.
#[test]
fn a_stray_grant_sent_again_leaves_no_waiter_behind() {
    let name = "stray";
    let (servers, tokens) = full_on_the_third(name);
    let c = &servers.0[2];
    // The other two grant slot 1; the third node's reply is the only one still awaited.
    let mut cmd = servers.lockctl();
    cmd.args(["-v", "--node-timeout", "20s", "acquire", name])
        .args(["--ttl", "60s", "--limit", "2"]);
    let waiter = cut_on_the_third(&servers, &mut cmd, BOUND, || {
        // The first send ran: both slots taken, so the waiter is queued there (its reply is lost).
        support::queue::wait_queued(c, name, 1);
        let o = run(lockctl_on(c).args(["release", name, "--token", &tokens[1]]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    });
    let (code, token, trace) = waiter.finish();
    assert_eq!(code, 0, "{trace}");
    assert!(trace.contains("reconnecting"), "no read was cut: {trace}");
    assert!(
        trace.contains(&format!("{}: rollback in", c.url())),
        "the third node's resend was not a stray grant: {trace}"
    );
    held_and_left(&servers, name, &token, &trace);
}

/// As above, but the third node's answer is never read: it is stopped (SIGSTOP) past the node
/// timeout, with the waiter's send in its socket. The other two make the quorum: lockctl holds the
/// lock without having read a ticket, and exits. The node then resumes and runs the send, which
/// queues the waiter (its slots are full): lockctl must have sent its leave after it, or the gone
/// holder stays queued there until its heartbeat runs out.
#[test]
fn a_waiter_whose_answer_timed_out_leaves_that_node_when_granted() {
    let name = "lost";
    let (servers, _) = full_on_the_third(name);
    let c = &servers.0[2];
    c.pause();
    let o = run(servers.lockctl().args([
        "-v",
        "--node-timeout",
        "300ms",
        "acquire",
        name,
        "--ttl",
        "60s",
        "--limit",
        "2",
    ]));
    c.resume();
    let trace = stderr(&o);
    assert_eq!(code(&o), 0, "{trace}");
    assert!(
        trace.contains("within the node timeout"),
        "the third node answered: {trace}"
    );
    held_and_left(&servers, name, &stdout(&o), &trace);
}

/// The digest of `leave.lua` as lockctl sends it (`front.lua` before it).
fn leave_sha() -> &'static str {
    static SHA: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SHA.get_or_init(|| {
        let source = concat!(
            include_str!("../src/lock/scripts/front.lua"),
            include_str!("../src/lock/scripts/leave.lua")
        );
        redis::Script::new(source).get_hash().to_string()
    })
}

/// A waiter's `-w` deadline passes and it leaves the queue; that call times out (a proxy holds the
/// server's answers back from then on; the server runs what it gets) on a server that never ran the
/// leave script, which answers the `EVALSHA` with NOSCRIPT to nobody. lockctl must send the text
/// after it, or its record stays queued there, at the head, holding up whoever waits behind it
/// until a script finds its heartbeat expired.
#[test]
fn a_leave_that_timed_out_on_a_server_without_the_script_still_runs() {
    let s = Server::start_tcp();
    let name = "leave-lost";
    let _holder = queue::hold(&mut lockctl_on(&s), name);
    let port = holding_proxy(s.port.unwrap(), |seen| {
        let sha = leave_sha().as_bytes();
        seen.windows(sha.len()).any(|w| w == sha)
    });
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", format!("redis://127.0.0.1:{port}"))
        .args(["-v", "--node-timeout", "500ms", "acquire", name, "-w", "1s"]));
    let trace = stderr(&o);
    assert_eq!(code(&o), 75, "{trace}");
    assert!(
        trace.contains("leave the queue failed"),
        "the leave's answer came: {trace}"
    );
    let queue = support::queue::queue_key(name);
    assert!(
        eventually(Duration::from_secs(5), || s
            .cmd::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"])
            .is_empty()),
        "the waiter is still queued: {:?}\n{trace}",
        snapshot(&s)
    );
}
