//! Fifth review of the queue, against the stall rule that moves a passed expiry to a front lifetime
//! (`front.lua`, `keep_time`), the pending hint and the blind send without comment lines
//! (`node.rs`, `compact`): cases where a leave or rollback is lost, a live waiter loses its place,
//! or a dead one is kept longer than the docs say. Real servers, real signals.
//!
//! What breaks:
//! - the blind send (`node.rs` `send_only`, called by `mod.rs` `rollback` and `queue.rs` for the
//!   leave) puts an attempt, a rollback and a leave on one connection that the server reads once
//!   (16 KB) after it closed; the unit test `a_rollback_and_a_leave_fit_in_one_read` counts the
//!   scripts and allows 2 KB for everything else, but the three commands carry about thirty
//!   key-sized strings (each with the prefix and the name) and the attempt's command line and
//!   note. A 300-byte name or prefix lost the leave; a 480-byte name lost the rollback of a
//!   granted attempt, and a grant nobody holds kept the lock for its TTL (one node and Redlock 3).
//!   Since the rollback of an attempt that timed out also goes on a new connection, with the leave
//!   behind it, only a 480-byte name with a 500-byte note still loses the leave;
//! - over TLS a stopped server completes no handshake, so the leave's new connection fails and
//!   nothing is sent, whatever the sizes;
//! - a passed expiry moves by the caller's front lifetime when that is longer than the waiter's
//!   own (`front.lua` `keep_time`), so a stopped head is kept as long as the live waiter behind
//!   it would be.

mod support;

use std::time::{Duration, Instant};

use support::queue::{
    hold, queue_key, served_after_a_stall_on, signalled_behind_its_rollback,
    signalled_during_a_stall, wait_queued, waiter,
};
use support::tls::{lockctl_tls, tls_server};
use support::*;

/// Docs (queue.md, "What it does not cover"): a waiter signalled while its node is stopped leaves
/// behind, on its closed connection, its last attempt, a rollback and its leave, and the server
/// runs them at the resume, as far as its first read (16 KB) took them in; the scripts go without
/// their comment lines so that they fit. The fit was checked for the scripts alone
/// (`a_rollback_and_a_leave_fit_in_one_read`: 2 KB to spare), but the keys and arguments go along
/// too: the attempt's ten keys, command line and note, the rollback's and the leave's seven keys
/// each and their key bases. With a legal lock name of 480 bytes (the limit is 512) and a note,
/// they come to well over 16 KB, so the leave is lost again and the signalled waiter stays queued
/// after the resume: the next one waits for its expiry. Same staging as `queue_review3`'s
/// `a_waiter_signalled_during_a_node_stall_leaves_at_the_resume`, which passes with a short name.
#[test]
#[ignore = "open: what a waiter signalled in a stall leaves on its closed connection (attempt, rollback, leave) runs only as far as the server's first read (16 KB); a 480-byte name and a 500-byte note exceed it and the leave is lost (4 of 4); the next waiter waits for the entry's expiry (3.8 to 4.4 s); since the rollback of an attempt that timed out also goes on a new connection with the leave behind it, those two alone still exceed it (1 of 1)"]
fn a_waiter_with_a_long_name_signalled_during_a_node_stall_leaves_at_the_resume() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let note = "x".repeat(500);
    signalled_during_a_stall_of(&s, || lockctl_on(&s), &"n".repeat(480), &["--note", &note]);
}

/// Two waiters queue behind a holder (`cmd` makes a lockctl for `s`); the node is stopped, the
/// first waiter is signalled during the stop, and the node resumes: the first waiter must be gone
/// from the queue once the server answers again.
fn signalled_during_a_stall_of(
    s: &Server,
    cmd: impl FnMut() -> std::process::Command,
    name: &str,
    extra: &[&str],
) {
    let (said, queued) = signalled_during_a_stall(s, cmd, name, &queue_key(name), extra);
    assert!(
        !queued,
        "the signalled waiter was still queued after the resume; it said: {said}"
    );
}

/// A waiter's attempt that times out during a stall is run by the server at the resume and may be
/// granted there; the client sent a rollback right after it on the same connection, and the server
/// runs it as far as its first read of the closed connection took it in (docs/queue.md, "A node
/// that stalls"). Here the holder's 3 s lease ends during a 5 s stall and a single waiter keeps
/// trying. Returns how long after the resume the waiter was served.
fn served_after_a_stall_with_a_lease_ending_in_it(name: &str) -> Duration {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    served_after_a_stall_on(&s, || lockctl_on(&s), name)
}

