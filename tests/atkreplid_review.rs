//! Adversarial review of 84c6b21 ("a plain URL's server whose `master_replid` changed under the same
//! run id counts as a replica since the last read"), against real servers (`REDIS_SERVER`).
//!
//! Results on redis 7.0.15, 6.2 and valkey 8 (`REDIS_SERVER`), the same on all three:
//!
//! FAIL on 84c6b21 (real defects):
//! - false lease losses: a plain master's FIRST replica (or one back after `repl-backlog-ttl` freed
//!   the backlog) makes the master take a new `master_replid` (Redis creates the backlog with a new
//!   id) under the same run id: `a_first_replica_attached_under_a_holder_is_not_a_demotion`,
//!   `a_replica_coming_back_after_the_backlog_ttl_is_not_a_demotion`,
//!   `a_redlock_holder_whose_masters_get_replicas_keeps_its_lease` (all 76, "became a replica");
//! - demotions not seen (two holders): a flip between the grant script and the `INFO` of the same
//!   write is flagged and cleared by `granted()` (`a_flip_between_the_grant_script_and_its_info_is_
//!   cleared_by_the_grant`), or becomes a first grant's baseline (`a_flip_between_a_first_grant_
//!   script_and_its_info_is_the_baseline`); a demotion whose old master comes back as a master by a
//!   restart with its data resets the history (`a_holder_stopped_across_a_demotion_and_a_restart_
//!   with_data_renews_beside_the_new_holder`; not a regression: 56554b6 did the same).
//!
//! Since b9dcfc6 the three false losses and the flip cleared by the grant pass: a changed id counts
//! as a demotion only with `role:slave` or a `master_replid2` (a promotion; a new backlog clears
//! it), and each attempt clears the flag at its start, so one set by the winning attempt's own
//! replies stays. The other two stay, ignored, as known limits (docs/guarantees.md).
//!
//! Pass: a restart with data keeps the lease; a Redlock holder stopped across two flips stops; a
//! flip with the connection dropped is seen; `FAILOVER` under a holder ends it (76) with no second
//! holder; a replica promoted away is not named a demotion; `DEBUG RELOAD`, `SCRIPT FLUSH`,
//! `CONFIG SET`, `REPLICAOF NO ONE` on a master keep the id and the lease; a Sentinel failover and
//! failback under one `exec` are followed (0).
//!
//! Unless a test says otherwise, every server here is started by its test and never restarts, so
//! the restart quarantine is off (`LOCKCTL_QUARANTINE=0`, the default of `support::lockctl`). Tests
//! that restart a server set the quarantine explicitly (`Holder::spawn_q`).

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::holder::{demotion_named, Holder};
use support::topology::{SentinelGroup, MASTER_NAME};
use support::*;

impl Holder {
    /// `lockctl -r URL exec -v NAME --ttl TTL -n -- sleep SECS` with `LOCKCTL_QUARANTINE=q`, once
    /// it reports its grant.
    fn spawn_q(url: &str, name: &str, ttl: &str, secs: &str, q: &str) -> Holder {
        let h = Holder::spawn(
            lockctl()
                .env("LOCKCTL_QUARANTINE", q)
                .args(["-r", url, "exec", name, "--ttl", ttl, "-v", "-n"])
                .args(["--", "sleep", secs]),
        );
        h.granted(name);
        h
    }

    /// As `spawn_q` with the quarantine off (servers started by the test, never restarted).
    fn start(url: &str, name: &str, ttl: &str, secs: &str) -> Holder {
        Holder::spawn_q(url, name, ttl, secs, "0")
    }
}

