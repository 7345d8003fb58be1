//! Adversarial review of b9dcfc6 ("a master's replication id that changed counts as a demotion only
//! with role:slave or a master_replid2"), against real servers (`REDIS_SERVER`).
//!
//! Results on redis 7.0.15, 6.2 and valkey 8, the same on all three:
//!
//! FAIL on b9dcfc6 (real defect, two holders): a demotion and promotion back between two renewals
//! is no longer seen once the promoted master's `master_replid2` is cleared before the holder's
//! next read, which Redis does whenever it makes a new backlog: a first replica attaching to the
//! promoted master (`a_demotion_hidden_by_a_first_replica_after_the_promotion_is_missed`), or
//! `repl-backlog-ttl` freeing the backlog it kept (`a_demotion_hidden_by_the_backlog_ttl_after_
//! the_promotion_is_missed`); the holder renews on its old master beside a second holder (0, not
//! 76). 84c6b21 counted any changed id and saw both. `control_the_demotion_scene_without_hiding_
//! is_seen` passes (76).
//!
//! Kept as it is, both ignored as a known limit (docs/guarantees.md): the alternative, any changed
//! id under the same run id (84c6b21), ended the lease of every holder on a master that got its
//! first replica, or one back after `repl-backlog-ttl` (tests/atkreplid_review.rs), and `INFO`
//! shows the two cases alike. The hidden demotion needs a demotion, a grant on the other master, a
//! promotion back and a new backlog, all between two renewals or while lockctl is stopped.
//!
//! Held: an aborted `FAILOVER`, `CLIENT PAUSE WRITE` and `DEBUG CHANGE-REPL-ID` keep the lease.
//! Ignored (documented consequence, conservative): a flip while a waiter was stopped, seen first in
//! its winning attempt's reply, ends that grant at its first renewal (76).
//!
//! Every server here is started by its test and never restarts, so the restart quarantine is off
//! (`LOCKCTL_QUARANTINE=0`, the default of `support::lockctl`).

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::holder::{demotion_named, Holder};
use support::*;

impl Holder {
    /// `lockctl -r URL exec -v NAME --ttl TTL -n -- sleep SECS`, quarantine off, once it reports
    /// its grant.
    fn start(url: &str, name: &str, ttl: &str, secs: &str) -> Holder {
        let h = Holder::exec(url, name, ttl, &["-n"], secs);
        h.granted(name);
        h
    }
}

fn replid2(s: &Server) -> String {
    replication_field(s, "master_replid2")
}

fn zeros(id: &str) -> bool {
    !id.is_empty() && id.bytes().all(|b| b == b'0')
}

fn renewed_after(lines: &[String], marker: usize) -> usize {
    lines[marker..]
        .iter()
        .filter(|l| l.contains("renewed '"))
        .count()
}

