//! An adversarial review of 702d170 ("watcher: a process of the job found running 2 ms after the
//! freeze's stop was sent ... is stopped again, what it started is stopped through the kernel's
//! lists of its children, and it is killed at once"). Attacked on real processes, a real
//! `redis-server` and the real `lockctl`, against both promises: nothing of the job outlives a
//! SIGKILLed lockctl (running or stopped), and nothing that is not the job's is stopped or killed.
//!
//! Every scene's job runs `esc` (the C program [`ESC`], compiled with `cc`); every process it
//! starts carries the scene's tag in its command line, and the processes it starts to escape are
//! `sleep 300` named `escape.TAG`, in sessions of their own, behind middles that exit at once.
//!
//! Scenes (see each test's doc; counts from a run of the scene alone and a run of the whole file
//! with one test thread, on a 2-core machine shared with another test suite):
//!
//! - `the_early_kill_orphans_a_chain_of_groups_that_the_kernel_continues`: the early kill of a
//!   self-continuing process orphaned its child's group (stopped by the freeze, SIGHUP ignored);
//!   the kernel sent it SIGHUP and SIGCONT, and the child ran until the freeze looked at it again,
//!   after its 1 ms sleep; its escapes went to init. 8 of 8 rounds, then 5 of 8 in a run of the
//!   whole file, left escapes (1 to 7 each), all started after the freeze had stopped their
//!   starter.
//! - `the_early_kill_of_a_tracer_lets_its_tracee_run`: a tracer killed early detached its tracee,
//!   parked at a system-call stop (held, for the freeze) after the tracer suppressed the freeze's
//!   stop; the kernel resumed it. 5 of 8 rounds left escapes (1 or 2), in each of two runs.
//!
//!   The fix for both (`Freeze::tend`): once one process is found running past its stop, the
//!   freeze gives way to the kill: what every process held so far started is stopped through the
//!   kernel's lists of children, and all are killed in one pass, children before their parents
//!   (`deepest_first`), so that a process the kernel continues already has its SIGKILL pending.
//!   Both pass since, run one at a time.
//! - `a_process_whose_main_thread_exited_is_taken_for_gone`: `hold` read the leader's state; a
//!   leader that exited (`pthread_exit`) reads `Z` while the process's other thread runs: "gone",
//!   never looked at again, never killed early, running through the freeze (which its own forks
//!   stretch to 0.3 to 0.6 s). 2 of 6, then 3 of 6 rounds left escapes started 200 to 350 ms
//!   after the kill (40 to 82 a round). Fixed: a leader in state `Z` is judged by its other
//!   threads (`threads_hold`); its escapes now all start within 10 ms of the kill, before the
//!   watcher's first walk. One run of 6 rounds since left one process that was not an escape (not
//!   shown; two further runs passed).
//! - `a_threaded_process_with_its_main_thread_alive_is_killed_early` (held): its control.
//! - `the_early_kill_of_a_busy_process_waiting_for_a_cpu_orphans_its_child_s_group` (held, 0 of
//!   4): the chain with busy parents and no timer; the busy ones took their stops within 2 ms
//!   here, none was killed early, no child was continued. (With the fix above but the kill in the
//!   order found, 4 of 4 rounds failed: on a loaded machine a busy parent waited over 2 ms for a
//!   CPU, and was killed before its child.)
//! - `a_restless_forker_s_fork_in_flight` (held, 0 of 16 and 0 of 8 rounds): the stated instant
//!   between the look at a restless process's children and its death.
//! - `a_swarm_of_restless_chains_ends_promptly` (held): 123 processes, 40 restless, 80 in groups
//!   that the early kills orphan: the job gone 0.17 to 0.33 s after the kill.
//! - `the_deadline_path_with_an_orphan_chain_and_a_tracer` (held): lockctl, stopped but alive, is
//!   the subreaper of what the early kills hand on: no group is orphaned, escapes are found.
//! - `bystanders_in_lockctl_s_session_are_spared_by_the_early_kills` (held).
//!
//! `ATKKILL2_ROUNDS` multiplies every scene's rounds.

mod support;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::tagged::*;
use support::watchers::{state, ticks_now};
use support::*;

