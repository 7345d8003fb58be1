//! Review of the three-section INFO check (ab9b8bd, 7c91669) against Sentinel failover, Redis Cluster
//! nodes, and restarts without data with the restart quarantine on.

mod support;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::topology::{
    intervals, lockctl_on_url, logged_child, no_two_holders, now_ns, Cluster, SentinelGroup,
    MASTER_NAME,
};
use support::*;

fn failover_during_exec(failover: impl FnOnce(&mut SentinelGroup)) {
    let mut group = SentinelGroup::start();
    let url = group.url();
    let old_master = group.master_port();
    let group = std::cell::RefCell::new(&mut group);
    no_two_holders(
        &url,
        || failover(&mut group.borrow_mut()),
        || group.borrow().master_port() != old_master,
    );
}

#[test]
fn sentinel_planned_failover_during_exec() {
    failover_during_exec(|group| {
        let () = group.sentinels[0]
            .cmd(&["SENTINEL", "FAILOVER", MASTER_NAME])
            .unwrap();
    });
}

#[test]
fn sentinel_master_kill9_during_exec() {
    failover_during_exec(|group| {
        let port = group.master_port().unwrap();
        group.server(port).kill();
    });
}

/// A replica given directly as the URL is refused; after a failover the old master (now a replica)
/// given directly is refused too; the Sentinel URL finds the new master.
#[test]
fn sentinel_replica_urls_are_refused_before_and_after_failover() {
    let group = SentinelGroup::start();
    let r = format!("redis://127.0.0.1:{}", group.replicas[0].port.unwrap());
    let o = run(lockctl_on_url(&r).args(["acquire", "x", "-n"]));
    assert_ne!(code(&o), 0, "a replica granted: {}", stderr(&o));
    assert!(stderr(&o).contains("replica"), "{}", stderr(&o));
    let old = group.master_port().unwrap();
    let () = group.sentinels[0]
        .cmd(&["SENTINEL", "FAILOVER", MASTER_NAME])
        .unwrap();
    assert!(eventually(Duration::from_secs(60), || group.master_port() != Some(old)));
    // Wait until the old master is a replica.
    assert!(eventually(Duration::from_secs(60), || {
        support::topology::info_field(old, "replication", "role").as_deref() == Some("slave")
    }));
    let o = run(lockctl_on_url(&format!("redis://127.0.0.1:{old}")).args(["acquire", "y", "-n"]));
    assert_ne!(code(&o), 0, "the demoted master granted: {}", stderr(&o));
    let g = run(lockctl_on_url(&group.url()).args(["acquire", "y", "-n"]));
    assert_eq!(code(&g), 0, "{}", stderr(&g));
    let o = run(lockctl_on_url(&group.url()).args(["acquire", "y", "-n"]));
    assert_eq!(
        code(&o),
        75,
        "second holder through Sentinel: {}",
        stderr(&o)
    );
}