/// Control: with a short name the rolled-back grant is undone at the resume and the waiter's next
/// attempt takes the lock at once.
#[test]
fn a_waiter_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    let took = served_after_a_stall_with_a_lease_ending_in_it("stall");
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume"
    );
}

/// With a legal 480-byte name the attempt (ten keys and its arguments) and the rollback (the
/// script without comments, seven keys and four key bases) do not fit in 16 KB together: the
/// attempt is granted at the resume and its rollback is lost, so a grant nobody holds keeps the
/// lock for the waiter's whole 30 s TTL while the waiter itself waits behind it.
/// Passes since the rollback of an attempt that timed out also goes on a new connection, with
/// the leave behind it and no attempt ahead of them (docs/redlock.md, "Rollback"): failed 1 of 1
/// run on the code before, passes 4 of 4.
#[test]
fn a_waiter_with_a_long_name_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    let took = served_after_a_stall_with_a_lease_ending_in_it(&"n".repeat(480));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
}

/// Control over TLS: the attempt that timed out in the stall is rolled back at the resume.
#[test]
fn over_tls_a_waiter_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    let (tls, pki) = tls_server();
    let took = served_after_a_stall_on(&tls.server, || lockctl_tls(&tls, &pki), "tls");
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume over TLS: a stray grant held the lock"
    );
}

/// A 300-byte `--prefix` (the limit is 512) with a short name: the same loss, since every key
/// carries the prefix.
/// Passes since the rollback of an attempt that timed out also goes on a new connection, with
/// the leave behind it and no attempt ahead of them (docs/redlock.md, "Rollback"): failed 1 of 1
/// run on the code before, passes 4 of 4.
#[test]
fn a_waiter_with_a_long_prefix_signalled_during_a_node_stall_leaves_at_the_resume() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let prefix = format!("{}:", "p".repeat(299));
    let queue = format!("{{{prefix}pfx}}\u{1f}queue");
    let (said, queued) = signalled_during_a_stall(
        &s,
        || {
            let mut c = lockctl_on(&s);
            c.env("LOCKCTL_PREFIX", &prefix);
            c
        },
        "pfx",
        &queue,
        &[],
    );
    assert!(
        !queued,
        "the signalled waiter was still queued after the resume; it said: {said}"
    );
}

/// Over TLS with a short name: the leave of a waiter signalled during the stall cannot be sent. With
/// `--verbose` the waiter's last lines are a new connection ("connected") and the exit, with no
/// "sent without waiting" for the leave: the stopped server's kernel accepts the TCP connection, but
/// no TLS handshake completes with a stopped server, so the send fails and nothing goes out (5 of 5
/// runs; the next waiter was served 3.8 to 4.5 s after the release). The waiter said "nothing was
/// left in Redis" all the same; it now says that its place could not be withdrawn, and the entry
/// goes with its expiry (docs/queue.md, "What it does not cover"). Where the signal lands right
/// after the rollback of the attempt that timed out, the old connection is still there: see the
/// next test.
#[test]
fn over_tls_a_waiter_signalled_during_a_node_stall_says_its_place_stays_until_it_expires() {
    let (tls, pki) = tls_server();
    let (said, _) = signalled_during_a_stall(
        &tls.server,
        || lockctl_tls(&tls, &pki),
        "tlsterm",
        &queue_key("tlsterm"),
        &[],
    );
    assert!(
        said.contains("could not be withdrawn on 1 of 1 node(s)")
            && !said.contains("nothing was left"),
        "the signalled waiter said: {said}"
    );
}

/// The same over TLS, with the signal sent at the moment the waiter has sent the rollback of its
/// attempt that timed out in the stall (`-v`: "sent without waiting"), when its connection still
/// owes the attempt's reply: the leave then goes out on that connection, as its third write. Over
/// TLS each write is a record, and a stopped server reads no more than the first two records of a
/// connection closed before it resumed (Redis 7.0), so the leave was lost while the waiter said its
/// place "was given up without waiting for the answer" (the full CI run, and 1 of 4 runs of the
/// test above, whose signal lands there by chance). It now says that its place could not be
/// withdrawn, and the entry goes with its expiry.
#[test]
fn over_tls_a_waiter_signalled_behind_its_rollback_says_its_place_stays_until_it_expires() {
    let (tls, pki) = tls_server();
    let (said, queued) =
        signalled_behind_its_rollback(&tls.server, || lockctl_tls(&tls, &pki), "tlsbehind", &[]);
    let last = said.lines().last().unwrap_or_default();
    assert!(
        last.contains("could not be withdrawn on 1 of 1 node(s)") || !queued,
        "the signalled waiter's place stayed, and it said: {last}"
    );
}

