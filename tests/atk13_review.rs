//! A review of 2558c95 (`check_proc` judges `/proc/self/status` only on `/proc`'s own mount,
//! device and mount ID; a watcher gone when the command's first process announces its group stops
//! the start with a clear message, exit 1).
//!
//! What broke (reproductions in the tests' doc comments). Fixed since, the tests passing and in
//! the suite: both symlink mounts and the bind without `statx` (`self/status` is opened with
//! `openat2`'s `RESOLVE_NO_XDEV`), and the exec's own EPIPE (the gone watcher is a code of its
//! own, not an errno). Known limits, their tests ignored (docs/guarantees.md): the check without
//! `openat2` and `statx` (`a_parent_status_bound_without_openat2_and_statx_is_refused`, added
//! with the fix), and lockctl and its watcher both killed before the command's exec.
//! - Check A is bypassed by a *symlink* mounted with the new mount API (`open_tree` +
//!   `move_mount`, which, unlike `mount --bind`, does not follow a symlink target). Mounted over
//!   `/proc/self` with the text `1`, `/proc/self/status` opens the parent namespace's PID 1's
//!   status on `/proc`'s own mount (same device, same mount ID), whose `NSpid` is `1`: a PID 1
//!   lockctl on its parent's `/proc` passes, runs its command and does not exit (3 of 3,
//!   `a_symlink_mounted_over_proc_self_is_refused`). The same with a symlink `../1/status`
//!   mounted over the parent's `/proc/PID/status` (3 of 3,
//!   `a_symlink_mounted_over_the_parent_s_status_is_refused`). By hand, no test: a lockctl that is
//!   not PID 1 (PID 2 of its namespace, a symlink `2` over `/proc/self`, the parent's `/proc/2`
//!   being a process of that namespace, `NSpid: 2`) passed too and ran its command (exit 7).
//!   `openat2(dirfd of /proc, "self/status", RESOLVE_NO_XDEV)` fails with EXDEV for the symlink
//!   over `self`, the symlink over the status file and atk11's bind of `/proc/1/status`, and
//!   opens the file on a Docker-masked procfs, on a `/proc` that is a bind of a procfs and on a
//!   `hidepid=2` procfs (tried by hand with python, 1 run each).
//! - The device-only fallback: with `statx` failing (a seccomp filter returning ENOSYS, as on
//!   kernels before 4.11; before 5.8 there is no mount ID either), atk11's bind of the parent's
//!   own `/proc/1/status` over lockctl's entry (same device, `NSpid: 1`) passes again, the command
//!   runs and a PID 1 lockctl does not exit (3 of 3,
//!   `a_parent_status_bound_over_a_parent_proc_without_statx_is_refused`). Held: the fallback
//!   refuses the parent's `/proc` without the bind, and runs on a Docker-masked own procfs.
//! - At the edge of the documented limit "lockctl and its watcher both killed within the same
//!   instant": both SIGKILLed, one after the other, while the first process is held at the entry
//!   of its `execve` after its announcement: the command then starts with neither alive (3 of 3,
//!   `a_command_whose_lockctl_and_watcher_died_before_its_exec_does_not_run`).
//! - Minor: an exec that fails with `EPIPE` is reported as a gone watcher (exit 1 and the
//!   watcher's message, not 126), 3 of 3 with strace injecting the error
//!   (`an_exec_failing_with_epipe_is_not_taken_for_a_gone_watcher`).
//!
//! What held (tests here, in the suite): no false refusal of check A on a PID 1 with Docker's
//! masks and lxcfs-like binds over its procfs; a non-root user, not PID 1, on a `hidepid=2`
//! procfs with the same masks; `/proc` as a bind of a procfs (no PID namespace; and a PID 1's,
//! read-only); a procfs stacked over the namespace's own; a chroot into an rbind of `/`. The
//! watcher SIGKILLed or SIGSTOPped while the command's first process is held at its `execve`,
//! and SIGSTOPped while it is held before the announcement: exit 76, the job gone, the lock
//! released, the stopped watcher resumed by lockctl and gone. lockctl itself held after the
//! watcher was found ready, in `prctl(PR_SET_CHILD_SUBREAPER)`: the watcher killed there gives
//! exit 1 and the watcher's message, the command not run; stopped there, exit 76, the job
//! stopped. A missing command whose watcher was killed before the announcement: exit 1 and the
//! watcher's message. A PID 1 lockctl (its watcher its own child), strace attached from outside,
//! its watcher killed before the announcement: exit 1, the watcher's message, released.
//!
//! Tried by hand, no test: the watcher's start held in its `setpgid` (strace, which also holds
//! the command's first process there): the watcher is seen at a tracer's stop and replaced, the
//! replacement too, and lockctl ends with exit 1 ("the watcher process ended, stopped or stayed
//! silent at its start"), the lock free, no watcher left. A scene artifact: under `strace -f`
//! without `-b execve` the watcher is traced, and a SIGSTOP leaves it at a tracer's stop that
//! lockctl reports ("stopped by a debugger") but does not end, so strace never exits; the tests
//! here let each process go at its exec.

mod support;

use std::time::Duration;

use support::watchers;
use support::watchers::{
    children_of, pid1_lockctl, traced_lockctl, watcher_of, watchers_of, Started,
};
use support::*;

