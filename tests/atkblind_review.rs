//! Attack on the rollback of an attempt whose outcome is unknown and on what a signalled waiter
//! says about its place (`node.rs` `Owed`, `send_only`, `send_on_new` with `AUTH` and `SELECT` in
//! the rollback's write, `left_behind` for a call cut by a stop of lockctl), with real servers
//! stopped by SIGSTOP and lockctl itself stopped and continued every few milliseconds.
//!
//! Breaks (two fixed since, one left open: the ignored tests): - on a unix socket, a server stopped and resumed
//! reads a connection closed meanwhile once (16 KB) and frees it at the first reply it cannot
//! write. `send_on_new` puts `AUTH` (or `SELECT`) in front of the rollback in the same write:
//! `AUTH` completes in that first read and its reply ends the connection, so a rollback whose write
//! passes 16 KB (a prefix and a name at their limits) never runs, and neither does the leave behind
//! it. Without `AUTH` or `SELECT` nothing is answered before the script has been read whole, and it
//! runs. Measured outside lockctl too (Redis 7.0, one write, closed before the resume): `EVAL` of 8
//! KB and 20 KB alone ran; behind `AUTH` 8 KB ran and 20 KB was lost. A stray grant nobody holds
//! then keeps the lock for its TTL, and a waiter signalled behind the rollback says its place was
//! given up while it stays queued (`Owed` counts the first write's 16 KB reads, not the end of the
//! connection at `AUTH`'s reply);
//! - the script behind a pipelined `AUTH` runs whatever the `AUTH` answers: when it fails (the
//!   user's password rotated while lockctl ran, its old connection still logged in) the rollback
//!   runs as the connection's `default` user (`ACL LOG`: `cmd=eval user=default`), where a normal
//!   connect stops at the failed `AUTH`.
//!
//! On the code before the new connection took `AUTH` and `SELECT` (5507d26^) the three unix tests
//! at the limits fail too, as does the 512-byte name (the rollback went on the old connection
//! alone); the failed `AUTH` cannot arise there (no bare connection: its test stops at "no rollback
//! went out on a new connection"). So the limit case is older than this change, and the `default`
//! user's run comes with it.
//!
//! What held: lockctl stopped every 3 ms through acquire, renew and release on one live node and on
//! Redlock 3 (thousands of cut reads, with servers busy in 30 ms and 150 ms scripts): no lost
//! grant, no stray, no renewal or release that said "not ours" while it was, no tombstone blocking
//! the next grant, and `exec` kept its lease through cut renewals (a release under such stops may
//! answer 69, unavailable, which is not a lie); over TCP with a password, the cut attempt in a
//! stall, a waiter cut then signalled, database 2, the `default` user disabled, and every size at
//! its limit; a unix socket without `AUTH` or `SELECT` at every size; a 512-byte name under the
//! default prefix. The unix-socket breaks fail the same on Valkey 8 and Redis 6.2 (`REDIS_SERVER`),
//! as does the failed `AUTH`, and atktls_review's tests pass on both.
//!
//! The servers are started here and never restarted, so the restart quarantine is off
//! (`support::lockctl`).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::queue::{queue_key, wait_queued, waiter};
use support::*;

/// Stops and continues `pid` every `period` (stopped for 1 ms of it), as a shell's Ctrl-Z / fg or
/// a busy machine would: each stop cuts the read lockctl blocks in (EINTR). Returns the stops sent.
fn stop_and_continue(
    pid: i32,
    period: Duration,
    done: Arc<AtomicBool>,
) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !done.load(Ordering::Relaxed) {
            kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(1));
            kill(pid, libc::SIGCONT);
            n += 1;
            std::thread::sleep(period);
        }
        n
    })
}

