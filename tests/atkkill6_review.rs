//! An adversarial review of 3593fda (`kill_at_once` pins in passes of `pin_budget`): a watcher
//! with a low RLIMIT_NOFILE (budget 1 at 40 and 64) against a job of hundreds of processes in
//! sessions of their own, some of which continue themselves (a POSIX timer sending SIGCONT) and
//! fork `setsid` children when they find they were stopped; compared with the default limit.
//! `ATKKILL6_ROUNDS` multiplies the rounds. Run alone, one test thread.
//!
//! Counts from runs on a 2-CPU machine (default soft limit 20000 here, budget 9968):
//! - 450 processes (40 self-continuing, forking nothing), limit 40 vs default: 0 of 12 and 0 of
//!   12 rounds left anything; the watcher always exited (0.22 to 0.48 s). 200 quiet ones at
//!   limit 16: 0 of 2. The passes kill everything found.
//! - 300 processes, 20 of them forking `setsid` children once lockctl is gone (8 at most each):
//!   left processes in 14 of 18 rounds at the default limit (the control), 12 of 15 at 40, 18 of
//!   21 at 64: no difference the change makes. Every process left started after lockctl's death
//!   (children of the restless ones, parent init); the originals all died. Ignored: it breaks
//!   the control as much (pre-existing; see the report).
//! - 30 processes, 20 restless: 2 of 4 (default) and 0 of 4 (limit 40), one child each.
//! - With `src/exec/procs.rs` of b80c5ab (before the pins and their passes), the two controls
//!   left processes in 2 of 3 and 3 of 4 rounds: the escape predates both changes. Children were
//!   born 23 to 284 ms after the kill, sometimes several of one parent milliseconds apart, so not
//!   all of it is the stated instant before a parent's death; its cause is not found
//!   (`docs/guarantees.md`, the limits of the freeze).

mod support;

use std::io::BufRead;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::Duration;

use support::tagged::*;
use support::*;

fn rounds(default: usize) -> usize {
    support::watchers::rounds_times("ATKKILL6_ROUNDS", default)
}

fn tag(n: usize) -> String {
    support::watchers::process_tag(n, 6)
}

/// `esc6 job TAG DIR N R FORKS`: the job's first process (lockctl's child). Forks N children,
/// each `setsid`; the first R of them are restless: a timer sends them SIGCONT every 2 ms, and
/// once lockctl is gone, each time they find a gap of 1.5 ms or more in their own 200 us loop
/// (stopped, or not given a CPU), they fork a `setsid` child that pauses (FORKS at most each).
/// The restless ones write `fork.TAG.PID` with how many they forked. Says `ready`, then pauses.
const ESC6: &str = r#"
static long now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000L + t.tv_nsec / 1000;
}

static void idle(void) {
    signal(SIGHUP, SIG_IGN);
    for (;;) pause();
}

static void restless(pid_t lpid, int forks) {
    signal(SIGHUP, SIG_IGN);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_cont;
    sigaction(SIGCONT, &sa, 0);
    timer_t t;
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGCONT;
    if (timer_create(CLOCK_MONOTONIC, &ev, &t) != 0) idle();
    struct itimerspec its = {{0, 2000000}, {0, 2000000}};
    timer_settime(t, 0, &its, 0);
    int made = 0, gone = 0;
    long last = now_us();
    for (;;) {
        struct timespec d = {0, 200000};
        nanosleep(&d, 0);
        long now = now_us();
        if (!gone && kill(lpid, 0) != 0 && errno == ESRCH) gone = 1;
        if (gone && made < forks && now - last >= 1500) {
            pid_t c = fork();
            if (c == 0) {
                setsid();
                char what[64];
                snprintf(what, sizeof what, "child.%d", getpid());
                mark(what, now_us() * 10 + made + 1);
                idle();
            }
            if (c > 0) {
                made++;
                char what[64];
                snprintf(what, sizeof what, "fork.%d", getpid());
                mark(what, made);
            }
        }
        last = now_us();
    }
}

int main(int argc, char **argv) {
    if (argc < 7) return 2;
    tag = argv[2];
    dir = argv[3];
    int n = atoi(argv[4]), r = atoi(argv[5]), forks = atoi(argv[6]);
    pid_t lpid = getppid();
    signal(SIGTERM, SIG_IGN);
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            setsid();
            if (i < r) restless(lpid, forks);
            idle();
        }
    }
    printf("ready\n");
    fflush(stdout);
    idle();
    return 0;
}
"#;

#[derive(Debug)]
#[allow(dead_code)]
struct Broken {
    round: usize,
    watcher_exited: bool,
    left: usize,
    forked_after_kill: usize,
    first: Vec<Left>,
}