/// `python3 -c MOUNT_LINK TEXT TARGET DIR`: makes a symlink whose text is TEXT in DIR and mounts
/// it over TARGET itself, not followed (the new mount API: `open_tree(OPEN_TREE_CLONE |
/// AT_SYMLINK_NOFOLLOW)`, `move_mount` without `MOVE_MOUNT_T_SYMLINKS`; syscalls 428 and 429,
/// the same number on every architecture). `mount --bind` follows a symlink target; this does not.
const MOUNT_LINK: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
text, target, d = sys.argv[1:4]
link = os.path.join(d, "link")
os.symlink(text, link)
fd = libc.syscall(428, -100, link.encode(), 1 | 0x100)
if fd < 0:
    sys.exit("open_tree: " + os.strerror(ctypes.get_errno()))
if libc.syscall(429, fd, b"", -100, target.encode(), 4) < 0:
    sys.exit("move_mount: " + os.strerror(ctypes.get_errno()))
"#;

/// Promise (1): a parent namespace's `/proc` must be refused even when `/proc/self` itself, the
/// symlink, is covered by a mount of a symlink whose text is `1`: `/proc/self/status` then opens
/// the parent namespace's PID 1's status on `/proc`'s own mount (same device and mount ID), and
/// its `NSpid` is `1`, lockctl's PID as the first process of its new namespace.
///
/// Reproduction (root, `unshare`, python3; 2558c95): `cargo test --test atk13_review --
/// --ignored a_symlink_mounted_over_proc_self_is_refused`. Scene: `unshare -pfm --kill-child
/// --propagation private sh -c SCRIPT`, SCRIPT: `python3 -c MOUNT_LINK 1 /proc/self D` (a symlink
/// `D/link -> 1` mounted over `/proc/self`, not followed), then `exec lockctl exec sl --ttl 5s --
/// touch D/ran` (PID 1 of the new namespace, the parent's `/proc`). Seen: 3 of 3 by the test,
/// 1 of 1 by hand: the command ran and lockctl was still running at the 15 s bound (killed
/// then); expected: exit 1 ("another PID namespace"), nothing in Redis, the command not run. The
/// same scene without the mount is refused (`the_bypass_s_control_is_refused`).
///
/// A fix would have to see the mount on the `self` link too, e.g. open `self/status` under a
/// descriptor of `/proc` with `openat2(RESOLVE_NO_XDEV)` (no mount crossed on the way, kernels
/// from 5.6), or `statx("/proc/self", AT_SYMLINK_NOFOLLOW)` on `/proc`'s mount as well. Opening
/// `/proc/PID/status` by getpid() instead would not do: in the parent's procfs, `/proc/1` is the
/// parent namespace's first process, whose `NSpid` is `1` too.
#[test]
fn a_symlink_mounted_over_proc_self_is_refused() {
    over_the_parent_proc(&format!(
        "python3 -c '{MOUNT_LINK}' 1 /proc/self \"$D\" || exit 99"
    ));
}

/// The same defect with the symlink mounted over the status file instead of over `/proc/self`:
/// `/proc/$O/status` (the shell's entry in the parent's `/proc`; lockctl takes the shell's PID)
/// covered by a symlink `../1/status`, resolved from `/proc/$O` on `/proc`'s own mount. A fix that
/// only looks at the `self` link (`statx` with `AT_SYMLINK_NOFOLLOW`) would not see this one;
/// `openat2(RESOLVE_NO_XDEV)` on `self/status` would.
///
/// Reproduction (2558c95): `cargo test --test atk13_review -- --ignored
/// a_symlink_mounted_over_the_parent_s_status_is_refused`; the scene as above with `O=$(awk
/// '/^PPid/{print $2}' /proc/self/status)` and `python3 -c MOUNT_LINK ../1/status
/// /proc/$O/status D`. Seen: 3 of 3, the command ran and lockctl was still running at the 15 s
/// bound, the key held.
#[test]
fn a_symlink_mounted_over_the_parent_s_status_is_refused() {
    over_the_parent_proc(&format!(
        "O=$(awk '/^PPid/{{print $2}}' /proc/self/status)\npython3 -c '{MOUNT_LINK}' ../1/status \
         /proc/$O/status \"$D\" || exit 99"
    ));
}

/// `python3 NOSTATX PROGRAM ARGS...`: execs PROGRAM (the same PID) under a seccomp filter that
/// fails the system calls numbered in `NOSTATX_NR` (comma-separated) with ENOSYS, as on a kernel
/// without them or under a seccomp profile that lacks them (Docker's lacked `statx` before 18.04).
const NOSTATX: &str = r#"
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
nrs = [int(n) for n in os.environ.pop("NOSTATX_NR").split(",")]
k = len(nrs)
ins = [(0x20, 0, 0, 0)]                                   # A = seccomp_data.nr
ins += [(0x15, k - i, 0, nr) for i, nr in enumerate(nrs)] # A == nr ? to ERRNO
ins += [(0x06, 0, 0, 0x7fff0000),                         # ALLOW
        (0x06, 0, 0, 0x00050000 | 38)]                    # ERRNO(ENOSYS)
prog = b"".join(struct.pack("HBBI", *i) for i in ins)
buf = ctypes.create_string_buffer(prog)
fprog = struct.pack("HxxxxxxQ", len(ins), ctypes.addressof(buf))
fbuf = ctypes.create_string_buffer(fprog)
if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, fbuf, 0, 0) != 0:
    sys.exit("seccomp: " + os.strerror(ctypes.get_errno()))
