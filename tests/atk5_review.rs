//! A review of 42b1bda (`deadline_fits` in `src/exec/watcher.rs`): a deadline goes into the pipe
//! to the watcher only if the words after it (the job's group, FORGET, HANDLING, DONE) still fit
//! whatever the reader did: two pages free in a pipe of three or more, a page's worth less 16
//! bytes in a pipe of two, no deadline in a pipe of one; the capacity is asked with each deadline.
//!
//! The rule looks at the capacity as it is when a deadline is written. A pipe is resized by any
//! process of the same user (`F_SETPIPE_SZ` on `/proc/WATCHER/fd/3`), also after the deadlines
//! are in it: the kernel lets a pipe shrink to as few pages as it has pages taken, whatever bytes
//! they hold. A stopped watcher's pipe holds HANDLING and then 455 deadlines in its first page
//! (1 + 455 * 9 = 4096 bytes, the page full), and 455 in each page after that (4095 bytes, one
//! byte free). Shrunk to one page when its first is full, or to two pages when its second holds
//! its 455 deadlines, the pipe then has no room for DONE, and `Watcher::done` does not resume the
//! stopped watcher.

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::time::{Duration, Instant};

use support::watchers::{self, exit_within, queued, state, StubbornJob};
use support::*;

/// The pipe that `pid` reads on its descriptor `fd`, opened through `/proc` (non-blocking, for
/// reading, which the test never does): FIONREAD and F_SETPIPE_SZ on it act on that pipe.
fn open_pipe(pid: i32, fd: i32) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{pid}/fd/{fd}"))
        .expect("the watcher's pipe, opened through /proc")
}

fn bytes_in(pipe: &std::fs::File) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: FIONREAD into a live integer, on a descriptor the test owns.
    assert_eq!(
        unsafe { libc::ioctl(pipe.as_raw_fd(), libc::FIONREAD, &mut n) },
        0
    );
    n
}

/// How a shrink went: the bytes in the pipe when it was resized, and F_SETPIPE_SZ's answer.
#[derive(Debug)]
struct Shrunk {
    bytes: i32,
    set: i32,
}

