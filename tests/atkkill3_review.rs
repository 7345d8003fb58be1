//! An adversarial review of 2d7da9e (`Walker::signal`, `Freeze`, `deepest_first`,
//! `hold`/`threads_hold` in `src/exec/procs.rs`): the freeze's walk on a thread of its own, the
//! early kill in one pass ordered children before parents, the final kill by PID in the same
//! order. Attacked on real processes, a real `redis-server` and the real `lockctl`, against both
//! promises: nothing of the job outlives a SIGKILLed lockctl, and nothing that is not the job's
//! is stopped or killed.
//!
//! Every scene's job runs `esc3` (the C program [`ESC3`], compiled with `cc`); every process it
//! starts carries the scene's tag in its command line; escapes are `sleep 300` named
//! `escape.TAG`, each in a session of its own.
//!
//! Scenes (see each test's doc; counts from runs of the scene alone and of the whole file with
//! one test thread, on a 2-core machine shared with another test suite; the file takes about 40 s):
//!
//! - `a_deep_member_s_death_orphans_a_shallow_member_s_group` (fails, ignored: a stated limit):
//!   `deepest_first` orders by
//!   the parent chain, but the kernel's orphaned-group rule is about every member's parent: the
//!   group `G`'s only link outside it is a deep member `y` (its parent `w` in another group), while
//!   a shallow member `b` (its parent init once lockctl is gone) is stopped. The final kill's first
//!   SIGKILL goes to `y`; `y`'s exit orphans `G` and the kernel sends it SIGHUP and SIGCONT; `b`
//!   (ignoring SIGHUP) runs until its own SIGKILL, after every process of depth 1, and its `setsid`
//!   children go to init. With 200 escapes and 150 fillers, 4 of 6, 6 of 6 and 5 of 6 rounds left 5
//!   to 200 escapes each; as committed (60 escapes, 120 fillers, to keep under 200 extra
//!   processes), 5 of 6 (60 each). They started 40 to 130 ms after lockctl's SIGKILL (one round 320
//!   ms), with `y` a zombie (`Z`) whenever `b` woke: after the watcher's SIGKILL to `y`, so after
//!   the freeze had stopped `b`. With no fillers at depth 1 (`ATKKILL3_FILLERS=0`): 1 of 6. No
//!   order of a one-by-one kill holds here: `y`'s exit orphans `G` (stopped `b`), `w`'s exit does
//!   too (`y` handed to init), and `b`'s exit orphans `w`'s group (`w` stopped; `b` is its link).
//!   With the kills in one tight pass after all the start times are read (`kill_at_once`), still
//!   5 of 6: the processes killed before `b` run their exits beside the watcher. Killing whole
//!   groups first (`killpg`) would narrow it; the answer is the cgroup v2 freezer and
//!   `cgroup.kill` (`docs/guarantees.md`).
//! - `without_the_deep_link_the_shallow_member_stays_stopped` (held, 0 of 3): its control, `y` in
//!   `w`'s group.
//! - `a_bystander_at_a_dead_held_process_s_pid_keeps_its_children` (failed 4 of 4 and 4 of 4;
//!   passes since the fix: a gone entry is skipped, and a list counts only when the start time
//!   matches before and after it is read):
//!   `Freeze::tend` reads the kernel's lists of children of every process in `Freeze::stopped` by
//!   PID, the ones gone since too, with no start-time check: a bystander `bp` that took the PID of
//!   a held process `d` that died during the freeze (`d` killed by the outsider, `bp` aimed with
//!   `ns_last_pid`, running 0.5 to 90 ms after `d` was seen stopped, hundreds of ms after `d`
//!   started: not the stated "same clock tick" limit) has its child `bc` stopped (SIGSTOP) and
//!   killed (SIGKILL) once any held process is found running (here `r`, continued by the outsider).
//! - `a_job_that_keeps_continuing_itself_ends` (held, 0 of 3 twice): 60 self-continuing forkers;
//!   the watcher exited 72 to 275 ms after the kill, nothing left.
//! - `a_tracee_outside_the_job_is_neither_stopped_nor_killed` (held, 0 of 3 twice): a job process
//!   that `PTRACE_SEIZE`s a bystander; the tracer saw no signal for it, it kept running.
//! - `the_deadline_path_with_a_deep_link` (held, 0 of 2 twice): the first scene's job, lockctl
//!   SIGSTOPped past its lease: lockctl alive, the subreaper and the link of `b`'s group; nothing
//!   left, exit 76.
//!
//! `ATKKILL3_ROUNDS` multiplies every scene's rounds.

