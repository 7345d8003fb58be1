//! Attacks on commits 2e13ac6 and 2864300: a key put back by a renewal (renew.lua answers
//! `{ttl, run id, 1}`) counts from the next renewal on, not in the one that puts it back; only the
//! server that lost it in a restart puts it back.
//!
//! The restart quarantine stays on in every lockctl run here (its default, the TTL), holder and
//! second client alike, except where a comment says otherwise.

mod support;

use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::holder::Holder;
use support::proxy::{self, Switch};
use support::*;

/// A movable loopback address (as [`Switch`]) whose next connection, once armed, has the reply to
/// its first script cut: the script runs on the server, its reply is lost with the connection.
struct CutOnce {
    port: u16,
    to: Arc<Mutex<Option<u16>>>,
    armed: Arc<AtomicBool>,
    cuts: Arc<Mutex<usize>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl CutOnce {
    fn start(upstream: u16) -> CutOnce {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let to = Arc::new(Mutex::new(Some(upstream)));
        let armed = Arc::new(AtomicBool::new(false));
        let cuts: Arc<Mutex<usize>> = Arc::default();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let (target, arm, n, conns) = (
            Arc::clone(&to),
            Arc::clone(&armed),
            Arc::clone(&cuts),
            Arc::clone(&open),
        );
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let target = target.lock().unwrap();
                let Some(server) = target.and_then(|p| TcpStream::connect(("127.0.0.1", p)).ok())
                else {
                    continue;
                };
                {
                    let mut conns = conns.lock().unwrap();
                    conns.push(client.try_clone().unwrap());
                    conns.push(server.try_clone().unwrap());
                }
                if arm.swap(false, Ordering::SeqCst) {
                    let n = Arc::clone(&n);
                    cut_the_run_scripts_reply(client, server, n);
                } else {
                    proxy::pass_through(client, server);
                }
            }
        });
        CutOnce {
            port,
            to,
            armed,
            cuts,
            open,
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    fn point_at(&self, upstream: Option<u16>) {
        *self.to.lock().unwrap() = upstream;
        for c in self.open.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn cuts(&self) -> usize {
        *self.cuts.lock().unwrap()
    }
}

/// Relays `client` to `server`; once a script (`EVAL`, `EVALSHA`) has gone by, the server's next
/// reply is cut with both connections, unless it is a `NOSCRIPT` error (the script did not run:
/// passed on, the client then sends its source, and that run's reply is the one cut). The script
/// ran on the server; its reply is lost.
fn cut_the_run_scripts_reply(client: TcpStream, server: TcpStream, cuts: Arc<Mutex<usize>>) {
    use std::io::{Read, Write};
    let armed = Arc::new(AtomicBool::new(false));
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let arm = Arc::clone(&armed);
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
            if proxy::holds_a_script(&seen) {
                arm.store(true, Ordering::SeqCst);
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    std::thread::spawn(move || {
        let (mut s_in, mut c_out) = (server, client);
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = s_in.read(&mut buf) {
            if armed.load(Ordering::SeqCst) {
                if buf[..n].starts_with(b"-NOSCRIPT") {
                    armed.store(false, Ordering::SeqCst);
                } else {
                    *cuts.lock().unwrap() += 1;
                    let _ = c_out.shutdown(Shutdown::Both);
                    let _ = s_in.shutdown(Shutdown::Both);
                    return;
                }
            }
            if c_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_out.shutdown(Shutdown::Write);
    });
}

/// How the holder's renewal right after the second client's release is kept from a full answer.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Fault {
    /// Every node answers (the control).
    None,
    /// B's address leads nowhere at that renewal (B's server is out of the holder's reach).
    BUnreachable,
    /// The reply to A's re-creation is lost with its connection (the script ran).
    ReplyOfThePutBackLost,
}

/// The common scene. Three nodes: A (restarts without its data while out of the holder's reach),
/// B (its address moves to another long-running server, a takeover), C (stays). A second client,
/// quarantine on, is granted the lock on A and B's new server (2 of 3) while the holder is stopped
/// within its lease, and releases it. The holder's renewal after the continue puts its key back on
/// A (past its quarantine, the server that lost it): that does not count, and with B's new server
/// answering "not ours" and C "ours" the holder holds 1 of 3, a loss (the control, `Fault::None`).
/// But when that renewal is kept from a full answer (`fault`), the call is made again: a renewal
/// retried after "unavailable" (1 held + 1 unanswered), or the node layer's resend of a call whose
/// connection dropped. The second run finds the key put back on A "in place" and counts it, with
/// C: 2 of 3, and the job runs on to exit 0, across the second client's grant.
fn scene(fault: Fault) -> (i32, Vec<String>, String, usize) {
    let mut a = Server::start_tcp();
    let b = Server::start_tcp();
    let c = Server::start();
    let other_b = Server::start_tcp();
    let ttl = 6;
    assert!(
        eventually(Duration::from_secs(30), || [&a, &b, &c, &other_b]
            .iter()
            .all(|s| s.uptime() > ttl)),
        "the servers never passed the quarantine"
    );
    let addr_a = CutOnce::start(a.port.unwrap());
    let addr_b = Switch::start(b.port.unwrap());
    let urls = format!("{},{},{}", addr_a.url(), addr_b.url(), c.url());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &urls, "exec", "count", "--ttl", "6s", "-v"])
            .args(["--", "sleep", "20"]),
    );
    holder.granted("count");
    let key = slot_key("count", 1);
    let token = c.get(&key).expect("the holder's key on C");
    assert_eq!(a.get(&key), Some(token.clone()));
    assert_eq!(b.get(&key), Some(token.clone()));

    // A drops out of reach, restarts without its data and passes its quarantine; the holder
    // renews on B and C all the while.
    addr_a.point_at(None);
    a.restart_empty();
    assert!(
        eventually(Duration::from_secs(30), || a.uptime() > ttl + 1),
        "A never passed its quarantine"
    );
    assert_eq!(a.get(&key), None);

    // Right after a renewal, the holder is stopped (its lease has ~6 s left).
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal: {:#?}",
        holder.lines.lock().unwrap()
    );
    kill(holder.pid(), libc::SIGSTOP);
    let stopped = Instant::now();
    addr_a.point_at(a.port);
    addr_b.point_at(other_b.port);
    // The second client reaches A directly, B's address (now the other server) and C.
    let second_urls = format!("{},{},{}", a.url(), addr_b.url(), c.url());
    let second = run(quarantined()
        .env("LOCKCTL_REDIS", &second_urls)
        .args(["acquire", "count", "-n", "--ttl", "6s", "--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    assert_eq!(a.get(&key), Some(other.clone()));
    assert_eq!(other_b.get(&key), Some(other.clone()));
    assert_eq!(c.get(&key), Some(token.clone()));
    let released = run(quarantined()
        .env("LOCKCTL_REDIS", &second_urls)
        .args(["release", "count", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    match fault {
        Fault::BUnreachable => addr_b.point_at(None),
        Fault::ReplyOfThePutBackLost => addr_a.arm(),
        Fault::None => {}
    }
    let gap = stopped.elapsed();
    assert!(
        gap < Duration::from_secs(4),
        "the second grant took {gap:?}: the holder's lease may have run out while stopped"
    );
    kill(holder.pid(), libc::SIGCONT);
    let (exit, lines) = holder.finish();
    let on_a = a.get(&key);
    (
        exit,
        lines,
        format!("A's key afterwards {on_a:?}, the holder's {token}"),
        addr_a.cuts(),
    )
}

/// Promise 1 (no two holders). The scene of [`scene`], with B's address leading nowhere at the
/// holder's renewal after the second client's release (B's new server out of the holder's reach:
/// one slow or unreachable node). Expected: the lease ends (exit 76), as it does when B answers.
#[test]
fn a_key_put_back_counts_in_the_retry_when_another_node_does_not_answer() {
    let (exit, lines, keys, _) = scene(Fault::BUnreachable);
    assert_eq!(
        exit, 76,
        "the holder's job ran on to its end across the second client's grant ({keys}): {lines:#?}"
    );
}

/// Promise 1 (no two holders). The scene of [`scene`], B's new server answering "not ours", and the
/// reply to A's re-creation lost with its connection (the script ran on A and put the key back; a
/// `NOSCRIPT` reply before it is let through). lockctl's node layer sends a call whose connection
/// dropped again on a new connection, within the same renewal: the second run of renew.lua finds
/// the key the first one put back "in place" and answers `{ttl, run id}`, which counts. So the key
/// put back counts in the very renewal that put it back (2 of 3 with C, no "got our key back"
/// line), and the job runs on to exit 0 across the second client's grant. Expected: the lease ends
/// (exit 76).
#[test]
fn a_key_put_back_counts_in_the_retry_when_its_reply_is_lost() {
    let (exit, lines, keys, cuts) = scene(Fault::ReplyOfThePutBackLost);
    assert_eq!(cuts, 1, "the reply to A's renewal was not cut: {lines:#?}");
    assert_eq!(
        exit, 76,
        "the holder's job ran on to its end across the second client's grant ({keys}): {lines:#?}"
    );
}

/// The control of the two scenes above (promise 1 holds without the fault): every node answers the
/// holder's renewal after the second client's release; A's key is put back and does not count, B's
/// new server answers "not ours": 1 of 3, the lease ends (exit 76).
#[test]
fn control_every_node_answers_and_the_lease_ends() {
    let (exit, lines, keys, _) = scene(Fault::None);
    assert_eq!(
        exit, 76,
        "the holder's job ran on to its end across the second client's grant ({keys}): {lines:#?}"
    );
    assert!(
        lines.iter().any(|l| l.contains("got our key back")),
        "A's key was not put back: {lines:#?}"
    );
}

/// Promise 2 (availability) and promise 3 (fences). A Redlock minority node (1 of 3) restarts
/// without its data right after one of the holder's renewals (the restart the uptime bound is
/// closest to: the node was up for less than the time since that renewal's send by only the time
/// the test takes to restart it). Quarantine on (the TTL, 3 s), node timeout 1 s. Expected: the key
/// is put back on the restarted node after its quarantine, with the node's fencing counter raised
/// to the holder's fence; the job runs to its end (exit 0); the next grant's fence is larger.
/// Run under `REDIS_SERVER` = Redis 5.0, 6.2, valkey 8 and the default too.
#[test]
fn a_restart_right_after_a_renewal_gets_the_key_back_and_fences_go_on() {
    let mut servers = Servers::start(3);
    servers.wait_out_quarantine(3);
    let urls = servers.urls();
    let holder = Holder::spawn(
        quarantined()
            .args([
                "-r",
                &urls,
                "exec",
                "avail",
                "--ttl",
                "3s",
                "--node-timeout",
                "1s",
            ])
            .args(["-v", "--", "sleep", "12"]),
    );
    holder.granted("avail");
    let key = slot_key("avail", 1);
    let fence_key = "{lockctl:avail}\u{1f}fence";
    let token = servers.0[0].get(&key).expect("the holder's key on node 0");
    let fence: u64 = servers.0[1].get(fence_key).unwrap().parse().unwrap();
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(5), || holder.count("renewed '") > seen),
        "no renewal: {:#?}",
        holder.lines.lock().unwrap()
    );
    servers.0[0].restart_empty();
    assert_eq!(servers.0[0].get(&key), None);
    let back = eventually(Duration::from_secs(8), || {
        servers.0[0].get(&key) == Some(token.clone())
    });
    let counter: Option<String> = servers.0[0].get(fence_key);
    let (exit, lines) = holder.finish();
    assert!(
        back,
        "the key was not put back on the restarted node: {lines:#?}"
    );
    assert_eq!(
        exit, 0,
        "the holder lost its lease to a minority restart: {lines:#?}"
    );
    assert_eq!(
        counter.map(|c| c.parse::<u64>().unwrap()),
        Some(fence),
        "the re-created key did not raise the node's fencing counter to the holder's fence"
    );
    // The next grant, on the restarted node and one other (the third is out of reach).
    let two = format!(
        "{},{},redis://127.0.0.1:{}",
        servers.0[0].url(),
        servers.0[1].url(),
        nowhere()
    );
    let next = acquire_json(
        quarantined().env("LOCKCTL_REDIS", &two),
        "avail",
        &["-n", "--ttl", "3s", "--node-timeout", "1s"],
    );
    let next_fence = next["fence"].as_u64().expect("a fence");
    assert!(
        next_fence > fence,
        "the next grant's fence {next_fence} <= the holder's {fence}"
    );
}
