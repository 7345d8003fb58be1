//! Attacks on commit 5ce4c4f (a key put back counts once a renewal has counted without it since the
//! holder learned of the put-back: renew.lua writes `back = <call number>:<run id>` into the slot's
//! holder hash, every held renewal that finds the key answers that mark, and the holder counts the
//! node once a renewal counted after it first saw the mark, `Grant::backs`).
//!
//! The restart quarantine stays on in every lockctl run here (its default, the TTL), holder, breaker
//! and second client alike.

mod support;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::holder::Holder;
use support::proxy::{Holding, Verdict};
use support::*;

/// A loopback address in front of one server port. Armed (`cut_next`), it keeps the next request
/// a client sends on any connection from the server and cuts that client's connection: the client
/// sees the connection dropped before any reply and sends the same call again on a new connection,
/// which passes. The request kept back goes to the server later (`deliver`), on its own
/// connection: a request that the network delivered late, after the client had resent it.
struct Cut {
    path: Holding,
    armed: Arc<AtomicBool>,
}

impl Cut {
    fn start(upstream: u16) -> Cut {
        let armed = Arc::new(AtomicBool::new(false));
        let arm = Arc::clone(&armed);
        let path = Holding::start(upstream, move |_| {
            if arm.swap(false, Ordering::SeqCst) {
                Verdict::HoldAndCut
            } else {
                Verdict::Pass
            }
        });
        Cut { path, armed }
    }

    fn url(&self) -> String {
        self.path.url()
    }

