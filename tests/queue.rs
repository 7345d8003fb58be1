//! The queue: waiters are served in arrival order on one node and on Redlock, `-n` never jumps it,
//! a dead or stopped waiter leaves it within the documented bound, a waiter that gives up leaves at
//! once, `--supersede` displaces the older waiters (on Redlock only once a quorum took it in),
//! notes show everywhere, and N handoffs cost O(N) commands. Real servers, real signals.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::queue::{all_succeed, finish_off, hold, queue_key, waiter};
use support::*;

/// Each node's queue: member -> score.
fn queues(servers: &[&Server], name: &str) -> Vec<HashMap<String, String>> {
    servers
        .iter()
        .map(|s| {
            let v: Vec<(String, String)> =
                s.cmd(&["ZRANGE", &queue_key(name), "0", "-1", "WITHSCORES"]);
            v.into_iter().collect()
        })
        .collect()
}

/// Waits until `count` waiters are queued on every node, each with one ticket on all of them (the
/// enqueue finished everywhere).
fn wait_queued(servers: &[&Server], name: &str, count: usize) {
    let ok = eventually(Duration::from_secs(30), || {
        let q = queues(servers, name);
        q.iter().all(|m| m.len() == count) && q.iter().all(|m| *m == q[0])
    });
    assert!(
        ok,
        "{count} waiters not queued alike: {:?}",
        queues(servers, name)
    );
}

/// Six waiters arriving one after another are served in that order, `rounds` times.
fn arrival_order(servers: &[&Server], lockctl: impl Fn() -> Command, rounds: usize) {
    let dir = tempfile::tempdir().unwrap();
    for round in 0..rounds {
        let name = format!("order{round}");
        let file = dir.path().join(&name);
        let token = hold(&mut lockctl(), &name);
        let mut kids = Vec::new();
        for i in 1..=6 {
            kids.push(waiter(&mut lockctl(), &name, &file, &i.to_string(), &[]));
            wait_queued(servers, &name, i);
            std::thread::sleep(Duration::from_millis(150));
        }
        let o = run(lockctl().args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        all_succeed(kids);
        let order = std::fs::read_to_string(&file).unwrap();
        assert_eq!(
            order.split_whitespace().collect::<Vec<_>>(),
            ["1", "2", "3", "4", "5", "6"],
            "round {round}"
        );
    }
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let s = Server::start();
    arrival_order(&[&s], || lockctl_on(&s), 10);
}

#[test]
fn waiters_are_served_in_arrival_order_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    arrival_order(&all, || s.lockctl(), 10);
}

/// `status NAME --format json`.
fn status_json(cmd: &mut Command, name: &str) -> serde_json::Value {
    let o = run(cmd.args(["status", name, "--format", "json"]));
    serde_json::from_str(&stdout(&o)).expect("status prints JSON")
}

fn waiter_pids(cmd: &mut Command, name: &str) -> Vec<u64> {
    status_json(cmd, name)["waiters"]
        .as_array()
        .expect("a waiters array")
        .iter()
        .map(|w| w["pid"].as_u64().expect("a pid"))
        .collect()
}

