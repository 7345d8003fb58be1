//! Attacks on commit 2e13ac6 (renew.lua puts a key back only on the server that lost it in a
//! restart: uptime since the holder's last confirmation there, plus the node timeout; role master
//! with `master_replid2` all zeros; the restart quarantine as before).
//!
//! The restart quarantine stays on in every lockctl run here (its default, the TTL), holder and
//! second client alike, except where a comment says otherwise.

mod support;

use std::time::Duration;

use support::holder::Holder;
use support::proxy::Switch;
use support::*;

/// Promise 1 (no two holders), Redlock over three nodes A, B, C (A and B behind movable addresses).
///
/// Node A drops out of the holder's reach (its address leads nowhere) while B and C keep the lease;
/// meanwhile A restarts without its data, a genuine restart, and passes its quarantine. Right
/// after one of the holder's renewals, the holder is stopped (within its lease); A's address leads
/// to A again, and B's address moves to another long-running server (a takeover, the case the
/// change is about). A second client, quarantine on, is granted the lock on A and on B's new
/// server (2 of 3) and releases it. The holder is continued: its renewal finds no key on A, whose
/// run id changed and which has been up for less than the time since the holder last found its key
/// there, is a master with `master_replid2` all zeros and is past its quarantine, so the key is put
/// back there, hiding the second client's grant on A; with C, that is 2 of 3, and the job runs on
/// beside the second holder's lease. Expected: the lease ends (exit 76).
#[test]
fn a_restarted_node_past_its_quarantine_hides_a_grant_made_there_after_it() {
    let mut a = Server::start_tcp();
    let b = Server::start_tcp();
    let c = Server::start();
    let other_b = Server::start_tcp();
    let ttl = 6;
    // Every server passes the quarantine (the TTL) so that both grants below count it.
    assert!(
        eventually(Duration::from_secs(30), || [&a, &b, &c, &other_b]
            .iter()
            .all(|s| s.uptime() > ttl)),
        "the servers never passed the quarantine"
    );
    let addr_a = Switch::start(a.port.unwrap());
    let addr_b = Switch::start(b.port.unwrap());
    let urls = format!("{},{},{}", addr_a.url(), addr_b.url(), c.url());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &urls, "exec", "mixed", "--ttl", "6s", "-v"])
            .args(["--", "sleep", "40"]),
    );
    holder.granted("mixed");
    let token = c.get(&slot_key("mixed", 1)).expect("the holder's key on C");
    assert_eq!(a.get(&slot_key("mixed", 1)), Some(token.clone()));
    assert_eq!(b.get(&slot_key("mixed", 1)), Some(token.clone()));

    // A drops out of reach, restarts without its data and passes its quarantine; the holder
    // renews on B and C all the while.
    addr_a.point_at(None);
    a.restart_empty();
    assert!(
        eventually(Duration::from_secs(30), || a.uptime() > ttl + 1),
        "A never passed its quarantine"
    );
    assert_eq!(a.get(&slot_key("mixed", 1)), None);

    // Right after a renewal, the holder is stopped (its lease has ~6 s left).
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal: {:#?}",
        holder.lines.lock().unwrap()
    );
    kill(holder.pid(), libc::SIGSTOP);
    let stopped = std::time::Instant::now();
    addr_a.point_at(a.port);
    addr_b.point_at(other_b.port);
    let second = run(quarantined()
        .env("LOCKCTL_REDIS", &urls)
        .args(["acquire", "mixed", "-n", "--ttl", "6s", "--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    assert_eq!(a.get(&slot_key("mixed", 1)), Some(other.clone()));
    assert_eq!(other_b.get(&slot_key("mixed", 1)), Some(other.clone()));
    let released = run(quarantined()
        .env("LOCKCTL_REDIS", &urls)
        .args(["release", "mixed", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    let gap = stopped.elapsed();
    assert!(
        gap < Duration::from_secs(4),
        "the second grant took {gap:?}: the holder's lease may have run out while stopped"
    );
    let before = holder.len();
    kill(holder.pid(), libc::SIGCONT);
    // The holder's next renewal (or the end of its lease).
    assert!(
        eventually(Duration::from_secs(10), || holder
            .count_from(before, "renew 'mixed':")
            + holder.count_from(before, "lost")
            >= 1),
        "no renewal after the continue: {:#?}",
        holder.lines.lock().unwrap()
    );
    std::thread::sleep(Duration::from_millis(200));
    let on_a = a.get(&slot_key("mixed", 1));
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder's lease ran on beside the second client's grant (A's key afterwards: {on_a:?}, \
         the holder's token {token}): {lines:#?}"
    );
}

/// Promise 2 (a genuine restart of a Redlock minority node gets the holder's key back after its
/// quarantine), on a node that lost the key in a restart from its last snapshot: the key was
/// written after the snapshot (`SAVE` before the grant), as with any `save` schedule. The node is a
/// master that had a replica (it has a replication backlog, so its RDB carries its replication id),
/// and Redis 7 / Valkey 8 restore that id at start-up as `master_replid2`, which the change reads as
/// "promoted since it started". Same scene as redlock.rs
/// `renewal_recreates_a_key_lost_in_a_minority_restart_after_its_quarantine` otherwise (TTL 3 s,
/// node timeout 1 s, quarantine on).
#[test]
fn a_master_restarted_from_an_older_snapshot_gets_the_key_back() {
    restart_from_an_older_snapshot(true);
}

/// The control of the scene above: the same restart from an older snapshot, on a master that never
/// had a replica (its RDB carries no replication id, `master_replid2` stays all zeros). The key is
/// put back after the quarantine.
#[test]
fn control_a_master_without_a_backlog_restarted_from_an_older_snapshot_gets_the_key_back() {
    restart_from_an_older_snapshot(false);
}

fn restart_from_an_older_snapshot(had_a_replica: bool) {
    let mut m = Server::start_tcp();
    if had_a_replica {
        // A replica once, gone before the grant: the master keeps its backlog.
        let replica = replicas_in_sync(&m, 1);
        drop(replica);
        assert!(
            eventually(Duration::from_secs(20), || replication_field(
                &m,
                "connected_slaves"
            ) == "0"),
            "the master still lists its replica"
        );
    }
    let _: String = m.cmd(&["SAVE"]);
    let others = Servers::start(2);
    assert!(
        eventually(Duration::from_secs(20), || m.uptime() > 3
            && others.0.iter().all(|s| s.uptime() > 3)),
        "the servers never passed the quarantine"
    );
    let urls = format!("{},{}", m.url(), others.urls());
    let holder = Holder::spawn(
        quarantined()
            .args([
                "-r",
                &urls,
                "exec",
                "snap",
                "--ttl",
                "3s",
                "--node-timeout",
                "1s",
            ])
            .args(["-v", "--", "sleep", "30"]),
    );
    holder.granted("snap");
    let token = m
        .get(&slot_key("snap", 1))
        .expect("the holder's key on the master");
    let fence: u64 = m
        .get("{lockctl:snap}\u{1f}fence")
        .expect("the fencing counter")
        .parse()
        .unwrap();
    m.restart_in_place();
    let lost = m.get(&slot_key("snap", 1));
    let replid2 = replication_field(&m, "master_replid2");
    let back = eventually(Duration::from_secs(15), || {
        m.get(&slot_key("snap", 1)).is_some()
    });
    let after = m.get(&slot_key("snap", 1));
    let counter: Option<String> = m.get("{lockctl:snap}\u{1f}fence");
    let (exit, lines) = holder.stop();
    assert_eq!(lost, None, "the restart kept the key: not the scene");
    assert!(
        back && after == Some(token),
        "the key was not put back on the restarted master (master_replid2 {replid2}); exec \
         exited {exit}: {lines:#?}"
    );
    assert_eq!(
        counter.map(|c| c.parse::<u64>().unwrap()),
        Some(fence),
        "the re-created key did not raise the node's fencing counter to the holder's fence"
    );
}
