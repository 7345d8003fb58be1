//! Attack on what a waiter signalled during a node's stall says about its place (`mod.rs`
//! `interrupted`, `queue.rs` `leave`, `node.rs` `send_only` / `send_on_new` and the count of the
//! writes a connection owes, `owed`), and on the rollback of its attempt, with real servers stopped
//! by SIGSTOP.
//!
//! What a stopped Redis 7.0 runs of a connection closed before it resumed, measured outside lockctl
//! with a client sending one EVAL per write (3 runs per case): it runs what it read up to and
//! including the read after the one that completed the first command, and frees the connection at
//! the reply it cannot write. Over TLS a read is one record, so that is the first two writes
//! whatever their sizes (3 small writes: 2 ran; a first write of 20 KB, two records: 2 of 3; a first
//! write of two commands: both and the next; a second write of 20 KB: 2 of 3; 5 small: 2), as
//! `owed` counts. Over a unix socket the first reply already fails, so only the first read (16 KB)
//! runs (3 writes of 105 bytes: all; of 7 KB: 2; of 14 KB: 1). Over TCP reads go further (3 of
//! 14 KB: all; 5 of 20 KB: 2). `owed` counted for TLS only.
//!
//! Breaks, each fixed since (the tests pass): the writes a connection owes are counted in bytes
//! and TLS records (`node.rs` `Owed`), and a send past what a stopped server reads counts as not
//! sent; `AUTH` and `SELECT` go in the same write as a rollback on a new connection; a call cut by a
//! stop counts as timed out (`left_behind`). What they were:
//! - a unix socket whose connections need an answer to open (a user and password, or a database
//!   other than 0) gets no new connection for the rollback, so the attempt, the rollback and the
//!   leave share the old connection, of which only 16 KB run: with a 300-byte name the leave is lost
//!   while the waiter says its place was given up; with a 480-byte name the rollback is lost and the
//!   grant made at the resume keeps the lock for its 30 s TTL;
//! - the same over plain TCP with a password once the three writes are at their largest (prefix,
//!   name and note at their limits): the leave is lost at times (how far a read goes varies) while
//!   the waiter says its place was given up;
//! - an attempt whose read on a stalled node is cut by stops of lockctl (EINTR) is sent again on a
//!   new connection each time, leaving a copy on every connection it drops; when the call ends on a
//!   cut rather than a timeout nothing counts as owed, no blind rollback nor tombstone goes out, and
//!   a copy granted at the resume keeps the lock for its TTL (plain TCP; TLS held).
//!
//! The servers are started here and never restarted, so the restart quarantine is off
//! (`support::lockctl`).

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::queue::{
    hold, queue_key, served_after_a_stall_on, signalled_behind_its_rollback,
    signalled_behind_its_rollback_on, signalled_during_a_stall, wait_queued, waiter,
};
use support::tls::{lockctl_tls, tls_server};
use support::*;

/// A server on a loopback TCP port with an ACL user `lk` (password `pw`) that may do everything;
/// the default user, which the test's own reads use over the unix socket, stays open.
fn server_with_a_user() -> Server {
    let s = Server::start_tcp();
    let _: () = s.cmd(&["ACL", "SETUSER", "lk", "on", ">pw", "~*", "&*", "+@all"]);
    s
}

/// A lockctl for `s` as user `lk`: a connection whose handshake (AUTH) waits for an answer, so no
/// new connection is opened to a stopped server for the rollback (`Node::send_on_new`).
fn lockctl_as_user(s: &Server) -> std::process::Command {
    let mut c = lockctl();
    c.env(
        "LOCKCTL_REDIS",
        format!("redis://lk:pw@127.0.0.1:{}", s.port.unwrap()),
    );
    c
}

/// A server on a unix socket with the ACL user `lk` as in [`server_with_a_user`].
fn unix_server_with_a_user() -> Server {
    let s = Server::start();
    let _: () = s.cmd(&["ACL", "SETUSER", "lk", "on", ">pw", "~*", "&*", "+@all"]);
    s
}

