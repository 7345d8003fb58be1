//! A seeded, randomized fault run: workers contend for one lock while a nemesis attacks it, and a
//! checker judges the history against what the guarantees (`docs/guarantees.md`) allow.
//!
//! The fault tests in `faults.rs` each stage one fault at one chosen moment. This file lets faults
//! fall where they will and overlap each other, so that orders nobody thought of get tried; the
//! seed replays the fault schedule (not the exact interleaving, which the scheduler decides).
//!
//! **Workers.** Four threads loop `lockctl exec` over one lock (TTL 2 s, node timeout 200 ms,
//! `--kill-after 500ms`, `-w 5s`, the restart quarantine at its default, the TTL). The command runs
//! `support/section.py`: a read-modify-write of a counter file that is not atomic (read, sleep,
//! write back plus one; mostly 5–60 ms, one section in eight holds for 0.3–1.2 TTL and one in
//! twelve for 1.5–3 TTL, so that renewals, and faults between them, happen inside sections), then a
//! fenced write into SQLite (`UPDATE ... WHERE fence < $LOCKCTL_FENCE`). It appends its start (once
//! it runs) and its end (just before it exits, also when lockctl's SIGTERM ends it) to a history
//! file, on CLOCK_MONOTONIC, the clock the test reads too. Most sections are lockctl's direct
//! child; one in eight runs in a pipeline (`python3 ... | cat`) and one in eight in the background
//! of a shell that exits at once (`python3 ... & exit 0`), since `exec` answers for the command's
//! whole process group, not only its direct child.
//!
//! **Nemesis.** Driven by a seeded RNG (`LOCKCTL_TORTURE_SEED`, printed at the start and in every
//! failure), every 0.3–2.5 s it injects one of: SIGSTOP of nodes for less than the TTL, or for
//! more; kill -9 of nodes and a restart without data up to 0.5 s later; `CLIENT KILL TYPE normal`
//! on a node; `lockctl break --yes`; SIGSTOP of a worker's lockctl (the wrapper, not its command;
//! mostly the holder's) for less than the TTL, or for more; kill -9 of a worker's lockctl. On
//! Redlock 3 a node fault hits one node, or a majority one time in three. Faults overlap in time; a
//! node or a lockctl is hit by one fault at a time.
//!
//! **The rules.** lockctl's exit codes: 0, the command succeeded and the lease held throughout; 76,
//! the lease was lost at some point; 69 and 75, the command never ran. A holder whose lockctl the
//! nemesis killed counts as one that lost its lease (its command dies with it). The checker fails
//! the run on:
//!
//! 1. *Overlap.* Two sections running at once, unless the earlier grant of the two lost its lease
//!    and the overlap ended within its stop bound. The earlier grant is the one whose section
//!    started before the other's lockctl was spawned (when neither did, the smaller fence). Its
//!    stop bound is `E + --kill-after + 500 ms`, where E is the latest of: the later section's
//!    start; the end of every SIGSTOP of its own lockctl (a stopped lockctl cannot stop its
//!    command: the guarantees say `exec` narrows this window and cannot close it); and every
//!    `break` during its run plus one TTL (a broken holder's lease deadline is at most one TTL
//!    after its last successful renewal). Nothing else excuses an overlap. A stopped, killed or
//!    restarted node and a killed connection must never give two holders at once (the quorum and
//!    the restart quarantine are there for that), so the new holder can only start once the old
//!    lease is gone, and the old holder's lockctl, which times its lease to end before the key
//!    expires, must have sent SIGTERM by then: its command may run on only for `--kill-after` and
//!    500 ms of scheduling slack. An earlier grant that exited 0 never overlaps another section: it
//!    kept its lease throughout, unless a `break` fell during its run (then its bound above): a
//!    broken holder learns of the break at its next renewal that reaches a quorum, and while the
//!    nemesis has a quorum of nodes stopped none does, so it may finish its command within its
//!    validity and exit 0 with the new holder already running. Fences order their writes.
//! 2. *Lost update.* A counter write that no later section read, overwritten by the next write,
//!    when both sections' `exec` exited 0 (and no `break` fell during the first one's run).
//! 3. *Refused fenced write.* An `exec` that exited 0 whose write the store refused (or that did
//!    not get to write), but for one broken during its run, restarts without data included: a holder that kept its lease must get a
//!    fence above every earlier one.
//! 4. *Fences.* Two grants with the same fence, or a grant whose lockctl was spawned after another
//!    grant's section had started (so it was granted later) with a smaller fence, across restarts
//!    without data too. Only the order is checked: the values are not promised.
//! 5. *Outliving lockctl.* A section still running more than `--kill-after` + 500 ms after its
//!    lockctl exited: the lock is no longer held for it (released, or left to expire by a killed
//!    lockctl). This does not wait for another holder to come along and overlap.
//! 6. *Exit codes.* Any code but 0, 69, 75 and 76 (and 137 for a lockctl the nemesis killed); a
//!    command that ran although lockctl exited 69 or 75; an `exec` that exited 0 without its
//!    section completing.
//!
//! On failure the message names the seed, each broken rule with its offending records and the
//! nemesis events around them, and keeps the history directory. A run lasts 30 s per configuration
//! (`LOCKCTL_TORTURE_SECONDS`; `scripts/torture` sets it), then stops injecting, undoes every
//! fault, lets the last sections finish, and kills every process it started.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use support::*;

const LOCK: &str = "torture";
const WORKERS: usize = 4;
const TTL_MS: u64 = 2000;
const NODE_TIMEOUT: &str = "200ms";
const KILL_AFTER_MS: u64 = 500;
/// Scheduling allowance on top of `--kill-after` for a holder that lost its lease.
const MARGIN_MS: u64 = 500;
/// How long a worker waits for the lock before giving up (exit 75) and trying again.
const WAIT: &str = "5s";
/// A single `lockctl` call that takes longer than this has hung.
const CALL_BOUND: Duration = Duration::from_secs(120);
const SECTION: &str = include_str!("support/section.py");
const MS: u64 = 1_000_000;

/// CLOCK_MONOTONIC in nanoseconds: the clock `section.py` writes to the history.
fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn sleep_ms(ms: u64) {
    std::thread::sleep(Duration::from_millis(ms));
}