/// One scene: `limit` the watcher's RLIMIT_NOFILE (None: inherited).
fn scene(limit: Option<u64>, n_rounds: usize, base: usize, n: usize, r: usize, forks: usize) {
    let s = Server::start();
    let src = format!("{C_PRELUDE}{ESC6}");
    let bin = compile(s.dir(), "esc6", &src);
    let mut broken = Vec::new();
    for round in 0..n_rounds {
        let t = tag(base + round);
        let _sweep = Sweep(t.clone());
        let mut cmd = lockctl_on(&s);
        cmd.args([
            "exec",
            &format!("kill6-{t}"),
            "--ttl",
            "5s",
            "--kill-after",
            "1s",
            "--",
        ])
        .arg(&bin)
        .args(["job", &t])
        .arg(s.dir())
        .args([n.to_string(), r.to_string(), forks.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
        if let Some(lim) = limit {
            // SAFETY: setrlimit only (async-signal-safe), on a value built before the fork.
            unsafe {
                cmd.pre_exec(move || {
                    let l = libc::rlimit {
                        rlim_cur: lim,
                        rlim_max: lim,
                    };
                    match libc::setrlimit(libc::RLIMIT_NOFILE, &l) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
        }
        let mut child = cmd.spawn().unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let l = Lockctl(Some(child));
        let mut line = String::new();
        let ready = (0..10).any(|_| {
            line.clear();
            out.read_line(&mut line).unwrap_or(0) > 0 && line.trim() == "ready"
        });
        assert!(ready, "round {round}: the job never said ready: {line:?}");
        assert!(
            eventually(Duration::from_secs(10), || tagged_but(&t, &[]).len() > n),
            "round {round}: the job's processes never ran"
        );
        std::thread::sleep(Duration::from_millis(200));
        let before = tagged_but(&t, &[]).len();
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime writes the struct given.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        let kill_us = ts.tv_sec * 1_000_000 + ts.tv_nsec / 1000;
        let (at, quiet, took) = kill_lockctl(l);
        let left = leftovers(&t, at, &[], Duration::from_secs(3));
        let forked: usize = std::fs::read_dir(s.dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.starts_with("fork.") && name.ends_with(&t)
            })
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .filter_map(|c| c.split_whitespace().nth(1)?.parse::<usize>().ok())
            .sum();
        for x in &left {
            let f = s.dir().join(format!("child.{}.{t}", x.pid));
            if let Ok(c) = std::fs::read_to_string(&f) {
                let v: i64 = c
                    .split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (born, idx) = (v / 10, v % 10);
                let parent = c.split_whitespace().nth(3).unwrap_or("?").to_string();
                let n_of = std::fs::read_to_string(s.dir().join(format!("fork.{parent}.{t}")))
                    .unwrap_or_default();
                eprintln!(
                    "  escapee {} born {} us after the kill (watcher gone by {} us), fork {idx} of parent {parent} (which made {})",
                    x.pid, born - kill_us, took.as_micros(), n_of.split_whitespace().nth(1).unwrap_or("?")
                );
            }
        }
        let later = left.iter().filter(|x| x.after_kill >= 0).count();
        eprintln!(
            "limit {limit:?} round {round}: {before} before; watcher exited: {quiet} after \
             {took:?}; forked after lockctl's death {forked}; left {} ({later} started at or \
             after the kill tick)",
            left.len()
        );
        if !quiet || !left.is_empty() {
            broken.push(Broken {
                round,
                watcher_exited: quiet,
                left: left.len(),
                forked_after_kill: forked,
                first: left.into_iter().take(3).collect(),
            });
        }
    }
    assert_held(
        &broken,
        n_rounds,
        &format!("RLIMIT_NOFILE {limit:?}: the job outlived lockctl"),
    );
}

#[test]
#[ignore = "breaks the control (default limit) as much: pre-existing, not 3593fda"]
fn restless_job_watcher_at_nofile_40() {
    scene(Some(40), rounds(3), 0, 300, 20, 8);
}

#[test]
#[ignore = "breaks the control (default limit) as much: pre-existing, not 3593fda"]
fn restless_job_watcher_at_nofile_64() {
    scene(Some(64), rounds(3), 100, 300, 20, 8);
}

#[test]
#[ignore = "breaks the control (default limit) as much: pre-existing, not 3593fda"]
fn restless_job_control_default_nofile() {
    scene(None, rounds(3), 200, 300, 20, 8);
}

/// 450 processes, 40 of them restless but forking nothing: every process found must die.
#[test]
fn big_restless_job_no_forks_watcher_at_nofile_40() {
    scene(Some(40), rounds(3), 300, 450, 40, 0);
}

#[test]
fn big_restless_job_no_forks_control_default_nofile() {
    scene(None, rounds(3), 400, 450, 40, 0);
}

/// The watcher at a very low limit (budget 1 and few descriptors spare): 200 quiet processes.
#[test]
fn quiet_job_watcher_at_nofile_16() {
    scene(Some(16), rounds(2), 500, 200, 0, 0);
}

/// The same restless members with few quiet ones (30 in all): does the escape scale with size?
#[test]
#[ignore = "breaks the control (default limit) as much: pre-existing, not 3593fda"]
fn small_restless_job_watcher_at_nofile_40() {
    scene(Some(40), rounds(4), 600, 30, 20, 8);
}

#[test]
#[ignore = "breaks the control (default limit) as much: pre-existing, not 3593fda"]
fn small_restless_job_control_default_nofile() {
    scene(None, rounds(4), 700, 30, 20, 8);
}