/// A lock taken through a cluster replica (MOVED to its master) excludes a second one taken
/// through any other node, and fences increase.
#[test]
fn cluster_replica_url_and_other_nodes_exclude_each_other() {
    let cluster = Cluster::start();
    let owner = cluster.owner("lockctl:cj");
    let replica = cluster.replica_of(owner);
    let other = cluster.not_owner("lockctl:cj");
    let urls = [
        format!("redis://127.0.0.1:{replica}"),
        format!("redis://127.0.0.1:{other}"),
        format!("redis://127.0.0.1:{owner}"),
    ];
    let mut last_fence = 0i64;
    for first in &urls {
        let g = acquire_json(&mut lockctl_on_url(first), "cj", &["-n", "--ttl", "30s"]);
        let fence = g["fence"].as_i64().unwrap();
        assert!(fence > last_fence, "fence {fence} after {last_fence}");
        last_fence = fence;
        for second in &urls {
            let o = run(lockctl_on_url(second).args(["acquire", "cj", "-n"]));
            assert_eq!(code(&o), 75, "{first} then {second}: {}", stderr(&o));
        }
        let token = g["token"].as_str().unwrap();
        let o = run(lockctl_on_url(first).args(["release", "cj", "--token", token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
}

/// `exec` as holder on `cmd_a`, `restart` during it, a second client looping on `cmd_b`: the
/// second's children never overlap the first's; the first exits 0 or 76.
fn restart_under_exec(
    mk: impl Fn() -> Command + Send + Sync + 'static,
    restart: impl FnOnce(),
) -> (i32, Vec<i32>) {
    let mk = Arc::new(mk);
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("h.log");
    let mut a = mk()
        .args([
            "-v",
            "exec",
            "rq",
            "--ttl",
            "3s",
            "--kill-after",
            "1s",
            "-n",
            "--",
            "sh",
            "-c",
        ])
        .arg(logged_child("A", &log, "8"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let a_err = collect_stderr(a.stderr.take().unwrap());
    assert!(
        eventually(Duration::from_secs(20), || std::fs::read_to_string(&log)
            .is_ok_and(|t| t.contains("A start"))),
        "A never started"
    );
    std::thread::sleep(Duration::from_millis(500));
    restart();
    let stop = Arc::new(AtomicBool::new(false));
    let b = {
        let (stop, log, mk) = (Arc::clone(&stop), log.clone(), Arc::clone(&mk));
        std::thread::spawn(move || {
            let mut codes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let o = run(mk()
                    .args(["exec", "rq", "-n", "--ttl", "3s", "--", "sh", "-c"])
                    .arg(logged_child("B", &log, "0.2")));
                codes.push(code(&o));
                std::thread::sleep(Duration::from_millis(100));
            }
            codes
        })
    };
    let a_out = wait_output(a, Duration::from_secs(60));
    let a_end = now_ns();
    let a_code = code(&a_out);
    let a_log = a_err.join().unwrap();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    let b_codes = b.join().unwrap();
    eprintln!("A exit {a_code}; B exits {b_codes:?}\n{a_log}");
    assert!(a_code == 0 || a_code == 76, "A exit {a_code}\n{a_log}");
    let a_spans = intervals(&log, "A", a_end);
    let (a_start, a_stop) = a_spans[0];
    for (bs, be) in intervals(&log, "B", now_ns()) {
        assert!(
            be < a_start || bs > a_stop,
            "two holders: A {a_start}..{a_stop}, B {bs}..{be}; A exit {a_code}\n{a_log}\nB {b_codes:?}"
        );
    }
    (a_code, b_codes)
}

#[test]
fn single_node_restart_empty_under_exec_quarantine_on() {
    let s = Arc::new(std::sync::Mutex::new(Server::start()));
    assert!(eventually(Duration::from_secs(10), || s
        .lock()
        .unwrap()
        .uptime()
        > 4));
    let url = s.lock().unwrap().url();
    let u2 = url.clone();
    let s2 = Arc::clone(&s);
    let (a, _) = restart_under_exec(
        move || {
            let mut c = quarantined();
            c.env("LOCKCTL_REDIS", &u2);
            c
        },
        move || s2.lock().unwrap().restart_empty(),
    );
    assert_eq!(a, 76, "the holder's lease was lost with the data");
    let _ = url;
}

#[test]
fn single_node_restart_empty_second_acquire_refused_and_fence_increases() {
    let mut s = Server::start();
    assert!(eventually(Duration::from_secs(10), || s.uptime() > 3));
    let mut q = quarantined();
    q.env("LOCKCTL_REDIS", s.url());
    let g = acquire_json(&mut q, "f", &["-n", "--ttl", "2s"]);
    let f1 = g["fence"].as_i64().unwrap();
    s.restart_empty();
    let o = run(quarantined()
        .env("LOCKCTL_REDIS", s.url())
        .args(["acquire", "f", "-n", "--ttl", "2s"]));
    assert_ne!(code(&o), 0, "granted during the quarantine: {}", stdout(&o));
    let mut q = quarantined();
    q.env("LOCKCTL_REDIS", s.url());
    let g2 = acquire_json(&mut q, "f", &["--ttl", "2s", "-w", "20s"]);
    let f2 = g2["fence"].as_i64().unwrap();
    assert!(
        f2 > f1,
        "fence {f2} after {f1} across a restart without data"
    );
}

fn redlock_restart(which: &'static [usize]) {
    let servers = Arc::new(std::sync::Mutex::new(Servers::start(3)));
    servers.lock().unwrap().wait_out_quarantine(3);
    let urls = servers.lock().unwrap().urls();
    let s2 = Arc::clone(&servers);
    restart_under_exec(
        move || {
            let mut c = quarantined();
            c.env("LOCKCTL_REDIS", &urls);
            c
        },
        move || {
            let mut s = s2.lock().unwrap();
            for &i in which {
                s[i].restart_empty();
            }
        },
    );
}

#[test]
fn redlock_minority_restart_empty_under_exec() {
    redlock_restart(&[0]);
}

#[test]
fn redlock_majority_restart_empty_under_exec() {
    redlock_restart(&[0, 2]);
}

/// The master named by Sentinel is killed and restarted without its data before the Sentinels
/// fail it over (down-after 1 s): its replicas resync the empty data set. Quarantine on.
#[test]
fn sentinel_master_restart_empty_under_exec_quarantine_on() {
    let mut group = SentinelGroup::start();
    assert!(eventually(Duration::from_secs(10), || group
        .master
        .uptime()
        > 4));
    let url = group.url();
    let (a, b) = restart_under_exec(
        move || {
            let mut c = quarantined();
            c.env("LOCKCTL_REDIS", &url);
            c
        },
        || group.master.restart_empty(),
    );
    eprintln!("A {a}, B {b:?}");
}

/// kill -9 of the master, failover to a replica, then the old master restarted without data (it
/// comes back as a master until the Sentinels turn it into a replica). Quarantine on.
#[test]
fn sentinel_failover_then_old_master_back_empty_under_exec() {
    let mut group = SentinelGroup::start();
    let url = group.url();
    let old = group.master_port().unwrap();
    let g = &mut group;
    restart_under_exec(
        move || {
            let mut c = quarantined();
            c.env("LOCKCTL_REDIS", &url);
            c
        },
        || {
            g.server(old).kill();
            assert!(eventually(Duration::from_secs(60), || g
                .master_port()
                .is_some_and(|p| p != old)));
            g.server(old).restart_empty();
        },
    );
}

/// The URL names the slot's master, which a CLUSTER FAILOVER turns into a cluster replica during
/// an exec: new connections find `role:slave` with `cluster_enabled:1` and must be redirected,
/// not refused or served by the replica.
#[test]
fn cluster_url_of_a_master_demoted_during_exec() {
    let cluster = Cluster::start();
    let key = "lockctl:fo";
    let owner = cluster.owner(key);
    let replica = cluster.replica_of(owner);
    let url = format!("redis://127.0.0.1:{owner}");
    no_two_holders(
        &url,
        || {
            let c = &cluster.nodes.iter().find(|n| n.port == replica).unwrap();
            let () = c.cmd(&["CLUSTER", "FAILOVER"]).unwrap();
        },
        || support::topology::info_field(owner, "replication", "role").as_deref() == Some("slave"),
    );
}
