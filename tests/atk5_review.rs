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
//!
//! Also here: in a pipe of 16384 pages the byte lost at each page's end outgrows the two-page
//! reserve (by arithmetic: pipes above 1 MiB are refused where this was written); and a same-user
//! reader of the watcher's pipe stuck in a userfaultfd page fault holds the pipe's mutex, on which
//! lockctl's renewal thread (in `Link::deadline`, holding the deadline's lock) and the watcher both
//! wait, so the job runs on past its lease. What holds: the control shrinks (one page with room
//! left; before the grant), and the two-page rule under lockctl's own renewals.
//!
//! Since: a watcher whose DONE does not fit is killed through its pidfd instead of left (5e49285:
//! the shrink tests pass and run in the suite); `deadline_fits` allows 8 bytes a page for the page
//! ends (d363082; the huge pipe's test needs CAP_SYS_RESOURCE, the arithmetic is a unit test on a
//! model of the pipe); the stuck reader is a known limit of the kind "lockctl and its watcher both
//! stopped" (docs/guarantees.md).

mod support;

use std::os::fd::{AsRawFd, FromRawFd};
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

/// Fills the watcher's pipe to exactly `at` bytes with harmless deadline words (`t` and a
/// deadline of 0, which the watcher's `max` ignores), written through a write end opened on
/// `/proc/WATCHER/fd/3` (what any process of the user can do), then sets its capacity to `size`.
/// lockctl's own renewals add 9 bytes each beside them (every 20 s at `--ttl 60s`; the test does
/// not wait for them, so that its verdict does not depend on the machine's speed). An error if the
/// count went past `at` (a renewal between the last look and the resize) or the pipe stopped
/// taking words.
fn shrink_at(watcher: i32, at: i32, size: i32, limit: Duration) -> Result<Shrunk, String> {
    let pipe = open_pipe(watcher, 3);
    let mut writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(format!("/proc/{watcher}/fd/3"))
        .expect("a write end of the watcher's pipe, opened through /proc");
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    let until = Instant::now() + limit;
    loop {
        let bytes = bytes_in(&pipe);
        if bytes == at {
            // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
            let set = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, size) };
            let bytes = bytes_in(&pipe);
            if bytes != at {
                return Err(format!(
                    "a renewal came between the look and the resize ({bytes})"
                ));
            }
            return Ok(Shrunk { bytes, set });
        }
        if bytes > at {
            return Err(format!("the pipe went past {at} bytes ({bytes})"));
        }
        if Instant::now() >= until {
            return Err(format!("the pipe never held {at} bytes ({bytes})"));
        }
        // The job's group word (5 bytes) may still be in the pipe, unread by the stopped watcher:
        // one-byte HANDLING words first bring the count to where 9-byte words reach `at` (a page
        // is 455 of them and a byte: pages then fill to their last byte, as lockctl's would).
        let word: &[u8] = if (at - bytes) % 9 != 0 { b"l" } else { &word };
        if !std::io::Write::write(&mut writer, word).is_ok_and(|n| n == word.len()) {
            return Err(format!("the pipe took no more words at {bytes} bytes"));
        }
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
    } = StubbornJob::start(&s, name, "60s");
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
/// same ending). Failed 4 of 4 runs with a verdict at 42b1bda (4096 bytes in the one-page pipe,
/// the watcher in state T after lockctl's exit 76, the lock released); one more run gave no
/// verdict (renewals ended at 2476 bytes, a late renewal on the loaded machine).
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_pipe_shrunk_to_one_page_once_its_first_is_full_still_takes_done` (about 50 s: 455 renewals).
#[test]
// Fixed by 5e49285 (a watcher whose DONE does not fit is killed through its pidfd): was a defect at 42b1bda: a pipe shrunk through /proc to one page once HANDLING and 455 deadlines fill its first page has no room for FORGET or DONE; the stopped watcher stays behind after lockctl's exit
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
/// stays behind after lockctl's exit 76. Failed 2 of 2 at 42b1bda (8192 bytes in the pipe after
/// lockctl's exit, the watcher in state T).
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_pipe_shrunk_to_two_pages_once_its_second_is_full_still_takes_done` (about 95 s: 910
/// renewals).
#[test]
// Fixed by 5e49285 (a watcher whose DONE does not fit is killed through its pidfd): was a defect at 42b1bda: a pipe shrunk through /proc to two pages once its second page holds 455 deadlines (8191 bytes) takes FORGET in its last byte and no DONE; the stopped watcher stays behind after lockctl's exit
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
/// Passed 3 of 3 at 42b1bda.
#[test]
fn a_pipe_shrunk_to_one_page_with_room_left_takes_done() {
    let name = "room1";
    match shrunk_scene(name, 4087, 4096) {
        Ok(o) => check(name, o, 4096),
        Err(e) => panic!("{e}"),
    }
}

/// What the watcher left stopped by
/// [`a_pipe_shrunk_to_one_page_once_its_first_is_full_still_takes_done`] does when it is resumed
/// later (any SIGCONT: `pkill -CONT`, `kill -CONT -1`, a debugger's detach): it reads HANDLING and
/// the 455 deadlines, no FORGET and no DONE (they did not fit), then end-of-file, takes lockctl for
/// dead and stops and kills the job's group by its old ID. In a PID namespace of the test's own,
/// after lockctl's exit 76 the job's old group ID is handed to a `setsid sleep 60`
/// (`ns_last_pid`), an unrelated process group; the watcher is then resumed, and the `sleep` is
/// killed. Failed 2 of 2 at 42b1bda (the victim, given the job's old ID 8, ended with status
/// 137 once the watcher was resumed).
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_watcher_left_by_a_full_page_does_not_kill_a_group_that_reused_the_jobs_id` (root: a PID
/// namespace and ns_last_pid; about 60 s).
#[test]
// Fixed by 5e49285 (a watcher whose DONE does not fit is killed through its pidfd): was a defect at 42b1bda: the watcher left stopped by a pipe shrunk to one full page (no FORGET, no DONE) kills, once resumed, the process group that took the job's old ID after lockctl's exit
fn a_watcher_left_by_a_full_page_does_not_kill_a_group_that_reused_the_jobs_id() {
    watchers::left_watcher_scene("60s", |watcher| {
        let shrunk = shrink_at(watcher, 4096, 4096, Duration::from_secs(240))
            .unwrap_or_else(|e| panic!("no verdict: {e}"));
        assert_eq!(shrunk.set, 4096, "F_SETPIPE_SZ refused");
        format!("{shrunk:?}")
    });
}

/// A pipe of 16384 pages (64 MiB: root, or any user where `fs.pipe-max-size` was raised that far)
/// and a stopped watcher: "two pages free" assumes the bytes lost at the pages' ends add up to less
/// than a page, but each page holds 455 deadlines (4095 bytes) and loses one, so past about 4090
/// pages the lost bytes eat the reserve. Here `queued + 9 <= capacity - 8192` lets in more
/// deadlines (7455630) than the pipe's pages hold (455 each, 7454720): the pipe fills to its last
/// byte but one, FORGET takes it, DONE does not fit, and the stopped watcher stays behind after
/// lockctl's exit 76. The deadlines are written by the test through lockctl's own descriptor (9
/// bytes each, `t` and a deadline of 0, which the watcher's `max` ignores), while the rule lets
/// them in, as lockctl's renewals would over days (atk4_review's
/// `a_pipe_grown_after_the_start_still_takes_done` fills its pipe the same way); lockctl's own
/// renewals go on beside them (`--ttl 5s`).
///
/// A model of the kernel's allotment (a write merges into the last page if it fits whole there,
/// else takes a new one; HANDLING, then deadlines while the rule lets them in) gives: 16, 256,
/// 4096 and 8192 pages still take FORGET and DONE, 16384 pages take FORGET only.
///
/// Not seen run: where this was written root lacks CAP_SYS_RESOURCE and `fs.pipe-max-size` is
/// 1 MiB (256 pages, where the reserve holds), so F_SETPIPE_SZ to 64 MiB is refused (EPERM) and the
/// test returns without a verdict. The defect is by the arithmetic above, not observed.
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_stopped_watchers_huge_pipe_still_takes_done` (with CAP_SYS_RESOURCE, or `fs.pipe-max-size`
/// at 64 MiB or more; 64 MiB of kernel memory for a minute).
#[test]
#[ignore = "needs CAP_SYS_RESOURCE or fs.pipe-max-size of 64 MiB (refused here); fixed by d363082: deadline_fits allows 8 bytes a page, checked on a model of the pipe in src/exec/watcher.rs; was a suspected defect at 42b1bda, by arithmetic: in a pipe of 16384 pages the two-page reserve is smaller than the byte lost at each page's end; deadlines fill the stopped watcher's pipe, DONE does not fit, the watcher stays behind"]
fn a_stopped_watchers_huge_pipe_still_takes_done() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no pipe above fs.pipe-max-size; skipped");
        return;
    }
    const SIZE: i32 = 64 << 20;
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "huge", "5s");
    let pipe = open_pipe(watcher, 3);
    // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
    let set = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, SIZE) };
    if set != SIZE {
        // No CAP_SYS_RESOURCE and fs.pipe-max-size below 64 MiB (as where this was written):
        // no verdict.
        eprintln!(
            "F_SETPIPE_SZ to {SIZE} refused: {}; no verdict",
            std::io::Error::last_os_error()
        );
        return;
    }
    let mut writer =
        watchers::writer_of(lockctl, watcher, 3).expect("lockctl's end of the watcher's pipe");
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    let (mut words, mut refused) = (0u64, false);
    let mut q = bytes_in(&pipe);
    loop {
        if words % 4096 == 0 {
            q = bytes_in(&pipe);
        }
        // lockctl's rule for a pipe of three pages or more.
        if q + 9 > SIZE - 2 * 4096 - 8 * (SIZE / 4096) {
            break;
        }
        match std::io::Write::write(&mut writer, &word) {
            Ok(9) => {
                words += 1;
                q += 9;
            }
            _ => {
                refused = true;
                break;
            }
        }
    }
    drop(writer);
    // A renewal or two more (every 1.7 s), which lockctl's check lets in while the pipe takes them.
    std::thread::sleep(Duration::from_secs(4));
    let bytes = bytes_in(&pipe);
    drop(pipe);
    eprintln!(
        "{words} deadlines written, the pipe full: {refused}; {bytes} bytes in the stopped \
         watcher's {SIZE}-byte pipe ({} free by lockctl's rule)",
        SIZE - 2 * 4096 - bytes
    );
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let after = queued(watcher, 3);
    drop(stopped);
    eprintln!("lockctl exited {status:?}; watcher left {left} ({how:?}, {after:?} bytes)");
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    assert_eq!(s.get("lockctl:huge"), None, "the lock was not released");
    assert!(
        !left,
        "the stopped watcher {watcher} (state {how:?}, {after:?} bytes in its {SIZE}-byte pipe) \
         outlived its lockctl {lockctl}, which exited 76 for it: {errs}"
    );
}