mod support;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::tagged::*;
use support::watchers::{state, ticks_now, watchers_of};
use support::*;

fn rounds(default: usize) -> usize {
    support::watchers::rounds_times("ATKKILL3_ROUNDS", default)
}

/// A tag unique to this test process and `n`: it names the processes a scene started, and only
/// those (it appears in their command lines).
fn tag(n: usize) -> String {
    support::watchers::process_tag(n, 8)
}

/// The job's program, after [`C_PRELUDE`]. `esc3 MODE TAG DIR N`. SIGTERM is ignored throughout.
///
/// - `deeplink`: the first process `p` (in the job's group) forks `a`, which leads a group `G` of
///   its own and forks `b` (in `G`); `b` forks N fillers (in `G`, pausing) and `w`, which leads a
///   group `H` of its own and forks `y`, which joins `G`. `a` exits once `y` has joined: `b` goes
///   to lockctl (the subreaper), and to init with lockctl's death. Then `G`'s only member with a
///   parent in another group of the session is `y` (parent `w`, in `H`). Every process of `G`
///   ignores SIGHUP; `b`, once continued (a SIGCONT handler), forks 60 `setsid sleep`s named
///   `escape.TAG` as fast as it can, writing `woke.TAG` after the first (and before them
///   `ystate.TAG`: `y`'s state letter as a number when `b` woke, `-` (45) if gone; `y` wrote its
///   PID to `y.TAG`). `nolink`: the same, but `y` stays in `H`: `G` has no link once lockctl is
///   gone.
/// - `restless`: N processes, each continuing itself with a POSIX timer every 0.2 ms and forking
///   a child that lives 1 ms every 2 ms.
/// - `reuse`: the first process `r` forks N idle fillers and `d`, behind a middle that exits, in a
///   group of its own; `d` writes its PID to `d.TAG`, then `r` its own to `ready.TAG`. `aim`
///   (outside the job, `esc3 aim TAG DIR LOCKCTL`): once lockctl is gone and `d` stopped, kills
///   `d`, has `bp` take `d`'s PID (`ns_last_pid`), `bp` forks `bc` and logs what becomes of it to
///   `bc.TAG`; then sends `r` SIGCONT every 0.5 ms for 0.3 s. Steps in `aim.TAG` (1: `d` seen
///   stopped, 2: `bp` has `d`'s PID and `bc` runs, 3: done; 10 to 12: gave up).
/// - `seize`: the first process `PTRACE_SEIZE`s the process N (not the job's) and lets it run:
///   every signal it reports is delivered on (a stop is kept, `PTRACE_LISTEN`), and logged to
///   `sig.TAG` (the signal and the ptrace event, one a line).
const ESC3: &str = r#"
static void idle(void) {
    signal(SIGHUP, SIG_IGN);
    for (;;)
        pause();
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    char *mode = argv[1];
    tag = argv[2];
    dir = argv[3];
    int n = atoi(argv[4]);
    snprintf(escarg, sizeof escarg, "escape.%s", tag);
    signal(SIGTERM, SIG_IGN);
    int join = strcmp(mode, "deeplink") == 0;
    if (join || strcmp(mode, "nolink") == 0) {
        pid_t a = fork();
        if (a == 0) {
            setpgid(0, 0);
            pid_t g = getpid();
            int joined[2];
            if (pipe(joined) < 0) _exit(1);
            pid_t b = fork();
            if (b == 0) {
                close(joined[0]);
                signal(SIGHUP, SIG_IGN);
                struct sigaction sa;
                memset(&sa, 0, sizeof sa);
                sa.sa_handler = on_cont;
                sigaction(SIGCONT, &sa, 0);
                for (int i = 0; i < n; i++)
                    if (fork() == 0)
                        idle();
                if (fork() == 0) {
                    setpgid(0, 0);
                    if (fork() == 0) {
                        if (join)
                            setpgid(0, g);
                        mark("y", 0);
                        if (write(joined[1], "y", 1) < 0) {}
                        idle();
                    }
                    idle();
                }
                close(joined[1]);
                while (getppid() == a)
                    usleep(1000);
                usleep(50000);
                mark("ready", n);
                while (!woke)
                    pause();
                /* What `y` was when `b` woke: its state letter, '-' if gone (`ystate.TAG`). */
                char ypath[512], ybuf[512];
                long ystate = '-';
                snprintf(ypath, sizeof ypath, "%s/y.%s", dir, tag);
                int yfd = open(ypath, O_RDONLY);
                if (yfd >= 0) {
                    ssize_t k = read(yfd, ybuf, sizeof ybuf - 1);
                    close(yfd);
                    if (k > 0) {
                        ybuf[k] = 0;
                        snprintf(ypath, sizeof ypath, "/proc/%d/stat", atoi(ybuf));
                        yfd = open(ypath, O_RDONLY);
                        if (yfd >= 0) {
                            k = read(yfd, ybuf, sizeof ybuf - 1);
                            close(yfd);
                            if (k > 0) {
                                ybuf[k] = 0;
                                char *e = strrchr(ybuf, ')');
                                if (e) ystate = e[2];
                            }
                        }
                    }
                }
                mark("ystate", ystate);
                for (int i = 0; i < 60; i++) {
                    if (fork() == 0) {
                        setsid();
                        execlp("sleep", escarg, "300", (char *)0);
                        _exit(1);
                    }
                    if (i == 0)
                        mark("woke", 0);
                }
                for (;;)
                    pause();
            }
            close(joined[1]);
            char c;
            if (read(joined[0], &c, 1) < 0) {}
            _exit(0);
        }
        waitpid(a, 0, 0);
        for (;;)
            pause();
    }
    if (strcmp(mode, "restless") == 0) {
        /* N processes (children of the first), each continuing itself with a POSIX timer every
         * 0.2 ms and forking a child every 2 ms that lives 1 ms (reaped). */
        for (int i = 0; i < n; i++) {
            if (fork() == 0) {
                struct sigaction sa;
                memset(&sa, 0, sizeof sa);
                sa.sa_handler = on_cont;
                sigaction(SIGCONT, &sa, 0);
                timer_t tm;
                struct sigevent ev;
                memset(&ev, 0, sizeof ev);
                ev.sigev_notify = SIGEV_SIGNAL;
                ev.sigev_signo = SIGCONT;
                timer_create(CLOCK_MONOTONIC, &ev, &tm);
                struct itimerspec its = {{0, 200000}, {0, 200000}};
                timer_settime(tm, 0, &its, 0);
                for (;;) {
                    pid_t c = fork();
                    if (c == 0) { usleep(1000); _exit(0); }
                    while (c > 0 && waitpid(c, 0, 0) < 0 && errno == EINTR)
                        ;
                    usleep(2000);
                }
            }
        }
        usleep(300000);
        mark("ready", n);
        idle();
    }
    if (strcmp(mode, "reuse") == 0) {
        /* The first process `r` (in the job's group) forks N idle fillers and a middle that forks
         * `d` and exits: `d` leads a group of its own, its parent lockctl, then init. `d` writes
         * its PID to `d.TAG`, `r` its own to `ready.TAG`. */
        for (int i = 0; i < n; i++)
            if (fork() == 0)
                idle();
        pid_t m = fork();
        if (m == 0) {
            if (fork() == 0) {
                setpgid(0, 0);
                mark("d", 0);
                idle();
            }
            _exit(0);
        }
        waitpid(m, 0, 0);
        char path[512];
        snprintf(path, sizeof path, "%s/d.%s", dir, tag);
        while (access(path, F_OK) != 0)
            usleep(1000);
        mark("ready", n);
        idle();
    }
    if (strcmp(mode, "aim") == 0) {
        /* Outside the job: `esc3 aim TAG DIR LOCKCTL`. Once lockctl is gone and `d` is stopped
         * (by the freeze), kills `d`, waits until it is reaped, has the next PID be `d`'s
         * (`ns_last_pid`) and forks `bp` there; `bp` forks `bc` and logs what becomes of it to
         * `bc.TAG`. Then sends `r` SIGCONT every 0.5 ms for 0.3 s. Logs its steps to `aim.TAG`. */
        char path[512], buf[512];
        pid_t d = 0, r = 0;
        snprintf(path, sizeof path, "%s/d.%s", dir, tag);
        FILE *f = fopen(path, "r");
        if (!f || fscanf(f, "%d", &d) != 1) return 3;
        fclose(f);
        snprintf(path, sizeof path, "%s/ready.%s", dir, tag);
        f = fopen(path, "r");
        if (!f || fscanf(f, "%d", &r) != 1) return 3;
        fclose(f);
        char lstat[64], dstat[64];
        snprintf(lstat, sizeof lstat, "/proc/%d/stat", n);
        snprintf(dstat, sizeof dstat, "/proc/%d/stat", d);
        int ok = 0;
        for (long i = 0; i < 400000; i++) {
            int fd = open(dstat, O_RDONLY);
            if (fd < 0) break;
            ssize_t k = read(fd, buf, sizeof buf - 1);
            close(fd);
            if (k <= 0) break;
            buf[k] = 0;
            char *e = strrchr(buf, ')');
            if (e && e[2] == 'T' && access(lstat, F_OK) != 0) { ok = 1; break; }
            usleep(50);
        }
        mark("aim", ok ? 1 : 10);
        if (!ok) return 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        kill(d, SIGKILL);
        for (int i = 0; i < 20000 && access(dstat, F_OK) == 0; i++)
            usleep(50);
        int bc[2];
        if (pipe(bc) < 0) return 3;
        pid_t bp = -1;
        for (int tries = 0; tries < 50; tries++) {
            int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY);
            if (fd < 0) { mark("aim", 11); return 0; }
            char num[32];
            int len = snprintf(num, sizeof num, "%d", d - 1);
            if (write(fd, num, len) < 0) {}
            close(fd);
            bp = fork();
            if (bp == 0) {
                if (getpid() != d) _exit(3);
                pid_t c = fork();
                if (c == 0) {
                    for (;;)
                        pause();
                }
                if (write(bc[1], "x", 1) < 0) {}
                for (;;) {
                    int st;
                    if (waitpid(c, &st, WUNTRACED | WCONTINUED) < 0) _exit(0);
                    char what[64];
                    if (WIFSTOPPED(st)) snprintf(what, sizeof what, "stopped %d", WSTOPSIG(st));
                    else if (WIFSIGNALED(st)) snprintf(what, sizeof what, "killed %d", WTERMSIG(st));
                    else if (WIFCONTINUED(st)) snprintf(what, sizeof what, "continued");
                    else snprintf(what, sizeof what, "exited");
                    char lp[512];
                    snprintf(lp, sizeof lp, "%s/bc.%s", dir, tag);
                    int lf = open(lp, O_WRONLY | O_CREAT | O_APPEND, 0644);
                    if (lf >= 0) {
                        char line[96];
                        int ll = snprintf(line, sizeof line, "%d %s\n", c, what);
                        if (write(lf, line, ll) < 0) {}
                        close(lf);
                    }
                    if (WIFSIGNALED(st) || WIFEXITED(st)) _exit(0);
                }
            }
            if (bp == d) break;
            waitpid(bp, 0, 0);
            bp = -1;
        }
        if (bp != d) { mark("aim", 12); return 0; }
        char x;
        if (read(bc[0], &x, 1) < 0) {}
        clock_gettime(CLOCK_MONOTONIC, &t1);
        /* How long, in microseconds, from `d` seen stopped to `bc` running; `r`'s state then. */
        mark("took", (t1.tv_sec - t0.tv_sec) * 1000000 + (t1.tv_nsec - t0.tv_nsec) / 1000);
        snprintf(path, sizeof path, "/proc/%d/stat", r);
        f = fopen(path, "r");
        char rst = '-';
        if (f) {
            if (fgets(buf, sizeof buf, f)) { char *e = strrchr(buf, ')'); if (e) rst = e[2]; }
            fclose(f);
        }
        mark("rstate", rst);
        mark("aim", 2);
        for (int i = 0; i < 600; i++) {
            kill(r, SIGCONT);
            usleep(500);
        }
        mark("aim", 3);
        return 0;
    }
    if (strcmp(mode, "seize") == 0) {
        pid_t t = n;
        if (ptrace(PTRACE_SEIZE, t, 0, 0) != 0) {
            mark("seizefailed", errno);
            for (;;)
                pause();
        }
        mark("ready", t);
        for (;;) {
            int st;
            if (waitpid(t, &st, __WALL) < 0) {
                if (errno == EINTR) continue;
                for (;;)
                    pause();
            }
            if (WIFSTOPPED(st)) {
                int sig = WSTOPSIG(st);
                char path[512], line[32];
                snprintf(path, sizeof path, "%s/sig.%s", dir, tag);
                int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
                int len = snprintf(line, sizeof line, "%d %d\n", sig, st >> 16);
                if (fd >= 0) { if (write(fd, line, len) < 0) {} close(fd); }
                if ((st >> 16) == PTRACE_EVENT_STOP)
                    ptrace(PTRACE_LISTEN, t, 0, 0);
                else
                    ptrace(PTRACE_CONT, t, 0, sig == SIGTRAP ? 0 : sig);
            }
        }
    }
    return 2;
}
"#;

