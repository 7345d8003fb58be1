//! Third review of the queue, after a node learned to notice its own stall (the `seen` key) and a
//! rolled-back grant started putting its waiter back: cases where a dead waiter is kept, the order
//! breaks, or the bounds the docs give do not hold. Real servers, real signals.

mod support;

use std::process::Child;
use std::time::{Duration, Instant};

use support::queue::{
    all_succeed, hold, in_order_every_round, order, queue_key, signalled_during_a_stall,
    wait_queued, waiter,
};
use support::*;

/// Stops the given children (SIGSTOP); they keep their connections, wake subscriptions included.
fn stop_all(kids: &[Child]) {
    for k in kids {
        kill(k.id() as i32, libc::SIGSTOP);
    }
}

/// Continues and kills the given children, and reaps them.
fn finish(kids: Vec<Child>) {
    for k in kids {
        kill(k.id() as i32, libc::SIGCONT);
        kill(k.id() as i32, libc::SIGKILL);
        let _ = wait_output(k, Duration::from_secs(10));
    }
}

/// Docs (queue.md, "Liveness"): "A SIGKILLed or SIGSTOPped waiter at the front leaves within 3 s
/// (a front lifetime) of its last heartbeat", and a dead waiter delays the next one by about 5 s
/// when its turn comes. `stopped` waiters are SIGSTOPped (a Ctrl-Z: they keep their connections and
/// still listen on their wake channels) ahead of a live one, and the lock is released. The live
/// waiter stands at place `stopped`, behind the front, so its heartbeat interval is 5 s at place 3
/// (4 to 5 s with the jitter) and 10 s at place 4 (8 to 10 s), longer than the 4 s front lifetime:
/// every one of its beats finds `seen` more than a lifetime old, takes it for a stall of the node,
/// and moves every expiry forward by the gap (the stopped waiters still listen, so they are kept;
/// the beat itself clears the `s` mark). Nothing else calls, so the stopped waiters never expire
/// and the live one, with the lock free, is served only if a beat happens to come less than a
/// lifetime after the one before: at place 3 when the jitter is near its low end, at place 4
/// never. Bounded generously: the stopped waiters at about 5 s each, and 10 s more.
fn stopped_waiters_ahead_are_dropped(stopped: u64) {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = format!("ctrlz{stopped}");
    let token = hold(&mut lockctl_on(&s), &name);
    let mut kids = Vec::new();
    for i in 1..=stopped + 1 {
        kids.push(waiter(
            &mut lockctl_on(&s),
            &name,
            &file,
            &i.to_string(),
            &[],
        ));
        wait_queued(&s, &name, i);
    }
    // Each waiter's attempt after it subscribed earns its place's interval.
    std::thread::sleep(Duration::from_secs(1));
    let live = kids.pop().unwrap();
    stop_all(&kids);
    let o = run(lockctl_on(&s).args(["release", &name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let released = Instant::now();
    let bound = Duration::from_secs(5 * stopped + 10);
    let got = eventually(bound, || !order(&file).is_empty());
    let took = released.elapsed();
    let queued: Vec<String> = s.cmd(&["ZRANGE", &queue_key(&name), "0", "-1"]);
    let seen: Option<String> = s.get(&format!("{{lockctl:{name}}}\u{1f}seen"));
    finish(kids);
    finish(vec![live]);
    assert!(
        got,
        "the live waiter was not served {took:?} after the release, behind {stopped} stopped \
         ones (queue {queued:?}, seen {seen:?})"
    );
    eprintln!("the live waiter was served {took:?} after the release");
    assert_eq!(order(&file), [(stopped + 1).to_string()]);
}

/// Seen at place 3: not served within 45 s, 40 s and 25 s, served after 29.8 s and (with other
/// tests running) twice within 25 s; `seen` and every expiry moving forward together by 4.0 to
/// 5.0 s at each beat, the head's expiry 195 ms after `seen` each time.
#[test]
fn three_stopped_waiters_ahead_of_a_live_one_are_dropped() {
    stopped_waiters_ahead_are_dropped(3);
}

/// At place 4 no beat comes within a lifetime of the one before, so the live waiter is never served.
#[test]
fn four_stopped_waiters_ahead_of_a_live_one_are_dropped() {
    stopped_waiters_ahead_are_dropped(4);
}

/// Calls the queue's scripts (`acquire -n`, refused while anyone waits) back to back for `for_`,
/// so that `seen` is fresh when the caller stops the node right after.
fn touch_queue(mut lockctl: impl FnMut() -> std::process::Command, name: &str, for_: Duration) {
    let until = Instant::now() + for_;
    while Instant::now() < until {
        let o = run(lockctl().args(["acquire", name, "-n"]));
        assert_eq!(code(&o), 75, "{}", stderr(&o));
    }
}

/// Docs (queue.md, "A node that stalls"): a live waiter keeps its place through a stall of the node.
/// The rule only counts a gap longer than a front lifetime (4 s) as a stall, but a front waiter's
/// expiry is a front lifetime after its own last beat, which may be up to a heartbeat (1 s) before
/// the node's last script. A stall a little shorter than the lifetime (3.8 s here) therefore passes
/// the head's expiry without counting as a stall: the first script after the resume drops it, and
/// if that script is the second waiter's attempt (sent during the stall and run at the resume),
/// the second waiter takes the lock, whose lease ended during the stall, first. Several rounds,
/// since which waiter's buffered attempt runs first varies.
#[test]
fn a_stall_just_shorter_than_a_lifetime_keeps_the_arrival_order() {
    in_order_every_round(4, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("short{round}");
        let o = run(lockctl_on(&s).args(["acquire", &name, "--ttl", "3s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let mut kids = Vec::new();
        for i in 1..=2u64 {
            kids.push(waiter(
                &mut lockctl_on(&s),
                &name,
                &file,
                &i.to_string(),
                &[],
            ));
            wait_queued(&s, &name, i);
        }
        touch_queue(|| lockctl_on(&s), &name, Duration::from_millis(1500));
        s.pause();
        std::thread::sleep(Duration::from_millis(3800));
        s.resume();
        all_succeed(kids);
        order(&file)
    });
}

/// Docs (queue.md): "A waiter that stops waiting leaves at once: ... on a signal (the same script
/// sent without waiting for the answer)". During a stall of the single node every attempt of the
/// head times out and is rolled back without waiting; a SIGTERM that comes while the waiter sleeps
/// must still send its leave, after the rollback on that connection or on a new one (the stopped
/// server's kernel accepts it). It used to find no connection and send nothing: its attempts
/// buffered in the stopped server ran at the resume and beat for it, and the dead head held the next
/// waiter up a whole front lifetime (4 s) after the release instead of leaving at the resume. The
/// stall is kept shorter than a lifetime, so that the stall rule plays no part.
#[test]
fn a_waiter_signalled_during_a_node_stall_leaves_at_the_resume() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let (said, queued) =
        signalled_during_a_stall(&s, || lockctl_on(&s), "term", &queue_key("term"), &[]);
    assert!(
        !queued,
        "the signalled waiter was still queued after the resume; it said: {said}"
    );
}

/// The id of the oldest subscribed client on `s` (the first waiter's wake subscription).
fn oldest_subscriber(s: &Server) -> String {
    let list: String = s.cmd(&["CLIENT", "LIST"]);
    list.lines()
        .filter(|l| l.split(' ').any(|f| f.starts_with("sub=") && f != "sub=0"))
        .filter_map(|l| l.strip_prefix("id=")?.split(' ').next().map(str::to_string))
        .min_by_key(|id| id.parse::<u64>().unwrap_or(u64::MAX))
        .expect("a subscribed client")
}

/// Docs (queue.md, "A node that stalls"): after a stall the expired waiters that no longer listen
/// on their wake channel are taken for dead and dropped; a live waiter keeps its place. A live
/// waiter's subscription can be gone for a while, though: after one drops (here `CLIENT KILL` of
/// the first waiter's subscriber connection, as an operator's `CLIENT KILL TYPE pubsub` or an
/// output-buffer limit would) the waiter subscribes again at most every 5 s. A stall of the node in
/// that window (6 s, longer than a lifetime, shorter than the queue keys' TTL) makes the first
/// script after the resume drop the live first waiter, and the second one, if its attempt runs
/// first, takes the lock whose lease ended during the stall. Several rounds, since which waiter's
/// attempt runs first after the resume varies.
#[test]
#[ignore = "open: a live waiter whose wake subscription dropped retries at once and its attempt says it no longer listens, but the stall here begins right after the kill, so that attempt waits in the stopped server with the others; its record still says it listened, and if the second waiter's attempt runs first after the resume, the first is dropped as dead and the second takes the free lock (order 2 1 in 2 of 10 rounds, 0 of 6 later; with the record's `sub` 2 of 24 rounds)"]
fn a_live_waiter_between_two_subscriptions_keeps_its_place_through_a_stall() {
    in_order_every_round(6, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for this server the test started itself.
        let s = Server::start();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("unsub{round}");
        let o = run(lockctl_on(&s).args(["acquire", &name, "--ttl", "4s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let mut kids = Vec::new();
        for i in 1..=2u64 {
            kids.push(waiter(
                &mut lockctl_on(&s),
                &name,
                &file,
                &i.to_string(),
                &[],
            ));
            wait_queued(&s, &name, i);
        }
        std::thread::sleep(Duration::from_millis(500));
        let id = oldest_subscriber(&s);
        let () = s.cmd(&["CLIENT", "KILL", "ID", &id]);
        s.pause();
        std::thread::sleep(Duration::from_secs(6));
        s.resume();
        all_succeed(kids);
        order(&file)
    });
}

/// The same on Redlock over 3 nodes, all stopped at once for 3.8 s (the host of all three
/// stalls): each node drops the first waiter on its own, and the second takes the lock first.
#[test]
fn three_nodes_stalled_just_shorter_than_a_lifetime_keep_the_arrival_order() {
    in_order_every_round(4, &["1", "2"], |round| {
        // Never restarted: the quarantine is off for these servers the test started itself.
        let s = Servers::start(3);
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("order");
        let name = format!("shortall{round}");
        let o = run(s.lockctl().args(["acquire", &name, "--ttl", "3s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let mut kids = Vec::new();
        for i in 1..=2u64 {
            kids.push(waiter(&mut s.lockctl(), &name, &file, &i.to_string(), &[]));
            for n in 0..3 {
                wait_queued(&s[n], &name, i);
            }
        }
        touch_queue(|| s.lockctl(), &name, Duration::from_millis(1500));
        for n in 0..3 {
            s[n].pause();
        }
        std::thread::sleep(Duration::from_millis(3800));
        for n in 0..3 {
            s[n].resume();
        }
        all_succeed(kids);
        order(&file)
    });
}