/// A single plain master, no replica, under an `exec` (TTL 3 s, renewals every second). A replica
/// is then started with `--replicaof` the master: nothing is demoted, the master stays the master
/// and keeps the holder's key, and the replica receives it (a full sync). Redis creates the
/// replication backlog at the first replica's sync and gives the master a NEW `master_replid`
/// then (`changeReplicationId` in `syncCommand`), under the same run id.
///
/// Expected: the holder keeps its lease (0) — adding a replica is routine (docs/topologies.md) and
/// not a demotion. Observed on 84c6b21: see the report.
#[test]
fn a_first_replica_attached_under_a_holder_is_not_a_demotion() {
    let master = Server::start_tcp();
    let before = replid(&master);
    let holder = Holder::start(&master.url(), "att", "3s", "12");
    let port = master.port.unwrap().to_string();
    let _replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(20), || online_replicas(&master) == 1),
        "the replica never came online"
    );
    let after = replid(&master);
    eprintln!("master {before} -> {after}");
    let marker = holder.len();
    let (rc, lines) = holder.finish();
    eprintln!("{:#?}", &lines[marker..]);
    assert_eq!(
        rc, 0,
        "a replica attached to the holder's master (master_replid {before} -> {after}, same \
         run id, never demoted) ended the lease: {lines:#?}"
    );
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// The same on a master that had a replica before: the replica went away (`REPLICAOF NO ONE` on
/// it; or down for maintenance) for longer than `repl-backlog-ttl` (default one hour; 1 s here), so
/// the master freed its backlog. A holder is then granted (no replica connected), and the replica
/// comes back: a new backlog, a new `master_replid` on the master, same run id, nothing demoted.
///
/// Expected: the holder keeps its lease (0).
#[test]
fn a_replica_coming_back_after_the_backlog_ttl_is_not_a_demotion() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let replica = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(20), || online_replicas(&master) == 1),
        "the replica never came online"
    );
    let _: String = master.cmd(&["CONFIG", "SET", "repl-backlog-ttl", "1"]);
    let _: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert!(
        eventually(Duration::from_secs(10), || online_replicas(&master) == 0),
        "the replica did not go"
    );
    // The master's replication cron frees the backlog once it had no replica for 1 s.
    std::thread::sleep(Duration::from_secs(3));
    let holder = Holder::start(&master.url(), "ttl", "3s", "12");
    let before = replid(&master);
    let _: String = replica.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(20), || online_replicas(&master) == 1),
        "the replica never came back"
    );
    let after = replid(&master);
    eprintln!("master {before} -> {after}");
    let (rc, lines) = holder.finish();
    assert_eq!(
        rc, 0,
        "a replica's return (master_replid {before} -> {after}) ended the lease: {lines:#?}"
    );
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// A plain master with its data (`appendonly yes`, `appendfsync always`) restarted in place (kill -9
/// and start again on its AOF) under an `exec`; no demotion. The run id changes, which 84c6b21 says
/// only resets the replication history: the holder must behave as before the change (its key
/// survived: it keeps its lease, 0). Quarantine ON (3 s, explicit; the grant waits it out).
#[test]
fn a_restart_with_data_under_a_holder_is_not_a_demotion() {
    let mut server = Server::tcp_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    std::thread::sleep(Duration::from_millis(5000));
    let holder = Holder::spawn_q(&server.url(), "rsd", "9s", "12", "3s");
    server.restart_in_place();
    assert!(
        server.get("lockctl:rsd").is_some(),
        "the key did not survive"
    );
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 0, "{lines:#?}");
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// The scene 84c6b21 fixes (a holder stopped across a demotion, a second client granted on the
/// master it followed, full sync delayed so the old master keeps the holder's copy), but the old
/// master comes back as a master by a restart with its data (`appendonly yes`, kill -9 and start
/// again on its AOF: `REPLICAOF` is not persisted, so it starts as a master) instead of
/// `REPLICAOF NO ONE`. The run id changes, so the replication history is reset and the demotion is
/// never seen; the holder's key survived the restart. Quarantine ON for the holder (3 s, explicit);
/// the second client's server is never restarted (quarantine 0 there).
///
/// Expected (docs/guarantees.md, "A master turned replica"): the holder stops (76) rather than renew
/// beside the second client. Observed on 84c6b21: see the report.
#[test]
#[ignore = "known limit (docs/guarantees.md): a demotion whose server comes back as a master by a restart with its data is not seen (a new run id starts a new history, and a server restarted with its data is trusted as the same master); not a regression of 84c6b21"]
fn a_holder_stopped_across_a_demotion_and_a_restart_with_data_renews_beside_the_new_holder() {
    let new_master = Server::slow_to_sync();
    let mut old = Server::tcp_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    std::thread::sleep(Duration::from_millis(5000));
    let holder = Holder::spawn_q(&old.url(), "rgap", "9s", "12", "3s");

    kill(holder.pid(), libc::SIGSTOP);
    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let o = run(lockctl_on(&new_master).args(["acquire", "rgap", "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    old.restart_in_place();
    let info: String = old.cmd(&["INFO", "replication"]);
    let role = if info.contains("role:master") {
        "master"
    } else {
        "slave"
    };
    assert_eq!(role, "master");
    assert!(
        old.get("lockctl:rgap").is_some(),
        "the old master lost its copy: this scene did not happen"
    );
    let marker = holder.len();
    kill(holder.pid(), libc::SIGCONT);
    let (rc, lines) = holder.finish();
    let renewed = lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .count();
    eprintln!("{:#?}", &lines[marker..]);
    assert!(
        new_master.get("lockctl:rgap").is_some(),
        "the second client's key is gone"
    );
    assert_eq!(
        rc, 76,
        "the holder renewed {renewed} time(s) on its old master (demoted, restarted with its data) \
         while another client held the lock on the master it had followed: {lines:#?}"
    );
}

/// Redlock over three nodes; the holder's lockctl is stopped (SIGSTOP) while two nodes are flipped
/// (`REPLICAOF` a port where nothing listens, then `REPLICAOF NO ONE`: their own copy of the key
/// kept), then resumed within its lease. Both flips changed `master_replid` under the same run id.
/// Expected: the first renewal after the resume counts 1 of 3 and the holder stops (76), naming the
/// demotion, with no renewal after the resume.
#[test]
fn a_redlock_holder_stopped_across_two_flips_stops() {
    let nodes = [
        Server::start_tcp(),
        Server::start_tcp(),
        Server::start_tcp(),
    ];
    let holder = Holder::start(&urls_of(&nodes), "two", "9s", "14");
    kill(holder.pid(), libc::SIGSTOP);
    for n in &nodes[..2] {
        let _: String = n.cmd(&["REPLICAOF", "127.0.0.1", &nowhere()]);
        let _: String = n.cmd(&["REPLICAOF", "NO", "ONE"]);
    }
    let marker = holder.len();
    kill(holder.pid(), libc::SIGCONT);
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 76, "{lines:#?}");
    assert_eq!(
        lines[marker..]
            .iter()
            .filter(|l| l.contains("renewed '"))
            .count(),
        0,
        "{lines:#?}"
    );
    assert!(demotion_named(&lines), "{lines:#?}");
}

/// The single-node flip while the holder is stopped, and the holder's connection killed too
/// (`CLIENT KILL TYPE normal`): its next renewal opens a new connection and reads the full `INFO`.
/// The history is the node's, not the connection's: expected 76, naming the demotion.
#[test]
fn a_flip_with_the_connection_dropped_is_still_seen() {
    let server = Server::start_tcp();
    let holder = Holder::start(&server.url(), "drop", "9s", "14");
    kill(holder.pid(), libc::SIGSTOP);
    let _: String = server.cmd(&["REPLICAOF", "127.0.0.1", &nowhere()]);
    let _: String = server.cmd(&["REPLICAOF", "NO", "ONE"]);
    let killed: i64 = server.cmd(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed >= 1, "the holder's connection was not killed");
    let marker = holder.len();
    kill(holder.pid(), libc::SIGCONT);
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 76, "{lines:#?}");
    assert_eq!(
        lines[marker..]
            .iter()
            .filter(|l| l.contains("renewed '"))
            .count(),
        0,
        "{lines:#?}"
    );
    assert!(demotion_named(&lines), "{lines:#?}");
}

/// `FAILOVER` (Redis 6.2+) on a plain master with one replica, under an `exec` on the master's
/// plain URL: the master becomes a replica of its promoted replica, a real demotion. Expected: the
/// holder stops (76) naming the demotion; the promoted replica has the holder's key (its grant
/// waited for the replica, `WAIT`), so a second client is refused there while the lease could still
/// be running (75 with `-n`), and nothing but an expiring copy is left after the holder.
#[test]
fn a_failover_command_under_a_holder_ends_it_as_a_demotion() {
    if server_major_version() < 6 {
        return;
    }
    let master = Server::start_tcp();
    let replica = replicas_in_sync(&master, 1).remove(0);
    let holder = Holder::start(&master.url(), "fo", "3s", "30");
    let _: String = master.cmd(&["FAILOVER"]);
    assert!(
        eventually(Duration::from_secs(20), || {
            let info: String = replica.cmd(&["INFO", "replication"]);
            info.contains("role:master")
        }),
        "the replica was never promoted"
    );
    let o = run(lockctl_on(&replica).args(["acquire", "fo", "-n"]));
    assert_ne!(
        code(&o),
        0,
        "a second holder on the promoted replica: {}",
        stderr(&o)
    );
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 76, "{lines:#?}");
    assert!(demotion_named(&lines), "{lines:#?}");
    assert!(
        eventually(Duration::from_secs(10), || replica
            .get("lockctl:fo")
            .is_none()),
        "the holder's key outlived its TTL on the new master"
    );
}