    fn cut_next(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn armed(&self) -> bool {
        self.armed.load(Ordering::SeqCst)
    }

    /// The kept request, as sent: the bytes kept back.
    fn kept(&self) -> Vec<u8> {
        self.path
            .conns()
            .iter()
            .map(|c| c.lock().unwrap().held.clone())
            .find(|h| !h.is_empty())
            .unwrap_or_default()
    }

    /// Delivers the kept request to the server on its connection. Returns the bytes sent.
    fn deliver(&self) -> usize {
        for c in self.path.conns().iter() {
            let mut c = c.lock().unwrap();
            if !c.held.is_empty() {
                let held = std::mem::take(&mut c.held);
                c.server.write_all(&held).unwrap();
                return held.len();
            }
        }
        0
    }
}

fn back_of(s: &Server) -> Option<String> {
    let hashes: Vec<String> = s.cmd(&["KEYS", "*holder*"]);
    hashes
        .iter()
        .find_map(|h| s.cmd::<Option<String>>(&["HGET", h, "back"]))
}

/// Promise 1 (no two holders), Redlock over three nodes A, B, C (A behind a path that can keep a
/// request back and cut the connection), TTL 6 s, quarantine on.
///
/// A is killed and stays down 8 s while B and C keep the lease; it comes back without its data
/// (new run id X). Once past its quarantine, the holder's next renewal call k to A is kept back on
/// the way and its connection cut: lockctl sends call k again on a new connection (node.rs resends
/// a call whose connection dropped), which puts the key back with `back = k:X`. The holder learns
/// that mark (A does not count), the renewal counts on B and C, and the next renewal counts A:
/// all as designed. Then, right after a renewal, an operator breaks the lock (reaching A and B; C
/// is out of the operator's reach), a second client is granted it on A and B (2 of 3) and
/// releases it. Now the first copy of call k reaches A: the key is missing, the run id is X (not
/// the one call k carried), nothing recorded a renewal under X with an older run id, A's uptime is
/// within call k's bound and past its quarantine: the key is put back with the same mark `k:X`,
/// which the holder already knows and has counted past. Its next renewal counts A at once; with C
/// that is 2 of 3, and the job runs on after a break and beside a second client's grant.
/// Expected: the lease ends (exit 76) at the renewal after the break.
#[test]
fn a_late_copy_of_a_resent_put_back_reuses_a_known_mark_after_a_break() {
    let mut a = Server::start_tcp();
    let b = Server::start_tcp();
    let c = Server::start_tcp();
    let ttl = 6;
    assert!(
        eventually(Duration::from_secs(30), || [&a, &b, &c]
            .iter()
            .all(|s| s.uptime() > ttl + 1)),
        "the servers never passed the quarantine"
    );
    let path_a = Cut::start(a.port.unwrap());
    let urls = format!("{},{},{}", path_a.url(), b.url(), c.url());
    let holder = Holder::spawn(
        quarantined()
            .args(["-r", &urls, "exec", "mark", "--ttl", "6s", "-v"])
            .args(["--", "sleep", "45"]),
    );
    holder.granted("mark");
    let key = slot_key("mark", 1);
    let token = a.get(&key).expect("the holder's key on A");
    assert_eq!(b.get(&key), Some(token.clone()));
    assert_eq!(c.get(&key), Some(token.clone()));

    // A down for 8 s, then back without its data.
    a.kill();
    std::thread::sleep(Duration::from_secs(8));
    a.restart_empty();
    let run_x: String = {
        let info: String = a.cmd(&["INFO", "server"]);
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .unwrap()
            .trim()
            .to_string()
    };
    // Armed right after a renewal that found A still in its quarantine (-1, no key), once the next
    // one comes past it (uptime 7 s and up: (up - 1) * 1000 >= 6000).
    let mut armed = false;
    for _ in 0..10 {
        let seen = holder.count("renewed '");
        assert!(
            eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
            "no renewal while A restarts: {:#?}",
            holder.lines.lock().unwrap()
        );
        assert_eq!(
            a.get(&key),
            None,
            "A got the key back before the path was armed"
        );
        if a.uptime() >= ttl - 1 {
            path_a.cut_next();
            armed = true;
            break;
        }
    }
    assert!(armed);
    assert!(
        eventually(Duration::from_secs(10), || !path_a.armed()),
        "no renewal reached A's path"
    );
    assert!(
        eventually(Duration::from_secs(3), || a.get(&key).is_some()),
        "the resent call put nothing back on A: {:#?}",
        holder.lines.lock().unwrap()
    );
    let mark = back_of(&a).expect("back on A");
    assert!(mark.contains(&format!(":{run_x}")), "mark {mark}");
    let kept = String::from_utf8_lossy(&path_a.kept()).to_string();
    assert!(!kept.is_empty(), "nothing kept back");
    // Two more renewals: one learned the mark and counted on B and C, the next counts A.
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '")
            >= seen + 2),
        "no renewals after the put-back: {:#?}",
        holder.lines.lock().unwrap()
    );
    // Right after a renewal: the break, the second grant and release, the late copy.
    let seen = holder.count("renewed '");
    assert!(
        eventually(Duration::from_secs(10), || holder.count("renewed '") > seen),
        "no renewal: {:#?}",
        holder.lines.lock().unwrap()
    );
    let act = Instant::now();
    let others = format!("{},{},redis://127.0.0.1:{}", a.url(), b.url(), nowhere());
    let broke = run(quarantined()
        .env("LOCKCTL_REDIS", &others)
        .args(["break", "mark", "--yes"]));
    assert_eq!(code(&broke), 0, "{}", stderr(&broke));
    assert_eq!(a.get(&key), None);
    assert_eq!(b.get(&key), None);
    assert_eq!(
        c.get(&key),
        Some(token.clone()),
        "C was out of the operator's reach"
    );
    let second = run(quarantined()
        .env("LOCKCTL_REDIS", &others)
        .args(["acquire", "mark", "-n", "--ttl", "6s", "--format", "json"]));
    assert_eq!(code(&second), 0, "{}", stderr(&second));
    let grant: serde_json::Value = serde_json::from_str(&stdout(&second)).unwrap();
    let other = grant["token"].as_str().unwrap().to_string();
    assert_eq!(a.get(&key), Some(other.clone()));
    assert_eq!(b.get(&key), Some(other.clone()));
    let released = run(quarantined()
        .env("LOCKCTL_REDIS", &others)
        .args(["release", "mark", "--token", &other]));
    assert_eq!(code(&released), 0, "{}", stderr(&released));
    let scripts = |s: &Server| commandstat_calls(s, "evalsha") + commandstat_calls(s, "eval");
    let calls = scripts(&a);
    let sent = path_a.deliver();
    assert!(sent > 0, "nothing kept back on A's path");
    // The late copy runs on A (found here by A's count of script calls). Since 2e13ac6's fourth
    // review it puts nothing back (the put-back's record on A says the key was there under this run
    // id, so its disappearance is final); before, it put the key back under the mark the holder
    // had learned. Either way the holder must not count A.
    assert!(
        eventually(Duration::from_secs(2), || scripts(&a) > calls),
        "the late copy never ran on A"
    );
    let on_a = a.get(&key);
    let back_again = back_of(&a);
    if on_a.is_some() {
        assert_ne!(
            back_again.as_deref(),
            Some(mark.as_str()),
            "the late copy reused the mark"
        );
    }
    let gap = act.elapsed();
    assert!(
        gap < Duration::from_millis(1900),
        "the break and second grant took {gap:?}: a renewal may have come between"
    );
    eprintln!(
        "A after the late copy: key {on_a:?} (holder {token}), back {back_again:?} (learned {mark})"
    );
    let before = holder.len();
    assert!(
        eventually(Duration::from_secs(10), || holder
            .count_from(before, "renewed '")
            + holder.count_from(before, "lost")
            >= 2),
        "no renewal after the late copy: {:#?}",
        holder.lines.lock().unwrap()
    );
    let (exit, lines) = holder.finish();
    assert_eq!(
        exit, 76,
        "the holder's lease ran on after a break that reached A and B and beside the second \
         client's grant there (A's key after the late copy: {on_a:?}, back {back_again:?}, the \
         mark the holder had learned and counted past: {mark}): {lines:#?}"
    );
}