/// Waits, up to `limit`, until the watcher's pipe holds exactly `at` bytes (looked at every
/// millisecond; lockctl adds 9 every 0.1 s at `--ttl 300ms`), then sets its capacity to `size`.
/// An error if the count went past `at` unseen, or the limit passed.
fn shrink_at(watcher: i32, at: i32, size: i32, limit: Duration) -> Result<Shrunk, String> {
    let pipe = open_pipe(watcher, 3);
    let until = Instant::now() + limit;
    let mut last = (bytes_in(&pipe), Instant::now());
    loop {
        let bytes = bytes_in(&pipe);
        if bytes != last.0 {
            last = (bytes, Instant::now());
        }
        if bytes == at {
            // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
            let set = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
            let bytes = bytes_in(&pipe);
            return Ok(Shrunk { bytes, set });
        }
        if bytes > at {
            return Err(format!("the pipe went past {at} bytes unseen ({bytes})"));
        }
        if last.1.elapsed() > Duration::from_secs(5) {
            return Err(format!(
                "renewals ended at {bytes} bytes (a renewal too late on a loaded machine?)"
            ));
        }
        if Instant::now() >= until {
            return Err(format!("the pipe never held {at} bytes ({bytes})"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// What became of a StubbornJob whose stopped watcher's pipe was shrunk to `size` bytes when it
/// held `at`: lockctl's exit code, whether the watcher outlived lockctl (still there, stopped,
/// 10 s after lockctl's exit), the bytes in its pipe then, and lockctl's stderr.
struct Outcome {
    shrunk: Shrunk,
    code: Option<i32>,
    left: bool,
    how: Option<char>,
    after: Option<i32>,
    released: bool,
    guards_left: bool,
    errs: String,
}

fn shrunk_scene(name: &str, at: i32, size: i32) -> Result<Outcome, String> {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, name, "300ms");
    let shrunk = shrink_at(watcher, at, size, Duration::from_secs(240));
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let shrunk = shrunk.map_err(|e| format!("no verdict: {e}; {errs}"))?;
    eprintln!("{name}: {shrunk:?} (the watcher {watcher}, lockctl {lockctl})");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let after = queued(watcher, 3);
    drop(stopped);
    let guards_left = !eventually(Duration::from_secs(10), || {
        watchers::watchers_of(lockctl).is_empty()
    });
    Ok(Outcome {
        shrunk,
        code: status.and_then(|s| s.code()),
        left,
        how,
        after,
        released: s.get(&format!("lockctl:{name}")).is_none(),
        guards_left,
        errs,
    })
}

fn check(name: &str, o: Outcome, size: i32) {
    eprintln!(
        "{name}: lockctl exited {:?}; watcher left {} (state {:?}, {:?} bytes in its pipe); \
         released {}",
        o.code, o.left, o.how, o.after, o.released
    );
    assert_eq!(o.shrunk.set, size, "F_SETPIPE_SZ refused: {:?}", o.shrunk);
    assert_eq!(o.code, Some(76), "{}", o.errs);
    assert!(o.released, "the lock was not released: {}", o.errs);
    assert!(
        !o.guards_left,
        "a lockctl-guard is still there after the cleanup"
    );
    assert!(
        !o.left,
        "the stopped watcher (state {:?}, {:?} bytes in its {size}-byte pipe, {} when it was \
         shrunk) outlived its lockctl, which exited 76 for it: {}",
        o.how, o.after, o.shrunk.bytes, o.errs
    );
}

/// The stopped watcher's pipe (StubbornJob: lockctl saw it stopped, wrote HANDLING, stopped the
/// job, which ignores SIGTERM, and renews on at `--ttl 300ms`) shrunk to one page by another
/// process of the same user at the moment its first page is full: HANDLING and 455 deadlines,
/// 4096 bytes in one page, so the kernel takes the shrink. The next deadline finds a pipe of one
/// page and is not written (counted as a watcher gone: renewals end), but the page holds no room
/// for FORGET or DONE either: once the job ends, `Watcher::done` does not resume the watcher,
/// which stays behind, stopped, after lockctl's exit 76 (the defect atk4_review found at
/// 93ed0d8, reached now by shrinking after the page filled instead of before). Resumed later, it
/// reads no FORGET and no DONE, takes lockctl for dead, and kills the job's group by its old ID
/// (see atk4_review's `a_left_watcher_resumed_later_does_not_kill_a_group_that_reused_the_jobs_id`,
/// same ending).
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_pipe_shrunk_to_one_page_once_its_first_is_full_still_takes_done` (about 50 s: 455 renewals).
#[test]
#[ignore = "defect at 42b1bda: a pipe shrunk through /proc to one page once HANDLING and 455 deadlines fill its first page has no room for FORGET or DONE; the stopped watcher stays behind after lockctl's exit"]
fn a_pipe_shrunk_to_one_page_once_its_first_is_full_still_takes_done() {
    let name = "full1";
    match shrunk_scene(name, 4096, 4096) {
        Ok(o) => check(name, o, 4096),
        Err(e) => panic!("{e}"),
    }
}

/// The same with two pages: shrunk to 8 KiB once the second page holds its 455 deadlines (4096 +
/// 4095 = 8191 bytes in two pages, one byte free). FORGET takes that byte; DONE does not fit.
/// The next deadline is refused (8191 + 9 > 4096 - 16), renewals end, and the stopped watcher
/// stays behind after lockctl's exit 76.
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_pipe_shrunk_to_two_pages_once_its_second_is_full_still_takes_done` (about 95 s: 910
/// renewals).
#[test]
#[ignore = "defect at 42b1bda: a pipe shrunk through /proc to two pages once its second page holds 455 deadlines (8191 bytes) takes FORGET in its last byte and no DONE; the stopped watcher stays behind after lockctl's exit"]
fn a_pipe_shrunk_to_two_pages_once_its_second_is_full_still_takes_done() {
    let name = "full2";
    match shrunk_scene(name, 8191, 8192) {
        Ok(o) => check(name, o, 8192),
        Err(e) => panic!("{e}"),
    }
}

/// The control: shrunk to one page one deadline earlier (HANDLING and 454 deadlines, 4087 bytes,
/// nine free in the page). The next deadline is refused (a pipe of one page), FORGET and DONE
/// fit, `Watcher::done` resumes the watcher, which exits; lockctl exits 76 and releases the lock.
#[test]
fn a_pipe_shrunk_to_one_page_with_room_left_takes_done() {
    let name = "room1";
    match shrunk_scene(name, 4087, 4096) {
        Ok(o) => check(name, o, 4096),
        Err(e) => panic!("{e}"),
    }
}