/// Starts `lockctl exec NAME --ttl TTL --kill-after KA -- sh -c` running `esc3 MODE TAG DIR N` in
/// the background, once `ready.TAG` is there.
fn start_job(s: &Server, bin: &Path, mode: &str, t: &str, n: i64, ttl: &str, ka: &str) -> Lockctl {
    let d = s.dir();
    let body = format!(
        "{bin} {mode} {t} {dd} {n} &\nwhile [ ! -e {dd}/ready.{t} ]; do sleep 0.01; done\necho ready\nwait\n",
        bin = bin.display(),
        dd = d.display(),
    );
    run_job(s, &format!("kill3-{mode}-{t}"), t, &body, ttl, ka)
}

/// One round's outcome.
#[derive(Debug)]
#[allow(dead_code)]
struct Round {
    round: usize,
    /// What of the job was left 3 s after lockctl's SIGKILL (the first three).
    left: Vec<Left>,
    count: usize,
    escapes: usize,
    late: usize,
    woke: Option<String>,
    /// `y`'s state when `b` woke (`-`: gone).
    y_when_woke: Option<char>,
    watcher_exited: bool,
    watcher_took: Duration,
}

/// The group whose only link outside it is deep. The job (see [`ESC3`], `deeplink`): `b` in a
/// group `G` whose leader `a` has exited, `b`'s parent init once lockctl is gone; N fillers, `b`'s
/// children, in `G`; `w`, `b`'s child, leading a group `H`; `y`, `w`'s child, in `G`. Depths, by
/// the parents the freeze records: `b` 0, the fillers and `w` 1, `y` 2. All ignore SIGHUP.
///
/// lockctl is SIGKILLed. `b`'s parent becomes init (another session); `y` keeps `G` from being
/// orphaned. The freeze stops everything and holds (no process continues itself); its final
/// kill by PID goes deepest first: `y` first. `y`'s exit leaves `G` with no member whose parent
/// is in another group of the session, with stopped members: the kernel sends `G` SIGHUP and
/// SIGCONT (`kill_orphaned_pgrp` at `y`'s exit). `b` (ignoring SIGHUP) runs until its SIGKILL,
/// which comes after every process of depth 1 (`w` and the N fillers), and forks `setsid sleep`s.
/// Those go to init in sessions of their own; the kill rounds after do not find them.
///
/// Asserted: no escape is left, nothing that started 200 ms or more after the kill, the
/// watchers exit within 10 s.
#[test]
#[ignore = "open, a stated limit: a group whose only link outside it is a deep member, orphaned \
            by that member's SIGKILL before a stopped shallow member's, is continued by the \
            kernel (4 of 6, 6 of 6, 5 of 6, 5 of 6 rounds; 5 of 6 with the one-pass kill); \
            the answer is the cgroup v2 freezer and cgroup.kill"]