/// Runs `cmd` to its end while it is stopped and continued every `period`.
fn run_stopped(cmd: &mut std::process::Command, period: Duration) -> std::process::Output {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let done = Arc::new(AtomicBool::new(false));
    let stops = stop_and_continue(child.id() as i32, period, done.clone());
    let pid = child.id() as i32;
    let o = wait_output(child, Duration::from_secs(60));
    done.store(true, Ordering::Relaxed);
    stops.join().unwrap();
    kill(pid, libc::SIGCONT);
    CUTS.fetch_add(
        stderr(&o).matches("connection dropped").count(),
        Ordering::Relaxed,
    );
    o
}

/// Reads cut by the stops of [`run_stopped`] (`-v`: "connection dropped"), over every test.
static CUTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A script that keeps the server busy for ARGV[1] microseconds.
const BUSY: &str = "local t = redis.call('TIME') \
    local start = t[1] * 1000000 + t[2] \
    repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] - start > tonumber(ARGV[1])";

/// What went wrong in the rounds of [`live_rounds`].
#[derive(Debug, Default)]
struct Tally {
    rounds: usize,
    acquired: usize,
    /// `acquire` said 0 but a quorum did not hold its token.
    lost_grant: usize,
    /// `acquire` failed and a key stayed behind (a grant nobody holds).
    stray: usize,
    /// `renew` said 0 but the lease was not extended on a quorum.
    renew_lied: usize,
    /// `renew` said 76 (not ours) although a quorum holds the token.
    renew_failed_held: usize,
    /// `renew` or `release` said 69 (too few answers): honest, counted only.
    unavailable: usize,
    /// `release` said 76 (not ours) although its keys were deleted by it.
    release_failed_released: usize,
    /// `release` said 0 and a key of the token stayed.
    release_left: usize,
    /// A plain `acquire -n` right after the round, without stops, was refused.
    blocked_after: usize,
    other: Vec<String>,
}

/// Rounds of acquire, renew and release of one name on `servers` (all of them one lock), each
/// command stopped and continued every `period`; every answer is checked against the servers.
fn live_rounds(
    servers: &[&Server],
    rounds: usize,
    period: Duration,
    busy: Duration,
    name: &str,
) -> Tally {
    // Each server busy in scripts of `busy` most of the time, so that lockctl's reads block long
    // enough for the stops to cut them.
    let busy_us = busy.as_micros() as u64;
    let done = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = servers
        .iter()
        .map(|s| {
            let mut c = s.conn();
            let done = done.clone();
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let _: () = redis::cmd("EVAL")
                        .arg(BUSY)
                        .arg(0)
                        .arg(busy_us)
                        .query(&mut c)
                        .expect("busy script");
                    std::thread::sleep(Duration::from_millis(3));
                }
            })
        })
        .collect();
    let t = live_rounds_busy(servers, rounds, period, name);
    done.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    t
}