// ---------------------------------------------------------------------------------------------
// The tests
// ---------------------------------------------------------------------------------------------

#[test]
fn nemesis_single_node() {
    torture(1);
}

#[test]
fn nemesis_redlock_3() {
    torture(3);
}

/// The checker itself, on hand-made histories: it must flag what the rules forbid and let through
/// what they allow, or a green run would prove nothing.
#[test]
fn checker_judges_hand_made_histories() {
    let p = Params {
        ttl: TTL_MS * MS,
        allowance: (KILL_AFTER_MS + MARGIN_MS) * MS,
    };
    let s = 1_000 * MS;
    // Two holders one after the other, fences increasing: nothing to say.
    let mut h = History::default();
    h.add(
        "a",
        0,
        0,
        0,
        1,
        (s / 10, s),
        Some("init"),
        Some(s / 2),
        Some(true),
    );
    h.add(
        "b",
        1,
        s + s / 10,
        0,
        2,
        (s + s / 5, 2 * s),
        Some("a"),
        Some(s + s / 2),
        Some(true),
    );
    h.final_version = "b".into();
    assert!(check(&h, &p).is_empty(), "{:?}", check(&h, &p));

    // Both exited 0 and overlapped: overlap and lost update.
    let mut h = History::default();
    h.add(
        "a",
        0,
        0,
        0,
        1,
        (s / 10, s),
        Some("init"),
        Some(s / 2),
        Some(true),
    );
    h.add(
        "b",
        1,
        s / 5,
        0,
        2,
        (s / 4, 2 * s),
        Some("init"),
        Some(s),
        Some(true),
    );
    h.final_version = "b".into();
    let found = rules(&check(&h, &p));
    assert!(
        found.contains(&"overlap") && found.contains(&"lost update"),
        "{found:?}"
    );
    // ... unless a `break` fell during the earlier one's run: it may never have heard of it (a
    // quorum of its nodes stopped) and finished within its validity. A break after its run
    // excuses nothing, and the overlap stays bounded by the break's TTL.
    h.breaks = vec![s / 5];
    assert!(check(&h, &p).is_empty(), "{:?}", check(&h, &p));
    h.breaks = vec![s + s / 10];
    let found = rules(&check(&h, &p));
    assert!(
        found.contains(&"overlap") && found.contains(&"lost update"),
        "{found:?}"
    );
    h.breaks = vec![s / 5];
    for (i, id) in ["a", "b"].into_iter().enumerate() {
        h.execs[i].exited = 5 * s;
        h.sections.get_mut(id).unwrap().end = Some(5 * s);
    }
    assert_eq!(rules(&check(&h, &p)), vec!["overlap beyond the stop bound"]);

    // The earlier holder exited 76 and was stopped within the bound: allowed. Past it: not.
    let mut h = History::default();
    h.add(
        "a",
        0,
        0,
        76,
        1,
        (s / 10, s + s / 2),
        Some("init"),
        None,
        None,
    );
    h.add(
        "b",
        1,
        s / 2,
        0,
        2,
        (s, 4 * s),
        Some("init"),
        Some(2 * s),
        Some(true),
    );
    h.final_version = "b".into();
    assert!(check(&h, &p).is_empty(), "{:?}", check(&h, &p));
    h.execs[0].exited = 4 * s;
    h.sections.get_mut("a").unwrap().end = Some(3 * s);
    assert_eq!(rules(&check(&h, &p)), vec!["overlap beyond the stop bound"]);
    // ... unless its own lockctl was stopped until then.
    h.stops.push(WrapperStop {
        pid: h.execs[0].pid,
        from: s / 2,
        until: 2 * s + s / 2,
    });
    assert!(check(&h, &p).is_empty(), "{:?}", check(&h, &p));

    // A later grant with a smaller or equal fence, a refused write, a command run on exit 75.
    let mut h = History::default();
    h.add(
        "a",
        0,
        0,
        0,
        5,
        (s / 10, s),
        Some("init"),
        Some(s / 2),
        Some(true),
    );
    h.add(
        "b",
        1,
        2 * s,
        0,
        5,
        (2 * s, 3 * s),
        Some("a"),
        Some(2 * s),
        Some(false),
    );
    h.add("c", 2, 4 * s, 75, 3, (4 * s, 5 * s), None, None, None);
    h.final_version = "b".into();
    // A section that ran on for 1.75 s after its lockctl exited.
    h.add(
        "d",
        3,
        6 * s,
        0,
        6,
        (6 * s, 8 * s),
        Some("b"),
        Some(7 * s),
        Some(true),
    );
    h.execs[3].exited = 6 * s + s / 4;
    h.final_version = "d".into();
    let found = rules(&check(&h, &p));
    for r in [
        "outlived its lockctl",
        "fence repeated",
        "fence went down",
        "fenced write refused",
        "unexpected exit",
    ] {
        assert!(found.contains(&r), "{r} missing from {found:?}");
    }
}

fn rules(v: &[Violation]) -> Vec<&'static str> {
    let mut r: Vec<_> = v.iter().map(|v| v.rule).collect();
    r.dedup();
    r
}

// ---------------------------------------------------------------------------------------------
// One run
// ---------------------------------------------------------------------------------------------