/// A watcher started while lockctl waits for the lock, its pipe shrunk to one page through
/// `/proc` before the grant: the grant's deadline finds a pipe of one page and is not written, the
/// watcher counts as gone and is replaced once by a new one (a pipe of the default size), and the
/// command runs and passes its exit code through; the lock is released and no watcher is left.
/// Passed 3 of 3 at 42b1bda.
#[test]
fn a_pipe_shrunk_to_one_page_before_the_grant_still_runs_the_command() {
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "early", &["--ttl", "60s"]);
    let token = held["token"].as_str().unwrap().to_string();
    let (child, err) =
        watchers::start_waiting(&s, "early", &["--ttl", "2s"], &["sh", "-c", "exit 3"]);
    let lockctl = child.id();
    let first = watchers::watcher_of(lockctl);
    let pipe = open_pipe(first, 3);
    // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
    let set = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 4096) };
    drop(pipe);
    assert_eq!(set, 4096, "F_SETPIPE_SZ refused");
    let o = run(lockctl_on(&s).args(["release", "early", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = child.output(Duration::from_secs(60));
    let mut errs = String::new();
    std::io::Read::read_to_string(&mut { err }, &mut errs).unwrap_or_default();
    eprintln!("exit {:?}: {errs}", out.status.code());
    assert_eq!(out.status.code(), Some(3), "{errs}");
    assert_eq!(s.get("lockctl:early"), None, "the lock was not released");
    assert!(
        eventually(Duration::from_secs(10), || watchers::watchers_of(lockctl)
            .is_empty()),
        "a lockctl-guard of lockctl {lockctl} is left"
    );
}

/// Task states (`/proc/PID/task/TID/stat`) of `pid`'s threads, with their names and the system
/// calls they are in.
fn thread_states(pid: i32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
            let name = stat.split('(').nth(1)?.split(')').next()?.to_string();
            let st = stat
                .rsplit(')')
                .next()?
                .split_whitespace()
                .next()?
                .to_string();
            // The system call it is in, by number (72 fcntl, 16 ioctl, 1 write on x86_64).
            let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
            let nr = call.split_whitespace().next().unwrap_or("?").to_string();
            Some(format!("{name}:{st}:{nr}"))
        })
        .collect()
}

