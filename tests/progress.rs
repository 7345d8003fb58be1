//! What a waiting lockctl shows: a spinner on a terminal (run under `script(1)`, a real pseudo-
//! terminal), plain lines in a log, nothing with `-q`; and the node timeout read from the environment.

mod support;

use std::time::{Duration, Instant};

use support::*;

/// Runs lockctl with `args` on a pseudo-terminal and returns everything it wrote there.
fn on_a_terminal(server: &Server, args: &str) -> (i32, String) {
    let line = format!("{} {args}", env!("CARGO_BIN_EXE_lockctl"));
    let template = lockctl_on(server);
    let mut cmd = std::process::Command::new("script");
    cmd.args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::null());
    for (k, v) in template.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = run(&mut cmd);
    (code(&o), String::from_utf8_lossy(&o.stdout).into_owned())
}

#[test]
fn spinner_on_a_terminal_names_the_lock_and_holder() {
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "spun", &["--ttl", "60s"]);
    let (rc, screen) = on_a_terminal(&s, "acquire spun -w 1500ms");
    assert_eq!(rc, 75, "{screen}");
    assert!(
        screen.contains("waiting for lock 'spun' held by"),
        "{screen}"
    );
    assert!(screen.contains("pid"), "the holder is named: {screen}");
    assert!(
        screen.contains('\r') || screen.contains("\x1b["),
        "redrawn in place: {screen:?}"
    );
    assert!(
        !screen.contains("lockctl: waiting"),
        "no log lines on a terminal: {screen}"
    );

    let (rc, screen) = on_a_terminal(&s, "-q acquire spun -w 500ms");
    assert_eq!(rc, 75);
    assert!(
        !screen.contains("waiting"),
        "-q silences the spinner: {screen}"
    );
}

#[test]
fn node_timeout_from_the_environment() {
    let stopped = Server::start_tcp();
    stopped.pause();
    let started = Instant::now();
    let o = run(lockctl_on(&stopped)
        .env("LOCKCTL_NODE_TIMEOUT", "200ms")
        .args(["acquire", "x", "-n"]));
    let took = started.elapsed();
    stopped.resume();
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("200ms"),
        "the message names the timeout: {}",
        stderr(&o)
    );
    assert!(took < Duration::from_secs(5), "took {took:?}");
}

#[test]
fn spinner_names_the_restart_quarantine() {
    let s = Server::start();
    // The server started a moment ago: a quarantine of a minute keeps it from voting.
    let (rc, screen) = on_a_terminal(&s, "acquire fresh -w 1s --quarantine 1m");
    assert_eq!(rc, 75, "{screen}");
    assert!(screen.contains("restart quarantine"), "{screen}");
    assert!(screen.contains("votes in"), "{screen}");
    assert!(
        screen.contains("not acquired, because of the restart quarantine"),
        "{screen}"
    );

    // -q: no spinner, but the quarantine is said once, and the refusal.
    let (rc, screen) = on_a_terminal(&s, "-q acquire fresh -w 1s --quarantine 1m");
    assert_eq!(rc, 75, "{screen}");
    assert_eq!(
        screen.matches("lockctl: waiting for lock 'fresh'").count(),
        1,
        "{screen}"
    );
    assert!(
        screen.contains("not acquired, because of the restart quarantine"),
        "{screen}"
    );
}
