//! A review of exec's two speed cuts: the job spawned with `clone(CLONE_VM | CLONE_VFORK)` and
//! `execvpe` instead of a fork, and the release that no longer joins the renewal thread (a lock
//! shared by the engine and the stop request, held by a renewal from its check to its end); and of
//! `/proc` read in one read.
//!
//! Real parts only: the lockctl binary against redis-servers started here (so their restart
//! quarantine is off: each holds nothing from before); the faults are real (SIGSTOP of a server,
//! SIGKILL and SIGTERM of lockctl, odd masks and dispositions set by the parent before exec).
//! Bounds are generous upper bounds, never a duration to meet.

mod support;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const HANDLED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

fn exec_on(s: &Server, name: &str) -> Command {
    let mut c = lockctl_on(s);
    c.args(["exec", name]);
    c
}

/// The keys of lock `name` that say it is held: the lock key and its holder record. (The fence
/// counter, release records and a killed waiter's queue entries stay, by design.)
fn held_keys(s: &Server, name: &str) -> Vec<String> {
    let lock = format!("lockctl:{name}");
    let holder = format!("{{lockctl:{name}}}\u{1f}holder");
    s.keys()
        .into_iter()
        .filter(|k| *k == lock || *k == holder)
        .collect()
}

/// True when `stderr` says the lease ran out in time (a renewal or the job's start came too late),
/// which a loaded machine may cause with a tiny TTL.
fn timing_loss(stderr: &str) -> bool {
    stderr.contains("validity ran out") || stderr.contains("lease ran out before the command")
}

/// PIDs of live processes whose environment or command line contains `marker`.
fn with_marker(marker: &str) -> Vec<i32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let hit = ["cmdline", "environ"].iter().any(|f| {
            std::fs::read(format!("/proc/{pid}/{f}"))
                .is_ok_and(|b| b.windows(marker.len()).any(|w| w == marker.as_bytes()))
        });
        if hit && alive(pid) {
            found.push(pid);
        }
    }
    found
}