/// A read of the watcher's pipe into memory registered with userfaultfd (missing pages), by
/// another process of the same user through `/proc/WATCHER/fd/3`: the kernel's `pipe_read` holds
/// the pipe's mutex while it copies to the reader's buffer, and the copy waits in the page fault
/// for as long as nobody answers it. Every other call on the pipe then waits for that mutex,
/// uninterruptibly: lockctl's renewal thread in `Link::deadline` (F_GETPIPE_SZ, FIONREAD, the
/// write), while it holds the deadline's lock, and the watcher in its `read`. Nobody renews, the
/// key expires, another client takes the lock, and neither lockctl's deadline timer nor the
/// watcher stops the job. Seen in 4 runs of 4 at 42b1bda: the other client got the lock, the job
/// still ran 3 s later, lockctl said nothing; lockctl's `renew` thread in D state in `fcntl` (72:
/// the F_GETPIPE_SZ that 42b1bda added comes first), its `deadline` thread in `futex`, the watcher
/// in D; once the fault was let go, lockctl said "validity ran out ... ago" and exited 76.
/// (Not the rule's own doing: FIONREAD and the write took the same mutex
/// before 42b1bda, which added F_GETPIPE_SZ; the promise that lockctl never blocks on the pipe
/// assumed a non-blocking descriptor is enough.)
///
/// Reproduction: `cargo test --test atk5_review -- --ignored --exact
/// a_reader_stuck_in_a_page_fault_on_the_watchers_pipe_does_not_keep_the_job_past_its_lease`
/// (userfaultfd for kernel-mode faults: root, or CAP_SYS_PTRACE, or vm.unprivileged_userfaultfd=1;
/// about 20 s).
#[test]
#[ignore = "known limit (docs/guarantees.md, both stopped): a same-user reader of the watcher's pipe stuck in a userfaultfd page fault holds the pipe's mutex; lockctl's renewal thread (F_GETPIPE_SZ, FIONREAD, write) and the watcher's read block on it, the lease runs out and the job runs on under another client's lock"]
fn a_reader_stuck_in_a_page_fault_on_the_watchers_pipe_does_not_keep_the_job_past_its_lease() {
    const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
    const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
    let s = Server::start();
    let job = s.dir().join("job");
    let err = s.dir().join("lockctl.err");
    let script = format!("echo $$ > {}; exec sleep 60", job.display());
    let child = lockctl_on(&s)
        .args(["exec", "stuck", "--ttl", "1s", "--kill-after", "1s", "--"])
        .args(["sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let child = watchers::Started(Some(child));
    let lockctl = child.id();
    assert!(
        eventually(Duration::from_secs(30), || std::fs::read_to_string(&job)
            .is_ok_and(|j| j.ends_with('\n'))),
        "the command did not start"
    );
    let job_pid: i32 = std::fs::read_to_string(&job)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let watcher = watchers::watcher_of(lockctl);
    // SAFETY: userfaultfd and its ioctls on structures of the sizes the kernel expects (u64
    // fields), an anonymous mapping of one page owned by the test.
    let (uffd, mem) = unsafe {
        let fd = libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC) as i32;
        if fd < 0 {
            eprintln!(
                "userfaultfd refused: {}; no verdict",
                std::io::Error::last_os_error()
            );
            return;
        }
        let mut api = [0xaau64, 0, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()), 0);
        let mem = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(mem, libc::MAP_FAILED);
        // range.start, range.len, mode (MISSING = 1), ioctls (out).
        let mut reg = [mem as u64, 4096, 1, 0];
        assert_eq!(libc::ioctl(fd, UFFDIO_REGISTER, reg.as_mut_ptr()), 0);
        (std::os::fd::OwnedFd::from_raw_fd(fd), mem as usize)
    };
    // A blocking reader of the watcher's pipe, through /proc.
    let pipe = std::fs::File::open(format!("/proc/{watcher}/fd/3")).unwrap();
    let reader = std::thread::spawn(move || {
        // SAFETY: a read into the test's registered page, 64 bytes of it.
        let n = unsafe { libc::read(pipe.as_raw_fd(), mem as *mut libc::c_void, 64) };
        (n, std::io::Error::last_os_error())
    });
    // Another client asks for the lock for 15 s: it gets it once the lease has run out unrenewed.
    let other = run(lockctl_on(&s).args(["acquire", "stuck", "--ttl", "60s", "-w", "15s"]));
    let taken = code(&other) == 0;
    // lockctl's policy would have stopped the job by now: SIGTERM at the deadline, SIGKILL 1 s on.
    std::thread::sleep(Duration::from_secs(3));
    let running = alive(job_pid);
    let lockctl_threads = thread_states(lockctl as i32);
    let watcher_state = state(watcher);
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    eprintln!(
        "another client took the lock: {taken}; the job {job_pid} runs: {running}; lockctl's \
         threads {lockctl_threads:?}; the watcher {watcher_state:?}; lockctl said: {errs}"
    );
    // Let the fault go: the read fails (EFAULT) and the pipe's mutex is free again.
    drop(uffd);
    let (n, e) = reader.join().unwrap();
    eprintln!("the stuck read returned {n} ({e})");
    // SAFETY: unmaps the test's own page.
    unsafe { libc::munmap(mem as *mut libc::c_void, 4096) };
    let out = child.output(Duration::from_secs(30));
    eprintln!(
        "lockctl exited {:?}: {}",
        out.status.code(),
        std::fs::read_to_string(&err).unwrap_or_default()
    );
    if running {
        kill(job_pid, libc::SIGKILL);
    }
    assert!(
        eventually(Duration::from_secs(10), || watchers::watchers_of(lockctl)
            .is_empty()),
        "a lockctl-guard of lockctl {lockctl} is left"
    );
    assert!(
        taken,
        "no verdict: nobody else got the lock: {}",
        stderr(&other)
    );
    assert!(
        !running,
        "the job {job_pid} ran on 3 s after another client took the lock (lockctl's threads \
         {lockctl_threads:?}, the watcher {watcher_state:?}): {errs}"
    );
}

