//! A review of cf62c68 (`src/exec/watcher.rs`, `src/exec/mod.rs`): the start thread joined when
//! lockctl ends without a grant, no signal by PID without pidfds, deadlines that leave the pipe's
//! last 16 bytes free (`PIPE_RESERVE`), and signals looked for while a silent watcher is awaited.
//!
//! Three defects, fixed since (the reserve is two pages; the middle process's exit is awaited
//! with a bound with or without pidfds, and again after its SIGKILL), whose tests stay, marked
//! where they were ignored (the one with real renewals is slow, and run by hand):
//! - `PIPE_RESERVE` counts bytes (FIONREAD), but a pipe's room is in pages: a 9-byte write is
//!   merged into the last page only if it fits there whole, so a page of deadlines holds 455 of
//!   them (4095 bytes). With no one-byte word before the deadlines since the pipe was last empty
//!   (a watcher stopped, resumed, stopped again: HANDLING was already sent), the reserve check
//!   lets the 7280th deadline in (65520 bytes); FORGET takes the one free byte left, DONE does not
//!   fit, and the watcher stays stopped after lockctl's exit 76 (test words: 4 of 4; lockctl's own
//!   renewals with `--ttl 60ms`: 1 of 1).
//! - Without pidfds, `reap_middle` waits for a stopped middle process without a bound, and `Drop
//!   for StartThread` now joins it: a SIGTERM while lockctl waits hangs it for good (3 of 3).
//! - The same hang with pidfds when the middle process is frozen by a cgroup (v1) freezer: after
//!   its 2 s bound `reap_middle` sends SIGKILL and waits without a bound (2 of 2).
//!
//! What held: a watcher traced by `strace -p` under `--ttl 300ms` renewals is not taken for one
//! that does not read (6 of 6 execs).

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::watchers::{exit_within, queued, state, writer_of, Started, Stopped, StubbornJob};
use support::*;

/// As atkwatcher2_review's full-pipe test, but the watcher is stopped, resumed (it reads
/// lockctl's HANDLING word and empties its pipe) and stopped again: lockctl is already stopping
/// the job, so no one-byte word comes before the deadlines this time. The deadlines are written
/// as lockctl writes them (`Link::deadline`'s check: none once `queued + 9 > size - 8192`), through
/// lockctl's own descriptor so that the test need not wait for 7280 renewals (each is the same
/// 9 bytes lockctl writes). The job then ends: FORGET takes the pipe's last free byte, DONE does
/// not fit, and `Watcher::done` does not resume the stopped watcher, which stays for good.
#[test]
// Fixed: was a defect: PIPE_RESERVE counts bytes, not pages; a watcher stopped a second time (no HANDLING byte first) gets 7280 deadlines, the pipe's last free byte goes to FORGET, DONE does not fit and the watcher stays stopped for good
fn a_watcher_stopped_twice_is_not_left_behind_when_its_pipe_is_full() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "full2", "5s");
    // Resumed, the watcher reads HANDLING and whatever deadlines came: its pipe is empty again.
    kill(watcher, libc::SIGCONT);
    assert!(
        eventually(Duration::from_secs(10), || queued(watcher, 3) == Some(0)
            && state(watcher) != Some('T')),
        "the resumed watcher did not empty its pipe"
    );
    kill(watcher, libc::SIGSTOP);
    assert!(eventually(Duration::from_secs(10), || state(watcher) == Some('T')));
    let mut pipe = writer_of(lockctl, watcher, 3).expect("lockctl's end of the watcher's pipe");
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    let mut words = 0;
    // SAFETY: F_GETPIPE_SZ on a descriptor the test owns.
    let size = unsafe { libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&pipe), libc::F_GETPIPE_SZ) };
    while queued(watcher, 3).is_some_and(|q| q + 9 <= size - 8192)
        && std::io::Write::write(&mut pipe, &word).is_ok_and(|n| n == word.len())
    {
        words += 1;
    }
    drop(pipe);
    let bytes = queued(watcher, 3);
    eprintln!("{words} words written; {bytes:?} bytes of {size} in the stopped watcher's pipe");
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let bytes = queued(watcher, 3);
    drop(stopped);
    assert_eq!(s.get("lockctl:full2"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} (state {how:?}, {bytes:?} bytes in its pipe) outlived its lockctl \
         {lockctl}, which exited 76 for it: {errs}"
    );
}

