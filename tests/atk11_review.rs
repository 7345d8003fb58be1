//! A review of 643e4e3 (`check_proc` reads `/proc/self/status`'s `NSpid`; a child subreaper
//! without `/proc` is refused too).
//!
//! What broke (ignored failing test, reproduction in its doc comment):
//! - `/proc/self/status` can be covered by a bind mount before lockctl starts: root in a new PID
//!   and mount namespace without its own `/proc` binds the status file of its shell from a procfs
//!   of its own namespace (mounted elsewhere, then lazily unmounted) over its entry in the
//!   parent's `/proc`, then execs lockctl (same PID): `NSpid` reads one PID, lockctl's, the check
//!   passes on the parent namespace's `/proc`, the command runs, and lockctl did not exit after
//!   it (the test: 3 of 3, still running at its 15 s bound, the key held; by hand: still there
//!   16 minutes later).
//!   `a_status_bound_over_a_parent_proc_is_refused`.
//!
//! What held (tests here, in the suite): two nested PID namespaces each with its own `/proc`
//! (lockctl not PID 1); a non-root user in a user and PID namespace with its own `/proc`.
//! Tried by hand, no test: `lockctl exec` inside `lockctl exec` (also in a PID namespace),
//! lockctl as uid 65534, a non-PID-1 lockctl on a `subset=pid` procfs, two levels with lockctl
//! PID 1 of the inner one: all ran their command (exit 7). `unshare -p` without `--fork`
//! (lockctl's children in another PID namespace than its own): exit 1, nothing in Redis, but the
//! message is only "cannot install signal handlers: Invalid argument (os error 22)".

mod support;

use std::time::Duration;

use support::watchers::Started;
use support::*;

fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: no namespace of the test's own; skipped");
        return false;
    }
    need_tool("unshare", "--version");
    true
}

/// Runs `unshare ARGS sh -c SCRIPT ns LOCKCTL` with the server's URL; output within `limit`.
fn ns_script(url: &str, pre: &[&str], script: &str, limit: Duration) -> std::process::Output {
    let child = std::process::Command::new(pre[0])
        .args(&pre[1..])
        .args(["sh", "-c", script, "ns"])
        .arg(env!("CARGO_BIN_EXE_lockctl"))
        .env("LOCKCTL_REDIS", url)
        .env("LOCKCTL_QUARANTINE", "0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    Started(Some(child)).output(limit)
}

/// Promise (3): two nested PID namespaces, each with its own `/proc`
/// (`unshare -pf --mount-proc` twice); lockctl, not PID 1 of the inner one, runs its command and
/// exits with its code, the lock released.
#[test]
fn two_nested_namespaces_with_their_own_proc_run_the_command() {
    if !root() {
        return;
    }
    let s = Server::start();
    let out = ns_script(
        &s.url(),
        &[
            "unshare",
            "-pf",
            "--kill-child",
            "--mount-proc",
            "unshare",
            "-pf",
            "--kill-child",
            "--mount-proc",
        ],
        r#""$1" exec n2 --ttl 10s -- sh -c 'exit 7'; exit $?"#,
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(s.get("lockctl:n2"), None, "the lock was not released");
}

/// Promise (3): a non-root user (uid 65534, `setpriv`) in a user and PID namespace of its own
/// with its own `/proc` (`unshare -Urpf --mount-proc`) runs its command, exit 7, released.
#[test]
fn a_non_root_user_in_its_own_user_and_pid_namespace_runs_the_command() {
    if !root() {
        return;
    }
    need_tool("setpriv", "--version");
    let s = Server::start_tcp();
    let out = ns_script(
        &s.url(),
        &[
            "setpriv",
            "--reuid",
            "65534",
            "--regid",
            "65534",
            "--clear-groups",
            "unshare",
            "-Urpf",
            "--mount-proc",
        ],
        r#"exec "$1" exec nu --ttl 10s -- sh -c 'exit 7'"#,
        Duration::from_secs(20),
    );
    assert_eq!(code(&out), 7, "{}", stderr(&out));
    assert_eq!(s.get("lockctl:nu"), None, "the lock was not released");
}

/// Promise (1): a parent namespace's `/proc` must be refused even when `/proc/self/status` was
/// covered beforehand by a bind mount of the same process's status from a procfs of its own
/// namespace (so `NSpid` names one PID, lockctl's).
///
/// Reproduction (root, `unshare`; 643e4e3): `cargo test --test atk11_review -- --ignored
/// a_status_bound_over_a_parent_proc_is_refused`. Scene: `unshare -pfm --kill-child
/// --propagation private sh -c SCRIPT`, SCRIPT: `O=$(awk '/^PPid/{print $2}' /proc/self/status)`
/// (the shell's PID in the parent's `/proc`), `mount -t proc proc D/p`, `mount --bind
/// D/p/$$/status /proc/$O/status`, `umount -l D/p`, `exec lockctl exec ab --ttl 5s -- touch
/// D/ran`. Seen (3 of 3 by the test, 1 of 1 by hand): the command ran and lockctl was still
/// running at the 15 s bound (by hand: 16 minutes later), the key held; expected: exit 1,
/// nothing in Redis, the command not run.
#[test]
#[ignore = "643e4e3: a status file bound over the parent's /proc/self/status passes check_proc"]
fn a_status_bound_over_a_parent_proc_is_refused() {
    if !root() {
        return;
    }
    let s = Server::start();
    let d = s.dir().to_path_buf();
    let p = d.join("p");
    std::fs::create_dir_all(&p).unwrap();
    let ran = d.join("ran");
    let out = ns_script(
        &s.url(),
        &[
            "unshare",
            "-pfm",
            "--kill-child",
            "--propagation",
            "private",
        ],
        &format!(
            r#"O=$(awk '/^PPid/{{print $2}}' /proc/self/status)
mount -t proc proc {p} && mount --bind {p}/$$/status /proc/$O/status && umount -l {p} || exit 99
exec "$1" exec ab --ttl 5s -- touch {ran}"#,
            p = p.display(),
            ran = ran.display()
        ),
        Duration::from_secs(15),
    );
    let status = out.status.code();
    assert_ne!(status, Some(99), "the scene: {}", stderr(&out));
    assert!(
        !ran.exists(),
        "the command ran on the parent's /proc (lockctl: {status:?}, None: still running at the \
         15 s bound); keys {:?}",
        s.keys()
    );
    assert_eq!(status, Some(1), "{}", stderr(&out));
    assert!(s.keys().is_empty(), "wrote to Redis: {:?}", s.keys());
}
