//! Finding the job's processes in `/proc`: every descendant of lockctl, whatever process group it
//! moved to.
//!
//! A process group is not a boundary a job keeps: coreutils `timeout` and a shell with job control
//! (`set -m`) put their children in groups of their own, so a `killpg` on the job's first group
//! misses them. The ancestry does hold: lockctl is the subreaper of everything it started, so every
//! process of the job is a descendant of lockctl for as long as lockctl lives (an orphan comes back
//! to lockctl, not to init). Signals therefore go to the job's group *and* to every descendant found
//! by following parent links in `/proc`, and to the groups those descendants lead.
//!
//! A walk is a snapshot: a process forked after it is not in it. Its parent is, and a stopping
//! signal (SIGKILL) is sent in rounds until a walk finds nothing new. A process found by a walk
//! may exit, be reaped and have its PID handed to another process before the walk ends: a walk of
//! every process takes milliseconds, a loaded machine's a tenth of a second, and a process with
//! CAP_SYS_ADMIN can aim the next PID (`ns_last_pid`). So no signal goes by a PID alone: each
//! process is pinned first ([`Pin`]), a pidfd opened on its PID and its start time read again
//! after that; the signal then goes through the pidfd, which names that process and no other
//! (`tests/atkkill4_review.rs`: a bystander at the PID of a member that exited during the walk was
//! stopped for good, one at the PID of a killed member reaped during the kill rounds was killed).
//! A group is signalled as a whole only while its leader is pinned: its ID is then the leader's
//! PID, which no other process can have.

use std::collections::{HashMap, HashSet};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// What `/proc` is to this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcMount {
    /// This PID namespace's own: `/proc/self` names this process.
    Own,
    /// Another PID namespace's (a namespace made without mounting its own, `unshare -pf` without
    /// `--mount-proc`): its PIDs are not this namespace's, and a walk there finds other processes,
    /// lockctl's own threads among them, under the PIDs of the job's.
    Foreign,
    /// No procfs mounted at `/proc`.
    Missing,
}

/// Whether `/proc` is a procfs, and this PID namespace's (see [`ProcMount`]).
///
/// `/proc/self/status`'s `NSpid` line lists this process's PID in every PID namespace from the
/// procfs's down to its own: one PID, this process's, only in its own namespace's procfs. The PID
/// alone would not do: in a parent namespace's procfs it may be the same number by chance (or by
/// `ns_last_pid`); it is what kernels without `NSpid` (before 4.1) are judged by.
///
/// The file read must be `/proc`'s own: root can bind a status file (or a whole `/proc/PID`) from
/// a procfs of lockctl's namespace over the entry that `/proc/self` names in a parent's `/proc`,
/// or mount a symlink over `/proc/self` or over that status file that leads to another process's
/// (`open_tree` and `move_mount` mount a symlink itself), and that file's `NSpid` is the right one.
/// Each is a mount of its own on the way: `self/status` is opened under `/proc` with `openat2`'s
/// `RESOLVE_NO_XDEV`, which refuses to cross one. Where `openat2` is missing (kernels before 5.6,
/// or a seccomp filter that refuses it), the file must at least be on `/proc`'s mount: the same
/// device, which another procfs never shares, and the same mount ID where the kernel tells it
/// (5.8 on); a symlink mounted over the way, or a bind of the same procfs on a kernel without
/// mount IDs, passes there (docs/guarantees.md).
pub fn proc_mount() -> ProcMount {
    let Ok(proc) = std::fs::File::open("/proc") else {
        return ProcMount::Missing;
    };
    // SAFETY: fstatfs into a zeroed struct, on a descriptor that lives through the call.
    let procfs = unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::fstatfs(proc.as_raw_fd(), &mut st) == 0 && st.f_type == libc::PROC_SUPER_MAGIC
    };
    if !procfs {
        return ProcMount::Missing;
    }
    let status = match open_beneath(&proc, c"self/status") {
        Ok(file) => file,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS) | Some(libc::EPERM)) => {
            let Ok(file) = std::fs::File::open("/proc/self/status") else {
                return ProcMount::Foreign;
            };
            file
        }
        // EXDEV: a mount on the way.
        Err(_) => return ProcMount::Foreign,
    };
    match (
        mount_of(proc.as_raw_fd(), c""),
        mount_of(status.as_raw_fd(), c""),
    ) {
        (Some(proc), Some(file)) if proc == file => {}
        _ => return ProcMount::Foreign,
    }
    let me = std::process::id().to_string();
    let nspid = read_all(status).ok().and_then(|status| {
        let ids = status.lines().find_map(|l| l.strip_prefix("NSpid:"))?;
        Some(ids.split_whitespace().eq([me.as_str()]))
    });
    // Kernels before 4.1 have no `NSpid`: the PID that `/proc/self` names must do there.
    let own = nspid.unwrap_or_else(|| {
        std::fs::read_link("/proc/self").is_ok_and(|l| l.to_str() == Some(me.as_str()))
    });
    if own {
        ProcMount::Own
    } else {
        ProcMount::Foreign
    }
}