os.execv(sys.argv[1], sys.argv[1:])
"#;

/// The scene's preparation that makes `$W` run lockctl under [`NOSTATX`] for `statx`.
fn without_statx() -> String {
    without(&[libc::SYS_statx])
}

/// The scene's preparation that makes `$W` run lockctl under [`NOSTATX`] for `calls`.
fn without(calls: &[libc::c_long]) -> String {
    let nrs: Vec<String> = calls.iter().map(|n| n.to_string()).collect();
    format!(
        "cat > \"$D/nostatx.py\" <<'PY'\n{NOSTATX}\nPY\nexport NOSTATX_NR={}\nW=\"python3 $D/nostatx.py\"",
        nrs.join(",")
    )
}

/// Promise (1), where the kernel tells no mount ID (before 5.8) or `statx` is denied: atk11's
/// bind of the parent's own `/proc/1/status` (the same device, `NSpid: 1`) over the shell's entry
/// in the parent's `/proc`, lockctl then PID 1 under a seccomp filter that fails `statx` with
/// ENOSYS. The device alone cannot tell the bind from `/proc`'s own file; root in the namespace
/// can install the filter on any kernel.
///
/// Reproduction (2558c95): `cargo test --test atk13_review -- --ignored
/// a_parent_status_bound_over_a_parent_proc_without_statx_is_refused`. Scene: as
/// `atk11_review::a_parent_status_naming_the_same_pid_bound_over_a_parent_proc_is_refused`, with
/// lockctl exec'd through `python3 NOSTATX` (strace shows its `statx` failing with ENOSYS).
/// Seen (3 of 3): the command ran and lockctl was still running at the 15 s bound, the key held;
/// the same bind with `statx` allowed is refused (atk11's test passes at 2558c95). A check that
/// cannot have a mount ID could refuse a bound file by other means only (`openat2` with
/// `RESOLVE_NO_XDEV`, itself deniable; or refuse outright when neither can be had). Refused
/// since: `self/status` is opened with `openat2`'s `RESOLVE_NO_XDEV` first.
#[test]
fn a_parent_status_bound_over_a_parent_proc_without_statx_is_refused() {
    over_the_parent_proc(&format!(
        "O=$(awk '/^PPid/{{print $2}}' /proc/self/status)\nmount --bind /proc/1/status \
         /proc/$O/status || exit 99\n{}",
        without_statx()
    ));
}

/// The known limit that remains (docs/guarantees.md): with neither `openat2` nor `statx` (kernels
/// before 5.6 lack the first and, before 5.8, the mount ID; root can deny both with a seccomp
/// filter), the device alone cannot tell a bind of the same procfs from `/proc`'s own file, and
/// the scene above passes the check: the command runs on the parent's `/proc`.
///
/// Reproduction: `cargo test --test atk13_review -- --ignored
/// a_parent_status_bound_without_openat2_and_statx_is_refused`.
#[test]
#[ignore = "known limit (docs/guarantees.md): without openat2 and statx, a bind of the same procfs over lockctl's status entry passes the /proc check"]
fn a_parent_status_bound_without_openat2_and_statx_is_refused() {
    over_the_parent_proc(&format!(
        "O=$(awk '/^PPid/{{print $2}}' /proc/self/status)\nmount --bind /proc/1/status \
         /proc/$O/status || exit 99\n{}",
        without(&[libc::SYS_statx, libc::SYS_openat2])
    ));
}

/// Promise (4) on the fallback (no `openat2`, as before Linux 5.6): a PID 1 lockctl on its own
/// procfs, masked as Docker masks it, runs its command (exit 7, released).
#[test]
fn without_openat2_a_pid1_lockctl_on_a_docker_masked_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    need_tool("python3", "--version");
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |d| {
            format!(
                "D={}\n{DOCKER_MASKS}\n{}",
                d.display(),
                without(&[libc::SYS_openat2])
            )
        },
        "exec $W",
        "ns1",
    );
}

/// The control: the same filter without the bind is refused.
#[test]
fn without_statx_the_parent_s_proc_is_refused() {
    over_the_parent_proc(&without_statx());
}

/// Promise (4) without `statx` (the device-only fallback): a PID 1 lockctl on its own procfs,
/// masked as Docker masks it, under the same filter, runs its command (exit 7, released).
#[test]
fn without_statx_a_pid1_lockctl_on_a_docker_masked_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    need_tool("python3", "--version");
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |d| format!("D={}\n{DOCKER_MASKS}\n{}", d.display(), without_statx()),
        "exec $W",
        "ns1",
    );
}

/// The control of the scene above: the same namespace and command, nothing mounted, is refused
/// (exit 1, nothing in Redis, the command not run).
#[test]
fn the_bypass_s_control_is_refused() {
    over_the_parent_proc("true");
}

