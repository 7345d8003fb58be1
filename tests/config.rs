//! Configuration through the environment, and the rules `release` and `renew` follow when they are
//! given less than everything: the TTL a bare `renew` sets, and which token they take.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use support::*;

/// Options that deliberately have no variable: what to run, the operator's override, positionals,
/// `--token` (read by the commands themselves, see `token_rule_*`), and clap's own flags.
const NO_VARIABLE: [&str; 8] = [
    "help", "version", "name", "command", "program", "yes", "shell", "pattern",
];

/// Every variable that an option reads, by command (the global ones under "lockctl").
fn variables() -> Vec<(String, Vec<String>)> {
    let mut cmd = lockctl::cli::command();
    cmd.build();
    let mut out = Vec::new();
    let mut collect = |name: String, c: &clap::Command| {
        let vars = c
            .get_arguments()
            .filter(|a| !NO_VARIABLE.contains(&a.get_id().as_str()) && a.get_id() != "token")
            .map(|a| {
                let var = a
                    .get_env()
                    .unwrap_or_else(|| panic!("{name} --{} has no variable", a.get_id()));
                var.to_string_lossy().into_owned()
            })
            .collect();
        out.push((name, vars));
    };
    collect("lockctl".into(), &cmd);
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        collect(sub.get_name().to_string(), sub);
    }
    out
}

#[test]
fn every_option_has_a_variable_shown_in_help() {
    let all = variables();
    for (name, vars) in &all {
        let o = if name == "lockctl" {
            run(lockctl().arg("--help"))
        } else {
            run(lockctl().args([name, "--help"]))
        };
        assert_eq!(code(&o), 0);
        let help = stdout(&o);
        for var in vars {
            let expected = format!("LOCKCTL_{}", var.trim_start_matches("LOCKCTL_"));
            assert!(
                help.contains(&format!("[env: {expected}")),
                "{name} --help lacks {var}"
            );
        }
    }
    let global = &all[0].1;
    for var in [
        "LOCKCTL_REDIS",
        "LOCKCTL_REDIS_FILE",
        "LOCKCTL_NODE_TIMEOUT",
        "LOCKCTL_DRIFT_FACTOR",
        "LOCKCTL_QUARANTINE",
        "LOCKCTL_QUIET",
    ] {
        assert!(global.contains(&var.to_string()), "{var}");
    }
    let exec = &all.iter().find(|(n, _)| n == "exec").unwrap().1;
    for var in [
        "LOCKCTL_TTL",
        "LOCKCTL_WAIT",
        "LOCKCTL_NO_WAIT",
        "LOCKCTL_CONFLICT_EXIT_CODE",
        "LOCKCTL_KILL_AFTER",
    ] {
        assert!(exec.contains(&var.to_string()), "{var}");
    }
    // release and renew say where their token comes from.
    for cmd in ["release", "renew"] {
        let help = stdout(&run(lockctl().args([cmd, "--help"])));
        assert!(
            help.contains("LOCKCTL_TOKEN") && help.contains("LOCKCTL_NAME"),
            "{help}"
        );
    }
}

/// Waits until the server is surely up for a whole second, so a 900 ms quarantine has passed:
/// `uptime_in_seconds` can read a second high, so lockctl counts only `uptime - 1`.
fn up_one_second(s: &Server) {
    assert!(eventually(Duration::from_secs(10), || s.uptime() >= 2));
}

#[test]
fn every_empty_variable_counts_as_unset() {
    let s = Server::start();
    up_one_second(&s);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("redis.conf");
    std::fs::write(&file, format!("{}\n", s.url())).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut every: Vec<String> = variables().into_iter().flat_map(|(_, v)| v).collect();
    every.extend(["LOCKCTL_TOKEN".into(), "LOCKCTL_NAME".into()]);
    every.sort();
    every.dedup();
    assert!(every.len() >= 17, "{every:?}");
    for var in &every {
        let base = || {
            let mut c = lockctl_on(&s);
            if var == "LOCKCTL_REDIS" {
                // The nodes come from the file instead; an empty LOCKCTL_REDIS must not count as
                // a second, conflicting source (nor as an empty URL).
                c.env("LOCKCTL_REDIS_FILE", &file);
            }
            c.env(var, "");
            c
        };
        let mut args = vec!["acquire", "empty", "-n"];
        if var == "LOCKCTL_QUARANTINE" {
            // Unset means the default quarantine, the TTL: 900 ms, over for this server.
            args.extend(["--ttl", "900ms"]);
        }
        let o = run(base().args(&args));
        assert_eq!(code(&o), 0, "{var}='': {}", stderr(&o));
        let token = stdout(&o);
        assert_eq!(
            token.len(),
            32,
            "{var}='': plain output is the token: {token}"
        );
        let o = run(base()
            .env("LOCKCTL_TOKEN", &token)
            .args(["release", "empty"]));
        // LOCKCTL_TOKEN itself is set here, so its own case is covered by bad_input.rs.
        if var != "LOCKCTL_TOKEN" {
            assert_eq!(code(&o), 0, "release with {var}='': {}", stderr(&o));
        }
        let o = run(base().args(["release", "empty", "--token", &token]));
        assert!([0, 76].contains(&code(&o)), "{var}='': {}", stderr(&o));
        assert_eq!(s.get("lockctl:empty"), None);
    }
}

