//! Attacks on the resends after a read cut by a stop of lockctl (SIGSTOP, SIGCONT: the read fails
//! with EINTR and the command goes again on a new connection), and on the break's record.
//!
//! Each test holds lockctl in a read by pausing the server, stops lockctl there, lets the server run
//! the first send, changes the world (a break, an expiry and another holder, a restart), and only
//! then continues lockctl, whose resend meets the changed world. The resend must not do twice what
//! matters, and the exit code must tell the truth about what happened.

mod support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use support::hammer::{
    holding_proxy, reading_a_socket, stop_in_a_read, two_scripts, warm_with_break, Traced,
};
use support::*;

/// A lockctl run that has hung.
const BOUND: Duration = Duration::from_secs(30);

fn pttl(s: &Server, key: &str) -> i64 {
    s.cmd(&["PTTL", key])
}

/// The first renewal of an `exec` after its server restarted with its data (AOF) runs, and its
/// reply is cut by a stop; meanwhile an operator breaks the lock; the server is past its restart
/// quarantine when the renewal goes again. The holder never learnt the server's new run id (the
/// reply that carried it was cut), so the resend looks like a renewal after a restart that lost the
/// key, and `renew.lua` may put the key back: a renewal must never revive a key after a break. The
/// quarantine stays on (1 s) throughout.
#[test]
fn a_renewal_sent_again_after_a_break_does_not_revive_the_lock() {
    let mut s = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    warm_with_break(&s);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    let name = "revived";
    let key = slot_key(name, 1);
    // The server has just started: the grant waits out the quarantine.
    let exec = Traced::spawn(
        lockctl_on(&s)
            .env("LOCKCTL_QUARANTINE", "1s")
            .args([
                "-v",
                "--node-timeout",
                "10s",
                "exec",
                name,
                "--ttl",
                "15s",
                "--kill-after",
                "1s",
                "-c",
            ])
            .arg(format!(
                "echo $LOCKCTL_TOKEN > '{}'; exec sleep 120",
                token_file.display()
            )),
        BOUND,
    );
    assert!(
        eventually(BOUND, || std::fs::read_to_string(&token_file)
            .is_ok_and(|t| t.trim().len() == 32)),
        "the job never ran: {}",
        exec.trace()
    );
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    // Just after a renewal, so the next one (every 5 s) comes only after the restart.
    let before = exec.count("renew in");
    assert!(
        eventually(BOUND, || exec.count("renew in") > before),
        "no renewal: {}",
        exec.trace()
    );
    s.restart_in_place();
    assert_eq!(
        s.get(&key).as_deref(),
        Some(token.as_str()),
        "AOF lost the key"
    );
    // The restart emptied the script cache: a NOSCRIPT first send would run nothing.
    warm_with_break(&s);
    let (left, then) = (pttl(&s, &key), std::time::Instant::now());
    // Without a renewal the key's time left only goes down; the renewal (5 s later) puts it back.
    let unrenewed = || left - then.elapsed().as_millis() as i64;
    s.pause();
    stop_in_a_read(exec.pid(), BOUND);
    s.resume();
    assert!(
        eventually(BOUND, || pttl(&s, &key) > unrenewed() + 2000),
        "the renewal's first send never ran ({left} ms then, {} ms now): {}",
        pttl(&s, &key),
        exec.trace()
    );
    let o = run(lockctl_on(&s).args(["break", name, "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get(&key), None);
    // Past the 1 s quarantine (the server's uptime reads up to a second high).
    assert!(eventually(BOUND, || s.uptime() >= 3));
    kill(exec.pid(), libc::SIGCONT);
    // The resend runs at once; a revived key would then stay for the lease's TTL.
    std::thread::sleep(Duration::from_secs(2));
    let now = s.get(&key);
    let alive = Some(alive(exec.pid()));
    assert_ne!(
        now.as_deref(),
        Some(token.as_str()),
        "the renewal sent again put back the key the operator broke (job still running: \
         {alive:?}): {}",
        exec.trace()
    );
    let (exit, _, trace) = exec.finish();
    assert_eq!(exit, 76, "{trace}");
}

/// `lockctl renew` whose renewal ran (its reply held back by a proxy and the read cut by a stop),
/// then the lock is broken, then the renewal goes again: the key stays gone, and the exit says the
/// lease is not held (76).
#[test]
fn a_renew_sent_again_after_a_break_stays_broken() {
    let s = Server::start_tcp();
    warm_with_break(&s);
    let name = "renew-broken";
    let key = slot_key(name, 1);
    let token = queue::hold(&mut lockctl_on(&s), name);
    // `renew --token` finds its slot first (one script), then renews (the second).
    let port = holding_proxy(s.port.unwrap(), two_scripts);
    let renew = Traced::spawn(
        lockctl()
            .env("LOCKCTL_REDIS", format!("redis://127.0.0.1:{port}"))
            .args([
                "-v",
                "--node-timeout",
                "20s",
                "renew",
                name,
                "--token",
                &token,
                "--ttl",
                "600s",
            ]),
        BOUND,
    );
    assert!(
        eventually(BOUND, || pttl(&s, &key) > 100_000),
        "the renewal's first send never ran"
    );
    stop_in_a_read(renew.pid(), BOUND);
    let o = run(lockctl_on(&s).args(["break", name, "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    kill(renew.pid(), libc::SIGCONT);
    let (exit, _, trace) = renew.finish();
    eprintln!("exit {exit}\n{trace}");
    assert!(trace.contains("reconnecting"), "not sent again: {trace}");
    assert_eq!(s.get(&key), None, "the renewal revived the key: {trace}");
    assert_eq!(exit, 76, "{trace}");
}

/// `acquire -n --ttl 2s` whose grant ran and whose reply is cut by a stop that outlasts the TTL:
/// the key expires, another client takes the lock, then the grant goes again. It must not report
/// a grant (the other holds the lock), and must leave the other's lock alone.
#[test]
fn a_grant_sent_again_after_its_key_was_taken_is_not_reported() {
    let s = Server::start();
    warm_with_break(&s);
    let name = "taken";
    let key = slot_key(name, 1);
    s.pause();
    let acquire = Traced::spawn(
        lockctl_on(&s).args([
            "-v",
            "--node-timeout",
            "20s",
            "acquire",
            name,
            "-n",
            "--ttl",
            "2s",
        ]),
        BOUND,
    );
    let mut other = String::new();
    acquire.cut_once(&s, || {
        assert!(
            eventually(BOUND, || s.get(&key).is_some()),
            "the first send never ran"
        );
        let o = run(lockctl_on(&s).args(["acquire", name, "-w", "30s", "--ttl", "60s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        other = stdout(&o);
    });
    let (exit, out, trace) = acquire.finish();
    eprintln!("exit {exit}\n{trace}");
    assert_ne!(
        exit, 0,
        "a grant reported while another held the lock: {out}\n{trace}"
    );
    assert!(out.is_empty(), "{trace}");
    assert_eq!(s.get(&key).as_deref(), Some(other.as_str()), "{trace}");
    assert!(
        [75, 69].contains(&exit),
        "exit {exit}, not busy or unavailable: {trace}"
    );
}

/// `acquire -n` whose grant ran and whose reply is cut by a stop; meanwhile the server restarts
/// without its data. The grant goes again to a server in its restart quarantine (on: 3 s, the
/// server first let past it): it must not count, so no grant is reported, and nothing of the
/// attempt stays on the server.
#[test]
fn a_grant_sent_again_to_a_server_restarted_empty_is_quarantined() {
    let mut s = Server::start();
    warm_with_break(&s);
    assert!(eventually(BOUND, || s.uptime() >= 5));
    let name = "restarted";
    let key = slot_key(name, 1);
    // The server is stopped before lockctl starts: stopped after it, a lockctl given the CPU first
    // could finish its acquire before the stop (this failed a full run on a loaded machine).
    s.pause();
    let acquire = Traced::spawn(
        lockctl_on(&s).env("LOCKCTL_QUARANTINE", "3s").args([
            "-v",
            "--node-timeout",
            "20s",
            "acquire",
            name,
            "-n",
            "--ttl",
            "30s",
        ]),
        BOUND,
    );
    stop_in_a_read(acquire.pid(), BOUND);
    s.resume();
    assert!(
        eventually(BOUND, || s.get(&key).is_some()),
        "the first send never ran"
    );
    s.restart_empty();
    kill(acquire.pid(), libc::SIGCONT);
    let (exit, out, trace) = acquire.finish();
    eprintln!("exit {exit}\n{trace}");
    assert!(trace.contains("reconnecting"), "not sent again: {trace}");
    assert_ne!(
        exit, 0,
        "a grant on a server in its restart quarantine reported: {out}\n{trace}"
    );
    assert!(out.is_empty(), "{trace}");
    assert!(
        eventually(Duration::from_secs(10), || s.get(&key).is_none()),
        "the attempt left the lock held: {trace}"
    );
}

/// `break --yes` whose reply is cut by a stop that outlasts its node timeout (1 s) but not its
/// record (twice the node timeout and a second): the first send ran and let the waiter in. No
/// second send may go (the call's time is up), so the waiter keeps the lock; the exit code is
/// what lockctl can know, a break that may have run (69), or the break's report (0).
#[test]
fn a_break_stopped_past_its_node_timeout_breaks_nothing_more() {
    let s = Server::start();
    warm_with_break(&s);
    let name = "late-break";
    let key = slot_key(name, 1);
    let dir = tempfile::tempdir().unwrap();
    let entered = dir.path().join("entered");
    let first = queue::hold(&mut lockctl_on(&s), name);
    let mut waiter = lockctl_on(&s);
    waiter
        .args(["exec", name, "--ttl", "30s", "-c"])
        .arg(format!("touch '{}'; sleep 30", entered.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut waiter = waiter.spawn().unwrap();
    queue::wait_queued(&s, name, 1);
    s.pause();
    let breaker = Traced::spawn(
        lockctl_on(&s).args(["-v", "--node-timeout", "1s", "break", name, "--yes"]),
        BOUND,
    );
    let mut second = None;
    breaker.cut_once(&s, || {
        assert!(
            eventually(BOUND, || entered.exists()),
            "the waiter never got the lock the break freed"
        );
        second = s.get(&key);
        std::thread::sleep(Duration::from_secs(2));
    });
    let second = second.expect("the waiter holds the lock");
    assert_ne!(second, first);
    let (exit, out, trace) = breaker.finish();
    eprintln!("exit {exit}\nstdout: {out}\n{trace}");
    let now = s.get(&key);
    kill(waiter.id() as i32, libc::SIGTERM);
    let _ = waiter.wait();
    assert_eq!(
        now.as_deref(),
        Some(second.as_str()),
        "a break past its time took the lock from the holder its first send let in: {trace}"
    );
    assert!(!out.contains("sh -c touch"), "{out}");
    assert!([0, 69].contains(&exit), "exit {exit}: {trace}");
    if exit == 69 {
        // The operator's next step would be to break again, taking the lock from the waiter.
        assert!(
            trace.contains("may have run"),
            "a break that ran reported only as unavailable: {trace}"
        );
    }
}

/// Stops and continues `pid` every few milliseconds until `done` is set.
fn hammer(pid: i32, done: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut rng = fastrand::Rng::new();
        let mut n = 0;
        while !done.load(Ordering::Relaxed) {
            kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(rng.u64(1..=5)));
            kill(pid, libc::SIGCONT);
            n += 1;
            std::thread::sleep(Duration::from_millis(rng.u64(1..=3)));
        }
        n
    })
}

/// Runs `cmd` under [`hammer`]: its output, the time it took and the stops it took.
fn hammered(cmd: &mut Command) -> (std::process::Output, Duration, u64) {
    let started = std::time::Instant::now();
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let done = Arc::new(AtomicBool::new(false));
    let h = hammer(child.id() as i32, done.clone());
    // Reaped only after the hammer stops, so its pid is never signalled once reused.
    let pid = child.id() as i32;
    assert!(
        eventually(BOUND, || {
            std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
                s.rsplit(')')
                    .next()
                    .is_some_and(|r| r.trim_start().starts_with('Z'))
            })
        }),
        "lockctl never ended"
    );
    done.store(true, Ordering::Relaxed);
    let stops = h.join().unwrap();
    let o = wait_output(child, BOUND);
    (o, started.elapsed(), stops)
}

/// A server with a password, lockctl stopped and continued every few milliseconds, handshake
/// included: the right password still gets the lock and releases it (the cut handshake is made
/// again); a wrong one is still refused (78), promptly, never taken for a cut read and tried until
/// the node timeout (10 s here).
#[test]
fn a_password_server_under_stops() {
    let s = Server::start_tcp();
    let () = s.cmd(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let port = s.port.unwrap();
    let on = |password: &str| {
        let mut c = lockctl();
        c.env(
            "LOCKCTL_REDIS",
            format!("redis://:{password}@127.0.0.1:{port}"),
        )
        .args(["--node-timeout", "10s"]);
        c
    };
    let mut stops = 0;
    for _ in 0..10 {
        let (o, took, n) = hammered(on("hunter2zz").args(["acquire", "pw", "-n"]));
        stops += n;
        let err = stderr(&o);
        assert_eq!(code(&o), 78, "{err}");
        assert!(!err.contains("hunter2zz"), "the password shows: {err}");
        assert!(
            took < Duration::from_secs(9),
            "refused only after {took:?}: {err}"
        );
    }
    let key = slot_key("pw", 1);
    let get = || -> Option<String> {
        let mut c = redis::Client::open(format!("redis://:s3cret@127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("GET").arg(&key).query(&mut c).unwrap()
    };
    for _ in 0..10 {
        let (o, _, n) = hammered(on("s3cret").args(["acquire", "pw", "-n"]));
        stops += n;
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let token = stdout(&o);
        assert_eq!(get().as_deref(), Some(token.as_str()));
        let (o, _, n) = hammered(on("s3cret").args(["release", "pw", "--token", &token]));
        stops += n;
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert_eq!(get(), None);
    }
    eprintln!("{stops} stops");
}

/// A lock on a Redis Cluster reached through a node that does not own its slot: every send is
/// redirected (MOVED) to the owner. The owner paused (briefly: below the cluster's 2 s node
/// timeout, so no failover) holds lockctl in its read there, and lockctl is stopped and continued
/// in it several times: each cut read goes again through the URL's node and its MOVED. A stop is
/// not a redirect loop: the renewal that ran is reported (0), not refused as a cluster whose slot
/// map keeps changing (78).
#[test]
fn a_call_cut_repeatedly_through_a_redirect_is_not_a_redirect_loop() {
    let cluster = support::topology::Cluster::start();
    let name = "hops";
    let key = format!("lockctl:{name}");
    let owner = cluster.owner(&key);
    let url = format!("redis://127.0.0.1:{}", cluster.not_owner(&key));
    let on = || support::topology::lockctl_on_url(&url);
    let token = stdout(&run(on().args(["acquire", name, "-n", "--ttl", "60s"])));
    assert_eq!(token.len(), 32);
    // The owner caches the renewal script: a first send that runs, not one answered NOSCRIPT.
    let o = run(on().args(["renew", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let owner_pid = cluster
        .nodes
        .iter()
        .find(|n| n.port == owner)
        .expect("the owner")
        .pid();
    let renew = Traced::spawn(
        on().args([
            "-v",
            "--node-timeout",
            "30s",
            "renew",
            name,
            "--token",
            &token,
            "--ttl",
            "600s",
        ]),
        BOUND,
    );
    kill(owner_pid, libc::SIGSTOP);
    let mut cuts = 0;
    while cuts < 8 && renew.count("moved to") < 7 {
        // Not waiting for a reply any more: it has ended (refused, on the code before).
        if !eventually(Duration::from_secs(5), || reading_a_socket(renew.pid())) {
            break;
        }
        stop_in_a_read(renew.pid(), BOUND);
        kill(renew.pid(), libc::SIGCONT);
        cuts += 1;
        let moved = renew.count("moved to");
        // The resend's MOVED, or the next read (its connection to the owner) cut again.
        eventually(Duration::from_secs(2), || {
            renew.count("moved to") > moved || renew.count("reconnecting") >= cuts
        });
    }
    kill(owner_pid, libc::SIGCONT);
    let (exit, out, trace) = renew.finish();
    eprintln!("exit {exit} after {cuts} cuts\n{trace}");
    assert_eq!(
        exit, 0,
        "a renewal cut {cuts} times by stops reported as failed: {trace}"
    );
    assert!(!out.is_empty());
    let o = run(on().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}