/// The two-page rule with lockctl's own renewals: a stopped watcher's pipe set to two pages (what
/// a user past `fs.pipe-user-pages-soft` gets) while it holds a few bytes; renewals every 0.1 s
/// fill it until `queued + 9 > 4096 - 16` refuses one (HANDLING and 453 deadlines, 4078 bytes, all
/// in the first page); lockctl then counts the watcher gone (it was already handling the loss),
/// and once the job ends FORGET and DONE fit, `Watcher::done` resumes the watcher, which exits;
/// lockctl exits 76 and releases the lock. Passed 2 of 2 at 42b1bda (4078 bytes when renewals
/// ended).
#[test]
fn a_stopped_watchers_two_page_pipe_still_takes_done() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "two", "300ms");
    let pipe = open_pipe(watcher, 3);
    // SAFETY: F_SETPIPE_SZ on a descriptor the test owns.
    let set = unsafe { libc::fcntl(pipe.as_raw_fd(), libc::F_SETPIPE_SZ, 8192) };
    assert_eq!(set, 8192, "F_SETPIPE_SZ refused");
    let mut last = (bytes_in(&pipe), Instant::now());
    let settled = eventually(Duration::from_secs(120), || {
        let q = bytes_in(&pipe);
        if q != last.0 {
            last = (q, Instant::now());
        }
        last.1.elapsed() > Duration::from_secs(3)
    });
    let bytes = bytes_in(&pipe);
    drop(pipe);
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    drop(stopped);
    eprintln!(
        "renewals ended: {settled}, {bytes} bytes in the 8192-byte pipe; watcher left {left}"
    );
    assert!(
        settled,
        "lockctl still writes deadlines into a full two-page pipe"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    assert_eq!(s.get("lockctl:two"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} outlived its lockctl {lockctl}: {errs}"
    );
    assert!(eventually(Duration::from_secs(10), || {
        watchers::watchers_of(lockctl).is_empty()
    }));
}
