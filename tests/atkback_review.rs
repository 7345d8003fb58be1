//! Attacks on commit 38a924e (a key put back counts only once a renewal has counted without it:
//! renew.lua records `back = <the holder's count of renewals that counted>` in the slot's holder
//! hash, and a run that finds the key in place while the holder's count is still that number
//! answers "put back").
//!
//! The restart quarantine stays on in every lockctl run here (its default, the TTL), holder and
//! second client alike.

mod support;

use std::io::Write;
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::holder::Holder;
use support::proxy::{Holding, Switch, Verdict};
use support::*;

/// A loopback address in front of one server port whose client-to-server bytes can be held back
/// (a network path that delays a client's segments, as a partition does while TCP retransmits)
/// and delivered later, in order, to the server: the held requests then run on the server long
/// after the client gave up on them. `refuse` closes new connections and cuts the open ones.
struct Delay {
    path: Holding,
    holding: Arc<AtomicBool>,
}

impl Delay {
    fn start(upstream: u16) -> Delay {
        let holding = Arc::new(AtomicBool::new(false));
        let hold = Arc::clone(&holding);
        // In hold, and after it while a connection still has bytes held (they go out in order).
        let path = Holding::start(upstream, move |c| {
            if hold.load(Ordering::SeqCst) || !c.held.is_empty() {
                Verdict::Hold
            } else {
                Verdict::Pass
            }
        });
        Delay { path, holding }
    }

    fn url(&self) -> String {
        self.path.url()
    }

    /// New connections are closed at once, open ones cut.
    fn refuse(&self) {
        self.path.refuse();
    }

    fn pass(&self) {
        self.holding.store(false, Ordering::SeqCst);
        self.path.admit();
    }

    /// Client bytes are held back from the server from now on.
    fn hold(&self) {
        self.holding.store(true, Ordering::SeqCst);
        self.path.admit();
    }

    /// Delivers the held bytes of the first connection that has any (the oldest held request),
    /// and drops the others' (a later delivery would find the key in place and change nothing
    /// that matters here). Then passes again. Returns how many bytes went out.
    fn deliver_oldest(&self) -> usize {
        let conns = self.path.conns();
        let mut sent = 0;
        for c in conns.iter() {
            let mut c = c.lock().unwrap();
            if c.held.is_empty() {
                continue;
            }
            if sent == 0 {
                let held = std::mem::take(&mut c.held);
                c.server.write_all(&held).unwrap();
                sent = held.len();
            } else {
                c.held.clear();
                let _ = c.server.shutdown(Shutdown::Both);
                let _ = c.client.shutdown(Shutdown::Both);
            }
        }
        self.holding.store(false, Ordering::SeqCst);
        sent
    }
}

