//! `--supersede` under attack, with real servers: two superseders at once, on one node and on
//! Redlock.

mod support;

use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use support::queue::queue_key;
use support::*;

/// The key of the displaced waiters' records.
fn superseded_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}superseded")
}

/// An `exec` waiting for `name` that prints its fence once it holds it.
fn acquirer(mut cmd: Command, name: &str, extra: &[&str]) -> Child {
    cmd.args(["exec", name, "--ttl", "60s"])
        .args(extra)
        .args(["-c", "echo fence $LOCKCTL_FENCE"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn exec")
}

/// Waits until `count` waiters are queued on every node of `on`.
fn queued_everywhere(on: &[&Server], name: &str, count: u64) {
    let ok = eventually(Duration::from_secs(30), || {
        on.iter()
            .all(|s| s.cmd::<u64>(&["ZCARD", &queue_key(name)]) == count)
    });
    assert!(ok, "{count} waiter(s) not queued on every node");
}

fn fence_of(o: &Output) -> Option<u64> {
    stdout(o).strip_prefix("fence ")?.parse().ok()
}

/// One round: a holder H, an older plain waiter W queued everywhere, then two `--supersede` waiters
/// started at the same instant. Returns (W's output, the superseders' outputs, H's fence).
fn two_superseders(on: &[&Server], lockctl: &dyn Fn() -> Command, name: &str) -> (Output, [Output; 2], u64) {
    let grant = acquire_json(&mut lockctl(), name, &["--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let fence = grant["fence"].as_u64().unwrap();
    let w = acquirer(lockctl(), name, &[]);
    queued_everywhere(on, name, 1);
    let a = acquirer(lockctl(), name, &["--supersede", "--note", "a"]);
    let b = acquirer(lockctl(), name, &["--supersede", "--note", "b"]);
    let w = wait_output(w, Duration::from_secs(60));
    // Both superseders have had time to queue and displace (a generous bound, not a measure).
    std::thread::sleep(Duration::from_secs(2));
    for s in on {
        assert_eq!(s.get(&format!("lockctl:{name}")), Some(token.clone()), "the holder's key");
    }
    let o = run(lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let a = wait_output(a, Duration::from_secs(60));
    let b = wait_output(b, Duration::from_secs(60));
    (w, [a, b], fence)
}

/// Runs `rounds` rounds; every one must end with W displaced (75), exactly one superseder displaced
/// (75, naming the other's note) and the other granted once, with a fence above the holder's.
fn race(on: &[&Server], lockctl: &dyn Fn() -> Command, rounds: usize) {
    let mut outcomes = Vec::new();
    for r in 0..rounds {
        let name = format!("race{r}");
        let (w, s, fence) = two_superseders(on, lockctl, &name);
        assert_eq!(code(&w), 75, "W: {}", stderr(&w));
        let codes = [code(&s[0]), code(&s[1])];
        eprintln!("round {r}: superseders exited {codes:?}");
        for (i, o) in s.iter().enumerate() {
            eprintln!("  {i}: {} / {}", stdout(o), stderr(o).trim());
        }
        outcomes.push(codes);
        for o in &s {
            if code(o) == 0 {
                let f = fence_of(o).expect("a granted superseder prints its fence");
                assert!(f > fence, "fence {f} not above the holder's {fence}");
            }
        }
    }
    let good = outcomes
        .iter()
        .filter(|c| {
            let mut c = **c;
            c.sort();
            c == [0, 75]
        })
        .count();
    assert_eq!(good, rounds, "rounds where exactly one superseder was displaced: {outcomes:?}");
}

/// One node: the scripts run one after the other, so the later superseder displaces the earlier.
#[test]
fn two_superseders_at_once_one_wins() {
    let s = Server::start();
    race(&[&s], &|| lockctl_on(&s), 10);
}

/// Redlock 3: the two superseders' attempts reach the nodes in either order.
#[test]
fn two_superseders_at_once_one_wins_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    race(&all, &|| s.lockctl(), 10);
}

/// The members queued for `name` on `s`.
fn members(s: &Server, name: &str) -> Vec<String> {
    s.cmd(&["ZRANGE", &queue_key(name), "0", "-1"])
}

/// One node, stopped while a `--supersede` waiter S makes its first attempts: none is answered, so
/// S never learns that it joined the queue. At the resume the server runs S's buffered attempt,
/// which queues S and displaces the older W (S did join, so W's 75 is due). S is then stopped past
/// its lifetime; a plain waiter L queues meanwhile, behind S, and S is dropped. Resumed, S queues
/// anew: docs/queue.md says it displaces once, "nor does it displace again when it queues anew
/// after a stop longer than its lifetime", so L must keep its place and be served.
#[test]
fn a_superseder_that_never_heard_its_first_answer_displaces_again_after_a_lapse() {
    let s = Server::start();
    let name = "lapse";
    let token = support::queue::hold(&mut lockctl_on(&s), name);
    let w = acquirer(lockctl_on(&s), name, &[]);
    queued_everywhere(&[&s], name, 1);
    s.pause();
    let sup = acquirer(lockctl_on(&s), name, &["--supersede", "--note", "S"]);
    let sup_pid = sup.id() as i32;
    // S's attempts time out against the stopped node (500 ms each) and stay in its socket buffer.
    std::thread::sleep(Duration::from_millis(1500));
    kill(sup_pid, libc::SIGSTOP);
    s.resume();
    let _: String = s.cmd(&["PING"]);
    let w = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&w), 75, "W: {}", stderr(&w));
    assert!(stderr(&w).contains(&format!("pid {sup_pid}")), "{}", stderr(&w));
    let before = members(&s, name);
    let l = acquirer(lockctl_on(&s), name, &["--note", "L"]);
    assert!(
        eventually(Duration::from_secs(30), || members(&s, name)
            .iter()
            .any(|m| !before.contains(m))),
        "L never queued"
    );
    let l_id: String = members(&s, name)
        .into_iter()
        .find(|m| !before.contains(m))
        .unwrap();
    // S, stopped, is dropped once its heartbeat expiry passes (L's heartbeats run the scripts).
    assert!(
        eventually(Duration::from_secs(60), || members(&s, name) == [l_id.clone()]),
        "S never dropped: {:?}",
        members(&s, name)
    );
    kill(sup_pid, libc::SIGCONT);
    // S's next attempt runs at once; give it time to queue (a generous bound).
    std::thread::sleep(Duration::from_secs(2));
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let l = wait_output(l, Duration::from_secs(60));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("L: {:?} {}", l.status, stderr(&l));
    eprintln!("S: {:?} {}", sup.status, stderr(&sup));
    assert_eq!(code(&l), 0, "L, queued while S was stopped, displaced: {}", stderr(&l));
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}

/// Redlock 3, a `--supersede` waiter S that is stopped (SIGSTOP) past its lifetime after it
/// displaced the older W, while a plain waiter L queues behind it; resumed, S queues anew and must
/// displace nobody (docs/queue.md: "nor does it displace again when it queues anew after a stop
/// longer than its lifetime"). `partial`: node 1 is stopped between S's first attempt and its
/// displacing one (node 2 is stopped from the start, and its timeout, 2 s, makes the first attempt
/// last long enough), so that the displacing attempt is answered by node 0 alone.
fn redlock_lapse(partial: bool) {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "lapse";
    let lc = || {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", "2s");
        c
    };
    let token = support::queue::hold(&mut lc(), name);
    let w = acquirer(lc(), name, &[]);
    queued_everywhere(&all, name, 1);
    if partial {
        s[2].pause();
    }
    let sup = acquirer(lc(), name, &["--supersede", "--note", "S", "-v"]);
    let sup_pid = sup.id() as i32;
    if partial {
        assert!(
            eventually(Duration::from_secs(30), || members(&s[0], name).len() == 2
                && members(&s[1], name).len() == 2),
            "S never queued on nodes 0 and 1"
        );
        s[1].pause();
        // The displacing attempt reaches node 0 and times out on the others.
        assert!(
            eventually(Duration::from_secs(30), || s[0]
                .cmd::<i64>(&["EXISTS", &superseded_key(name)])
                == 1),
            "S never displaced W on node 0"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let w = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&w), 75, "W: {}", stderr(&w));
    assert!(stderr(&w).contains(&format!("pid {sup_pid}")), "{}", stderr(&w));
    kill(sup_pid, libc::SIGSTOP);
    if partial {
        s[1].resume();
        s[2].resume();
        for n in &all {
            let _: String = n.cmd(&["PING"]);
        }
    }
    let before: Vec<Vec<String>> = all.iter().map(|n| members(n, name)).collect();
    let l = acquirer(lc(), name, &["--note", "L"]);
    let new_on = |i: usize| -> Vec<String> {
        members(all[i], name)
            .into_iter()
            .filter(|m| !before[i].contains(m))
            .collect()
    };
    assert!(
        eventually(Duration::from_secs(30), || (0..3).all(|i| new_on(i).len() == 1)),
        "L never queued everywhere"
    );
    let l_id = new_on(0).remove(0);
    // S, stopped, is dropped everywhere once its heartbeat expiry passes.
    assert!(
        eventually(Duration::from_secs(60), || all
            .iter()
            .all(|n| members(n, name) == [l_id.clone()])),
        "S never dropped: {:?}",
        all.iter().map(|n| members(n, name)).collect::<Vec<_>>()
    );
    kill(sup_pid, libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(3));
    let o = run(lc().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let l = wait_output(l, Duration::from_secs(60));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("L: {:?} {}", l.status, stderr(&l));
    eprintln!("S: {:?} {}", sup.status, stderr(&sup));
    for n in &all {
        let h: Vec<String> = n.cmd(&["HGETALL", &superseded_key(name)]);
        eprintln!("superseded: {h:?}");
    }
    assert_eq!(code(&l), 0, "L, queued while S was stopped, displaced: {}", stderr(&l));
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}

/// The displacing attempt answered by a quorum: S waits as any waiter afterwards. (Held.)
#[test]
fn a_superseder_displaces_once_also_after_a_lapse_on_redlock() {
    redlock_lapse(false);
}

/// The displacing attempt answered by one node of three (docs/queue.md's gap: W is displaced by a
/// superseder that a quorum had queued): S stays in its displacing mode, and after its lapse it
/// queues anew and displaces L, who queued after it.
#[test]
fn a_superseder_whose_displacing_attempt_reached_one_node_displaces_again_after_a_lapse() {
    redlock_lapse(true);
}

/// Redlock 3, node 2 stopped while a `--supersede` waiter S makes its first attempt and its
/// displacing one: both wait in node 2's socket buffer, and the first, run at the resume, gives S
/// a ticket from the server's clock then, above the ticket S carries (the largest nodes 0 and 1
/// gave). Node 2 then runs the displacing attempt: acquire.lua lowers S's score to the carried
/// ticket before it looks below the old score, and displaces S itself there. S must not be
/// displaced, by anyone, least of all by itself, and is granted at the release.
#[test]
fn a_superseder_never_displaces_itself() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "self";
    let lc = || {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", "1s");
        c
    };
    let token = support::queue::hold(&mut lc(), name);
    let w = acquirer(lc(), name, &[]);
    queued_everywhere(&all, name, 1);
    s[2].pause();
    let sup = acquirer(lc(), name, &["--supersede", "--note", "S"]);
    let sup_pid = sup.id();
    let displaced_on = |n: &Server| n.cmd::<i64>(&["EXISTS", &superseded_key(name)]) == 1;
    assert!(
        eventually(Duration::from_secs(30), || displaced_on(&s[0]) && displaced_on(&s[1])),
        "S never displaced W on nodes 0 and 1"
    );
    let sup_id = members(&s[0], name);
    assert_eq!(sup_id.len(), 1, "S alone queued on node 0: {sup_id:?}");
    // The displacing attempt times out on node 2 (1 s) and S waits on as a plain waiter.
    std::thread::sleep(Duration::from_millis(1500));
    s[2].resume();
    let _: String = s[2].cmd(&["PING"]);
    let w = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&w), 75, "W: {}", stderr(&w));
    std::thread::sleep(Duration::from_secs(2));
    let records: Vec<Vec<String>> = all
        .iter()
        .map(|n| n.cmd(&["HKEYS", &superseded_key(name)]))
        .collect();
    let o = run(lc().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("S {sup_pid} ({}): {:?} {}", sup_id[0], sup.status, stderr(&sup));
    assert!(
        records.iter().all(|r| !r.contains(&sup_id[0])),
        "S's own id among the displaced: {records:?}"
    );
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}