/// Makes `pidfd_open` fail with ENOSYS in the process about to exec (and its children), as a
/// seccomp profile that denies it (older container runtimes' defaults) or a kernel before 5.3.
fn deny_pidfds(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: only prctl calls (async-signal-safe) on a filter built before the fork.
    unsafe {
        cmd.pre_exec(|| {
            const RET_ALLOW: u32 = 0x7fff_0000;
            const RET_ERRNO: u32 = 0x0005_0000;
            const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
            let filter = [
                // A = arch
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 4,
                },
                libc::sock_filter {
                    code: 0x15,
                    jt: 0,
                    jf: 3,
                    k: AUDIT_ARCH_X86_64,
                },
                // A = nr
                libc::sock_filter {
                    code: 0x20,
                    jt: 0,
                    jf: 0,
                    k: 0,
                },
                libc::sock_filter {
                    code: 0x15,
                    jt: 0,
                    jf: 1,
                    k: libc::SYS_pidfd_open as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: RET_ERRNO | libc::ENOSYS as u32,
                },
                libc::sock_filter {
                    code: 0x06,
                    jt: 0,
                    jf: 0,
                    k: RET_ALLOW,
                },
            ];
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_ptr() as *mut _,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Starts `exec NAME FLAGS -- touch RAN` on a held lock (pidfds denied if `no_pidfds`) and stops
/// its watcher start's middle process (lockctl's only child while it waits) with SIGSTOP as soon
/// as it shows; up to 50 lockctls.
fn catch_the_middle(
    s: &Server,
    name: &str,
    flags: &[&str],
    ran: &std::path::Path,
    err: &std::path::Path,
    no_pidfds: bool,
) -> Option<(Started, Stopped)> {
    support::watchers::catch_the_middle(|_| {
        let mut cmd = lockctl_on(s);
        cmd.args(["exec", name])
            .args(flags)
            .args(["--", "touch"])
            .arg(ran)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(err).unwrap());
        if no_pidfds {
            deny_pidfds(&mut cmd);
        }
        Started(Some(cmd.spawn().unwrap()))
    })
}

/// Without pidfds, `reap_middle` waits for the double fork's middle process without a bound (its
/// docs say so), and since cf62c68 the start thread is joined when lockctl ends without a grant
/// (`Drop for StartThread`). A middle process stopped while lockctl waits for a held lock
/// (`kill -STOP` of lockctl's children), then a SIGTERM: lockctl must still exit promptly (the
/// promise allows 2 s more for a stopped middle process); before cf62c68 it did, the thread
/// dying with it. Waited for 20 s.
#[test]
// Fixed: was a defect: without pidfds, a SIGTERM while lockctl waits for the lock and the watcher's middle process is stopped hangs lockctl for good: Drop for StartThread joins a start whose reap_middle waitpid has no bound
fn without_pidfds_a_sigterm_with_a_stopped_middle_process_ends_lockctl_promptly() {
    if !cfg!(target_arch = "x86_64") {
        return;
    }
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "nopidfd", &["--ttl", "600s"]);
    let token = held["token"].as_str().unwrap().to_string();
    let ran = s.dir().join("ran");
    let err = s.dir().join("lockctl.err");
    let caught = catch_the_middle(&s, "nopidfd", &["-w", "60s"], &ran, &err, true);
    let (mut child, middle) = caught.expect("the middle process was never caught (50 tries)");
    let lockctl = child.id();
    // Well inside the 60 s wait: lockctl is waiting for the lock, its start thread in waitpid.
    std::thread::sleep(Duration::from_millis(300));
    kill(lockctl as i32, libc::SIGTERM);
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(20));
    let how = state(middle.0);
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    // Cleanup: the stopped middle killed (lockctl's waitpid then returns), lockctl reaped.
    drop(middle);
    let late = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(20));
    child.0.take();
    assert!(!ran.exists(), "the command ran: {errs}");
    let o = run(lockctl_on(&s).args(["release", "nopidfd", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        status.is_some(),
        "lockctl {lockctl} did not exit within 20 s of its SIGTERM (its watcher's middle process \
         stopped, state {how:?}); once the middle process was killed it exited {late:?}: {errs}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(143), "{errs}");
}

/// `Link::deadline` counts a deadline that would go into the pipe's last 16 bytes as a failed
/// write ("the watcher does not read"). A healthy watcher that is slow to read (traced by `strace
/// -p`, every `read` a tracer's stop, as a loaded machine might slow it) under many quick renewals
/// (`--ttl 300ms`, one every 0.1 s) for 6 s must not be taken for one that does not read: the
/// command's own exit code (0) comes back, not 76. Three runs. (Each `read` also held 3 ms or
/// 30 ms at its entry by strace, lockctl sees its watcher "stopped by a debugger" within about
/// 1 s: its walker reads /proc at every wake, so it is at a tracer's stop at nearly every look;
/// that check is older than cf62c68 and not this attack's subject.)
#[test]
fn a_slow_reading_watcher_under_quick_renewals_is_not_taken_for_one_that_does_not_read() {
    need_tool("strace", "-V");
    let s = Server::start();
    for round in 0..3 {
        let name = format!("slow{round}");
        let mut cmd = lockctl_on(&s);
        cmd.args(["exec", &name, "--ttl", "300ms", "--", "sleep", "6"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let child = Started(Some(cmd.spawn().unwrap()));
        let watcher = support::watchers::watcher_of(child.id());
        let mut strace = std::process::Command::new("strace");
        strace
            .args(["-p", &watcher.to_string(), "-o", "/dev/null"])
            .args(["-e", "trace=read"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let strace = Started(Some(strace.spawn().unwrap()));
        let out = child.output(Duration::from_secs(60));
        drop(strace);
        assert_eq!(code(&out), 0, "round {round}: {}", stderr(&out));
        assert_eq!(s.get(&format!("lockctl:{name}")), None);
    }
}

/// The same as [`a_watcher_stopped_twice_is_not_left_behind_when_its_pipe_is_full`] with lockctl's
/// own renewals filling the pipe (`--ttl 60ms`, one about every 20 ms: 7280 of them take a few
/// minutes), no word written by the test. Waits up to 400 s for the pipe to stop growing at its
/// reserve; a lease lost first (a loaded machine) ends the run without a verdict (it panics
/// saying so).
#[test]
#[ignore = "slow (about 150 s of real renewals at a 60 ms TTL): run by hand; the same case as a_watcher_stopped_twice_is_not_left_behind_when_its_pipe_is_full, a defect fixed by the two-page reserve"]
fn a_watcher_stopped_twice_is_not_left_behind_when_renewals_fill_its_pipe() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "full3", "60ms");
    kill(watcher, libc::SIGCONT);
    assert!(
        eventually(Duration::from_secs(10), || queued(watcher, 3) == Some(0)
            && state(watcher) != Some('T')),
        "the resumed watcher did not empty its pipe"
    );
    kill(watcher, libc::SIGSTOP);
    assert!(eventually(Duration::from_secs(10), || state(watcher) == Some('T')));
    let full = eventually(Duration::from_secs(400), || {
        queued(watcher, 3).is_some_and(|q| q + 9 > 65536 - 8192)
            || child
                .0
                .as_mut()
                .unwrap()
                .try_wait()
                .ok()
                .flatten()
                .is_some()
    });
    let bytes = queued(watcher, 3);
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    eprintln!("pipe filled by renewals: {full}, {bytes:?} bytes");
    assert!(
        full && child
            .0
            .as_mut()
            .unwrap()
            .try_wait()
            .ok()
            .flatten()
            .is_none(),
        "no verdict: the pipe did not fill with lockctl's renewals within 400 s, or lockctl \
         ended first ({bytes:?} bytes): {errs}"
    );
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    let how = state(watcher);
    let bytes = queued(watcher, 3);
    drop(stopped);
    assert_eq!(s.get("lockctl:full3"), None, "the lock was not released");
    assert!(
        !left,
        "the watcher {watcher} (state {how:?}, {bytes:?} bytes in its pipe) outlived its lockctl \
         {lockctl}, which exited 76 for it: {errs}"
    );
}

/// `Link::deadline`'s own check, with lockctl's real renewals (`--ttl 5s`, one about every 1.7 s):
/// the watcher is stopped (lockctl stops the job, which runs on), and the test fills its pipe with
/// lockctl's 9-byte words through lockctl's descriptor until one more deadline would still fit
/// the pipe's room (`deadline_fits`: all but two pages and 8 bytes a page of a pipe of three pages
/// or more) but not
/// two. The next renewal's deadline fits and is written; the one after must not be: lockctl stops
/// writing at the room's end, and takes the unwritten deadline for a lost watcher. The renewals are
/// seen on the server (the key's PTTL goes up). The writes that fill the pipe up to its last byte
/// are atkwatcher2_review's and the test above's; here only lockctl writes past the room.
#[test]
fn lockctl_writes_no_deadline_past_the_room_of_a_stopped_watcher_s_pipe() {
    let s = Server::start();
    let StubbornJob {
        mut child,
        lockctl,
        watcher,
        stopped,
        go,
        err,
    } = StubbornJob::start(&s, "room", "5s");
    let mut pipe = writer_of(lockctl, watcher, 3).expect("lockctl's end of the watcher's pipe");
    // SAFETY: F_GETPIPE_SZ on a descriptor the test owns; sysconf reads a kernel value.
    let (size, page) = unsafe {
        (
            libc::fcntl(std::os::fd::AsRawFd::as_raw_fd(&pipe), libc::F_GETPIPE_SZ),
            libc::sysconf(libc::_SC_PAGESIZE) as i32,
        )
    };
    assert!(size >= 3 * page, "a pipe of {size} bytes");
    let room = size - 2 * page - 8 * (size / page);
    let word = [b't', 0, 0, 0, 0, 0, 0, 0, 0];
    while queued(watcher, 3).is_some_and(|q| q + 18 <= room)
        && std::io::Write::write(&mut pipe, &word).is_ok_and(|n| n == word.len())
    {}
    drop(pipe);
    let filled = queued(watcher, 3).expect("the watcher's pipe");
    assert!(
        filled + 9 <= room && filled + 18 > room,
        "{filled} of {room} bytes"
    );
    let pttl = || s.cmd::<i64>(&["PTTL", "lockctl:room"]);
    // Two renewals after the fill (each within 20 s): the first's deadline fits, the second's not.
    for n in 1..=2 {
        let mut last = pttl();
        assert!(
            eventually(Duration::from_secs(20), || {
                let now = pttl();
                let renewed = now > last;
                last = now;
                renewed
            }),
            "renewal {n} after the fill did not come: {}",
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }
    let over = eventually(Duration::from_secs(3), || {
        queued(watcher, 3).is_some_and(|q| q > room)
    });
    let bytes = queued(watcher, 3);
    std::fs::write(&go, "").unwrap();
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(60));
    child.0.take();
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let left = !eventually(Duration::from_secs(10), || !stopped.still_there());
    drop(stopped);
    assert!(
        !over,
        "lockctl wrote a deadline past the room of its stopped watcher's pipe: {bytes:?} bytes \
         queued, room {room} of {size} (filled to {filled}): {errs}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(76), "{errs}");
    assert!(
        !left,
        "the watcher {watcher} outlived its lockctl {lockctl}: {errs}"
    );
    assert_eq!(s.get("lockctl:room"), None, "the lock was not released");
}

/// A freezer cgroup (v1) of the test's own, holding one process; thawed and removed when dropped.
struct Frozen(std::path::PathBuf);

impl Frozen {
    /// None where the v1 freezer is not mounted or writable.
    fn freeze(pid: i32) -> Option<Frozen> {
        let dir = std::path::Path::new("/sys/fs/cgroup/freezer").join(format!("atkwatcher3-{pid}"));
        std::fs::create_dir(&dir).ok()?;
        let frozen = Frozen(dir);
        std::fs::write(frozen.0.join("cgroup.procs"), pid.to_string()).ok()?;
        std::fs::write(frozen.0.join("freezer.state"), "FROZEN").ok()?;
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(frozen.0.join("freezer.state"))
                .is_ok_and(|s| s.trim() == "FROZEN")
        })
        .then_some(frozen)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = std::fs::write(self.0.join("freezer.state"), "THAWED");
        if let Ok(tasks) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for t in tasks.split_whitespace() {
                let _ = std::fs::write("/sys/fs/cgroup/freezer/cgroup.procs", t);
            }
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// The watcher start's middle process frozen by a (v1) cgroup freezer while lockctl waits for a
/// held lock (state D; a SIGKILL does not end it while frozen), then a SIGTERM to lockctl. Since
/// cf62c68 lockctl joins its start thread before it exits, and that thread's `reap_middle`, after
/// its 2 s bound, sends SIGKILL and then waits for the middle process without a bound. lockctl must
/// still exit promptly (2 s more at most). Waited for 20 s.
#[test]
// Fixed: was a defect: a middle process frozen by a cgroup freezer while lockctl waits: a SIGTERM hangs lockctl for good (Drop for StartThread joins reap_middle, whose waitpid after SIGKILL has no bound)
fn a_sigterm_with_a_frozen_middle_process_ends_lockctl_promptly() {
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "frozenmid", &["--ttl", "600s"]);
    let token = held["token"].as_str().unwrap().to_string();
    let ran = s.dir().join("ran");
    let err = s.dir().join("lockctl.err");
    let (mut child, middle) = catch_the_middle(&s, "frozenmid", &["-w", "60s"], &ran, &err, false)
        .expect("the middle process was never caught (50 tries)");
    let lockctl = child.id();
    let Some(frozen) = Frozen::freeze(middle.0) else {
        eprintln!("no v1 freezer here: skipped");
        return;
    };
    // Resumed from its SIGSTOP, it stays frozen.
    kill(middle.0, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(300));
    let how = state(middle.0);
    kill(lockctl as i32, libc::SIGTERM);
    let status = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(20));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    // Cleanup: thawed (a SIGKILL already sent ends it then), lockctl reaped.
    drop(frozen);
    drop(middle);
    let late = exit_within(child.0.as_mut().unwrap(), Duration::from_secs(20));
    child.0.take();
    assert!(!ran.exists(), "the command ran: {errs}");
    let o = run(lockctl_on(&s).args(["release", "frozenmid", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        status.is_some(),
        "lockctl {lockctl} did not exit within 20 s of its SIGTERM (its watcher's middle process \
         frozen, state {how:?}); once thawed it exited {late:?}: {errs}"
    );
    assert_eq!(status.and_then(|s| s.code()), Some(143), "{errs}");
}
