//! Scenes that kill a lockctl running a job and look for what of the job is left: the processes
//! a scene starts carry its tag in their command lines (`tests/atkkill_review.rs`,
//! `tests/atkkill2_review.rs`).

use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use super::watchers::{exec_script, started_at, stat_field, state, ticks_now, watchers_of};
use super::{alive, eventually, kill, Server};

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

/// Starts `lockctl exec NAME --ttl TTL --kill-after KA -- sh SCRIPT` and waits for `ready`.
pub fn start(s: &Server, name: &str, script: &Path, ttl: &str, ka: &str) -> Lockctl {
    Lockctl(Some(exec_script(s, name, script, ttl, ka)))
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
