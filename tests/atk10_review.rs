//! A review of 085a259 (`check_proc`: exec refuses a procfs at `/proc` whose `/proc/self` is not
//! lockctl, and, as a PID namespace's first process, no procfs at `/proc`).
//!
//! What broke (ignored failing tests, reproductions in their doc comments):
//! - A parent namespace's `/proc` where lockctl's PID is the same number in both namespaces
//!   (root sets `ns_last_pid` in both; it can also happen by chance): `/proc/self` reads lockctl's
//!   PID, the check passes, and on a lost lease a job member in a session of its own ran on (3 of
//!   3). `a_parent_proc_where_lockctl_s_pid_coincides_is_refused_or_signals_only_its_job`.
//! - `/proc` changed after the check: a PID 1 lockctl whose own `/proc` is lazily unmounted while
//!   it waits for the lock (uncovering the parent's) runs its command and does not exit (3 of 3).
//!   `a_pid1_lockctl_whose_proc_is_unmounted_while_it_waits_exits_with_its_command`.
//! - A child subreaper (not PID 1) without any `/proc` is not refused, and waits for its own
//!   watcher after its command (4 of 4).
//!   `a_subreaper_lockctl_without_proc_exits_with_its_command_or_is_refused`.
//!
//! What held (tests here, in the suite): a PID 1 on a `subset=pid,hidepid=invisible` procfs; a
//! non-PID-1 on its namespace's `hidepid=invisible` procfs; no `/proc` outside a namespace's
//! first process and not a subreaper; a PID 1 on a tmpfs `/proc` with a fake `self` link and
//! `1/stat` (refused: exit 1, nothing in Redis, the command not run); the unmount scene's
//! control. Tried by hand, no test: an overlay over `/proc` with the procfs as its lower layer
//! (`mount -t overlay ... lowerdir=/proc`) is refused by the kernel (mount fails), so there is no
//! such `/proc` to run on.

mod support;

use std::time::Duration;

use support::watchers::{self, children_of, inner_pid, Started};
use support::*;

