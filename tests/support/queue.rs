//! Helpers of the queue's tests (`tests/queue*.rs`): waiters that note their turn in a file, a holder
//! from outside, and the queue's key as the scripts name it.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{code, eventually, kill, run, stderr, stderr_so_far, stdout, wait_output, Server};

/// The queue's key of lock `name` under the default prefix.
pub fn queue_key(name: &str) -> String {
    format!("{{lockctl:{name}}}\u{1f}queue")
}

/// Waits until `count` waiters are queued on `s`.
pub fn wait_queued(s: &Server, name: &str, count: u64) {
    let ok = eventually(Duration::from_secs(30), || {
        s.cmd::<u64>(&["ZCARD", &queue_key(name)]) == count
    });
    assert!(ok, "{count} waiter(s) not queued");
}

/// An `exec` waiting for `name` that appends `who` to `file` while it holds the lock.
pub fn waiter(cmd: &mut Command, name: &str, file: &Path, who: &str, extra: &[&str]) -> Child {
    cmd.args(["exec", name])
        .args(extra)
        .arg("-c")
        .arg(format!("echo {who} >> '{}'; sleep 0.02", file.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn waiter")
}

/// Holds `name` from outside for a minute; returns the token.
pub fn hold(cmd: &mut Command, name: &str) -> String {
    let o = run(cmd.args(["acquire", name, "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    stdout(&o)
}

/// The waiters' names in `file`, in the order they held the lock.
pub fn order(file: &Path) -> Vec<String> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Waiters `1..=n` for `name` (noting their names in `file`), started one at a time, each queued on
/// every server of `on` before the next starts, so that 1, 2, ... n is their arrival order; `cmd`
/// makes each one's lockctl.
pub fn queue_in_order(
    on: &[&Server],
    name: &str,
    file: &Path,
    n: u64,
    mut cmd: impl FnMut() -> Command,
) -> Vec<Child> {
    (1..=n)
        .map(|i| {
            let child = waiter(&mut cmd(), name, file, &i.to_string(), &[]);
            for s in on {
                wait_queued(s, name, i);
            }
            child
        })
        .collect()
}

/// A waiter the test stopped, or left waiting: resumed, killed and reaped.
pub fn finish_off(child: Child) {
    kill(child.id() as i32, libc::SIGCONT);
    kill(child.id() as i32, libc::SIGKILL);
    let _ = wait_output(child, Duration::from_secs(10));
}

/// Waits for each of `kids` to end (bounded generously), each with exit 0.
pub fn all_succeed(kids: impl IntoIterator<Item = Child>) {
    for k in kids {
        let o = wait_output(k, Duration::from_secs(120));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
}

/// Runs `round` `n` times, each returning the order its waiters were served in (printed as it
/// comes), and asserts that every round served them as `want`.
pub fn in_order_every_round(n: usize, want: &[&str], mut round: impl FnMut(usize) -> Vec<String>) {
    let orders: Vec<Vec<String>> = (0..n)
        .map(|r| {
            let got = round(r);
            eprintln!("round {r}: order {got:?}");
            got
        })
        .collect();
    assert!(
        orders.iter().all(|o| o.as_slice() == want),
        "served out of arrival order: {orders:?}"
    );
}

/// Two waiters queue behind a holder on `s` (`cmd` makes a lockctl for it; `queue` is the lock's
/// queue key, which depends on the prefix); the node is stopped, the first waiter is SIGTERMed
/// during the stop, the node resumes, and the holder releases once the server has run what was
/// buffered. Returns what the signalled waiter said and whether it was still queued at the release;
/// the next waiter must have been served within 30 s (a front lifetime and a heartbeat in any case).
pub fn signalled_during_a_stall(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
    queue: &str,
    extra: &[&str],
) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut cmd(), name);
    let mut kids = Vec::new();
    for i in 1..=2u64 {
        kids.push(waiter(&mut cmd(), name, &file, &i.to_string(), extra));
        let ok = eventually(Duration::from_secs(30), || {
            s.cmd::<u64>(&["ZCARD", queue]) == i
        });
        assert!(ok, "{i} waiter(s) not queued");
    }
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = s.cmd(&["ZRANGE", queue, "0", "-1"]);
    let first = kids.remove(0);
    s.pause();
    std::thread::sleep(Duration::from_millis(1500));
    kill(first.id() as i32, libc::SIGTERM);
    let o = wait_output(first, Duration::from_secs(10));
    let said = stderr(&o);
    eprintln!("the signalled waiter: {:?}: {said}", o.status);
    std::thread::sleep(Duration::from_millis(1000));
    s.resume();
    // The server has run what was buffered once it answers.
    let _: String = s.cmd(&["PING"]);
    std::thread::sleep(Duration::from_millis(300));
    let queued: Vec<String> = s.cmd(&["ZRANGE", queue, "0", "-1"]);
    let released = Instant::now();
    let o = run(cmd().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let second = kids.remove(0);
    let o = wait_output(second, Duration::from_secs(60));
    let took = released.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    eprintln!("the next waiter was served {took:?} after the release; queue at the release {queued:?} of {ids:?}");
    // Within a front lifetime and a heartbeat in any case; 30 s is far beyond both.
    assert!(
        took < Duration::from_secs(30),
        "the next one served {took:?} after the release"
    );
    (said, queued.contains(&ids[0]))
}

/// Two holders of a `--limit 2` semaphore with 60 s leases (made by `cmd`) and a `--limit 2` waiter
/// `who` queued behind them on every node of `nodes`, one second past its enqueue (its attempt made
/// after it subscribed): the holders' tokens and the waiter.
pub fn a_full_semaphore_of_two_with_a_waiter(
    nodes: &[&Server],
    cmd: impl Fn() -> Command,
    name: &str,
    file: &Path,
    who: &str,
) -> ([String; 2], Child) {
    let hold = |which| {
        let o = run(cmd().args(["acquire", name, "--limit", "2", "--ttl", "60s"]));
        assert_eq!(code(&o), 0, "{which}: {}", stderr(&o));
        stdout(&o)
    };
    let tokens = [hold("first"), hold("second")];
    let w = waiter(&mut cmd(), name, file, who, &["--limit", "2"]);
    for s in nodes {
        wait_queued(s, name, 1);
    }
    std::thread::sleep(Duration::from_secs(1));
    (tokens, w)
}

/// A holder with a 3 s lease and three waiters queued in order behind it on every node of `nodes`;
/// the nodes of `stalled` are stopped for `secs` (the lease ends during the stall), 1.5 s after the
/// last enqueue. Returns the order the waiters were served in; prints what was left on the queue's
/// key of each stalled node at the stop.
pub fn served_after_a_stall(
    nodes: &[&Server],
    stalled: &[&Server],
    name: &str,
    secs: u64,
    lockctl: impl Fn() -> Command,
) -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(lockctl().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let kids = queue_in_order(nodes, name, &file, 3, &lockctl);
    std::thread::sleep(Duration::from_millis(1500));
    let ttls: Vec<i64> = stalled
        .iter()
        .map(|s| s.cmd(&["PTTL", &queue_key(name)]))
        .collect();
    for s in stalled {
        s.pause();
    }
    std::thread::sleep(Duration::from_secs(secs));
    for s in stalled {
        s.resume();
    }
    all_succeed(kids);
    eprintln!("{name}: queue ttl at the stop {ttls:?} ms");
    order(&file)
}

/// A holder's 3 s lease ends during a 5 s stall while a single waiter (made by `cmd`) keeps
/// trying; its attempt that timed out is granted at the resume unless its rollback runs. Returns
/// how long after the resume the waiter was served.
pub fn served_after_a_stall_on(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
) -> Duration {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let o = run(cmd().args(["acquire", name, "--ttl", "3s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let w = waiter(&mut cmd(), name, &file, "1", &[]);
    wait_queued(s, name, 1);
    s.pause();
    std::thread::sleep(Duration::from_secs(5));
    s.resume();
    let resumed = Instant::now();
    let o = wait_output(w, Duration::from_secs(60));
    let took = resumed.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    eprintln!(
        "served {took:?} after the resume ({} byte name)",
        name.len()
    );
    took
}

/// The waiter signalled right after its rollback went out in the stall (`-v`: "sent without
/// waiting"), with the entry's presence after the resume and the waiter's last line.
pub fn signalled_behind_its_rollback(
    s: &Server,
    cmd: impl FnMut() -> std::process::Command,
    name: &str,
    extra: &[&str],
) -> (String, bool) {
    signalled_behind_its_rollback_on(s, cmd, name, &queue_key(name), 0, extra)
}

/// One command on `s`'s database `db`.
pub fn in_db<T: redis::FromRedisValue>(s: &Server, db: u8, args: &[&str]) -> T {
    let mut c = s.conn();
    redis::cmd("SELECT").arg(db).query::<()>(&mut c).unwrap();
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut c).expect("redis command")
}

/// [`signalled_behind_its_rollback`] with the lock's queue key given (it depends on the prefix).
pub fn signalled_behind_its_rollback_on(
    s: &Server,
    mut cmd: impl FnMut() -> std::process::Command,
    name: &str,
    queue: &str,
    db: u8,
    extra: &[&str],
) -> (String, bool) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("order");
    let token = hold(&mut cmd(), name);
    let mut first = waiter(cmd().arg("-v"), name, &file, "1", extra);
    let (seen, reader) = stderr_so_far(first.stderr.take().unwrap());
    let queued_n = |n: u64| {
        let ok = eventually(Duration::from_secs(30), || {
            in_db::<u64>(s, db, &["ZCARD", queue]) == n
        });
        assert!(ok, "{n} waiter(s) not queued");
    };
    queued_n(1);
    let second = waiter(&mut cmd(), name, &file, "2", &[]);
    queued_n(2);
    std::thread::sleep(Duration::from_secs(1));
    let ids: Vec<String> = in_db(s, db, &["ZRANGE", queue, "0", "-1"]);
    s.pause();
    let behind = eventually(Duration::from_secs(10), || {
        seen.lock().unwrap().contains("sent without waiting")
    });
    kill(first.id() as i32, libc::SIGTERM);
    let status = first.wait().unwrap();
    reader.join().unwrap();
    let said = seen.lock().unwrap().clone();
    eprintln!("the signalled waiter: {status:?}: {said}");
    assert!(behind, "no rollback went out in the stall: {said}");
    std::thread::sleep(Duration::from_millis(1000));
    s.resume();
    let _: String = s.cmd(&["PING"]);
    std::thread::sleep(Duration::from_millis(300));
    let queued: Vec<String> = in_db(s, db, &["ZRANGE", queue, "0", "-1"]);
    let o = run(cmd().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(second, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    (said, queued.contains(&ids[0]))
}
