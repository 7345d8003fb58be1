//! A closed stdout (`lockctl status x | head -0`, a reader that went away) is reported as an error
//! with exit 1, never a panic (101); for `acquire` the lock is given back, since nobody learned its
//! token. `list`, which streams, stops quietly instead.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::*;

/// Runs `cmd` with stdout connected to a pipe whose reading end is already closed.
fn run_with_closed_stdout(cmd: &mut std::process::Command) -> std::process::Output {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into a valid two-element array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: closing the read end we own; the write end becomes the child's stdout.
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] is an open descriptor we own and hand over to Stdio.
    let stdout = unsafe { <Stdio as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
    let child = cmd.stdout(stdout).stderr(Stdio::piped()).spawn().unwrap();
    wait_output(child, Duration::from_secs(60))
}

#[test]
fn no_command_panics_on_a_closed_stdout() {
    let s = Server::start();
    let held = acquire_json(&mut lockctl_on(&s), "held", &["--ttl", "60s"]);
    let token = held["token"].as_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["renew", "held", "--token", token],
        vec!["status", "held"],
        vec!["status", "held", "--format", "json"],
        vec!["doctor"],
        vec!["completions", "bash"],
    ];
    for args in cases {
        let o = run_with_closed_stdout(lockctl_on(&s).args(&args));
        let err = stderr(&o);
        assert_eq!(code(&o), 1, "{args:?}: {err}");
        assert!(err.contains("stdout"), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
    // `list` streams: a reader that went away (`lockctl list | head`) ends it quietly, like ls.
    let o = run_with_closed_stdout(lockctl_on(&s).args(["list"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("panicked"));
    let o = run_with_closed_stdout(lockctl_on(&s).args(["acquire", "free"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert_eq!(
        s.get("lockctl:free"),
        None,
        "an acquire nobody could read is released"
    );
    assert_eq!(s.get("lockctl:held").as_deref(), Some(token));
}