fn comm(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn read(d: &std::path::Path, f: &str) -> Option<String> {
    std::fs::read_to_string(d.join(f))
        .ok()
        .filter(|s| s.ends_with('\n'))
}

/// The `NSpid:` line of `/proc/PID/status`, outer to inner.
fn nspid(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The namespace's first process (`$1` N, `$2` the directory, `$3` lockctl): sets this
/// namespace's `ns_last_pid` to N - 1 and starts lockctl, so that it is N here; the test has set
/// the parent namespace's to N - 3 before `unshare`, so that (unshare N - 2, this shell N - 1)
/// lockctl is N there too, unless another process of the machine took a PID meanwhile.
const COINCIDE_NS: &str = r#"
N=$1; D=$2; L=$3
echo $((N - 1)) > /proc/sys/kernel/ns_last_pid
"$L" exec co --ttl 3s --kill-after 1s -- sh "$D/job.sh" 2>"$D/lockctl.err" &
wait $!
echo $? > "$D/status.tmp"; mv "$D/status.tmp" "$D/status"
"#;

/// The job: a member in a session of its own, at a PID of this namespace far from the parent's
/// numbering (`$D/free`, by `ns_last_pid`), then a loop that ignores SIGTERM.
const COINCIDE_JOB: &str = r#"
D=$(dirname "$0")
echo $(( $(cat $D/free) - 1 )) > /proc/sys/kernel/ns_last_pid
setsid sh -c 'echo $$ > $1/member.tmp; mv $1/member.tmp $1/member; exec sleep 30' member $D &
trap '' TERM
echo $$ > $D/job.tmp; mv $D/job.tmp $D/job
while :; do sleep 0.1; done
"#;

/// Reproduction (root, `unshare`; about 10 s): `cargo test --test atk10_review -- --ignored
/// --exact a_parent_proc_where_lockctl_s_pid_coincides_is_refused_or_signals_only_its_job`.
///
/// `unshare -pf --kill-child sh -c COINCIDE_NS` without `--mount-proc`, so `/proc` is the
/// parent namespace's, with the parent's `ns_last_pid` set to N - 3 just before and the
/// namespace's set to N - 1 inside: lockctl (not PID 1) is PID N in both namespaces (checked from
/// outside in `NSpid`; retried up to 10 times with a new N if another process took a PID in
/// between). `/proc/self` then reads N, `check_proc` says `Own`, and exec asks for the lock and
/// runs the job. The job starts a member in a session of its own at a PID of the namespace
/// (`ns_last_pid`) that is not its PID in the parent's numbering, and loops ignoring SIGTERM; the
/// test deletes the lock's key. Promise (1): either the check refuses (exit 1, nothing in
/// Redis), or lockctl (and its watcher) stops the member on the lost lease. Seen at 085a259, 3 of
/// 3 (each on the first try, e.g. lockctl `NSpid 28714 28714`, member `NSpid 28727 300`): the
/// check passed, lockctl said "lease on 'co' lost ... stopping the command", and the member was
/// alive 3 s later (lockctl had not exited by then either). Its walk reads the parent's
/// numbering (the member is 28727 there) and signals those numbers in its own namespace, where
/// 28727 is not the member (300). A check that the procfs is this namespace's: `/proc/self/status`
/// has one PID on its `NSpid:` line only in the namespace's own procfs.
#[test]
// Fixed: check_proc reads /proc/self/status's NSpid, one PID only in the namespace's own procfs; was a defect at 085a259: a parent namespace's /proc where lockctl's PID is the same number passed the check, and lockctl missed a job member after a lost lease and did not exit (3 of 3)
fn a_parent_proc_where_lockctl_s_pid_coincides_is_refused_or_signals_only_its_job() {
    if !watchers::as_root() {
        return;
    }
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let at = |f: &str| d.join(f);
    std::fs::write(at("job.sh"), COINCIDE_JOB).unwrap();
    let pid_max: i32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let free_range = |from: i32, len: i32| {
        (from..from + len).all(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    };
    let errs = || std::fs::read_to_string(at("lockctl.err")).unwrap_or_default();
    let mut scene = None;
    for attempt in 0..10 {
        let _ = std::fs::remove_file(at("lockctl.err"));
        let last: i32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let mut n = last + 400 + attempt * 300;
        if n + 300 >= pid_max {
            n = 400 + attempt * 300;
        }
        // Past the top the search goes on from the bottom: after the PIDs wrapped, live processes
        // of other tests may take every window above the last PID handed out.
        let mut windows = 0;
        while !free_range(n - 3, 300) {
            n += 300;
            if n + 300 >= pid_max {
                n = 400;
            }
            windows += 1;
            assert!(windows <= pid_max / 300, "no free range of PIDs");
        }
        // The member's PID in the namespace: free in the parent too, and far from its numbering.
        let member_in = (n + 5000..pid_max - 1)
            .chain(300..n - 3)
            .find(|&p| free_range(p, 1))
            .unwrap();
        std::fs::write(at("free"), format!("{member_in}\n")).unwrap();
        std::fs::write("/proc/sys/kernel/ns_last_pid", format!("{}", n - 3)).unwrap();
        let ns = std::process::Command::new("unshare")
            .args(["-pf", "--kill-child", "sh", "-c", COINCIDE_NS, "ns"])
            .arg(n.to_string())
            .arg(&d)
            .arg(env!("CARGO_BIN_EXE_lockctl"))
            .env("LOCKCTL_REDIS", s.url())
            .env("LOCKCTL_QUARANTINE", "0")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(|c| Started(Some(c)))
            .unwrap();
        let unshare = ns.id() as i32;
        let mut lockctl = 0;
        let seen = eventually(Duration::from_secs(10), || {
            let sh = children_of(unshare).first().copied().unwrap_or(0);
            lockctl = children_of(sh)
                .into_iter()
                .find(|&p| comm(p) == "lockctl")
                .unwrap_or(0);
            lockctl > 0 || read(&d, "status").is_some()
        });
        let ids = nspid(lockctl);
        eprintln!("attempt {attempt}: N {n}, lockctl {lockctl}, NSpid {ids:?}");
        if seen && lockctl > 0 && ids == [n, n] {
            scene = Some((ns, lockctl, member_in));
            break;
        }
        drop(ns);
        let _ = std::fs::remove_file(at("status"));
    }
    let Some((mut ns, lockctl, member_in)) = scene else {
        eprintln!("no verdict: lockctl's PIDs never coincided in 10 tries");
        return;
    };
    // Either the refusal, or the job with its member.
    let mut member = 0;
    let decided = eventually(Duration::from_secs(20), || {
        if read(&d, "status").is_some() {
            return true;
        }
        member = children_of(lockctl)
            .into_iter()
            .flat_map(|c| children_of(c).into_iter().chain(Some(c)))
            .find(|&p| inner_pid(p) == Some(member_in))
            .unwrap_or(0);
        member > 0 && read(&d, "job").is_some()
    });
    assert!(decided, "neither a refusal nor the job: {}", errs());
    if let Some(status) = read(&d, "status") {
        assert_eq!(status.trim(), "1", "{}", errs());
        assert!(
            s.keys().is_empty(),
            "a refusal wrote to Redis: {:?}",
            s.keys()
        );
        eprintln!("refused: {}", errs());
        return;
    }
    eprintln!(
        "the check passed: lockctl {lockctl} (NSpid {:?}), member {member} (NSpid {:?})",
        nspid(lockctl),
        nspid(member)
    );
    s.cmd::<i64>(&["DEL", "lockctl:co"]);
    let lost = eventually(Duration::from_secs(10), || errs().contains("lost"));
    std::thread::sleep(Duration::from_secs(3));
    let member_alive = alive(member);
    let status = read(&d, "status");
    let _ = watchers::exit_within(ns.0.as_mut().unwrap(), Duration::from_secs(10));
    if member_alive {
        // SAFETY: kill of a process this test started.
        unsafe { libc::kill(member, libc::SIGKILL) };
    }
    eprintln!("lost {lost}, lockctl's status {status:?}, {}", errs());
    assert!(lost, "no loss seen: {}", errs());
    assert!(
        !member_alive,
        "the job's member ran on 3 s after the lost lease (lockctl's status {status:?}): {}",
        errs()
    );
}

/// Runs `sh -c SCRIPT ns LOCKCTL` as the first process of a new PID and mount namespace with its
/// own `/proc` (`unshare -pf --mount-proc`); SCRIPT ends with `exec "$1" exec ...`, so lockctl is
/// PID 1 there. Returns its output within `limit`.
fn pid1_script(s: &Server, script: &str, limit: Duration) -> std::process::Output {
    let child = std::process::Command::new("unshare")
        .args([
            "-pf",
            "--kill-child",
            "--mount-proc",
            "sh",
            "-c",
            script,
            "ns",
        ])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    Started(Some(child)).output(limit)
}

/// Promise (3): a namespace's own procfs mounted with `subset=pid,hidepid=invisible` (a
/// container's hardened `/proc`) is this namespace's, and a PID 1 lockctl there runs its command
/// and exits with its code at once, the lock released.
#[test]
fn a_pid1_lockctl_with_a_subset_pid_hidepid_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    let s = Server::start();
    let out = pid1_script(
        &s,
        r#"mount -t proc -o subset=pid,hidepid=invisible proc /proc || exit 99
exec "$1" exec sp --ttl 10s -- sh -c 'exit 7'"#,
        Duration::from_secs(15),
    );
    assert_ne!(
        code(&out),
        99,
        "this kernel has no subset=pid: {}",
        stderr(&out)
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(s.get("lockctl:sp"), None, "the lock was not released");
}

/// Promise (2): a tmpfs over `/proc` holding a `self` link to `1` (and a `1/stat` that reads
/// like lockctl's) is not a procfs: a PID 1 lockctl there is refused before the lock, exit 1,
/// nothing in Redis, the command not run.
#[test]
fn a_pid1_lockctl_on_a_tmpfs_proc_with_a_fake_self_is_refused() {
    if !watchers::as_root() {
        return;
    }
    let s = Server::start();
    let ran = s.dir().join("ran");
    let out = pid1_script(
        &s,
        &format!(
            r#"umount -l /proc && mount -t tmpfs fake /proc || exit 99
ln -s 1 /proc/self && mkdir /proc/1 && echo '1 (lockctl) S 0 1 1 0 -1' > /proc/1/stat || exit 98
exec "$1" exec fk --ttl 10s -- touch {}"#,
            ran.display()
        ),
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("there is no /proc"),
        "{}",
        stderr(&out)
    );
    assert!(!ran.exists(), "the command ran");
    assert!(
        s.keys().is_empty(),
        "a refusal wrote to Redis: {:?}",
        s.keys()
    );
}

/// The scene of the two tests below: a PID 1 lockctl (`unshare -pf --mount-proc`, `exec lockctl
/// exec um --ttl 10s -- sh -c 'touch D/ran; exit 7'`) waits for a lock another lockctl holds;
/// with `umount`, its namespace's `/proc` is then lazily unmounted in its mount namespace
/// (`nsenter -t PID -m -p umount -l /proc`, root, from outside), which uncovers the `/proc` it
/// was mounted over, the parent's; then the holder ends. Returns lockctl's exit code (None: not
/// within 20 s of the holder's end), whether the command ran, and lockctl's stderr.
fn unmounted_while_waiting(umount: bool) -> (Option<i32>, bool, String) {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let go = d.join("go");
    let ran = d.join("ran");
    let mut holder = lockctl_on(&s);
    holder
        .args(["exec", "um", "--ttl", "10s", "--", "sh", "-c"])
        .arg(format!(
            "while [ ! -e {} ]; do sleep 0.05; done",
            go.display()
        ))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let holder = Started(Some(holder.spawn().unwrap()));
    assert!(
        eventually(Duration::from_secs(10), || s.get("lockctl:um").is_some()),
        "the holder did not take the lock"
    );
    let err = d.join("pid1.err");
    let job = format!("touch {}; exit 7", ran.display());
    let (mut ns, lockctl) = watchers::pid1_lockctl(
        &s,
        &["exec", "um", "--ttl", "10s", "--", "sh", "-c", &job],
        &err,
    );
    let errs = || std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), || errs()
            .contains("waiting for lock")),
        "lockctl does not wait: {}",
        errs()
    );
    if umount {
        let um = std::process::Command::new("nsenter")
            .args([
                "-t",
                &lockctl.to_string(),
                "-m",
                "-p",
                "umount",
                "-l",
                "/proc",
            ])
            .status()
            .unwrap();
        assert!(um.success(), "umount in lockctl's mount namespace failed");
    }
    std::fs::write(&go, "").unwrap();
    let _ = holder.output(Duration::from_secs(10));
    let status = watchers::exit_within(ns.0.as_mut().unwrap(), Duration::from_secs(20));
    let ran = eventually(Duration::from_secs(1), || ran.exists());
    eprintln!(
        "umount {umount}: lockctl's status {status:?}, command ran {ran}, key {:?}: {}",
        s.get("lockctl:um"),
        errs()
    );
    (status.and_then(|st| st.code()), ran, errs())
}