fn torture(nodes: usize) {
    let seed = match std::env::var("LOCKCTL_TORTURE_SEED") {
        Ok(s) if !s.is_empty() => s
            .parse()
            .unwrap_or_else(|_| panic!("LOCKCTL_TORTURE_SEED={s:?} is not a number")),
        _ => fastrand::u64(..),
    };
    let seconds: u64 = match std::env::var("LOCKCTL_TORTURE_SECONDS") {
        Ok(s) if !s.is_empty() => s
            .parse()
            .unwrap_or_else(|_| panic!("LOCKCTL_TORTURE_SECONDS={s:?} is not a number")),
        _ => 30,
    };
    let skip = skipped();
    let label = if skip.is_empty() {
        format!("seed {seed}, {nodes} node(s), {seconds} s")
    } else {
        format!(
            "seed {seed}, {nodes} node(s), {seconds} s, without {}",
            skip.join(", ")
        )
    };
    eprintln!("nemesis: {label} (set LOCKCTL_TORTURE_SEED={seed} to replay this schedule)");

    let dir = tempfile::Builder::new()
        .prefix("lockctl-nemesis-")
        .tempdir()
        .unwrap();
    prepare(dir.path());
    let mut servers = Servers::start(nodes);
    let t0 = now_ns();
    let ctx = Ctx {
        urls: servers.urls(),
        dir: dir.path().to_path_buf(),
        deadline: t0 + seconds * 1_000_000_000,
        running: Mutex::new(vec![None; WORKERS]),
        finished: AtomicUsize::new(0),
        succeeded: AtomicUsize::new(0),
        skip,
    };

    let (execs, nemesis) = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let ctx = &ctx;
                scope.spawn(move || worker(w, seed, ctx))
            })
            .collect();
        let nemesis = nemesis(&mut servers, &ctx, seed, t0);
        let execs: Vec<Exec> = workers
            .into_iter()
            .flat_map(|t| t.join().expect("worker thread"))
            .collect();
        (execs, nemesis)
    });
    drop(servers);
    let leftovers = kill_leftovers(dir.path());
    if leftovers > 0 {
        eprintln!("nemesis: killed {leftovers} process(es) of jobs still running after the run");
    }

    let history = History::read(dir.path(), execs, &nemesis);
    let params = Params {
        ttl: TTL_MS * MS,
        allowance: (KILL_AFTER_MS + MARGIN_MS) * MS,
    };
    let violations = check(&history, &params);
    let summary = summary(&label, &history, &nemesis);
    eprintln!("{summary}");
    if violations.is_empty() {
        assert!(
            history.execs.iter().any(|e| e.code == 0),
            "no section succeeded in the whole run: the test proved nothing\n{summary}"
        );
        return;
    }
    let kept = dir.keep();
    let all = report(&violations, &history, &nemesis.events, t0, usize::MAX);
    std::fs::write(kept.join("violations.txt"), format!("{summary}\n{all}")).unwrap();
    let report = report(&violations, &history, &nemesis.events, t0, 5);
    panic!(
        "nemesis found {} violation(s) ({label}; LOCKCTL_TORTURE_SEED={seed}); history and every case (violations.txt) kept in {}\n{summary}\n{report}",
        violations.len(),
        kept.display()
    );
}

fn prepare(dir: &Path) {
    std::fs::create_dir(dir.join("run")).unwrap();
    std::fs::create_dir(dir.join("log")).unwrap();
    std::fs::write(dir.join("section.py"), SECTION).unwrap();
    std::fs::write(dir.join("counter"), "0 init\n").unwrap();
    std::fs::write(dir.join("history"), "").unwrap();
    let o = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); db.executescript(\
             'CREATE TABLE store(id INTEGER PRIMARY KEY, fence INTEGER NOT NULL, writer TEXT);\
              INSERT INTO store VALUES (1, 0, NULL);\
              CREATE TABLE accepted(seq INTEGER PRIMARY KEY AUTOINCREMENT, fence INTEGER, writer TEXT);')",
        )
        .arg(dir.join("store.db"))
        .output()
        .expect("python3 (with its sqlite3 module) is required by the nemesis test");
    assert!(
        o.status.success(),
        "creating the store: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// What the workers and the nemesis share.
struct Ctx {
    urls: String,
    dir: PathBuf,
    deadline: u64,
    /// Per worker, the lockctl now running: its pid and exec id. Cleared before the pid is reaped,
    /// under this lock, so the nemesis never signals a recycled pid.
    running: Mutex<Vec<Option<(i32, String)>>>,
    finished: AtomicUsize,
    succeeded: AtomicUsize,
    /// Faults and shapes left out (`LOCKCTL_TORTURE_SKIP`).
    skip: Vec<String>,
}

/// A lockctl command with the restart quarantine at its default (the TTL): support's `lockctl()`
/// turns it off for the seconds-old servers of other tests, but this test restarts servers.
fn lockctl_quarantined(urls: &str) -> Command {
    let mut c = lockctl();
    c.env_remove("LOCKCTL_QUARANTINE")
        .env("LOCKCTL_REDIS", urls);
    c
}

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

/// What one `lockctl exec` did, as the test saw it from outside.
#[derive(Debug, Clone)]
struct Exec {
    id: String,
    worker: usize,
    pid: i32,
    spawned: u64,
    exited: u64,
    code: i32,
    /// When its command was seen gone, if it outlived lockctl.
    gone: Option<u64>,
    hold_ms: u64,
    shape: Shape,
}

/// How the section runs under `lockctl exec`: directly, or as a member of the command's process
/// group that is not lockctl's direct child: the whole group must run under the lock.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// `-- python3 section.py`
    Direct,
    /// `-c 'python3 section.py | cat'`: a pipeline, as shell jobs are.
    Pipeline,
    /// `-c 'python3 section.py & exit 0'`: the direct child exits first and leaves its work running.
    Background,
}