/// A lockctl for `s`'s unix socket as user `lk`.
fn lockctl_as_user_on_unix(s: &Server) -> std::process::Command {
    let mut c = lockctl();
    c.env(
        "LOCKCTL_REDIS",
        format!("unix://{}?user=lk&pass=pw", s.socket().display()),
    );
    c
}

/// A waiter signalled during the stall must not say its place "was given up" while its entry is
/// still queued after the resume (docs/queue.md, "What it does not cover").
fn assert_said_the_truth(said: &str, queued: bool) {
    let last = said.lines().last().unwrap_or_default();
    assert!(
        !queued || last.contains("could not be withdrawn"),
        "the signalled waiter was still queued after the resume, and it said: {last}"
    );
}

/// Held: over TCP with a user and password (AUTH: no new connection to a stopped server) and a
/// 300-byte name, the signal right behind the rollback: attempt, rollback and leave share the old
/// connection, and TCP reads them all at the resume (3 runs of 3).
#[test]
fn with_a_password_a_waiter_with_a_300_byte_name_signalled_in_a_stall_says_the_truth() {
    let s = server_with_a_user();
    let (said, queued) =
        signalled_behind_its_rollback(&s, || lockctl_as_user(&s), &"m".repeat(300), &[]);
    assert_said_the_truth(&said, queued);
}

/// Held: over TCP with a user and password and a short name, the signal landing wherever the
/// stall finds the waiter: it leaves, or says its place could not be withdrawn (no AUTH completes
/// on a new connection to a stopped server).
#[test]
fn with_a_password_a_waiter_with_a_short_name_signalled_in_a_stall_leaves_at_the_resume() {
    let s = server_with_a_user();
    let (said, queued) = signalled_during_a_stall(
        &s,
        || lockctl_as_user(&s),
        "pwshort",
        &queue_key("pwshort"),
        &[],
    );
    assert_said_the_truth(&said, queued);
}

/// Held: over TCP with a user and password and a 480-byte name, the attempt that timed out and its
/// rollback share the old connection (no new one to a stopped server), and both run at the resume:
/// the grant made there is undone (3 runs of 3).
#[test]
fn with_a_password_a_480_byte_name_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    let s = server_with_a_user();
    let took = served_after_a_stall_on(&s, || lockctl_as_user(&s), &"n".repeat(480));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
}

/// Held: over TLS with a 480-byte name the rollback (a write of two TLS records once the keys are
/// long) is still the second write on the old connection and runs at the resume: the grant made
/// there is undone and the waiter is served at once.
#[test]
fn over_tls_a_480_byte_name_whose_attempt_timed_out_in_a_stall_is_served_after_it() {
    let (tls, pki) = tls_server();
    let took = served_after_a_stall_on(&tls.server, || lockctl_tls(&tls, &pki), &"t".repeat(480));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume over TLS: a stray grant held the lock"
    );
}

/// Held: over TLS with a 300-byte name, a waiter signalled during the stall either leaves at the
/// resume or says that its place could not be withdrawn.
#[test]
fn over_tls_a_waiter_with_a_300_byte_name_signalled_in_a_stall_says_the_truth() {
    let (tls, pki) = tls_server();
    let name = "u".repeat(300);
    let (said, queued) = signalled_during_a_stall(
        &tls.server,
        || lockctl_tls(&tls, &pki),
        &name,
        &queue_key(&name),
        &[],
    );
    assert_said_the_truth(&said, queued);
}

/// Held: over TCP with a user and password and a short name, the signal right behind the rollback:
/// the leave is the third write on the old connection, counted as sent over TCP, and it runs.
#[test]
fn with_a_password_a_waiter_signalled_behind_its_rollback_says_the_truth() {
    let s = server_with_a_user();
    let (said, queued) = signalled_behind_its_rollback(&s, || lockctl_as_user(&s), "pwbehind", &[]);
    assert_said_the_truth(&said, queued);
}

