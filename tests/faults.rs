//! Faults in the middle of contended runs, on one node and on five-node Redlock.
//!
//! Every run is real: several workers loop on `lockctl exec` against real redis-servers, and each
//! critical section does two writes. A read-modify-write of a counter file (read, sleep, write back
//! plus one) loses an update whenever two sections overlap. A fenced write into SQLite
//! (`INSERT ... WHERE fence > MAX(fence)`, one transaction) is what a store that checks fencing tokens
//! does. While the workers run, the test injects a fault: a redis-server stopped (SIGSTOP) or killed
//! (kill -9), a node restarted with or without its data (with the restart quarantine, and without it
//! to show the double grant it prevents), lockctl itself stopped past its TTL, `SCRIPT FLUSH`,
//! `CLIENT KILL` of lockctl's connections, eviction under `maxmemory`, a stderr nobody reads.
//!
//! After each run the same properties are checked (see [`check`]): every exit code is one the fault
//! may cause (0, 69, 75, 76); no two grants got the same fencing token; every worker that exited 0 had
//! its fenced write accepted (a stale fence from a holder that still believed in its lease would be
//! rejected); the accepted fences strictly increase; when mutual exclusion must have held, the counter
//! equals the number of completed sections (no lost update); the work went on after the fault; and the
//! run ended within a generous bound. What each fault adds is asserted in its test.
//!
//! Timing is kept short (TTLs of 1–3 s, a 200 ms node timeout) and nothing asserts speed beyond
//! "no hang": faults are injected when a condition is seen (a section in progress, a new fence
//! accepted), not after a guessed sleep.

mod support;

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use support::*;

/// The node timeout of every run: far below the TTLs.
const NODE_TIMEOUT: &str = "200ms";
/// A run that takes longer than this has hung.
const RUN_BOUND: Duration = Duration::from_secs(75);

/// One critical section. `$DIR` holds the counter, the logs and the SQLite store; `$HOLD` is how
/// long the section sleeps between reading and writing the counter; `$W` names the worker.
///
/// The counter's write and its record in `done` are one step, as a job's commit is: a SIGTERM that
/// comes during them (a lost lease's, which often lands right at the end of the sleep, as the holder
/// learns of the loss about when its section ends) is taken once they are over. Without that, the
/// job killed between the shell's truncating open and its write leaves an empty counter, which the
/// next section reads as 0, and one killed between the two writes leaves an update without its
/// record: both look like an overlap that never happened.
const SECTION: &str = r#"set -eu
f=$LOCKCTL_FENCE
echo "$f" >> "$DIR/entered"
n=$(cat "$DIR/counter")
sleep "$HOLD"
trap 'stop=1' TERM
echo $((n + 1)) > "$DIR/counter"
echo "$f" >> "$DIR/done"
trap - TERM
[ -z "${stop:-}" ] || kill -TERM $$
r=$(sqlite3 -cmd ".timeout 20000" "$DIR/store.db" "BEGIN IMMEDIATE; INSERT INTO log(fence, worker) SELECT $f, '$W' WHERE $f > (SELECT COALESCE(MAX(fence), 0) FROM log); SELECT changes(); COMMIT;")
echo "section fence=$f accepted=$r"
"#;

/// The shared resource the workers write to: a counter file and a fenced SQLite log.
struct Store {
    dir: tempfile::TempDir,
}

impl Store {
    fn new() -> Store {
        let dir = tempfile::Builder::new()
            .prefix("lockctl-faults-")
            .tempdir()
            .unwrap();
        let s = Store { dir };
        std::fs::write(s.path("counter"), "0").unwrap();
        std::fs::write(s.path("entered"), "").unwrap();
        std::fs::write(s.path("done"), "").unwrap();
        std::fs::write(s.path("section.sh"), SECTION).unwrap();
        s.sql("CREATE TABLE log(seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER NOT NULL, worker TEXT NOT NULL);");
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn sql(&self, sql: &str) -> String {
        let o = Command::new("sqlite3")
            .arg("-cmd")
            .arg(".timeout 20000")
            .arg(self.path("store.db"))
            .arg(sql)
            .output()
            .expect("sqlite3 is required by the fault tests");
        assert!(
            o.status.success(),
            "sqlite3: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Fences accepted by the store, in the order they were written.
    fn accepted(&self) -> Vec<u64> {
        numbers(&self.sql("SELECT fence FROM log ORDER BY seq;"))
    }

    /// Fences of the sections that started.
    fn entered(&self) -> Vec<u64> {
        numbers(&std::fs::read_to_string(self.path("entered")).unwrap())
    }

    /// Fences of the sections that finished their read-modify-write.
    fn done(&self) -> Vec<u64> {
        numbers(&std::fs::read_to_string(self.path("done")).unwrap())
    }

    fn counter(&self) -> u64 {
        std::fs::read_to_string(self.path("counter"))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// The fence of a section that has started and not yet finished its read-modify-write.
    fn in_progress(&self) -> Option<u64> {
        let done: HashSet<u64> = self.done().into_iter().collect();
        self.entered().into_iter().find(|f| !done.contains(f))
    }

    /// Waits until at least `n` sections have finished.
    fn wait_done(&self, n: usize) {
        assert!(
            eventually(Duration::from_secs(30), || self.done().len() >= n),
            "the workers finished only {} sections",
            self.done().len()
        );
    }

    /// Waits until a section is in progress and returns its fence.
    fn wait_in_progress(&self) -> u64 {
        let mut fence = None;
        assert!(
            eventually(Duration::from_secs(30), || {
                fence = self.in_progress();
                fence.is_some()
            }),
            "no section in progress"
        );
        fence.unwrap()
    }
}

fn numbers(text: &str) -> Vec<u64> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse().expect("a number"))
        .collect()
}

/// How the workers contend.
struct Plan {
    name: &'static str,
    workers: usize,
    rounds: usize,
    ttl: &'static str,
    /// Seconds each section sleeps inside its read-modify-write.
    hold: &'static str,
    /// More lockctl options (`--quarantine 3s`).
    args: Vec<&'static str>,
    /// How long a worker waits for the lock (`-w`).
    wait: &'static str,
}

/// What one `lockctl exec` did.
#[derive(Debug)]
struct Outcome {
    worker: usize,
    pid: i32,
    code: i32,
    fence: Option<u64>,
    accepted: Option<bool>,
    stderr: String,
}

struct Run {
    outcomes: Vec<Outcome>,
    took: Duration,
}

impl Run {
    fn codes(&self) -> Vec<i32> {
        self.outcomes.iter().map(|o| o.code).collect()
    }

    fn count(&self, code: i32) -> usize {
        self.outcomes.iter().filter(|o| o.code == code).count()
    }

    fn by_fence(&self, fence: u64) -> Option<&Outcome> {
        self.outcomes.iter().find(|o| o.fence == Some(fence))
    }

    fn by_pid(&self, pid: i32) -> &Outcome {
        self.outcomes
            .iter()
            .find(|o| o.pid == pid)
            .unwrap_or_else(|| panic!("no worker ran as pid {pid}"))
    }

    fn describe(&self) -> String {
        let mut s = format!("run took {:?}; codes {:?}\n", self.took, self.codes());
        for o in &self.outcomes {
            if o.code != 0 {
                s.push_str(&format!(
                    "worker {} (pid {}) exited {} fence {:?} accepted {:?}: {}\n",
                    o.worker,
                    o.pid,
                    o.code,
                    o.fence,
                    o.accepted,
                    o.stderr.trim()
                ));
            }
        }
        s
    }
}

/// Runs the workers against `urls` while `fault` runs on this thread, and collects every outcome.
fn contend(urls: &str, store: &Store, plan: &Plan, fault: impl FnOnce()) -> Run {
    let started = Instant::now();
    let outcomes = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..plan.workers)
        .map(|w| {
            let mut base = lockctl();
            base.env("LOCKCTL_REDIS", urls)
                .env("DIR", store.dir.path())
                .env("HOLD", plan.hold)
                .env("W", format!("w{w}"))
                .args(["exec", plan.name, "--ttl", plan.ttl, "-w", plan.wait])
                .args(["--node-timeout", NODE_TIMEOUT, "--kill-after", "1s"])
                .args(&plan.args)
                .arg("--")
                .arg("sh")
                .arg(store.path("section.sh"));
            let rounds = plan.rounds;
            let outcomes = Arc::clone(&outcomes);
            std::thread::spawn(move || {
                for _ in 0..rounds {
                    let o = exec_once(&mut base, w);
                    let unavailable = o.code == 69;
                    outcomes.lock().unwrap().push(o);
                    if unavailable {
                        // A node is down: do not spin on it.
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            })
        })
        .collect();
    fault();
    for t in threads {
        t.join().expect("worker thread");
    }
    let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
    Run {
        outcomes,
        took: started.elapsed(),
    }
}

fn exec_once(cmd: &mut Command, worker: usize) -> Outcome {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let pid = child.id() as i32;
    let out = wait_output(child, Duration::from_secs(60));
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with("section "))?;
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(name))?
            .parse()
            .ok()
    };
    Outcome {
        worker,
        pid,
        code: code(&out),
        fence: field("fence="),
        accepted: field("accepted=").map(|a| a == 1),
        stderr: stderr(&out),
    }
}