fn worker(w: usize, seed: u64, ctx: &Ctx) -> Vec<Exec> {
    let mut rng =
        fastrand::Rng::with_seed(seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let mut out = Vec::new();
    let ttl = format!("{TTL_MS}ms");
    let kill_after = format!("{KILL_AFTER_MS}ms");
    for i in 0.. {
        if now_ns() >= ctx.deadline {
            break;
        }
        let id = format!("w{w}.{i}");
        let hold_ms = match rng.u32(0..24) {
            0..=1 => rng.u64(TTL_MS * 3 / 2..=TTL_MS * 3),
            2..=4 => rng.u64(TTL_MS * 3 / 10..=TTL_MS * 12 / 10),
            _ => rng.u64(5..=60),
        };
        let shape = match rng.u32(0..8) {
            0 if !ctx.skip.iter().any(|s| s == "pipeline") => Shape::Pipeline,
            1 if !ctx.skip.iter().any(|s| s == "background") => Shape::Background,
            _ => Shape::Direct,
        };
        let err = File::create(ctx.dir.join("log").join(format!("{id}.err"))).unwrap();
        let mut cmd = lockctl_quarantined(&ctx.urls);
        cmd.env("DIR", &ctx.dir)
            .env("EXEC", &id)
            .env("W", format!("w{w}"))
            .env("HOLD_MS", hold_ms.to_string())
            .args(["exec", LOCK, "--ttl", &ttl, "-w", WAIT])
            .args(["--node-timeout", NODE_TIMEOUT, "--kill-after", &kill_after]);
        match shape {
            Shape::Direct => cmd.args(["--", "python3", "section.py"]),
            Shape::Pipeline => cmd.args(["-c", "python3 section.py | cat"]),
            Shape::Background => cmd.args(["-c", "python3 section.py & exit 0"]),
        };
        cmd.current_dir(&ctx.dir)
            .stdout(Stdio::null())
            // A file, not a pipe: a part of the job that outlived lockctl would hold a pipe open.
            .stderr(err);
        let spawned = now_ns();
        let child = cmd.spawn().expect("spawn lockctl");
        let pid = child.id() as i32;
        ctx.running.lock().unwrap()[w] = Some((pid, id.clone()));
        let status = wait_bounded(child, || ctx.running.lock().unwrap()[w] = None);
        let exited = now_ns();
        let code = status
            .code()
            .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
        let gone = outlived(&ctx.dir, &id);
        out.push(Exec {
            id,
            worker: w,
            pid,
            spawned,
            exited,
            code,
            gone,
            hold_ms,
            shape,
        });
        ctx.finished.fetch_add(1, Ordering::Relaxed);
        if code == 0 {
            ctx.succeeded.fetch_add(1, Ordering::Relaxed);
        }
        if code == 69 {
            // No quorum answered: do not spin on stopped nodes.
            sleep_ms(rng.u64(50..150));
        }
    }
    out
}

/// Waits for lockctl to exit, calls `exited` before reaping it (the pid stays ours until then), and
/// kills it after [`CALL_BOUND`] so that a hang fails the test instead of stalling it.
fn wait_bounded(mut child: Child, exited: impl FnOnce()) -> ExitStatus {
    let pid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if rx.recv_timeout(CALL_BOUND).is_err() {
            kill(pid, libc::SIGCONT);
            kill(pid, libc::SIGKILL);
            eprintln!("nemesis: killed lockctl pid {pid} after {CALL_BOUND:?}");
        }
    });
    // SAFETY: waitid on our own child with WNOWAIT leaves it unreaped; info is written by the call.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        while libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        ) != 0
        {
            assert_eq!(
                std::io::Error::last_os_error().raw_os_error(),
                Some(libc::EINTR),
                "waitid"
            );
        }
    }
    exited();
    let status = child.wait().expect("reap lockctl");
    let _ = tx.send(());
    let _ = watchdog.join();
    status
}

/// Kills every process still running with this run's `DIR` in its environment (parts of a job that
/// outlived their lockctl), until none is left; returns how many there were.
fn kill_leftovers(dir: &Path) -> usize {
    let needle = format!("DIR={}\0", dir.display()).into_bytes();
    let mut killed = std::collections::HashSet::new();
    for _ in 0..100 {
        let mut found = false;
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            let Ok(env) = std::fs::read(entry.path().join("environ")) else {
                continue;
            };
            if env.windows(needle.len()).any(|w| w == needle.as_slice()) && alive(pid) {
                kill(pid, libc::SIGKILL);
                killed.insert(pid);
                found = true;
            }
        }
        if !found {
            break;
        }
        sleep_ms(20);
    }
    killed.len()
}

/// If the command of exec `id` still runs after its lockctl exited (a part of the job escaped the
/// lock), waits until it is gone (killing it after a while) and says when.
fn outlived(dir: &Path, id: &str) -> Option<u64> {
    let file = dir.join("run").join(id);
    let pid: Option<i32> = std::fs::read_to_string(&file)
        .ok()
        .and_then(|s| s.trim().parse().ok());
    let _ = std::fs::remove_file(&file);
    let pid = pid?;
    if !alive(pid) {
        return None;
    }
    if !eventually(Duration::from_secs(30), || !alive(pid)) {
        kill(pid, libc::SIGKILL);
        eventually(Duration::from_secs(5), || !alive(pid));
    }
    Some(now_ns())
}

// ---------------------------------------------------------------------------------------------
// Nemesis
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Event {
    at: u64,
    what: String,
}

/// A SIGSTOP of a worker's lockctl, from `from` to `until`.
#[derive(Debug, Clone)]
struct WrapperStop {
    pid: i32,
    from: u64,
    until: u64,
}

#[derive(Default)]
struct Nemesis {
    events: Vec<Event>,
    stops: Vec<WrapperStop>,
    /// When each `break` command returned.
    breaks: Vec<u64>,
    /// The worker lockctls killed with SIGKILL.
    killed: Vec<i32>,
    counts: BTreeMap<&'static str, usize>,
}

enum Undo {
    ContNode(usize),
    LaunchNode(usize),
    ContWrapper { pid: i32, stop: usize },
}

/// The faults: what the summary calls them, the name `LOCKCTL_TORTURE_SKIP` knows them by, and
/// their weight (the long stops take the lock away for seconds, so they come less often).
const FAULTS: [(&str, &str, u32); 8] = [
    ("node SIGSTOP < TTL", "node-stop", 2),
    ("node SIGSTOP > TTL", "node-stop", 1),
    ("node kill -9, restart without data", "node-restart", 2),
    ("CLIENT KILL TYPE normal", "client-kill", 2),
    ("lockctl break --yes", "break", 2),
    ("lockctl (wrapper) SIGSTOP < TTL", "wrapper-stop", 2),
    ("lockctl (wrapper) SIGSTOP > TTL", "wrapper-stop", 1),
    ("lockctl (wrapper) kill -9", "wrapper-kill", 1),
];
/// The section shapes `LOCKCTL_TORTURE_SKIP` can leave out.
const SHAPES: [&str; 2] = ["pipeline", "background"];

/// The pause between two faults, in ms.
const FAULT_GAP_MS: std::ops::RangeInclusive<u64> = 300..=2500;

/// A fault by weight, among those not skipped.
fn pick_fault(rng: &mut fastrand::Rng, skip: &[String]) -> Option<usize> {
    let weight = |f: &(&str, &str, u32)| {
        if skip.iter().any(|s| s == f.1) {
            0
        } else {
            f.2
        }
    };
    let total: u32 = FAULTS.iter().map(weight).sum();
    if total == 0 {
        return None;
    }
    let mut x = rng.u32(..total);
    for (i, f) in FAULTS.iter().enumerate() {
        if x < weight(f) {
            return Some(i);
        }
        x -= weight(f);
    }
    unreachable!()
}

