//! Redis Cluster: a `-r` naming any node of the cluster works for every command.
//!
//! Each test runs a real cluster (3 masters, 3 replicas, `redis-server --cluster-enabled yes` and
//! `redis-cli --cluster create`) on loopback ports. Commands go through a node that does not own the
//! lock's slot (MOVED is followed), through a replica, and through `redis+cluster://` seeds; names
//! with braces keep every key of a lock in one slot; `list` and `doctor` cover every master; a
//! `CLUSTER FAILOVER` during an `exec` never gives two holders.

mod support;

use std::time::Duration;

use support::topology::{info_field, lockctl_on_url, no_two_holders, Cluster, SentinelGroup};
use support::*;

fn node_url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}")
}

/// acquire, status, renew, list, release, exec and break on `name` through `url`; the lock lives on
/// the owner of its slot.
fn every_command(cluster: &Cluster, url: &str, name: &str) {
    let key = format!("lockctl:{name}");
    let grant = acquire_json(&mut lockctl_on_url(url), name, &["-n"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let owner = cluster.owner(&key);
    let held: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query(
            &mut redis::Client::open(node_url(owner))
                .unwrap()
                .get_connection()
                .unwrap(),
        )
        .unwrap();
    assert_eq!(
        held.as_deref(),
        Some(token.as_str()),
        "{name}: on the owner"
    );
    for args in [vec!["status", name], vec!["renew", name, "--token", &token]] {
        let o = run(lockctl_on_url(url).args(&args));
        assert_eq!(code(&o), 0, "{args:?} {name}: {}", stderr(&o));
    }
    let o = run(lockctl_on_url(url).args(["list", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!("\"name\":{}", serde_json::json!(name))),
        "list shows {name} held on another master: {}",
        stdout(&o)
    );
    let o = run(lockctl_on_url(url).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "release {name}: {}", stderr(&o));
    let o = run(lockctl_on_url(url).args(["exec", name, "-n", "--", "true"]));
    assert_eq!(code(&o), 0, "exec {name}: {}", stderr(&o));
    acquire_json(&mut lockctl_on_url(url), name, &["-n"]);
    let o = run(lockctl_on_url(url).args(["break", name, "--yes"]));
    assert_eq!(code(&o), 0, "break {name}: {}", stderr(&o));
    let o = run(lockctl_on_url(url).args(["status", name]));
    assert_eq!(code(&o), 1, "free after break: {}", stderr(&o));
}

#[test]
fn every_command_works_through_any_node() {
    let cluster = Cluster::start();
    // A master that does not own the slot: every command is redirected.
    let other = cluster.not_owner("lockctl:job");
    every_command(&cluster, &node_url(other), "job");
    // A replica: it redirects to its master too.
    let replica = cluster.replica_of(cluster.owner("lockctl:job"));
    every_command(&cluster, &node_url(replica), "job");
    // Seeds, the first of them dead.
    let seeds = format!(
        "redis+cluster://127.0.0.1:{},127.0.0.1:{other}",
        free_port()
    );
    every_command(&cluster, &seeds, "job");

    // doctor covers every master and fails nothing.
    let o = run(lockctl_on_url(&node_url(other)).args(["doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "{out}\n{}", stderr(&o));
    for m in cluster.masters() {
        assert!(
            out.contains(&format!("(master 127.0.0.1:{m})")),
            "doctor checks master {m}: {out}"
        );
    }
    assert!(out.contains("Redis Cluster with 3 master(s)"), "{out}");
}

#[test]
fn names_with_braces_keep_their_keys_in_one_slot() {
    let cluster = Cluster::start();
    let url = node_url(cluster.masters()[0]);
    for name in ["a}b", "x{}y", "{t}x", "{", "}{"] {
        every_command(&cluster, &url, name);
    }
}

#[test]
fn two_nodes_of_one_cluster_are_one_vote() {
    let cluster = Cluster::start();
    let m = cluster.masters();
    let urls = format!("{},{}", node_url(m[0]), node_url(m[1]));
    let o = run(lockctl_on_url(&urls).args(["doctor"]));
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    assert!(
        stdout(&o).contains("reach the same cluster"),
        "{}",
        stdout(&o)
    );
    // Two of its nodes as two votes, beside an independent server: refused, naming both.
    let other = Server::start();
    let o = run(lockctl()
        .args([
            "-r",
            &node_url(m[0]),
            "-r",
            &node_url(m[1]),
            "-r",
            &other.url(),
        ])
        .args(["acquire", "x", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&node_url(m[0]))
            && stderr(&o).contains(&node_url(m[1]))
            && stderr(&o).contains("reach the same server"),
        "{}",
        stderr(&o)
    );
    // Found after the first round (the run ids of the servers that answered), and rolled back: no
    // lock is left, only the fencing counters may have moved.
    assert_eq!(other.get("lockctl:x"), None, "no lock was left");
    // Two seeds lists that share a node are refused before anything is sent.
    let a = format!("redis+cluster://127.0.0.1:{},127.0.0.1:{}", m[0], m[1]);
    let b = format!("redis+cluster://127.0.0.1:{},127.0.0.1:{}", m[1], m[2]);
    let o = run(lockctl()
        .args(["-r", &a, "-r", &b])
        .args(["acquire", "x", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&a) && stderr(&o).contains(&b),
        "{}",
        stderr(&o)
    );
}

#[test]
fn cluster_failover_during_exec_never_gives_two_holders() {
    let cluster = Cluster::start();
    let key = "lockctl:fo";
    let owner = cluster.owner(key);
    let replica = cluster.replica_of(owner);
    let url = node_url(cluster.not_owner(key));
    no_two_holders(
        &url,
        || {
            let c = &cluster.nodes.iter().find(|n| n.port == replica).unwrap();
            let () = c.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
        },
        || info_field(replica, "replication", "role").as_deref() == Some("master"),
    );
    assert!(
        eventually(Duration::from_secs(10), || cluster.owner(key) == replica),
        "the replica owns the slot now"
    );
}

#[test]
fn a_waiter_is_woken_by_a_release_through_any_node() {
    let cluster = Cluster::start();
    let url = node_url(cluster.not_owner("lockctl:w"));
    let grant = acquire_json(&mut lockctl_on_url(&url), "w", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let mut waiter = lockctl_on_url(&url)
        .args(["-v", "acquire", "w", "-w", "50s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let err = collect_stderr(waiter.stderr.take().unwrap());
    // Subscribed somewhere in the cluster (a release is published to every node).
    assert!(
        eventually(Duration::from_secs(20), || cluster.nodes.iter().any(|n| {
            n.cmd::<Vec<String>>(&["PUBSUB", "CHANNELS", "*wake*"])
                .is_ok_and(|c| !c.is_empty())
        })),
        "the waiter never subscribed"
    );
    // Let its backoff grow towards its 2 s ceiling, so that the release, not a retry that happens to
    // come due at the same moment, is what lets it in.
    std::thread::sleep(Duration::from_secs(3));
    let o = run(lockctl_on_url(&url).args(["release", "w", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = wait_output(waiter, Duration::from_secs(60));
    let err = err.join().unwrap();
    assert_eq!(code(&out), 0, "{err}");
    assert!(err.contains("woken by a release"), "{err}");
}

#[test]
fn one_server_by_two_spellings_is_one_vote() {
    let s = Server::start_tcp();
    let third = Server::start();
    let o = run(lockctl()
        .args(["-r", &format!("unix://{}", s.socket().display())])
        .args(["-r", &s.url(), "-r", &third.url()])
        .args(["acquire", "x", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("same server"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:x"), None, "no lock was left");
    assert_eq!(third.get("lockctl:x"), None, "no lock was left");
}

#[test]
fn redlock_over_a_cluster_a_sentinel_group_and_a_server() {
    let cluster = Cluster::start();
    let group = SentinelGroup::start();
    let server = Server::start();
    let urls = [
        node_url(cluster.not_owner("lockctl:multi")),
        group.url(),
        server.url(),
    ];
    let mut cmd = lockctl();
    for u in &urls {
        cmd.args(["-r", u]);
    }
    let grant = acquire_json(&mut cmd, "multi", &["-n"]);
    assert_eq!(grant["nodes"], 3, "{grant}");
    let token = grant["token"].as_str().unwrap().to_string();
    let with_all = |args: &[&str]| {
        let mut c = lockctl();
        for u in &urls {
            c.args(["-r", u]);
        }
        run(c.args(args))
    };
    let o = with_all(&["status", "multi", "--format", "json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(j["agree"], 3, "{j}");
    let o = with_all(&["acquire", "multi", "-n"]);
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let o = with_all(&["renew", "multi", "--token", &token]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = with_all(&["list"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("multi"), "{}", stdout(&o));
    let o = with_all(&["release", "multi", "--token", &token]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = with_all(&["exec", "multi", "-n", "--", "true"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(server.get("lockctl:multi"), None);
}

#[test]
fn a_lock_in_a_migrating_slot_is_unavailable_until_the_migration_ends() {
    let cluster = Cluster::start();
    let key = "lockctl:migrating";
    let source = cluster.owner(key);
    let target = cluster.not_owner(key);
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();
    let slot: i64 = node(source).cmd(&["CLUSTER", "KEYSLOT", key]).unwrap();
    let id = |port: u16| node(port).cmd::<String>(&["CLUSTER", "MYID"]).unwrap();
    let (source_id, target_id) = (id(source), id(target));
    let slot = slot.to_string();
    let () = node(target)
        .cmd(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
        .unwrap();
    let () = node(source)
        .cmd(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
        .unwrap();
    // None of the lock's keys is on the source, which answers ASK; the target takes a multi-key
    // script in an importing slot only once every key is there (TRYAGAIN): an outage, not a
    // misconfiguration.
    let url = node_url(source);
    let o = run(lockctl_on_url(&url).args(["-v", "acquire", "migrating", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("asks for") && stderr(&o).contains("being migrated"),
        "{}",
        stderr(&o)
    );
    // Once the slot has moved, the source answers MOVED, and the lock is taken on the target.
    for port in cluster.masters() {
        let () = node(port)
            .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id])
            .unwrap();
    }
    assert!(
        eventually(Duration::from_secs(10), || cluster.owner(key) == target),
        "the slot moved"
    );
    let o = run(lockctl_on_url(&url).args(["acquire", "migrating", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let held: Option<String> = node(target).cmd(&["GET", key]).unwrap();
    assert_eq!(held.as_deref(), Some(token.as_str()));
}

/// An `ASK` to a node that cannot be reached is an outage, not a misconfigured cluster: only an
/// address that is not `host:port` is refused as such. The slot's target is killed while the
/// source still sends its keys there.
#[test]
fn an_ask_to_a_node_that_is_down_is_an_outage() {
    let mut cluster = Cluster::start();
    let key = "lockctl:asked";
    let source = cluster.owner(key);
    let target = cluster.not_owner(key);
    let node = |c: &Cluster, port: u16| c.nodes.iter().position(|n| n.port == port).unwrap();
    let (s, t) = (node(&cluster, source), node(&cluster, target));
    let slot: i64 = cluster.nodes[s].cmd(&["CLUSTER", "KEYSLOT", key]).unwrap();
    let target_id: String = cluster.nodes[t].cmd(&["CLUSTER", "MYID"]).unwrap();
    let () = cluster.nodes[s]
        .cmd(&[
            "CLUSTER",
            "SETSLOT",
            &slot.to_string(),
            "MIGRATING",
            &target_id,
        ])
        .unwrap();
    cluster.nodes[t].kill();
    let o = run(lockctl_on_url(&node_url(source)).args(["-v", "acquire", "asked", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 69, "{err}");
    assert!(err.contains("asks for"), "{err}");
    assert!(!err.contains("not host:port"), "{err}");
}

/// Redirects that never end (two masters that each say the other owns the slot) are followed only
/// so far: the call is refused, naming the hops and what to check, instead of going round until the
/// node timeout.
#[test]
fn redirects_in_a_loop_are_refused_after_the_limit() {
    let cluster = Cluster::start();
    let key = "lockctl:looping";
    let (a, b) = (cluster.owner(key), cluster.not_owner(key));
    let node = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();
    let slot: i64 = node(a).cmd(&["CLUSTER", "KEYSLOT", key]).unwrap();
    let slot = slot.to_string();
    let id = |port: u16| node(port).cmd::<String>(&["CLUSTER", "MYID"]).unwrap();
    let (a_id, b_id) = (id(a), id(b));
    let () = node(a)
        .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &b_id])
        .unwrap();
    let () = node(b)
        .cmd(&["CLUSTER", "SETSLOT", &slot, "NODE", &a_id])
        .unwrap();
    let o = run(lockctl_on_url(&node_url(a)).args(["-v", "acquire", "looping", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 78, "{err}");
    assert!(err.contains("still redirected after"), "{err}");
    assert!(err.contains("CLUSTER SHARDS"), "{err}");
}
