//! Review of how a grant or renewal on a kept connection counts the master's replicas for `WAIT`
//! (`INFO replication` in the script's own write, `src/lock/node.rs`), against real servers.
//!
//! The promise (docs/topologies.md): the replicas in sync are read afresh by every grant and renewal,
//! never fewer than the master had at an earlier grant or renewal, and a grant or renewal counts only
//! once they acknowledged it. A count that is not read afresh lets a renewal
//! count that a replica never acknowledged, which a failover to that replica loses.
//!
//! The renewals are watched through `-v` (`renewed '...'` and `renewal failed` lines, in the order
//! lockctl logs them), so no assertion depends on the machine's speed: a replica stopped with SIGSTOP
//! stays listed `state=online` by its master and can never acknowledge, so any renewal after it was
//! stopped that lockctl counts is one it counted without that replica.
//!
//! Every server here is started by its test and none restarts, so the restart quarantine is off
//! (`LOCKCTL_QUARANTINE=0`, the default of `support::lockctl`): it guards servers that restarted.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::holder::Holder;
use support::*;

/// A field of `INFO section` on `server`, as a number (0 when absent).
fn info_number(server: &Server, section: &str, key: &str, sub: Option<&str>) -> u64 {
    let info: String = server.cmd(&["INFO", section]);
    let Some(line) = info.lines().find(|l| l.starts_with(&format!("{key}:"))) else {
        return 0;
    };
    let value = &line[key.len() + 1..];
    let value = match sub {
        Some(s) => value
            .split(',')
            .find_map(|kv| kv.strip_prefix(&format!("{s}=")))
            .unwrap_or("0"),
        None => value,
    };
    value.trim().parse().unwrap_or(0)
}

impl Holder {
    fn start(master: &Server, name: &str, ttl: &str, secs: &str) -> Holder {
        let holder = Holder::on(
            master,
            &["exec", name, "--ttl", ttl, "-v", "--", "sleep", secs],
        );
        // The grant as lockctl reports it, not the key: an attempt whose `WAIT` a replica just in
        // sync did not answer in time sets the key too, and is rolled back.
        holder.granted(name);
        holder
    }

    /// `lockctl ARGS` on `master`, its stderr collected line by line.
    fn on(master: &Server, args: &[&str]) -> Holder {
        Holder::spawn(lockctl_on(master).args(args))
    }

    /// Waits for lockctl's end: from its `from`th line on, it counted no renewal after the first
    /// that failed, and it exited 76 (the lease lost).
    fn lost_without_counting_after(self, from: usize) {
        let (code, lines) = self.finish();
        let counted = renewed_after(&lines[from..], "renewal failed");
        assert!(counted.is_empty(), "{counted:#?}\n{lines:#?}");
        assert_eq!(code, 76, "{lines:#?}");
    }
}

/// A replica of `master`, once the master lists it in sync.
fn replica_of(master: &Server) -> Server {
    let port = master.port.unwrap().to_string();
    let before = online_replicas(master);
    let replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(30), || online_replicas(master)
            == before + 1),
        "the replica did not come online"
    );
    replica
}

/// The renewals lockctl counted after the first line containing `marker`.
fn renewed_after<'a>(lines: &'a [String], marker: &str) -> Vec<&'a String> {
    let Some(at) = lines.iter().position(|l| l.contains(marker)) else {
        return Vec::new();
    };
    lines[at..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect()
}

/// A renewal the master refuses with an error reply (here an ACL that lost `pexpire` for a while,
/// as an operator's change and its revert would) still carries `INFO replication` in its write. That
/// count must not outlive the call: a replica that joins while the renewals are refused must be
/// waited for by the first renewal that goes through.
#[test]
fn a_replica_that_joins_while_renewals_are_refused_is_waited_for() {
    let master = Server::start_tcp();
    // Renewals every 5 s; a lease of 15 s leaves time to attach a replica while they are refused.
    let holder = Holder::start(&master, "refused", "15s", "40");

    let _: String = master.cmd(&["ACL", "SETUSER", "default", "-pexpire"]);
    // A renewal was refused (lockctl logs it).
    assert!(
        eventually(Duration::from_secs(30), || holder.count("renewal failed")
            >= 1),
        "no refused renewal"
    );
    assert!(
        master.get("lockctl:refused").is_some(),
        "the lease ran out before the replica could join"
    );

    // A replica joins, is in sync, and stops answering (SIGSTOP: still listed online).
    let replica = replica_of(&master);
    replica.pause();
    let marker = holder.lines.lock().unwrap().len();
    // The ACL is put back: renewals are accepted again.
    let _: String = master.cmd(&["ACL", "SETUSER", "default", "+pexpire"]);

    let (code, lines) = holder.finish();
    replica.resume();
    eprintln!("holder: exit {code}");
    let waits = info_number(&master, "commandstats", "cmdstat_wait", Some("calls"));
    let counted: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect();
    assert!(
        counted.is_empty(),
        "renewals counted after the replica joined and stopped, without its acknowledgement \
         (WAIT calls on the master: {waits}): {counted:#?}\n{lines:#?}"
    );
    assert_eq!(code, 76, "{lines:#?}");
}