/// The properties every run must keep, whatever the fault. `exclusive`: mutual exclusion must have
/// held throughout, so the counter lost no update.
fn check(run: &Run, store: &Store, allowed: &[i32], exclusive: bool) {
    let report = run.describe();
    eprintln!("{report}");
    assert!(run.took < RUN_BOUND, "{report}");
    for o in &run.outcomes {
        assert!(
            allowed.contains(&o.code),
            "worker {} exited {}, allowed {allowed:?}\n{report}",
            o.worker,
            o.code
        );
    }
    // No two grants share a fencing token.
    let entered = store.entered();
    let unique: HashSet<u64> = entered.iter().copied().collect();
    assert_eq!(
        unique.len(),
        entered.len(),
        "fences handed out twice: {entered:?}\n{report}"
    );
    // A holder whose lease held throughout wrote with the largest fence so far.
    for o in run.outcomes.iter().filter(|o| o.code == 0) {
        assert_eq!(
            o.accepted,
            Some(true),
            "worker {} exited 0 but its fenced write (fence {:?}) was rejected\n{report}",
            o.worker,
            o.fence
        );
    }
    let accepted = store.accepted();
    assert!(
        accepted.windows(2).all(|w| w[0] < w[1]),
        "accepted fences not increasing: {accepted:?}"
    );
    assert!(run.count(0) > 0, "no worker succeeded\n{report}");
    if exclusive {
        assert_eq!(
            store.counter(),
            store.done().len() as u64,
            "lost update: two sections overlapped\n{report}"
        );
    }
    if !run.outcomes.iter().any(|o| o.code == 76) {
        assert_eq!(
            store.done().len(),
            run.count(0),
            "every completed section belongs to a worker that exited 0\n{report}"
        );
    }
}

/// The pid of the lockctl process that holds `name`, as its holder record on `server` says.
fn holder_pid(server: &Server, name: &str) -> Option<i32> {
    let key = format!("{{lockctl:{name}}}\u{1f}holder");
    let pid: Option<String> = server.cmd(&["HGET", &key, "pid"]);
    pid.and_then(|p| p.parse().ok())
}