fn live_rounds_busy(servers: &[&Server], rounds: usize, period: Duration, name: &str) -> Tally {
    let urls = servers
        .iter()
        .map(|s| s.url())
        .collect::<Vec<_>>()
        .join(",");
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &urls).arg("-v");
        c
    };
    let quorum = servers.len() / 2 + 1;
    let key = format!("lockctl:{name}");
    let holding = |token: &str| {
        servers
            .iter()
            .filter(|s| s.cmd::<Option<String>>(&["GET", &key]).as_deref() == Some(token))
            .count()
    };
    let any_key = || {
        servers
            .iter()
            .filter(|s| s.cmd::<i64>(&["EXISTS", &key]) == 1)
            .count()
    };
    let long_lease = |token: &str| {
        servers
            .iter()
            .filter(|s| {
                s.cmd::<Option<String>>(&["GET", &key]).as_deref() == Some(token)
                    && s.cmd::<i64>(&["PTTL", &key]) > 40_000
            })
            .count()
    };
    let mut t = Tally::default();
    for _ in 0..rounds {
        t.rounds += 1;
        let o = run_stopped(
            cmd().args(["acquire", name, "--ttl", "30s", "-w", "5s"]),
            period,
        );
        let c = code(&o);
        if c != 0 {
            std::thread::sleep(Duration::from_millis(300));
            if any_key() > 0 {
                t.stray += 1;
                t.other
                    .push(format!("acquire {c} with a key left: {}", stderr(&o)));
                for s in servers {
                    let _: i64 = s.cmd(&["DEL", &key]);
                }
            }
            continue;
        }
        t.acquired += 1;
        let token = stdout(&o);
        if holding(&token) < quorum {
            t.lost_grant += 1;
            t.other
                .push(format!("acquire 0 but not held: {}", stderr(&o)));
        }
        let o = run_stopped(
            cmd().args(["renew", name, "--token", &token, "--ttl", "60s"]),
            period,
        );
        let c = code(&o);
        if c == 0 && long_lease(&token) < quorum {
            t.renew_lied += 1;
            t.other
                .push(format!("renew 0 but not renewed: {}", stderr(&o)));
        }
        if c == 69 {
            t.unavailable += 1;
        }
        if c == 76 && holding(&token) >= quorum {
            t.renew_failed_held += 1;
            t.other
                .push(format!("renew {c} while held: {}", stderr(&o)));
        }
        let o = run_stopped(cmd().args(["release", name, "--token", &token]), period);
        let c = code(&o);
        let left = holding(&token);
        if c == 69 {
            t.unavailable += 1;
        }
        if c == 76 && left == 0 {
            t.release_failed_released += 1;
            t.other
                .push(format!("release {c} though released: {}", stderr(&o)));
        }
        if c == 0 && left > 0 {
            t.release_left += 1;
            t.other
                .push(format!("release 0 with {left} key(s) left: {}", stderr(&o)));
        }
        for s in servers {
            let _: i64 = s.cmd(&["DEL", &key]);
        }
        let o = run(cmd().args(["acquire", name, "-n"]));
        if code(&o) != 0 {
            t.blocked_after += 1;
            t.other
                .push(format!("plain acquire after the round: {}", stderr(&o)));
        } else {
            let token = stdout(&o);
            let o = run(cmd().args(["release", name, "--token", &token]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
        }
    }
    eprintln!(
        "{t:#?}\n{} read(s) cut so far",
        CUTS.load(Ordering::Relaxed)
    );
    t
}

fn assert_clean(t: &Tally) {
    assert!(t.acquired > 0, "nothing acquired under the stops: {t:#?}");
    assert_eq!(
        (
            t.lost_grant,
            t.stray,
            t.renew_lied,
            t.renew_failed_held,
            t.release_failed_released,
            t.release_left,
            t.blocked_after
        ),
        (0, 0, 0, 0, 0, 0, 0),
        "{t:#?}"
    );
}

/// Held: one live node, lockctl stopped and continued every 3 ms through acquire, renew and
/// release: every answer matches the server, and no tombstone blocks the next grant.
#[test]
fn one_live_node_with_lockctl_stopped_every_few_ms_tells_the_truth() {
    let s = Server::start();
    let t = live_rounds(
        &[&s],
        12,
        Duration::from_millis(3),
        Duration::from_millis(30),
        "live1",
    );
    assert_clean(&t);
}

/// Held: Redlock of three live nodes, the same stops.
#[test]
fn redlock_of_three_live_nodes_with_lockctl_stopped_every_few_ms_tells_the_truth() {
    let ss = Servers::start(3);
    let t = live_rounds(
        &[&ss[0], &ss[1], &ss[2]],
        10,
        Duration::from_millis(3),
        Duration::from_millis(30),
        "live3",
    );
    assert_clean(&t);
}

/// A server on a loopback TCP port with an ACL user `lk` (password `pw`) that may do everything.
fn server_with_a_user() -> Server {
    let s = Server::start_tcp();
    let _: () = s.cmd(&["ACL", "SETUSER", "lk", "on", ">pw", "~*", "&*", "+@all"]);
    s
}

/// A holder's 3 s lease ends during a 5 s stall of `s`; a single waiter (made by `cmd`, with
/// `-v`) is stopped and continued every 10 ms through the stall (each stop cuts its read on the
/// stalled node, `left_behind`). Returns how long after the resume the waiter was served.
fn served_after_a_stall_with_stops(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
    queue_of: impl Fn(&Server) -> u64,
) -> (Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(cmd().arg("-v"), name, &file, "1", &[]);
    assert!(
        eventually(Duration::from_secs(30), || queue_of(s) == 1),
        "not queued"
    );
    std::thread::sleep(Duration::from_millis(500));
    s.pause();
    let done = Arc::new(AtomicBool::new(false));
    let stops = stop_and_continue(w.id() as i32, Duration::from_millis(8), done.clone());
    std::thread::sleep(Duration::from_secs(5));
    done.store(true, Ordering::Relaxed);
    let stops = stops.join().unwrap();
    kill(w.id() as i32, libc::SIGCONT);
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    let said = stderr(&o);
    assert_eq!(code(&o), 0, "{said}");
    eprintln!("served {took:?} after the resume ({stops} stops of the waiter)");
    (took, said)
}

/// Held: over TCP with a user and password, the waiter's attempt cut by stops in a stall: the
/// reconnect's AUTH gets no answer from the stopped server, and the rollback goes out blind with
/// AUTH on a bare connection; the grant made at the resume is undone.
#[test]
fn with_a_password_an_attempt_cut_by_stops_in_a_stall_is_rolled_back() {
    let s = server_with_a_user();
    let url = format!("redis://lk:pw@127.0.0.1:{}", s.port.unwrap());
    let (took, said) = served_after_a_stall_with_stops(
        &s,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", &url);
            c
        },
        "pwcut",
        |s| s.cmd::<u64>(&["ZCARD", &queue_key("pwcut")]),
    );
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock; the waiter said: {said}"
    );
}