/// A replica attached between the grant and the renewals: each renewal on the kept connection reads
/// the replicas afresh, so none counts while the new replica cannot acknowledge.
#[test]
fn a_replica_attached_after_the_grant_is_waited_for() {
    let master = Server::start_tcp();
    let holder = Holder::start(&master, "joined", "3s", "60");
    let replica = replica_of(&master);
    replica.pause();
    let marker = holder.lines.lock().unwrap().len();
    let (code, lines) = holder.finish();
    replica.resume();
    // A renewal in flight when the replica stopped may have been acknowledged; none after it.
    let counted = renewed_after(&lines[marker..], "renewal failed");
    assert!(counted.is_empty(), "{counted:#?}\n{lines:#?}");
    assert_eq!(code, 76, "{lines:#?}");
}

/// A replica detached after the grant (`REPLICAOF NO ONE` on it: it could be the one promoted):
/// the master has fewer replicas than at the grant, and no renewal counts there.
#[test]
fn a_replica_detached_after_the_grant_stops_the_renewals() {
    let master = Server::start_tcp();
    let replica = replica_of(&master);
    let holder = Holder::start(&master, "detached", "3s", "60");
    let _: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert!(eventually(Duration::from_secs(30), || online_replicas(
        &master
    ) == 0));
    let marker = holder.lines.lock().unwrap().len();
    holder.lost_without_counting_after(marker);
}

/// A replica killed -9 after the grant: the master drops it at once (its connection closes), and
/// the renewals stop counting on a master with fewer replicas than it had.
#[test]
fn a_replica_killed_after_the_grant_stops_the_renewals() {
    let master = Server::start_tcp();
    let mut replica = replica_of(&master);
    let holder = Holder::start(&master, "killed", "3s", "60");
    replica.kill();
    assert!(eventually(Duration::from_secs(30), || online_replicas(
        &master
    ) == 0));
    let marker = holder.lines.lock().unwrap().len();
    holder.lost_without_counting_after(marker);
}