/// The children of process `pid` (all its threads').
fn children(pid: i32) -> Vec<i32> {
    let mut out = Vec::new();
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(list) = std::fs::read_to_string(t.path().join("children")) {
                out.extend(
                    list.split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    out
}

/// Stops (or continues) a whole client: lockctl and its command's process group, as a GC pause or
/// a suspended VM would.
fn signal_client(pid: i32, child: i32, sig: i32) {
    kill(pid, sig);
    kill(-child, sig);
}

/// Three workers, four sections each.
fn plan(name: &'static str, ttl: &'static str, hold: &'static str) -> Plan {
    Plan {
        name,
        workers: 3,
        rounds: 4,
        ttl,
        hold,
        args: Vec::new(),
        wait: "30s",
    }
}

// ---------------------------------------------------------------------------------------------
// One node
// ---------------------------------------------------------------------------------------------

/// A fault-free run: the baseline every fault below is compared with.
#[test]
fn single_no_fault_baseline() {
    let servers = Servers::start(1);
    let store = Store::new();
    let run = contend(&servers.urls(), &store, &plan("base", "2s", "0.05"), || {});
    check(&run, &store, &[0], true);
    assert_eq!(run.count(0), 12, "{}", run.describe());
    assert_eq!(store.counter(), 12);
    assert_eq!(store.accepted().len(), 12);
}

/// Workers that wait only 100 ms for a lock held for 300 ms at a time: those that time out exit 75
/// and never run their section; the others run theirs one at a time.
#[test]
fn single_impatient_workers_exit_75() {
    let servers = Servers::start(1);
    let store = Store::new();
    let mut p = plan("impatient", "2s", "0.3");
    p.wait = "100ms";
    let run = contend(&servers.urls(), &store, &p, || {});
    check(&run, &store, &[0, 75], true);
    assert!(run.count(75) > 0, "{}", run.describe());
    assert_eq!(
        store.entered().len(),
        run.count(0),
        "a busy worker ran its section"
    );
}

/// A single server restarted without its data (no persistence) while nobody holds the lock. The
/// quarantine (the 2 s TTL) keeps new grants away, and although the fencing counter is gone, the next
/// grant's fence is larger than every fence before the restart: a lost counter starts again from the
/// server's clock in microseconds. The fenced store accepts the new holder's write. (Before, the
/// counter came back at 1 and the store refused every holder until it had caught up.)
#[test]
fn single_restart_without_data_keeps_fences_increasing() {
    let mut servers = Servers::start(1);
    let store = Store::new();
    let mut p = plan("amnesia", "2s", "0");
    p.workers = 1;
    p.rounds = 3;
    let run1 = contend(&servers.urls(), &store, &p, || {});
    check(&run1, &store, &[0], true);
    let before = store.accepted();
    assert_eq!(before.len(), 3);
    servers.0[0].restart_empty();
    assert!(servers[0].keys().is_empty(), "restarted without data");
    p.rounds = 1;
    p.args = vec!["--quarantine", "2s"];
    let run2 = contend(&servers.urls(), &store, &p, || {});
    let o = &run2.outcomes[0];
    assert_eq!(o.code, 0, "{}", run2.describe());
    assert!(
        o.fence > before.iter().max().copied(),
        "fence {:?} after {before:?}",
        o.fence
    );
    assert_eq!(o.accepted, Some(true), "the store accepted the new holder");
    assert_eq!(store.accepted().len(), 4);
}

/// The same restart without data while a holder is inside its section (TTL 3 s, quarantine 3 s). The
/// server is in quarantine after the restart, so the holder's renewal cannot put its key back: its
/// lease is lost and it exits 76 without writing. The waiter gets the lock once the quarantine is over,
/// with a fence larger than the holder's (the lost counter starts again from the server's clock), and
/// its write is accepted.
#[test]
fn single_restart_without_data_under_a_holder_ends_its_lease() {
    let mut servers = Servers::start(1);
    let store = Store::new();
    let urls = servers.urls();
    let mut a = lockctl();
    a.env("LOCKCTL_REDIS", &urls)
        .env("DIR", store.dir.path())
        .env("HOLD", "4")
        .env("W", "A")
        .args(["exec", "recreate", "--ttl", "3s", "--quarantine", "3s"])
        .args([
            "--node-timeout",
            NODE_TIMEOUT,
            "--kill-after",
            "1s",
            "--",
            "sh",
        ])
        .arg(store.path("section.sh"));
    // The fresh server is itself in quarantine for the first 3 s.
    let a = std::thread::spawn(move || exec_once(&mut a, 0));
    assert!(eventually(Duration::from_secs(20), || store
        .entered()
        .len()
        == 1));
    let a_fence = store.entered()[0];
    servers.0[0].restart_empty();
    let mut b = lockctl();
    b.env("LOCKCTL_REDIS", &urls)
        .env("DIR", store.dir.path())
        .env("HOLD", "0")
        .env("W", "B")
        .args([
            "exec",
            "recreate",
            "--ttl",
            "2s",
            "--quarantine",
            "3s",
            "-w",
            "30s",
        ])
        .args(["--node-timeout", NODE_TIMEOUT, "--", "sh"])
        .arg(store.path("section.sh"));
    let b = std::thread::spawn(move || exec_once(&mut b, 1));
    let a = a.join().unwrap();
    let b = b.join().unwrap();
    assert_eq!(a.code, 76, "{}", a.stderr);
    assert!(a.stderr.contains("restart quarantine"), "{}", a.stderr);
    assert_eq!(a.accepted, None, "A was stopped before it wrote");
    assert_eq!(b.code, 0, "{}", b.stderr);
    assert!(b.fence > Some(a_fence), "B {:?} after A {a_fence}", b.fence);
    assert_eq!(b.accepted, Some(true));
    assert_eq!(store.accepted(), vec![b.fence.unwrap()]);
}

/// A single node's holder whose key a restart lost loses its lease even with the quarantine off:
/// its renewal puts the key back at once, but a key put back counts only once a renewal has counted without it
/// (the node was without it, and may have granted the lock meanwhile), so the renewal holds 0 of 1:
/// exit 76, and the key put back is released, nothing left. (Before, the renewal counted the key it
/// put back and the lease went on; this test then showed that a `break` after it was final, which
/// `break_after_kept_restart.rs` and Redlock's `renewal_recreates_a_key_lost_in_a_minority_restart_after_its_quarantine`
/// still show.) The quarantine is off so that the renewal can put the key back at once: the server
/// is one this test started.
#[test]
fn single_restart_without_data_ends_the_holder_with_the_quarantine_off() {
    let mut s = Server::start();
    let go = s.dir().join("go");
    let mut child = lockctl_on(&s)
        .env("GO", &go)
        .args(["-v", "exec", "phoenix", "--ttl", "3s", "--quarantine", "0"])
        .args(["--node-timeout", NODE_TIMEOUT, "--kill-after", "1s", "-c"])
        .arg("echo ready; while [ ! -e \"$GO\" ]; do sleep 0.05; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(20),
    );
    s.restart_empty();
    // The next renewal (every second) ends the lease; the command is told to finish in any case.
    let _ = eventually(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    std::fs::write(&go, "").unwrap();
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("got our key back") && stderr(&o).contains("got it back"),
        "the lease ended for another reason than the key put back: {}",
        stderr(&o)
    );
    assert_eq!(
        s.get("lockctl:phoenix"),
        None,
        "the key put back was left behind"
    );
}

/// The server is stopped (SIGSTOP) for 600 ms while a section holds a 1.5 s lease and renews it every
/// 500 ms. The holder's renewals time out after 200 ms and are retried until its deadline; the server
/// comes back before it, so the holder keeps the lease and exits 0. Attempts that reach the stopped
/// server get no answer within the node timeout: exit 69, at once, not a hang.
#[test]
fn single_server_stopped_mid_section() {
    let servers = Servers::start(1);
    let store = Store::new();
    let mut p = plan("stopped", "1.5s", "0.6");
    p.rounds = 3;
    let mut holder = 0;
    let mut done_at_fault = 0;
    let run = contend(&servers.urls(), &store, &p, || {
        store.wait_done(1);
        holder = store.wait_in_progress();
        done_at_fault = store.done().len();
        servers[0].pause();
        std::thread::sleep(Duration::from_millis(600));
        servers[0].resume();
    });
    check(&run, &store, &[0, 69], true);
    let h = run.by_fence(holder).expect("the holder's outcome");
    assert_eq!(
        h.code,
        0,
        "the holder kept its lease through the pause\n{}",
        run.describe()
    );
    assert!(
        store.done().len() > done_at_fault,
        "work went on after the fault"
    );
}

/// The server is killed (kill -9) while a section holds the lock, stays down for a moment and comes
/// back with its data (appendonly, fsync always). The fencing counter survives the restart, so fences
/// keep increasing; the restart quarantine (3 s, above the 2 s TTL) keeps new grants away until any
/// lease the server granted before has expired or been renewed.
#[test]
fn single_server_killed_and_restarted_with_its_data() {
    let mut servers = Servers(vec![Server::with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ])]);
    let store = Store::new();
    let mut p = plan("killed", "2s", "0.3");
    p.args = vec!["--quarantine", "3s"];
    let urls = servers.urls();
    let mut done_at_fault = 0;
    let mut fence_before = 0;
    let run = contend(&urls, &store, &p, || {
        // The quarantine also holds off the first grants on the freshly started server.
        store.wait_done(2);
        fence_before = store.wait_in_progress();
        done_at_fault = store.done().len();
        servers[0].kill();
        std::thread::sleep(Duration::from_millis(300));
        servers.0[0].restart_empty();
    });
    // Attempts against the dead server: 69. The holder may outlive the outage or lose its lease (76).
    check(&run, &store, &[0, 69, 76], true);
    assert!(
        store.done().len() > done_at_fault,
        "work went on after the restart\n{}",
        run.describe()
    );
    let after: Vec<u64> = store
        .entered()
        .into_iter()
        .filter(|&f| f > fence_before)
        .collect();
    assert!(
        !after.is_empty(),
        "grants after the restart continue the counter"
    );
}