/// Held: over TLS with a 300-byte name and the signal right behind the rollback, the leave is the
/// third write and is counted as not sent: the waiter says its place could not be withdrawn.
#[test]
fn over_tls_a_long_name_signalled_behind_its_rollback_says_the_truth() {
    let (tls, pki) = tls_server();
    let (said, queued) = signalled_behind_its_rollback(
        &tls.server,
        || lockctl_tls(&tls, &pki),
        &"v".repeat(300),
        &[],
    );
    assert_said_the_truth(&said, queued);
}

/// Held: over TCP with a user and password, a 480-byte name and a 500-byte note, the signal right
/// behind the rollback: the three writes come to well over 16 KB, and TCP still reads them all.
#[test]
fn with_a_password_a_480_byte_name_and_a_note_signalled_behind_its_rollback_says_the_truth() {
    let s = server_with_a_user();
    let note = "x".repeat(500);
    let (said, queued) = signalled_behind_its_rollback(
        &s,
        || lockctl_as_user(&s),
        &"n".repeat(480),
        &["--note", &note],
    );
    assert_said_the_truth(&said, queued);
}

/// Was a break (fixed). On a unix socket with a user and password (AUTH: no new connection for the rollback), a
/// 300-byte name and the signal right behind the rollback: attempt, rollback and leave go on the
/// old connection, and a unix socket fails the server's first reply at once, so only its first read
/// (16 KB) runs: the leave is lost while the waiter says its place was given up.
#[test]
fn on_a_unix_socket_with_a_password_a_300_byte_name_signalled_behind_its_rollback_says_the_truth() {
    let s = unix_server_with_a_user();
    let (said, queued) =
        signalled_behind_its_rollback(&s, || lockctl_as_user_on_unix(&s), &"m".repeat(300), &[]);
    assert_said_the_truth(&said, queued);
}

/// Was a break (fixed). On a unix socket with a user and password and a 480-byte name, the attempt that timed
/// out in the stall and its rollback go on the old connection alone, and the rollback falls past
/// the server's first read: the attempt is granted at the resume, and that grant, which nobody
/// holds, keeps the lock for the waiter's 30 s TTL while the waiter waits behind it.
#[test]
fn on_a_unix_socket_with_a_password_a_480_byte_name_whose_attempt_timed_out_is_served_after_it() {
    let s = unix_server_with_a_user();
    let took = served_after_a_stall_on(&s, || lockctl_as_user_on_unix(&s), &"n".repeat(480));
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock"
    );
}

/// Held: on a unix socket with a user and password and a short name, the signal right behind the
/// rollback: the three writes fit in the server's first read and the leave runs.
#[test]
fn on_a_unix_socket_with_a_password_a_short_name_signalled_behind_its_rollback_says_the_truth() {
    let s = unix_server_with_a_user();
    let (said, queued) =
        signalled_behind_its_rollback(&s, || lockctl_as_user_on_unix(&s), "unixpw", &[]);
    assert_said_the_truth(&said, queued);
}

/// Was a break (fixed; fails 5 of 7 runs beside other tests of this file, passed 3 of 3 alone). Over plain
/// TCP with a user and password (no new connection for the rollback) and every size at its limit
/// (a 511-byte prefix, a 512-byte name, a 512-byte note), the signal right behind the rollback: the
/// leave is the third write on the old connection, counted as sent since this is not TLS, but a
/// stopped server runs a closed TCP connection's commands only as far as the read after the one
/// that completed the first command (five writes of 20 KB: 2 ran), and how far each read goes
/// varies: the leave is lost while the waiter says its place was given up.
#[test]
fn with_a_password_every_size_at_its_limit_signalled_behind_its_rollback_says_the_truth() {
    let s = server_with_a_user();
    let prefix = format!("{}:", "p".repeat(510));
    let name = "n".repeat(512);
    let note = "x".repeat(512);
    let queue = format!("{{{prefix}{name}}}\u{1f}queue");
    let (said, queued) = signalled_behind_its_rollback_on(
        &s,
        || {
            let mut c = lockctl_as_user(&s);
            c.env("LOCKCTL_PREFIX", &prefix);
            c
        },
        &name,
        &queue,
        0,
        &["--note", &note],
    );
    assert_said_the_truth(&said, queued);
}