/// `LOCKCTL_TORTURE_SKIP`: fault and shape names to leave out (comma-separated), to tell which of
/// them a violation needs.
fn skipped() -> Vec<String> {
    let list = std::env::var("LOCKCTL_TORTURE_SKIP").unwrap_or_default();
    let names: Vec<String> = list
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    for n in &names {
        let known = FAULTS.iter().any(|f| f.1 == n) || SHAPES.contains(&n.as_str());
        assert!(
            known,
            "LOCKCTL_TORTURE_SKIP: unknown name {n:?}; known: {}, {}",
            FAULTS
                .iter()
                .map(|f| f.1)
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect::<Vec<_>>()
                .join(", "),
            SHAPES.join(", ")
        );
    }
    names
}

fn nemesis(servers: &mut Servers, ctx: &Ctx, seed: u64, t0: u64) -> Nemesis {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut n = Nemesis::default();
    let log = |n: &mut Nemesis, what: String| {
        n.events.push(Event { at: now_ns(), what });
    };
    let nodes = servers.0.len();
    let mut busy = vec![false; nodes];
    let mut undo: Vec<(u64, Undo)> = Vec::new();
    let mut next = now_ns() + rng.u64(FAULT_GAP_MS) * MS;
    let mut stopped: Vec<i32> = Vec::new();
    let mut progress = now_ns() + 10_000 * MS;
    let short = |rng: &mut fastrand::Rng| rng.u64(TTL_MS / 10..=TTL_MS * 8 / 10);
    let long = |rng: &mut fastrand::Rng| rng.u64(TTL_MS * 12 / 10..=TTL_MS * 2);

    loop {
        let now = now_ns();
        // Undo what is due, and everything once the run is over.
        let over = now >= ctx.deadline;
        let (due, later): (Vec<_>, Vec<_>) = undo.drain(..).partition(|(at, _)| over || *at <= now);
        undo = later;
        for (_, u) in due {
            match u {
                Undo::ContNode(i) => {
                    servers[i].resume();
                    busy[i] = false;
                    log(&mut n, format!("node {i} SIGCONT"));
                }
                Undo::LaunchNode(i) => {
                    servers[i].restart_empty();
                    busy[i] = false;
                    log(&mut n, format!("node {i} up again, without data"));
                }
                Undo::ContWrapper { pid, stop } => {
                    kill(pid, libc::SIGCONT);
                    stopped.retain(|&p| p != pid);
                    n.stops[stop].until = now_ns();
                    log(&mut n, format!("lockctl pid {pid} SIGCONT"));
                }
            }
        }
        if over {
            break;
        }
        if now >= progress {
            progress = now + 10_000 * MS;
            eprintln!(
                "nemesis: +{}s: {} exec calls, {} exited 0, {} faults",
                (now - t0) / 1_000_000_000,
                ctx.finished.load(Ordering::Relaxed),
                ctx.succeeded.load(Ordering::Relaxed),
                n.counts.values().sum::<usize>()
            );
        }
        if now < next {
            sleep_ms(10);
            continue;
        }
        next = now + rng.u64(FAULT_GAP_MS) * MS;
        let Some(kind) = pick_fault(&mut rng, &ctx.skip) else {
            continue;
        };
        // The nodes a node fault hits: one, or on Redlock sometimes a majority.
        let free: Vec<usize> = (0..nodes).filter(|&i| !busy[i]).collect();
        let want = if nodes > 1 && rng.u32(0..3) == 0 {
            nodes / 2 + 1
        } else {
            1
        };
        let mut pick = free.clone();
        rng.shuffle(&mut pick);
        pick.truncate(want);
        let done = match kind {
            0 | 1 if !pick.is_empty() => {
                let ms = if kind == 0 {
                    short(&mut rng)
                } else {
                    long(&mut rng)
                };
                for &i in &pick {
                    servers[i].pause();
                    busy[i] = true;
                    undo.push((now_ns() + ms * MS, Undo::ContNode(i)));
                }
                log(&mut n, format!("nodes {pick:?} SIGSTOP for {ms} ms"));
                true
            }
            2 if !pick.is_empty() => {
                let ms = rng.u64(0..=500);
                for &i in &pick {
                    servers[i].kill();
                    busy[i] = true;
                    undo.push((now_ns() + ms * MS, Undo::LaunchNode(i)));
                }
                log(
                    &mut n,
                    format!("nodes {pick:?} kill -9, restart in {ms} ms"),
                );
                true
            }
            3 if !free.is_empty() => {
                let i = free[rng.usize(..free.len())];
                let what = client_kill(&servers[i]);
                log(&mut n, format!("node {i} CLIENT KILL TYPE normal: {what}"));
                true
            }
            4 => {
                let o = run(lockctl_quarantined(&ctx.urls).args([
                    "break",
                    LOCK,
                    "--yes",
                    "--node-timeout",
                    NODE_TIMEOUT,
                ]));
                n.breaks.push(now_ns());
                let out = stdout(&o);
                let first = out.lines().next().unwrap_or("");
                log(
                    &mut n,
                    format!("lockctl break --yes: exit {:?} {first}", o.status.code()),
                );
                true
            }
            5..=7 => {
                let ms = if kind == 5 {
                    short(&mut rng)
                } else {
                    long(&mut rng)
                };
                let running = ctx.running.lock().unwrap();
                let live: Vec<_> = running
                    .iter()
                    .flatten()
                    .filter(|(pid, _)| !stopped.contains(pid))
                    .collect();
                // Mostly the holder's lockctl (its command runs), else any, waiting ones included.
                let holding: Vec<_> = live
                    .iter()
                    .filter(|(_, id)| ctx.dir.join("run").join(id).exists())
                    .collect();
                let target = if !holding.is_empty() && rng.u32(0..4) > 0 {
                    Some((*holding[rng.usize(..holding.len())]).clone())
                } else if !live.is_empty() {
                    Some(live[rng.usize(..live.len())].clone())
                } else {
                    None
                };
                if let (Some((pid, id)), true) = (&target, kind == 7) {
                    let (pid, id) = (*pid, id.clone());
                    kill(pid, libc::SIGKILL);
                    drop(running);
                    n.killed.push(pid);
                    log(&mut n, format!("lockctl pid {pid} ({id}) kill -9"));
                    true
                } else if let Some((pid, id)) = target {
                    kill(pid, libc::SIGSTOP);
                    drop(running);
                    stopped.push(pid);
                    let at = now_ns();
                    n.stops.push(WrapperStop {
                        pid,
                        from: at,
                        until: u64::MAX,
                    });
                    undo.push((
                        at + ms * MS,
                        Undo::ContWrapper {
                            pid,
                            stop: n.stops.len() - 1,
                        },
                    ));
                    log(
                        &mut n,
                        format!("lockctl pid {pid} ({id}) SIGSTOP for {ms} ms"),
                    );
                    true
                } else {
                    false
                }
            }
            _ => false,
        };
        if done {
            *n.counts.entry(FAULTS[kind].0).or_default() += 1;
        } else {
            // Nothing to hit right now: try again soon.
            next = now + 50 * MS;
        }
    }
    n
}