/// A plain master with one replica under an `exec`; the replica is promoted away (`REPLICAOF NO
/// ONE` on it): the master is still the master, its `master_replid` unchanged, its replica gone.
/// The replica-count rule decides (the renewal's WAIT cannot be acknowledged): whatever the exit,
/// the demotion must not be named, since the holder's master never was a replica.
#[test]
fn a_replica_promoted_away_is_not_named_a_demotion_of_the_master() {
    let master = Server::start_tcp();
    let replica = replicas_in_sync(&master, 1).remove(0);
    let holder = Holder::start(&master.url(), "away", "3s", "8");
    let before = replid(&master);
    let _: String = replica.cmd(&["REPLICAOF", "NO", "ONE"]);
    let (rc, lines) = holder.finish();
    eprintln!("exit {rc}: {lines:#?}");
    assert_eq!(before, replid(&master));
    assert!(rc == 0 || rc == 76, "{lines:#?}");
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// Behind Sentinel (`redis+sentinel://`: not a plain URL, so 84c6b21's history is skipped), a planned
/// failover and then a second one (the failback, retried until the Sentinels accept it) under one
/// `exec`: each time the master is found again and the holder's key is there (its grants and
/// renewals waited for the replicas). Expected: the command runs to its end (0), no demotion named.
#[test]
fn a_sentinel_failover_and_failback_under_an_exec_are_followed() {
    let group = SentinelGroup::start();
    let url = group.url();
    let first = group.master_port();
    let holder = Holder::start(&url, "fb", "6s", "45");
    let () = group.sentinels[0]
        .cmd(&["SENTINEL", "FAILOVER", MASTER_NAME])
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || group.master_port() != first),
        "no failover"
    );
    let second = group.master_port();
    // The failback, asked again until a Sentinel carries it out (the first may be refused or
    // aborted while the group still settles after the first failover).
    let mut tries = 0;
    assert!(
        eventually(Duration::from_secs(40), || {
            tries += 1;
            let r: redis::RedisResult<()> =
                group.sentinels[tries % 3].cmd(&["SENTINEL", "FAILOVER", MASTER_NAME]);
            r.is_ok() && eventually(Duration::from_secs(6), || group.master_port() != second)
        }),
        "no failback after {tries} tries"
    );
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 0, "{lines:#?}");
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// A loopback proxy to `127.0.0.1:upstream` that, in a client write carrying a script (`EVAL`/
/// `EVALSHA`) followed by `INFO`, forwards the script first, waits for its reply to pass, and runs
/// `hook` before it forwards the `INFO` (once: the first time `hook` returns true).
fn splitting_proxy(upstream: u16, hook: Arc<dyn Fn() -> bool + Send + Sync>) -> u16 {
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let fired = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let Ok(mut server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let (mut c2, mut s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut s2, &mut c2);
                let _ = c2.shutdown(std::net::Shutdown::Both);
            });
            let hook = Arc::clone(&hook);
            let fired = Arc::clone(&fired);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                loop {
                    let n = match client.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let b = &buf[..n];
                    let info = b.windows(10).position(|w| w == b"$4\r\nINFO\r\n");
                    let script = b.windows(4).position(|w| w == b"EVAL");
                    match (info, script) {
                        (Some(i), Some(s)) if s < i && i >= 4 && !fired.load(Ordering::SeqCst) => {
                            let cut = i - 4;
                            if server.write_all(&b[..cut]).is_err() {
                                break;
                            }
                            std::thread::sleep(Duration::from_millis(100));
                            if hook() {
                                fired.store(true, Ordering::SeqCst);
                            }
                            if server.write_all(&b[cut..]).is_err() {
                                break;
                            }
                        }
                        _ => {
                            if server.write_all(b).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = server.shutdown(std::net::Shutdown::Both);
            });
        }
    });
    port
}