fn rounds(default: usize) -> usize {
    support::watchers::rounds_times("ATKKILL2_ROUNDS", default)
}

/// A tag unique to this test process and `n`: it names the processes a scene started, and only
/// those (it appears in their command lines).
fn tag(n: usize) -> String {
    support::watchers::process_tag(n, 6)
}

/// The job's program, after [`C_PRELUDE`]. `esc MODE TAG DIR N NS LOCKCTL` (NS: the period of a
/// process's own SIGCONT timer, in ns; LOCKCTL: lockctl's PID). Escapes are `sleep 300` named
/// `escape.TAG`, each started behind a middle process that exits at once, in a session of its own
/// (`setsid`). SIGTERM is ignored throughout.
///
/// - `orphan`: a chain of N+1 processes; the first (level 0) stays in the job's group and sends
///   itself SIGCONT with a POSIX timer every NS ns: a stop does not hold it. Each of levels 1..N is
///   the child of the one before, leads a process group of its own in the job's session, ignores
///   SIGHUP, and waits for a SIGCONT; once continued it starts 201 escapes, writing `woke.TAG`
///   (its PID, level, parent) after the first.
/// - `busy`: N chains of one level whose level 0 is a busy loop (no timer: any stop holds it once
///   it gets a CPU), with escapes.
/// - `swarm`: N chains of two levels below a self-continuing process each, as `orphan` but with no
///   escapes.
/// - `forker`: self-continuing; once lockctl is a zombie or gone, forks N children that call
///   `setsid` and become `escape.TAG`, as fast as it can, not waiting for them.
/// - `zleader`: self-continuing; its main thread exits (`pthread_exit`), its other thread starts
///   N escapes once lockctl is gone, one every 3 ms, not waiting for the middles. `threaded`: the
///   same with the main thread alive (it waits in `pause`).
/// - `tracer`: the first process `t` (self-continuing) traces its child `b` and keeps it parked at
///   a system-call stop. Whenever `b` has a SIGSTOP pending, `t` lets it take it, suppresses it
///   (`PTRACE_SYSCALL` with no signal) and parks it at its next system call again (counted in
///   `suppressed.TAG`). Once `b` is no longer traced it starts escapes as `orphan` does.
const ESC: &str = r#"static void nop(int s) { (void)s; }

/* A POSIX timer sending this process SIGCONT every `ns` nanoseconds. */
static void self_timer(long ns) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = nop;
    sigaction(SIGCONT, &sa, 0);
    timer_t t;
    struct sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_SIGNAL;
    ev.sigev_signo = SIGCONT;
    timer_create(CLOCK_MONOTONIC, &ev, &t);
    struct itimerspec its = {{0, ns}, {0, ns}};
    timer_settime(t, 0, &its, 0);
}

/* `n` times: a middle process starts `setsid sleep 300` named `escape.TAG` and exits at once. */
static void escape(int n) {
    for (int i = 0; i < n; i++) {
        pid_t m = fork();
        if (m == 0) {
            if (fork() == 0) {
                setsid();
                execlp("sleep", escarg, "300", (char *)0);
                _exit(1);
            }
            _exit(0);
        }
        if (m > 0)
            waitpid(m, 0, 0);
    }
}

static int traced(void) {
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY);
    if (fd < 0) return 1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 1;
    buf[n] = 0;
    char *t = strstr(buf, "TracerPid:");
    return t && atoi(t + 10) != 0;
}