/// lockctl and its command are stopped together (a GC pause, a suspended VM) in the middle of a
/// section, for longer than the 1 s TTL. The lock expires in Redis and another worker takes it with a
/// larger fence. When the stopped client wakes, its lockctl finds the deadline passed and exits 76; the
/// store rejects the stale fence if the command still gets to write.
#[test]
fn single_holder_paused_past_its_ttl() {
    let servers = Servers::start(1);
    let store = Store::new();
    let p = plan("paused", "1s", "0.2");
    let mut stopped = None;
    let run = contend(&servers.urls(), &store, &p, || {
        store.wait_done(1);
        let fence = loop {
            let fence = store.wait_in_progress();
            if let Some(pid) = holder_pid(&servers[0], "paused") {
                let kids = children(pid);
                if let Some(&child) = kids.first() {
                    signal_client(pid, child, libc::SIGSTOP);
                    if store.in_progress() == Some(fence) {
                        stopped = Some((pid, child, fence));
                        break fence;
                    }
                    // Caught between sections: let it go and try again.
                    signal_client(pid, child, libc::SIGCONT);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        // Another worker takes the lock once ours expired, and writes with a larger fence.
        assert!(
            eventually(Duration::from_secs(20), || store
                .accepted()
                .iter()
                .any(|&f| f > fence)),
            "nobody took over from the stopped holder"
        );
        let (pid, child, _) = stopped.unwrap();
        signal_client(pid, child, libc::SIGCONT);
    });
    let (pid, _, fence) = stopped.unwrap();
    check(&run, &store, &[0, 76], false);
    let z = run.by_pid(pid);
    assert_eq!(
        z.code,
        76,
        "the paused holder lost its lease\n{}",
        run.describe()
    );
    assert!(z.stderr.contains("lost"), "{}", z.stderr);
    assert_ne!(z.accepted, Some(true), "a stale fence was accepted");
    assert!(
        !store.accepted().contains(&fence),
        "the paused holder's fence {fence} was written"
    );
    assert_eq!(run.count(76), 1, "{}", run.describe());
}

/// `SCRIPT FLUSH` again and again during the run: every EVALSHA that finds its script gone reloads it,
/// and nothing else changes.
#[test]
fn single_script_flush_mid_run() {
    let servers = Servers::start(1);
    let store = Store::new();
    let mut flushes = 0;
    let run = contend(&servers.urls(), &store, &plan("flush", "1s", "0.1"), || {
        store.wait_done(1);
        while store.done().len() < 9 && flushes < 200 {
            let _: () = servers[0].cmd(&["SCRIPT", "FLUSH"]);
            flushes += 1;
            std::thread::sleep(Duration::from_millis(30));
        }
    });
    check(&run, &store, &[0], true);
    assert!(flushes >= 3, "only {flushes} flushes");
    assert_eq!(run.count(0), 12, "{}", run.describe());
}

/// The local TCP ports of `pid`'s connections to 127.0.0.1:`port`.
fn client_ports(pid: i32, port: u16) -> Vec<u16> {
    let mut inodes = HashSet::new();
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            if let Ok(link) = std::fs::read_link(fd.path()) {
                let l = link.to_string_lossy();
                if let Some(i) = l.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    inodes.insert(i.to_string());
                }
            }
        }
    }
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 9 && f[2] == remote && inodes.contains(f[9]))
                .then(|| u16::from_str_radix(f[1].split(':').nth(1)?, 16).ok())
                .flatten()
        })
        .collect()
}