/// The demotion scene of docs/guarantees.md ("A master turned replica"): a holder on `old` (plain
/// URL) is stopped (SIGSTOP); `old` follows `new_master` (`REPLICAOF`), whose full sync is delayed
/// (diskless, 20 s) so `old` keeps its own data and the holder's key; a second client is granted on
/// `new_master`; `old` is promoted back (`REPLICAOF NO ONE`: new id, old id in `master_replid2`).
/// Then `hide` runs, an ordinary operation on the promoted `old` that makes Redis take a new
/// `master_replid` and clear `master_replid2`. The holder is resumed within its lease.
///
/// Expected (docs/guarantees.md): the holder stops (76) rather than renew on `old` beside the
/// second client.
fn demotion_then_hidden(
    name: &str,
    old_args: &[&str],
    prepare: impl FnOnce(&Server),
    hide: impl FnOnce(&Server),
) {
    let new_master = Server::slow_to_sync();
    let old = Server::tcp_with_args(old_args);
    prepare(&old);
    let holder = Holder::start(&old.url(), name, "20s", "26");
    kill(holder.pid(), libc::SIGSTOP);
    let id0 = replid(&old);
    let port = new_master.port.unwrap().to_string();
    let _: String = old.cmd(&["REPLICAOF", "127.0.0.1", &port]);
    let o = run(lockctl_on(&new_master).args(["acquire", name, "-n", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let _: String = old.cmd(&["REPLICAOF", "NO", "ONE"]);
    let (id1, id1b) = (replid(&old), replid2(&old));
    assert!(!zeros(&id1b), "a promotion without master_replid2: {id1b}");
    hide(&old);
    let (id2, id2b) = (replid(&old), replid2(&old));
    eprintln!("old: {id0} -> {id1} (replid2 {id1b}) -> {id2} (replid2 {id2b})");
    assert!(
        old.get(&format!("lockctl:{name}")).is_some(),
        "the old master lost the holder's copy: this scene did not happen"
    );
    let marker = holder.len();
    kill(holder.pid(), libc::SIGCONT);
    let (rc, lines) = holder.finish();
    let renewed = renewed_after(&lines, marker);
    assert!(
        new_master.get(&format!("lockctl:{name}")).is_some(),
        "the second client's key is gone"
    );
    assert_eq!(
        rc, 76,
        "the holder renewed {renewed} time(s) on its old master (demoted, promoted back; id \
         {id0} -> {id1}/{id1b} -> {id2}/{id2b}) while another client held the lock on the master \
         it had followed: {lines:#?}"
    );
    assert_eq!(renewed, 0, "{lines:#?}");
}

/// `hide`: a first replica attaches to the promoted old master. It had no backlog (its sync with
/// `new_master` never completed), so Redis makes one for this replica with a new id and
/// `master_replid2` cleared (`syncCommand`), erasing the promotion's trace before the holder's next
/// read.
#[test]
#[ignore = "known limit (docs/guarantees.md): a promotion whose master then makes a new backlog (a first replica, or repl-backlog-ttl) before the holder's next read looks like a backlog made for a first replica (a new id, master_replid2 zeros), which must not end a lease; INFO cannot tell them apart"]
fn a_demotion_hidden_by_a_first_replica_after_the_promotion_is_missed() {
    let mut replica: Option<Server> = None;
    demotion_then_hidden(
        "hidefirst",
        &[],
        |_| {},
        |old| {
            let port = old.port.unwrap().to_string();
            replica = Some(Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]));
            assert!(
                eventually(Duration::from_secs(10), || zeros(&replid2(old))),
                "the first replica did not clear master_replid2"
            );
        },
    );
    drop(replica);
}

/// `hide`: the old master had a backlog (a replica was attached once, and left), kept across the
/// demotion (no sync completed). Once promoted, it has no replica; with `repl-backlog-ttl` 1 s
/// (default one hour; an operator's setting) the replication cron frees the backlog, with a new id
/// and `master_replid2` cleared — no replica involved at all.
#[test]
#[ignore = "known limit (docs/guarantees.md): a promotion whose master then makes a new backlog (a first replica, or repl-backlog-ttl) before the holder's next read looks like a backlog made for a first replica (a new id, master_replid2 zeros), which must not end a lease; INFO cannot tell them apart"]
fn a_demotion_hidden_by_the_backlog_ttl_after_the_promotion_is_missed() {
    let prepare = |old: &Server| {
        let port = old.port.unwrap().to_string();
        let r = Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]);
        assert!(
            eventually(Duration::from_secs(20), || online_replicas(old) == 1),
            "the replica never came online"
        );
        let _: String = r.cmd(&["REPLICAOF", "NO", "ONE"]);
        assert!(
            eventually(Duration::from_secs(10), || online_replicas(old) == 0),
            "the replica did not go"
        );
    };
    demotion_then_hidden("hidettl", &["--repl-backlog-ttl", "3600"], prepare, |old| {
        let _: String = old.cmd(&["CONFIG", "SET", "repl-backlog-ttl", "1"]);
        assert!(
            eventually(Duration::from_secs(10), || zeros(&replid2(old))),
            "the backlog was not freed (replid2 {})",
            replid2(old)
        );
    });
}

/// Control for the two above: the same scene with no `hide` is seen (76).
#[test]
fn control_the_demotion_scene_without_hiding_is_seen() {
    demotion_then_hidden("nohide", &[], |_| {}, |_| {});
}

/// False losses: a `FAILOVER` that never happens. A plain master with one replica under an `exec`;
/// the replica is stopped (SIGSTOP) so it cannot catch up, `FAILOVER TO` it (TIMEOUT 30 s) pauses
/// the master's writes, and `FAILOVER ABORT` ends it before anything changed; the replica is then
/// resumed. The master never was a replica: expected, its `master_replid` unchanged and no
/// demotion named (exit 0; the lease's 20 s TTL outlasts the pause).
#[test]
fn an_aborted_failover_is_not_a_demotion() {
    if server_major_version() < 6 {
        return;
    }
    let master = Server::start_tcp();
    let replica = replicas_in_sync(&master, 1).remove(0);
    let holder = Holder::start(&master.url(), "abort", "20s", "10");
    let before = (replid(&master), replid2(&master));
    replica.pause();
    // A write the stopped replica cannot acknowledge: without one pending, a replica caught up
    // already lets `FAILOVER` go on at once (the master really turns replica of it, and the holder
    // rightly stops, 76), which is not this scene (one CI run out of four).
    let _: String = master.cmd(&["SET", "pending", "1"]);
    let rport = replica.port.unwrap().to_string();
    let _: String = master.cmd(&["FAILOVER", "TO", "127.0.0.1", &rport, "TIMEOUT", "30000"]);
    std::thread::sleep(Duration::from_millis(1500));
    let _: String = master.cmd(&["FAILOVER", "ABORT"]);
    replica.resume();
    let after = (replid(&master), replid2(&master));
    let (rc, lines) = holder.finish();
    eprintln!("exit {rc}; {before:?} -> {after:?}");
    assert_eq!(before, after);
    assert!(!demotion_named(&lines), "{lines:#?}");
    assert_eq!(rc, 0, "{lines:#?}");
}