fn a_deep_member_s_death_orphans_a_shallow_member_s_group() {
    let n = rounds(6);
    let broken = deep_rounds("deeplink", n, 100);
    eprintln!("{} of {n} rounds left processes of the job", broken.len());
    assert!(
        broken.is_empty(),
        "processes of the job outlived lockctl: escapes started by a shallow member of a group \
         that the final kill's first SIGKILL (to a deep member, the group's only link outside it) \
         left orphaned, which the kernel continued (rounds broken, the first three left each): \
         {broken:#?}"
    );
}

/// The control of the scene above (held): the same job, but `y` stays in `w`'s group `H` (see
/// [`ESC3`], `nolink`): `G` has no link outside it once lockctl is gone, before anything is
/// stopped, and no later exit orphans it. Asserted as above.
#[test]
fn without_the_deep_link_the_shallow_member_stays_stopped() {
    let n = rounds(3);
    let broken = deep_rounds("nolink", n, 150);
    assert_held(
        &broken,
        n,
        "processes of the job outlived lockctl (rounds broken)",
    );
}

/// The fillers of `deeplink` and `nolink`: 120, or `ATKKILL3_FILLERS`.
fn fillers() -> i64 {
    std::env::var("ATKKILL3_FILLERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(120)
}

/// `n` rounds of `esc3 MODE` ([`fillers`] fillers) under a `lockctl exec` SIGKILLed 200 to 400 ms
/// after the job is ready; the rounds that left an escape (started after `b` woke past `y`'s
/// death), anything started 200 ms or more after the kill, or a watcher 10 s after it.
fn deep_rounds(mode: &str, n: usize, base: usize) -> Vec<Round> {
    let s = Server::start();
    let bin = compile(s.dir(), "esc3", &[C_PRELUDE, ESC3].concat());
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(base + round);
        let _sweep = Sweep(t.clone());
        let l = start_job(&s, &bin, mode, &t, fillers(), "5s", "1s");
        std::thread::sleep(Duration::from_millis(200 + (round as u64 * 37) % 200));
        let (at, quiet, took) = kill_lockctl(l);
        let mut left = leftovers(&t, at, &[], Duration::from_secs(3));
        let escapes = left.iter().filter(|l| l.cmd.contains("escape.")).count();
        let late = left.iter().filter(|l| l.after_kill >= 20).count();
        left.sort_by_key(|l| (l.cmd.contains("escape."), -l.after_kill));
        let read = |what: &str| std::fs::read_to_string(s.dir().join(format!("{what}.{t}"))).ok();
        let r = Round {
            round,
            count: left.len(),
            escapes,
            late,
            left: left.into_iter().take(3).collect(),
            woke: read("woke"),
            y_when_woke: read("ystate").and_then(|l| {
                let n: u8 = l.split_whitespace().nth(1)?.parse().ok()?;
                Some(n as char)
            }),
            watcher_exited: quiet,
            watcher_took: took,
        };
        eprintln!(
            "round {round}: left {} ({} escapes, {} started 200 ms or more after the kill; ticks \
             after the kill of the first shown: {:?}); woke: {:?}; y when b woke: {:?}; watcher \
             exited: {quiet} after {took:?}",
            r.count,
            r.escapes,
            r.late,
            r.left.iter().map(|l| l.after_kill).collect::<Vec<_>>(),
            r.woke,
            r.y_when_woke,
        );
        // An escape counts when `b` woke after `y` had died (`Z` or gone): `y` is killed by the
        // watcher alone, after the freeze stopped `b`, so past the stated gap of the first walk.
        let after_y = matches!(r.y_when_woke, Some('Z') | Some('X') | Some('-'));
        if (r.escapes > 0 && after_y) || r.late > 0 || !r.watcher_exited {
            broken.push(r);
        }
    }
    broken
}

