//! Review of lockctl's `INFO` reader (`Info::of` in `src/lock/node.rs`, commit b7114fb) against real
//! servers: what it reads of a reply (role, master, run id, cluster, replicas in sync) must keep the
//! promises of docs/topologies.md on every server of the matrix (`REDIS_SERVER`), over RESP2 and
//! RESP3, whatever the size of the reply.
//!
//! - a master with twelve replicas (`slave0` .. `slave11`, indexes of two digits) waits for all of
//!   them, and a grant that one of them cannot acknowledge does not count;
//! - over RESP3 (`?protocol=3`, where `INFO` is a verbatim string) a replica is refused naming its
//!   master, a master waits for its replica, and one server named twice is found by its run id;
//! - an `INFO` of about 150 KB (3,000 keyspace lines, 100 error kinds, 60 more clients) on a master
//!   and on its replica changes none of that;
//! - a Redis Cluster over RESP3: a replica of the slot's owner (`role:slave`, `cluster_enabled:1`)
//!   is followed, not refused;
//! - a master turned into a (writable, `replica-read-only no`) replica by hand under an `exec`: its
//!   renewals, and a waiter's grant, on the kept connection read `INFO replication`, which says
//!   `role:slave`, and must not count. Both failed on b7114fb (and on a8e71a0, the parser before
//!   it) when the master had no replica at the grant: the kept connection's `INFO replication`
//!   was read for the replica count only. Fixed: a reply that says `role:slave` checks the server
//!   again as a new connection would (refused, or the master found again behind Sentinel); with a
//!   replica at the grant the replica count stopped the renewals already
//!   (`a_master_with_a_replica_turned_replica_stops_the_renewals`).
//! - the same master promoted back (`REPLICAOF NO ONE`) before its copy from the new master came:
//!   the holder's renewals counted there again (a second review, of df046ef). Fixed: a holder's
//!   node refused as a replica answers "not ours" from its first refusal for the rest of the run.
//! - one limit stays, ignored: a `role:master` line put into the Server section through a setting
//!   that takes a line break (valkey's `availability-zone`) hides a writable replica.
//!
//! Every server here is started by its test and none restarts, so the restart quarantine is off
//! (`LOCKCTL_QUARANTINE=0`, the default of `support::lockctl`).

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::holder::Holder;
use support::*;

/// `lockctl -v acquire NAME -n` on `url`.
fn acquire_on(url: &str, name: &str) -> std::process::Output {
    run(lockctl().args(["-r", url, "-v", "acquire", name, "-n"]))
}