/// False losses: `CLIENT PAUSE WRITE` and `DEBUG CHANGE-REPL-ID` (when `enable-debug-command`
/// allows it: a new id, `master_replid2` cleared) under a holder on a master with no replica. Not
/// demotions: expected exit 0, no demotion named.
#[test]
fn a_client_pause_and_a_changed_repl_id_are_not_demotions() {
    let master = if server_major_version() >= 7 {
        Server::tcp_with_args(&["--enable-debug-command", "yes"])
    } else {
        Server::start_tcp()
    };
    let holder = Holder::start(&master.url(), "pause", "6s", "8");
    let _: String = master.cmd(&["CLIENT", "PAUSE", "1500", "WRITE"]);
    std::thread::sleep(Duration::from_millis(2000));
    let before = replid(&master);
    let _: String = master.cmd(&["DEBUG", "CHANGE-REPL-ID"]);
    eprintln!("{before} -> {} / {}", replid(&master), replid2(&master));
    let (rc, lines) = holder.finish();
    assert!(!demotion_named(&lines), "{lines:#?}");
    assert_eq!(rc, 0, "{lines:#?}");
}

/// False loss (documented: "one seen in the grant's own replies does" count): a single plain
/// master; holder A (`exec`, TTL 3 s); waiter W (`exec -w 40s`, TTL 9 s) has made failed attempts
/// (its history has the node's id). W is stopped (SIGSTOP); the node is flipped (`REPLICAOF` a port
/// where nothing listens, then `REPLICAOF NO ONE`: its data kept); A sees the flip and stops (76),
/// its key goes. W is resumed: its next attempt wins on the promoted master, after the flip, and
/// its own INFO reply first shows the changed id. The flip preceded W's grant and cannot concern
/// it, yet W's first renewal counts the node as not ours. Ideal: W runs to its end (0). Observed:
/// 76 (redis 7.0.15, 6.2, valkey 8): the INFO in the same write as the script cannot tell a flip
/// before the script from one after it. A waiter that is not stopped polls about every second
/// and usually sees the flip in a failed attempt first (then it keeps its next grant), so this
/// needs the flip and the release within one of its waits.
#[test]
#[ignore = "documented consequence (docs/guarantees.md): a flip seen first in the winning attempt's replies counts against the grant, even one that happened while the waiter was stopped before that attempt"]
fn a_flip_while_the_waiter_was_stopped_ends_its_next_grant() {
    let server = Server::start_tcp();
    let a = Holder::start(&server.url(), "wflip", "3s", "20");
    let mut child = lockctl()
        .env("LOCKCTL_QUARANTINE", "0")
        .args([
            "-r",
            &server.url(),
            "exec",
            "wflip",
            "--ttl",
            "9s",
            "-v",
            "-w",
            "40s",
        ])
        .args(["--", "sleep", "6"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (lines, reader) = stderr_lines(&mut child);
    assert!(
        eventually(Duration::from_secs(20), || lines
            .lock()
            .unwrap()
            .iter()
            .any(|l| l.contains("attempt on 'wflip'"))),
        "{:#?}",
        lines.lock().unwrap()
    );
    std::thread::sleep(Duration::from_millis(500));
    kill(child.id() as i32, libc::SIGSTOP);
    let _: String = server.cmd(&["REPLICAOF", "127.0.0.1", &free_port().to_string()]);
    let _: String = server.cmd(&["REPLICAOF", "NO", "ONE"]);
    let (rc_a, lines_a) = a.finish();
    assert_eq!(rc_a, 76, "{lines_a:#?}");
    assert!(
        eventually(Duration::from_secs(10), || server
            .get("lockctl:wflip")
            .is_none()),
        "A's key stayed"
    );
    kill(child.id() as i32, libc::SIGCONT);
    let o = wait_output(child, Duration::from_secs(60));
    reader.join().unwrap();
    let lines = lines.lock().unwrap().clone();
    assert!(
        lines.iter().any(|l| l.contains("acquired 'wflip'")),
        "{lines:#?}"
    );
    assert_eq!(code(&o), 0, "{lines:#?}");
}
