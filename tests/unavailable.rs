//! An unreachable node gives 69 (Redis unavailable) within about the node timeout, never a hang.
//!
//! Two real faults: a loopback port nobody listens on (connection refused at once), and a
//! redis-server stopped with SIGSTOP, which keeps its socket open so that connecting may succeed and
//! only the reply never comes: only the node timeout ends that wait.

mod support;

use std::time::{Duration, Instant};

use support::*;

const TOKEN: &str = "0123456789abcdef0123456789abcdef";

/// Runs the three commands against `url` and checks each exits 69 within `bound`.
fn all_unavailable(url: &str, bound: Duration) {
    let cases: [&[&str]; 5] = [
        &["acquire", "job", "-n"],
        &["acquire", "job"],
        &["acquire", "job", "-w", "30s"],
        &["release", "job", "--token", TOKEN],
        &["renew", "job", "--token", TOKEN],
    ];
    for args in cases {
        let t = Instant::now();
        let o = run(lockctl()
            .args(["-r", url, "--node-timeout", "300ms"])
            .args(args));
        let took = t.elapsed();
        let err = stderr(&o);
        assert_eq!(code(&o), 69, "{args:?}: {err}");
        assert!(err.contains("unavailable"), "{args:?}: {err}");
        assert!(took < bound, "{args:?} took {took:?}");
        assert_eq!(stdout(&o), "", "{args:?}");
    }
}

#[test]
fn a_port_nobody_listens_on_gives_69() {
    let port = free_port();
    all_unavailable(&format!("redis://127.0.0.1:{port}"), Duration::from_secs(5));
}

#[test]
fn a_missing_unix_socket_gives_69() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("unix://{}", dir.path().join("nobody.sock").display());
    all_unavailable(&url, Duration::from_secs(5));
}

#[test]
fn a_stopped_server_gives_69_within_about_the_node_timeout() {
    let s = Server::start_tcp();
    // Load the scripts first, so that a command stuck in the stopped server could really apply.
    let g = acquire_json(&mut lockctl_on(&s), "job", &[]);
    let o = run(lockctl_on(&s).args(["release", "job", "--token", g["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0);

    s.pause();
    // Connecting to a stopped server succeeds (the kernel accepts), so this is the reply timeout.
    // 300 ms per attempt; a few seconds of margin for a loaded machine.
    all_unavailable(&s.url(), Duration::from_secs(4));
    let unix = format!("unix://{}", s.socket().display());
    all_unavailable(&unix, Duration::from_secs(4));
    s.resume();

    // The stuck acquires ran when the server woke up, and their rollbacks after them.
    assert!(
        eventually(Duration::from_secs(10), || s.get("lockctl:job").is_none()),
        "a lock was left behind by an attempt that timed out: {:?}",
        s.keys()
    );
    let o = run(lockctl_on(&s).args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn the_default_node_timeout_also_bounds_a_stopped_server() {
    let s = Server::start();
    s.pause();
    let t = Instant::now();
    let o = run(lockctl_on(&s).args(["acquire", "job", "-n"]));
    let took = t.elapsed();
    s.resume();
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(stderr(&o).contains("node timeout"), "{}", stderr(&o));
    assert!(took < Duration::from_secs(6), "took {took:?}");
}