/// Plain TCP, a 300-byte name and no note (or a prefix and name that long together: each key
/// carries both): the leave is lost too. With a 200-byte name it went through (1 run).
/// Passes since the rollback of an attempt that timed out also goes on a new connection, with
/// the leave behind it and no attempt ahead of them (docs/redlock.md, "Rollback"): failed 1 of 1
/// run on the code before, passes 4 of 4.
#[test]
fn a_waiter_with_a_300_byte_name_signalled_during_a_node_stall_leaves_at_the_resume() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    signalled_during_a_stall_of(&s, || lockctl_on(&s), &"m".repeat(300), &[]);
}

/// Docs (queue.md, "Liveness" and "A node that stalls"): a stopped waiter delays the next one by
/// about a front lifetime and a heartbeat, and after a stall of the node its passed expiry moves
/// "a front lifetime" from now, once; a front lifetime is a waiter's own (4 s with the default node
/// timeout). `keep_time` moves it by the longer of the waiter's own and the *caller's* lifetime
/// (`front.lua`, `now_ms + math.max(lifetime, rec.front)`), so the first script after a stall
/// decides how long a stopped waiter stays: here the live waiter behind it, which uses
/// `--node-timeout 10s` (its own lifetime 23 s), moves the stopped head (4 s) 23 s forward and then
/// waits that long on a free lock. A third party does not do it: an `acquire -n --node-timeout
/// 10s` or the holder's `release --node-timeout 10s` after a quiet spell moved the stopped head by
/// 4 s (the next waiter served 3.1 s and 2.2 s after the release, one run each).
#[test]
fn a_stopped_head_is_moved_by_its_own_lifetime_not_the_callers() {
    // Never restarted: the quarantine is off for this server the test started itself.
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let name = "slowpeer";
    let token = hold(&mut lockctl_on(&s), name);
    let stopped = waiter(&mut lockctl_on(&s), name, &file, "1", &[]);
    wait_queued(&s, name, 1);
    let live = waiter(
        &mut lockctl_on(&s),
        name,
        &file,
        "2",
        &["--node-timeout", "10s"],
    );
    wait_queued(&s, name, 2);
    std::thread::sleep(Duration::from_secs(1));
    kill(stopped.id() as i32, libc::SIGSTOP);
    // Longer than the stopped waiter's 4 s lifetime, shorter than the live one's node timeout.
    s.pause();
    std::thread::sleep(Duration::from_secs(6));
    s.resume();
    let _: String = s.cmd(&["PING"]);
    let o = run(lockctl_on(&s).args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let released = Instant::now();
    let o = wait_output(live, Duration::from_secs(90));
    let took = released.elapsed();
    kill(stopped.id() as i32, libc::SIGCONT);
    kill(stopped.id() as i32, libc::SIGKILL);
    let _ = wait_output(stopped, Duration::from_secs(10));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    eprintln!("the live waiter was served {took:?} after the release");
    // The stopped head's own lifetime (4 s), a heartbeat, and 5 s to spare.
    assert!(
        took < Duration::from_secs(10),
        "the live waiter was served {took:?} after the release, behind a stopped head"
    );
}

/// The stray grant of `a_waiter_with_a_long_name_whose_attempt_timed_out_in_a_stall_is_served_after_it`
/// on Redlock 3, all three nodes stopped at once (as `queue_review2` stops them): the attempts that
/// timed out are granted at the resume on every node, their rollbacks are lost on every node, and
/// the stray grant holds a quorum for the waiter's 30 s TTL.
/// Passes since the rollback of an attempt that timed out also goes on a new connection, with
/// the leave behind it and no attempt ahead of them (docs/redlock.md, "Rollback"): failed 1 of 1
/// run on the code before, passes 4 of 4.
#[test]
fn on_redlock_a_waiter_with_a_long_name_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    // Never restarted: the quarantine is off for these servers the test started itself.
    let ss = Servers::start(3);
    let name = "r".repeat(480);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(ss.lockctl().args(["acquire", &name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(&mut ss.lockctl(), &name, &file, "1", &[]);
    for s in &ss.0 {
        wait_queued(s, &name, 1);
    }
    for s in &ss.0 {
        s.pause();
    }
    std::thread::sleep(Duration::from_secs(5));
    for s in &ss.0 {
        s.resume();
    }
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    eprintln!("served {took:?} after the resume on Redlock 3");
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
}