/// `path` opened for reading under the directory `dir` without crossing a mount on the way
/// (`openat2`, `RESOLVE_NO_XDEV`): EXDEV if it would, ENOSYS (or a seccomp filter's EPERM) where
/// the kernel has no `openat2`.
fn open_beneath(dir: &std::fs::File, path: &std::ffi::CStr) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    // SAFETY: a zeroed `open_how` is valid (no flags, no mode, no resolve rules).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_NO_XDEV;
    // SAFETY: openat2 with a live directory, a NUL-terminated path and an `open_how` of the size
    // given; the descriptor it returns is ours alone.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor, owned by nothing else.
    Ok(unsafe { std::fs::File::from_raw_fd(fd as i32) })
}

/// The device and mount ID of `path` under `dir` (the file `dir` itself for an empty path): the
/// mount ID is 0 where the kernel does not tell it (before 5.8), `None` if neither can be had.
fn mount_of(dir: i32, path: &std::ffi::CStr) -> Option<(u32, u32, u64)> {
    let flags = if path.is_empty() {
        libc::AT_EMPTY_PATH
    } else {
        0
    };
    // SAFETY: statx into a zeroed struct, on a path that lives through the call.
    unsafe {
        let mut st: libc::statx = std::mem::zeroed();
        if libc::statx(dir, path.as_ptr(), flags, libc::STATX_MNT_ID, &mut st) == 0 {
            let id = if st.stx_mask & libc::STATX_MNT_ID != 0 {
                st.stx_mnt_id
            } else {
                0
            };
            return Some((st.stx_dev_major, st.stx_dev_minor, id));
        }
        // No statx (kernels before 4.11): the device alone.
        let mut st: libc::stat = std::mem::zeroed();
        let done = if path.is_empty() {
            libc::fstat(dir, &mut st)
        } else {
            libc::stat(path.as_ptr(), &mut st)
        };
        (done == 0).then(|| (libc::major(st.st_dev), libc::minor(st.st_dev), 0))
    }
}

/// One process, as `/proc/PID/stat` describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proc {
    pub pid: i32,
    pub ppid: i32,
    pub pgid: i32,
    pub sid: i32,
    /// Start time, in clock ticks since boot: with the PID, it names one process for good.
    pub start: u64,
}

/// Every process visible in `/proc` now.
pub fn snapshot() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(read)
        .collect()
}

/// The process `pid`, if it exists.
pub fn read(pid: i32) -> Option<Proc> {
    let stat = read_proc(format!("/proc/{pid}/stat")).ok()?;
    let fields = after_name(&stat)?;
    Some(Proc {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        sid: fields.get(3)?.parse().ok()?,
        start: fields.get(19)?.parse().ok()?,
    })
}

/// The fields of a `stat` line after the command name: state(0) ppid(1) pgrp(2) session(3) ...
/// starttime(19). The name, in parentheses, may itself contain spaces and parentheses, so the
/// fields start after the last `)`; it is not used (a name proves nothing: a job's process may
/// call itself lockctl-guard).
fn after_name(stat: &str) -> Option<Vec<&str>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace().collect())
}

/// A file of `/proc`, whole, in one read when it fits 1 KiB (a `stat` line does): open, read,
/// the read that finds the end, close. `std::fs::read_to_string` asks for the size first, which
/// `/proc` gives as 0, and then reads in steps from 32 bytes up: nine calls for a `stat` line, on
/// the path between a grant and its command, and at each of the watcher's looks. Bytes that are
/// not UTF-8 are replaced, not refused.
pub fn read_proc(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    read_all(std::fs::File::open(path)?)
}