/// Stops and continues `pid` every 10 ms until `done`, as a busy machine or a debugger would: each
/// stop cuts the read it blocks in (EINTR, `SO_RCVTIMEO`). Returns how many stops it sent.
fn stop_and_continue(pid: i32, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0;
        while !done.load(Ordering::Relaxed) {
            kill(pid, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(2));
            kill(pid, libc::SIGCONT);
            n += 1;
            std::thread::sleep(Duration::from_millis(8));
        }
        n
    })
}

/// A holder's 3 s lease ends during a 5 s stall of `s`; a single waiter (made by `cmd`, with
/// `-v`) is stopped and continued every 10 ms through the stall, so that a read of its attempt
/// on the stalled node is cut and the call goes on on a new connection, leaving the attempt alone
/// on the old one. Returns how long after the resume the waiter was served, and what it said.
fn served_after_a_stall_with_stops(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
) -> (Duration, String) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(cmd().arg("-v"), name, &file, "1", &[]);
    wait_queued(s, name, 1);
    std::thread::sleep(Duration::from_millis(500));
    s.pause();
    let done = Arc::new(AtomicBool::new(false));
    let stops = stop_and_continue(w.id() as i32, done.clone());
    std::thread::sleep(Duration::from_secs(5));
    done.store(true, Ordering::Relaxed);
    let stops = stops.join().unwrap();
    kill(w.id() as i32, libc::SIGCONT);
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    let said = stderr(&o);
    assert_eq!(code(&o), 0, "{said}");
    eprintln!(
        "served {took:?} after the resume ({stops} stops of the waiter); the waiter said: {said}"
    );
    (took, said)
}

/// Held: over TLS the same stops cut nothing that leaves an attempt behind unrolled: the waiter is
/// served at the resume (13 runs of 13).
#[test]
fn over_tls_an_attempt_cut_by_a_stop_in_a_stall_is_rolled_back() {
    let (tls, pki) = tls_server();
    let (took, said) =
        served_after_a_stall_with_stops(&tls.server, || lockctl_tls(&tls, &pki), "tlscut");
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume over TLS: a stray grant held the lock; the waiter \
         said: {said}"
    );
}

/// Was a break (fixed; intermittent: fails 6 of 16 runs). Over plain TCP each stop of lockctl cuts the read of
/// its attempt on the stalled node (EINTR), and the attempt is sent again on a new connection (a
/// stopped server's kernel accepts it), leaving a copy on each connection it drops. When the call
/// ends on a cut rather than a timeout, nothing counts as owed: no blind rollback and no tombstone
/// go out, and the rollback that waits for an answer is cut and sent again the same way, as
/// EVALSHA, which a server that never ran the release script answers NOSCRIPT to nobody. A copy of
/// the attempt runs at the resume and is granted (the lease ended in the stall), and that grant,
/// which nobody holds, keeps the lock for the waiter's 30 s TTL while the waiter waits behind it.
#[test]
fn over_tcp_an_attempt_cut_by_a_stop_in_a_stall_is_rolled_back() {
    let s = Server::start_tcp();
    let (took, said) = served_after_a_stall_with_stops(&s, || lockctl_on(&s), "tcpcut");
    assert!(
        took < Duration::from_secs(15),
        "served {took:?} after the resume: a stray grant held the lock; the waiter said: {said}"
    );
}