static int sigstop_pending(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    int fd = open(path, O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *keys[] = {"SigPnd:", "ShdPnd:"};
    for (int k = 0; k < 2; k++) {
        char *p = strstr(buf, keys[k]);
        if (p && (strtoull(p + 7, 0, 16) & (1ULL << (SIGSTOP - 1))))
            return 1;
    }
    return 0;
}

/* Level 0 continues itself with a timer every `ns`; levels 1..`levels` each lead a group of their
 * own in the session, ignore SIGHUP, and once continued start `escapes` escapes. */
static void chain(int levels, long ns, int escapes, int ready) {
    int lvl = 0;
    while (lvl < levels) {
        pid_t c = fork();
        if (c != 0)
            break;
        lvl++;
        setpgid(0, 0);
        signal(SIGHUP, SIG_IGN);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_cont;
        sigaction(SIGCONT, &sa, 0);
    }
    if (lvl == levels && ready)
        mark("ready", levels);
    if (lvl == 0) {
        if (ns == 0)
            for (;;) /* busy, no timer: a stop holds it once it gets a CPU */
                ;
        self_timer(ns);
        for (;;)
            pause();
    }
    while (!woke)
        pause();
    if (escapes > 0) {
        escape(1);
        mark("woke", lvl);
        escape(escapes - 1);
    } else {
        mark("woke", lvl);
    }
    for (;;)
        pause();
}

static char lockctl_stat[64];
static int escapes_left;

/* Whether lockctl (its stat file `lockctl_stat`) is a zombie or gone. */
static int lockctl_gone(void) {
    char buf[512];
    int fd = open(lockctl_stat, O_RDONLY);
    if (fd < 0)
        return 1;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0)
        return 1;
    buf[len] = 0;
    char *st = strrchr(buf, ')');
    return st && (st[2] == 'Z' || st[2] == 'X');
}

static void *zworker(void *arg) {
    (void)arg;
    while (!lockctl_gone())
        usleep(1000);
    /* The middles are not waited for: one that the freeze stops does not hold this thread. */
    for (int i = 0; i < escapes_left; i++) {
        if (fork() == 0) {
            if (fork() == 0) {
                setsid();
                execlp("sleep", escarg, "300", (char *)0);
                _exit(1);
            }
            _exit(0);
        }
        if (i == 0)
            mark("woke", 0);
        usleep(3000);
    }
    for (;;)
        pause();
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    char *mode = argv[1];
    tag = argv[2];
    dir = argv[3];
    int n = atoi(argv[4]);
    long ns = argc > 5 ? atol(argv[5]) : 1000000;
    snprintf(escarg, sizeof escarg, "escape.%s", tag);
    signal(SIGTERM, SIG_IGN);
    if (strcmp(mode, "orphan") == 0)
        chain(n, ns, 201, 1);
    if (strcmp(mode, "busy") == 0) {
        /* N chains of one level below a busy process each, with escapes. */
        for (int i = 0; i < n; i++)
            if (fork() == 0)
                chain(1, 0, 201, 0);
        usleep(200000);
        mark("ready", n);
        for (;;)
            pause();
    }
    if (strcmp(mode, "swarm") == 0) {
        /* N chains of 2 levels below a self-continuing process each, no escapes. */
        for (int i = 0; i < n; i++)
            if (fork() == 0)
                chain(2, ns, 0, 0);
        usleep(300000);
        mark("ready", n);
        for (;;)
            pause();
    }
    if (strcmp(mode, "forker") == 0) {
        /* Self-continuing; once lockctl (argv[6]) is gone, forks `setsid sleep` children named
         * escape.TAG as fast as it can (N at most), without waiting for them. */
        char path[64];
        snprintf(path, sizeof path, "/proc/%s/stat", argc > 6 ? argv[6] : "1");
        mark("ready", n);
        self_timer(ns);
        while (access(path, F_OK) == 0) {
            char buf[512];
            int fd = open(path, O_RDONLY);
            if (fd < 0) break;
            ssize_t len = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (len <= 0) break;
            buf[len] = 0;
            char *st = strrchr(buf, ')');
            if (st && (st[2] == 'Z' || st[2] == 'X')) break;
            usleep(1000);
        }
        mark("woke", 0);
        for (int i = 0; i < n; i++)
            if (fork() == 0) {
                setsid();
                execlp("sleep", escarg, "300", (char *)0);
                _exit(1);
            }
        for (;;)
            pause();
    }
    if (strcmp(mode, "zleader") == 0 || strcmp(mode, "threaded") == 0) {
        /* Self-continuing; its main thread exits (the leader is a zombie, state Z, while the
         * process runs on); the other thread, once lockctl (argv[6]) is gone, starts N escapes,
         * one every 3 ms. */
        snprintf(lockctl_stat, sizeof lockctl_stat, "/proc/%s/stat", argc > 6 ? argv[6] : "1");
        escapes_left = n;
        self_timer(ns);
        pthread_t th;
        pthread_create(&th, 0, zworker, 0);
        usleep(50000);
        mark("ready", n);
        if (strcmp(mode, "threaded") == 0)
            for (;;)
                pause();
        pthread_exit(0);
    }
    if (strcmp(mode, "tracer") == 0) {
        pid_t b = fork();
        if (b == 0) {
            ptrace(PTRACE_TRACEME, 0, 0, 0);
            raise(SIGSTOP);
            while (traced())
                ;
            escape(1);
            mark("woke", 1);
            escape(200);
            for (;;)
                pause();
        }
        int st;
        waitpid(b, &st, __WALL);
        ptrace(PTRACE_SETOPTIONS, b, 0, PTRACE_O_TRACESYSGOOD);
        ptrace(PTRACE_SYSCALL, b, 0, 0);
        waitpid(b, &st, __WALL);
        /* b is parked at a system call stop. */
        mark("ready", b);
        self_timer(ns);
        long suppressed = 0;
        for (;;) {
            if (sigstop_pending(b)) {
                /* Let b take its stop, suppress it, park b at its next system call. */
                ptrace(PTRACE_SYSCALL, b, 0, 0);
                for (int i = 0; i < 8; i++) {
                    if (waitpid(b, &st, __WALL) < 0) {
                        if (errno == EINTR) { i--; continue; }
                        break;
                    }
                    if (!WIFSTOPPED(st)) break;
                    if (WSTOPSIG(st) == (SIGTRAP | 0x80) && !sigstop_pending(b))
                        break;
                    int sig = WSTOPSIG(st) == SIGSTOP ? 0 : 0;
                    ptrace(PTRACE_SYSCALL, b, 0, sig);
                }
                suppressed++;
                mark("suppressed", suppressed);
            }
            usleep(100);
        }
    }
    return 2;
}
"#;