/// The control of the scene: without the unmount, the PID 1 lockctl takes the lock after the
/// holder, runs its command and exits with its code.
#[test]
fn a_pid1_lockctl_that_waits_with_its_own_proc_exits_with_its_command() {
    if !watchers::as_root() {
        return;
    }
    let (code, ran, errs) = unmounted_while_waiting(false);
    assert!(ran, "the command did not run: {errs}");
    assert_eq!(code, Some(7), "{errs}");
}

/// Reproduction (root, `unshare`, `nsenter`; about 25 s): `cargo test --test atk10_review --
/// --ignored --exact
/// a_pid1_lockctl_whose_proc_is_unmounted_while_it_waits_exits_with_its_command`.
///
/// The scene of [`unmounted_while_waiting`] with the unmount: `check_proc` ran at the start only,
/// so lockctl takes the lock and runs the command with the parent's `/proc` under it, the state
/// it refuses at the start. Promise (1): it exits with 7 within 20 s of the holder's end (or
/// docs/guarantees.md names `/proc` changed after the start as outside the check). Seen at
/// 085a259, 3 of 3: the command ran (`ran` written, `exit 7`), and 20 s after the holder's end
/// lockctl had not exited and the lock's key was still there, with lockctl's token (renewed);
/// its stderr said nothing after "waiting for lock". The control
/// (`a_pid1_lockctl_that_waits_with_its_own_proc_exits_with_its_command`) exits 7 at once. The
/// unmount is root's (or the container's own) act in lockctl's mount namespace; a lazily
/// unmounted `/proc` uncovering the parent's is the state refused at the start.
#[test]
#[ignore = "known limit (docs/guarantees.md): /proc unmounted by root in lockctl's own mount namespace after exec checked it (here while a PID 1 lockctl waits for the lock); lockctl does not exit after its command"]
fn a_pid1_lockctl_whose_proc_is_unmounted_while_it_waits_exits_with_its_command() {
    if !watchers::as_root() {
        return;
    }
    need_tool("nsenter", "--version");
    let (code, ran, errs) = unmounted_while_waiting(true);
    assert!(ran, "the command did not run: {errs}");
    assert_eq!(
        code,
        Some(7),
        "lockctl did not exit with its command's code within 20 s of the holder's end: {errs}"
    );
}