/// Root in a new PID and mount namespace without its own `/proc` (`unshare -pfm --propagation
/// private`) runs `prep` (`$D` is a scratch directory), then execs `$W lockctl exec sl --ttl 5s
/// -- touch $D/ran` as the namespace's PID 1 (`$W`, empty unless `prep` sets it, a wrapper that
/// execs its arguments). lockctl must refuse: exit 1, nothing in Redis, the
/// command not run.
fn over_the_parent_proc(prep: &str) {
    if !watchers::as_root() {
        return;
    }
    need_tool("python3", "--version");
    let s = Server::start();
    let d = s.dir().join("scene");
    std::fs::create_dir_all(&d).unwrap();
    let ran = d.join("ran");
    let out = watchers::ns_script(
        &s.url(),
        &[
            "unshare",
            "-pfm",
            "--kill-child",
            "--propagation",
            "private",
        ],
        &format!(
            r#"D={d}
W=
{prep}
exec $W "$1" exec sl --ttl 5s -- touch "$D/ran""#,
            d = d.display()
        ),
        Duration::from_secs(15),
    );
    let status = out.status.code();
    assert_ne!(status, Some(99), "the scene: {}", stderr(&out));
    assert!(
        !ran.exists(),
        "the command ran on the parent's /proc (lockctl: {status:?}, None: still running at the \
         15 s bound); keys {:?}; {}",
        s.keys(),
        stderr(&out)
    );
    assert_eq!(status, Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another PID namespace"),
        "{}",
        stderr(&out)
    );
    assert!(s.keys().is_empty(), "wrote to Redis: {:?}", s.keys());
}

/// Runs `PRE... sh -c "SCRIPT; LAUNCH lockctl exec NAME --ttl 10s -- sh -c 'exit 7'"` (SCRIPT
/// given the server's scratch directory, under `set -e`; LAUNCH e.g. `exec setpriv ...`) and
/// asserts promise (4): the command ran (exit 7) and the lock was released.
fn runs_there(pre: &[&str], script: impl Fn(&std::path::Path) -> String, launch: &str, name: &str) {
    let s = Server::start_tcp();
    let d = s.dir().join("scene");
    std::fs::create_dir_all(&d).unwrap();
    let out = watchers::ns_script(
        &s.url(),
        pre,
        &format!(
            "set -e\n{}\nset +e\n{launch} \"$1\" exec {name} --ttl 10s -- sh -c 'exit 7'",
            script(&d)
        ),
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(
        s.get(&format!("lockctl:{name}")),
        None,
        "the lock was not released"
    );
}

/// Docker's masks of its own procfs, as `runc` makes them: `/dev/null` bound over `/proc/kcore`,
/// `/proc/keys`, `/proc/timer_list`, `/proc/latency_stats`, `/proc/sched_debug`, a read-only
/// tmpfs over `/proc/acpi` and `/proc/scsi`, and `/proc/bus`, `/proc/fs`, `/proc/irq`,
/// `/proc/sys`, `/proc/sysrq-trigger` bound over themselves read-only (those that exist here).
const DOCKER_MASKS: &str = r#"for f in kcore keys timer_list latency_stats sched_debug; do
  [ -e /proc/$f ] && mount --bind /dev/null /proc/$f
done
for d in acpi scsi; do
  [ -d /proc/$d ] && mount -t tmpfs -o ro tmpfs /proc/$d
done
for p in bus fs irq sys sysrq-trigger; do
  [ -e /proc/$p ] && mount --bind /proc/$p /proc/$p && mount -o remount,bind,ro /proc/$p
done
true"#;

/// lxcfs's binds over its own procfs's files (here copies of the files in a tmpfs, as lxcfs's
/// FUSE files are of another filesystem): `cpuinfo`, `diskstats`, `loadavg`, `meminfo`, `stat`,
/// `swaps`, `uptime`, `slabinfo`.
fn lxcfs_binds(d: &std::path::Path) -> String {
    format!(
        r#"mkdir -p {d}/lxcfs && mount -t tmpfs lxcfs {d}/lxcfs
for f in cpuinfo diskstats loadavg meminfo stat swaps uptime slabinfo; do
  [ -e /proc/$f ] || continue
  cat /proc/$f > {d}/lxcfs/$f 2>/dev/null || true
  mount --bind {d}/lxcfs/$f /proc/$f
done
true"#,
        d = d.display()
    )
}

/// Promise (4): a container's first process with its own `/proc`, masked as Docker masks it, and
/// lxcfs's files bound over it: lockctl (PID 1) runs its command, exit 7, released.
#[test]
fn a_pid1_lockctl_on_a_docker_masked_lxcfs_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |d| format!("{DOCKER_MASKS}\n{}", lxcfs_binds(d)),
        "exec",
        "dm1",
    );
}

/// Promise (4): the same `/proc` (Docker's masks, lxcfs's binds) with lockctl not PID 1 (a shell
/// is the first process), as a non-root user (uid 65534) on a `hidepid=2` procfs.
#[test]
fn a_non_root_lockctl_on_a_masked_hidepid_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    need_tool("setpriv", "--version");
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |d| {
            format!(
                "mount -o remount,hidepid=2 /proc\n{DOCKER_MASKS}\n{}",
                lxcfs_binds(d)
            )
        },
        "setpriv --reuid 65534 --regid 65534 --clear-groups",
        "dm2",
    );
}

/// Promise (4): `/proc` as a bind mount of a procfs (`mount --bind /proc X; mount --bind X
/// /proc` in a mount namespace of its own), lockctl not in a PID namespace of its own.
#[test]
fn a_lockctl_on_a_proc_that_is_a_bind_of_a_procfs_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    runs_there(
        &["unshare", "-m", "--propagation", "private"],
        |d| {
            format!(
            "mkdir -p {d}/x && mount --bind /proc {d}/x && mount --bind {d}/x /proc && umount -l \
             {d}/x",
            d = d.display()
        )
        },
        "exec",
        "bp1",
    );
}