/// A waiter (`exec -w`, its node a plain master M, reached through a proxy) has read M's
/// replication history on its earlier attempts. When the first holder releases, the waiter's grant
/// script runs on M, and only then — between the script and the `INFO` sent in the same write
/// (the proxy holds the `INFO`) — M is made a replica of a new master N (full sync delayed 20 s:
/// M keeps the waiter's fresh key), a second client is granted the lock on N, and M is promoted
/// back. The `INFO` shows M's new `master_replid`: M followed another master AFTER it granted the
/// waiter. 84c6b21 flags the node there and `granted()` clears the flag at once (a flip "while
/// waiting"), so the waiter's renewals count M's copy beside the second client's lock on N.
///
/// The proxy only makes the interleaving deterministic; by hand it is a race within one round trip.
/// Expected (the purpose of 84c6b21): the waiter does not keep a lease (76, or no grant).
/// Observed on 84c6b21: see the report.
#[test]
fn a_flip_between_the_grant_script_and_its_info_is_cleared_by_the_grant() {
    let new_master = Server::slow_to_sync();
    let old = Server::start_tcp();
    let first = acquire_json(&mut lockctl_on(&old), "g", &["-n", "--ttl", "60s"]);
    let first_token = first["token"].as_str().unwrap().to_string();
    let first_value = old.get("lockctl:g").unwrap();

    let (m_url, n_port, n_url) = (
        old.url(),
        new_master.port.unwrap().to_string(),
        new_master.url(),
    );
    let armed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let second_granted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = {
        let (armed, second_granted, first_value) = (
            Arc::clone(&armed),
            Arc::clone(&second_granted),
            first_value.clone(),
        );
        Arc::new(move || {
            use std::sync::atomic::Ordering;
            if !armed.load(Ordering::SeqCst) {
                return false;
            }
            let mut m = redis::Client::open(m_url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let v: Option<String> = redis::cmd("GET").arg("lockctl:g").query(&mut m).unwrap();
            if v.is_none() || v.as_deref() == Some(first_value.as_str()) {
                return false; // not the waiter's grant
            }
            let _: String = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(&n_port)
                .query(&mut m)
                .unwrap();
            let o = run(lockctl().args(["-r", &n_url, "acquire", "g", "-n", "--ttl", "60s"]));
            second_granted.store(code(&o) == 0, Ordering::SeqCst);
            let _: String = redis::cmd("REPLICAOF")
                .arg("NO")
                .arg("ONE")
                .query(&mut m)
                .unwrap();
            true
        }) as Arc<dyn Fn() -> bool + Send + Sync>
    };
    let proxy = splitting_proxy(old.port.unwrap(), hook);
    let waiter = Holder::spawn(
        lockctl()
            .env("LOCKCTL_NODE_TIMEOUT", "3s")
            .args(["-r", &format!("redis://127.0.0.1:{proxy}"), "exec", "g"])
            .args(["--ttl", "9s", "-v", "-w", "40s", "--", "sleep", "10"]),
    );
    // The waiter's first attempts read M's history (and find the lock held).
    assert!(
        eventually(Duration::from_secs(20), || waiter
            .count_from(0, "attempt on 'g'")
            >= 1),
        "the waiter made no attempt: {:#?}",
        waiter.lines.lock().unwrap()
    );
    std::thread::sleep(Duration::from_millis(300));
    armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let o = run(lockctl_on(&old).args(["release", "g", "--token", &first_token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (rc, lines) = waiter.finish();
    eprintln!("{lines:#?}");
    assert!(
        second_granted.load(std::sync::atomic::Ordering::SeqCst),
        "the hook never ran or the second client was refused: this scene did not happen"
    );
    assert!(
        new_master.get("lockctl:g").is_some(),
        "the second client's key is gone"
    );
    let renewed = lines.iter().filter(|l| l.contains("renewed '")).count();
    assert_ne!(
        rc, 0,
        "the waiter was granted on M, M then followed N where a second client was granted, and \
         the waiter renewed {renewed} time(s) on M beside it and ended 0: {lines:#?}"
    );
}

/// Operations on a plain master that are not demotions and (checked here) keep its
/// `master_replid`: `DEBUG RELOAD`, `SCRIPT FLUSH`, `CONFIG SET hz` and `repl-backlog-size`, and
/// `REPLICAOF NO ONE` on a server that is already a master, all under an `exec`. Expected: the
/// holder keeps its lease (0), no demotion named.
#[test]
fn operations_that_keep_the_replication_id_do_not_end_the_lease() {
    let server = Server::with_debug_command();
    let holder = Holder::start(&server.url(), "ops", "3s", "8");
    let before = replid(&server);
    let _: String = server.cmd(&["DEBUG", "RELOAD"]);
    std::thread::sleep(Duration::from_millis(1500));
    let _: String = server.cmd(&["SCRIPT", "FLUSH"]);
    std::thread::sleep(Duration::from_millis(1500));
    let _: String = server.cmd(&["CONFIG", "SET", "hz", "20"]);
    let _: String = server.cmd(&["CONFIG", "SET", "repl-backlog-size", "2mb"]);
    std::thread::sleep(Duration::from_millis(1500));
    let _: String = server.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert_eq!(
        before,
        replid(&server),
        "an operation changed the replication id"
    );
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 0, "{lines:#?}");
    assert!(!demotion_named(&lines), "{lines:#?}");
}

/// The same flip between the grant script and its `INFO`, for a first attempt (`exec -n`, a new
/// connection: the `INFO` after the script is the node's first read, so it becomes the baseline and
/// nothing is compared). Shows the window is the grant's own read, not only `granted()`'s clearing.
/// Expected: the holder does not keep a lease beside the second client (not 0).
#[test]
#[ignore = "known limit (docs/guarantees.md): a demotion and a promotion back, and a grant on the other master, all between a first grant's script and the INFO read in the same write, leave no earlier read to compare with; seeing it would cost a round trip before every first grant"]
fn a_flip_between_a_first_grant_script_and_its_info_is_the_baseline() {
    let new_master = Server::slow_to_sync();
    let old = Server::start_tcp();
    // The scripts cached on M first (another name): the grant goes out as EVALSHA + INFO in one
    // write (on a fresh server it is EVALSHA, NOSCRIPT, then EVAL alone).
    let o = run(lockctl_on(&old).args(["exec", "warm", "-n", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let (m_url, n_port, n_url) = (
        old.url(),
        new_master.port.unwrap().to_string(),
        new_master.url(),
    );
    let second_granted = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hook = {
        let second_granted = Arc::clone(&second_granted);
        Arc::new(move || {
            let mut m = redis::Client::open(m_url.as_str())
                .unwrap()
                .get_connection()
                .unwrap();
            let v: Option<String> = redis::cmd("GET").arg("lockctl:f").query(&mut m).unwrap();
            if v.is_none() {
                return false;
            }
            let _: String = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(&n_port)
                .query(&mut m)
                .unwrap();
            let o = run(lockctl().args(["-r", &n_url, "acquire", "f", "-n", "--ttl", "60s"]));
            second_granted.store(code(&o) == 0, std::sync::atomic::Ordering::SeqCst);
            let _: String = redis::cmd("REPLICAOF")
                .arg("NO")
                .arg("ONE")
                .query(&mut m)
                .unwrap();
            true
        }) as Arc<dyn Fn() -> bool + Send + Sync>
    };
    let proxy = splitting_proxy(old.port.unwrap(), hook);
    let holder = Holder::spawn(
        lockctl()
            .env("LOCKCTL_NODE_TIMEOUT", "3s")
            .args(["-r", &format!("redis://127.0.0.1:{proxy}"), "exec", "f"])
            .args(["--ttl", "9s", "-v", "-n", "--", "sleep", "10"]),
    );
    let (rc, lines) = holder.finish();
    eprintln!("{lines:#?}");
    assert!(
        second_granted.load(std::sync::atomic::Ordering::SeqCst),
        "the hook never ran or the second client was refused: this scene did not happen"
    );
    assert!(
        new_master.get("lockctl:f").is_some(),
        "the second client's key is gone"
    );
    let renewed = lines.iter().filter(|l| l.contains("renewed '")).count();
    assert_ne!(
        rc, 0,
        "granted on M, M then followed N where a second client was granted; the holder renewed \
         {renewed} time(s) on M beside it and ended 0: {lines:#?}"
    );
}

/// Redlock over three plain masters; a first replica is attached to two of them under an `exec`
/// (each master's `master_replid` changes, nothing is demoted). Expected: the holder keeps its lease
/// (0).
#[test]
fn a_redlock_holder_whose_masters_get_replicas_keeps_its_lease() {
    let nodes = [
        Server::start_tcp(),
        Server::start_tcp(),
        Server::start_tcp(),
    ];
    let holder = Holder::start(&urls_of(&nodes), "rr", "3s", "10");
    let ports: Vec<String> = nodes[..2]
        .iter()
        .map(|n| n.port.unwrap().to_string())
        .collect();
    let _replicas: Vec<Server> = ports
        .iter()
        .map(|p| Server::tcp_with_args(&["--replicaof", "127.0.0.1", p]))
        .collect();
    assert!(
        eventually(Duration::from_secs(20), || nodes[..2]
            .iter()
            .all(|n| online_replicas(n) == 1)),
        "the replicas never came online"
    );
    let (rc, lines) = holder.finish();
    assert_eq!(rc, 0, "{lines:#?}");
    assert!(!demotion_named(&lines), "{lines:#?}");
}