/// One command on `s`'s database `db`.
fn in_db<T: redis::FromRedisValue>(s: &Server, db: u8, args: &[&str]) -> T {
    let mut c = s.conn();
    redis::cmd("SELECT").arg(db).query::<()>(&mut c).unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c).expect("redis command")
}

/// Held: over TCP with a user, a password and database 2, a 480-byte name's attempt that timed
/// out in a stall: AUTH, SELECT and the rollback share one write on a new connection, and the
/// grant made at the resume is undone in database 2.
#[test]
fn with_a_password_and_database_2_an_attempt_timed_out_in_a_stall_is_rolled_back() {
    let s = server_with_a_user();
    let url = format!("redis://lk:pw@127.0.0.1:{}/2", s.port.unwrap());
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let name = "d".repeat(480);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", &name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(&mut cmd(), &name, &file, "1", &[]);
    let q = queue_key(&name);
    assert!(eventually(Duration::from_secs(30), || in_db::<u64>(
        &s,
        2,
        &["ZCARD", &q]
    ) == 1));
    s.pause();
    std::thread::sleep(Duration::from_secs(5));
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
    // Nothing of it went to database 0 as another user would see it.
    let keys: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert!(keys.is_empty(), "keys in database 0: {keys:?}");
}

/// Held (4 of 4): a 480-byte name's attempt timed out in a stall with the `default` user disabled:
/// the rollback's bare connection logs in with `AUTH` first and undoes the grant.
#[test]
fn with_the_default_user_off_a_rollback_on_a_new_connection_runs_as_the_user() {
    let s = server_with_a_user();
    let url = format!("redis://lk:pw@127.0.0.1:{}", s.port.unwrap());
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let mut admin = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    redis::cmd("ACL")
        .arg(&["SETUSER", "default", "off"][..])
        .query::<()>(&mut admin)
        .unwrap();
    let name = "o".repeat(480);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", &name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(&mut cmd(), &name, &file, "1", &[]);
    let q = queue_key(&name);
    assert!(eventually(Duration::from_secs(30), || redis::cmd("ZCARD")
        .arg(&q)
        .query::<u64>(&mut admin)
        .unwrap()
        == 1));
    s.pause();
    std::thread::sleep(Duration::from_secs(5));
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
}