/// Promise (4): the same bind with lockctl as the first process of its PID namespace, its own
/// procfs bound twice over and the bind then made read-only (`mount -o remount,bind,ro /proc`).
#[test]
fn a_pid1_lockctl_on_a_read_only_bind_of_its_procfs_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |d| {
            format!(
            "mkdir -p {d}/x && mount --bind /proc {d}/x && mount --bind {d}/x /proc && umount -l \
             {d}/x && mount -o remount,bind,ro /proc",
            d = d.display()
        )
        },
        "exec",
        "bp2",
    );
}

/// Promise (4): a build chroot, `/` bound recursively (`mount --rbind / R`, `/proc` with it) and
/// lockctl run in `chroot R`, in a mount namespace of its own.
#[test]
fn a_chrooted_lockctl_on_an_rbind_of_proc_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    let s = Server::start_tcp();
    let r = s.dir().join("root");
    std::fs::create_dir_all(&r).unwrap();
    let out = watchers::ns_script(
        &s.url(),
        &["unshare", "-m", "--propagation", "private"],
        &format!(
            "mount --rbind / {r} || exit 99\nexec chroot {r} \"$1\" exec cr --ttl 10s -- sh -c \
             'exit 7'",
            r = r.display()
        ),
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(s.get("lockctl:cr"), None, "the lock was not released");
}

/// Promise (4): a second procfs of lockctl's namespace mounted on top of the first at `/proc`
/// (`mount -t proc proc /proc` again, as a container's init may do), with a bind of `/dev/null`
/// over one file of the lower one; lockctl PID 1.
#[test]
fn a_pid1_lockctl_on_a_procfs_stacked_on_its_procfs_runs_its_command() {
    if !watchers::as_root() {
        return;
    }
    runs_there(
        &["unshare", "-pfm", "--kill-child", "--mount-proc"],
        |_| "mount --bind /dev/null /proc/kcore && mount -t proc -o hidepid=2 proc /proc".into(),
        "exec",
        "st1",
    );
}

/// lockctl under `strace -f -b execve -o /dev/null STRACE...` running `exec NAME --ttl 20s -- PROGRAM`
/// against `s`, its stderr in `err`, up to the moment its command's first process (lockctl's child
/// that is not its watcher) is held in the system call numbered `syscall`. Returns strace (whose
/// exit is lockctl's), lockctl's PID, its watcher's and the first process's.
fn held_start(
    s: &Server,
    strace: &[&str],
    name: &str,
    program: &[&std::ffi::OsStr],
    syscall: libc::c_long,
    err: &std::path::Path,
) -> (Started, i32, i32, i32) {
    need_tool("strace", "-V");
    let mut cmd = std::process::Command::new("strace");
    // `-b execve`: each process is let go at its exec, the watcher (`lockctl-guard`) included, so
    // that a SIGSTOP stops it as it would outside strace (traced, it sits at a tracer's stop that
    // only strace ends, and strace waits for it).
    cmd.args(["-f", "-b", "execve", "-o", "/dev/null"])
        .args(strace)
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .args(["exec", name, "--ttl", "20s", "--"])
        .args(program)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(err).unwrap());
    let child = Started(Some(cmd.spawn().expect("strace")));
    let strace = child.id() as i32;
    let lockctl = traced_lockctl(strace);
    let mut found = Vec::new();
    let one = eventually(Duration::from_secs(30), || {
        found = watchers_of(lockctl as u32);
        found.len() == 1
            && std::fs::read_to_string(format!("/proc/{}/comm", found[0]))
                .is_ok_and(|c| c.trim() == "lockctl-guard")
    });
    assert!(
        one,
        "lockctl {lockctl} has no one watcher ({found:?}); it said: {}; tree: {}",
        std::fs::read_to_string(err).unwrap_or_default(),
        tree(lockctl)
    );
    let watcher = found[0];
    let mut first = 0;
    let held = eventually(Duration::from_secs(20), || {
        first = children_of(lockctl)
            .into_iter()
            .find(|&p| p != watcher)
            .unwrap_or(0);
        first > 0
            && std::fs::read_to_string(format!("/proc/{first}/syscall"))
                .is_ok_and(|s| s.split_whitespace().next() == Some(&syscall.to_string()))
    });
    assert!(
        held,
        "the command's first process was not seen in syscall {syscall}"
    );
    (child, lockctl, watcher, first)
}

/// `pid` and its children, each with its state and command line, for a failure's message.
fn tree(pid: i32) -> String {
    let show = |p: i32| {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").trim().chars().next();
        let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
        let wchan = std::fs::read_to_string(format!("/proc/{p}/syscall")).unwrap_or_default();
        format!(
            "{p} {state:?} {:?} syscall {}",
            String::from_utf8_lossy(&cmd),
            wchan.split_whitespace().next().unwrap_or("")
        )
    };
    let mut out = vec![show(pid)];
    out.extend(children_of(pid).into_iter().map(show));
    out.join("; ")
}

/// `D/job`: a script that touches `D/ran` and then sleeps 30 s (`exec sleep 30`, the same PID).
fn job_script(d: &std::path::Path) -> std::path::PathBuf {
    let job = d.join("job");
    std::fs::write(
        &job,
        format!("#!/bin/sh\ntouch {}/ran\nexec sleep 30\n", d.display()),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&job, std::fs::Permissions::from_mode(0o755)).unwrap();
    job
}

