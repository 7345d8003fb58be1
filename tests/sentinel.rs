//! `redis+sentinel://`: finding the master through Sentinel, and failover without two holders.
//!
//! Each test runs a real Sentinel group (Debian's `redis-sentinel`): a master, two replicas and three
//! Sentinels on loopback ports. The failover tests run an `exec` whose child logs when it starts and
//! ends, force a failover (`SENTINEL FAILOVER`) or crash the master (kill -9) while a second client
//! keeps trying the same lock, and check that the second client's children never overlap the first
//! one's, and that the first holder either kept its lease (exit 0) or lost it (exit 76).

mod support;

use std::time::{Duration, Instant};

use support::topology::{no_two_holders, SentinelGroup, MASTER_NAME};
use support::*;

fn with_url(url: &str) -> std::process::Command {
    let mut c = lockctl();
    c.env("LOCKCTL_REDIS", url);
    c
}

#[test]
fn every_command_works_through_sentinel_and_grants_reach_the_replicas() {
    let group = SentinelGroup::start();
    let url = group.url();
    let o = run(with_url(&url).args(["-v", "acquire", "job", "-n", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 replica(s) acknowledged"),
        "the grant waited for both replicas: {}",
        stderr(&o)
    );
    let grant: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let token = grant["token"].as_str().unwrap().to_string();
    // WAIT returned only once both replicas had the key.
    for r in &group.replicas {
        assert_eq!(r.get("lockctl:job").as_deref(), Some(token.as_str()));
    }
    let o = run(with_url(&url).args(["status", "job"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(with_url(&url).args(["renew", "job", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(with_url(&url).args(["list"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("job"), "{}", stdout(&o));
    let o = run(with_url(&url).args(["release", "job", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(with_url(&url).args(["exec", "job", "-n", "--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(with_url(&url).args(["doctor"]));
    let out = stdout(&o);
    assert!(
        out.contains("permissions") && !out.lines().any(|l| l.trim_start().starts_with("fail")),
        "{out}"
    );
    assert_eq!(group.master.get("lockctl:job"), None);
}

#[test]
fn a_wrong_master_name_is_78_and_no_sentinel_is_69() {
    let group = SentinelGroup::start();
    let hosts: Vec<String> = group
        .sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port))
        .collect();
    let url = format!("redis+sentinel://{}/nosuchmaster", hosts.join(","));
    let o = run(with_url(&url).args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("nosuchmaster") && stderr(&o).contains("SENTINEL MASTERS"),
        "{}",
        stderr(&o)
    );
    let nobody = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/{MASTER_NAME}",
        free_port(),
        free_port()
    );
    let o = run(with_url(&nobody).args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    // The first Sentinel that answers is enough.
    let one_down = format!(
        "redis+sentinel://127.0.0.1:{},{}/{MASTER_NAME}",
        free_port(),
        hosts.join(",")
    );
    let o = run(with_url(&one_down).args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn sentinel_urls_are_checked_and_redacted() {
    for bad in [
        "redis+sentinel://127.0.0.1:26379",
        "redis+sentinel://127.0.0.1:26379/m/x/y",
        "redis+sentinel://127.0.0.1:26379/m/notadb",
        "redis+sentinel://127.0.0.1:26379,/m",
        "redis+sentinel://127.0.0.1:notaport/m",
        "redis+sentinel://:Secr3tPw@127.0.0.1:26379/m?replicas=many",
    ] {
        let o = run(lockctl().args(["-r", bad, "status", "x"]));
        assert_eq!(code(&o), 2, "{bad}: {}", stderr(&o));
        assert!(stderr(&o).contains("redis+sentinel://"), "{}", stderr(&o));
        assert!(!stderr(&o).contains("Secr3tPw"), "{}", stderr(&o));
    }
    // A data-node password in a Sentinel URL is never shown; nothing answers on these ports.
    let url = format!(
        "redis+sentinel://user:Secr3tPw@127.0.0.1:{}/{MASTER_NAME}",
        free_port()
    );
    let o = run(lockctl().args(["-r", &url, "-v", "acquire", "x", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(!stderr(&o).contains("Secr3tPw"), "{}", stderr(&o));
    assert!(stderr(&o).contains("user:***@"), "{}", stderr(&o));
}

#[test]
fn sentinel_credentials_come_from_the_environment() {
    let group = SentinelGroup::start_with(Some("S3ntinelPw"));
    let o = run(with_url(&group.url()).args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("LOCKCTL_SENTINEL_PASSWORD"),
        "{}",
        stderr(&o)
    );
    let o = run(with_url(&group.url())
        .env("LOCKCTL_SENTINEL_PASSWORD", "S3ntinelPw")
        .args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("S3ntinelPw"));
}

/// The group's master moves (`failover`) during an exec, with a second client trying all along.
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
fn planned_failover_during_exec_never_gives_two_holders() {
    failover_during_exec(|group| {
        let () = group.sentinels[0]
            .cmd(&["SENTINEL", "FAILOVER", MASTER_NAME])
            .unwrap();
    });
}

#[test]
fn master_crash_during_exec_never_gives_two_holders() {
    failover_during_exec(|group| {
        let port = group.master_port().unwrap();
        group.server(port).kill();
    });
}

#[test]
fn the_master_is_found_again_after_a_failover() {
    let group = SentinelGroup::start();
    let url = group.url();
    let grant = acquire_json(&mut with_url(&url), "moving", &["-n", "--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let old = group.master_port();
    let () = group.sentinels[0]
        .cmd(&["SENTINEL", "FAILOVER", MASTER_NAME])
        .unwrap();
    let started = Instant::now();
    assert!(
        eventually(Duration::from_secs(30), || group.master_port() != old),
        "no failover"
    );
    // Renewal and release go to the new master, which has the lock (WAIT put it on every replica).
    assert!(
        eventually(Duration::from_secs(20), || {
            let o = run(with_url(&url).args(["renew", "moving", "--token", &token]));
            code(&o) == 0
        }),
        "renew never reached the new master ({:?} after the failover)",
        started.elapsed()
    );
    let o = run(with_url(&url).args(["release", "moving", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn two_urls_for_one_sentinel_group_are_one_vote() {
    let group = SentinelGroup::start();
    let other = Server::start();
    let s = &group.sentinels;
    let a = format!("redis+sentinel://127.0.0.1:{}/{MASTER_NAME}", s[0].port);
    let b = format!("redis+sentinel://127.0.0.1:{}/{MASTER_NAME}", s[1].port);
    let o = run(lockctl()
        .args(["-r", &a, "-r", &b, "-r", &other.url()])
        .args(["acquire", "x", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains(&a) && stderr(&o).contains(&b),
        "{}",
        stderr(&o)
    );
    assert_eq!(other.get("lockctl:x"), None, "no lock was left");
}

/// A kept connection to a master that became a replica without Sentinel (`REPLICAOF` by hand, which
/// leaves its clients connected) gets `READONLY` for the holder's next renewal. That is taken as a
/// sign to ask the Sentinels again, not as the server's answer: here they still name the demoted
/// server (their failure detection is slowed to a minute first), so the renewal fails saying so.
/// Left on the connection, every renewal repeats the bare `READONLY` until the lease ends.
#[test]
fn a_master_demoted_by_hand_under_a_holder_sends_it_back_to_the_sentinels() {
    let group = SentinelGroup::start();
    for s in &group.sentinels {
        let () = s
            .cmd(&[
                "SENTINEL",
                "SET",
                MASTER_NAME,
                "down-after-milliseconds",
                "60000",
            ])
            .unwrap();
    }
    // The child marks its start: the grant, replicas' acknowledgement included, is complete.
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let child = with_url(&group.url())
        .args([
            "-v", "exec", "demoted", "--ttl", "3s", "-n", "--", "sh", "-c",
        ])
        .arg(format!("touch '{}'; exec sleep 30", started.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || started.exists()),
        "never granted"
    );
    // The first replica becomes a master, and the Sentinels' master its replica.
    let new = &group.replicas[0];
    let () = new.cmd(&["REPLICAOF", "NO", "ONE"]);
    let new_port = new.port.unwrap().to_string();
    let () = group.master.cmd(&["REPLICAOF", "127.0.0.1", &new_port]);
    let o = wait_output(child, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 76, "{err}");
    assert_eq!(
        group.master_port(),
        group.master.port,
        "the Sentinels moved the master: {err}"
    );
    assert!(
        err.contains("the Sentinels name a replica as the master"),
        "the READONLY renewal did not ask the Sentinels again: {err}"
    );
}

/// Only `READONLY` sends a call back to the Sentinels: any other refusal by the master they name is
/// its answer. An ACL user without `TIME` (which only the scripts run) is refused at once with 78,
/// naming the command, instead of asking the Sentinels and resending until the node timeout ends.
#[test]
fn a_refusal_by_the_named_master_is_its_answer() {
    let group = SentinelGroup::start();
    let () = group.master.cmd(&[
        "ACL",
        "SETUSER",
        "locker",
        "on",
        ">L0ckerPw",
        "~*",
        "&*",
        "+@all",
        "-time",
    ]);
    let url = group
        .url()
        .replace("redis+sentinel://", "redis+sentinel://locker:L0ckerPw@");
    let o = run(with_url(&url).args(["--node-timeout", "3s", "acquire", "job", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 78, "{err}");
    assert!(
        err.contains("[the command the script could not run: TIME]"),
        "{err}"
    );
    assert_eq!(group.master.get("lockctl:job"), None);
}