/// Held: a waiter stopped and continued every 10 ms through a stall over TCP with a password
/// (its attempts cut, `left_behind`), then signalled: it never says its place was given up while
/// its entry stays.
#[test]
fn with_a_password_a_waiter_cut_by_stops_then_signalled_in_a_stall_says_the_truth() {
    let s = server_with_a_user();
    let url = format!("redis://lk:pw@127.0.0.1:{}", s.port.unwrap());
    let name = "pwsig";
    let q = queue_key(name);
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let token = support::queue::hold(&mut cmd(), name);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let mut first = waiter(cmd().arg("-v"), name, &file, "1", &[]);
    let (seen, reader) = stderr_so_far(first.stderr.take().unwrap());
    wait_queued(&s, name, 1);
    let second = waiter(&mut cmd(), name, &file, "2", &[]);
    wait_queued(&s, name, 2);
    let ids: Vec<String> = s.cmd(&["ZRANGE", &q, "0", "-1"]);
    s.pause();
    let done = Arc::new(AtomicBool::new(false));
    let stops = stop_and_continue(first.id() as i32, Duration::from_millis(8), done.clone());
    std::thread::sleep(Duration::from_secs(3));
    done.store(true, Ordering::Relaxed);
    stops.join().unwrap();
    kill(first.id() as i32, libc::SIGCONT);
    kill(first.id() as i32, libc::SIGTERM);
    let status = first.wait().unwrap();
    reader.join().unwrap();
    let said = seen.lock().unwrap().clone();
    std::thread::sleep(Duration::from_millis(500));
    s.resume();
    let _: String = s.cmd(&["PING"]);
    std::thread::sleep(Duration::from_millis(300));
    let queued: Vec<String> = s.cmd(&["ZRANGE", &q, "0", "-1"]);
    let o = run(cmd().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(second, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let last = said.lines().last().unwrap_or_default().to_string();
    eprintln!("the signalled waiter: {status:?}: {last}");
    assert!(
        !queued.contains(&ids[0]) || last.contains("could not be withdrawn"),
        "still queued after the resume, and it said: {last}"
    );
}

/// Held. One live node busy in 150 ms scripts (under a third of the node timeout), lockctl stopped
/// and continued every 3 ms: a cut read's resend waits behind the next script, and calls end in
/// timeouts on a live server (`left_behind`, blind rollbacks with tombstones).
#[test]
fn one_slow_live_node_with_lockctl_stopped_every_few_ms_tells_the_truth() {
    let s = Server::start();
    let t = live_rounds(
        &[&s],
        8,
        Duration::from_millis(3),
        Duration::from_millis(150),
        "slow1",
    );
    assert_clean(&t);
}

/// Held: Redlock of three live nodes busy in 150 ms scripts, the same stops.
#[test]
fn redlock_of_three_slow_live_nodes_with_lockctl_stopped_every_few_ms_tells_the_truth() {
    let ss = Servers::start(3);
    let t = live_rounds(
        &[&ss[0], &ss[1], &ss[2]],
        8,
        Duration::from_millis(3),
        Duration::from_millis(150),
        "slow3",
    );
    assert_clean(&t);
}

/// A server on a unix socket with the ACL user `lk` (password `pw`) that may do everything.
fn unix_server_with_a_user() -> Server {
    let s = Server::start();
    let _: () = s.cmd(&["ACL", "SETUSER", "lk", "on", ">pw", "~*", "&*", "+@all"]);
    s
}

/// The longest prefix lockctl takes (511 bytes with its colon), and the queue key of `name` under
/// it.
fn long_prefix(name: &str) -> (String, String) {
    let prefix = format!("{}:", "p".repeat(510));
    let queue = format!("{{{prefix}{name}}}\u{1f}queue");
    (prefix, queue)
}

/// A holder's 3 s lease ends during a 5 s stall while a single waiter made by `cmd` (with `extra`)
/// keeps trying; its attempt that timed out is granted at the resume unless its rollback runs.
/// Returns how long after the resume the waiter was served, and its `-v` trace.
fn served_after_a_stall(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
    queue: &str,
    db: u8,
    extra: &[&str],
) -> (Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(cmd().arg("-v"), name, &file, "1", extra);
    assert!(
        eventually(Duration::from_secs(30), || in_db::<u64>(
            s,
            db,
            &["ZCARD", queue]
        ) == 1),
        "not queued"
    );
    s.pause();
    std::thread::sleep(Duration::from_secs(5));
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    let said = stderr(&o);
    assert_eq!(code(&o), 0, "{said}");
    eprintln!("served {took:?} after the resume");
    (took, said)
}

/// The sizes of what went out without waiting, from a `-v` trace.
fn blind_sends(said: &str) -> Vec<&str> {
    said.lines()
        .filter(|l| l.contains("without waiting") || l.contains("new connection"))
        .collect()
}

/// A waiter with a prefix, a name and a note at their limits whose attempt timed out in a stall of
/// `s` (reached at `url`, the lock in database `db`) is served soon after the resume: its rollback ran.
fn every_size_at_its_limit_is_rolled_back(s: &Server, url: &str, db: u8) {
    let name = "n".repeat(512);
    let note = "x".repeat(512);
    let (prefix, queue) = long_prefix(&name);
    let (took, said) = served_after_a_stall(
        s,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", url).env("LOCKCTL_PREFIX", &prefix);
            c
        },
        &name,
        &queue,
        db,
        &["--note", &note],
    );
    eprintln!("{:#?}", blind_sends(&said));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock; {:#?}",
        blind_sends(&said)
    );
}

/// Break (fails 7 of 7 on Redis 7.0, 1 of 1 on Valkey 8 and on Redis 6.2). On a unix socket with a
/// user and password and every size at its limit (a 511-byte prefix, a 512-byte name, a 512-byte
/// note), the waiter's attempt that timed out in a stall: its rollback goes on a new connection
/// behind `AUTH`, which the server answers after its first read and then drops the connection: the
/// grant made at the resume keeps the lock 30 s.
#[test]
#[ignore = "open: on a unix socket a stopped server reads a closed connection once (16 KB) and AUTH or SELECT in front of the rollback ends it with its reply, so a rollback past 16 KB (prefix, name and note at their limits) is lost and a grant made at the resume keeps the lock for its TTL; it failed the same before (the old connection alone); closing it needs the rollback under 16 KB or the script cached (EVALSHA)"]
fn on_a_unix_socket_with_a_password_every_size_at_its_limit_an_attempt_timed_out_is_rolled_back() {
    let s = unix_server_with_a_user();
    let url = format!("unix://{}?user=lk&pass=pw", s.socket().display());
    every_size_at_its_limit_is_rolled_back(&s, &url, 0);
}

/// Held (7 of 7, and on Valkey 8 and Redis 6.2): the same on a unix socket with neither user nor
/// password: the rollback alone on the new connection, with no reply before it to end the reads.
#[test]
fn on_a_unix_socket_every_size_at_its_limit_an_attempt_timed_out_is_rolled_back() {
    let s = Server::start();
    let url = s.url();
    every_size_at_its_limit_is_rolled_back(&s, &url, 0);
}

/// Break (fails 7 of 7 on Redis 7.0, 1 of 1 on Valkey 8 and on Redis 6.2). The same in database 1
/// of a unix socket with no user or password: `SELECT` goes in front of the rollback.
#[test]
#[ignore = "open: on a unix socket a stopped server reads a closed connection once (16 KB) and AUTH or SELECT in front of the rollback ends it with its reply, so a rollback past 16 KB (prefix, name and note at their limits) is lost and a grant made at the resume keeps the lock for its TTL; it failed the same before (the old connection alone); closing it needs the rollback under 16 KB or the script cached (EVALSHA)"]
fn on_a_unix_socket_in_database_1_every_size_at_its_limit_an_attempt_timed_out_is_rolled_back() {
    let s = Server::start();
    let url = format!("unix://{}?db=1", s.socket().display());
    every_size_at_its_limit_is_rolled_back(&s, &url, 1);
}

/// Held (4 of 4): over TCP with a user and password and every size at its limit: the server reads
/// once more after the read that completed `AUTH`, which takes the rest of the rollback.
#[test]
fn over_tcp_with_a_password_every_size_at_its_limit_an_attempt_timed_out_is_rolled_back() {
    let s = server_with_a_user();
    let url = format!("redis://lk:pw@127.0.0.1:{}", s.port.unwrap());
    every_size_at_its_limit_is_rolled_back(&s, &url, 0);
}

/// Was a break (failed 7 of 7 on Redis 7.0, 1 of 1 on Valkey 8 and on Redis 6.2). On a unix socket
/// with a user and password and every size at its limit, a waiter signalled right behind its
/// rollback: the leave follows the rollback on the new connection, behind `AUTH`, and is lost with
/// it, while the waiter said its place was given up. `AUTH` now counts as that connection's first
/// write (`Owed`), so the leave counts as not sent and the waiter says its place could not be
/// withdrawn.
#[test]
fn on_a_unix_socket_with_a_password_every_size_at_its_limit_the_signalled_waiter_says_the_truth() {
    let s = unix_server_with_a_user();
    let url = format!("unix://{}?user=lk&pass=pw", s.socket().display());
    let name = "n".repeat(512);
    let note = "x".repeat(512);
    let (prefix, queue) = long_prefix(&name);
    let (said, queued) = support::queue::signalled_behind_its_rollback_on(
        &s,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", &url).env("LOCKCTL_PREFIX", &prefix);
            c
        },
        &name,
        &queue,
        0,
        &["--note", &note],
    );
    let last = said.lines().last().unwrap_or_default();
    assert!(
        !queued || last.contains("could not be withdrawn"),
        "still queued after the resume, and it said: {last}"
    );
}