/// Runs `lockctl exec ns --ttl 10s -- sh -c 'exit 7'` in a mount namespace of its own without
/// any procfs at `/proc` (lazily unmounted until `statfs` no longer says procfs), in the machine's
/// PID namespace (not a PID 1), and, with `subreaper`, made a child subreaper before its exec
/// (`PR_SET_CHILD_SUBREAPER`, kept across `execve`: a supervisor that sets it and execs its
/// service). The command is `touch D/ran; exit 7`. Returns lockctl's output within 15 s (killed
/// at the bound), the lock's key then, and whether the command ran.
fn no_proc_lockctl(subreaper: bool) -> (std::process::Output, Option<String>, bool) {
    use std::os::unix::process::CommandExt;
    let s = Server::start();
    let ran = s.dir().join("ran");
    let job = format!("touch {}; exit 7", ran.display());
    let mut cmd = lockctl_on(&s);
    cmd.args(["exec", "np", "--ttl", "10s", "--", "sh", "-c", &job])
        .stdin(std::process::Stdio::null());
    // SAFETY: unshare, mount, umount2, statfs and prctl only, between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let err = || Err(std::io::Error::last_os_error());
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return err();
            }
            if libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ) != 0
            {
                return err();
            }
            for _ in 0..10 {
                let mut st: libc::statfs = std::mem::zeroed();
                if libc::statfs(c"/proc".as_ptr(), &mut st) != 0
                    || st.f_type != libc::PROC_SUPER_MAGIC
                {
                    break;
                }
                if libc::umount2(c"/proc".as_ptr(), libc::MNT_DETACH) != 0 {
                    return err();
                }
            }
            if subreaper && libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0 {
                return err();
            }
            Ok(())
        });
    }
    let out = Started(Some(cmd.spawn().unwrap())).output(Duration::from_secs(15));
    let key = s.get("lockctl:np");
    (out, key, ran.exists())
}