/// All of an open `/proc` file, read as [`read_proc`] does.
fn read_all(mut file: std::fs::File) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = vec![0u8; 1024];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(len * 2, 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    // A process's name (in parentheses in `stat`) is whatever bytes its program file or `prctl`
    // gave it: a job's process named in bytes that are not UTF-8 must still be found.
    Ok(match String::from_utf8(buf) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

/// How `pid` is stopped, if it is: `Some('T')` by a stop signal, `Some('t')` at a tracer's stop
/// (`strace -f` puts a process there for a moment at every system call; a debugger, for good).
pub fn stop_state(pid: i32) -> Option<char> {
    let stat = read_proc(format!("/proc/{pid}/stat")).ok()?;
    match *after_name(&stat)?.first()? {
        "T" => Some('T'),
        "t" => Some('t'),
        _ => None,
    }
}

/// The processes of `procs` whose chain of parents reaches one of `roots` (the roots excluded).
pub fn descendants(procs: &[Proc], roots: &HashSet<i32>) -> Vec<Proc> {
    let mut inside: HashSet<i32> = roots.clone();
    let mut found = Vec::new();
    loop {
        let before = found.len();
        for p in procs {
            if !inside.contains(&p.pid) && inside.contains(&p.ppid) {
                inside.insert(p.pid);
                found.push(*p);
            }
        }
        if found.len() == before {
            return found;
        }
    }
}

/// Sends `signal` once to each of `members` not in the group `done` (already signalled as a whole; 0
/// for none): to each group one of them leads, as a whole, and to the others one by one. A group led
/// by a process outside the job is not signalled as a whole: a member may have joined one (`setpgid`
/// into another group of the session), and the other processes there are not the job's. Inside a
/// PID namespace a group whose leader is outside it reads 0: such a member is signalled alone.
pub fn signal_all(members: &[Proc], signal: i32, done: i32) {
    let by_pid: HashMap<i32, &Proc> = members.iter().map(|p| (p.pid, p)).collect();
    let mut groups = HashSet::from([done]);
    for p in members {
        if done > 0 && p.pgid == done {
            continue;
        }
        if let Some(leader) = by_pid.get(&p.pgid) {
            if groups.insert(p.pgid) {
                // The group as a whole while its leader is the one the walk found: the group's
                // ID is then its PID, which no other process can have. A group whose leader is
                // gone is left to its members' own signals.
                let pin = Pin::new(leader);
                if !pin.gone() {
                    // SAFETY: killpg with plain integers, the leader pinned (see above).
                    unsafe { libc::killpg(p.pgid, signal) };
                }
            }
            // A process seen in a group may have left it (`setsid`) by the time the group is
            // signalled. A SIGKILL goes to it by itself too; other signals go once only (a second
            // SIGTERM or SIGINT means "now" to many programs).
            if signal == libc::SIGKILL && p.pid != p.pgid {
                Pin::new(p).send(signal);
            }
        } else {
            Pin::new(p).send(signal);
        }
    }
}

/// A pidfd on the process `pid` (Linux 5.3 and later): it names that process until the
/// descriptor is closed, whatever takes the PID after the process is reaped.
pub fn pidfd_open(pid: i32) -> std::io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a PID and flags; the descriptor, if any, is owned here.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just opened, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Sends `signal` to the process `pidfd` names, and to no other.
pub fn pidfd_signal(pidfd: &OwnedFd, signal: i32) {
    // SAFETY: pidfd_send_signal on a pidfd of ours, without siginfo.
    unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        );
    }
}

/// A process held for a signal: a pidfd opened on its PID (Linux 5.3 and later), kept only if the
/// process with that PID still has the start time it was found with when read after the open.
/// The pidfd then names that process and no other, whatever takes its PID after it exits. Where
/// pidfds are missing (an older kernel, a seccomp profile that denies them), the start time is
/// checked all the same and the signal goes by PID: a process that took the PID between that check
/// and the signal, microseconds, is the limit left there. With no descriptor left at all, not even
/// the check can be read, and nothing is sent ([`kill_at_once`] keeps half of them free).
enum Pin {
    Fd(OwnedFd),
    /// The start time matched, but no pidfd could be opened.
    Pid(i32),
    /// Gone, or its PID another process's by now.
    Gone,
}

impl Pin {
    fn new(p: &Proc) -> Pin {
        let fd = match pidfd_open(p.pid) {
            Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Pin::Gone,
            opened => opened.ok(),
        };
        // Read after the open: the same start time means the pidfd took the process found.
        if read(p.pid).is_none_or(|q| q.start != p.start) {
            return Pin::Gone;
        }
        match fd {
            Some(fd) => Pin::Fd(fd),
            None => Pin::Pid(p.pid),
        }
    }

    fn gone(&self) -> bool {
        matches!(self, Pin::Gone)
    }

    /// Sends `signal` to the pinned process.
    fn send(&self, signal: i32) {
        match self {
            Pin::Fd(fd) => pidfd_signal(fd, signal),
            // SAFETY: kill with plain integers, the start time checked just before.
            Pin::Pid(pid) => unsafe {
                libc::kill(*pid, signal);
            },
            Pin::Gone => {}
        }
    }
}

/// Sends `signal` to every descendant of this process outside the group `done` but `spare` (the
/// watcher, which has no descendants), in rounds for SIGKILL (a fork between a walk and the signal
/// escapes one round, not the next).
pub fn signal_descendants(signal: i32, done: i32, spare: i32) {
    let me = HashSet::from([std::process::id() as i32]);
    let rounds = if signal == libc::SIGKILL { 4 } else { 1 };
    let mut seen: HashSet<(i32, u64)> = HashSet::new();
    for _ in 0..rounds {
        let found: Vec<Proc> = descendants(&snapshot(), &me)
            .into_iter()
            .filter(|p| p.pid != spare)
            .filter(|p| seen.insert((p.pid, p.start)))
            .collect();
        if found.is_empty() {
            return;
        }
        signal_all(&found, signal, done);
    }
}