/// The scene of the tests below: the command's first process is held (strace: at the entry of its
/// `execve` of JOB, or of its first call `how` otherwise; `syscall` is its number) after or before
/// it announced its group, the watcher gets `signal` then, and lockctl is let
/// run. Promise (2): either the command did not run (exit 1 or 76), or it ran and was stopped
/// because its watcher is gone or stopped (exit 76); either way the lock is released, the job's
/// process is gone, and no watcher is left.
fn watcher_hit_in_the_start(how: &str, syscall: libc::c_long, signal: i32) {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let job = job_script(&d);
    let err = d.join("err");
    let strace: Vec<String> = match how {
        "execve" => [
            "-P",
            job.to_str().unwrap(),
            "-e",
            "trace=execve",
            "-e",
            "inject=execve:delay_enter=3000000",
        ]
        .map(String::from)
        .to_vec(),
        call => vec![
            "-e".to_string(),
            format!("trace={call}"),
            "-e".to_string(),
            format!("inject={call}:delay_enter=3000000:when=1"),
        ],
    };
    let strace: Vec<&str> = strace.iter().map(String::as_str).collect();
    let (child, lockctl, watcher, first) =
        held_start(&s, &strace, "hit", &[job.as_os_str()], syscall, &err);
    kill(watcher, signal);
    let out = child.output(Duration::from_secs(30));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let ran = d.join("ran").exists();
    let job_alive = alive(first);
    if job_alive {
        kill(first, libc::SIGKILL);
    }
    let status = out.status.code();
    eprintln!("status {status:?}, ran {ran}: {errs}");
    assert!(
        !job_alive,
        "the job's process outlived lockctl ({status:?}): {errs}"
    );
    assert!(
        status == Some(76) || (status == Some(1) && !ran),
        "lockctl: {status:?}, the command ran: {ran}: {errs}"
    );
    assert!(errs.contains("watcher process (lockctl-guard)"), "{errs}");
    assert_eq!(s.get("lockctl:hit"), None, "the lock was kept: {errs}");
    // A stopped watcher is lockctl's to resume before it exits (docs/guarantees.md); the test
    // resumes it only if it is left, and fails then.
    let gone = eventually(Duration::from_secs(20), || {
        watchers_of(lockctl as u32).is_empty()
    });
    if !gone {
        kill(watcher, libc::SIGCONT);
    }
    assert!(gone, "a watcher outlived its lockctl");
}

/// Promise (2): the watcher killed after the command's first process told it its group, while
/// that process is held at the entry of its `execve` (strace `-P JOB -e
/// inject=execve:delay_enter=3s`).
#[test]
fn a_watcher_killed_while_the_command_s_exec_is_held_stops_the_job() {
    watcher_hit_in_the_start("execve", libc::SYS_execve, libc::SIGKILL);
}

/// Promise (2): the watcher stopped (SIGSTOP) at the same moment.
#[test]
fn a_watcher_stopped_while_the_command_s_exec_is_held_stops_the_job() {
    watcher_hit_in_the_start("execve", libc::SYS_execve, libc::SIGSTOP);
}

/// Promise (2): the watcher stopped (SIGSTOP) before the command's first process told it its
/// group (held in `getppid`, its check that lockctl lives): the announcement fits in the pipe, the
/// command runs, and lockctl sees the stopped watcher.
#[test]
fn a_watcher_stopped_before_the_announcement_stops_the_job() {
    watcher_hit_in_the_start("getppid", libc::SYS_getppid, libc::SIGSTOP);
}

/// Promise (3): a command that cannot be found, its watcher killed while the first process is
/// held before it told the watcher its group: the start stops at the announcement (the watcher's
/// message, exit 1, the lock released), before any exec; the same command with the watcher alive
/// still gives 127 (`exec.rs`).
#[test]
fn a_missing_command_whose_watcher_was_killed_before_the_announcement_says_so() {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let err = d.join("err");
    let missing = d.join("no-such-command");
    let (child, lockctl, watcher, _) = held_start(
        &s,
        &[
            "-e",
            "trace=getppid",
            "-e",
            "inject=getppid:delay_enter=2000000:when=1",
        ],
        "nf",
        &[missing.as_os_str()],
        libc::SYS_getppid,
        &err,
    );
    kill(watcher, libc::SIGKILL);
    let out = child.output(Duration::from_secs(30));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    assert_eq!(code(&out), 1, "{errs}");
    assert!(
        errs.contains("watcher process (lockctl-guard) is gone") && errs.contains("did not run"),
        "{errs}"
    );
    assert_eq!(s.get("lockctl:nf"), None, "the lock was kept: {errs}");
    assert!(
        eventually(Duration::from_secs(20), || watchers_of(lockctl as u32)
            .is_empty()),
        "a watcher outlived its lockctl"
    );
}

