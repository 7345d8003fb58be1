//! A node must not be spared the quarantine because it "keeps its data" (`appendfsync always` now,
//! and the lock's fencing counter loaded). Both facts can only be read after the restart, so neither
//! proves that the data the node loaded holds the last grant. A node whose AOF lost its tail while it
//! ran with `appendfsync everysec` (changed at runtime, not in its config file), whose AOF was turned off at
//! runtime, or whose AOF was restored from an older copy has an older counter and no lock key, and
//! must not vote while the lost lease may be valid. These tests failed, with a second holder, while
//! lockctl spared such nodes; it spares none now (docs/quarantine.md).

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

const AOF: [&str; 6] = [
    "--appendonly",
    "yes",
    "--appendfsync",
    "always",
    "--no-appendfsync-on-rewrite",
    "no",
];

/// lockctl on `s`, with a node timeout of 2 s: every write fsyncs, and on a loaded machine one
/// outlasted the default 500 ms; that grant, run late, then held the name for its 60 s TTL against
/// the same acquire's next attempt (most likely the rollback sent behind it was lost with its
/// connection, the open case of `slots_review5.rs`
/// `a_late_answer_of_a_stopped_node_leaves_nothing_after_a_refusal`).
fn on(s: &Server) -> Command {
    let mut c = lockctl_on(s);
    c.env("LOCKCTL_NODE_TIMEOUT", "2s");
    c
}

/// lockctl with the restart quarantine on (its default: the request's TTL).
fn quarantined_on(s: &Server) -> Command {
    let mut c = on(s);
    c.env_remove("LOCKCTL_QUARANTINE");
    c
}

fn incr_aof(dir: &Path) -> PathBuf {
    std::fs::read_dir(dir.join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".incr.aof"))
        .expect("an incremental AOF file")
}

/// Grant 0 (makes the counter), `CONFIG SET` of `runtime` (not written to any config file), then
/// H1's grant; `lose` takes H1's grant out of the AOF while the server is down; then a second client
/// asks with the quarantine on. It must not be granted while H1's 60 s lease is valid (within the
/// same second, its fence would also repeat H1's).
fn second_grant_after_losing_the_first(
    runtime: Option<(&str, &str)>,
    lose: impl FnOnce(&Server, u64, &Path),
) {
    let mut s = Server::with_args(&AOF);
    // The server was started just now by this test: quarantine off (`lockctl_on`) for these grants.
    let t0 = acquire_json(&mut on(&s), "x", &["--ttl", "60s"]);
    let o = run(on(&s).args(["release", "x", "--token", t0["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    std::thread::sleep(std::time::Duration::from_millis(1100));
    let backup = s.dir().join("backup");
    let status = Command::new("cp")
        .arg("-a")
        .arg(s.dir().join("appendonlydir"))
        .arg(&backup)
        .status()
        .unwrap();
    assert!(status.success());
    let size = std::fs::metadata(incr_aof(s.dir())).unwrap().len();
    if let Some((param, value)) = runtime {
        s.cmd::<String>(&["CONFIG", "SET", param, value]);
    }
    let h1 = acquire_json(&mut on(&s), "x", &["--ttl", "60s"]);
    s.kill();
    lose(&s, size, &backup);
    s.restart_in_place();
    let fsync: Vec<String> = s.cmd(&["CONFIG", "GET", "appendfsync"]);
    assert_eq!(
        fsync[1], "always",
        "the restarted server fsyncs every write"
    );

    let o =
        run(quarantined_on(&s).args(["acquire", "x", "-n", "--ttl", "60s", "--format", "json"]));
    let h2 = stdout(&o);
    assert_ne!(
        code(&o),
        0,
        "a second holder while H1's 60 s lease is valid: H1 {h1}, H2 {h2}"
    );
}

/// The operator ran `CONFIG SET appendfsync everysec` (the config file still says always); the OS
/// crash that followed lost the writes of the last second, as everysec allows.
#[test]
fn a_runtime_everysec_tail_lost_in_a_crash_keeps_the_quarantine() {
    second_grant_after_losing_the_first(Some(("appendfsync", "everysec")), |s, size, _| {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(incr_aof(s.dir()))
            .unwrap();
        f.set_len(size).unwrap();
    });
}

/// The AOF directory restored from a copy taken before the last grant.
#[test]
fn an_aof_restored_from_an_older_copy_keeps_the_quarantine() {
    second_grant_after_losing_the_first(None, |s, _, backup| {
        let dir = s.dir().join("appendonlydir");
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::rename(backup, &dir).unwrap();
    });
}

/// The operator turned the AOF off at runtime (`CONFIG SET appendonly no`); a plain kill -9 later,
/// the server starts again with its command-line config (AOF on, always) and loads the AOF as it was
/// when it was turned off: the counter, not H1's key. No file is touched.
#[test]
fn an_aof_turned_off_at_runtime_keeps_the_quarantine() {
    second_grant_after_losing_the_first(Some(("appendonly", "no")), |_, _, _| {});
}