/// An `exec` waiting for `name` that prints `held` once it holds it (its stderr piped, for the wait
/// lines); `exec` records its own pid, which tells the waiters apart in `status`.
fn acquirer(cmd: &mut Command, name: &str, extra: &[&str]) -> Child {
    cmd.args(["exec", name, "--ttl", "60s"])
        .args(extra)
        .args(["-c", "echo held"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn acquire")
}

/// The heartbeat expiry of the only waiter queued for `name`, in server ms.
fn alive_until(s: &Server, name: &str) -> Option<u64> {
    let v: Vec<(String, u64)> = s.cmd(&[
        "ZRANGE",
        &format!("{{lockctl:{name}}}\u{1f}alive"),
        "0",
        "-1",
        "WITHSCORES",
    ]);
    v.first().map(|(_, t)| *t)
}

/// A queued waiter and a free lock: `-n` is refused.
fn no_wait_case(servers: &[&Server], lockctl: impl Fn() -> Command) {
    let token = hold(&mut lockctl(), "nj");
    let a = acquirer(&mut lockctl(), "nj", &[]);
    wait_queued(servers, "nj", 1);
    // Stop the waiter just after a heartbeat, so that it stays queued for about 3 s while it cannot
    // take the free lock: the state a head is in between being woken and its attempt.
    let first = alive_until(servers[0], "nj").unwrap();
    assert!(eventually(Duration::from_secs(10), || alive_until(
        servers[0], "nj"
    )
    .is_some_and(|t| t > first)));
    kill(a.id() as i32, libc::SIGSTOP);
    let o = run(lockctl().args(["release", "nj", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl().args(["acquire", "nj", "-n"]));
    assert_eq!(
        code(&o),
        75,
        "-n took a free lock from the queue: {}",
        stderr(&o)
    );
    assert!(stderr(&o).contains("1 waiting ahead"), "{}", stderr(&o));
    for s in servers {
        assert_eq!(s.get("lockctl:nj"), None);
    }
    kill(a.id() as i32, libc::SIGCONT);
    let out = wait_output(a, Duration::from_secs(60));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(stdout(&out), "held");
}

#[test]
fn no_wait_never_jumps_the_queue() {
    let s = Server::start();
    no_wait_case(&[&s], || lockctl_on(&s));
}

#[test]
fn no_wait_never_jumps_the_queue_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    no_wait_case(&all, || s.lockctl());
}

/// A Redlock grant won on a quorum while one node refused it (another holder's key stands there):
/// that node queued the waiter in the same call, and the grant takes it out of that queue before
/// lockctl exits, or the next release there would wake it instead of the next waiter, and every
/// waiter behind it would wait until its entry expired.
#[test]
fn a_grant_on_redlock_leaves_the_queue_of_a_node_that_refused_it() {
    let s = Servers::start(3);
    let _: () = s.0[2].cmd(&["SET", "lockctl:gq", "someone-else", "PX", "60000"]);
    let o = run(s
        .lockctl()
        .args(["acquire", "gq", "--ttl", "60s", "-w", "10s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let left = queues(&[&s.0[2]], "gq");
    assert!(
        left[0].is_empty(),
        "the granted waiter is still queued on the node that refused it: {left:?}"
    );
    for node in &s.0[..2] {
        assert_eq!(node.cmd::<u64>(&["ZCARD", &queue_key("gq")]), 0);
    }
}

/// `-n` and `-w 0` make one attempt and never queue (docs/queue.md): refused by a held lock, each
/// costs the node one script call, not an enqueue and a leave.
#[test]
fn no_wait_makes_one_attempt_and_never_queues() {
    let s = Server::start();
    let _token = hold(&mut lockctl_on(&s), "once");
    for flags in [&["-n"][..], &["-w", "0"]] {
        let before = script_calls(&s);
        let o = run(lockctl_on(&s).args(["acquire", "once"]).args(flags));
        assert_eq!(code(&o), 75, "{flags:?}: {}", stderr(&o));
        assert_eq!(
            script_calls(&s) - before,
            1,
            "{flags:?}: more than one attempt, or queued and then left"
        );
    }
    assert!(queues(&[&s], "once")[0].is_empty());
}

/// A waiter in the middle of the queue dies (`sig` SIGKILL) or stops (SIGSTOP): the one behind it
/// gets the lock within the documented bound (heartbeat expiry 3 s + heartbeat 1 s), bounded here
/// generously; a waiter that never left would hold it up forever.
fn dead_waiter_does_not_stall(sig: i32) {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut lockctl_on(&s), "dead");
    let mut kids = Vec::new();
    for who in ["a", "b", "c"] {
        kids.push(waiter(&mut lockctl_on(&s), "dead", &file, who, &[]));
        wait_queued(&[&s], "dead", kids.len());
    }
    let b = kids.remove(1);
    kill(b.id() as i32, sig);
    let released = Instant::now();
    let o = run(lockctl_on(&s).args(["release", "dead", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    let took = released.elapsed();
    eprintln!("the waiter behind a dead one got the lock {took:?} after the release");
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "a\nc\n");
    finish_off(b);
}

#[test]
fn a_killed_waiter_does_not_stall_the_queue() {
    dead_waiter_does_not_stall(libc::SIGKILL);
}

#[test]
fn a_stopped_waiter_does_not_stall_the_queue() {
    dead_waiter_does_not_stall(libc::SIGSTOP);
}

#[test]
fn a_waiter_that_stops_waiting_leaves_at_once() {
    let s = Server::start();
    let _token = hold(&mut lockctl_on(&s), "leave");
    let a = acquirer(&mut lockctl_on(&s), "leave", &["-w", "3s"]);
    wait_queued(&[&s], "leave", 1);
    let b = acquirer(&mut lockctl_on(&s), "leave", &[]);
    wait_queued(&[&s], "leave", 2);
    let (a_pid, b_pid) = (a.id() as u64, b.id() as u64);
    assert_eq!(waiter_pids(&mut lockctl_on(&s), "leave"), [a_pid, b_pid]);
    kill(b_pid as i32, libc::SIGTERM);
    let o = wait_output(b, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", stderr(&o));
    // Gone well before its heartbeat could expire (3 s).
    assert!(
        eventually(Duration::from_millis(500), || waiter_pids(
            &mut lockctl_on(&s),
            "leave"
        ) == [a_pid]),
        "{:?}",
        status_json(&mut lockctl_on(&s), "leave")["waiters"]
    );
    let o = wait_output(a, Duration::from_secs(60));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert_eq!(waiter_pids(&mut lockctl_on(&s), "leave"), Vec::<u64>::new());
}

/// The last waiter to leave takes the queue's keys along (docs/queue.md): once nobody waits, the
/// name keeps its lock and counter, not a queue whose entries nobody heartbeats any more.
#[test]
fn the_last_waiter_to_leave_takes_the_queue_keys_along() {
    let s = Server::start();
    let _token = hold(&mut lockctl_on(&s), "left");
    let a = acquirer(&mut lockctl_on(&s), "left", &[]);
    wait_queued(&[&s], "left", 1);
    kill(a.id() as i32, libc::SIGTERM);
    let o = wait_output(a, Duration::from_secs(60));
    assert_eq!(o.status.code(), Some(128 + libc::SIGTERM), "{}", stderr(&o));
    let left: Vec<String> = s
        .keys()
        .into_iter()
        .filter(|k| {
            ["queue", "alive", "waiters", "tickets"]
                .iter()
                .any(|kind| k.ends_with(&format!("\u{1f}{kind}")))
        })
        .collect();
    assert!(left.is_empty(), "the queue's keys stayed: {left:?}");
}

/// The contract: "a waiter that dies leaves the queue within a few seconds". Behind the front of the
/// queue a waiter heartbeats seconds apart and its entry stays until it reaches the front (docs/queue.md,
/// "Liveness"), but it must stop being listed at once: its wake subscription ends with it. One that is
/// stopped (SIGSTOP) still listens and is still listed: stopping is not dying.
fn a_waiter_that_dies_far_back_is_no_longer_listed_on(
    servers: &[&Server],
    lockctl: impl Fn() -> Command,
) {
    let token = hold(&mut lockctl(), "far");
    let mut kids = Vec::new();
    for _ in 0..6 {
        kids.push(acquirer(&mut lockctl(), "far", &[]));
        wait_queued(servers, "far", kids.len());
    }
    let pids: Vec<u64> = kids.iter().map(|k| k.id() as u64).collect();
    // The fifth and sixth stand behind the front (the first two places of a plain lock): wait until
    // every node keeps them longer than a front lifetime, so that the expiry alone would list them.
    let alive = "{lockctl:far}\u{1f}alive";
    let stretched = eventually(Duration::from_secs(30), || {
        servers.iter().all(|s| {
            let t: Vec<String> = s.cmd(&["TIME"]);
            let now_ms = t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000;
            let v: Vec<(String, u64)> = s.cmd(&["ZRANGE", alive, "0", "-1", "WITHSCORES"]);
            v.iter().filter(|(_, e)| *e > now_ms + 10_000).count() >= 2
        })
    });
    assert!(
        stretched,
        "the waiters far back did not get a longer heartbeat"
    );
    kill(pids[4] as i32, libc::SIGKILL);
    kill(pids[5] as i32, libc::SIGSTOP);
    let expected: Vec<u64> = [&pids[..4], &pids[5..]].concat();
    assert!(
        eventually(Duration::from_secs(3), || waiter_pids(
            &mut lockctl(),
            "far"
        ) == expected),
        "a dead waiter far back is still listed: {:?} (pids {pids:?})",
        status_json(&mut lockctl(), "far")["waiters"]
    );
    kill(pids[5] as i32, libc::SIGCONT);
    let o = run(lockctl().args(["release", "far", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    for (i, k) in kids.into_iter().enumerate() {
        let o = wait_output(k, Duration::from_secs(120));
        if i != 4 {
            assert_eq!(code(&o), 0, "{}", stderr(&o));
        }
    }
}

#[test]
fn a_waiter_that_dies_far_back_is_no_longer_listed() {
    let s = Server::start();
    a_waiter_that_dies_far_back_is_no_longer_listed_on(&[&s], || lockctl_on(&s));
}

#[test]
fn a_waiter_that_dies_far_back_is_no_longer_listed_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    a_waiter_that_dies_far_back_is_no_longer_listed_on(&all, || s.lockctl());
}

/// A waiter is listed from its enqueue on, by its expiry alone. The enqueue of the first waiter is
/// the first call that looks at the queue on the node, so it finds no time of a last look there
/// (`seen`, which the stall rule of `status.lua` needs); the waiter is stopped right after it (it
/// still listens: stopping is not dying), so that no heartbeat of its leaves one, and one left by a
/// heartbeat that came before the stop is deleted: the node as after the first enqueue. A round
/// counts only if `status` ran while the waiter's expiry was still ahead.
#[test]
fn a_waiter_is_listed_before_any_call_recorded_a_look_at_the_queue() {
    let s = Server::start();
    let now_ms = || {
        let t: Vec<String> = s.cmd(&["TIME"]);
        t[0].parse::<u64>().unwrap() * 1000 + t[1].parse::<u64>().unwrap() / 1000
    };
    let mut checked = false;
    for round in 0..10 {
        let name = format!("first{round}");
        let token = hold(&mut lockctl_on(&s), &name);
        let a = acquirer(&mut lockctl_on(&s), &name, &[]);
        let pid = a.id() as i32;
        wait_queued(&[&s], &name, 1);
        kill(pid, libc::SIGSTOP);
        let _: u64 = s.cmd(&["DEL", &format!("{{lockctl:{name}}}\u{1f}seen")]);
        let expiry = alive_until(&s, &name).expect("the waiter is queued");
        let pids = waiter_pids(&mut lockctl_on(&s), &name);
        let in_time = now_ms() < expiry;
        kill(pid, libc::SIGKILL);
        wait_output(a, Duration::from_secs(60));
        let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        if in_time {
            assert_eq!(pids, [pid as u64], "round {round}");
            checked = true;
            break;
        }
    }
    assert!(checked, "status never ran within a stopped waiter's expiry");
}

/// Asserts that the waiter `w` exits 75, displaced by the superseder of pid `pid` and note "build 3".
fn displaced_by_build_3(w: Child, pid: u64) {
    let o = wait_output(w, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 75, "{err}");
    assert!(err.contains("superseded"), "{err}");
    assert!(err.contains(&format!("pid {pid}")), "{err}");
    assert!(err.contains("note: build 3"), "{err}");
}

/// Releases "sup", held with `token`, through `lockctl`; asserts that the superseder `c` is then
/// granted.
fn granted_after_the_release(mut lockctl: Command, token: &str, c: Child) {
    let o = run(lockctl.args(["release", "sup", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(c, Duration::from_secs(60));
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "held".to_string()),
        "{}",
        stderr(&o)
    );
}

/// `--supersede` displaces the older waiters, never the holder.
fn supersede_case(servers: &[&Server], lockctl: impl Fn() -> Command) {
    let token = hold(&mut lockctl(), "sup");
    let a = acquirer(&mut lockctl(), "sup", &["--note", "build 1"]);
    wait_queued(servers, "sup", 1);
    let b = acquirer(&mut lockctl(), "sup", &["-E", "3"]);
    wait_queued(servers, "sup", 2);
    let c = acquirer(&mut lockctl(), "sup", &["--supersede", "--note", "build 3"]);
    let c_pid = c.id() as u64;
    displaced_by_build_3(a, c_pid);
    let o = wait_output(b, Duration::from_secs(60));
    assert_eq!(code(&o), 3, "-E applies: {}", stderr(&o));
    // The holder is untouched; the superseder alone waits.
    for s in servers {
        assert_eq!(s.get("lockctl:sup"), Some(token.clone()));
    }
    assert!(
        eventually(Duration::from_secs(5), || waiter_pids(
            &mut lockctl(),
            "sup"
        ) == [c_pid]),
        "{:?}",
        status_json(&mut lockctl(), "sup")["waiters"]
    );
    granted_after_the_release(lockctl(), &token, c);
}

#[test]
fn supersede_displaces_the_older_waiters_not_the_holder() {
    let s = Server::start();
    supersede_case(&[&s], || lockctl_on(&s));
}

#[test]
fn supersede_displaces_the_older_waiters_not_the_holder_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    supersede_case(&all, || s.lockctl());
}

/// The key of the displaced waiters' records.
fn superseded_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}superseded")
}

/// The waiters queued for `name` on `s`.
fn members(s: &Server, name: &str) -> Vec<String> {
    s.cmd(&["ZRANGE", &queue_key(name), "0", "-1"])
}

/// Redlock 3 with two nodes killed: a `--supersede` attempt reaches one node, never a quorum, and
/// gives up (69) having displaced nobody: the older waiter keeps its place on that node and no
/// `superseded` record is left there. (On the one-round code it displaced it there.)
#[test]
fn a_supersede_that_reaches_no_quorum_displaces_nobody() {
    let mut s = Servers::start(3);
    let token = hold(&mut s.lockctl(), "sup");
    let w = acquirer(&mut s.lockctl(), "sup", &[]);
    wait_queued(&s.0.iter().collect::<Vec<_>>(), "sup", 1);
    let before = members(&s[2], "sup");
    s[0].kill();
    s[1].kill();
    let o = run(s
        .lockctl()
        .args(["acquire", "sup", "-w", "2s", "--supersede"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert_eq!(members(&s[2], "sup"), before);
    let displaced: i64 = s[2].cmd(&["EXISTS", &superseded_key("sup")]);
    assert_eq!(displaced, 0, "a superseded record on the node reached");
    assert_eq!(s[2].get("lockctl:sup"), Some(token));
    kill(w.id() as i32, libc::SIGTERM);
    let o = wait_output(w, Duration::from_secs(60));
    assert!(!stderr(&o).contains("superseded"), "{}", stderr(&o));
}

/// Redlock 3 with two nodes stopped: a `--supersede` waiter queued on the third displaces nobody
/// while no quorum has taken it in, and displaces the older waiter once the nodes resume; then it
/// alone waits, and is granted at the release. (On the one-round code its first attempt displaced
/// the older waiter on the node it reached.)
#[test]
fn a_supersede_displaces_once_a_quorum_takes_it_in() {
    let s = Servers::start(3);
    let token = hold(&mut s.lockctl(), "sup");
    let w = acquirer(&mut s.lockctl(), "sup", &[]);
    wait_queued(&s.0.iter().collect::<Vec<_>>(), "sup", 1);
    s[0].pause();
    s[1].pause();
    let c = acquirer(
        &mut s.lockctl(),
        "sup",
        &["--supersede", "--note", "build 3"],
    );
    let c_pid = c.id() as u64;
    let displaced = || s[2].cmd::<i64>(&["EXISTS", &superseded_key("sup")]) == 1;
    let seen = eventually(Duration::from_secs(30), || {
        members(&s[2], "sup").len() == 2 || displaced()
    });
    assert!(seen, "the superseder never reached node 2");
    assert!(!displaced(), "displaced without a quorum");
    assert_eq!(members(&s[2], "sup").len(), 2);
    s[0].resume();
    s[1].resume();
    displaced_by_build_3(w, c_pid);
    granted_after_the_release(s.lockctl(), &token, c);
}

#[test]
fn notes_show_in_status_list_wait_lines_and_busy_messages() {
    let s = Server::start();
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_NOTE", "https://ci.example/jobs/41")
        .args(["acquire", "noted", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = acquirer(
        &mut lockctl_on(&s),
        "noted",
        &["-w", "2s", "--note", "job 42"],
    );
    let w_pid = w.id() as u64;
    wait_queued(&[&s], "noted", 1);

    let st = status_json(&mut lockctl_on(&s), "noted");
    assert_eq!(
        st["holders"][0]["holder"]["note"], "https://ci.example/jobs/41",
        "{st}"
    );
    assert_eq!(st["holder"]["note"], "https://ci.example/jobs/41", "{st}");
    assert_eq!(st["waiters"][0]["note"], "job 42", "{st}");
    assert_eq!(st["waiters"][0]["position"], 1, "{st}");
    assert_eq!(st["waiters"][0]["pid"], w_pid, "{st}");
    assert!(st["waiters"][0]["waited_ms"].as_i64().is_some(), "{st}");
    let plain = stdout(&run(lockctl_on(&s).args(["status", "noted"])));
    assert!(
        plain.contains("note: https://ci.example/jobs/41"),
        "{plain}"
    );
    assert!(plain.contains("waiters  1"), "{plain}");
    assert!(plain.contains(&format!("pid {w_pid}")), "{plain}");
    assert!(plain.contains("note: job 42"), "{plain}");

    let list = stdout(&run(lockctl_on(&s).args(["list"])));
    assert!(list.contains("WAITING"), "{list}");
    assert!(list.contains("note: https://ci.example/jobs/41"), "{list}");
    let lj: serde_json::Value = serde_json::from_str(&stdout(&run(
        lockctl_on(&s).args(["list", "--format", "json"])
    )))
    .expect("list prints JSON");
    let row = lj["locks"]
        .as_array()
        .and_then(|rows| rows.iter().find(|r| r["name"] == "noted"))
        .unwrap_or_else(|| panic!("no row for the lock: {lj}"));
    assert_eq!(row["waiters"], 1, "{lj}");
    assert_eq!(row["holder"]["note"], "https://ci.example/jobs/41", "{lj}");

    let o = wait_output(w, Duration::from_secs(60));
    let err = stderr(&o);
    assert_eq!(code(&o), 75, "{err}");
    assert!(err.contains("position 1 of 1"), "wait line: {err}");
    assert!(
        err.contains("lock 'noted' is busy (held by")
            && err.contains("note: https://ci.example/jobs/41"),
        "busy message: {err}"
    );
}

/// Wait lines give each waiter its place: the second of two is told `position 2 of 2`, the first
/// `position 1`.
#[test]
fn wait_lines_give_each_waiter_its_place() {
    let s = Server::start();
    let _token = hold(&mut lockctl_on(&s), "placed");
    let first = acquirer(&mut lockctl_on(&s), "placed", &["-w", "3s"]);
    wait_queued(&[&s], "placed", 1);
    let second = acquirer(&mut lockctl_on(&s), "placed", &["-w", "2s"]);
    let second = wait_output(second, Duration::from_secs(60));
    let first = wait_output(first, Duration::from_secs(60));
    assert_eq!(code(&second), 75, "{}", stderr(&second));
    assert!(
        stderr(&second).contains("position 2 of 2"),
        "wait line: {}",
        stderr(&second)
    );
    // Its busy message counts the other waiter.
    assert!(
        stderr(&second).contains("; 1 waiting)"),
        "busy message: {}",
        stderr(&second)
    );
    assert_eq!(code(&first), 75, "{}", stderr(&first));
    assert!(
        stderr(&first).contains("position 1 of"),
        "wait line: {}",
        stderr(&first)
    );
}

#[test]
fn a_bad_note_is_refused_before_redis_is_touched() {
    let s = Server::start();
    for (note, why) in [
        ("two\nlines", "control character"),
        (&"x".repeat(600)[..], "the limit is 512 bytes"),
    ] {
        for cmd in [
            vec!["acquire", "bad-note", "--note", note],
            vec!["exec", "bad-note", "--note", note, "--", "true"],
        ] {
            let o = run(lockctl_on(&s).args(&cmd));
            assert_eq!(code(&o), 2, "{}", stderr(&o));
            assert!(stderr(&o).contains("invalid --note"), "{}", stderr(&o));
            assert!(stderr(&o).contains(why), "{}", stderr(&o));
        }
        let o = run(lockctl_on(&s)
            .env("LOCKCTL_NOTE", note)
            .args(["acquire", "bad-note"]));
        assert_eq!(code(&o), 2, "{}", stderr(&o));
    }
    assert_eq!(s.keys(), Vec::<String>::new());
}

/// Calls of EVALSHA and EVAL on a server since its start or CONFIG RESETSTAT.
fn script_calls(s: &Server) -> u64 {
    let info: String = s.cmd(&["INFO", "commandstats"]);
    ["evalsha", "eval"]
        .iter()
        .map(|c| {
            let prefix = format!("cmdstat_{c}:calls=");
            info.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|rest| rest.split(',').next())
                .map_or(0, |n| n.parse().expect("numeric calls"))
        })
        .sum()
}

/// Issue 12: every release woke every waiter, so 30 waiters taking the lock once each cost 534
/// script calls (60 cost 1,947). Waking only the head makes it linear: a few calls per waiter (its
/// enqueue, the retry after subscribing, one heartbeat a second, the attempt it is woken for, its
/// release).
#[test]
fn n_handoffs_cost_a_linear_number_of_commands() {
    const N: usize = 30;
    let s = Server::start();
    let token = hold(&mut lockctl_on(&s), "handoff");
    let _: () = s.cmd(&["CONFIG", "RESETSTAT"]);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ran");
    let kids: Vec<Child> = (0..N)
        .map(|i| waiter(&mut lockctl_on(&s), "handoff", &file, &i.to_string(), &[]))
        .collect();
    wait_queued(&[&s], "handoff", N);
    let o = run(lockctl_on(&s).args(["release", "handoff", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    all_succeed(kids);
    let calls = script_calls(&s);
    eprintln!("{N} waiters, one handoff each: {calls} script calls");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), N);
    assert!(
        calls < 12 * N as u64,
        "{calls} script calls for {N} handoffs"
    );
}

/// With N slots the first N waiters in line may go together, in any order among themselves, but no
/// waiter is granted before more than N - 1 of those queued ahead of it: with N = 1, strict FIFO.
#[test]
fn semaphore_waiters_are_served_in_arrival_order() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let tokens: Vec<String> = (0..2)
        .map(|_| {
            let o = run(lockctl_on(&s).args(["acquire", "sem", "--ttl", "60s", "--limit", "2"]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
            stdout(&o)
        })
        .collect();
    let mut kids = Vec::new();
    for i in 1..=4 {
        // The fence orders the grants: a process's first write can lag behind the next grant's.
        kids.push(waiter(
            &mut lockctl_on(&s),
            "sem",
            &file,
            &format!("$LOCKCTL_FENCE {i}"),
            &["--limit", "2"],
        ));
        wait_queued(&[&s], "sem", i);
    }
    for t in &tokens {
        let o = run(lockctl_on(&s).args(["release", "sem", "--token", t]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    all_succeed(kids);
    let text = std::fs::read_to_string(&file).unwrap();
    let mut grants: Vec<(u64, &str)> = text
        .lines()
        .map(|l| {
            let (fence, who) = l.split_once(' ').expect("fence and number");
            (fence.parse().expect("a fence"), who)
        })
        .collect();
    grants.sort_unstable();
    let order: Vec<usize> = grants.iter().map(|(_, who)| who.parse().unwrap()).collect();
    for (at, &k) in order.iter().enumerate() {
        let overtaken = order[at + 1..].iter().filter(|&&j| j < k).count();
        assert!(
            overtaken <= 1,
            "waiter {k} overtook {overtaken} earlier ones: {order:?}"
        );
    }
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, [1, 2, 3, 4], "{text}");
}