/// One round's outcome.
#[derive(Debug)]
#[allow(dead_code)]
struct Round {
    round: usize,
    /// What of the job was left 3 s after lockctl's SIGKILL (the first three).
    left: Vec<Left>,
    /// How many were left, how many of them escapes started after a continuation, how many
    /// started 200 ms or more after the kill.
    count: usize,
    escapes: usize,
    late: usize,
    /// `woke.TAG` and `suppressed.TAG`, as the job wrote them.
    woke: Option<String>,
    suppressed: Option<String>,
    watcher_exited: bool,
    watcher_took: Duration,
}

/// Runs `esc MODE TAG DIR N NS` as the job of a `lockctl exec`, SIGKILLs lockctl after 300 to
/// 500 ms, and looks 3 s later at what is left of the job.
fn round_of(
    s: &Server,
    bin: &Path,
    mode: &str,
    n: usize,
    ns: u64,
    round: usize,
    base: usize,
) -> Round {
    let d = s.dir().to_path_buf();
    let t = tag(base + round);
    let _sweep = Sweep(t.clone());
    let body = format!(
        "{bin} {mode} {t} {dd} {n} {ns} $PPID &\nwhile [ ! -e {dd}/ready.{t} ]; do sleep 0.01; done\necho ready\nwait\n",
        bin = bin.display(),
        dd = d.display(),
    );
    let l = run_job(
        s,
        &format!("kill2-{mode}-{base}-{round}"),
        &t,
        &body,
        "5s",
        "1s",
    );
    std::thread::sleep(Duration::from_millis(300 + (round as u64 * 37) % 200));
    let (at, quiet, took) = kill_lockctl(l);
    let mut left = leftovers(&t, at, &[], Duration::from_secs(3));
    let escapes = left.iter().filter(|l| l.cmd.contains("escape.")).count();
    let late = left.iter().filter(|l| l.after_kill >= 20).count();
    // Shown first: what is not an escape, then the latest to start.
    left.sort_by_key(|l| (l.cmd.contains("escape."), -l.after_kill));
    let r = Round {
        round,
        count: left.len(),
        escapes,
        late,
        left: left.into_iter().take(3).collect(),
        woke: std::fs::read_to_string(d.join(format!("woke.{t}"))).ok(),
        suppressed: std::fs::read_to_string(d.join(format!("suppressed.{t}"))).ok(),
        watcher_exited: quiet,
        watcher_took: took,
    };
    eprintln!(
        "round {round}: left {} ({} escapes, {} started 200 ms or more after the kill; the first \
         shown started ticks after the kill: {:?}); woke: {:?}; suppressed: {:?}; watcher exited: \
         {quiet} after {took:?}",
        r.count,
        r.escapes,
        r.late,
        r.left.iter().map(|l| l.after_kill).collect::<Vec<_>>(),
        r.woke,
        r.suppressed,
    );
    r
}