/// The holder's connections are killed by address (`CLIENT KILL ADDR`, the server's view of the
/// client's local address, found from the holder's pid) again and again while it holds a 1 s lease and
/// renews it every 333 ms, and every fourth time all of lockctl's connections by the server's local
/// address (`CLIENT KILL LADDR`). Each call finds its connection dropped, reconnects once and goes on:
/// every worker exits 0.
#[test]
fn single_client_kill_of_the_holder_mid_run() {
    let servers = Servers(vec![Server::start_tcp()]);
    let port = servers[0].port.unwrap();
    let store = Store::new();
    let mut p = plan("killconn", "1s", "0.5");
    p.rounds = 3;
    let mut killed = 0;
    let mut by_laddr = 0;
    let run = contend(&servers.urls(), &store, &p, || {
        store.wait_done(1);
        let until = Instant::now() + Duration::from_secs(30);
        let mut round = 0;
        while store.done().len() < 8 && Instant::now() < until {
            round += 1;
            if round % 4 == 0 {
                // Every lockctl connection at once: the ones on the server's TCP listener.
                let laddr = format!("127.0.0.1:{port}");
                let n: i64 = servers[0].cmd(&["CLIENT", "KILL", "LADDR", &laddr]);
                by_laddr += n;
            } else if let Some(pid) = holder_pid(&servers[0], "killconn") {
                for local in client_ports(pid, port) {
                    let addr = format!("127.0.0.1:{local}");
                    let n: i64 =
                        servers[0].cmd(&["CLIENT", "KILL", "ADDR", &addr, "SKIPME", "yes"]);
                    killed += n;
                }
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    // A holder whose release ran but whose reply was lost to a kill sends it again and finds the
    // key gone: exit 76 "the release found the lock no longer ours" (a known false "lost", stated
    // in src/lock/node.rs). Any other 76 is a real loss and fails the run.
    check(&run, &store, &[0, 76], true);
    for o in run.outcomes.iter().filter(|o| o.code == 76) {
        assert!(
            o.stderr
                .contains("the release found the lock no longer ours"),
            "worker {} lost its lease: {}",
            o.worker,
            run.describe()
        );
    }
    assert!(killed >= 3, "only {killed} holder connections killed");
    assert!(by_laddr >= 1, "no connection killed by LADDR");
    assert_eq!(run.count(0) + run.count(76), 9, "{}", run.describe());
}

/// One `exec` holds a 1 s lease for 2.5 s while every normal and every pub/sub connection on the
/// server is killed every 100 ms (`CLIENT KILL TYPE normal`, `TYPE pubsub`). The renewals reconnect
/// and the lease is kept; a waiter whose subscription is killed still gets the lock after the holder.
#[test]
fn single_client_kill_type_normal_while_renewing() {
    let servers = Servers::start(1);
    let store = Store::new();
    let mut holder = lockctl_on(&servers[0]);
    holder
        .env("DIR", store.dir.path())
        .env("HOLD", "2.5")
        .env("W", "holder")
        .args([
            "exec",
            "typekill",
            "--ttl",
            "1s",
            "--node-timeout",
            NODE_TIMEOUT,
            "--",
        ])
        .arg("sh")
        .arg(store.path("section.sh"));
    let holder = std::thread::spawn(move || exec_once(&mut holder, 0));
    assert!(eventually(Duration::from_secs(20), || store
        .entered()
        .len()
        == 1));
    let mut waiter = lockctl_on(&servers[0]);
    waiter
        .env("DIR", store.dir.path())
        .env("HOLD", "0")
        .env("W", "waiter")
        .args([
            "exec",
            "typekill",
            "--ttl",
            "1s",
            "-w",
            "30s",
            "--node-timeout",
            NODE_TIMEOUT,
        ])
        .args(["--", "sh"])
        .arg(store.path("section.sh"));
    let waiter = std::thread::spawn(move || exec_once(&mut waiter, 1));
    let mut killed = 0;
    let until = Instant::now() + Duration::from_secs(30);
    while store.done().is_empty() && Instant::now() < until {
        for kind in ["normal", "pubsub"] {
            let n: i64 = servers[0].cmd(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]);
            killed += n;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let h = holder.join().unwrap();
    let w = waiter.join().unwrap();
    assert_eq!(h.code, 0, "the holder keeps its lease: {}", h.stderr);
    assert_eq!(w.code, 0, "the waiter gets the lock after it: {}", w.stderr);
    assert!(
        h.fence.is_some() && w.fence > h.fence,
        "{:?} {:?}",
        h.fence,
        w.fence
    );
    assert_eq!((h.accepted, w.accepted), (Some(true), Some(true)));
    assert!(killed >= 5, "only {killed} connections killed");
    assert_eq!(store.counter(), 2);
}

/// A server with `maxmemory` and `allkeys-lru` is filled with junk while an `exec` holds a 1 s lease.
/// What happens, and what this test asserts: LRU eviction treats the lock key like any other key, so
/// once enough newer keys are written the lock is evicted; the next renewal finds it gone and lockctl
/// stops the command and exits 76 (had the lock survived every fill, the holder would exit 0 and the
/// key would hold its token at the end; the test accepts only these two outcomes). The fencing counter,
/// idle since the grant, may be evicted too; the next grant's fence is still larger, because a missing
/// counter starts again from the server's clock. Eviction still breaks leases, hence `doctor` fails
/// any policy but `noeviction`.
#[test]
fn single_eviction_under_maxmemory() {
    let s = Server::with_args(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-lru"]);
    let store = Store::new();
    // Some grants before, as a counter with a history.
    for _ in 0..3 {
        let o = run(lockctl_on(&s).args(["exec", "evicted", "--", "true"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    let go = store.path("go");
    let mut holder = lockctl_on(&s);
    holder
        .args([
            "exec",
            "evicted",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "--node-timeout",
            NODE_TIMEOUT,
        ])
        .args([
            "--",
            "sh",
            "-c",
            "echo \"section fence=$LOCKCTL_FENCE\"; while [ ! -e \"$GO\" ]; do sleep 0.05; done",
        ])
        .env("GO", &go);
    let holder = std::thread::spawn(move || exec_once(&mut holder, 0));
    assert!(eventually(Duration::from_secs(20), || s
        .get("lockctl:evicted")
        .is_some()));
    let token = s.get("lockctl:evicted").unwrap();

    let junk = "x".repeat(10_000);
    let mut conn = s.conn();
    let mut evicted = false;
    for round in 0..40 {
        let mut pipe = redis::pipe();
        for i in 0..800 {
            pipe.cmd("SET")
                .arg(format!("junk:{round}:{i}"))
                .arg(&junk)
                .ignore();
        }
        let _: () = pipe.query(&mut conn).expect("fill");
        if s.get("lockctl:evicted").as_deref() != Some(token.as_str()) {
            evicted = true;
            break;
        }
    }
    let stats: String = s.cmd(&["INFO", "stats"]);
    assert!(
        !stats.contains("evicted_keys:0\r"),
        "nothing was evicted: {stats}"
    );
    eprintln!("lock evicted: {evicted}");
    let h = if evicted {
        let h = holder.join().unwrap();
        assert_eq!(h.code, 76, "an evicted lock is a lost lease: {}", h.stderr);
        assert!(h.stderr.contains("lost"), "{}", h.stderr);
        h
    } else {
        std::fs::write(&go, "").unwrap();
        let h = holder.join().unwrap();
        assert_eq!(h.code, 0, "the lock survived: {}", h.stderr);
        h
    };
    let h_fence = h.fence.expect("the holder's fence");
    // Whether or not the counter went with the junk, the next grant gets a larger fence.
    let counter: Option<String> = s.cmd(&["GET", "{lockctl:evicted}\u{1f}fence"]);
    eprintln!("counter evicted: {}", counter.is_none());
    let g = acquire_json(&mut lockctl_on(&s), "evicted", &["-n"]);
    assert!(
        g["fence"].as_u64().unwrap() > h_fence,
        "{g} after {h_fence}"
    );
    assert!(
        evicted || counter.is_some(),
        "neither the lock nor the counter was evicted"
    );
}

// ---------------------------------------------------------------------------------------------
// Five-node Redlock
// ---------------------------------------------------------------------------------------------

fn redlock_plan(name: &'static str) -> Plan {
    plan(name, "2s", "0.1")
}

/// Two of five nodes stopped (SIGSTOP) mid-run until the workers have finished three more sections:
/// each call waits at most the node timeout for them, three nodes are still a quorum that grants and
/// renews, and everything else is as without the fault.
#[test]
fn redlock_two_nodes_stopped_mid_run() {
    let servers = Servers::start(5);
    let store = Store::new();
    let mut done_at_fault = 0;
    let mut done_while_stopped = 0;
    let run = contend(&servers.urls(), &store, &redlock_plan("stop2"), || {
        store.wait_done(2);
        done_at_fault = store.done().len();
        servers[1].pause();
        servers[3].pause();
        eventually(Duration::from_secs(60), || {
            store.done().len() >= done_at_fault + 3
        });
        done_while_stopped = store.done().len() - done_at_fault;
        servers[1].resume();
        servers[3].resume();
    });
    check(&run, &store, &[0], true);
    assert!(
        done_while_stopped >= 3,
        "a quorum of three finished only {done_while_stopped} section(s) while two nodes were \
         stopped\n{}",
        run.describe()
    );
    assert_eq!(run.count(0), 12, "{}", run.describe());
}

/// Two of five nodes killed (kill -9) mid-run and left dead: three are a quorum, every worker exits 0.
#[test]
fn redlock_two_nodes_killed_mid_run() {
    let mut servers = Servers::start(5);
    let store = Store::new();
    let urls = servers.urls();
    let mut done_at_fault = 0;
    let run = contend(&urls, &store, &redlock_plan("kill2"), || {
        store.wait_done(2);
        done_at_fault = store.done().len();
        servers[0].kill();
        servers[4].kill();
    });
    check(&run, &store, &[0], true);
    assert!(store.done().len() > done_at_fault);
    assert_eq!(run.count(0), 12, "{}", run.describe());
}

/// Three of five nodes (a majority) killed and restarted at once without their data, in the middle of
/// a section, with `--quarantine 3s` above the 2 s TTL. The restarted nodes refuse to vote for 3 s; the
/// holder, with its lock now on only two nodes, cannot renew and loses its lease (76) or finishes
/// first; nobody else can get a quorum until the quarantine is over, by when every lease granted
/// before has expired. So mutual exclusion holds (no lost update), and fences keep increasing because
/// every later grant includes a node that kept its counter.
#[test]
fn redlock_majority_restarted_empty_with_quarantine() {
    let mut servers = Servers::start(5);
    let store = Store::new();
    let mut p = redlock_plan("restart3");
    p.hold = "0.3";
    p.args = vec!["--quarantine", "3s"];
    let urls = servers.urls();
    let mut before = 0;
    let run = contend(&urls, &store, &p, || {
        // Quarantine also applies to the fresh servers: the first grant waits until they are 3 s old.
        store.wait_done(2);
        before = store.wait_in_progress();
        for i in [1, 2, 3] {
            servers[i].restart_empty();
        }
    });
    check(&run, &store, &[0, 76], true);
    let after: Vec<u64> = store
        .entered()
        .into_iter()
        .filter(|&f| f > before)
        .collect();
    assert!(
        !after.is_empty(),
        "grants went on after the restart\n{}",
        run.describe()
    );
}

/// Starts holder A: `exec NAME --ttl TTL [EXTRA]` whose command enters its section (creating `a-in`), waits
/// for the file `go-a`, then makes its fenced write and prints whether it was accepted. Returns once A
/// is inside its section.
fn start_gated_writer(
    servers: &Servers,
    store: &Store,
    name: &str,
    ttl: &str,
    extra: &[&str],
) -> std::process::Child {
    let a_script = "echo \"section fence=$LOCKCTL_FENCE\"; echo in > \"$DIR/a-in\"; \
                    while [ ! -e \"$GO\" ]; do sleep 0.02; done; \
                    r=$(sqlite3 -cmd '.timeout 20000' \"$DIR/store.db\" \"BEGIN IMMEDIATE; INSERT INTO log(fence, worker) SELECT $LOCKCTL_FENCE, 'A' WHERE $LOCKCTL_FENCE > (SELECT COALESCE(MAX(fence), 0) FROM log); SELECT changes(); COMMIT;\"); \
                    echo \"write accepted=$r\"";
    let a = servers
        .lockctl()
        .env("DIR", store.dir.path())
        .env("GO", store.path("go-a"))
        .args(["exec", name, "--ttl", ttl, "--node-timeout", NODE_TIMEOUT])
        .args(extra)
        .args(["-c", a_script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || store
        .path("a-in")
        .exists()));
    a
}

/// What the quarantine prevents. A holds the lock on all five nodes (exec, 10 s TTL, inside its
/// section); three nodes are restarted without their data. With `--quarantine 0`, B gets the lock at
/// once on the three empty nodes while A's lockctl still holds it on the other two and still believes
/// in its lease: two holders at once. The counters went with the data, but a lost counter starts again
/// from the server's clock, so B's fence is still larger than A's. A's fenced write, made after B's, is
/// rejected: the store catches what the lock let through, and A's lockctl exits 76 when it finds the
/// lock taken. The same steps with the quarantine on are the counterpart (next test).
#[test]
fn redlock_restart_without_quarantine_double_grants() {
    let mut servers = Servers::start(5);
    let store = Store::new();
    let go = store.path("go-a");
    let a = start_gated_writer(&servers, &store, "dg", "10s", &[]);
    let a_token = servers[0].get("lockctl:dg").expect("A holds node 0");
    for i in [1, 2, 3] {
        servers[i].restart_empty();
    }
    let b = exec_once(
        servers
            .lockctl()
            .env("DIR", store.dir.path())
            .env("HOLD", "0")
            .env("W", "B")
            .env("N0", servers[0].socket())
            .args(["exec", "dg", "-n", "--quarantine", "0", "--ttl", "10s"])
            .args(["--node-timeout", NODE_TIMEOUT, "--", "sh", "-c"])
            .arg(format!(
                "redis-cli -s \"$N0\" GET lockctl:dg > \"$DIR/b-saw\"; exec sh {}",
                store.path("section.sh").display()
            )),
        1,
    );
    std::fs::write(&go, "").unwrap();
    let a_out = wait_output(a, Duration::from_secs(60));
    let a_stdout = stdout(&a_out);
    let a_fence: u64 = a_stdout
        .split("fence=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();

    assert_eq!(b.code, 0, "B got the lock: {}", b.stderr);
    let b_saw = std::fs::read_to_string(store.path("b-saw")).unwrap();
    assert_eq!(
        b_saw.trim(),
        a_token,
        "while B held the lock, node 0 still held A's"
    );
    assert!(
        b.fence.unwrap() > a_fence,
        "B's fence {:?} not above A's {a_fence}",
        b.fence
    );
    assert_eq!(b.accepted, Some(true), "B wrote first");
    assert!(
        a_stdout.contains("write accepted=0"),
        "A's write was rejected: {a_stdout}"
    );
    assert_eq!(code(&a_out), 76, "{}", stderr(&a_out));
}

/// The counterpart of the test above with the quarantine on: A (TTL 3 s) holds for 2.5 s, three nodes
/// are restarted without their data, B (`--quarantine 3s`) is refused at once with `-n` and, waiting,
/// gets the lock only after the quarantine, with a larger fence. The restarted nodes are in quarantine
/// too for A's renewals, which therefore hold only two of five nodes: A loses its lease (76) and never
/// writes. (Before, A's renewals put its keys back on the restarted nodes at once, bypassing the
/// quarantine, and A exited 0.)
#[test]
fn redlock_restart_with_quarantine_keeps_one_holder() {
    let mut servers = Servers::start(5);
    let store = Store::new();
    // A's quarantine is on too; the fresh servers make it wait ~4 s first.
    let a = start_gated_writer(&servers, &store, "q3", "3s", &["--quarantine", "3s"]);
    std::thread::sleep(Duration::from_millis(2500));
    for i in [1, 2, 3] {
        servers[i].restart_empty();
    }
    let b_cmd = |extra: &[&str]| {
        let mut c = servers.lockctl();
        c.env("DIR", store.dir.path())
            .env("HOLD", "0")
            .env("W", "B")
            .args(["exec", "q3", "--quarantine", "3s", "--ttl", "3s"])
            .args(["--node-timeout", NODE_TIMEOUT])
            .args(extra)
            .arg("--")
            .arg("sh")
            .arg(store.path("section.sh"));
        c
    };
    let b_now = exec_once(&mut b_cmd(&["-n"]), 1);
    assert_eq!(
        b_now.code, 75,
        "quarantined nodes do not vote: {}",
        b_now.stderr
    );
    let mut b = b_cmd(&["-w", "15s"]);
    let b = std::thread::spawn(move || exec_once(&mut b, 2));
    let b = b.join().unwrap();
    std::fs::write(store.path("go-a"), "").unwrap();
    let a_out = wait_output(a, Duration::from_secs(60));
    let a_stdout = stdout(&a_out);
    let a_fence: u64 = a_stdout
        .split("fence=")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(code(&a_out), 76, "{}", stderr(&a_out));
    assert!(!a_stdout.contains("write accepted"), "{a_stdout}");
    assert_eq!(b.code, 0, "{}", b.stderr);
    assert!(
        b.fence.unwrap() > a_fence,
        "B {:?} after A {a_fence}",
        b.fence
    );
    assert_eq!(b.accepted, Some(true));
    assert_eq!(store.accepted(), vec![b.fence.unwrap()]);
}

/// Three of five nodes lose their data while nobody holds the lock, and a grant then goes through
/// exactly those three (the other two are held by another client): every counter it sees was lost,
/// yet its fence is larger than every fence before, because a lost counter starts again from the
/// server's clock. (Before, the fences started again from 1.) The quarantine stays on: the grant waits
/// until the restarted nodes have been up for the TTL.
#[test]
fn redlock_fences_survive_a_majority_losing_its_data() {
    let mut servers = Servers::start(5);
    let mut fences = Vec::new();
    for _ in 0..5 {
        let g = acquire_json(&mut servers.lockctl(), "amnesia5", &["--ttl", "2s"]);
        fences.push(g["fence"].as_u64().unwrap());
        let o = run(servers
            .lockctl()
            .args(["release", "amnesia5", "--token"])
            .arg(g["token"].as_str().unwrap()));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    for i in [1, 2, 3] {
        servers[i].restart_empty();
    }
    for i in [0, 4] {
        let _: () = servers[i].cmd(&[
            "SET",
            "lockctl:amnesia5",
            "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "PX",
            "60000",
        ]);
    }
    let mut c = servers.lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    let g = acquire_json(&mut c, "amnesia5", &["--ttl", "2s", "-w", "30s"]);
    for i in [1, 2, 3] {
        assert_eq!(
            servers[i].get("lockctl:amnesia5").as_deref(),
            g["token"].as_str()
        );
    }
    let last = *fences.last().unwrap();
    assert!(g["fence"].as_u64().unwrap() > last, "{g} after {fences:?}");
}

/// lockctl and its command stopped past the TTL on Redlock: as on one node, the paused holder exits
/// 76, another takes over with a larger fence, and the stale write is never accepted.
#[test]
fn redlock_holder_paused_past_its_ttl() {
    let servers = Servers::start(5);
    let store = Store::new();
    let p = plan("rpaused", "1s", "0.2");
    let mut stopped = None;
    let run = contend(&servers.urls(), &store, &p, || {
        store.wait_done(1);
        loop {
            let fence = store.wait_in_progress();
            if let Some(pid) = holder_pid(&servers[2], "rpaused") {
                if let Some(&child) = children(pid).first() {
                    signal_client(pid, child, libc::SIGSTOP);
                    if store.in_progress() == Some(fence) {
                        stopped = Some((pid, child, fence));
                        break;
                    }
                    signal_client(pid, child, libc::SIGCONT);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let (pid, child, fence) = stopped.unwrap();
        assert!(
            eventually(Duration::from_secs(20), || store
                .accepted()
                .iter()
                .any(|&f| f > fence)),
            "nobody took over from the stopped holder"
        );
        signal_client(pid, child, libc::SIGCONT);
    });
    let (pid, _, fence) = stopped.unwrap();
    check(&run, &store, &[0, 76], false);
    let z = run.by_pid(pid);
    assert_eq!(z.code, 76, "{}", run.describe());
    assert!(!store.accepted().contains(&fence));
    assert_eq!(run.count(76), 1, "{}", run.describe());
}

/// `SCRIPT FLUSH` on every node and `CLIENT KILL TYPE normal` on two of them, over and over, during a
/// Redlock run: scripts are reloaded, dropped connections reopened, and nothing else changes.
#[test]
fn redlock_script_flush_and_client_kill_mid_run() {
    let servers = Servers::start(5);
    let store = Store::new();
    let mut rounds = 0;
    let run = contend(&servers.urls(), &store, &redlock_plan("flushkill"), || {
        store.wait_done(1);
        while store.done().len() < 9 && rounds < 200 {
            for s in &servers.0 {
                let _: () = s.cmd(&["SCRIPT", "FLUSH"]);
            }
            for i in [1, 3] {
                let _: i64 = servers[i].cmd(&["CLIENT", "KILL", "TYPE", "normal", "SKIPME", "yes"]);
            }
            rounds += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    check(&run, &store, &[0], true);
    assert!(rounds >= 3);
    assert_eq!(run.count(0), 12, "{}", run.describe());
}

/// A lock won on exactly three of five nodes (another client holds the other two), and one of the
/// three stopped while the section runs: renewals reach two nodes that hold our token and two that
/// hold someone else's, and the stopped one, which still holds ours, does not answer. Nothing says the
/// lease is lost, so lockctl keeps retrying until the node answers again (the deadline is far) and the
/// command runs to its end: exit 0. `renew` and `release` in the same state say "unavailable" (69),
/// not "lost" (76).
#[test]
fn redlock_stopped_node_of_a_minimal_quorum_is_not_a_lost_lease() {
    let servers = Servers::start(5);
    for i in [3, 4] {
        let _: () = servers[i].cmd(&[
            "SET",
            "lockctl:minimal",
            "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "PX",
            "60000",
        ]);
    }
    let store = Store::new();
    let go = store.path("go");
    let mut c = servers.lockctl();
    c.env("GO", &go)
        .env("DIR", store.dir.path())
        .args(["exec", "minimal", "--ttl", "2s", "--node-timeout", NODE_TIMEOUT, "-c"])
        .arg("echo in > \"$DIR/in\"; while [ ! -e \"$GO\" ]; do sleep 0.02; done; echo \"section fence=$LOCKCTL_FENCE accepted=1\"");
    let holder = std::thread::spawn(move || exec_once(&mut c, 0));
    assert!(eventually(Duration::from_secs(20), || store
        .path("in")
        .exists()));
    let token = servers[0].get("lockctl:minimal").unwrap();
    servers[1].pause();
    let o = run(servers.lockctl().args([
        "renew",
        "minimal",
        "--ttl",
        "2s",
        "--token",
        &token,
        "--node-timeout",
        NODE_TIMEOUT,
    ]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    // Long enough for the exec's renewals to miss the stopped node at least once (every 667 ms).
    std::thread::sleep(Duration::from_millis(1000));
    servers[1].resume();
    std::fs::write(&go, "").unwrap();
    let h = holder.join().unwrap();
    assert_eq!(h.code, 0, "{}", h.stderr);
    assert!(!h.stderr.contains("lost"), "{}", h.stderr);
    for i in [3, 4] {
        assert_eq!(
            servers[i].get("lockctl:minimal").as_deref(),
            Some("f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0")
        );
    }
    for i in 0..3 {
        assert_eq!(
            servers[i].get("lockctl:minimal"),
            None,
            "released on node {i}"
        );
    }

    // The same for `release`: it deletes our token where it can, and cannot tell whether the stopped
    // node still holds it, so it says unavailable.
    for i in [3, 4] {
        let _: () = servers[i].cmd(&[
            "SET",
            "lockctl:minimal2",
            "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0",
            "PX",
            "60000",
        ]);
    }
    let g = acquire_json(&mut servers.lockctl(), "minimal2", &["--ttl", "30s"]);
    servers[1].pause();
    let o = run(servers
        .lockctl()
        .args([
            "release",
            "minimal2",
            "--node-timeout",
            NODE_TIMEOUT,
            "--token",
        ])
        .arg(g["token"].as_str().unwrap()));
    servers[1].resume();
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(stderr(&o).contains("did not answer"), "{}", stderr(&o));
}

/// `CLIENT KILL TYPE normal` and `TYPE pubsub` on the single node every 100 ms during a contended
/// run: every connection of every lockctl, fresh or reused, holder or waiter, is dropped again and
/// again. Each call reconnects once (also a connection killed between its connect and its first
/// command, which used to give 69), a waiter whose subscription is gone still retries within its
/// backoff, and every worker exits 0 with no lost update.
#[test]
fn single_client_kill_type_normal_mid_run() {
    let servers = Servers::start(1);
    let store = Store::new();
    let mut killed = 0;
    let run = contend(
        &servers.urls(),
        &store,
        &plan("typekill2", "1s", "0.4"),
        || {
            store.wait_done(1);
            let until = Instant::now() + Duration::from_secs(30);
            while store.done().len() < 11 && Instant::now() < until {
                for kind in ["normal", "pubsub"] {
                    let n: i64 = servers[0].cmd(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]);
                    killed += n;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        },
    );
    check(&run, &store, &[0], true);
    assert!(killed >= 5, "only {killed} connections killed");
    assert_eq!(run.count(0), 12, "{}", run.describe());
}

/// lockctl's stderr is a pipe whose reader has gone (a log collector that died, a closed terminal):
/// every diagnostic it writes fails with EPIPE. When the lease is lost it must still stop the command
/// and exit 76; a failed write must never take the renewal thread down and leave the command running
/// without the lock.
#[test]
fn single_lease_loss_with_stderr_gone() {
    let s = Server::start();
    let store = Store::new();
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut child = lockctl_on(&s)
        .env("DIR", store.dir.path())
        .args([
            "exec",
            "nostderr",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "--node-timeout",
            NODE_TIMEOUT,
        ])
        .args(["-c", "echo $$ > \"$DIR/pid\"; while :; do sleep 0.05; done"])
        .stdout(Stdio::null())
        .stderr(writer)
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(store.path("pid")).is_ok_and(|p| p.ends_with('\n'))
    }));
    let pid: i32 = std::fs::read_to_string(store.path("pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _: i64 = s.cmd(&["DEL", "lockctl:nostderr"]);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(Duration::from_secs(20));
    let stopped = eventually(Duration::from_secs(5), || !alive(pid));
    if status.is_err() || !stopped {
        kill(pid, libc::SIGKILL);
    }
    let status = status
        .expect("lockctl did not exit after losing its lease")
        .unwrap();
    assert!(stopped, "the command outlived the lease");
    assert_eq!(status.code(), Some(76));
}
