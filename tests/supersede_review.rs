//! `--supersede` attacked with real servers (stopped with SIGSTOP, runs of two superseders at
//! once, a superseder stopped past its lifetime), against the promises of the contract and
//! docs/queue.md: a superseder that fails or gives up before a quorum took it in displaces
//! nobody; it displaces once, only waiters queued before it, never itself; the holder is never
//! touched; of two superseders at once one ends up ahead; nothing stays beyond its documented
//! expiry. The tests that failed on the code they attacked (43c3b1c) each say what they show
//! and how often; all of them pass since the fixes that followed (docs/queue.md, `--supersede`),
//! the one ignored test excepted (a documented gap).
//!
//! Node timeouts are set per test where a stopped node must hold an attempt in its socket buffer
//! for a while: the server runs what was buffered when it resumes, in the order the connections
//! were made.

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

/// Holds `name` through `lockctl` and queues a waiter W behind the holder on every node of `on`;
/// returns the holder's token and W.
fn with_a_waiter(on: &[&Server], lockctl: impl Fn() -> Command, name: &str) -> (String, Child) {
    let token = support::queue::hold(&mut lockctl(), name);
    let w = acquirer(lockctl(), name, &[]);
    queued_everywhere(on, name, 1);
    (token, w)
}

/// `name` held on every node of `s` and a waiter W queued behind the holder on each, lockctl given
/// a node timeout of `timeout` (a stopped node costs a command that long, no more). Returns that
/// lockctl, the holder's token and W.
fn held_with_a_waiter<'a>(
    s: &'a Servers,
    name: &str,
    timeout: &'static str,
) -> (impl Fn() -> Command + 'a, String, Child) {
    let lc = move || {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", timeout);
        c
    };
    let all: Vec<&Server> = s.0.iter().collect();
    let (token, w) = with_a_waiter(&all, lc, name);
    (lc, token, w)
}

