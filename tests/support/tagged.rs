//! Scenes that kill a lockctl running a job and look for what of the job is left: the processes
//! a scene starts carry its tag in their command lines (`tests/atkkill_review.rs`,
//! `tests/atkkill2_review.rs`, `tests/atkkill3_review.rs`).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::watchers::{exec_script, started_at, stat_field, state, ticks_now, watchers_of};
use super::{alive, eventually, kill, need_tool, Server};

/// The command line of `pid`, its arguments joined by spaces.
pub fn cmdline(pid: i32) -> String {
    cmdline_of(Path::new(&format!("/proc/{pid}/cmdline")))
}

/// A `cmdline` file's arguments joined by spaces.
pub fn cmdline_of(path: &Path) -> String {
    std::fs::read(path)
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default()
}

/// A process left behind: PID, state, parent, session, start (ticks after the kill), command line.
#[derive(Debug)]
#[allow(dead_code)]
pub struct Left {
    pub pid: i32,
    pub state: char,
    pub ppid: u64,
    pub sid: u64,
    pub after_kill: i64,
    pub cmd: String,
}

/// Whether the file `path` holds `tag`.
pub fn holds(path: &str, tag: &str) -> bool {
    std::fs::read(path).is_ok_and(|c| c.windows(tag.len()).any(|w| w == tag.as_bytes()))
}

/// The state of the first thread of `pid` that is not a zombie, with the tag in its command line:
/// a process whose leader thread exited shows `Z` and no command line in `/proc/PID`, while its
/// other threads run.
pub fn live_thread(pid: i32, tag: &str) -> Option<char> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find_map(|tid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
            let st = stat[stat.rfind(')')? + 1..].trim_start().chars().next()?;
            (st != 'Z' && st != 'X' && holds(&format!("/proc/{pid}/task/{tid}/cmdline"), tag))
                .then_some(st)
        })
}

/// The live processes whose command line holds `tag`, but `spare`: zombies excluded, but a
/// process whose leader is a zombie and another thread of which runs is included.
pub fn tagged_but(tag: &str, spare: &[i32]) -> Vec<i32> {
    let me = std::process::id() as i32;
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&p| p != me && !spare.contains(&p))
        .filter(|&p| match state(p) {
            Some('Z') => live_thread(p, tag).is_some(),
            Some('X') | None => false,
            Some(_) => holds(&format!("/proc/{p}/cmdline"), tag),
        })
        .collect()
}

/// What of the job `tag` is still there `wait` after lockctl's SIGKILL at tick `at`.
pub fn leftovers(tag: &str, at: u64, spare: &[i32], wait: Duration) -> Vec<Left> {
    eventually(wait, || tagged_but(tag, spare).is_empty());
    tagged_but(tag, spare)
        .into_iter()
        .filter_map(|pid| {
            let (st, cmd) = match state(pid)? {
                'Z' => (
                    live_thread(pid, tag)?,
                    format!(
                        "[leader a zombie, a thread runs] {}",
                        std::fs::read_dir(format!("/proc/{pid}/task"))
                            .ok()?
                            .filter_map(|e| e.ok())
                            .map(|e| cmdline_of(&e.path().join("cmdline")))
                            .find(|c| c.contains(tag))?
                    ),
                ),
                st => (st, cmdline(pid)),
            };
            Some(Left {
                pid,
                state: st,
                ppid: stat_field(pid, 1)?,
                sid: stat_field(pid, 3)?,
                after_kill: started_at(pid)? as i64 - at as i64,
                cmd,
            })
        })
        .collect()
}

/// Kills what is left of the test's own tagged processes (stopped ones included).
pub fn sweep(tag: &str) {
    for _ in 0..10 {
        let left = tagged_but(tag, &[]);
        if left.is_empty() {
            return;
        }
        for p in left {
            kill(p, libc::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The scene's own processes, swept when dropped (also when an assertion fails).
pub struct Sweep(pub String);

impl Drop for Sweep {
    fn drop(&mut self) {
        sweep(&self.0);
    }
}

/// lockctl, SIGKILLed and reaped when dropped.
pub struct Lockctl(pub Option<Child>);

impl Lockctl {
    pub fn pid(&self) -> i32 {
        self.0.as_ref().unwrap().id() as i32
    }
}

impl Drop for Lockctl {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Writes `body` to `job-TAG.sh` in the server's directory, starts `lockctl exec NAME --ttl TTL
/// --kill-after KA -- sh` with it and waits for the job's `ready`.
pub fn run_job(s: &Server, name: &str, tag: &str, body: &str, ttl: &str, ka: &str) -> Lockctl {
    let script = write(s.dir(), &format!("job-{tag}.sh"), body);
    Lockctl(Some(exec_script(s, name, &script, ttl, ka)))
}

/// Fails with `what` and the rounds in `broken` (of `n`) when there are any, after saying how many.
pub fn assert_held<T: std::fmt::Debug>(broken: &[T], n: usize, what: &str) {
    eprintln!("{} of {n} rounds left processes of the job", broken.len());
    assert!(broken.is_empty(), "{what}: {broken:#?}");
}

/// SIGKILLs lockctl (reaped) and waits (10 s at most) until its watchers are gone; returns the
/// tick just before the kill, whether the watchers exited, and how long they took.
pub fn kill_lockctl(mut l: Lockctl) -> (u64, bool, Duration) {
    let pid = l.pid();
    let watchers = watchers_of(pid as u32);
    let at = ticks_now();
    let t0 = Instant::now();
    let mut c = l.0.take().unwrap();
    let _ = c.kill();
    let _ = c.wait();
    let quiet = eventually(Duration::from_secs(10), || {
        watchers.iter().all(|&w| !alive(w))
    });
    (at, quiet, t0.elapsed())
}

pub fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// Compiles the C program `src` into `dir/name` with `cc` (which `scripts/setup.sh` installs),
/// with POSIX threads.
pub fn compile(dir: &Path, name: &str, src: &str) -> PathBuf {
    need_tool("cc", "--version");
    let c = write(dir, &format!("{name}.c"), src);
    let bin = dir.join(name);
    let out = std::process::Command::new("cc")
        .args(["-O2", "-pthread", "-o"])
        .arg(&bin)
        .arg(&c)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// The start of the review files' C programs (`ESC` and `ESC3`, which follow it): the headers,
/// a SIGCONT handler that sets `woke`, the `tag` and `dir` of the scene, and `mark(what, n)`,
/// which writes `PID N ppid PPID` to `DIR/what.TAG` at once (written aside, then renamed).
pub const C_PRELUDE: &str = r#"#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t woke;
static void on_cont(int s) { (void)s; woke = 1; }
static char *tag, *dir;
static char escarg[160];

static void mark(const char *what, long n) {
    char path[512], tmp[520], body[64];
    snprintf(path, sizeof path, "%s/%s.%s", dir, what, tag);
    snprintf(tmp, sizeof tmp, "%s.tmp%d", path, getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    int len = snprintf(body, sizeof body, "%d %ld ppid %d\n", getpid(), n, getppid());
    if (write(fd, body, len) < 0) {}
    close(fd);
    rename(tmp, path);
}
"#;