/// Promise 1 (no two holders), Redlock over three nodes A, B, C (B behind a path that can delay
/// the holder's requests, C behind a movable address), TTL 6 s, node timeout 500 ms, quarantine on.
///
/// B drops out of the holder's reach (connections refused) while A and C keep the lease, and
/// restarts without its data a few seconds later. Its path comes back while B is still in its
/// quarantine: the holder's renewals reach B (answer -1, which caches renew.lua there), then the
/// path starts holding the holder's bytes back. The next renewal's request to B is held (renewal
/// j, count j); it times out, and A and C count: the holder's count moves on to j+1. Once B is
/// past its quarantine, right after one of the holder's renewals, C's address moves to another
/// long-running server (a takeover) and a second client, quarantine on, is granted the lock on B
/// (direct path) and on C's new server, 2 of 3, and releases it. Then the held request of renewal
/// j reaches B: the key is missing, the run id changed, B's uptime is within that request's bound
/// (measured from the holder's last confirmation on B, long before), B is past its quarantine, so
/// the key is put back with `back = j`. The holder's next renewal carries count j+1: B's key is in
/// place with `back` != j+1, so it counts at once; with A that is 2 of 3, and the job runs on
/// beside the second client's grant. Expected: the lease ends (exit 76).
#[test]
fn a_late_delivered_put_back_counts_at_once_and_hides_a_grant() {
    let a = Server::start_tcp();
    let mut b = Server::start_tcp();
    let c = Server::start_tcp();
    let other_c = Server::start_tcp();
    let ttl = 6;
    assert!(
        eventually(Duration::from_secs(30), || [&a, &b, &c, &other_c]
            .iter()
            .all(|s| s.uptime() > ttl + 1)),
        "the servers never passed the quarantine"
    );
    let path_b = Delay::start(b.port.unwrap());
    let addr_c = Switch::start(c.port.unwrap());
    let urls = format!("{},{},{}", a.url(), path_b.url(), addr_c.url());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &urls, "exec", "late", "--ttl", "6s", "-v"])
            .args(["--", "sleep", "45"]),
    );
    holder.granted("late");
    let key = slot_key("late", 1);
    let token = a.get(&key).expect("the holder's key on A");
    assert_eq!(b.get(&key), Some(token.clone()));
    assert_eq!(c.get(&key), Some(token.clone()));

    // B out of the holder's reach; the holder renews on A and C.
    path_b.refuse();
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal without B: {:#?}",
        holder.lines.lock().unwrap()
    );
    std::thread::sleep(Duration::from_secs(3));
    // B restarts without its data; its path comes back while it is in its quarantine.
    b.restart_empty();
    path_b.pass();
    assert!(
        eventually(Duration::from_secs(10), || commandstat_calls(&b, "eval")
            >= 1),
        "the holder never reached the restarted B"
    );
    let up_when_reached = b.uptime();
    assert!(
        up_when_reached <= ttl,
        "B reached only at uptime {up_when_reached}"
    );
    assert_eq!(b.get(&key), None, "B answered -1 (quarantine), no key");
    // From now on the holder's requests to B are held on the way.
    path_b.hold();
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal with B held: {:#?}",
        holder.lines.lock().unwrap()
    );
    // B past its quarantine for the second client.
    assert!(
        eventually(Duration::from_secs(15), || b.uptime() > ttl + 2),
        "B never passed its quarantine"
    );
    // Right after a renewal of the holder (counted on A and C).
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal: {:#?}",
        holder.lines.lock().unwrap()
    );
    let act = Instant::now();
    addr_c.point_at(other_c.port);
    let second_urls = format!("{},{},{}", a.url(), b.url(), addr_c.url());
    let second = run(quarantined()
        .env("LOCKCTL_REDIS", &second_urls)
        .args(["acquire", "late", "-n", "--ttl", "6s", "--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    assert_eq!(b.get(&key), Some(other.clone()));
    assert_eq!(other_c.get(&key), Some(other.clone()));
    let released = run(quarantined()
        .env("LOCKCTL_REDIS", &second_urls)
        .args(["release", "late", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    // The held request of the holder's renewal reaches B.
    let sent = path_b.deliver_oldest();
    assert!(sent > 0, "nothing held on B's path");
    assert!(
        eventually(Duration::from_secs(2), || b.get(&key).is_some()),
        "the held renewal put nothing back on B"
    );
    let on_b = b.get(&key);
    let holder_hash: Vec<String> = b.cmd(&["KEYS", "*holder*"]);
    let back: Vec<Option<String>> = holder_hash
        .iter()
        .map(|h| b.cmd(&["HGET", h, "back"]))
        .collect();
    let gap = act.elapsed();
    assert!(
        gap < Duration::from_millis(1900),
        "the second grant took {gap:?}: a renewal may have come between"
    );
    eprintln!("B after the late delivery: key {on_b:?} (holder {token}), back {back:?}");
    let before = holder.len();
    assert!(
        eventually(Duration::from_secs(10), || holder
            .count_from(before, "renewed '")
            + holder.count_from(before, "lost")
            >= 2),
        "no renewal after the delivery: {:#?}",
        holder.lines.lock().unwrap()
    );
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder's lease ran on beside the second client's grant on B and C's new server \
         (B's key after the late delivery: {on_b:?}, back {back:?}, holder's token {token}): \
         {lines:#?}"
    );
}