/// `CLIENT KILL TYPE normal` on a node that is not stopped, on a connection of our own (which it
/// skips), bounded so that it can never hang the nemesis.
fn client_kill(server: &Server) -> String {
    let url = format!("unix://{}", server.socket().display());
    let r = redis::Client::open(url)
        .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(500)))
        .and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(2)))?;
            redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg("normal")
                .query::<i64>(&mut c)
        });
    match r {
        Ok(k) => format!("{k} connection(s) closed"),
        Err(e) => format!("failed: {e}"),
    }
}

// ---------------------------------------------------------------------------------------------
// History and checker
// ---------------------------------------------------------------------------------------------

/// A critical section, from the history file.
#[derive(Debug, Clone)]
struct Section {
    fence: u64,
    pid: i32,
    start: u64,
    /// When it recorded its end (`end` completed, `term` cut short by SIGTERM).
    end: Option<u64>,
    how: Option<String>,
    /// The counter version it read (the exec id of the last writer, or `init`).
    read: Option<String>,
    /// When it wrote the counter (taken just before the write).
    wrote: Option<u64>,
    /// Whether the fenced store accepted its write.
    store: Option<bool>,
}

#[derive(Default)]
struct History {
    execs: Vec<Exec>,
    sections: HashMap<String, Section>,
    stops: Vec<WrapperStop>,
    breaks: Vec<u64>,
    killed: Vec<i32>,
    /// The counter's last writer at the end of the run.
    final_version: String,
    /// Where the history and lockctl's stderr (`log/<exec>.err`) are.
    dir: Option<PathBuf>,
}

fn field<T: std::str::FromStr>(s: &str) -> Option<T> {
    if s == "-" {
        None
    } else {
        s.parse().ok()
    }
}

impl History {
    /// Whether exec `e` lost its lease: it exited 76, or the nemesis killed its lockctl.
    fn lost(&self, e: &Exec) -> bool {
        e.code == 76 || (e.code == 128 + libc::SIGKILL && self.killed.contains(&e.pid))
    }

    /// A `break` returned while `e`'s lockctl ran: the operator took the lock from under it. A holder
    /// learns of it at its next renewal that gets through; while a quorum of its nodes is stopped,
    /// none does, and it may finish its command within its validity and exit 0 (as it would have,
    /// as far as it could know), with the new holder already running.
    fn broken(&self, e: &Exec) -> bool {
        self.breaks.iter().any(|&b| b >= e.spawned && b <= e.exited)
    }

    fn read(dir: &Path, execs: Vec<Exec>, nemesis: &Nemesis) -> History {
        let mut sections: HashMap<String, Section> = HashMap::new();
        let text = std::fs::read_to_string(dir.join("history")).unwrap();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["S", id, _w, fence, pid, t] => {
                    sections.insert(
                        id.to_string(),
                        Section {
                            fence: fence.parse().unwrap(),
                            pid: pid.parse().unwrap(),
                            start: t.parse().unwrap(),
                            end: None,
                            how: None,
                            read: None,
                            wrote: None,
                            store: None,
                        },
                    );
                }
                ["E", id, _w, _fence, _pid, t, how, read, wrote, store] => {
                    let s = sections
                        .get_mut(*id)
                        .unwrap_or_else(|| panic!("end without a start: {line}"));
                    s.end = Some(t.parse().unwrap());
                    s.how = Some(how.to_string());
                    s.read = field(read);
                    s.wrote = field(wrote);
                    s.store = field::<u8>(store).map(|v| v == 1);
                }
                _ => panic!("unreadable history line: {line:?}"),
            }
        }
        let counter = std::fs::read_to_string(dir.join("counter")).unwrap();
        History {
            execs,
            sections,
            stops: nemesis.stops.clone(),
            breaks: nemesis.breaks.clone(),
            killed: nemesis.killed.clone(),
            final_version: counter.split_whitespace().nth(1).unwrap_or("").to_string(),
            dir: Some(dir.to_path_buf()),
        }
    }

    /// A hand-made exec and its section, for the checker's own test: `span` is the section's start
    /// and end; lockctl exits when the section ends.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        id: &str,
        worker: usize,
        spawned: u64,
        code: i32,
        fence: u64,
        span: (u64, u64),
        read: Option<&str>,
        wrote: Option<u64>,
        store: Option<bool>,
    ) {
        self.execs.push(Exec {
            id: id.into(),
            worker,
            pid: 1000 + self.execs.len() as i32,
            spawned,
            exited: span.1,
            code,
            gone: None,
            hold_ms: 0,
            shape: Shape::Direct,
        });
        self.sections.insert(
            id.into(),
            Section {
                fence,
                pid: 2000 + self.execs.len() as i32,
                start: span.0,
                end: Some(span.1),
                how: Some(if code == 76 { "term" } else { "end" }.into()),
                read: read.map(Into::into),
                wrote,
                store,
            },
        );
    }
}

struct Params {
    ttl: u64,
    /// `--kill-after` plus the scheduling margin.
    allowance: u64,
}

#[derive(Debug)]
struct Violation {
    rule: &'static str,
    detail: String,
    execs: Vec<String>,
}