/// The same on a waiting `exec`'s grant: its attempts on the kept connection are refused with an
/// error reply (OOM: `maxmemory` reached, which stops the queue's writes but not the holder), a
/// replica joins meanwhile and stops answering, memory is freed and the holder releases. The grant
/// that follows must wait for that replica; it cannot acknowledge, so no grant may count.
#[test]
fn a_replica_that_joins_while_a_waiters_attempts_are_refused_is_waited_for() {
    let master = Server::start_tcp();
    let held = acquire_json(&mut lockctl_on(&master), "oom", &["--ttl", "60s"]);
    let token = held["token"].as_str().unwrap().to_string();
    let waiter = Holder::on(&master, &["exec", "oom", "-w", "15s", "-v", "--", "true"]);
    assert!(
        eventually(Duration::from_secs(30), || waiter.count("attempt on 'oom'")
            >= 1),
        "the waiter never tried"
    );

    let _: String = master.cmd(&["CONFIG", "SET", "maxmemory", "1"]);
    assert!(
        eventually(Duration::from_secs(30), || waiter.count("OOM") >= 1),
        "no refused attempt: {:#?}",
        waiter.lines.lock().unwrap()
    );

    let replica = replica_of(&master);
    replica.pause();
    let _: String = master.cmd(&["CONFIG", "SET", "maxmemory", "0"]);
    let marker = waiter.lines.lock().unwrap().len();
    let o = run(lockctl_on(&master).args(["release", "oom", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let (code, lines) = waiter.finish();
    replica.resume();
    eprintln!("waiter: exit {code}");
    let granted: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("acquired 'oom'"))
        .collect();
    assert!(
        granted.is_empty(),
        "a grant counted while the only replica could not acknowledge it: {granted:#?}\n{lines:#?}"
    );
    assert_ne!(code, 0, "{lines:#?}");
}

/// Grants and renewals with the script flushed from the master over and over (`SCRIPT FLUSH` in a
/// loop): each EVALSHA that misses goes out again as EVAL on the same connection, after the
/// `INFO replication` of its write was read; the lock keeps working and every grant or renewal
/// lockctl counts was followed by a `WAIT` for the replica.
#[test]
fn renewals_under_a_loop_of_script_flushes_still_wait_for_the_replica() {
    let master = Server::start_tcp();
    let _replica = replica_of(&master);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let stop = Arc::clone(&stop);
        let mut conn = master.conn();
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _: () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut conn).unwrap();
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let holder = Holder::start(&master, "flushed", "1s", "3");
    let (code, lines) = holder.finish();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flusher.join().unwrap();
    assert_eq!(code, 0, "{lines:#?}");
    let renewed = lines.iter().filter(|l| l.contains("renewed '")).count() as u64;
    let waits = info_number(&master, "commandstats", "cmdstat_wait", Some("calls"));
    let missed = info_number(&master, "errorstats", "errorstat_NOSCRIPT", Some("count"));
    eprintln!("{renewed} renewals counted, {waits} WAIT, {missed} NOSCRIPT");
    assert!(renewed >= 3, "{lines:#?}");
    assert!(missed >= 1, "the scripts were never missing");
    // The grant and each renewal counted.
    assert!(
        waits > renewed,
        "{waits} WAIT for {renewed} renewals and a grant"
    );
}

/// `INFO` taken away by an ACL while a holder runs, on a master with a replica: the renewals
/// cannot count the replicas, so none counts, and the lease is lost.
#[test]
fn info_denied_mid_run_stops_the_renewals() {
    let master = Server::start_tcp();
    let _replica = replica_of(&master);
    let holder = Holder::start(&master, "noinfo", "3s", "60");
    let _: String = master.cmd(&["ACL", "SETUSER", "default", "-info"]);
    let marker = holder.lines.lock().unwrap().len();
    holder.lost_without_counting_after(marker);
}

/// The holder's connection killed over and over (`CLIENT KILL TYPE normal`), on a master with a
/// replica: a renewal whose connection drops between the script and `WAIT` must not count; every
/// renewal lockctl counts was followed by a `WAIT` that the replica answered.
#[test]
fn renewals_with_their_connection_killed_over_and_over_still_wait() {
    let master = Server::start_tcp();
    let _replica = replica_of(&master);
    let holder = Holder::start(&master, "killed-conn", "1s", "4");
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = {
        let stop = Arc::clone(&stop);
        let mut conn = master.conn();
        std::thread::spawn(move || {
            let mut kills = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let n: i64 = redis::cmd("CLIENT")
                    .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
                    .query(&mut conn)
                    .unwrap();
                kills += n;
                std::thread::sleep(Duration::from_millis(3));
            }
            kills
        })
    };
    let (code, lines) = holder.finish();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = killer.join().unwrap();
    assert!(kills > 0, "no connection was killed");
    assert!(code == 0 || code == 76, "{code}: {lines:#?}");
    let renewed = lines.iter().filter(|l| l.contains("renewed '")).count() as u64;
    let waits = info_number(&master, "commandstats", "cmdstat_wait", Some("calls"));
    assert!(
        waits > renewed,
        "{waits} WAIT for {renewed} renewals and a grant (connections killed: {kills})"
    );
    eprintln!(
        "killed {kills} connection(s); {renewed} renewals counted, {waits} WAIT, exit {code}"
    );
}