/// Whether a round broke the promise: an escape left (started after the watcher's freeze stopped
/// its ancestor, so past the stated gap), anything left that started 200 ms or more after the
/// kill, or a watcher still there 10 s after it.
fn broke(r: &Round) -> bool {
    r.escapes > 0 || r.late > 0 || !r.watcher_exited
}

/// Whether a round broke the promise where escapes are allowed (they started before the stop of
/// a process that the freeze does not kill early): a process that is not an escape left, anything
/// left that started 200 ms or more after the kill, or a watcher still there 10 s after it.
fn broke_late(r: &Round) -> bool {
    r.late > 0 || r.left.iter().any(|l| !l.cmd.contains("escape.")) || !r.watcher_exited
}

/// Runs `rounds` rounds of the job `esc MODE TAG DIR N NS` (`job`: MODE, N, NS; see [`round_of`])
/// on a server of its own, and fails with `what` and the rounds that `broke_if` calls broken.
fn scene(
    job: (&str, usize, u64),
    rounds: usize,
    base: usize,
    broke_if: fn(&Round) -> bool,
    what: &str,
) {
    let s = Server::start();
    let bin = compile(s.dir(), "esc", &[C_PRELUDE, ESC].concat());
    let (mode, n, ns) = job;
    let broken: Vec<Round> = (0..rounds)
        .map(|round| round_of(&s, &bin, mode, n, ns, round, base))
        .filter(broke_if)
        .collect();
    assert_held(
        &broken,
        rounds,
        &format!("{what} (rounds broken, the first three left each)"),
    );
}

/// The orphaned-group chain that the early kill sets off. The job: `p` (level 0, in the job's
/// group) continues itself with a timer every 0.5 ms; `c1`, its child, leads a group of its own
/// in the job's session, `c2` is `c1`'s child in another group, `c3` `c2`'s (see [`ESC`],
/// `orphan`); each of `c1..c3` ignores SIGHUP and, once continued, starts `setsid sleep` children
/// behind middles that exit at once. The freeze stops them all; `p` is found running 2 ms after
/// its stop, stopped again, its children listed (all stopped already) and killed at once. `p` was
/// the last parent of `c1`'s group outside it in the session: at the end of `p`'s exit the kernel
/// hands `c1` to init, finds `c1`'s group orphaned with a stopped member, and sends it SIGHUP and
/// SIGCONT. `c1` runs until the freeze's next look at it (after the wait's 1 ms sleep), then is
/// killed the same way, which orphans `c2`'s group, and so on. Asserted: no escape is left, and
/// nothing that started 200 ms or more after the kill.
#[test]
fn the_early_kill_orphans_a_chain_of_groups_that_the_kernel_continues() {
    scene(
        ("orphan", 3, 500_000),
        rounds(8),
        100,
        broke,
        "processes of the job outlived lockctl: escapes started by a process the kernel \
         continued (orphaned-group SIGHUP+SIGCONT) after the watcher's early kill of its parent",
    );
}

/// The tracer killed early lets its tracee go. The job: `t` (timer every 0.5 ms, as in the scene
/// above) traces its child `b` and keeps it parked at a system-call stop (state `t`, which the
/// freeze counts as held). The freeze's SIGSTOP to `b` stays pending while `b` is parked; `t`,
/// continued by its timer, lets `b` take it, suppresses it and parks `b` again (see [`ESC`],
/// `tracer`). `t` is then found running and killed at once: the kernel detaches `b` and resumes it
/// (a tracee in a ptrace stop, not a group stop, is restarted when its tracer exits), with no stop
/// pending. `b` runs until the freeze's next look at it. Asserted: no escape is left, and nothing
/// that started 200 ms or more after the kill.
#[test]
fn the_early_kill_of_a_tracer_lets_its_tracee_run() {
    scene(
        ("tracer", 1, 500_000),
        rounds(8),
        200,
        broke,
        "processes of the job outlived lockctl: escapes started by a tracee that the watcher's \
         early kill of its tracer let go",
    );
}