/// Releases `name` held with `token` through `lockctl`; asserts that the release succeeded.
fn release(mut lockctl: Command, name: &str, token: &str) {
    let o = run(lockctl.args(["release", name, "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

fn fence_of(o: &Output) -> Option<u64> {
    stdout(o).strip_prefix("fence ")?.parse().ok()
}

/// One round: a holder H, an older plain waiter W queued everywhere, then two `--supersede` waiters
/// started at the same instant. Returns (W's output, the superseders' outputs, H's fence).
fn two_superseders(
    on: &[&Server],
    lockctl: &dyn Fn() -> Command,
    name: &str,
) -> (Output, [Output; 2], u64) {
    let grant = acquire_json(&mut lockctl(), name, &["--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let fence = grant["fence"].as_u64().unwrap();
    let w = acquirer(lockctl(), name, &[]);
    queued_everywhere(on, name, 1);
    let counter = format!("{{lockctl:{name}}}\u{1f}fence");
    let counters: Vec<Option<String>> = on.iter().map(|s| s.get(&counter)).collect();
    let pttls = || -> Vec<i64> {
        on.iter()
            .map(|s| s.cmd(&["PTTL", &format!("lockctl:{name}")]))
            .collect()
    };
    let before = pttls();
    let a = acquirer(lockctl(), name, &["--supersede", "--note", "a"]);
    let b = acquirer(lockctl(), name, &["--supersede", "--note", "b"]);
    let w = wait_output(w, Duration::from_secs(60));
    // Both superseders have had time to queue and displace (a generous bound, not a measure).
    std::thread::sleep(Duration::from_secs(2));
    for s in on {
        assert_eq!(
            s.get(&format!("lockctl:{name}")),
            Some(token.clone()),
            "the holder's key"
        );
    }
    // The holder's lease only runs down, and nobody was granted meanwhile.
    let after = pttls();
    assert!(
        after.iter().zip(&before).all(|(a, b)| a <= b && *a > 0),
        "the holder's TTL: {before:?} then {after:?}"
    );
    let now: Vec<Option<String>> = on.iter().map(|s| s.get(&counter)).collect();
    assert_eq!(
        now, counters,
        "the fencing counter moved while the holder held"
    );
    release(lockctl(), name, &token);
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
    assert_eq!(
        good, rounds,
        "rounds where exactly one superseder was displaced: {outcomes:?}"
    );
}

/// One node: the scripts run one after the other, so the later superseder displaces the earlier.
/// (Held: 70 of 70 rounds.)
#[test]
fn two_superseders_at_once_one_wins() {
    let s = Server::start();
    race(&[&s], &|| lockctl_on(&s), 10);
}

/// Redlock 3: the two superseders' attempts reach the nodes in either order, and each displaces,
/// on the node where the other's score is below its own, the other one: both exit 75, each naming
/// the other, and nobody is left waiting (the holder's next grant goes to whoever comes next).
/// Both were displaced in 13 of 70 rounds (7 runs of 10, each run failing); on the code before
/// 43c3b1c too (3 of 10), the attempt that displaces having only moved to the next round. Fixed by
/// the agreed order in the `superseded` record (the later superseder's displacements stand): 90
/// of 90 rounds held (9 runs); with only the displacement bound fixed, both displaced in 12 of 60
/// rounds of this test and the Redlock 5 one together (3 runs each, 5 of the 6 failing).
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

/// Whether each node of `on` keeps a `superseded` record for `name` (1) or not (0).
fn records_on(on: &[&Server], name: &str) -> Vec<i64> {
    on.iter()
        .map(|n| n.cmd(&["EXISTS", &superseded_key(name)]))
        .collect()
}

/// The ids of the waiters each node of `on` records as displaced from `name`'s queue.
fn displaced_ids(on: &[&Server], name: &str) -> Vec<Vec<String>> {
    on.iter()
        .map(|n| n.cmd(&["HKEYS", &superseded_key(name)]))
        .collect()
}

/// Asserts that W and a superseder S are queued for `name` on nodes 0 and 1 of `s` within 30 s.
fn queued_on_0_and_1(s: &Servers, name: &str) {
    assert!(
        eventually(Duration::from_secs(30), || members(&s[0], name).len() == 2
            && members(&s[1], name).len() == 2),
        "S never queued on nodes 0 and 1"
    );
}

/// Asserts that a superseder displaced W from `name`'s queue on nodes 0 and 1 of `s` within 30 s.
fn displaced_on_0_and_1(s: &Servers, name: &str) {
    let displaced_on = |n: &Server| n.cmd::<i64>(&["EXISTS", &superseded_key(name)]) == 1;
    assert!(
        eventually(Duration::from_secs(30), || displaced_on(&s[0])
            && displaced_on(&s[1])),
        "S never displaced W on nodes 0 and 1"
    );
}

/// Redlock 3, node 2 stopped while a superseder S (node timeout 1 s) displaces W on nodes 0 and 1:
/// resumes node 2 once S's displacing attempt has timed out there, asserts that W exits 75, and
/// returns the ids each node records as displaced once node 2 has run what it buffered.
fn displaced_once_node_2_resumes(s: &Servers, w: Child, name: &str) -> Vec<Vec<String>> {
    // The displacing attempt times out on node 2 (1 s) and S waits on as a plain waiter.
    std::thread::sleep(Duration::from_millis(1500));
    s[2].resume();
    let _: String = s[2].cmd(&["PING"]);
    let w = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&w), 75, "W: {}", stderr(&w));
    std::thread::sleep(Duration::from_secs(2));
    displaced_ids(&s.0.iter().collect::<Vec<_>>(), name)
}

/// Redlock 3: node 2 stopped, a `--supersede -w 6s` waiter S started through `lockctl`, node 1
/// stopped once S is queued on nodes 0 and 1, so that S's displacing attempt is answered by node 0
/// alone; asserts that S gives up ungranted, then resumes nodes 1 and 2.
fn given_up_between_its_attempts(s: &Servers, lockctl: Command, name: &str) {
    s[2].pause();
    let sup = acquirer(lockctl, name, &["--supersede", "-w", "6s"]);
    queued_on_0_and_1(s, name);
    s[1].pause();
    let o = wait_output(sup, Duration::from_secs(60));
    eprintln!("S: {:?} {}", o.status, stderr(&o));
    assert_ne!(o.status.code(), Some(0), "S was granted");
    s[1].resume();
    s[2].resume();
}

/// One node, stopped while a `--supersede` waiter S makes its first attempts: none is answered, so
/// S never learns that it joined the queue. At the resume the server runs S's buffered attempts,
/// which queue S. S is then stopped past its lifetime; a plain waiter L queues meanwhile, behind
/// S, and S is dropped. Resumed, S queues anew: docs/queue.md says it displaces once, "nor does it
/// displace again when it queues anew after a stop longer than its lifetime", so L must keep its
/// place and be served. It displaced L (7 of 7 runs): with no answer it never left its displacing
/// mode (`Place::supersede_answered` counts only the replies it read).
///
/// Its buffered attempts displace nobody either: S read no answer, so, as on Redlock, it had not
/// yet sent an attempt that displaces (an unanswered one may run after S gave up, see
/// `given_up_during_a_stall`). Before that change they displaced the older W at the resume.
#[test]
fn a_superseder_that_never_heard_its_first_answer_displaces_again_after_a_lapse() {
    let s = Server::start();
    let name = "lapse";
    let (token, w) = with_a_waiter(&[&s], || lockctl_on(&s), name);
    let w_id = members(&s, name).remove(0);
    s.pause();
    let sup = acquirer(lockctl_on(&s), name, &["--supersede", "--note", "S"]);
    let sup_pid = sup.id() as i32;
    // S's attempts time out against the stopped node (500 ms each) and stay in its socket buffer.
    std::thread::sleep(Duration::from_millis(1500));
    kill(sup_pid, libc::SIGSTOP);
    s.resume();
    let _: String = s.cmd(&["PING"]);
    assert!(
        eventually(Duration::from_secs(30), || members(&s, name).len() == 2),
        "S's buffered attempts never queued it: {:?}",
        members(&s, name)
    );
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
    // S, stopped, is dropped once its heartbeat expiry passes (W's and L's heartbeats run the
    // scripts).
    assert!(
        eventually(Duration::from_secs(60), || members(&s, name)
            == [w_id.clone(), l_id.clone()]),
        "S never dropped: {:?}",
        members(&s, name)
    );
    kill(sup_pid, libc::SIGCONT);
    // S's next attempt runs at once; give it time to queue (a generous bound).
    std::thread::sleep(Duration::from_secs(2));
    let records: Vec<String> = s.cmd(&["HKEYS", &superseded_key(name)]);
    release(lockctl_on(&s), name, &token);
    let w = wait_output(w, Duration::from_secs(60));
    let l = wait_output(l, Duration::from_secs(60));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("W: {:?} {}", w.status, stderr(&w));
    eprintln!("L: {:?} {}", l.status, stderr(&l));
    eprintln!("S: {:?} {}", sup.status, stderr(&sup));
    assert!(records.is_empty(), "displaced: {records:?}");
    assert_eq!(code(&w), 0, "W: {}", stderr(&w));
    assert_eq!(
        code(&l),
        0,
        "L, queued while S was stopped, displaced: {}",
        stderr(&l)
    );
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
    let (lc, token, w) = held_with_a_waiter(&s, name, "2s");
    if partial {
        s[2].pause();
    }
    let sup = acquirer(lc(), name, &["--supersede", "--note", "S", "-v"]);
    let sup_pid = sup.id() as i32;
    if partial {
        queued_on_0_and_1(&s, name);
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
    assert!(
        stderr(&w).contains(&format!("pid {sup_pid}")),
        "{}",
        stderr(&w)
    );
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
        eventually(Duration::from_secs(30), || (0..3)
            .all(|i| new_on(i).len() == 1)),
        "L never queued everywhere"
    );
    let l_id = new_on(0).remove(0);
    // S, stopped, is dropped everywhere once its heartbeat expiry passes.
    assert!(
        eventually(Duration::from_secs(60), || all.iter().all(|n| members(
            n, name
        ) == [
            l_id.clone()
        ])),
        "S never dropped: {:?}",
        all.iter().map(|n| members(n, name)).collect::<Vec<_>>()
    );
    kill(sup_pid, libc::SIGCONT);
    std::thread::sleep(Duration::from_secs(3));
    release(lc(), name, &token);
    let l = wait_output(l, Duration::from_secs(60));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("L: {:?} {}", l.status, stderr(&l));
    eprintln!("S: {:?} {}", sup.status, stderr(&sup));
    for n in &all {
        let h: Vec<String> = n.cmd(&["HGETALL", &superseded_key(name)]);
        eprintln!("superseded: {h:?}");
    }
    assert_eq!(
        code(&l),
        0,
        "L, queued while S was stopped, displaced: {}",
        stderr(&l)
    );
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}

/// The displacing attempt answered by a quorum: S waits as any waiter afterwards. (Held, 6 of
/// 6; on the code before 43c3b1c it displaced L.)
#[test]
fn a_superseder_displaces_once_also_after_a_lapse_on_redlock() {
    redlock_lapse(false);
}

/// The displacing attempt answered by one node of three (docs/queue.md's gap: W is displaced by a
/// superseder that a quorum had queued): S stays in its displacing mode, and after its lapse it
/// queues anew and displaces L, who queued after it (7 of 7 runs). S then exits 75 itself,
/// "superseded" by its own pid (see `a_superseder_never_displaces_itself`). Fixed: a lapse ends
/// the displacing mode (held in every run since, 5 of 5).
#[test]
fn a_superseder_whose_displacing_attempt_reached_one_node_displaces_again_after_a_lapse() {
    redlock_lapse(true);
}

/// Redlock 3, node 2 stopped while a `--supersede` waiter S makes its first attempt and its
/// displacing one: both wait in node 2's socket buffer, and the first, run at the resume, gives S
/// a ticket from the server's clock then, above the ticket S carries (the largest nodes 0 and 1
/// gave). Node 2 then runs the displacing attempt: acquire.lua lowers S's score to the carried
/// ticket before it looks below the old score, and displaces S itself there. S must not be
/// displaced, by anyone, least of all by itself, and is granted at the release. S exits 75,
/// "superseded in the queue by" its own pid, 6 of 6 runs; on the code before 43c3b1c (which
/// displaced only on a first enqueue, below the new ticket) the test passes, 4 of 4. Fixed: the
/// bound is the lower of that score and the carried ticket, the caller is never among the
/// displaced, and node 2 (which never answered S) gets a deadline of 0 (held, 5 of 5).
#[test]
fn a_superseder_never_displaces_itself() {
    let s = Servers::start(3);
    let name = "self";
    let (lc, token, w) = held_with_a_waiter(&s, name, "1s");
    s[2].pause();
    let sup = acquirer(lc(), name, &["--supersede", "--note", "S"]);
    let sup_pid = sup.id();
    displaced_on_0_and_1(&s, name);
    let sup_id = members(&s[0], name);
    assert_eq!(sup_id.len(), 1, "S alone queued on node 0: {sup_id:?}");
    let records = displaced_once_node_2_resumes(&s, w, name);
    release(lc(), name, &token);
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!(
        "S {sup_pid} ({}): {:?} {}",
        sup_id[0],
        sup.status,
        stderr(&sup)
    );
    assert!(
        records.iter().all(|r| !r.contains(&sup_id[0])),
        "S's own id among the displaced: {records:?}"
    );
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}

/// Once every client of `name` has exited: on every node of `on`, only the fencing counter stays
/// without an expiry, the queue's keys are gone (within a waiter's lifetime, for one that a node
/// ran late), and a `superseded` record expires within its minute.
fn nothing_left(on: &[&Server], name: &str) {
    let fence = format!("{{lockctl:{name}}}\u{1f}fence");
    let left = || -> Vec<(String, i64)> {
        on.iter()
            .flat_map(|n| {
                n.keys()
                    .into_iter()
                    .filter(|k| k.contains(name) && *k != fence)
                    .map(|k| {
                        let ttl: i64 = n.cmd(&["PTTL", &k]);
                        (k, ttl)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let ok = eventually(Duration::from_secs(15), || {
        left()
            .iter()
            .all(|(k, ttl)| *k == superseded_key(name) && (1..=60_000).contains(ttl))
    });
    assert!(ok, "left behind: {:?}", left());
}

/// How a superseder stops waiting.
#[derive(Clone, Copy, Debug)]
enum GiveUp {
    Signal(i32),
    Deadline,
}

/// `n` nodes, the first `stopped` of them stopped before a `--supersede` waiter S arrives, and S
/// stops waiting (`how`) while they are stopped: S never heard a quorum take it in, so it must
/// displace nobody, also once the nodes resume and run what was buffered: no `superseded` record,
/// the older W keeps its place everywhere and is granted at the release.
fn given_up_during_a_stall(n: usize, stopped: usize, how: GiveUp) {
    let s = Servers::start(n);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "gaveup";
    let (token, w) = with_a_waiter(&all, || s.lockctl(), name);
    let w_id = members(&s[0], name);
    for node in &all[..stopped] {
        node.pause();
    }
    let extra: &[&str] = match how {
        GiveUp::Deadline => &["--supersede", "-w", "2s"],
        GiveUp::Signal(_) => &["--supersede"],
    };
    let sup = acquirer(s.lockctl(), name, extra);
    std::thread::sleep(Duration::from_millis(1500));
    if let GiveUp::Signal(sig) = how {
        kill(sup.id() as i32, sig);
    }
    let o = wait_output(sup, Duration::from_secs(60));
    eprintln!("S ({how:?}): {:?} {}", o.status, stderr(&o));
    assert_ne!(o.status.code(), Some(0), "S was granted");
    for node in &all[..stopped] {
        node.resume();
        let _: String = node.cmd(&["PING"]);
    }
    // W heartbeats (1 s) meanwhile: it would have learned of a displacement.
    std::thread::sleep(Duration::from_secs(3));
    let records = records_on(&all, name);
    let queues: Vec<Vec<String>> = all.iter().map(|n| members(n, name)).collect();
    release(s.lockctl(), name, &token);
    let w = wait_output(w, Duration::from_secs(60));
    assert_eq!(
        records,
        vec![0; n],
        "superseded records left by S, who gave up"
    );
    assert!(
        queues.iter().all(|q| q.contains(&w_id[0])),
        "W lost its place: {queues:?}"
    );
    assert_eq!(code(&w), 0, "W: {}", stderr(&w));
    nothing_left(&all, name);
}

/// Redlock 3 with two nodes stopped: S, queued on one, is SIGTERMed. (Held, 6 of 6 runs:
/// its buffered attempts wait as any waiter's.)
#[test]
fn a_superseder_signalled_before_a_quorum_displaces_nobody_on_redlock() {
    given_up_during_a_stall(3, 2, GiveUp::Signal(libc::SIGTERM));
}

/// Redlock 3 with two nodes stopped: S, queued on one, is SIGINTed. (Held, 6 of 6.)
#[test]
fn a_superseder_interrupted_before_a_quorum_displaces_nobody_on_redlock() {
    given_up_during_a_stall(3, 2, GiveUp::Signal(libc::SIGINT));
}

/// Redlock 3 with two nodes stopped: S's `-w 2s` ends. (Held, 6 of 6.)
#[test]
fn a_superseder_whose_wait_ends_before_a_quorum_displaces_nobody_on_redlock() {
    given_up_during_a_stall(3, 2, GiveUp::Deadline);
}

/// One node, stopped: S's attempts go unanswered and S is SIGTERMed; the node then runs them. On
/// one node the first attempt displaces (its script checks the refusals first), so the buffered
/// attempt, run after S is gone, displaces W and leaves a `superseded` record naming S: 6 of 6
/// runs (also before 43c3b1c). Fixed: one node displaces only in the attempt after one whose
/// answer S read (held, 5 of 5).
#[test]
fn a_superseder_signalled_during_a_stall_displaces_nobody() {
    given_up_during_a_stall(1, 1, GiveUp::Signal(libc::SIGTERM));
}

/// One node, stopped: S's `-w 2s` ends (69); the node then runs its attempts, which displace W:
/// 6 of 6 runs (also before 43c3b1c). Fixed as the one above (held, 5 of 5).
#[test]
fn a_superseder_whose_wait_ends_during_a_stall_displaces_nobody() {
    given_up_during_a_stall(1, 1, GiveUp::Deadline);
}

/// `--limit 2` with two holders running (their commands sleep, then print their fence) and two
/// older waiters W1, W2: a `--supersede` waiter S displaces both (75, naming S), a later L queued
/// behind S keeps its place, the holders' keys stay as they were and their commands run to the end
/// (exit 0), and S and L are granted once the holders are done, with four distinct fences.
fn limit_two(on: &[&Server], lockctl: &dyn Fn() -> Command) {
    let name = "pool";
    let holder = |cmd: Command| {
        let mut cmd = cmd;
        cmd.args(["exec", name, "--limit", "2", "--ttl", "60s", "-c"])
            .arg("sleep 8; echo fence $LOCKCTL_FENCE")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn holder")
    };
    let slots = || -> Vec<(Option<String>, Option<String>)> {
        on.iter()
            .map(|n| (n.get(&slot_key(name, 1)), n.get(&slot_key(name, 2))))
            .collect()
    };
    // One after the other, so that each takes its slot on every node (no split vote).
    let h1 = holder(lockctl());
    assert!(
        eventually(Duration::from_secs(30), || slots()
            .iter()
            .all(|(a, _)| a.is_some())),
        "the first holder never held slot 1 everywhere: {:?}",
        slots()
    );
    let h2 = holder(lockctl());
    assert!(
        eventually(Duration::from_secs(30), || slots()
            .iter()
            .all(|(_, b)| b.is_some())),
        "the second holder never held slot 2 everywhere: {:?}",
        slots()
    );
    let held = slots();
    let lim = ["--limit", "2"];
    let w1 = acquirer(lockctl(), name, &lim);
    queued_everywhere(on, name, 1);
    let w2 = acquirer(lockctl(), name, &lim);
    queued_everywhere(on, name, 2);
    let sup = acquirer(
        lockctl(),
        name,
        &["--limit", "2", "--supersede", "--note", "S"],
    );
    let sup_pid = sup.id();
    for w in [w1, w2] {
        let o = wait_output(w, Duration::from_secs(60));
        assert_eq!(code(&o), 75, "{}", stderr(&o));
        assert!(
            stderr(&o).contains(&format!("pid {sup_pid}")),
            "{}",
            stderr(&o)
        );
    }
    queued_everywhere(on, name, 1);
    let l = acquirer(lockctl(), name, &lim);
    queued_everywhere(on, name, 2);
    assert_eq!(slots(), held, "the holders' slots changed");
    let mut fences = Vec::new();
    for o in [h1, h2, sup, l].map(|c| wait_output(c, Duration::from_secs(60))) {
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        fences.push(fence_of(&o).expect("a fence"));
    }
    let mut distinct = fences.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), 4, "fences {fences:?}");
    assert!(
        fences[2] > fences[0].max(fences[1]) && fences[3] > fences[0].max(fences[1]),
        "fences {fences:?}"
    );
    nothing_left(on, name);
}

#[test]
fn supersede_with_limit_two() {
    let s = Server::start();
    limit_two(&[&s], &|| lockctl_on(&s));
}

#[test]
fn supersede_with_limit_two_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    limit_two(&all, &|| s.lockctl());
}

/// Redlock 5: both displaced in 18 of 70 rounds (7 runs of 10, each run failing). Fixed as on
/// Redlock 3: 90 of 90 rounds held (9 runs).
#[test]
fn two_superseders_at_once_one_wins_on_redlock_5() {
    let s = Servers::start(5);
    let all: Vec<&Server> = s.0.iter().collect();
    race(&all, &|| s.lockctl(), 10);
}

/// Redlock 3, node 2 stopped from the start (its 2 s timeout makes S's first attempt last that
/// long) and node 1 stopped once S is queued on nodes 0 and 1: S's displacing attempt is answered by
/// node 0 alone, which displaces W, and S's `-w 6s` then ends (69). The gap docs/queue.md
/// documents ("between the two attempts ... nodes can go down. The second attempt then displaces
/// on the nodes that accept it"): W exits 75 naming a superseder that never got the lock and is gone
/// (6 of 6 runs with `--ignored`; every node kept a `superseded` record).
#[test]
#[ignore = "documented gap (docs/queue.md, --supersede): a node stopped between a Redlock superseder's two attempts; the displaced waiter exits 75 naming a superseder that then gives up"]
fn a_superseder_that_fails_after_a_node_stopped_between_its_attempts_displaces_nobody() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "between";
    let (lc, token, w) = held_with_a_waiter(&s, name, "2s");
    given_up_between_its_attempts(&s, lc(), name);
    std::thread::sleep(Duration::from_secs(3));
    let records = records_on(&all, name);
    release(lc(), name, &token);
    let w = wait_output(w, Duration::from_secs(60));
    eprintln!("W: {:?} {}", w.status, stderr(&w));
    assert_eq!(
        records,
        [0, 0, 0],
        "superseded records left by S, which failed"
    );
    assert_eq!(code(&w), 0, "W: {}", stderr(&w));
}

/// The same stop between a Redlock superseder's two attempts, seen from the nodes that ran the
/// displacing attempt late: node 1 queued S (it answered S's first attempt) and ran the displacing
/// attempt at its resume, after S had given up on its answer and gone; node 2 answered neither.
/// Node 0 ran it in time and displaced W (the gap above), so W leaves everywhere; nodes 1 and 2
/// must displace nobody, so no `superseded` record there. On the code before the displacing
/// attempt carried its deadline, node 1 displaced W at its resume.
#[test]
fn a_displacing_attempt_run_late_displaces_nobody_on_redlock() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "late";
    let (lc, token, w) = held_with_a_waiter(&s, name, "2s");
    let w_id = members(&s[0], name).remove(0);
    given_up_between_its_attempts(&s, lc(), name);
    for n in &all[1..] {
        let _: String = n.cmd(&["PING"]);
    }
    // What the nodes buffered has run (a generous bound, not a measure).
    std::thread::sleep(Duration::from_secs(1));
    let records = records_on(&all, name);
    release(lc(), name, &token);
    let w = wait_output(w, Duration::from_secs(60));
    eprintln!(
        "W {w_id}: {:?} {}; records {records:?}",
        w.status,
        stderr(&w)
    );
    assert_eq!(records[1..], [0, 0], "superseded records on the late nodes");
}

/// docs/queue.md's key table: `superseded` (displaced waiter id → the superseder's record)
/// "expires after a minute". Each displacement renews the whole hash's expiry, so a record stays
/// as long as displacements keep coming within a minute of each other (a stream of superseders,
/// one per CI push, keeps every record ever written): here W's record is still there 70 s after W
/// was displaced, because a second superseder displaced the first one 45 s in (4 of 4 runs).
/// Fixed: each record carries its own `until`, and the first attempt after it drops the record
/// (held, 4 of 4).
#[test]
fn a_superseded_record_expires_after_a_minute() {
    let s = Server::start();
    let name = "records";
    let o = run(lockctl_on(&s).args(["acquire", name, "--ttl", "5m"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    let w = acquirer(lockctl_on(&s), name, &[]);
    queued_everywhere(&[&s], name, 1);
    let w_id = members(&s, name).remove(0);
    let s1 = acquirer(lockctl_on(&s), name, &["--supersede", "--note", "S1"]);
    let o = wait_output(w, Duration::from_secs(60));
    assert_eq!(code(&o), 75, "W: {}", stderr(&o));
    let displaced = std::time::Instant::now();
    std::thread::sleep(Duration::from_secs(45));
    let s2 = acquirer(lockctl_on(&s), name, &["--supersede", "--note", "S2"]);
    let o = wait_output(s1, Duration::from_secs(60));
    assert_eq!(code(&o), 75, "S1: {}", stderr(&o));
    std::thread::sleep(Duration::from_secs(70).saturating_sub(displaced.elapsed()));
    let kept: i64 = s.cmd(&["HEXISTS", &superseded_key(name), &w_id]);
    release(lockctl_on(&s), name, &token);
    let o = wait_output(s2, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "S2: {}", stderr(&o));
    assert_eq!(
        kept,
        0,
        "W's record outlived its minute ({:?} after)",
        displaced.elapsed()
    );
}

/// Redlock 3, node 2 stopped while a `--supersede` waiter S (node timeout 1 s) makes its first
/// attempt and while a plain waiter L arrives after it (node timeout 200 ms, so that L's first
/// attempt and the one carrying its ticket reach node 2's socket before S's displacing attempt
/// does). Node 2, resumed, runs them in that order: S queued at a ticket from its clock then, L
/// queued after it, then lowered to L's ticket (below S's score there, as L's ticket comes from
/// before the resume), then S's displacing attempt, which looks below S's old score there and
/// displaces L. L arrived after S on every node and must keep its place. L is displaced (and S
/// with it, by itself), 4 of 4 runs. (Before 43c3b1c the setup does not arise: S displaced W in
/// its first attempt.) Fixed as `a_superseder_never_displaces_itself` (held, 5 of 5).
#[test]
fn a_later_waiter_is_never_displaced() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "later";
    let lc = |timeout: &str| {
        let mut c = s.lockctl();
        c.env("LOCKCTL_NODE_TIMEOUT", timeout);
        c
    };
    let (token, w) = with_a_waiter(&all, || lc("1s"), name);
    let w_id = members(&s[0], name).remove(0);
    s[2].pause();
    let sup = acquirer(lc("1s"), name, &["--supersede", "--note", "S"]);
    queued_on_0_and_1(&s, name);
    let sup_id = members(&s[0], name)
        .into_iter()
        .find(|m| *m != w_id)
        .unwrap();
    let l = acquirer(lc("200ms"), name, &["--note", "L"]);
    let l_id = || {
        members(&s[0], name)
            .into_iter()
            .find(|m| *m != w_id && *m != sup_id)
    };
    assert!(
        eventually(Duration::from_secs(30), || l_id().is_some()),
        "L never queued"
    );
    let l_id = l_id().unwrap();
    displaced_on_0_and_1(&s, name);
    let records = displaced_once_node_2_resumes(&s, w, name);
    release(lc("1s"), name, &token);
    let l = wait_output(l, Duration::from_secs(60));
    let sup = wait_output(sup, Duration::from_secs(60));
    eprintln!("W {w_id}, S {sup_id}, L {l_id}; records {records:?}");
    eprintln!("S: {:?} {}", sup.status, stderr(&sup));
    eprintln!("L: {:?} {}", l.status, stderr(&l));
    assert!(
        records.iter().all(|r| !r.contains(&l_id)),
        "L, who arrived after S, among the displaced: {records:?}"
    );
    assert_eq!(code(&l), 0, "L: {}", stderr(&l));
}

/// Redlock 3, six plain waiters queued behind the holder, then a `--supersede` waiter S: the six
/// must have exited, displaced, within 10 s of S's start, though S, queued seventh, is told a
/// heartbeat interval of 26 s (it grows with the square of the distance from the front). S
/// displaces in the attempt after the one a quorum took it in, which comes at once: `Engine::acquire`
/// sends it again at once, and so does its first wait, which subscribes to the wake channels and
/// then retries (so dropping the former alone, `reorder || displace` -> `&&`, still passes here).
#[test]
fn a_superseder_far_back_displaces_at_once() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "far";
    let token = support::queue::hold(&mut s.lockctl(), name);
    let mut waiters = Vec::new();
    for k in 1..=6 {
        waiters.push(acquirer(s.lockctl(), name, &["--note", &format!("W{k}")]));
        queued_everywhere(&all, name, k);
    }
    let started = std::time::Instant::now();
    let sup = acquirer(s.lockctl(), name, &["--supersede", "--note", "S"]);
    // A displaced waiter is woken and exits at once.
    let outs: Vec<Output> = waiters
        .into_iter()
        .map(|w| wait_output(w, Duration::from_secs(60)))
        .collect();
    let took = started.elapsed();
    let r = run(s.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let sup = wait_output(sup, Duration::from_secs(60));
    assert!(
        took < Duration::from_secs(10),
        "the six exited {took:?} after S started (its heartbeat is 26 s)"
    );
    for (k, o) in outs.iter().enumerate() {
        assert_eq!(code(o), 75, "W{}: {}", k + 1, stderr(o));
    }
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
    assert!(fence_of(&sup).is_some(), "S: {}", stdout(&sup));
}

/// As above, but S first reaches one node of three: the other two are stopped (SIGSTOP) when S
/// starts and resumed two seconds later. The attempt after the resume is the first that a quorum
/// takes in; S must displace the six within 10 s of the resume, not at its next heartbeat (26 s).
#[test]
fn a_superseder_far_back_displaces_at_once_when_a_quorum_comes_late() {
    let s = Servers::start(3);
    let all: Vec<&Server> = s.0.iter().collect();
    let name = "late";
    let token = support::queue::hold(&mut s.lockctl(), name);
    let mut waiters = Vec::new();
    for k in 1..=6 {
        waiters.push(acquirer(s.lockctl(), name, &["--note", &format!("W{k}")]));
        queued_everywhere(&all, name, k);
    }
    s[1].pause();
    s[2].pause();
    let sup = acquirer(s.lockctl(), name, &["--supersede", "--note", "S"]);
    std::thread::sleep(Duration::from_secs(2));
    s[1].resume();
    s[2].resume();
    let resumed = std::time::Instant::now();
    let outs: Vec<Output> = waiters
        .into_iter()
        .map(|w| wait_output(w, Duration::from_secs(60)))
        .collect();
    let took = resumed.elapsed();
    let r = run(s.lockctl().args(["release", name, "--token", &token]));
    assert_eq!(code(&r), 0, "{}", stderr(&r));
    let sup = wait_output(sup, Duration::from_secs(60));
    for (k, o) in outs.iter().enumerate() {
        assert_eq!(code(o), 75, "W{}: {}", k + 1, stderr(o));
    }
    assert!(
        took < Duration::from_secs(10),
        "the six exited {took:?} after the resume (S's heartbeat is 26 s)"
    );
    assert_eq!(code(&sup), 0, "S: {}", stderr(&sup));
}