/// Held: Redlock of a TLS node and two unix-socket nodes, the TLS node stopped and the first of two
/// waiters signalled right behind the rollback it sent there: the unix nodes take its leave at
/// once, and the TLS node, where the leave is the third write on the old connection, is the one
/// node it says its place could not be withdrawn on (or the entry is gone there too).
#[test]
fn redlock_with_one_tls_node_a_waiter_signalled_behind_its_rollback_says_the_truth() {
    let (tls, pki) = tls_server();
    let unix = [Server::start(), Server::start()];
    let urls = format!(
        "{},{},{}",
        tls.url("127.0.0.1"),
        unix[0].url(),
        unix[1].url()
    );
    let cmd = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &urls)
            .env("LOCKCTL_TLS_CA", pki.path("ca.crt"));
        c
    };
    let name = "mixed";
    let queue = queue_key(name);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut cmd(), name);
    let mut first = waiter(cmd().arg("-v"), name, &file, "1", &[]);
    let (seen, reader) = stderr_so_far(first.stderr.take().unwrap());
    for s in [&tls.server, &unix[0], &unix[1]] {
        wait_queued(s, name, 1);
    }
    let second = waiter(&mut cmd(), name, &file, "2", &[]);
    for s in [&tls.server, &unix[0], &unix[1]] {
        wait_queued(s, name, 2);
    }
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = unix[0].cmd(&["ZRANGE", &queue, "0", "-1"]);
    tls.server.pause();
    let behind = eventually(Duration::from_secs(10), || {
        seen.lock().unwrap().contains("sent without waiting")
    });
    kill(first.id() as i32, libc::SIGTERM);
    first.wait().unwrap();
    reader.join().unwrap();
    let said = seen.lock().unwrap().clone();
    assert!(behind, "no rollback went out in the stall: {said}");
    std::thread::sleep(Duration::from_millis(1000));
    tls.server.resume();
    let _: String = tls.server.cmd(&["PING"]);
    std::thread::sleep(Duration::from_millis(300));
    let on = |s: &Server| {
        s.cmd::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"])
            .contains(&ids[0])
    };
    let (on_tls, on_unix) = (on(&tls.server), on(&unix[0]) || on(&unix[1]));
    let o = run(cmd().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(second, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let last = said.lines().last().unwrap_or_default();
    eprintln!("queued on the TLS node {on_tls}, on a unix node {on_unix}; it said: {last}");
    assert!(!on_unix, "the leave did not reach the unix nodes: {last}");
    assert!(
        !on_tls || last.contains("could not be withdrawn on 1 of 3 node(s)"),
        "still queued on the TLS node, and it said: {last}"
    );
}

/// Was a break (fixed). The same as the unix socket with a password, with database 1 instead (`?db=1`: SELECT,
/// whose answer a stopped server does not give either, so no new connection for the rollback): a
/// 300-byte name and the signal right behind the rollback lose the leave while the waiter says its
/// place was given up.
#[test]
fn on_a_unix_socket_in_database_1_a_300_byte_name_signalled_behind_its_rollback_says_the_truth() {
    let s = Server::start();
    let name = "d".repeat(300);
    let (said, queued) = signalled_behind_its_rollback_on(
        &s,
        || {
            let mut c = lockctl();
            c.env(
                "LOCKCTL_REDIS",
                format!("unix://{}?db=1", s.socket().display()),
            );
            c
        },
        &name,
        &queue_key(&name),
        1,
        &[],
    );
    assert_said_the_truth(&said, queued);
}

/// Held: the same on a unix socket with neither password nor database: the rollback goes on a new
/// connection with the leave behind it, and those two fit in the server's first read.
#[test]
fn on_a_unix_socket_a_300_byte_name_signalled_behind_its_rollback_says_the_truth() {
    let s = Server::start();
    let (said, queued) =
        signalled_behind_its_rollback(&s, || lockctl_on(&s), &"e".repeat(300), &[]);
    assert_said_the_truth(&said, queued);
}