/// The watcher's view of the job (in the exec'd watcher only: it allocates). While lockctl lives,
/// its descendants are the job; once it is gone, they are orphans of init (or of a subreaper, such
/// as a container's first process), and the watcher finds only what it can prove to be the job's:
///
/// - the processes its looks found (at every [`super::watcher`] wake, a tenth of a second at most)
///   that still run, checked by start time so a recycled PID is not taken for one of them, and
///   their descendants;
/// - processes in lockctl's session, started after lockctl, whose process group is the job's own
///   (also after lockctl reaped its leader: a group's ID stays reserved while any member exists) or
///   is led by a process of the job it has found. A process joins a group only by being forked in
///   it or by asking to (`setpgid` on itself or its child before exec), so every member of such a
///   group is the job's, unless it chose to join. No other process is taken for the job's: being
///   an orphan, or leading a group of its own, proves nothing (a container's first process has
///   children that are not orphans; another lockctl's command leads its group; in a PID namespace
///   every group whose leader is outside reads 0).
///
/// A process that moved to a group of its own (or another session) within a tenth of a second
/// before lockctl's death, and whose parent exited before the watcher could stop the job's group,
/// is not found; neither is one in another group of the session that a member joined.
pub struct Walker {
    lockctl: i32,
    me: i32,
    /// lockctl's session and start time.
    sid: i32,
    start: u64,
    /// The job's processes that the looks found and that still ran at the last look, by PID.
    seen: HashMap<i32, Proc>,
}

impl Walker {
    /// `lockctl` is the PID of the lockctl that started `start` (clock ticks since boot); the watcher
    /// shares its session. lockctl may be gone already.
    pub fn new(lockctl: i32, start: u64) -> Walker {
        // SAFETY: getsid has no preconditions.
        let sid = unsafe { libc::getsid(0) };
        Walker {
            lockctl,
            me: std::process::id() as i32,
            sid,
            start,
            seen: HashMap::new(),
        }
    }

    /// True while lockctl runs (its PID is not another process's by now).
    fn lockctl_lives(&self) -> bool {
        read(self.lockctl).is_some_and(|p| p.start == self.start)
    }