/// An exec joined with its section.
#[derive(Clone, Copy)]
struct Row<'a> {
    e: &'a Exec,
    s: &'a Section,
}

impl Row<'_> {
    /// When the section certainly no longer ran: its end record, else when its command was seen
    /// gone (lockctl's exit, or later if the command outlived it).
    fn end(&self) -> u64 {
        self.s
            .end
            .unwrap_or_else(|| self.e.exited.max(self.e.gone.unwrap_or(0)))
    }
}

fn check(h: &History, p: &Params) -> Vec<Violation> {
    let mut v = Vec::new();
    let mut rows: Vec<Row> = Vec::new();
    for e in &h.execs {
        let s = h.sections.get(&e.id);
        match (e.code, s) {
            (0, Some(s)) => rows.push(Row { e, s }),
            (_, Some(s)) if h.lost(e) => rows.push(Row { e, s }),
            (69 | 75, None) => {}
            (_, None) if h.lost(e) => {}
            (0, None) => v.push(Violation {
                rule: "unexpected exit",
                detail: format!("{} exited 0 but its command never ran", e.id),
                execs: vec![e.id.clone()],
            }),
            (code, s) => {
                v.push(Violation {
                    rule: "unexpected exit",
                    detail: format!(
                        "{} exited {code}{}",
                        e.id,
                        if s.is_some() {
                            " and its command ran"
                        } else {
                            ""
                        }
                    ),
                    execs: vec![e.id.clone()],
                });
                if let Some(s) = s {
                    rows.push(Row { e, s });
                }
            }
        }
        if let (0, Some(s)) = (e.code, s) {
            if s.how.as_deref() != Some("end") {
                v.push(Violation {
                    rule: "unexpected exit",
                    detail: format!("{} exited 0 but its section did not complete", e.id),
                    execs: vec![e.id.clone()],
                });
            } else if s.store != Some(true) && !h.broken(e) {
                v.push(Violation {
                    rule: "fenced write refused",
                    detail: format!(
                        "{} exited 0 but the store refused its fence {}",
                        e.id, s.fence
                    ),
                    execs: vec![e.id.clone()],
                });
            }
        }
    }
    rows.sort_by_key(|r| r.s.start);
    for r in &rows {
        let late = r.end().saturating_sub(r.e.exited);
        if late > p.allowance {
            v.push(Violation {
                rule: "outlived its lockctl",
                detail: format!(
                    "the section of {} (fence {}, exit {}, {:?}) ran on for {} ms after its lockctl \
                     exited",
                    r.e.id,
                    r.s.fence,
                    r.e.code,
                    r.e.shape,
                    late / MS
                ),
                execs: vec![r.e.id.clone()],
            });
        }
    }
    overlaps(&rows, h, p, &mut v);
    lost_updates(&rows, h, &mut v);
    fences(&rows, &mut v);
    v
}

/// Rule 1: every overlap must be excused by the earlier grant's lost lease, within its bound.
fn overlaps(rows: &[Row], h: &History, p: &Params, v: &mut Vec<Violation>) {
    for (i, x) in rows.iter().enumerate() {
        for y in &rows[i + 1..] {
            if y.s.start >= x.end() {
                break;
            }
            // The earlier grant: the one whose section started before the other's lockctl was
            // spawned; when neither did, the smaller fence.
            let y_first =
                x.e.spawned > y.s.start || (y.e.spawned <= x.s.start && y.s.fence < x.s.fence);
            let (old, new) = if y_first { (y, x) } else { (x, y) };
            let from = x.s.start.max(y.s.start);
            let to = x.end().min(y.end());
            let ms = (to - from) / MS;
            if !h.lost(old.e) && !h.broken(old.e) {
                v.push(Violation {
                    rule: "overlap",
                    detail: format!(
                        "{} (fence {}, exit {}) and {} (fence {}, exit {}) ran at once for {ms} ms; \
                         the earlier grant exited {}, so its lease held throughout",
                        old.e.id,
                        old.s.fence,
                        old.e.code,
                        new.e.id,
                        new.s.fence,
                        new.e.code,
                        old.e.code
                    ),
                    execs: vec![old.e.id.clone(), new.e.id.clone()],
                });
                continue;
            }
            let (lo, hi) = (old.e.spawned, old.e.exited);
            let excuse = h
                .stops
                .iter()
                .filter(|s| s.pid == old.e.pid && s.from <= hi && s.until >= lo)
                .map(|s| s.until)
                .chain(
                    h.breaks
                        .iter()
                        .filter(|&&b| b >= lo && b <= hi)
                        .map(|b| b + p.ttl),
                )
                .fold(new.s.start, u64::max);
            let bound = excuse.saturating_add(p.allowance);
            if to > bound {
                v.push(Violation {
                    rule: "overlap beyond the stop bound",
                    detail: format!(
                        "{} (fence {}, exit {}) still ran {} ms past its stop bound while {} \
                         (fence {}, exit {}) held the lock ({ms} ms of overlap)",
                        old.e.id,
                        old.s.fence,
                        old.e.code,
                        (to - bound) / MS,
                        new.e.id,
                        new.s.fence,
                        new.e.code
                    ),
                    execs: vec![old.e.id.clone(), new.e.id.clone()],
                });
            }
        }
    }
}