/// Promise (3): a command whose exec fails with EPIPE while its watcher is alive must be reported
/// as that failure (126, "cannot run ...: Broken pipe"), not as a watcher that is gone: `EPIPE`
/// is not only the announcement's. An exec can return it: a file on a FUSE file system whose
/// server answers the open with `EPIPE` (FUSE passes any errno below 512 through); here strace
/// makes the command's `execve` fail so (`-P JOB -e inject=execve:error=EPIPE`).
///
/// Reproduction (2558c95): `cargo test --test atk13_review -- --ignored
/// an_exec_failing_with_epipe_is_not_taken_for_a_gone_watcher`. Seen (3 of 3): exit 1 and
/// "cannot run JOB: its watcher process (lockctl-guard) is gone, so the command could outlive
/// lockctl; the command did not run and the lock was released", with no signal to the watcher;
/// expected: 126 and the exec's error. The lock is released and the command does not run either
/// way: only the message and the code are wrong. The child could tell the two apart (a flag in
/// its plan set when the announcement fails) instead of reading one errno as the other.
#[test]
fn an_exec_failing_with_epipe_is_not_taken_for_a_gone_watcher() {
    need_tool("strace", "-V");
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let job = job_script(&d);
    let mut cmd = std::process::Command::new("strace");
    cmd.args(["-f", "-b", "execve", "-o", "/dev/null", "-P"])
        .arg(&job)
        .args(["-e", "trace=execve", "-e", "inject=execve:error=EPIPE"])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .args(["exec", "ep", "--ttl", "20s", "--"])
        .arg(&job)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null());
    let out = run(&mut cmd);
    let errs = stderr(&out);
    assert!(!d.join("ran").exists(), "the command ran: {errs}");
    assert_eq!(s.get("lockctl:ep"), None, "the lock was kept: {errs}");
    assert!(!errs.contains("is gone"), "{errs}");
    assert_eq!(code(&out), 126, "{errs}");
    assert!(errs.contains("Broken pipe"), "{errs}");
}

/// The scene of the two tests below: lockctl itself is held after its watcher was found ready and
/// before the command's spawn, in `prctl(PR_SET_CHILD_SUBREAPER)` (its second `prctl`; strace
/// `-e inject=prctl:delay_enter=3s:when=2`, which its other threads, with one `prctl` each, do not
/// reach), and its watcher gets `signal`. Promise (2): the command does not run (exit 1), or it
/// runs and is stopped (exit 76); the lock is released, no job process or watcher is left.
fn watcher_hit_while_lockctl_becomes_a_subreaper(signal: i32) {
    need_tool("strace", "-V");
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let job = job_script(&d);
    let err = d.join("err");
    let mut cmd = std::process::Command::new("strace");
    cmd.args(["-f", "-b", "execve", "-o", "/dev/null"])
        .args([
            "-e",
            "trace=prctl",
            "-e",
            "inject=prctl:delay_enter=3000000:when=2",
        ])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .args(["exec", "sr", "--ttl", "20s", "--"])
        .arg(&job)
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap());
    let child = Started(Some(cmd.spawn().expect("strace")));
    let strace = child.id() as i32;
    let lockctl = traced_lockctl(strace);
    let held = eventually(Duration::from_secs(20), || {
        std::fs::read_to_string(format!("/proc/{lockctl}/syscall")).is_ok_and(|s| {
            let mut f = s.split_whitespace();
            f.next() == Some(&libc::SYS_prctl.to_string()) && f.next() == Some("0x24")
        })
    });
    if !held {
        let at = std::fs::read_to_string(format!("/proc/{lockctl}/syscall"));
        let out = child.output(Duration::from_secs(30));
        panic!(
            "lockctl was not seen in prctl(PR_SET_CHILD_SUBREAPER) (its syscall at the end: \
             {at:?}); it ended {:?}: {}",
            out.status,
            std::fs::read_to_string(&err).unwrap_or_default()
        );
    }
    let watcher = watcher_of(lockctl as u32);
    kill(watcher, signal);
    let out = child.output(Duration::from_secs(30));
    let errs = std::fs::read_to_string(&err).unwrap_or_default();
    let ran = d.join("ran").exists();
    let status = out.status.code();
    eprintln!("status {status:?}, ran {ran}: {errs}");
    assert!(
        status == Some(76) || (status == Some(1) && !ran),
        "lockctl: {status:?}, the command ran: {ran}: {errs}"
    );
    assert!(errs.contains("watcher process (lockctl-guard)"), "{errs}");
    assert_eq!(s.get("lockctl:sr"), None, "the lock was kept: {errs}");
    let gone = eventually(Duration::from_secs(20), || {
        watchers_of(lockctl as u32).is_empty()
    });
    if !gone {
        kill(watcher, libc::SIGCONT);
    }
    assert!(gone, "a watcher outlived its lockctl");
}

/// Promise (2): the watcher killed while lockctl is held before the spawn.
#[test]
fn a_watcher_killed_while_lockctl_becomes_a_subreaper_stops_the_start() {
    watcher_hit_while_lockctl_becomes_a_subreaper(libc::SIGKILL);
}

/// Promise (2): the watcher stopped while lockctl is held before the spawn.
#[test]
fn a_watcher_stopped_while_lockctl_becomes_a_subreaper_stops_the_job() {
    watcher_hit_while_lockctl_becomes_a_subreaper(libc::SIGSTOP);
}