    /// Waits (a second at most) until lockctl has finished exiting, every thread of it: its
    /// descriptors close, which wakes the watcher, before the kernel hands its children to init. The job's group becomes
    /// orphaned at that moment, and an orphaned group with a stopped member gets SIGHUP and SIGCONT:
    /// stopped too early, the command's first process would die of the SIGHUP, and the parent links
    /// from it to the job's other groups would be cut before the search.
    pub fn await_lockctl_exit(&self) {
        for _ in 0..1000 {
            let state = read_proc(format!("/proc/{}/stat", self.lockctl));
            let running = state.is_ok_and(|stat| {
                let fields = after_name(&stat).unwrap_or_default();
                let start = fields.get(19).and_then(|s| s.parse::<u64>().ok());
                start == Some(self.start) && !matches!(fields.first(), Some(&"Z") | Some(&"X"))
            }) || std::fs::read_dir(format!("/proc/{}/task", self.lockctl))
                // A zombie leader's other threads may still be exiting; the last one hands over
                // the children.
                .is_ok_and(|tasks| tasks.count() > 1);
            if !running {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// Looks again at lockctl's descendants, if lockctl still runs, and adds them to what earlier
    /// looks found. A process of the job stays one until it dies: lockctl is its subreaper, so a
    /// descendant whose parent exits is handed to lockctl, and it leaves lockctl's descendants only
    /// by dying or with lockctl's own exit. So what an earlier look found and still runs (the same
    /// PID and start time) is kept, whether this look found it or not: a look that overlapped
    /// lockctl's exit misses what the kernel had already handed on to init, and the pipe does not
    /// tell such a look apart. A killed lockctl's threads exit one by one; the children of the
    /// first to reach the end of its exit go to init once every thread is exiting, while the last
    /// one still holds the descriptor table, the pipe's write end among it. A look taken then,
    /// which once replaced the one before, lost those children, and they outlived lockctl.
    pub fn refresh(&mut self) {
        if !self.lockctl_lives() {
            return;
        }
        let found = children_of(self.lockctl)
            .unwrap_or_else(|| descendants(&snapshot(), &HashSet::from([self.lockctl])));
        let mut seen: HashMap<i32, Proc> = found
            .into_iter()
            .filter(|p| p.pid != self.me)
            .map(|p| (p.pid, p))
            .collect();
        // Only what this look missed is read again, one `stat` each: most looks miss nothing.
        for (pid, p) in self.seen.drain() {
            if !seen.contains_key(&pid) && read(pid).is_some_and(|q| q.start == p.start) {
                seen.insert(pid, p);
            }
        }
        self.seen = seen;
    }

    /// The job's processes in `procs` as the watcher can prove them (see the type's docs): what its
    /// looks found that still runs, lockctl's descendants while it lives, the group `group` while
    /// `live`, and the descendants of all these; with `orphaned`, also the processes of lockctl's
    /// session, started after it, in the job's groups. Never the watcher or lockctl itself.
    fn members(&self, procs: &[Proc], group: i32, live: bool, orphaned: bool) -> Vec<Proc> {
        let by_pid: HashMap<i32, &Proc> = procs.iter().map(|p| (p.pid, p)).collect();
        let still = |p: &Proc| by_pid.get(&p.pid).is_some_and(|q| q.start == p.start);
        let mut roots: HashSet<i32> = self
            .seen
            .values()
            .filter(|p| still(p))
            .map(|p| p.pid)
            .collect();
        if self.lockctl_lives() {
            roots.insert(self.lockctl);
        }
        if live && group > 0 {
            roots.insert(group);
        }
        // The remembered processes as they are now (their group, session and parent as of this
        // walk), not as they were when remembered: a process that moved to another group since
        // must be signalled where it is.
        let mut members: HashMap<i32, Proc> = self
            .seen
            .values()
            .filter_map(|p| by_pid.get(&p.pid).filter(|q| q.start == p.start))
            .map(|q| **q)
            .chain(descendants(procs, &roots))
            .map(|p| (p.pid, p))
            .collect();
        if orphaned && self.start > 0 {
            let groups: HashSet<i32> = members
                .values()
                .filter(|p| p.pgid == p.pid)
                .map(|p| p.pid)
                .chain(Some(group))
                .filter(|&g| g > 0)
                .collect();
            for p in procs {
                if p.sid == self.sid && p.start >= self.start && groups.contains(&p.pgid) {
                    members.insert(p.pid, *p);
                }
            }
        }
        members
            .into_values()
            .filter(|p| p.pid != self.me && p.pid != self.lockctl)
            .collect()
    }

    /// Sends `signal` to the job outside its group `group` (0 if not announced), which the caller
    /// signals as a whole while `live` (lockctl has not reaped its leader; afterwards the ID only
    /// names the group to match members against). `orphaned`: lockctl is gone, so look for its
    /// orphans too (see the type's docs).
    ///
    /// A SIGKILL is preceded by a freeze: every process found is stopped, by its PID, and the walk
    /// made again until it finds none it has not stopped. A stopped process can neither fork nor
    /// leave its group or session, so what it started before its stop is found below it, and the
    /// kill that follows meets a job that holds still. Killed without that, a process that keeps
    /// starting children in sessions of their own (`setsid`) left those it started between the
    /// walk and its death running under init, with no link to the job
    /// (`tests/atkunion_review.rs`). What the freeze stopped is remembered, so the kill reaches it
    /// also where the walk no longer leads to it.
    ///
    /// A stop does not hold a process that something continues: the kernel's SIGHUP and SIGCONT to
    /// a group that becomes orphaned with a stopped member, another process of the job not stopped
    /// yet, or a timer of its own (`tests/atkkill_review.rs`). Once one is found running
    /// [`STOP_TAKES`] after its stop was sent (continued since, in an uninterruptible sleep, or
    /// not given a CPU yet), the freeze gives way to the kill ([`Freeze::tend`]): a SIGKILL cannot
    /// be undone. The processes stopped so far are looked at every millisecond, also while a walk
    /// of `/proc` runs (on a thread of its own: on a loaded machine a walk took 0.3 s). What such
    /// a process starts in the instant between the look at its children and its death is the
    /// limit left (`docs/guarantees.md`).
    pub fn signal(&mut self, group: i32, live: bool, signal: i32, orphaned: bool) {
        let mut freeze = Freeze::default();
        if signal == libc::SIGKILL {
            for _ in 0..16 {
                // The walk of every process takes a loaded machine a tenth of a second or more:
                // the processes stopped so far are tended meanwhile (see `Freeze::tend`), so that
                // one that something continues does not run for as long.
                let procs = freeze.walking(self);
                let fresh: Vec<Proc> = self
                    .members(&procs, group, live, orphaned)
                    .into_iter()
                    .filter(|p| freeze.sent.insert((p.pid, p.start)))
                    .collect();
                let now = Instant::now();
                for p in &fresh {
                    // Pinned: the walk took milliseconds, and the process it read may be gone,
                    // its PID another's (the module docs).
                    Pin::new(p).send(libc::SIGSTOP);
                    freeze.stop_sent.insert((p.pid, p.start), now);
                }
                freeze.stopped.extend(fresh.iter().copied());
                self.seen.extend(fresh.iter().map(|p| (p.pid, *p)));
                // The walk above has stopped what the restless ones started before it.
                let killed = !freeze.restless.is_empty();
                for p in freeze.restless.drain(..) {
                    Pin::new(&p).send(libc::SIGKILL);
                }
                // A stop is sent, not yet taken: a process that the scheduler has not run since
                // may still fork. The next walk comes once every process stopped so far holds
                // still (a tenth of a second at most), and the freeze ends with a walk that finds
                // nothing new behind processes that all hold still.
                let until = Instant::now() + Duration::from_millis(100);
                let mut still;
                loop {
                    still = freeze.tend(self);
                    if still || !freeze.restless.is_empty() || Instant::now() >= until {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                if fresh.is_empty() && still && !killed {
                    break;
                }
            }
            // Every process the freeze stopped is killed by its PID at once, before any other
            // walk: a walk takes time, and one of them continued meanwhile (the kernel's SIGCONT
            // to a group that an exit orphans, which the freeze may not have seen yet) would run
            // through it. This also reaches one that the rounds below would leave to the caller
            // as a member of the job's own group, which the caller may have signalled before the
            // process joined it; a stopped process that nothing kills stays. Each is pinned
            // ([`Pin`]) before its kill.
            kill_at_once(&freeze.stopped, &freeze.gone);
        }
        let rounds = if signal == libc::SIGKILL { 8 } else { 1 };
        let mut done: HashSet<(i32, u64)> = HashSet::new();
        for _ in 0..rounds {
            let fresh: Vec<Proc> = self
                .members(&snapshot(), group, live, orphaned)
                .into_iter()
                .filter(|p| done.insert((p.pid, p.start)))
                .collect();
            if fresh.is_empty() {
                break;
            }
            signal_all(&fresh, signal, if live { group } else { 0 });
            self.seen.extend(fresh.into_iter().map(|p| (p.pid, p)));
        }
    }
}

/// What a freeze ([`Walker::signal`]) has done so far.
#[derive(Default)]
struct Freeze {
    /// Every process sent its stop, by PID and start; those gone for good since.
    sent: HashSet<(i32, u64)>,
    gone: HashSet<(i32, u64)>,
    /// When each was last sent its stop.
    stop_sent: HashMap<(i32, u64), Instant>,
    stopped: Vec<Proc>,
    /// To kill after the next walk: found running past [`STOP_TAKES`] where the kernel keeps no
    /// lists of children to stop what they started.
    restless: Vec<Proc>,
}

impl Freeze {
    /// Every process of the machine, as [`snapshot`] reads them, read on a thread of its own while
    /// this one tends the processes stopped so far; on this thread alone if none can be started.
    fn walking(&mut self, walker: &mut Walker) -> Vec<Proc> {
        let Ok(walk) = std::thread::Builder::new()
            .name("walk".into())
            .spawn(snapshot)
        else {
            return snapshot();
        };
        while !walk.is_finished() {
            self.tend(walker);
            std::thread::sleep(Duration::from_millis(1));
        }
        walk.join().unwrap_or_default()
    }

    /// One look at every process stopped so far; true if all hold still. One found running
    /// [`STOP_TAKES`] after its stop was sent is one that a stop does not hold (continued since,
    /// in an uninterruptible sleep, or not given a CPU yet). Then the freeze gives way to the kill
    /// at once: what every process held so far started is stopped through the kernel's lists of
    /// children, and all of them are killed in one pass, the one that ran again too. Killed alone,
    /// its exit could hand others on: a group that it leaves orphaned with stopped members gets
    /// SIGCONT from the kernel, and a process it traced resumes from its tracer's stop
    /// (`tests/atkkill2_review.rs`); a process with a SIGKILL pending dies instead of running.
    /// Without such lists it is left to be killed after the next walk ([`Freeze::restless`]).
    fn tend(&mut self, walker: &mut Walker) -> bool {
        let mut still = true;
        let now = Instant::now();
        let mut unheld = Vec::new();
        for p in &self.stopped {
            let key = (p.pid, p.start);
            if self.gone.contains(&key) {
                continue;
            }
            match hold(p.pid, p.start) {
                Hold::Gone => {
                    self.gone.insert(key);
                    continue;
                }
                Hold::Stopped => continue,
                Hold::Running => still = false,
            }
            let sent_at = self.stop_sent.entry(key).or_insert(now);
            if now.duration_since(*sent_at) >= STOP_TAKES {
                Pin::new(p).send(libc::SIGSTOP);
                *sent_at = now;
                unheld.push(*p);
            }
        }
        if unheld.is_empty() {
            return still;
        }
        let held: Vec<Proc> = self.stopped.clone();
        let mut listed = true;
        for p in &held {
            // A process gone since, or one whose PID another process has taken, has no list of
            // the job's: its start time is checked before and after the list is read (a PID is
            // not handed on while its process exists), and its list is dropped otherwise.
            let same = || read(p.pid).is_some_and(|q| q.start == p.start);
            if self.gone.contains(&(p.pid, p.start)) || !same() {
                continue;
            }
            let Some(below) = children_of(p.pid) else {
                listed = false;
                break;
            };
            if !same() {
                continue;
            }
            let now = Instant::now();
            for c in below {
                if self.sent.insert((c.pid, c.start)) {
                    Pin::new(&c).send(libc::SIGSTOP);
                    self.stop_sent.insert((c.pid, c.start), now);
                    self.stopped.push(c);
                    walker.seen.insert(c.pid, c);
                }
            }
        }
        if !listed {
            for p in unheld {
                if !self.restless.contains(&p) {
                    self.restless.push(p);
                }
            }
            return still;
        }
        kill_at_once(&self.stopped, &self.gone);
        still
    }
}

/// Sends SIGKILL to each of `procs` that is not `gone` and still runs with its start time, in
/// one tight pass, children before parents ([`deepest_first`]): they are all pinned first
/// ([`Pin`]), so that the kills follow each other within microseconds. A kill can leave a group of
/// stopped processes orphaned, and the kernel then continues them; one whose SIGKILL comes a
/// little later runs meanwhile (`tests/atkkill3_review.rs`).
///
/// A pin holds a descriptor until its kill, so a job larger than [`pin_budget`] is killed in
/// passes of that many: pinned all at once, a job of thousands would take every descriptor the
/// watcher may open, and then the reads of `/proc` that check a start time and the walk on the
/// other thread would fail too, and the pins past the limit would count as gone (found by reading).
fn kill_at_once(procs: &[Proc], gone: &HashSet<(i32, u64)>) {
    let order: Vec<Proc> = deepest_first(procs)
        .into_iter()
        .filter(|p| !gone.contains(&(p.pid, p.start)))
        .collect();
    for pass in order.chunks(pin_budget()) {
        let pinned: Vec<Pin> = pass
            .iter()
            .map(Pin::new)
            .filter(|pin| !pin.gone())
            .collect();
        for pin in &pinned {
            pin.send(libc::SIGKILL);
        }
    }
}

/// How many pins [`kill_at_once`] holds at once: half the descriptors this process may open (its
/// soft `RLIMIT_NOFILE`), less 32 for its other descriptors and the reads of `/proc` meanwhile;
/// one at the least.
fn pin_budget() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct given.
    let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    (soft / 2).saturating_sub(32).max(1)
}

/// `procs` ordered for a kill in one pass: children before their parents (by the parent each had
/// when found), so that no parent dies while a child of its, stopped, waits for its own SIGKILL:
/// a parent's exit that leaves a group orphaned with stopped members has the kernel continue
/// them, and one continued before its SIGKILL is pending runs.
fn deepest_first(procs: &[Proc]) -> Vec<Proc> {
    let parent: HashMap<i32, i32> = procs.iter().map(|p| (p.pid, p.ppid)).collect();
    let depth = |mut pid: i32| {
        let mut d = 0usize;
        while let Some(&up) = parent.get(&pid) {
            if up == pid || d > procs.len() {
                break;
            }
            pid = up;
            d += 1;
        }
        d
    };
    let mut ordered: Vec<(usize, Proc)> = procs.iter().map(|p| (depth(p.pid), *p)).collect();
    ordered.sort_by_key(|e| std::cmp::Reverse(e.0));
    ordered.into_iter().map(|(_, p)| p).collect()
}

/// How long a process may take to act on its SIGSTOP before the freeze counts it as one that a
/// stop does not hold (see [`Walker::signal`]): a running process takes it at its next return to
/// user space, one waiting for a CPU when it gets one.
const STOP_TAKES: Duration = Duration::from_millis(2);

/// Whether the process `pid` started at `start` can run.
enum Hold {
    /// A zombie, or gone (its PID free or another process's): for good.
    Gone,
    /// Stopped, by a signal or a tracer: until something continues it.
    Stopped,
    Running,
}

fn hold(pid: i32, start: u64) -> Hold {
    let Ok(stat) = read_proc(format!("/proc/{pid}/stat")) else {
        return Hold::Gone;
    };
    let fields = after_name(&stat).unwrap_or_default();
    if fields.get(19).and_then(|s| s.parse::<u64>().ok()) != Some(start) {
        return Hold::Gone;
    }
    match fields.first() {
        // The first thread's state: one that ended (`pthread_exit`) reads as a zombie while the
        // others run (`tests/atkkill2_review.rs`), so then the other threads tell.
        Some(&"Z") | Some(&"X") => threads_hold(pid),
        Some(&"T") | Some(&"t") => Hold::Stopped,
        _ => Hold::Running,
    }
}

/// The state of the process `pid`, whose first thread has ended, by its other threads: gone when
/// none is left, stopped when every one left is.
fn threads_hold(pid: i32) -> Hold {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Hold::Gone;
    };
    let mut hold = Hold::Gone;
    for task in tasks.flatten() {
        let Ok(stat) = read_proc(task.path().join("stat")) else {
            continue;
        };
        match after_name(&stat).unwrap_or_default().first() {
            Some(&"Z") | Some(&"X") | None => {}
            Some(&"T") | Some(&"t") => hold = Hold::Stopped,
            Some(_) => return Hold::Running,
        }
    }
    hold
}

/// The descendants of `root`, read from the kernel's lists of children
/// (`/proc/PID/task/TID/children`): a look that reads only the job's processes, not every process
/// of the machine, as [`snapshot`] does; this one runs ten times a second. `None` if the kernel keeps
/// no such lists.
fn children_of(root: i32) -> Option<Vec<Proc>> {
    let mut found = Vec::new();
    let mut queue = vec![root];
    let mut inside = HashSet::from([root]);
    while let Some(pid) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let list = match read_proc(task.path().join("children")) {
                Ok(list) => list,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && pid == root => {
                    // Gone with its thread, or no such lists at all: ask the thread that stays.
                    if !std::path::Path::new(&format!("/proc/{pid}/task/{pid}/children")).exists()
                        && std::path::Path::new(&format!("/proc/{pid}")).exists()
                    {
                        return None;
                    }
                    continue;
                }
                Err(_) => continue,
            };
            for child in list
                .split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok())
            {
                if inside.insert(child) {
                    if let Some(p) = read(child) {
                        found.push(p);
                        queue.push(child);
                    }
                }
            }
        }
    }
    Some(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(pid: i32, ppid: i32) -> Proc {
        Proc {
            pid,
            ppid,
            pgid: pid,
            sid: 1,
            start: 0,
        }
    }

    #[test]
    fn descendants_follow_parent_chains_in_any_order() {
        let procs = [p(5, 4), p(4, 3), p(3, 1), p(9, 1), p(6, 3)];
        let mut found: Vec<i32> = descendants(&procs, &HashSet::from([3]))
            .iter()
            .map(|p| p.pid)
            .collect();
        found.sort();
        assert_eq!(found, [4, 5, 6]);
    }

    #[test]
    fn the_lists_of_children_find_a_grandchild() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let me = std::process::id() as i32;
        // The main thread's list is there on a kernel that keeps such lists: they are read then,
        // not every process of /proc.
        let lists = std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists();
        let found = children_of(me).map(|v| v.iter().map(|p| p.pid).collect::<Vec<_>>());
        // SAFETY: kill on the processes this test started.
        unsafe { libc::kill(grandchild, libc::SIGKILL) };
        child.wait().unwrap();
        match found {
            Some(found) => {
                assert!(found.contains(&(child.id() as i32)), "{found:?}");
                assert!(found.contains(&grandchild), "{found:?}");
            }
            None => assert!(
                !lists,
                "the kernel's lists of children are there but not read"
            ),
        }
    }