/// Held (4 of 4): on a unix socket with a user and password, the default prefix and a 512-byte name
/// (the longest name): the rollback's write (about 10 KB) stays within the server's first read.
#[test]
fn on_a_unix_socket_with_a_password_a_512_byte_name_an_attempt_timed_out_is_rolled_back() {
    let s = unix_server_with_a_user();
    let url = format!("unix://{}?user=lk&pass=pw", s.socket().display());
    let name = "n".repeat(512);
    let note = "x".repeat(512);
    let (took, said) = served_after_a_stall(
        &s,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", &url);
            c
        },
        &name,
        &queue_key(&name),
        0,
        &["--note", &note],
    );
    eprintln!("{:#?}", blind_sends(&said));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock; {:#?}",
        blind_sends(&said)
    );
}

/// Was a break (failed 7 of 7 on Redis 7.0, 1 of 1 on Valkey 8 and on Redis 6.2). The user's
/// password changed while a waiter runs (a rotation: its connection stays logged in), then a stall
/// in which its attempt times out: the rollback's bare connection sent `AUTH` with the old
/// password, which failed, and the script behind it in the same write ran as the connection's
/// `default` user. The `default` user here may not touch lockctl's keys, so a script run as it
/// shows in `ACL LOG`. Now a rollback that the old, logged-in connection carries goes there alone
/// (no new connection, so no `AUTH` at all); one past what the server reads of it still takes the
/// bare connection, as docs/security.md says.
#[test]
fn a_rollback_whose_auth_fails_runs_nothing_as_the_default_user() {
    let s = unix_server_with_a_user();
    let _: () = s.cmd(&["ACL", "SETUSER", "admin", "on", ">adm", "~*", "&*", "+@all"]);
    let url = format!("unix://{}?user=lk&pass=pw", s.socket().display());
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let name = "rotated";
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut w = waiter(cmd().arg("-v"), name, &file, "1", &[]);
    let (seen, reader) = stderr_so_far(w.stderr.take().unwrap());
    wait_queued(&s, name, 1);
    std::thread::sleep(Duration::from_millis(500));
    let admin_url = format!("unix://{}?user=admin&pass=adm", s.socket().display());
    let mut admin = redis::Client::open(admin_url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let acl = |c: &mut redis::Connection, args: &[&str]| {
        redis::cmd("ACL").arg(args).query::<()>(c).unwrap();
    };
    acl(&mut admin, &["SETUSER", "lk", "resetpass", ">rotated"]);
    acl(
        &mut admin,
        &[
            "SETUSER",
            "default",
            "resetkeys",
            "~other:*",
            "resetchannels",
        ],
    );
    acl(&mut admin, &["LOG", "RESET"]);
    s.pause();
    let behind = eventually(Duration::from_secs(10), || {
        seen.lock().unwrap().contains("sent without waiting")
    });
    std::thread::sleep(Duration::from_millis(500));
    s.resume();
    std::thread::sleep(Duration::from_millis(500));
    let log: redis::Value = redis::cmd("ACL").arg("LOG").query(&mut admin).unwrap();
    kill(w.id() as i32, libc::SIGKILL);
    let _ = w.wait();
    reader.join().unwrap();
    let text = format!("{log:?}");
    // The failed AUTH itself is logged too (`cmd=auth`); a script is `cmd=eval`.
    let as_default = text.matches("cmd=eval user=default").count();
    eprintln!("ACL LOG after the resume: {text}");
    assert!(behind, "no rollback went out in the stall");
    assert!(
        !seen.lock().unwrap().contains("new connection too"),
        "the rollback took a bare connection"
    );
    assert_eq!(
        as_default, 0,
        "something ran as the default user after the failed AUTH: {text}"
    );
}

/// Held (4 of 4, about 10 cut reads a run): `exec` with a 3 s lease running a 5 s child, stopped
/// and continued every 3 ms on a node busy in 30 ms scripts: its renewal thread's reads are cut
/// over and over, and it keeps the lease (exit 0, the key held all along) and releases it at the
/// end.
#[test]
fn exec_stopped_every_few_ms_keeps_its_lease_through_cut_renewals() {
    let s = Server::start();
    let done = Arc::new(AtomicBool::new(false));
    let busy = {
        let mut c = s.conn();
        let done = done.clone();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let _: () = redis::cmd("EVAL")
                    .arg(BUSY)
                    .arg(0)
                    .arg(30_000)
                    .query(&mut c)
                    .expect("busy script");
                std::thread::sleep(Duration::from_millis(3));
            }
        })
    };
    let key = "lockctl:execcut";
    let child = lockctl_on(&s)
        .arg("-v")
        .args(["exec", "execcut", "--ttl", "3s", "-c", "sleep 5"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn exec");
    let pid = child.id() as i32;
    assert!(eventually(Duration::from_secs(10), || s
        .cmd::<i64>(&["EXISTS", key])
        == 1));
    let stop = Arc::new(AtomicBool::new(false));
    let stops = stop_and_continue(pid, Duration::from_millis(3), stop.clone());
    let mut gaps = 0;
    let watch_until = Instant::now() + Duration::from_millis(4500);
    while Instant::now() < watch_until {
        if s.cmd::<i64>(&["EXISTS", key]) == 0 {
            gaps += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    let stops = stops.join().unwrap();
    kill(pid, libc::SIGCONT);
    let o = wait_output(child, Duration::from_secs(60));
    done.store(true, Ordering::Relaxed);
    busy.join().unwrap();
    let said = stderr(&o);
    let cuts = said.matches("connection dropped").count();
    eprintln!(
        "{stops} stops, {cuts} cut reads, exit {:?}",
        o.status.code()
    );
    assert_eq!(gaps, 0, "the key was gone while exec ran: {said}");
    assert_eq!(code(&o), 0, "{said}");
    assert_eq!(s.cmd::<i64>(&["EXISTS", key]), 0, "not released: {said}");
}