/// Promise (2) for a PID 1 lockctl, whose watcher is its own child: lockctl waits for a lock
/// another client holds, strace attaches to it from outside (`strace -f -b execve -p PID -e
/// inject=getppid:delay_enter=3s:when=1`), the lock is released, the command's first process is
/// held in `getppid` before its announcement, and the watcher is killed. Expected: exit 1, the
/// watcher's message, the command not run, the lock released.
#[test]
fn a_pid1_lockctl_whose_watcher_was_killed_before_the_announcement_stops_the_start() {
    if !watchers::as_root() {
        return;
    }
    need_tool("strace", "-V");
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let job = job_script(&d);
    let err = d.join("err");
    let held = acquire_json(&mut lockctl_on(&s), "p1", &["--ttl", "60s"]);
    let token = held["token"].as_str().unwrap().to_string();
    let job_arg = job.to_str().unwrap();
    let (ns, lockctl) = pid1_lockctl(&s, &["exec", "p1", "--ttl", "20s", "--", job_arg], &err);
    let errs = || std::fs::read_to_string(&err).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(20), || errs()
            .contains("waiting for lock")),
        "{}",
        errs()
    );
    let trace_err = d.join("strace-err");
    let mut strace = std::process::Command::new("strace")
        .args([
            "-f",
            "-b",
            "execve",
            "-o",
            "/dev/null",
            "-e",
            "trace=getppid",
        ])
        .args(["-e", "inject=getppid:delay_enter=3000000:when=1", "-p"])
        .arg(lockctl.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&trace_err).unwrap())
        .spawn()
        .map(|c| Started(Some(c)))
        .unwrap();
    // Every thread of lockctl attached (strace -p attaches each), the spawning one included.
    let traced = |status: &str| {
        status
            .lines()
            .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
    };
    assert!(
        eventually(Duration::from_secs(20), || {
            std::fs::read_dir(format!("/proc/{lockctl}/task")).is_ok_and(|tasks| {
                tasks.flatten().all(|t| {
                    std::fs::read_to_string(t.path().join("status")).is_ok_and(|st| traced(&st))
                })
            })
        }),
        "strace did not attach: {}",
        std::fs::read_to_string(&trace_err).unwrap_or_default()
    );
    let o = run(lockctl_on(&s).args(["release", "p1", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut watcher = 0;
    let mut first = 0;
    let seen = eventually(Duration::from_secs(20), || {
        for c in children_of(lockctl) {
            let comm = std::fs::read_to_string(format!("/proc/{c}/comm")).unwrap_or_default();
            if comm.trim() == "lockctl-guard" {
                watcher = c;
            } else if std::fs::read_to_string(format!("/proc/{c}/syscall"))
                .is_ok_and(|s| s.split_whitespace().next() == Some(&libc::SYS_getppid.to_string()))
            {
                first = c;
            }
        }
        watcher > 0 && first > 0
    });
    assert!(seen, "watcher {watcher}, first process {first}: {}", errs());
    kill(watcher, libc::SIGKILL);
    let out = ns.output(Duration::from_secs(30));
    strace.stop();
    let ran = d.join("ran").exists();
    assert!(!ran, "the command ran: {:?} {}", out.status, errs());
    assert_eq!(out.status.code(), Some(1), "{}", errs());
    assert!(
        errs().contains("watcher process (lockctl-guard) is gone"),
        "{}",
        errs()
    );
    assert_eq!(s.get("lockctl:p1"), None, "the lock was kept: {}", errs());
}

/// Promise (2), the edge of the documented limit "lockctl and its watcher both killed within the
/// same instant": here both are killed *before* the command's exec, at some distance (the
/// watcher first, then lockctl), while the first process is held at the entry of its `execve`
/// after its announcement (strace `-P JOB -e inject=execve:delay_enter=3s`). The exec then goes
/// on and the command starts with neither process alive: nothing guards it, and the key stays
/// until its TTL runs out (another client may then take the lock while it runs).
///
/// Reproduction (2558c95): `cargo test --test atk13_review -- --ignored
/// a_command_whose_lockctl_and_watcher_died_before_its_exec_does_not_run`. Seen (3 of 3 by the
/// test, 1 of 1 by hand): `D/ran` written and the job's process (`sleep 30`) alive once it was
/// (by hand: still there 2 s later, init its parent, the key still held); expected: the command not run (or killed within seconds). The first
/// process checks that lockctl lives only before its announcement (`getppid`); a check after it
/// would narrow the moment to the `execve` itself, which a hold at its entry, as here, still
/// spans; only a guard that survives the exec (a parent-death signal) covers that.
#[test]
#[ignore = "edge of a documented limit at 2558c95: lockctl and its watcher both SIGKILLed while the first process is held at its execve; the command starts unguarded (3 of 3)"]
fn a_command_whose_lockctl_and_watcher_died_before_its_exec_does_not_run() {
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let job = job_script(&d);
    let err = d.join("err");
    let strace = [
        "-P",
        job.to_str().unwrap(),
        "-e",
        "trace=execve",
        "-e",
        "inject=execve:delay_enter=3000000",
    ];
    let (child, lockctl, watcher, first) = held_start(
        &s,
        &strace,
        "both",
        &[job.as_os_str()],
        libc::SYS_execve,
        &err,
    );
    kill(watcher, libc::SIGKILL);
    assert!(
        eventually(Duration::from_secs(10), || !alive(watcher)),
        "the watcher did not die"
    );
    kill(lockctl, libc::SIGKILL);
    let _ = child.output(Duration::from_secs(30));
    // The hold ends 3 s after it began; the job's process is then the command, or gone.
    let started = eventually(Duration::from_secs(10), || d.join("ran").exists());
    let job_alive = alive(first);
    if job_alive {
        kill(first, libc::SIGKILL);
    }
    assert!(
        !started && !job_alive,
        "the command started after lockctl and its watcher died (ran {started}, its process \
         alive {job_alive})"
    );
}