#[test]
fn variables_set_the_options() {
    let s = Server::start();
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_TTL", "7m")
        .env("LOCKCTL_FORMAT", "json")
        .args(["acquire", "env"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(g["ttl_ms"], 420_000);
    // Busy: LOCKCTL_NO_WAIT and LOCKCTL_CONFLICT_EXIT_CODE.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_NO_WAIT", "1")
        .env("LOCKCTL_CONFLICT_EXIT_CODE", "9")
        .args(["acquire", "env"]));
    assert_eq!(code(&o), 9, "{}", stderr(&o));
    // LOCKCTL_QUIET silences the busy line; LOCKCTL_VERBOSE logs steps.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_QUIET", "true")
        .args(["acquire", "env", "-n"]));
    assert_eq!((code(&o), stderr(&o)), (75, String::new()));
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_VERBOSE", "yes")
        .args(["status", "env"]));
    assert!(stderr(&o).contains(" ms] "), "{}", stderr(&o));
    // A value that is not a boolean is a usage error naming the option.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_NO_WAIT", "maybe")
        .args(["acquire", "other"]));
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--no-wait"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:other"), None);
}

#[test]
fn the_command_line_beats_the_environment() {
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "held", &["--ttl", "60s"]);
    // An exported wait does not stop -n from being one attempt.
    let started = Instant::now();
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_WAIT", "120s")
        .args(["acquire", "held", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(started.elapsed() < Duration::from_secs(60), "-n waited");
    // An exported no-wait does not stop -w from waiting: the holder goes away during the wait.
    let tok = acquire_json(&mut lockctl_on(&s), "soon", &["--ttl", "60s"])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let waiter = lockctl_on(&s)
        .env("LOCKCTL_NO_WAIT", "1")
        .args(["acquire", "soon", "-w", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let o = run(lockctl_on(&s).args(["release", "soon", "--token", &tok]));
    assert_eq!(code(&o), 0);
    let o = wait_output(waiter, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "-w lost to LOCKCTL_NO_WAIT: {}", stderr(&o));
    // -q on the command line beats LOCKCTL_VERBOSE.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_VERBOSE", "1")
        .args(["-q", "acquire", "held", "-n"]));
    assert_eq!((code(&o), stderr(&o)), (75, String::new()));
    // Both on the command line: a usage error, as before.
    let o = run(lockctl_on(&s).args(["-q", "-v", "status", "held"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
}

#[test]
fn redis_and_redis_file_one_source_wins() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("nodes");
    std::fs::write(&file, format!("# the lock nodes\n\n  {}  \n", s.url())).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let dead = format!("redis://127.0.0.1:{}", free_port());
    // --redis-file on the command line beats LOCKCTL_REDIS (which names a dead node).
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", &dead)
        .arg("--redis-file")
        .arg(&file)
        .args(["acquire", "a", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stderr(&o), "", "a private file draws no warning");
    // -r on the command line beats LOCKCTL_REDIS_FILE.
    let o = run(lockctl()
        .env("LOCKCTL_REDIS_FILE", &file)
        .args(["-r", &dead, "acquire", "b", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    // Both on the command line, or both in the environment: a usage error that names both.
    let o = run(lockctl()
        .args(["-r", &s.url(), "--redis-file"])
        .arg(&file)
        .args(["acquire", "c", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--redis-file"), "{}", stderr(&o));
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", s.url())
        .env("LOCKCTL_REDIS_FILE", &file)
        .args(["acquire", "c", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("LOCKCTL_REDIS_FILE"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:c"), None);
    assert!(s.get("lockctl:a").is_some());
    assert_eq!(s.get("lockctl:b"), None);
}

fn pttl(s: &Server, key: &str) -> i64 {
    s.cmd(&["PTTL", key])
}

#[test]
fn renew_without_ttl_keeps_the_grant_ttl() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "backup", &["--ttl", "10m"]);
    let token = g["token"].as_str().unwrap();
    s.cmd::<()>(&["PEXPIRE", "lockctl:backup", "100000"]);
    let o = run(lockctl_on(&s).args(["renew", "backup", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let validity: u64 = stdout(&o).parse().unwrap();
    assert!(validity > 500_000 && validity < 600_000, "{validity}");
    let left = pttl(&s, "lockctl:backup");
    assert!(
        left > 500_000 && left <= 600_000,
        "renew shrank the lease to {left} ms"
    );
    // --ttl still sets what it says, and does not change the grant's TTL for the next bare renew.
    let o = run(lockctl_on(&s).args(["renew", "backup", "--token", token, "--ttl", "1m"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(pttl(&s, "lockctl:backup") <= 60_000);
    let o = run(lockctl_on(&s).args(["renew", "backup", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(pttl(&s, "lockctl:backup") > 500_000);
    // LOCKCTL_TTL is --ttl.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_TTL", "2m")
        .args(["renew", "backup", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!((60_000..=120_000).contains(&pttl(&s, "lockctl:backup")));

    // A canonical client's key (no holder record of ours) gets the documented default, 30 s.
    s.cmd::<()>(&["SET", "lockctl:foreign", "canonical-token", "PX", "600000"]);
    let o = run(lockctl_on(&s).args(["renew", "foreign", "--token", "canonical-token"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let left = pttl(&s, "lockctl:foreign");
    assert!(left > 20_000 && left <= 30_000, "{left}");
    let help = stdout(&run(lockctl().args(["renew", "--help"])));
    assert!(help.contains("30s for a lock"), "{help}");
    // Another token still renews nothing.
    let o = run(lockctl_on(&s).args(["renew", "backup", "--token", "canonical-token"]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}

#[test]
fn renew_inside_exec_keeps_the_exec_ttl() {
    let s = Server::start();
    let o = run(lockctl_on(&s)
        .args([
            "exec",
            "job",
            "--ttl",
            "5m",
            "-c",
            "sleep 0.2; lockctl renew job && redis-cli -s \"$SOCK\" pttl lockctl:job",
        ])
        .env("PATH", path_with_lockctl())
        .env("SOCK", s.socket()));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let lines: Vec<&str> = std::str::from_utf8(&o.stdout).unwrap().lines().collect();
    let left: i64 = lines[1].trim().parse().unwrap();
    assert!(
        left > 240_000,
        "the child's renew shrank exec's lease to {left} ms"
    );
}

/// PATH with the lockctl under test first.
fn path_with_lockctl() -> String {
    let bin = Path::new(env!("CARGO_BIN_EXE_lockctl")).parent().unwrap();
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

#[test]
fn token_rule_inherited_token_only_for_its_own_lock() {
    let s = Server::start();
    // Inside exec outer: another lock acquired and released by the script itself.
    let script = r#"
        other=$(lockctl acquire other -n) || exit 10
        lockctl release other; echo "bare release other: $?"
        lockctl renew other; echo "bare renew other: $?"
        redis-cli -s "$SOCK" get lockctl:other
        lockctl release other --token "$other"; echo "release other --token: $?"
        lockctl renew outer > /dev/null; echo "bare renew outer: $?"
    "#;
    let o = run(lockctl_on(&s)
        .args(["exec", "outer", "-c", script])
        .env("PATH", path_with_lockctl())
        .env("SOCK", s.socket()));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert_eq!(code(&o), 0, "{out}{}", stderr(&o));
    assert!(out.contains("bare release other: 2"), "{out}");
    assert!(out.contains("bare renew other: 2"), "{out}");
    assert!(out.contains("release other --token: 0"), "{out}");
    assert!(out.contains("bare renew outer: 0"), "{out}");
    let err = stderr(&o);
    assert!(
        err.contains("LOCKCTL_TOKEN holds the token of lock 'outer'") && err.contains("--token"),
        "{err}"
    );
    // The bare release left other's lock alone: it was still there for the explicit release.
    let token_line = out.lines().nth(2).unwrap();
    assert_eq!(token_line.trim().len(), 32, "{out}");
    assert_eq!(s.get("lockctl:other"), None);
    assert_eq!(s.get("lockctl:outer"), None);

    // LOCKCTL_NAME unset or empty: the inherited token is used, as before.
    let t = acquire_json(&mut lockctl_on(&s), "plain", &[])["token"]
        .as_str()
        .unwrap()
        .to_string();
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_TOKEN", &t)
        .env("LOCKCTL_NAME", "")
        .args(["renew", "plain"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_TOKEN", &t)
        .args(["release", "plain"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}
