//! Another server takes over a node's address under a holder: a virtual IP or a DNS name moved to
//! another machine, or a replica promoted in the old master's place. The new server has a new run
//! id and lacks the holder's key, as a server restarted without its data does; unlike that one, it
//! has been up all along, so its uptime says nothing of when it could first grant the lock, and a
//! second client may have held the lock there and released it before the holder's next renewal.
//! The holder's renewal must not put its key back there (`renew.lua`): its lease on that node ends.
//!
//! The restart quarantine stays on in every scene here (the lease's TTL).

mod support;

use std::time::Duration;

use support::holder::Holder;
use support::proxy::Switch;
use support::topology::{info_field, SentinelGroup};
use support::*;

/// A holder on one node whose address moves, between two renewals, to another server that has been
/// up for longer than the quarantine; a second client takes the lock there and gives it back before
/// the holder's next renewal. Before, that renewal put the holder's key back (a new run id, past its
/// quarantine: a restart, as far as it could tell) and the job ran on to its end, its lease having
/// run beside the second client's. Now the lease is lost there: exit 76, and no key is put back.
#[test]
fn a_server_that_took_over_the_address_puts_no_key_back() {
    let servers = Servers(vec![Server::start_tcp(), Server::start_tcp()]);
    // Both servers pass the quarantine (3 s, the TTL), so that the second client's grant on the
    // new one is not refused for its uptime.
    servers.wait_out_quarantine(3);
    let (old, new) = (&servers[0], &servers[1]);
    let address = Switch::start(old.port.unwrap());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &address.url(), "exec", "moved", "--ttl", "3s", "-v"])
            .args(["--", "sleep", "8"]),
    );
    holder.granted("moved");
    let token = old.get(&slot_key("moved", 1)).expect("the holder's key");
    // The address moves; while it leads nowhere, the second client holds the lock on the new
    // server and releases it. The holder's renewals meanwhile fail (no answer), within its lease.
    address.point_at(None);
    let second = run(quarantined()
        .args(["-r", &new.url(), "acquire", "moved", "-n", "--ttl", "3s"])
        .args(["--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    let released =
        run(quarantined().args(["-r", &new.url(), "release", "moved", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    address.point_at(new.port);
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder went on through another client's lease on the new server: {lines:#?}"
    );
    assert_ne!(
        new.get(&slot_key("moved", 1)),
        Some(token),
        "the holder's key was put back on the new server"
    );
}

/// Through Sentinel: the master's only replica, its replication held back (a proxy), lacks the
/// holder's key when the master is killed and the Sentinels promote it. While the holder is stopped
/// (SIGSTOP, within its lease), a second client takes the lock on the new master and gives it back.
/// Before, the holder's next renewal put its key back there (a new run id, up for longer than the
/// quarantine) and the job ran on; now its lease ends: exit 76.
#[test]
fn a_replica_promoted_without_the_key_puts_no_key_back() {
    let link = std::sync::OnceLock::new();
    let mut group = SentinelGroup::start_custom(None, 1, |master| {
        link.get_or_init(|| Switch::start(master)).port
    });
    let link = link.get().unwrap();
    let url = group.url();
    let replica = group.replicas[0].port.unwrap();
    // The replica passes the quarantine (10 s, the TTL) before it is promoted.
    assert!(
        eventually(Duration::from_secs(30), || group.replicas[0].uptime() > 10),
        "the replica never passed the quarantine"
    );
    // The master's writes stop reaching its replica: it no longer counts it as online, so the grant
    // waits for no acknowledgement.
    link.point_at(None);
    let master = group.master_port().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || online_replicas(&group.master)
            == 0),
        "the master still lists its replica"
    );
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &url, "exec", "promoted", "--ttl", "10s", "-v"])
            .args(["--", "sleep", "30"]),
    );
    holder.granted("promoted");
    let token = group.master.get(&slot_key("promoted", 1)).expect("the key");
    kill(holder.pid(), libc::SIGSTOP);
    group.server(master).kill();
    assert!(
        eventually(Duration::from_secs(30), || group.master_port()
            == Some(replica)
            && info_field(replica, "replication", "role").as_deref()
                == Some("master")),
        "the Sentinels never promoted the replica"
    );
    assert_eq!(group.replicas[0].get(&slot_key("promoted", 1)), None);
    let second = run(quarantined()
        .args(["-r", &url, "acquire", "promoted", "-n", "--ttl", "10s"])
        .args(["--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    let released = run(quarantined().args(["-r", &url, "release", "promoted", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    kill(holder.pid(), libc::SIGCONT);
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder went on through another client's lease on the promoted replica: {lines:#?}"
    );
    assert_ne!(
        group.replicas[0].get(&slot_key("promoted", 1)),
        Some(token),
        "the holder's key was put back on the promoted replica"
    );
}

/// A server started after the holder's last renewal, as a replica that never synced, then promoted
/// by hand (`REPLICAOF NO ONE`) and put at the node's address while the holder is stopped (SIGSTOP,
/// within its lease). Its uptime is shorter than the time since that renewal, so it passes for the
/// node restarted without its data, and it puts the holder's key back. A second client took the lock
/// there and gave it back meanwhile: the key put back must not count, and the lease ends (exit 76,
/// the key released). The quarantine stays on, shortened to 2 s (3 s for the second client) so that
/// the new server passes it within the holder's lease of 10 s.
#[test]
fn a_key_put_back_by_a_server_promoted_since_it_started_does_not_count() {
    let servers = Servers(vec![Server::start_tcp()]);
    servers.wait_out_quarantine(2);
    let address = Switch::start(servers[0].port.unwrap());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &address.url(), "--quarantine", "2s", "exec", "lone"])
            .args(["--ttl", "10s", "-v", "--", "sleep", "40"]),
    );
    holder.granted("lone");
    let token = servers[0].get(&slot_key("lone", 1)).expect("the key");
    assert!(
        eventually(Duration::from_secs(30), || holder.count("renewed 'lone'")
            >= 1),
        "no renewal"
    );
    kill(holder.pid(), libc::SIGSTOP);
    let promoted = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &nowhere()]);
    assert!(
        eventually(Duration::from_secs(30), || promoted.uptime() >= 4),
        "the new server never passed the second client's quarantine"
    );
    let () = promoted.cmd(&["REPLICAOF", "NO", "ONE"]);
    let replid2 = info_field(promoted.port.unwrap(), "replication", "master_replid2").unwrap();
    assert!(replid2.contains(|c| c != '0'), "no trace of the promotion");
    address.point_at(promoted.port);
    let second = run(quarantined()
        .args([
            "-r",
            &promoted.url(),
            "acquire",
            "lone",
            "-n",
            "--ttl",
            "3s",
        ])
        .args(["--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    let released =
        run(quarantined().args(["-r", &promoted.url(), "release", "lone", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    kill(holder.pid(), libc::SIGCONT);
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder went on through another client's lease on the promoted server: {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("got it back")),
        "the lease ended for another reason than the key put back: {lines:#?}"
    );
    assert_ne!(
        promoted.get(&slot_key("lone", 1)),
        Some(token),
        "the holder's key was left on the promoted server"
    );
}