/// Rule 2: a counter write nobody read, overwritten by the next write, both by holders that exited 0.
fn lost_updates(rows: &[Row], h: &History, v: &mut Vec<Violation>) {
    let mut writes: Vec<(u64, Row)> = rows
        .iter()
        .filter_map(|r| r.s.wrote.map(|t| (t, *r)))
        .collect();
    writes.sort_by_key(|(t, _)| *t);
    let mut readers: HashMap<&str, usize> = HashMap::new();
    for (_, r) in &writes {
        if let Some(read) = &r.s.read {
            *readers.entry(read.as_str()).or_default() += 1;
        }
    }
    // Sections whose write time is known. A section killed between its write and its end record (its
    // lockctl was killed, and the watcher killed the job) wrote a version nobody can place: a write
    // that read such a version is not judged, since the unplaced write may well have read the one
    // before it.
    let known: HashSet<&str> = writes.iter().map(|(_, r)| r.e.id.as_str()).collect();
    for (k, (_, t)) in writes.iter().enumerate() {
        if t.e.id == h.final_version || readers.contains_key(t.e.id.as_str()) {
            continue;
        }
        let Some((_, s)) = writes.get(k + 1) else {
            continue;
        };
        if s.s
            .read
            .as_deref()
            .is_some_and(|read| read != "init" && !known.contains(read))
        {
            continue;
        }
        if t.e.code == 0 && s.e.code == 0 && !h.broken(t.e) {
            v.push(Violation {
                rule: "lost update",
                detail: format!(
                    "the counter write of {} (fence {}) was overwritten unread by {} (fence {}), \
                     which had read version {}; both exited 0",
                    t.e.id,
                    t.s.fence,
                    s.e.id,
                    s.s.fence,
                    s.s.read.as_deref().unwrap_or("?")
                ),
                execs: vec![t.e.id.clone(), s.e.id.clone()],
            });
        }
    }
}

/// Rule 4: fences strictly increase in grant order.
fn fences(rows: &[Row], v: &mut Vec<Violation>) {
    let mut by_fence: BTreeMap<u64, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_fence.entry(r.s.fence).or_default().push(r);
    }
    for (fence, rs) in &by_fence {
        if rs.len() > 1 {
            v.push(Violation {
                rule: "fence repeated",
                detail: format!(
                    "fence {fence} was handed out {} times: {}",
                    rs.len(),
                    rs.iter()
                        .map(|r| r.e.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                execs: rs.iter().map(|r| r.e.id.clone()).collect(),
            });
        }
    }
    // `rows` is sorted by section start; a grant whose lockctl was spawned after a section started
    // came after that section's grant.
    let mut later: Vec<&Row> = rows.iter().collect();
    later.sort_by_key(|r| r.e.spawned);
    let mut k = 0;
    let mut max: Option<&Row> = None;
    for y in later {
        while k < rows.len() && rows[k].s.start < y.e.spawned {
            if max.is_none_or(|m| rows[k].s.fence > m.s.fence) {
                max = Some(&rows[k]);
            }
            k += 1;
        }
        if let Some(x) = max {
            if x.s.fence > y.s.fence {
                v.push(Violation {
                    rule: "fence went down",
                    detail: format!(
                        "{} got fence {}, below the fence {} of {}, whose section had started \
                         before {}'s lockctl was spawned",
                        y.e.id, y.s.fence, x.s.fence, x.e.id, y.e.id
                    ),
                    execs: vec![x.e.id.clone(), y.e.id.clone()],
                });
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

fn summary(label: &str, h: &History, n: &Nemesis) -> String {
    let mut codes: BTreeMap<i32, usize> = BTreeMap::new();
    for e in &h.execs {
        *codes.entry(e.code).or_default() += 1;
    }
    let mut s = format!(
        "nemesis summary ({label}): {} exec calls, {} sections ran; exit codes {codes:?}\n  faults:",
        h.execs.len(),
        h.sections.len()
    );
    for (k, c) in &n.counts {
        let _ = write!(s, " {k}: {c};");
    }
    if n.counts.is_empty() {
        s.push_str(" none");
    }
    s
}

/// The violations by rule, `shown` cases of each, with their records and the events around them.
fn report(
    violations: &[Violation],
    h: &History,
    events: &[Event],
    t0: u64,
    shown: usize,
) -> String {
    let rel = |t: u64| format!("+{:.3}s", t.saturating_sub(t0) as f64 / 1e9);
    let mut by_rule: BTreeMap<&str, Vec<&Violation>> = BTreeMap::new();
    for v in violations {
        by_rule.entry(v.rule).or_default().push(v);
    }
    let execs: HashMap<&str, &Exec> = h.execs.iter().map(|e| (e.id.as_str(), e)).collect();
    let mut out = String::new();
    for (rule, vs) in &by_rule {
        let _ = writeln!(
            out,
            "\nVIOLATION [{rule}]: {} found, the first {} shown",
            vs.len(),
            vs.len().min(shown)
        );
        for v in vs.iter().take(shown) {
            let _ = writeln!(out, "- {}", v.detail);
            let (mut lo, mut hi) = (u64::MAX, 0);
            for id in &v.execs {
                let Some(e) = execs.get(id.as_str()) else {
                    continue;
                };
                lo = lo.min(e.spawned);
                hi = hi.max(e.exited);
                let _ = write!(
                    out,
                    "    {} worker {} lockctl pid {} spawned {} exited {} code {} hold {} ms ({:?})",
                    e.id,
                    e.worker,
                    e.pid,
                    rel(e.spawned),
                    rel(e.exited),
                    e.code,
                    e.hold_ms,
                    e.shape
                );
                if let Some(s) = h.sections.get(id) {
                    let _ = write!(
                        out,
                        "; section pid {} fence {} start {} end {} ({}) read {} wrote {} store {}",
                        s.pid,
                        s.fence,
                        rel(s.start),
                        s.end.map(rel).unwrap_or_else(|| "-".into()),
                        s.how.as_deref().unwrap_or("no end record"),
                        s.read.as_deref().unwrap_or("-"),
                        s.wrote.map(rel).unwrap_or_else(|| "-".into()),
                        match s.store {
                            Some(true) => "accepted",
                            Some(false) => "REFUSED",
                            None => "-",
                        }
                    );
                }
                if let Some(g) = e.gone {
                    let _ = write!(out, "; command outlived lockctl until {}", rel(g));
                }
                out.push('\n');
                let err = h
                    .dir
                    .as_ref()
                    .and_then(|d| {
                        std::fs::read_to_string(d.join("log").join(format!("{id}.err"))).ok()
                    })
                    .unwrap_or_default();
                for l in err.lines().take(4) {
                    let _ = writeln!(out, "      stderr: {l}");
                }
            }
            let from = lo.saturating_sub(2 * TTL_MS * MS);
            let to = hi.saturating_add(1000 * MS);
            let _ = writeln!(out, "    nemesis events from {} to {}:", rel(from), rel(to));
            for ev in events.iter().filter(|ev| ev.at >= from && ev.at <= to) {
                let _ = writeln!(out, "      {} {}", rel(ev.at), ev.what);
            }
        }
    }
    out
}