/// A self-continuing process forking as fast as it can once lockctl is gone: `f` (timer every 0.5
/// ms) waits until lockctl is a zombie or gone, then forks 100 children that each call `setsid`
/// and become `sleep 300` named `escape.TAG` (see [`ESC`], `forker`). The freeze stops `f`, its
/// timer continues it, and it forks; 2 ms after its stop it is stopped again, its children are
/// listed (each of them read as well) and stopped, and it is killed. A stop sent while `f` is
/// inside `fork` lets that fork finish (only a fatal signal cancels one): the child may be linked
/// to `f` only after the watcher has read `f`'s list; it then goes to init when `f` dies, in a
/// session of its own. The stated limit ("what it starts in the instant between that look and
/// its death", `docs/guarantees.md`), measured here. Asserted: no escape is left.
#[test]
fn a_restless_forker_s_fork_in_flight() {
    scene(
        ("forker", 100, 500_000),
        rounds(8),
        300,
        broke,
        "processes of the job outlived lockctl: children forked by a restless process around the \
         watcher's look at its children",
    );
}

/// Liveness with many restless processes: 40 self-continuing processes, each with a chain of two
/// levels in groups of their own that ignore SIGHUP (see [`ESC`], `swarm`): 121 processes of the
/// job, 40 of which the freeze must kill early, each kill continuing (orphaned-group rule) the
/// next level, which must be killed early in turn. Measured: how long after lockctl's SIGKILL
/// the watcher exits and the last process of the job is gone. Asserted: the watcher is gone
/// within 10 s, nothing of the job is left 3 s after the kill, and the job is gone within 2 s.
#[test]
fn a_swarm_of_restless_chains_ends_promptly() {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let bin = compile(&d, "esc", &[C_PRELUDE, ESC].concat());
    let n = rounds(3);
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(400 + round);
        let _sweep = Sweep(t.clone());
        let body = format!(
            "{bin} swarm {t} {dd} 40 500000 &\nwhile [ ! -e {dd}/ready.{t} ]; do sleep 0.01; done\necho ready\nwait\n",
            bin = bin.display(),
            dd = d.display(),
        );
        let l = run_job(&s, &format!("kill2-swarm-{round}"), &t, &body, "5s", "1s");
        std::thread::sleep(Duration::from_millis(400));
        let before = tagged_but(&t, &[]).len();
        let t0 = Instant::now();
        let (at, quiet, took) = kill_lockctl(l);
        let gone = eventually(Duration::from_secs(3), || tagged_but(&t, &[]).is_empty());
        let last = t0.elapsed();
        let left = leftovers(&t, at, &[], Duration::from_millis(10));
        eprintln!(
            "round {round}: {before} processes of the job before the kill; watcher gone after \
             {took:?} ({quiet}); the job gone after {last:?} ({gone}); left {}",
            left.len()
        );
        if !quiet || !gone || last > Duration::from_secs(2) {
            broken.push((
                round,
                before,
                took,
                last,
                left.into_iter().take(3).collect::<Vec<_>>(),
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "the job outlived lockctl's SIGKILL by more than 2 s, or its watcher 10 s (round, processes \
         before, watcher's exit, the job's end, the first three left): {broken:#?}"
    );
}

/// The deadline path with both scenes above: lockctl is SIGSTOPped past its lease (TTL 1 s,
/// `--kill-after` 1 s), its watcher kills the job while lockctl is alive (stopped): the early
/// kill of the chain's self-continuing process hands its child to lockctl, a subreaper in the
/// same session, so no group becomes orphaned; the tracee let go by its tracer's early kill
/// starts escapes whose middles exit, and those go to lockctl too, where the kill rounds find
/// them. Asserted: 3.5 s after the stop, with lockctl still stopped, nothing of the job runs;
/// once lockctl is continued it exits 76 and nothing is left.
#[test]
fn the_deadline_path_with_an_orphan_chain_and_a_tracer() {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let bin = compile(&d, "esc", &[C_PRELUDE, ESC].concat());
    let n = rounds(2);
    let mut broken = Vec::new();
    for (i, mode) in ["orphan", "tracer"].iter().enumerate() {
        for round in 0..n {
            let t = tag(500 + i * 50 + round);
            let _sweep = Sweep(t.clone());
            let body = format!(
                "{bin} {mode} {t} {dd} 3 500000 $PPID &\nwhile [ ! -e {dd}/ready.{t} ]; do sleep 0.01; done\necho ready\nwait\n",
                bin = bin.display(),
                dd = d.display(),
            );
            let mut l = run_job(
                &s,
                &format!("kill2-dl-{mode}-{round}"),
                &t,
                &body,
                "1s",
                "1s",
            );
            let lockctl = l.pid();
            std::thread::sleep(Duration::from_millis(100 + (round as u64 * 61) % 200));
            let at = ticks_now();
            kill(lockctl, libc::SIGSTOP);
            std::thread::sleep(Duration::from_millis(3500));
            let during = leftovers(&t, at, &[lockctl], Duration::from_millis(10));
            kill(lockctl, libc::SIGCONT);
            let out = wait_output(l.0.take().unwrap(), Duration::from_secs(30));
            std::thread::sleep(Duration::from_millis(300));
            let after = tagged_but(&t, &[]);
            let woke = std::fs::read_to_string(d.join(format!("woke.{t}"))).ok();
            eprintln!(
                "{mode} round {round}: while lockctl was stopped, left {}; woke: {woke:?}; lockctl \
                 exited {}; left after: {after:?}",
                during.len(),
                code(&out)
            );
            if !during.is_empty() || !after.is_empty() || code(&out) != 76 {
                broken.push((
                    mode,
                    round,
                    code(&out),
                    during.into_iter().take(3).collect::<Vec<_>>(),
                    after,
                ));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "the job ran on past its lease while lockctl was stopped, or after (mode, round, \
         lockctl's exit, the first three left while stopped, left after): {broken:#?}"
    );
}

/// A process whose main thread has exited: `z` (timer every 0.5 ms, as above) starts a thread and
/// ends its main thread with `pthread_exit`; the leader stays a zombie until the whole process
/// exits, and `/proc/PID/stat` (the leader's) says `Z` while the other thread runs. Once lockctl
/// is gone, that thread starts `setsid sleep` children behind middles that exit at once, one
/// every 3 ms, without waiting for the middles (see [`ESC`], `zleader`). The freeze stops `z` (a
/// stop by PID stops every thread) and `z`'s timer continues it; the freeze's wait asks `hold`,
/// which reads the leader's state, takes `Z` for "gone for good" and never looks at `z` again:
/// `z` is not killed early, and runs through the rest of the freeze, which then lasts 0.4 to 0.6 s
/// (0.03 to 0.1 s in the control below; the middles `z` keeps starting are new to every walk,
/// which is likely what keeps the rounds going); its escapes go to init. It dies with the
/// final kill by PID. Asserted: nothing that started 200 ms or more after the kill is left, and
/// nothing but escapes.
#[test]
fn a_process_whose_main_thread_exited_is_taken_for_gone() {
    scene(
        ("zleader", 200, 500_000),
        rounds(6),
        600,
        broke_late,
        "processes of the job started 200 ms or more after lockctl's SIGKILL outlived it: escapes \
         of a process whose leader thread is a zombie (state Z) while its other thread runs",
    );
}

/// The control of the scene above: the same process with its main thread alive (see [`ESC`],
/// `threaded`): the freeze finds it running 2 ms after its stop and kills it at once. Asserted as
/// above.
#[test]
fn a_threaded_process_with_its_main_thread_alive_is_killed_early() {
    scene(
        ("threaded", 200, 500_000),
        rounds(6),
        650,
        broke_late,
        "processes of the job started 200 ms or more after lockctl's SIGKILL outlived it",
    );
}

/// Processes of the test's own, killed and reaped when dropped.
struct Idle(Vec<Child>);

impl Drop for Idle {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Bystanders beside the early kills: 20 `sleep 300` of the test's own in lockctl's session,
/// started after lockctl (so its start time does not tell them from the job), each leading a group
/// of its own; the test stops every other one (state `T`), so each of their groups has a stopped
/// member, the condition of the orphaned-group SIGHUP and SIGCONT. The jobs are those of the
/// orphan-chain and tracer scenes, whose processes the freeze kills early. Asserted: every running
/// bystander still runs (`S`), every stopped one is still stopped (`T`), none ended.
#[test]
fn bystanders_in_lockctl_s_session_are_spared_by_the_early_kills() {
    use std::os::unix::process::CommandExt;
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let bin = compile(&d, "esc", &[C_PRELUDE, ESC].concat());
    let n = rounds(2);
    let mut harmed = Vec::new();
    for (i, mode) in ["orphan", "tracer"].iter().enumerate() {
        for round in 0..n {
            let t = tag(700 + i * 50 + round);
            let _sweep = Sweep(t.clone());
            let body = format!(
                "{bin} {mode} {t} {dd} 3 500000 $PPID &\nwhile [ ! -e {dd}/ready.{t} ]; do sleep 0.01; done\necho ready\nwait\n",
                bin = bin.display(),
                dd = d.display(),
            );
            let l = run_job(
                &s,
                &format!("kill2-by-{mode}-{round}"),
                &t,
                &body,
                "5s",
                "1s",
            );
            let mut idle = Idle(
                (0..20)
                    .map(|_| {
                        std::process::Command::new("sleep")
                            .arg0(format!("bystander.{t}"))
                            .arg("300")
                            .process_group(0)
                            .stdin(Stdio::null())
                            .spawn()
                            .unwrap()
                    })
                    .collect(),
            );
            for c in idle.0.iter().step_by(2) {
                kill(c.id() as i32, libc::SIGSTOP);
            }
            std::thread::sleep(Duration::from_millis(300 + (round as u64 * 37) % 200));
            let (_, quiet, took) = kill_lockctl(l);
            std::thread::sleep(Duration::from_millis(500));
            let bad: Vec<(u32, bool, Option<char>)> = idle
                .0
                .iter_mut()
                .enumerate()
                .filter_map(|(k, c)| {
                    let st = state(c.id() as i32);
                    let want = if k % 2 == 0 { 'T' } else { 'S' };
                    let ended = c.try_wait().ok().flatten().is_some();
                    (ended || st != Some(want)).then_some((c.id(), k % 2 == 0, st))
                })
                .collect();
            eprintln!(
                "{mode} round {round}: bystanders harmed (pid, stopped by the test, state now): \
                 {bad:?}; watcher exited: {quiet} after {took:?}"
            );
            if !bad.is_empty() {
                harmed.push((mode, round, bad));
            }
        }
    }
    assert!(
        harmed.is_empty(),
        "bystanders (the test's own `sleep 300`, in lockctl's session, each leading a group of its \
         own) stopped, continued or killed (mode, round, [(pid, stopped by the test, state now)]): \
         {harmed:?}"
    );
}

/// The chain scene with no timer: four chains whose first process is a plain busy loop, each with
/// a child in a group of its own that ignores SIGHUP and escapes once continued (see [`ESC`],
/// `busy`). Four busy processes on two cores: a busy process waiting for a CPU when the freeze's
/// stop comes does not take it within 2 ms, is killed early, and its child's group is orphaned
/// with a stopped member. Asserted as in the chain scene: no escape is left, and nothing that
/// started 200 ms or more after the kill. Held here: the busy processes took their stops within
/// 2 ms, and no child was continued.
#[test]
fn the_early_kill_of_a_busy_process_waiting_for_a_cpu_orphans_its_child_s_group() {
    scene(
        ("busy", 4, 0),
        rounds(4),
        800,
        broke,
        "processes of the job outlived lockctl: escapes started by a process the kernel \
         continued (orphaned-group SIGHUP+SIGCONT) after the watcher's early kill of its busy \
         parent",
    );
}