/// The hexadecimal field `name` of a `/proc/PID/status` text.
fn status_field(status: &str, name: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(name))
        .unwrap_or_else(|| panic!("no {name} in {status}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

fn bit(sig: i32) -> u64 {
    1u64 << (sig - 1)
}

/// Waits for `child`, at most `limit`; None if it was still running (it is then killed).
fn wait_bounded(mut child: Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let end = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A copy of `/bin/sleep` under `dir` whose name is not UTF-8: its `/proc/PID/stat` is not either.
fn non_utf8_sleep(dir: &Path) -> PathBuf {
    let name = std::ffi::OsStr::from_bytes(b"sl\xffp");
    let path = dir.join(name);
    std::fs::copy("/bin/sleep", &path).unwrap();
    path
}

// ---- The spawn ----------------------------------------------------------------------------------

/// `exec -- true` and `exec -- sh -c 'exit N'`, hundreds of times: each passes its code through,
/// leaves the lock free at once, and leaves no process behind.
#[test]
fn a_job_that_exits_at_once_many_times_leaves_nothing() {
    let s = Server::start();
    let marker = format!("spawn-review-{}", std::process::id());
    for i in 0..400u32 {
        let want = (i * 37) % 256;
        let mut cmd = exec_on(&s, "quick");
        if i % 2 == 0 {
            cmd.args(["--ttl", "2s", "--", "true"]);
        } else {
            let exit = format!("exit {want}");
            cmd.args(["--ttl", "2s", "--", "sh", "-c", &exit, &marker]);
        }
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its PID in the message: a signal from elsewhere can then be looked up by it.
        let pid = child.id();
        let o = wait_output(child, Duration::from_secs(60));
        let want = if i % 2 == 0 { 0 } else { want as i32 };
        assert_eq!(
            o.status.code(),
            Some(want),
            "run {i}, lockctl PID {pid}: {:?} {}",
            o.status,
            stderr(&o)
        );
        assert_eq!(held_keys(&s, "quick"), Vec::<String>::new(), "run {i}");
    }
    assert_eq!(
        with_marker(&marker),
        Vec::<i32>::new(),
        "a job's process was left"
    );
    // A renewal racing an exit must not put the key back after the release.
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(held_keys(&s, "quick"), Vec::<String>::new());
}

/// Jobs that end around the renewal times of a 300 ms TTL (every 100 ms): each is the job's code
/// (or, under load, a loss in time, said so), never a lock found not ours, and the key is gone
/// right after and stays gone.
#[test]
fn jobs_ending_at_renewal_times_of_a_tiny_ttl() {
    let s = Server::start();
    for i in 0..120u32 {
        let ms = (i * 7) % 330;
        let o = run(exec_on(&s, "tiny").args([
            "--ttl",
            "300ms",
            "--",
            "sh",
            "-c",
            &format!("sleep 0.{ms:03}; exit 9"),
        ]));
        // On a loaded machine a 300 ms lease can run out between two renewals (or before the
        // job starts): that is a loss in time, said as such, never a lock found not ours.
        assert!(
            code(&o) == 9 || code(&o) == 76 && timing_loss(&stderr(&o)),
            "run {i} ({ms} ms): {}",
            stderr(&o)
        );
        assert!(
            !stderr(&o).contains("no longer ours"),
            "run {i}: {}",
            stderr(&o)
        );
        assert_eq!(held_keys(&s, "tiny"), Vec::<String>::new(), "run {i}");
    }
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(held_keys(&s, "tiny"), Vec::<String>::new());
}

/// PATH lookup as execvp does it, and the errors: 127 for a command not found (also with an
/// empty PATH, and a relative path with a slash), 126 for a file that is not executable and for a
/// directory, with lockctl's message; the lock is free after each.
#[test]
fn path_lookup_and_spawn_errors() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::write(&plain, "echo hi\n").unwrap();
    let bin1 = dir.path().join("a");
    let bin2 = dir.path().join("b");
    std::fs::create_dir_all(&bin1).unwrap();
    std::fs::create_dir_all(&bin2).unwrap();
    // Not executable in the first directory, executable in the second: execvp goes on.
    std::fs::write(bin1.join("tool"), "#!/bin/sh\necho first\n").unwrap();
    std::fs::write(bin2.join("tool"), "#!/bin/sh\necho second\n").unwrap();
    // No `#!`: execvp runs it with /bin/sh.
    std::fs::write(bin2.join("nobang"), "echo nobang \"$@\"\n").unwrap();
    for f in [bin2.join("tool"), bin2.join("nobang")] {
        std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let path = format!("{}:{}:/usr/bin:/bin", bin1.display(), bin2.display());

    let cases: Vec<(Vec<&str>, Option<&str>, i32, &str)> = vec![
        (vec!["no-such-command-here"], None, 127, "No such file"),
        (
            vec![plain.to_str().unwrap()],
            None,
            126,
            "Permission denied",
        ),
        (
            vec![dir.path().to_str().unwrap()],
            None,
            126,
            "Permission denied",
        ),
        (vec!["./no/such/thing"], None, 127, "No such file"),
        (vec!["true"], Some(""), 127, "No such file"),
        (vec!["tool"], Some(&path), 0, ""),
        (vec!["nobang", "x", "y"], Some(&path), 0, ""),
    ];
    for (argv, path_env, want, msg) in cases {
        let mut c = exec_on(&s, "paths");
        c.arg("--").args(&argv).current_dir(dir.path());
        if let Some(p) = path_env {
            c.env("PATH", p);
        }
        let o = run(&mut c);
        assert_eq!(code(&o), want, "{argv:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(msg), "{argv:?}: {}", stderr(&o));
        if want != 0 {
            assert!(
                stderr(&o).contains("cannot run"),
                "{argv:?}: {}",
                stderr(&o)
            );
        }
        assert_eq!(held_keys(&s, "paths"), Vec::<String>::new(), "{argv:?}");
        match argv[0] {
            "tool" => assert_eq!(stdout(&o), "second"),
            "nobang" => assert_eq!(stdout(&o), "nobang x y"),
            _ => {}
        }
    }
    // No PATH at all: execvp's default path.
    let o = run(exec_on(&s, "paths").env_remove("PATH").args(["--", "true"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A job that itself execs something missing: the shell's 127 passes through.
    let o = run(exec_on(&s, "paths").args(["--", "sh", "-c", "exec no-such-command-here"]));
    assert_eq!(code(&o), 127, "{}", stderr(&o));
    assert_eq!(held_keys(&s, "paths"), Vec::<String>::new());
    // A relative path with a slash runs from the inherited working directory.
    std::fs::write(dir.path().join("rel.sh"), "#!/bin/sh\npwd\n").unwrap();
    std::fs::set_permissions(
        dir.path().join("rel.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let o = run(exec_on(&s, "paths")
        .args(["--", "./rel.sh"])
        .current_dir(dir.path()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        std::fs::canonicalize(stdout(&o)).unwrap(),
        std::fs::canonicalize(dir.path()).unwrap()
    );
}

/// Very long argv and environment, and arguments that are not UTF-8, reach the job byte for byte;
/// the job gets the contract's variables.
#[test]
fn long_and_non_utf8_arguments_and_the_environment() {
    let s = Server::start();
    let many: Vec<String> = (0..20_000)
        .map(|i| format!("argument-{i:06}-{}", "x".repeat(30)))
        .collect();
    let big = "v".repeat(100_000);
    let o = run(exec_on(&s, "args")
        .env("SPAWN_REVIEW_BIG", &big)
        .args([
            "--",
            "sh",
            "-c",
            "echo $# ${#SPAWN_REVIEW_BIG} \"$1\" \"${20000}\"",
            "sh",
        ])
        .args(&many));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        stdout(&o),
        format!("20000 100000 {} {}", many[0], many[19_999])
    );

    let odd = std::ffi::OsStr::from_bytes(b"a\xff\xfeb c");
    let o = run(exec_on(&s, "args")
        .args(["--", "sh", "-c", "printf '%s' \"$1\"", "sh"])
        .arg(odd));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(o.stdout, b"a\xff\xfeb c");

    let o = run(exec_on(&s, "args").args([
        "--",
        "sh",
        "-c",
        "echo \"$LOCKCTL_NAME|$LOCKCTL_KEY|${#LOCKCTL_TOKEN}|$LOCKCTL_FENCE|$LOCKCTL_SLOT|$SPAWN_REVIEW_KEEP\"",
    ]).env("SPAWN_REVIEW_KEEP", "kept"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let f: Vec<&str> = out.split('|').collect();
    assert_eq!(f[0], "args", "{out}");
    assert_eq!(f[1], "lockctl:args", "{out}");
    assert!(f[2].parse::<usize>().unwrap() > 0, "{out}");
    assert!(f[3].parse::<u64>().is_ok(), "{out}");
    assert_eq!(f[4], "1", "{out}");
    assert_eq!(f[5], "kept", "{out}");
    assert_eq!(held_keys(&s, "args"), Vec::<String>::new());
}

/// The job starts holding the lock: its token is the lock key's value when its first process
/// runs, every time; and it inherits no descriptor of lockctl's (a connection, the watcher's pipe):
/// its open descriptors are those its parent would have given it without lockctl.
#[test]
fn the_job_starts_with_the_lock_held_and_no_descriptor_of_lockctl_s() {
    let s = Server::start();
    let script = format!(
        "[ \"$(redis-cli -s '{}' GET lockctl:held)\" = \"$LOCKCTL_TOKEN\" ] || exit 42",
        s.socket().display()
    );
    for i in 0..50 {
        let o = run(exec_on(&s, "held").args(["--ttl", "2s", "--", "sh", "-c", &script]));
        assert_eq!(code(&o), 0, "run {i}: {}", stderr(&o));
    }
    // `ls` itself as the job: a shell holds a pipeline's pipes for a moment. (Its own descriptor
    // of the directory is in both lists.)
    let plain = run(Command::new("ls").arg("/proc/self/fd"));
    let o = run(exec_on(&s, "held").args(["--", "ls", "/proc/self/fd"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), stdout(&plain), "the job's descriptors");
}

/// The job and a grandchild start with no handled signal ignored or blocked, in a process group
/// of their own. Started from a parent that blocked SIGTERM and SIGWINCH and ignored SIGINT,
/// SIGPIPE and SIGWINCH, the job has exactly SIGTERM and SIGWINCH blocked (the mask lockctl was
/// started with, by design: `release_review.rs`) and SIGINT and SIGPIPE back to their default
/// action. The job is `cat` itself, reading its own status (a shell clears the mask of the
/// children it forks); the grandchild is a `cat` that a job's shell starts.
#[test]
fn the_job_and_a_grandchild_start_with_clean_signal_state() {
    let s = Server::start();
    let handled = HANDLED.iter().fold(0, |m, &s| m | bit(s));
    let run_from = |job: &[&str], blocked: &'static [i32], ignored: &'static [i32]| {
        let mut c = exec_on(&s, "sigs");
        c.arg("--").args(job);
        // SAFETY: sigprocmask and signal on the forked child's own state before exec.
        unsafe {
            c.pre_exec(move || {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                for &sig in blocked {
                    libc::sigaddset(&mut set, sig);
                }
                libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                for &sig in ignored {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let o = run(&mut c);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        stdout(&o)
    };
    let job = run_from(&["cat", "/proc/self/status"], &[], &[]);
    let grandchild = run_from(&["sh", "-c", "cat /proc/self/status; true"], &[], &[]);
    for st in [&job, &grandchild] {
        assert_eq!(status_field(st, "SigBlk"), 0, "{st}");
        assert_eq!(status_field(st, "SigIgn") & handled, 0, "{st}");
        assert_eq!(status_field(st, "SigIgn") & bit(libc::SIGPIPE), 0, "{st}");
        assert_eq!(status_field(st, "SigCgt"), 0, "{st}");
    }

    let odd_blocked: &'static [i32] = &[libc::SIGTERM, libc::SIGWINCH];
    let odd_ignored: &'static [i32] = &[libc::SIGINT, libc::SIGPIPE, libc::SIGWINCH];
    let job = run_from(&["cat", "/proc/self/status"], odd_blocked, odd_ignored);
    assert_eq!(
        status_field(&job, "SigBlk"),
        bit(libc::SIGTERM) | bit(libc::SIGWINCH),
        "{job}"
    );
    assert_eq!(status_field(&job, "SigIgn") & handled, 0, "{job}");
    assert_eq!(
        status_field(&job, "SigIgn") & bit(libc::SIGPIPE),
        0,
        "{job}"
    );
    assert_eq!(status_field(&job, "SigCgt"), 0, "{job}");

    // Its own group, led by the job: not the group of lockctl (the test's child, which is in the
    // test's group).
    let out = run_from(&["sh", "-c", "echo $$ $(ps -o pgid= -p $$)"], &[], &[]);
    let f: Vec<i32> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(f[0], f[1], "{out}");
    // SAFETY: getpgrp has no preconditions.
    assert_ne!(f[1], unsafe { libc::getpgrp() }, "{out}");
}

/// A job whose parent ignored SIGCHLD (`trap '' CHLD` in a shell hands it on): exec runs the job
/// and passes its code through; the job gets SIGCHLD at its default action.
#[test]
fn sigchld_ignored_by_exec_s_parent() {
    let s = Server::start();
    for (script, want) in [
        ("exit 7", 7),
        ("sleep 0.2; exit 5", 5),
        ("sleep 0.2 & exit 4", 4),
        ("kill -9 $$", 137),
    ] {
        let mut c = exec_on(&s, "chld");
        c.args(["--", "sh", "-c", script]);
        // SAFETY: signal on the forked child's own state before exec.
        unsafe {
            c.pre_exec(|| {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                Ok(())
            });
        }
        let o = run(&mut c);
        assert_eq!(code(&o), want, "{script}: {}", stderr(&o));
        assert_eq!(held_keys(&s, "chld"), Vec::<String>::new(), "{script}");
    }
    let mut c = exec_on(&s, "chld");
    c.args(["--", "cat", "/proc/self/status"]);
    // SAFETY: as above.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGCHLD, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = run(&mut c);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(
        status_field(&stdout(&o), "SigIgn") & bit(libc::SIGCHLD),
        0,
        "{}",
        stdout(&o)
    );
}

/// Under a small stack limit and a small address-space limit, exec runs its job (or, where the
/// limit leaves no room at all, fails cleanly) and leaves the lock free.
#[test]
fn small_stack_and_address_space_limits() {
    let s = Server::start();
    let bin = env!("CARGO_BIN_EXE_lockctl");
    // (Below about 200 KiB of stack a debug build of lockctl overflows its main thread before it
    // parses its arguments, whatever the command.)
    for limits in [
        "ulimit -s 256",
        "ulimit -v 400000",
        "ulimit -v 60000",
        "ulimit -v 20000",
    ] {
        let o = run(Command::new("sh")
            .args([
                "-c",
                &format!("{limits} && exec \"$0\" exec lim -- sh -c 'echo ran; exit 3'"),
                bin,
            ])
            .env("LOCKCTL_REDIS", s.url())
            .env("LOCKCTL_QUARANTINE", "0"));
        let c = o.status.code();
        assert!(
            c == Some(3) && stdout(&o) == "ran" || c == Some(1) || c == Some(126),
            "{limits}: {o:?}"
        );
        assert_eq!(held_keys(&s, "lim"), Vec::<String>::new(), "{limits}");
    }
}

/// A job that starts a grandchild and exits: exec waits for the grandchild, passes the job's code
/// through and then frees the lock.
#[test]
fn a_job_that_forks_a_grandchild_and_exits() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let done = dir.path().join("done");
    for i in 0..20 {
        let _ = std::fs::remove_file(&done);
        let o = run(exec_on(&s, "gc").args([
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            &format!("(sleep 0.3; touch '{}') & exit 4", done.display()),
        ]));
        assert_eq!(code(&o), 4, "run {i}: {}", stderr(&o));
        assert!(done.exists(), "run {i}: exec ended before its grandchild");
        assert_eq!(held_keys(&s, "gc"), Vec::<String>::new(), "run {i}");
    }
}

/// The foreground job on a terminal (`script` gives it one): the job's group is the terminal's
/// foreground group while it runs, and lockctl's shell gets it back.
#[test]
fn a_job_on_a_terminal_is_in_the_foreground() {
    need_tool("script", "--version");
    let s = Server::start();
    let bin = env!("CARGO_BIN_EXE_lockctl");
    let o = run(Command::new("script")
        .args([
            "-qec",
            &format!("{bin} exec tty -- sh -c 'ps -o pgid=,tpgid= -p $$'; echo rc=$?"),
            "/dev/null",
        ])
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_QUARANTINE", "0"));
    let out = stdout(&o);
    assert!(out.contains("rc=0"), "{out} {}", stderr(&o));
    let line = out.lines().find(|l| !l.contains("rc=")).unwrap();
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 2, "{out}");
    assert_eq!(
        f[0], f[1],
        "the job's group is not the terminal's foreground: {out}"
    );
}

// ---- Signals and deaths at every phase -----------------------------------------------------

/// SIGTERM or SIGINT to exec at spread-out moments from its start to just after its job's exit:
/// exec always ends, well within a generous bound, with 0 or 128+N, and frees the lock. (A signal
/// that comes before lockctl handles signals, at its very start, kills it: it holds nothing yet.)
#[test]
fn sigterm_or_sigint_at_every_phase_of_a_short_job_ends_exec() {
    let s = Server::start();
    for i in 0..150u64 {
        let child = exec_on(&s, "term")
            .args(["--ttl", "2s", "--", "sh", "-c", "sleep 0.02"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros((i * 397) % 40_000));
        let sig = if i % 2 == 0 {
            libc::SIGTERM
        } else {
            libc::SIGINT
        };
        kill(child.id() as i32, sig);
        let o = wait_output(child, Duration::from_secs(60));
        let c = o.status.code();
        let early = std::os::unix::process::ExitStatusExt::signal(&o.status) == Some(sig);
        assert!(
            c == Some(0) || c == Some(128 + sig) || early,
            "run {i}: {:?} {}",
            o.status,
            stderr(&o)
        );
        assert_eq!(held_keys(&s, "term"), Vec::<String>::new(), "run {i}");
    }
}

/// SIGKILL to exec at spread-out moments around the spawn: no job process outlives the lease's
/// deadline by more than a generous bound (the watcher kills it), and the lock expires.
#[test]
fn sigkill_of_exec_at_the_spawn_leaves_no_job_running() {
    let s = Server::start();
    let marker = format!("spawn-review-kill-{}", std::process::id());
    for i in 0..40u64 {
        let tag = format!("{marker}-{i}-end");
        let child = exec_on(&s, "kill9")
            .args(["--ttl", "2s", "--", "sh", "-c", "sleep 300 & sleep 300"])
            .env("SPAWN_REVIEW_TAG", &tag)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_micros((i * 1_777) % 60_000));
        kill(child.id() as i32, libc::SIGKILL);
        let _ = wait_bounded(child, Duration::from_secs(10));
        // Every process of the job has the tag in its environment.
        assert!(
            eventually(Duration::from_secs(30), || with_marker(&tag).is_empty()),
            "run {i}: the job outlived lockctl: {:?}",
            with_marker(&tag)
        );
    }
    assert!(
        eventually(Duration::from_secs(30), || held_keys(&s, "kill9")
            .is_empty()),
        "the lock never expired"
    );
}

/// A job process whose name is not UTF-8 (its `/proc/PID/stat` is not) in a session of its own:
/// a SIGTERM forwarded by exec reaches it like any other, and exec ends.
#[test]
fn a_signal_reaches_a_descendant_whose_name_is_not_utf8() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let sleeper = non_utf8_sleep(dir.path());
    let mut child = exec_on(&s, "odd")
        .args(["--", "sh", "-c", "setsid \"$0\" 120 & echo started; wait"])
        .arg(&sleeper)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "started",
        Duration::from_secs(30),
    );
    std::thread::sleep(Duration::from_millis(300));
    kill(child.id() as i32, libc::SIGTERM);
    let st = wait_bounded(child, Duration::from_secs(60));
    assert!(
        st.is_some(),
        "exec was still waiting for the descendant 60 s after the SIGTERM"
    );
    assert_eq!(held_keys(&s, "odd"), Vec::<String>::new());
}

/// The same descendant when the lease is lost (the lock broken): it is stopped, and exec ends
/// with 76.
#[test]
fn a_lost_lease_stops_a_descendant_whose_name_is_not_utf8() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let sleeper = non_utf8_sleep(dir.path());
    let mut child = exec_on(&s, "odd2")
        .args(["--ttl", "3s", "--kill-after", "1s", "--"])
        .args(["sh", "-c", "setsid \"$0\" 120 & echo started; wait"])
        .arg(&sleeper)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "started",
        Duration::from_secs(30),
    );
    let o = run(lockctl_on(&s).args(["break", "odd2", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let st = wait_bounded(child, Duration::from_secs(60));
    assert_eq!(
        st.and_then(|st| st.code()),
        Some(76),
        "exec did not end with 76 within 60 s of the break"
    );
}

/// The same descendant when lockctl is killed with SIGKILL: its watcher stops it.
#[test]
fn the_watcher_stops_a_descendant_whose_name_is_not_utf8() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let sleeper = non_utf8_sleep(dir.path());
    let pidfile = dir.path().join("pid");
    let mut child = exec_on(&s, "odd3")
        .args(["--ttl", "3s", "--kill-after", "1s", "--"])
        .args([
            "sh",
            "-c",
            "setsid \"$0\" 120 & echo $! > \"$1\"; echo started; wait",
        ])
        .arg(&sleeper)
        .arg(&pidfile)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "started",
        Duration::from_secs(30),
    );
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    // The watcher looks every tenth of a second: let it see the descendant once.
    std::thread::sleep(Duration::from_millis(500));
    kill(child.id() as i32, libc::SIGKILL);
    let _ = child.wait();
    let stopped = eventually(Duration::from_secs(60), || !alive(pid));
    if !stopped {
        kill(pid, libc::SIGKILL);
    }
    assert!(stopped, "the descendant outlived lockctl by 60 s");
}

/// A job that ignores SIGTERM, its lease lost by a `break` and by a server stopped past the
/// deadline: the job and its children are killed after `--kill-after`, exec ends with 76 well
/// within a generous bound, and nothing of the job is left.
#[test]
fn a_lost_lease_kills_a_job_that_ignores_sigterm() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    for how in ["break", "stop"] {
        let tag = format!("spawn-review-ignore-{}-{how}-end", std::process::id());
        let pidfile = dir.path().join(format!("pid-{how}"));
        let mut child = exec_on(&s, "ign")
            .args(["--ttl", "3s", "--kill-after", "1s", "--", "sh", "-c"])
            .arg(format!(
                "trap '' TERM; echo $$ > '{}'; echo started; while :; do sleep 0.1; done",
                pidfile.display()
            ))
            .env("SPAWN_REVIEW_TAG", &tag)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let _out = wait_for_line(
            child.stdout.take().unwrap(),
            "started",
            Duration::from_secs(30),
        );
        if how == "break" {
            let o = run(lockctl_on(&s).args(["break", "ign", "--yes"]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
        } else {
            s.pause();
        }
        let st = wait_bounded(child, Duration::from_secs(60));
        if how == "stop" {
            s.resume();
        }
        assert_eq!(st.and_then(|st| st.code()), Some(76), "{how}");
        assert!(
            eventually(Duration::from_secs(10), || with_marker(&tag).is_empty()),
            "{how}: the job was left: {:?}",
            with_marker(&tag)
        );
        if how == "stop" {
            // Nothing revives the key once the server continues.
            assert!(eventually(Duration::from_secs(30), || held_keys(&s, "ign").is_empty()));
        }
    }
}

// ---- The release without the join ------------------------------------------------------------

/// The job stops the server and ends while the renewal due then hangs on it: exec waits for that
/// renewal (bounded by the node timeout), cannot release, passes the job's code through (the lease
/// held until the job's end), and ends; once the server continues, the key expires.
#[test]
fn a_job_ending_while_its_final_renewal_hangs_on_a_stopped_server() {
    let s = Server::start();
    for round in 0..3 {
        let script = format!("kill -STOP {}; sleep 1.3; exit 3", s.pid());
        let child = exec_on(&s, "hang")
            .args(["--ttl", "3s", "--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let o = wait_output(child, Duration::from_secs(60));
        s.resume();
        assert_eq!(code(&o), 3, "round {round}: {}", stderr(&o));
        assert!(
            !stderr(&o).contains("lost"),
            "round {round}: {}",
            stderr(&o)
        );
        assert!(
            eventually(Duration::from_secs(30), || held_keys(&s, "hang").is_empty()),
            "round {round}: the key never went"
        );
    }
}

/// A server busy (`DEBUG SLEEP`, sent by the job in the background) at a renewal time while the
/// job's first process ends: the renewal is in flight when the job's last process (that
/// `redis-cli`) ends, just before or just after its reply. It is waited for and counts (the lease
/// held: the job's code, no loss), and the release after it leaves no key, now or later.
#[test]
fn a_job_ending_while_a_renewal_waits_on_a_busy_server() {
    let s = Server::with_debug_command();
    let sock = s.socket();
    for i in 0..24u32 {
        // Renewals every second; the server sleeps 300 ms from about 950 ms on, and the job's
        // first process ends somewhere in 950..1280 ms.
        let end = (i * 13) % 330;
        let script = format!(
            "sleep 0.95; redis-cli -s '{}' DEBUG SLEEP 0.3 >/dev/null & sleep 0.{end:03}; exit 5",
            sock.display()
        );
        let o = run(exec_on(&s, "busy").args([
            "--ttl",
            "3s",
            "--node-timeout",
            "1s",
            "--",
            "sh",
            "-c",
            &script,
        ]));
        assert_eq!(code(&o), 5, "run {i}: {}", stderr(&o));
        assert!(!stderr(&o).contains("lost"), "run {i}: {}", stderr(&o));
        assert_eq!(held_keys(&s, "busy"), Vec::<String>::new(), "run {i}");
    }
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(held_keys(&s, "busy"), Vec::<String>::new());
}

/// As above, with SIGTERM sent to exec while the renewal hangs: exec still ends within bounds.
#[test]
fn sigterm_while_the_final_renewal_hangs_ends_exec() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let ended = dir.path().join("ended");
    let script = format!(
        "kill -STOP {}; sleep 1.3; touch '{}'; exit 3",
        s.pid(),
        ended.display()
    );
    let child = exec_on(&s, "hang2")
        .args(["--ttl", "3s", "--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(30), || ended.exists()));
    kill(child.id() as i32, libc::SIGTERM);
    kill(child.id() as i32, libc::SIGINT);
    let o = wait_output(child, Duration::from_secs(60));
    s.resume();
    assert!(
        matches!(o.status.code(), Some(3) | Some(143) | Some(130)),
        "{:?} {}",
        o.status,
        stderr(&o)
    );
}

/// The job breaks the lock and stops the server, then ends while the renewal due hangs; the test
/// continues the server once the job has ended. That renewal (or, where it had not started, the
/// release) finds the lock gone: exit 76, said on stderr, never the job's 0.
#[test]
fn a_loss_found_by_the_final_renewal_is_reported() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    for round in 0..3 {
        let ended = dir.path().join(format!("ended{round}"));
        let script = format!(
            "\"$0\" break loss --yes 2>/dev/null; kill -STOP {}; sleep 2.3; touch '{}'; exit 0",
            s.pid(),
            ended.display()
        );
        let child = exec_on(&s, "loss")
            .args([
                "--ttl",
                "6s",
                "--node-timeout",
                "4s",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .arg(env!("CARGO_BIN_EXE_lockctl"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        assert!(eventually(Duration::from_secs(30), || ended.exists()));
        std::thread::sleep(Duration::from_millis(300));
        s.resume();
        let o = wait_output(child, Duration::from_secs(60));
        assert_eq!(code(&o), 76, "round {round}: {}", stderr(&o));
        assert!(stderr(&o).contains("lost"), "round {round}: {}", stderr(&o));
        assert_eq!(held_keys(&s, "loss"), Vec::<String>::new(), "round {round}");
    }
}

/// Eight workers, each running twenty jobs through exec on one lock with a 2 s TTL: no two
/// jobs ever overlap, every job's code passes through, and the lock is free at the end.
#[test]
fn many_concurrent_execs_exclude_each_other() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let inside = dir.path().join("inside");
    let script = format!(
        "mkdir '{0}' || exit 99; sleep 0.0$(($$ % 5)); rmdir '{0}'; exit 6",
        inside.display()
    );
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let url = s.url();
            let script = script.clone();
            std::thread::spawn(move || {
                let mut codes = Vec::new();
                for _ in 0..20 {
                    let o = run(lockctl()
                        .env("LOCKCTL_REDIS", &url)
                        .args(["exec", "many", "--ttl", "2s", "--", "sh", "-c", &script]));
                    codes.push((code(&o), stderr(&o)));
                }
                codes
            })
        })
        .collect();
    for w in workers {
        for (c, err) in w.join().unwrap() {
            assert_eq!(c, 6, "{err}");
        }
    }
    assert_eq!(held_keys(&s, "many"), Vec::<String>::new());
}

/// Redlock over three nodes with one stopped throughout: every job runs on the two others' quorum,
/// its code passes through, and the two free the lock.
#[test]
fn redlock_with_one_node_stopped() {
    let servers = Servers::start(3);
    servers[2].pause();
    for i in 0..10 {
        let o = run(servers.lockctl().args([
            "exec",
            "rl",
            "--ttl",
            "2s",
            "--",
            "sh",
            "-c",
            "sleep 0.$(($$ % 9)); exit 8",
        ]));
        assert_eq!(code(&o), 8, "run {i}: {}", stderr(&o));
        assert_eq!(
            held_keys(&servers[0], "rl"),
            Vec::<String>::new(),
            "run {i}"
        );
        assert_eq!(
            held_keys(&servers[1], "rl"),
            Vec::<String>::new(),
            "run {i}"
        );
    }
    servers[2].resume();
}