/// Promise (3): no `/proc`, not a namespace's first process, not a subreaper: exec runs its
/// command and exits with its code, the lock released.
#[test]
fn a_lockctl_without_proc_that_is_not_pid1_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    let (out, key, ran) = no_proc_lockctl(false);
    eprintln!("{:?}, ran {ran}: {}", out.status, stderr(&out));
    assert!(ran, "the command did not run");
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(key, None, "the lock was not released");
}

/// Reproduction (root; about 15 s): `cargo test --test atk10_review -- --ignored --exact
/// a_subreaper_lockctl_without_proc_exits_with_its_command_or_is_refused`.
///
/// The check refuses no `/proc` only to a PID 1 (`getpid() == 1`), but a child subreaper is in
/// the same place: the watcher's middle process exits under it, so the watcher is its own child
/// (atk9_review's `a_lockctl_made_a_subreaper_before_its_exec_exits_with_its_command`), and
/// without `/proc` nothing tells the watcher from the job. Promise (1)/(2): exit 7 at once, or a
/// refusal (exit 1, nothing in Redis). Seen at 085a259, 4 of 4: no refusal; lockctl took the
/// lock, the command ran (`ran` written, in the last run), and lockctl was still there at the
/// 15 s bound (killed by the test: signal 9), silent on stderr, the key still held with its token.
/// A check that covers it: `prctl(PR_GET_CHILD_SUBREAPER)` besides `getpid() == 1`, or, needing
/// no `/proc`, atk9's `waitid(P_PID, watcher, WEXITED | WNOHANG | WNOWAIT)` (ECHILD exactly when
/// the watcher is not lockctl's child).
#[test]
// Fixed: check_proc refuses a missing /proc for a child subreaper too (PR_GET_CHILD_SUBREAPER); was a defect at 085a259: only a PID 1 was refused, and a subreaper lockctl without /proc waited for its own watcher after its command (4 of 4)
fn a_subreaper_lockctl_without_proc_exits_with_its_command_or_is_refused() {
    if !watchers::as_root() {
        return;
    }
    let (out, key, ran) = no_proc_lockctl(true);
    eprintln!("{:?}, ran {ran}, key {key:?}: {}", out.status, stderr(&out));
    match out.status.code() {
        Some(1) => assert_eq!(key, None, "a refusal wrote to Redis"),
        c => {
            assert_eq!(c, Some(7), "{}", stderr(&out));
            assert_eq!(key, None, "the lock was not released");
        }
    }
}

/// Promise (3): a namespace with its own `/proc` (`unshare -pf --mount-proc`), lockctl not its
/// first process (sh is, and waits for it) and on a `hidepid=invisible` remount: exec runs its
/// command and exits with its code, the lock released.
#[test]
fn a_lockctl_that_is_not_pid1_with_its_namespace_s_hidepid_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    let s = Server::start();
    let out = pid1_script(
        &s,
        r#"mount -o remount,hidepid=invisible /proc || exit 99
"$1" exec hp --ttl 10s -- sh -c 'exit 7'
exit $?"#,
        Duration::from_secs(15),
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(s.get("lockctl:hp"), None, "the lock was not released");
}
