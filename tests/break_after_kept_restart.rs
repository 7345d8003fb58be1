//! A `break` must end the holder also after its server restarted with its data. A restart changes
//! the server's run id; when the key survived it (an AOF with `appendfsync always`), the renewal
//! finds it and extends it. It used not to record the new run id, so the key's disappearance after a
//! later `break` looked like a restart loss and the renewal put the key back: the broken holder
//! carried on and a second client found the lock busy. Every renewal now records the run id.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::*;

#[test]
fn break_after_a_restart_that_kept_the_key_ends_the_holder() {
    let mut s = Server::with_args(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--no-appendfsync-on-rewrite",
        "no",
    ]);
    let go = s.dir().join("go");
    // The restart quarantine stays on (the default: the 3 s TTL); the grant waits it out.
    let mut child = lockctl_on(&s)
        .env_remove("LOCKCTL_QUARANTINE")
        .env("GO", &go)
        .args(["exec", "phoenix", "--ttl", "3s", "--kill-after", "1s", "-c"])
        .arg("echo ready; while [ ! -e \"$GO\" ]; do sleep 0.05; done")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    let token = s.get("lockctl:phoenix").unwrap();
    s.restart_in_place();
    assert_eq!(
        s.get("lockctl:phoenix"),
        Some(token.clone()),
        "the AOF kept the key"
    );
    // Past the restarted server's quarantine (3 s, plus the second the uptime may read high).
    std::thread::sleep(Duration::from_secs(5));
    assert!(
        matches!(child.try_wait(), Ok(None)),
        "the holder kept its lease through a restart that kept its key"
    );
    let o = run(lockctl_on(&s).args(["break", "phoenix", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // The next renewal (every second) ends the lease; the command is told to finish in any case.
    let _ = eventually(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    let back = s.get("lockctl:phoenix");
    std::fs::write(&go, "").unwrap();
    let o = wait_output(child, Duration::from_secs(30));
    assert_eq!(back, None, "the renewal put the broken key back");
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}
