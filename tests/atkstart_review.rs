//! Adversarial review of 84987b3 (the one-subcommand parse), 6c6c089 (empty variables, CPU
//! features), d041225 (`#![no_main]` start-up) and ab9b8bd (a new connection's `INFO` by
//! sections).
//!
//! The first two tests are the defects found: each failed on ab9b8bd (3 of 3 runs) and passes
//! since the fix (every check of a new connection reads the same three sections; the C `main`
//! catches a panic). Tests named `held_` are attacks that held, kept as cheap checks.

mod support;

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::Stdio;
use std::time::Duration;

use support::*;

const PW: &str = "S3ctionsOnlyPw";

/// A user allowed `INFO` with exactly the three sections a new connection's check asks for
/// (ACL first-argument rules), and not `INFO` with its default sections.
fn sections_only_user(s: &Server) -> String {
    let ok: String = s.cmd(&[
        "ACL",
        "SETUSER",
        "sections",
        "reset",
        "on",
        &format!(">{PW}"),
        "~*",
        "&*",
        "+@all",
        "-info",
        "+info|server",
        "+info|replication",
        "+info|cluster",
    ]);
    assert_eq!(ok, "OK");
    format!("unix://{}?user=sections&pass={PW}", s.socket().display())
}

/// ab9b8bd: a connection's check sends `INFO server`, `INFO replication`, `INFO cluster`; other
/// paths (`list`'s scan, `doctor`) still send a plain `INFO`. An ACL user allowed the three
/// sections but not plain `INFO` was refused by every command at 9c66996 (78: "an ACL without a
/// command lockctl needs"); at ab9b8bd acquire, renew, release, status, exec and break work on it,
/// while `list` exits 78 and `doctor` reports "every lock fails until then". One node's
/// configuration is either refused or not: the commands must agree.
#[test]
fn a_user_allowed_only_the_checked_info_sections_gets_one_answer_from_every_command() {
    let s = Server::start();
    let url = sections_only_user(&s);
    let acquire = run(lockctl().args(["-r", &url, "acquire", "sect", "-n"]));
    let list = run(lockctl().args(["-r", &url, "list"]));
    let doctor = run(lockctl().args(["-r", &url, "doctor"]));
    assert_eq!(
        code(&acquire),
        code(&list),
        "acquire and list disagree on one node's ACL: acquire exit {} ({}), list exit {} ({}); \
         doctor exit {}: {}",
        code(&acquire),
        stderr(&acquire).trim(),
        code(&list),
        stderr(&list).trim(),
        code(&doctor),
        stdout(&doctor)
            .lines()
            .filter(|l| l.contains("fail"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
}

/// d041225: a panic of the main thread no longer goes through the standard library's start-up,
/// which caught it and exited 101. In a build that unwinds (the test profile, which every test
/// here runs), it now unwinds into the C `main` and aborts ("failed to initiate panic", SIGABRT).
/// In every build the message names the thread '<unnamed>' instead of 'main'. The release
/// profile aborts on panic anyway (same status, SIGABRT, before and after).
/// Reproduction: `lockctl --lockctl-guard 2>/dev/full` (the guard's usage line is an `eprintln!`,
/// which panics on a failed write).
#[test]
fn a_panic_of_the_main_thread_exits_101() {
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = lockctl()
        .arg("--lockctl-guard")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(full))
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(101),
        "a panic in main: {:?} (signal {:?})",
        o.status,
        o.status.signal()
    );
}

/// 84987b3: words equal to subcommand names before the subcommand (an option's value) or after
/// it (a lock name, an exec argument), version and help after a subcommand, and usage errors read
/// as the whole tree reads them.
#[test]
fn held_the_cli_small_tree_reads_subcommand_words_as_values_alike() {
    let s = Server::start();
    // A prefix equal to a subcommand name, before the subcommand.
    let o = run(lockctl_on(&s).args(["--prefix", "status", "acquire", "x", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(s.get("statusx").is_some(), "{:?}", s.keys());
    let o = run(lockctl_on(&s).args(["--prefix", "acquire", "acquire", "y", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(s.get("acquirey").is_some(), "{:?}", s.keys());
    // A lock name equal to a subcommand name.
    let o = run(lockctl_on(&s).args(["acquire", "status", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(s.get("lockctl:status").is_some());
    let o = run(lockctl_on(&s).args(["acquire", "help", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(s.get("lockctl:help").is_some());
    // Version and help after a subcommand, and a usage error, as the whole tree prints them.
    let o = run(lockctl_on(&s).args(["acquire", "z", "-V"]));
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "lockctl-acquire 0.1.0".to_string())
    );
    let o = run(lockctl_on(&s).args(["status", "z", "--help"]));
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("Exit status:"), "{}", stdout(&o));
    let o = run(lockctl_on(&s).args(["acquire", "z", "-n", "-w", "1s"]));
    assert_eq!(code(&o), 2);
    assert!(
        stderr(&o).contains("--wait cannot be used with --no-wait")
            && stderr(&o).contains("Usage: lockctl acquire [OPTIONS] <NAME>"),
        "{}",
        stderr(&o)
    );
    let o = run(lockctl_on(&s).args(["-r", "status", "acquire", "z", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:z"), None);
    // `exec` with subcommand words after `--`.
    let o = run(lockctl_on(&s).args(["exec", "e", "-n", "--", "echo", "status", "help"]));
    assert_eq!((code(&o), stdout(&o)), (0, "status help".to_string()));
}

/// 6c6c089: an empty `LOCKCTL_QUARANTINE` counts as unset (the quarantine is the TTL), on the small
/// tree's path: a server just started does not vote.
#[test]
fn held_an_empty_quarantine_variable_counts_as_unset() {
    let s = Server::start();
    let o = run(quarantined()
        .env("LOCKCTL_QUARANTINE", "")
        .env("LOCKCTL_REDIS", s.url())
        .args(["acquire", "q", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(stderr(&o).contains("restart quarantine"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:q"), None);
    // An empty LOCKCTL_REDIS beside -r, and an empty LOCKCTL_REDIS_FILE.
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", "")
        .env("LOCKCTL_REDIS_FILE", "")
        .args(["-r", &s.url(), "acquire", "r", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// d041225: descriptors 0, 1, 2 closed at start are /dev/null in lockctl and in the job, the
/// Redis sockets land above them, and the lock is given back.
#[test]
fn held_closed_standard_descriptors_become_dev_null() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fds");
    // The links are read in a command substitution, whose `$$` is the job's shell: its own
    // descriptors are not redirected meanwhile.
    let script = format!(
        "r=\"$(for f in 0 1 2; do readlink /proc/$$/fd/$f /proc/$PPID/fd/$f; done)\"; \
         echo \"$r\" > {}",
        out.display()
    );
    let mut cmd = lockctl_on(&s);
    cmd.args(["exec", "fds", "-n", "-c", &script]);
    // SAFETY: close(2) of the standard descriptors in the child before exec.
    unsafe {
        cmd.pre_exec(|| {
            libc::close(0);
            libc::close(1);
            libc::close(2);
            Ok(())
        });
    }
    let status = cmd.status().unwrap();
    assert_eq!(status.code(), Some(0));
    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(text.lines().count(), 6, "{text}");
    assert!(text.lines().all(|l| l == "/dev/null"), "{text}");
    assert_eq!(s.get("lockctl:fds"), None);
}

/// d041225: a full stdout is an error, and the lock is given back; an exec job gets SIGPIPE's
/// default action (`yes | head -1` ends) and a job killed by SIGPIPE is 141.
#[test]
fn held_full_stdout_and_sigpipe_in_the_job() {
    let s = Server::start();
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    for format in ["plain", "json", "env"] {
        let o = lockctl_on(&s)
            .args(["acquire", "full", "-n", "--format", format])
            .stdout(Stdio::from(full.try_clone().unwrap()))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert_eq!(code(&o), 1, "{format}: {}", stderr(&o));
        assert_eq!(s.get("lockctl:full"), None, "{format}");
    }
    let o = run(lockctl_on(&s).args(["exec", "p", "-n", "--", "sh", "-c", "yes | head -1"]));
    assert_eq!(
        (code(&o), stdout(&o)),
        (0, "y".to_string()),
        "{}",
        stderr(&o)
    );
    let o = run(lockctl_on(&s).args(["exec", "p", "-n", "-c", "kill -PIPE $$"]));
    assert_eq!(code(&o), 141, "{}", stderr(&o));
    // The job's signal mask is empty and SIGPIPE is not ignored (the test process itself may
    // ignore others, which any child inherits, before and after d041225 alike).
    let o = run(lockctl_on(&s).args([
        "exec",
        "p",
        "-n",
        "--",
        "sh",
        "-c",
        "grep -E '^Sig(Ign|Blk)' /proc/self/status",
    ]));
    let text = stdout(&o);
    let field = |name: &str| {
        let line = text.lines().find(|l| l.starts_with(name)).expect(name);
        u64::from_str_radix(line.split('\t').nth(1).unwrap().trim(), 16).unwrap()
    };
    assert_eq!(field("SigBlk:"), 0, "{text}");
    assert_eq!(field("SigIgn:") & (1 << (libc::SIGPIPE - 1)), 0, "{text}");
}

/// d041225: a signal sent to lockctl during exec reaches the job, and lockctl exits 128+N with
/// the lock given back.
#[test]
fn held_signals_are_forwarded_by_exec() {
    let s = Server::start();
    for (sig, name) in [
        (libc::SIGTERM, "term"),
        (libc::SIGINT, "int"),
        (libc::SIGHUP, "hup"),
    ] {
        let child = lockctl_on(&s)
            .args(["exec", name, "--", "sleep", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(eventually(Duration::from_secs(10), || s
            .get(&format!("lockctl:{name}"))
            .is_some()));
        std::thread::sleep(Duration::from_millis(200));
        kill(child.id() as i32, sig);
        let o = wait_output(child, Duration::from_secs(30));
        assert_eq!(code(&o), 128 + sig, "{name}: {}", stderr(&o));
        assert_eq!(s.get(&format!("lockctl:{name}")), None, "{name}");
    }
}

/// ab9b8bd: the check by sections still refuses a replica (78), and a master's replicas in sync
/// are still counted for WAIT.
#[test]
fn held_a_replica_is_refused_and_a_masters_replica_is_waited_for() {
    let master = Server::start_tcp();
    let replicas = replicas_in_sync(&master, 1);
    let o = run(lockctl().args(["-r", &replicas[0].url(), "acquire", "r", "-n"]));
    assert_eq!(code(&o), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("refused: this is a replica"),
        "{}",
        stderr(&o)
    );
    let o = run(lockctl().args(["-r", &master.url(), "-v", "acquire", "r", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );
}