/// A master with twelve replicas: `INFO` lists them as `slave0` to `slave11`, all are counted, and
/// a grant waits for all twelve. One of them stopped (SIGSTOP: still listed online, never
/// acknowledging) makes the next grant fail as unavailable (69), rolled back.
#[test]
fn a_master_with_twelve_replicas_waits_for_each() {
    let master = Server::start_tcp();
    let replicas = replicas_in_sync(&master, 12);
    let info: String = master.cmd(&["INFO", "replication"]);
    assert!(info.contains("slave11:"), "{info}");

    let o = acquire_on(&master.url(), "many");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("12 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );

    replicas[11].pause();
    let o = acquire_on(&master.url(), "many2");
    replicas[11].resume();
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("of 12 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );
    assert_eq!(master.get("lockctl:many2"), None, "rolled back");
}

/// RESP3 (`?protocol=3`): `INFO` comes as a verbatim string. A replica is refused (78) naming the
/// master it follows, the master counts its replica, and one server named twice (by `127.0.0.1`
/// and by `localhost`) is refused as the same server (2), found by the run id.
#[test]
fn over_resp3_a_replica_is_refused_and_replicas_are_counted() {
    let master = Server::start_tcp();
    let replicas = replicas_in_sync(&master, 1);
    let port = master.port.unwrap();
    let replica_url = format!("redis://127.0.0.1:{}?protocol=3", replicas[0].port.unwrap());
    let o = acquire_on(&replica_url, "r3");
    assert_eq!(code(&o), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&format!("a replica of 127.0.0.1:{port}")),
        "{}",
        stderr(&o)
    );
    assert_eq!(replicas[0].get("lockctl:r3"), None);
    assert_eq!(master.get("lockctl:r3"), None);

    let master_url = format!("redis://127.0.0.1:{port}?protocol=3");
    let o = acquire_on(&master_url, "r3");
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );

    let other = Server::start();
    let twice = format!(
        "{master_url},redis://localhost:{port}?protocol=3,{}",
        other.url()
    );
    let o = run(lockctl().args(["-r", &twice, "acquire", "twice", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("same server"), "{}", stderr(&o));
}

/// An `INFO` of about 150 KB on a master and on its replica: 3,000 databases with a key each (one
/// keyspace line each, on both, since the replica copies them), 100 kinds of error in `errorstats`
/// (Redis 6.2 and later), 60 more idle clients. The replica is still refused naming its master (over
/// RESP2 and RESP3), the master still waits for its replica, and the master named twice is still
/// found by its run id.
#[test]
fn a_huge_info_reply_is_read_like_a_small_one() {
    let master = Server::tcp_with_args(&["--databases", "3000", "--maxclients", "1000"]);
    let mut conn = master.conn();
    let mut pipe = redis::pipe();
    for db in 0..3000 {
        pipe.cmd("SELECT").arg(db).ignore();
        pipe.cmd("SET").arg("filler").arg(db).ignore();
    }
    pipe.cmd("SELECT").arg(0).ignore();
    pipe.query::<()>(&mut conn).unwrap();
    for i in 0..100 {
        let _ = redis::cmd("EVAL")
            .arg(format!("return redis.error_reply('E{i}X made up')"))
            .arg(0)
            .query::<()>(&mut conn);
    }
    let _idle: Vec<redis::Connection> = (0..60).map(|_| master.conn()).collect();
    let port = master.port.unwrap().to_string();
    let replica =
        Server::tcp_with_args(&["--databases", "3000", "--replicaof", "127.0.0.1", &port]);
    assert!(
        eventually(Duration::from_secs(90), || online_replicas(&master) == 1
            && replicas_acknowledge(&mut conn, "probe", 1)),
        "the replica did not come online"
    );
    let big: String = master.cmd(&["INFO"]);
    assert!(big.len() > 100_000, "INFO of {} bytes", big.len());
    assert!(
        eventually(Duration::from_secs(30), || replica
            .cmd::<String>(&["INFO"])
            .contains("db2999:")),
        "the replica has not all the keys"
    );

    for q in ["", "?protocol=3"] {
        let url = format!("redis://127.0.0.1:{}{q}", replica.port.unwrap());
        let o = acquire_on(&url, "big");
        assert_eq!(code(&o), 78, "{url}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("a replica of 127.0.0.1:{port}")),
            "{url}: {}",
            stderr(&o)
        );
        let url = format!("redis://127.0.0.1:{port}{q}");
        let o = acquire_on(&url, &format!("big{}", q.len()));
        assert_eq!(code(&o), 0, "{url}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("1 replica(s) acknowledged"),
            "{url}: {}",
            stderr(&o)
        );
    }
    let other = Server::start();
    let twice = format!(
        "redis://localhost:{port},unix://{},{}",
        master.socket().display(),
        other.url()
    );
    let o = run(lockctl().args(["-r", &twice, "acquire", "twice", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("same server"), "{}", stderr(&o));
}

impl Holder {
    fn start(server: &Server, name: &str, ttl: &str, secs: &str) -> Holder {
        Holder::start_on(&server.url(), name, ttl, secs)
    }

    /// `exec -v NAME -- sleep SECS` on `url`, once it reports its grant.
    fn start_on(url: &str, name: &str, ttl: &str, secs: &str) -> Holder {
        let holder = Holder::exec(url, name, ttl, &[], secs);
        holder.granted(name);
        holder
    }
}

/// Over RESP3 an `exec`'s renewals on its kept connection read `INFO replication` as a verbatim
/// string. A master with ten replicas at the grant (`slave0` to `slave9`) gets two more while the
/// holder runs (`slave10`, `slave11`), and the last one is stopped (SIGSTOP: still listed online,
/// never acknowledging). A renewal that counted only the ten replicas of the grant would `WAIT` for
/// ten and count; no renewal may count once the twelfth is stopped, and the lease is lost (76).
#[test]
fn over_resp3_replicas_that_join_an_exec_are_waited_for() {
    let master = Server::start_tcp();
    let _first = replicas_in_sync(&master, 10);
    let url = format!("{}?protocol=3", master.url());
    // Renewals every 3 s or so, valid for 10 s: the two replicas sync well within the lease.
    let holder = Holder::start_on(&url, "joined3", "10s", "120");
    let port = master.port.unwrap().to_string();
    let more: Vec<Server> = (0..2)
        .map(|_| Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]))
        .collect();
    let mut conn = master.conn();
    assert!(
        eventually(Duration::from_secs(90), || online_replicas(&master) == 12
            && replicas_acknowledge(&mut conn, "probe", 12)),
        "the two replicas did not come online"
    );
    let renewed_with_twelve = holder.count_from(0, "renewed '");
    more[1].pause();
    let marker = holder.len();
    assert_eq!(
        holder.count_from(0, "lease on"),
        0,
        "lost before the replica stopped: {:#?}",
        holder.lines.lock().unwrap()
    );
    let (code, lines) = holder.finish();
    more[1].resume();
    eprintln!("{renewed_with_twelve} renewal(s) before the stop, exit {code}");
    // A renewal in flight when the replica stopped may have been acknowledged; none after it.
    let from = lines[marker..]
        .iter()
        .position(|l| l.contains("renewal failed"))
        .map_or(lines.len(), |at| marker + at);
    let counted: Vec<&String> = lines[from..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect();
    assert!(counted.is_empty(), "{counted:#?}\n{lines:#?}");
    assert_eq!(code, 76, "{lines:#?}");
}

/// A master that becomes a replica (`REPLICAOF` by an operator, moving it under a new master) while
/// an `exec` holds a lock on it. The docs promise that lockctl never takes, renews or releases a
/// lock on a server whose role is `slave`. The server here allows writes on a replica
/// (`replica-read-only no`), so no `READONLY` stops the renewals: only what lockctl reads of the
/// server can. Each renewal on the kept connection carries `INFO replication`, which now says
/// `role:slave` (read by `Info::of` and not looked at); the master had no replica at the grant, so
/// the replica count asks for no `WAIT` either.
///
/// The new master is empty and delays the full sync (diskless, 20 s), so the old master keeps its
/// copy of the lock meanwhile. A second client takes the lock on the new master at once. From then
/// on the holder must not count a renewal: it did, one a second (ttl 3 s) on b7114fb, its child
/// running beside the second holder's grant.
#[test]
fn a_master_turned_replica_under_a_holder_is_not_renewed_on() {
    let new_master = Server::slow_to_sync();
    let old = Server::tcp_with_args(&["--replica-read-only", "no"]);
    let holder = Holder::start(&old, "moved", "3s", "60");

    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    assert!(old
        .cmd::<String>(&["INFO", "replication"])
        .contains("role:slave"));
    // The lock's key is still on the old master (its copy from the new one is delayed), and the
    // new master grants the lock to a second client.
    assert!(old.get("lockctl:moved").is_some());
    let o = run(lockctl_on(&new_master).args(["acquire", "moved", "-n", "--ttl", "30s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let marker = holder.len();

    // Until the holder stops counting renewals (a fix) or counts two more (one could have been in
    // flight): bounded by the sync delay, after which the copy drops the key anyway.
    eventually(Duration::from_secs(15), || {
        holder.count_from(marker, "renewed '") >= 2
            || holder.count_from(marker, "renewal failed") >= 1
            || holder.count_from(marker, "lease on") >= 1
    });
    let still_synced = old
        .cmd::<String>(&["INFO", "replication"])
        .contains("master_sync_in_progress:1")
        || old.get("lockctl:moved").is_some();
    let (_, lines) = holder.stop();
    let counted: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect();
    assert!(
        counted.len() < 2,
        "renewals counted on a replica (role:slave) after another client was granted the lock on \
         its master (old master still syncing: {still_synced}): {counted:#?}\n{lines:#?}"
    );
}

/// The boundary of the case above: the same hand-made move (`replica-read-only no` everywhere) on a
/// master that had a replica at the grant. The replica is promoted (`REPLICAOF NO ONE`) and the old
/// master follows it: the old master lists no replica any more, fewer than at the grant, so no
/// renewal counts there (one in flight may), and the lease is lost (76).
#[test]
fn a_master_with_a_replica_turned_replica_stops_the_renewals() {
    let old = Server::tcp_with_args(&["--replica-read-only", "no"]);
    let port = old.port.unwrap().to_string();
    let promoted = Server::tcp_with_args(&[
        "--replica-read-only",
        "no",
        "--replicaof",
        "127.0.0.1",
        &port,
    ]);
    let mut conn = old.conn();
    assert!(
        eventually(Duration::from_secs(90), || online_replicas(&old) == 1
            && replicas_acknowledge(&mut conn, "probe", 1)),
        "the replica did not come online"
    );
    let holder = Holder::start(&old, "swapped", "3s", "60");
    let _: String = promoted.cmd(&["REPLICAOF", "NO", "ONE"]);
    let new_port = promoted.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &new_port]);
    let marker = holder.len();
    let (code, lines) = holder.finish();
    let counted: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect();
    for l in lines
        .iter()
        .filter(|l| l.contains("renewal failed"))
        .take(2)
    {
        eprintln!("{l}");
    }
    assert!(counted.len() < 2, "{counted:#?}\n{lines:#?}");
    assert_eq!(code, 76, "{lines:#?}");
}

/// The grant side of the same: a waiting `exec` on a master with writable replicas
/// (`replica-read-only no`), which becomes a replica of an empty new master (full sync delayed 20 s)
/// while the lock is held there with a 3 s lease. A second client holds the lock on the new master.
/// When the first holder's key runs out on the old master, the waiter's next attempt goes out on its
/// kept connection, whose `INFO replication` says `role:slave`: no grant may be reported there.
/// On b7114fb (and a8e71a0 before it) the waiter reported `acquired` and started its command on
/// Redis 7.0.15 and Valkey 8.1.8, the second client holding the lock on the new master all along. On
/// Redis 6.2.14 it passes: the waiter saw no grant within its 15 s (the expired key was not taken over
/// there; why was not looked into).
#[test]
fn a_waiter_on_a_master_turned_replica_is_not_granted_there() {
    let new_master = Server::slow_to_sync();
    let old = Server::tcp_with_args(&["--replica-read-only", "no"]);
    let o = run(lockctl_on(&old).args(["acquire", "turned", "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut child = lockctl_on(&old)
        .args(["exec", "turned", "-w", "15s", "-v", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, reader) = stderr_lines(&mut child);
    assert!(
        eventually(Duration::from_secs(30), || lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("attempt on 'turned'"))),
        "the waiter never tried"
    );

    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    assert!(old
        .cmd::<String>(&["INFO", "replication"])
        .contains("role:slave"));
    let marker = lines.lock().unwrap().len();
    let o = run(lockctl_on(&new_master).args(["acquire", "turned", "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let o = wait_output(child, Duration::from_secs(60));
    reader.join().unwrap();
    let lines = lines.lock().unwrap().clone();
    let granted: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("acquired 'turned'"))
        .collect();
    assert!(
        granted.is_empty(),
        "granted on a replica (role:slave) while another client held the lock on its master \
         (exit {}): {granted:#?}\n{lines:#?}",
        code(&o)
    );
}

/// A Redis Cluster over RESP3 (`INFO` a verbatim string): a replica of the lock's slot owner says
/// `role:slave` and `cluster_enabled:1`, so it is followed to its master, not refused; the grant
/// waits for the owner's replica; `list` through that replica finds the lock, and `doctor` through
/// a master that does not own the slot names the cluster and its three masters.
#[test]
fn over_resp3_a_cluster_replica_is_followed_not_refused() {
    use support::topology::{lockctl_on_url, Cluster};
    let cluster = Cluster::start();
    let owner = cluster.owner("lockctl:c3");
    let replica = cluster.replica_of(owner);
    let url = format!("redis://127.0.0.1:{replica}?protocol=3");
    let o = run(lockctl_on_url(&url).args(["-v", "acquire", "c3", "-n", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );
    let grant: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    let token = grant["token"].as_str().unwrap().to_string();
    let o = run(lockctl_on_url(&url).args(["list", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("\"name\":\"c3\""), "{}", stdout(&o));
    let o = run(lockctl_on_url(&url).args(["release", "c3", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let other = cluster.not_owner("lockctl:c3");
    let o = run(lockctl_on_url(&format!("redis://127.0.0.1:{other}?protocol=3")).args(["doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "{out}\n{}", stderr(&o));
    assert!(out.contains("Redis Cluster with 3 master(s)"), "{out}");
}

/// `INFO` as one flat list where the first line of a key wins (`Info::of`, as the parser before it):
/// a line `role:master` in a section before `# Replication` hides the replica's own `role:slave`.
/// Valkey 8 prints its `availability-zone` setting in `# Server` as it was set, and `CONFIG SET`
/// takes one with a line break in it, so a replica whose zone was set to `"zone\r\nrole:master"`
/// shows a `role:master` line first. The replica must still be refused as one: here it was not. Read
/// only, it refused through `READONLY` with the other message (no "a replica of HOST:PORT"); with
/// writes allowed on it (`replica-read-only no`), `acquire` took the lock on the replica (exit 0),
/// and the master never saw it. Servers without that setting (Redis) skip this test.
#[test]
#[ignore = "known limit: a role:master line put into INFO's Server section through a setting \
            that takes a line break (valkey's availability-zone, set by an operator) hides a \
            writable replica; the first role line wins (fails on valkey 8, cannot be set on Redis)"]
fn a_role_line_before_the_replication_section_does_not_hide_a_replica() {
    let master = Server::start_tcp();
    let replicas = replicas_in_sync(&master, 1);
    let replica = &replicas[0];
    let set = redis::cmd("CONFIG")
        .arg("SET")
        .arg("availability-zone")
        .arg("zone\r\nrole:master")
        .query::<()>(&mut replica.conn());
    if let Err(e) = set {
        eprintln!("skipped: this server has no availability-zone setting ({e})");
        return;
    }
    let info: String = replica.cmd(&["INFO"]);
    let first_role = info.lines().find(|l| l.starts_with("role:"));
    assert_eq!(first_role, Some("role:master"), "{info}");
    assert!(info.contains("role:slave"), "{info}");

    let follows = format!("a replica of 127.0.0.1:{}", master.port.unwrap());
    let mut refusals = Vec::new();
    for read_only in ["yes", "no"] {
        let _: String = replica.cmd(&["CONFIG", "SET", "replica-read-only", read_only]);
        let o = run(lockctl_on(replica).args(["acquire", "zoned", "-n", "--ttl", "60s"]));
        refusals.push(format!(
            "replica-read-only {read_only}: exit {}, {}, lock on the replica: {:?}",
            code(&o),
            stderr(&o).trim(),
            replica.get("lockctl:zoned")
        ));
        // Nothing to remove on a read-only replica (and `DEL` is refused there).
        let _ = redis::cmd("DEL")
            .arg("lockctl:zoned")
            .query::<i64>(&mut replica.conn());
    }
    for r in &refusals {
        assert!(
            r.contains("exit 78") && r.contains(&follows) && r.ends_with("None"),
            "{refusals:#?}"
        );
    }
}

/// The old master of `a_master_turned_replica_under_a_holder_is_not_renewed_on` promoted back
/// (`REPLICAOF NO ONE`) right after the holder's first refused renewal, before its copy from the new
/// master came (full sync delayed 20 s): it still has the holder's key, while a second client holds
/// the lock on the new master. The holder must end at that first refusal (76, the child stopped),
/// not renew again once the old master is a master again. Found by the review of df046ef: on it,
/// 29 renewals counted after the promotion and the job ran to its end beside the second holder
/// (Redis 7.0.15, 6.2.14 and valkey 8.1.8).
#[test]
fn a_master_turned_replica_and_promoted_back_between_renewals_does_not_keep_the_holder() {
    let new_master = Server::slow_to_sync();
    let old = Server::tcp_with_args(&["--replica-read-only", "no"]);
    let holder = Holder::start(&old, "back", "3s", "30");

    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let o = run(lockctl_on(&new_master).args(["acquire", "back", "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let marker = holder.len();
    assert!(
        eventually(Duration::from_secs(15), || holder
            .count_from(marker, "renewal failed")
            + holder.count_from(marker, "lease on")
            >= 1),
        "no renewal was refused on the replica: {:#?}",
        holder.lines.lock().unwrap()
    );
    let _: String = old.cmd(&["REPLICAOF", "NO", "ONE"]);
    // Its copy is there unless the holder, ended, released it (on a writable replica).
    let copy = old.get("lockctl:back").is_some();

    let (code, lines) = holder.finish();
    eprintln!("the old master's copy at its promotion: {copy}");
    let renewed: Vec<&String> = lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .collect();
    // One renewal may have been in flight when the old master turned replica.
    assert!(renewed.len() < 2, "{renewed:#?}\n{lines:#?}");
    assert_eq!(code, 76, "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("became a replica of another master")),
        "{lines:#?}"
    );
}

/// The same scene with Redlock: the demoted and promoted-back master is one of three. Its vote is
/// lost for the rest of the run, and the lease goes on with the two others: every renewal after the
/// refusal holds our token on 2 of 3 nodes, none on 3 (on df046ef they counted 3 of 3 again once
/// it was promoted back), and the job ends as it would (0).
#[test]
fn a_redlock_master_promoted_back_does_not_vote_again() {
    let new_master = Server::slow_to_sync();
    let old = Server::tcp_with_args(&["--replica-read-only", "no"]);
    let others = [Server::start_tcp(), Server::start_tcp()];
    let urls = format!("{},{},{}", old.url(), others[0].url(), others[1].url());
    let holder = Holder::start_on(&urls, "back3", "3s", "12");

    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let marker = holder.len();
    assert!(
        eventually(Duration::from_secs(15), || holder
            .count_from(marker, "renew 'back3': 2/3")
            >= 1),
        "no renewal without the demoted master: {:#?}",
        holder.lines.lock().unwrap()
    );
    let _: String = old.cmd(&["REPLICAOF", "NO", "ONE"]);
    assert!(
        old.get("lockctl:back3").is_some(),
        "the old master lost its copy before its promotion: this scene did not happen"
    );
    let promoted = holder.len();

    let (code, lines) = holder.finish();
    let after = &lines[promoted..];
    let three: Vec<&String> = after
        .iter()
        .filter(|l| l.contains("renew 'back3': 3/3"))
        .collect();
    assert!(three.is_empty(), "{three:#?}\n{lines:#?}");
    assert!(
        after.iter().filter(|l| l.contains("renewed '")).count() >= 1,
        "no renewal after the promotion: {lines:#?}"
    );
    assert_eq!(code, 0, "{lines:#?}");
}