/// A server where `INFO` is renamed away (`rename-command INFO ""`): lockctl cannot check the server
/// or count its replicas, so it refuses (78) with a message that names INFO, and leaves no lock
/// behind (the grant that went out with the INFO is rolled back).
#[test]
fn a_server_without_info_refuses_and_keeps_no_lock() {
    let master = Server::with_args(&["--rename-command", "INFO", ""]);
    for args in [
        &["acquire", "renamed", "-n"][..],
        &["exec", "renamed", "-n", "--", "true"][..],
    ] {
        let o = run(lockctl_on(&master).args(args));
        assert_eq!(code(&o), 78, "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("INFO"), "{}", stderr(&o));
        let left: Vec<String> = master
            .keys()
            .into_iter()
            .filter(|k| k.contains("renamed"))
            .collect();
        assert!(
            master.get("lockctl:renamed").is_none(),
            "{args:?} left the lock: {left:?}"
        );
    }
}

/// `?replicas=N` below the replicas in sync still waits for N of them: a master with two replicas,
/// both stopped (still listed in sync), must not count a grant that `?replicas=1` asked one of them
/// to acknowledge. None can, so the grant is unavailable (69) and rolled back.
#[test]
fn fewer_replicas_asked_than_in_sync_are_still_waited_for() {
    let master = Server::start_tcp();
    let replicas = [replica_of(&master), replica_of(&master)];
    for r in &replicas {
        r.pause();
    }
    let url = format!("{}?replicas=1", master.url());
    let o = run(lockctl()
        .args(["-r", &url, "--node-timeout", "1s"])
        .args(["acquire", "asked", "-n"]));
    for r in &replicas {
        r.resume();
    }
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("only 0 of 1 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );
    assert!(
        eventually(Duration::from_secs(10), || master
            .get("lockctl:asked")
            .is_none()),
        "the unacknowledged grant was left in place"
    );
}

/// A replica still waiting for its first full copy cannot acknowledge anything yet, so it is not
/// counted: the master (diskless sync after a 60 s delay, so the replica stays in `wait_bgsave`)
/// grants at once, without a `WAIT` that could only time out.
#[test]
fn a_replica_still_syncing_is_not_waited_for() {
    let master = Server::tcp_with_args(&["--repl-diskless-sync", "yes"]);
    let _: String = master.cmd(&["CONFIG", "SET", "repl-diskless-sync-delay", "60"]);
    let port = master.port.unwrap().to_string();
    let _replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(30), || {
            let info: String = master.cmd(&["INFO", "replication"]);
            info.contains("slave0:") && !info.contains("state=online")
        }),
        "the replica never asked for its copy"
    );
    let o =
        run(lockctl_on(&master).args(["-v", "acquire", "syncing", "-n", "--node-timeout", "2s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        online_replicas(&master),
        0,
        "the replica got its copy during the test"
    );
}

/// A replica that never acknowledges (stopped with SIGSTOP: still listed online) is reported by
/// count, "only 0 of 1 replica(s) acknowledged", not as a `WAIT` that got no answer. A server
/// answers a timed-out `WAIT` only at its next cron tick (every 1000/hz ms), so lockctl's `WAIT`
/// must end at least that long before the node timeout for its answer to be read. Found in CI:
/// with twelve replicas, hz 10 and the 500 ms node timeout, the answer came after lockctl's read
/// had given up. Whether it does depends on where between two ticks the grant starts: each try
/// here starts a chosen part of a tick after the last answer (which came at a tick), for hz 10 with
/// the default node timeout and for hz 2 (a tick every 500 ms) with a node timeout of 2 s. Each
/// grant fails as unavailable (69), rolled back, naming the count.
#[test]
fn a_replica_that_never_acknowledges_is_counted_within_the_node_timeout() {
    for (hz, node_timeout) in [(10, "500ms"), (2, "2s")] {
        let master = Server::tcp_with_args(&["--hz", &hz.to_string()]);
        let replica = replica_of(&master);
        replica.pause();
        let tick = Duration::from_millis(1000 / hz);
        for (n, part) in [0.0, 0.6, 0.2, 0.8, 0.45].into_iter().enumerate() {
            std::thread::sleep(tick.mul_f64(part));
            let name = format!("uncounted{hz}x{n}");
            let o = run(lockctl().args([
                "-r",
                &master.url(),
                "--node-timeout",
                node_timeout,
                "-v",
                "acquire",
                &name,
                "-n",
            ]));
            assert_eq!(code(&o), 69, "hz {hz}: {}", stderr(&o));
            assert!(
                stderr(&o).contains("only 0 of 1 replica(s) acknowledged"),
                "hz {hz}, {part} of a tick after the last answer: {}",
                stderr(&o)
            );
            assert_eq!(master.get(&format!("lockctl:{name}")), None, "rolled back");
        }
        replica.resume();
    }
}