    /// A process that a look found stays the job's until it dies, also when a later look no longer
    /// finds it below lockctl: what the kernel does to the children of a killed lockctl's first
    /// exiting thread while another thread still holds the watcher's pipe open. Stood in for here
    /// by a process `p` that is no subreaper: `q`, its child, is killed (and left unreaped), and
    /// `q`'s child `c` goes to init while `p` runs on.
    #[test]
    fn a_look_keeps_what_earlier_looks_found_while_it_runs() {
        let mut p = std::process::Command::new("sh")
            .args([
                "-c",
                "sh -c 'sleep 30 & echo c $!; exec sleep 30' & echo q $!; exec sleep 30",
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(p.stdout.take().unwrap());
        let (mut q, mut c) = (0, 0);
        while q == 0 || c == 0 {
            let mut line = String::new();
            assert!(std::io::BufRead::read_line(&mut out, &mut line).unwrap() > 0);
            match line.split_whitespace().collect::<Vec<_>>()[..] {
                ["q", pid] => q = pid.parse().unwrap(),
                ["c", pid] => c = pid.parse().unwrap(),
                _ => panic!("{line:?}"),
            }
        }
        let pid = p.id() as i32;
        let mut walker = Walker::new(pid, read(pid).unwrap().start);
        walker.refresh();
        assert!(walker.seen.contains_key(&q) && walker.seen.contains_key(&c));
        // SAFETY: kill on processes this test started.
        unsafe { libc::kill(q, libc::SIGKILL) };
        let handed_on = (0..500).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            read(c).is_some_and(|r| r.ppid != q)
        });
        walker.refresh();
        let kept = walker.seen.contains_key(&c);
        // SAFETY: as above.
        unsafe {
            libc::kill(c, libc::SIGKILL);
            libc::kill(pid, libc::SIGKILL);
        }
        p.wait().unwrap();
        assert!(handed_on, "{c} was never handed on to another parent");
        assert!(
            kept,
            "a look dropped {c}, which an earlier look found and which still ran"
        );
    }

    #[test]
    fn a_kill_pass_leaves_half_the_descriptors_free() {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes the struct given.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        let budget = pin_budget() as u64;
        assert!(budget >= 1);
        assert!(
            budget == 1 || budget * 2 + 64 <= limit.rlim_cur,
            "{budget} of {limit:?}"
        );
    }

    #[test]
    fn a_pin_is_gone_once_the_start_time_differs() {
        let me = read(std::process::id() as i32).unwrap();
        assert!(matches!(Pin::new(&me), Pin::Fd(_)));
        let other = Proc {
            start: me.start + 1,
            ..me
        };
        assert!(Pin::new(&other).gone());
    }

    #[test]
    fn this_process_reads_itself() {
        let me = read(std::process::id() as i32).unwrap();
        assert_eq!(me.pid, std::process::id() as i32);
        // SAFETY: getppid has no preconditions.
        assert_eq!(me.ppid, unsafe { libc::getppid() });
    }
}