/// Liveness: a job whose processes keep continuing themselves (see [`ESC3`], `restless`: 60
/// processes, a SIGCONT timer every 0.2 ms each, each forking short-lived children). Asserted: the
/// watchers exit within 10 s of lockctl's SIGKILL, nothing of the job is left 3 s after it, and
/// (printed) how long the watcher took.
#[test]
fn a_job_that_keeps_continuing_itself_ends() {
    let s = Server::start();
    let bin = compile(s.dir(), "esc3", &[C_PRELUDE, ESC3].concat());
    let n = rounds(3);
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(500 + round);
        let _sweep = Sweep(t.clone());
        let l = start_job(&s, &bin, "restless", &t, 60, "5s", "1s");
        std::thread::sleep(Duration::from_millis(200 + (round as u64 * 37) % 200));
        let (at, quiet, took) = kill_lockctl(l);
        let left = leftovers(&t, at, &[], Duration::from_secs(3));
        eprintln!(
            "round {round}: watcher exited {quiet} after {took:?}; left {} (the first three: {:?})",
            left.len(),
            left.iter().take(3).collect::<Vec<_>>()
        );
        if !quiet || !left.is_empty() {
            broken.push((
                round,
                quiet,
                took,
                left.into_iter().take(3).collect::<Vec<_>>(),
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "a self-continuing job outlived lockctl, or its watcher did not end (round, watcher \
         exited, after, the first three left): {broken:#?}"
    );
}

/// A process that is not the job's, traced by one that is. The test starts `sleep 300` (named
/// `bystander.TAG`, outside lockctl); the job's first process `PTRACE_SEIZE`s it and passes on
/// every signal it reports, logging each (see [`ESC3`], `seize`). A tracee is not in its tracer's
/// lists of children (`/proc/PID/task/TID/children` lists real children) and its `stat` names its
/// real parent, so the freeze must not reach it. lockctl is SIGKILLed; the watcher's freeze and
/// kill kill the tracer, which detaches the bystander.
///
/// Asserted: the bystander lives, is not stopped, and the tracer saw no SIGSTOP or SIGKILL-bound
/// signal for it.
#[test]
fn a_tracee_outside_the_job_is_neither_stopped_nor_killed() {
    let s = Server::start();
    let bin = compile(s.dir(), "esc3", &[C_PRELUDE, ESC3].concat());
    let n = rounds(3);
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(200 + round);
        let _sweep = Sweep(t.clone());
        let mut by = std::process::Command::new("sleep")
            .arg0(format!("bystander.{t}"))
            .arg("300")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let bpid = by.id() as i32;
        let l = start_job(&s, &bin, "seize", &t, bpid as i64, "5s", "1s");
        let seized = std::fs::read_to_string(s.dir().join(format!("ready.{t}"))).is_ok();
        std::thread::sleep(Duration::from_millis(300));
        let (_, quiet, took) = kill_lockctl(l);
        std::thread::sleep(Duration::from_millis(300));
        let st = state(bpid);
        let sigs = std::fs::read_to_string(s.dir().join(format!("sig.{t}"))).unwrap_or_default();
        let job_left = tagged_but(&t, &[bpid]);
        eprintln!(
            "round {round}: seized {seized}; bystander state {st:?}; signals the tracer saw: \
             {sigs:?}; job left: {job_left:?}; watcher exited {quiet} after {took:?}"
        );
        let stopped_or_gone = !matches!(st, Some('S') | Some('R'));
        if stopped_or_gone || sigs.lines().any(|l| l.starts_with("19 ")) || !quiet {
            broken.push((round, st, sigs, job_left));
        }
        let _ = by.kill();
        let _ = by.wait();
    }
    assert!(
        broken.is_empty(),
        "a process that is not the job's, traced by the job, was stopped or killed (round, its \
         state, the signals its tracer saw, the job left): {broken:#?}"
    );
}

/// The first scene's job on the deadline path: lockctl SIGSTOPped with `--ttl 1s --kill-after
/// 1s`, alive, so `b`'s parent is lockctl (in another group of the session: a link of `G` that
/// `y`'s death does not cut). Asserted: nothing of the job is left while lockctl is still stopped
/// 3.5 s later, nothing after its SIGCONT, and lockctl exits 76.
#[test]
fn the_deadline_path_with_a_deep_link() {
    let s = Server::start();
    let bin = compile(s.dir(), "esc3", &[C_PRELUDE, ESC3].concat());
    let n = rounds(2);
    let mut broken = Vec::new();
    for round in 0..n {
        let t = tag(300 + round);
        let _sweep = Sweep(t.clone());
        let mut l = start_job(&s, &bin, "deeplink", &t, 120, "1s", "1s");
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
        let woke = std::fs::read_to_string(s.dir().join(format!("woke.{t}"))).ok();
        eprintln!(
            "round {round}: while lockctl was stopped, left {}; woke: {woke:?}; lockctl exited {}; \
             left after: {after:?}",
            during.len(),
            code(&out)
        );
        if !during.is_empty() || !after.is_empty() || code(&out) != 76 {
            broken.push((
                round,
                code(&out),
                during.into_iter().take(3).collect::<Vec<_>>(),
                after,
            ));
        }
    }
    assert!(
        broken.is_empty(),
        "the job ran on past its lease while lockctl was stopped, or after (round, lockctl's \
         exit, the first three left while stopped, left after): {broken:#?}"
    );
}

/// A bystander that took the PID of a process of the job the freeze had stopped and that died
/// since. `Freeze::tend`, once one held process runs past its stop, reads the kernel's lists of
/// children of every process held so far by PID (`children_of(p.pid)` for each of
/// `Freeze::stopped`), the ones gone since too, with no start-time check of the holder; whatever
/// it lists is stopped and killed in the one pass (its own start time, read then, checked).
///
/// The job (see [`ESC3`], `reuse`): `r` with 120 idle fillers, and `d` in a group of its own whose
/// parent is init once lockctl is gone. The outsider `aim` (started by the test, not the job's):
/// once lockctl is gone and `d` stopped by the freeze, kills `d` (init reaps it), forks `bp` at
/// `d`'s PID (`ns_last_pid`: CAP_SYS_ADMIN; on this machine `pid_max` is 32768, so the PID space
/// also wraps in the normal course of things), `bp` forks `bc`; then `aim` continues `r` (a held
/// process) so that a look finds it running. Asserted: `bc`, which is not the job's, is neither
/// stopped nor killed. Skipped (passes) when `ns_last_pid` cannot be written.
#[test]
fn a_bystander_at_a_dead_held_process_s_pid_keeps_its_children() {
    let s = Server::start();
    let bin = compile(s.dir(), "esc3", &[C_PRELUDE, ESC3].concat());
    let n = rounds(4);
    let mut broken = Vec::new();
    let mut aimed = 0;
    for round in 0..n {
        let t = tag(400 + round);
        let _sweep = Sweep(t.clone());
        // lockctl under a child subreaper of its own (`support/subreaper.py`), which reaps `d`
        // as soon as it dies (this machine's init reaps orphans a second or more late).
        let d = s.dir();
        let body = format!(
            "{bin} reuse {t} {dd} 120 &\nwait\n",
            bin = bin.display(),
            dd = d.display(),
        );
        let script = write(d, &format!("job-{t}.sh"), &body);
        let subreaper = write(d, "subreaper.py", include_str!("support/subreaper.py"));
        let lc = lockctl_on(&s);
        let mut wrapped = std::process::Command::new("python3");
        wrapped
            .arg(&subreaper)
            .arg("60")
            .arg(lc.get_program())
            .args(lc.get_args())
            .args(["exec", &format!("kill3-reuse-{t}"), "--ttl", "5s"])
            .args(["--kill-after", "1s", "--", "sh"])
            .arg(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (k, v) in lc.get_envs() {
            match v {
                Some(v) => wrapped.env(k, v),
                None => wrapped.env_remove(k),
            };
        }
        let l = Lockctl(Some(wrapped.spawn().unwrap()));
        let ready = eventually(Duration::from_secs(30), || {
            d.join(format!("ready.{t}")).exists()
        });
        assert!(ready, "the job never said ready");
        let py = l.pid();
        // The subreaper's children: lockctl, and its watcher (whose parent exited).
        let lockctl = std::fs::read_to_string(format!("/proc/{py}/task/{py}/children"))
            .unwrap()
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
            .find(|&c| !cmdline(c).starts_with("lockctl-guard"))
            .unwrap();
        let mut aim = std::process::Command::new(&bin)
            .args(["aim", &t])
            .arg(s.dir())
            .arg(lockctl.to_string())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200 + (round as u64 * 37) % 200));
        let watchers = watchers_of(lockctl as u32);
        let t0 = Instant::now();
        kill(lockctl, libc::SIGKILL);
        let quiet = eventually(Duration::from_secs(10), || {
            watchers.iter().all(|&w| !alive(w))
        });
        let took = t0.elapsed();
        drop(l);
        let done = eventually(Duration::from_secs(5), || {
            aim.try_wait().is_ok_and(|s| s.is_some())
        });
        let _ = aim.kill();
        let _ = aim.wait();
        let read = |what: &str| {
            std::fs::read_to_string(s.dir().join(format!("{what}.{t}"))).unwrap_or_default()
        };
        let (steps, bc) = (read("aim"), read("bc"));
        let (took_us, rstate) = (read("took"), read("rstate"));
        let step = steps.split_whitespace().nth(1).unwrap_or("").to_string();
        if step == "2" || step == "3" {
            aimed += 1;
        }
        eprintln!(
            "round {round}: aim's last step {step:?} (done {done}); from d stopped to bc \
             running: {took_us:?} us; r's state then: {rstate:?}; bc: {bc:?}; watcher exited \
             {quiet} after {took:?}"
        );
        if bc.contains("stopped") || bc.contains("killed") || !quiet {
            broken.push((round, step, bc));
        }
    }
    eprintln!(
        "{} of {n} rounds: the bystander's child was stopped or killed; {aimed} rounds had `bp` \
         at `d`'s PID",
        broken.len()
    );
    assert!(
        broken.is_empty(),
        "a process that is not the job's (the child of a bystander that took the PID of a held \
         process of the job that died during the freeze) was stopped or killed by the watcher \
         (round, aim's last step, what bp saw of bc): {broken:#?}"
    );
}
