//! Bad input exits 2 with a message that names the option, and changes nothing in Redis.
//!
//! Every case runs against a live server that already holds a lock, so "nothing changed" is checked
//! on real state: no new key appears, and the existing lock keeps its token and TTL.

mod support;

use support::*;

/// A server holding lock `held`; returns it with the holder's token.
fn server_with_a_lock() -> (Server, String) {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "held", &["--ttl", "60s"]);
    (s, g["token"].as_str().unwrap().to_string())
}

/// Runs lockctl with `args` and checks: exit 2, each of `words` in stderr, nothing on stdout, and the
/// server's keys and the held lock unchanged.
fn rejects(s: &Server, token: &str, args: &[&str], words: &[&str]) {
    let keys = s.keys();
    let pttl: i64 = s.cmd(&["PTTL", "lockctl:held"]);
    let o = run(lockctl_on(s).args(args));
    let err = stderr(&o);
    assert_eq!(
        code(&o),
        2,
        "{args:?} should be a usage error; stderr: {err}"
    );
    for w in words {
        assert!(
            err.contains(w),
            "{args:?}: the message should name {w:?}: {err}"
        );
    }
    assert_eq!(stdout(&o), "", "{args:?} printed a result");
    assert_eq!(s.keys(), keys, "{args:?} changed the keys");
    assert_eq!(s.get("lockctl:held").as_deref(), Some(token));
    let after: i64 = s.cmd(&["PTTL", "lockctl:held"]);
    assert!(after <= pttl, "{args:?} extended the lock");
}

#[test]
fn bad_ttl() {
    let (s, t) = server_with_a_lock();
    for ttl in [
        "0",
        "0s",
        "0ms",
        "-1",
        "-5s",
        "abc",
        "",
        "10 parsecs",
        "1e400",
        "400d",
        "1us",
    ] {
        rejects(&s, &t, &["acquire", "new", "--ttl", ttl], &["--ttl"]);
        rejects(
            &s,
            &t,
            &["renew", "held", "--token", &t, "--ttl", ttl],
            &["--ttl"],
        );
    }
    rejects(&s, &t, &["acquire", "new", "--ttl=-1"], &["--ttl"]);
}

#[test]
fn bad_wait_and_timeouts() {
    let (s, t) = server_with_a_lock();
    for w in ["-1", "soon", "1e400"] {
        rejects(&s, &t, &["acquire", "new", "-w", w], &["--wait"]);
    }
    rejects(
        &s,
        &t,
        &["acquire", "new", "-w", "1s", "-n"],
        &["--no-wait"],
    );
    for d in ["0", "-1", "x"] {
        rejects(
            &s,
            &t,
            &["--node-timeout", d, "acquire", "new"],
            &["--node-timeout"],
        );
    }
    rejects(
        &s,
        &t,
        &["--quarantine", "x", "acquire", "new"],
        &["--quarantine"],
    );
    for f in ["0.5", "-0.1", "lots"] {
        rejects(
            &s,
            &t,
            &["--drift-factor", f, "acquire", "new"],
            &["--drift-factor"],
        );
    }
}

#[test]
fn bad_conflict_exit_code() {
    let (s, t) = server_with_a_lock();
    for n in ["300", "256", "-1", "x"] {
        rejects(
            &s,
            &t,
            &["acquire", "held", "-n", "-E", n],
            &["--conflict-exit-code"],
        );
    }
}

#[test]
fn bad_names() {
    let (s, t) = server_with_a_lock();
    let long = "x".repeat(513);
    // 171 three-byte characters: 513 bytes, though only 171 characters.
    let long_utf8 = "€".repeat(171);
    for name in ["", "a\nb", "tab\there", "nul\u{7}", &long, &long_utf8] {
        rejects(&s, &t, &["acquire", name], &["NAME"]);
        rejects(&s, &t, &["release", name, "--token", &t], &["NAME"]);
        rejects(&s, &t, &["renew", name, "--token", &t], &["NAME"]);
    }
    // The auxiliary keys' separator is a control character too.
    rejects(&s, &t, &["acquire", "held\u{1f}fence"], &["NAME"]);
    rejects(
        &s,
        &t,
        &["--prefix", "p\u{1f}", "acquire", "new"],
        &["--prefix"],
    );
    // 512 bytes is the limit, and it is allowed.
    let o = run(lockctl_on(&s).args(["acquire", &"y".repeat(512), "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn bad_urls() {
    let (s, t) = server_with_a_lock();
    for url in [
        "http://127.0.0.1:6379",
        "ftp://127.0.0.1",
        "127.0.0.1:6379",
        "redis://",
        "unix://",
        "",
    ] {
        let o = run(lockctl_on(&s).args(["-r", url, "acquire", "new", "-n"]));
        assert_eq!(code(&o), 2, "{url:?}: {}", stderr(&o));
        assert!(stderr(&o).contains("--redis"), "{url:?}: {}", stderr(&o));
    }
    // One bad URL among good ones, through the environment.
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", format!("{},gopher://x", s.url()))
        .args(["acquire", "new", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--redis"), "{}", stderr(&o));
    assert!(stderr(&o).contains("gopher"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:new"), None);
    // The same node twice is not Redlock.
    let o = run(lockctl().args(["-r", &s.url(), "-r", &s.url(), "acquire", "new", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--redis"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:new"), None);
    assert_eq!(s.get("lockctl:held").as_deref(), Some(t.as_str()));
}

#[test]
fn release_and_renew_without_a_token() {
    let (s, t) = server_with_a_lock();
    for cmd in ["release", "renew"] {
        rejects(&s, &t, &[cmd, "held"], &["--token", "LOCKCTL_TOKEN"]);
        rejects(&s, &t, &[cmd, "held", "--token", ""], &["--token"]);
        rejects(&s, &t, &[cmd, "held", "--token", "a\nb"], &["--token"]);
    }
    // An empty LOCKCTL_TOKEN is no token either.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_TOKEN", "")
        .args(["release", "held"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--token"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:held").as_deref(), Some(t.as_str()));
}

#[test]
fn unknown_commands_and_flags() {
    let (s, t) = server_with_a_lock();
    rejects(&s, &t, &["grab", "held"], &["grab"]);
    rejects(
        &s,
        &t,
        &["acquire", "new", "--frobnicate"],
        &["--frobnicate"],
    );
    rejects(
        &s,
        &t,
        &["acquire", "new", "--format", "yaml"],
        &["--format"],
    );
    rejects(&s, &t, &["acquire"], &["NAME"]);
    rejects(
        &s,
        &t,
        &["-q", "-v", "acquire", "new"],
        &["--quiet", "--verbose"],
    );
}

/// `--version` and `-V` alone are answered before clap runs: the same line clap prints, exit 0, even
/// with a bad value in the environment (clap prints the version before it reads the environment).
/// With anything else on the command line clap answers, as before.
#[test]
fn version_is_what_clap_prints() {
    let clap_line = lockctl::cli::command().render_version().to_string();
    assert_eq!(clap_line, lockctl::cli::VERSION_LINE);
    let raw = |o: &std::process::Output| String::from_utf8_lossy(&o.stdout).into_owned();
    for flag in ["--version", "-V"] {
        let o = run(lockctl().arg(flag).env("LOCKCTL_NODE_TIMEOUT", "soon"));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert_eq!(raw(&o), clap_line);
        assert_eq!(stderr(&o), "");
    }
    // Through clap, as before: the same line.
    let o = run(lockctl().args(["-q", "--version"]));
    assert_eq!((code(&o), raw(&o)), (0, clap_line));
    let o = run(lockctl().args(["acquire", "-V"]));
    assert_eq!(
        raw(&o),
        format!("lockctl-acquire {}\n", env!("CARGO_PKG_VERSION"))
    );
}

/// A lockctl with a live server holding `held` in the environment, for messages about other nodes.
fn with_lock_env(s: &Server, args: &[&str]) -> std::process::Output {
    run(lockctl_on(s).args(args))
}

#[test]
fn url_without_scheme_says_what_to_write() {
    let (s, t) = server_with_a_lock();
    rejects(
        &s,
        &t,
        &["-r", "127.0.0.1:16379", "acquire", "new", "-n"],
        &["--redis", "no scheme", "redis://127.0.0.1:16379"],
    );
    rejects(
        &s,
        &t,
        &["-r", "/run/redis/redis.sock", "status", "held"],
        &["unix:///run/redis/redis.sock"],
    );
    // Through the environment too.
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", "localhost:6379")
        .args(["acquire", "new", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("redis://localhost:6379"),
        "{}",
        stderr(&o)
    );
    assert_eq!(s.get("lockctl:new"), None);
}

#[test]
fn password_with_slash_says_to_percent_encode() {
    let (s, t) = server_with_a_lock();
    for url in [
        "redis://:pa/ss@127.0.0.1:6379",
        "redis://user:p@ss/word@127.0.0.1:6379/0",
        "redis://:pa?ss@127.0.0.1:6379",
    ] {
        rejects(
            &s,
            &t,
            &["-r", url, "acquire", "new", "-n"],
            &["--redis", "percent-encode", "%2F", "%40"],
        );
        let o = with_lock_env(&s, &["-r", url, "acquire", "new", "-n"]);
        for secret in ["pa/ss", "p@ss", "pa?ss"] {
            assert!(!stderr(&o).contains(secret), "{}", stderr(&o));
        }
    }
}

#[test]
fn a_port_that_is_not_redis_says_so() {
    let (s, t) = server_with_a_lock();
    // A minimal HTTP server on a loopback port: it answers every connection with a 400.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let _ = std::io::Write::write_all(
                &mut conn,
                b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    for args in [
        &["acquire", "new", "-n"][..],
        &["status", "new"],
        &["release", "held", "--token", &t],
    ] {
        let keys = s.keys();
        let o = run(lockctl().args(["-r", &url]).args(args));
        let err = stderr(&o);
        assert_eq!(code(&o), 69, "{args:?}: {err}");
        assert!(
            err.contains("does not look like a Redis server") && err.contains("host and port"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("Unexpected"), "{err}");
        assert_eq!(s.keys(), keys);
    }
    assert_eq!(s.get("lockctl:held").as_deref(), Some(t.as_str()));
}

#[test]
fn exec_without_a_command_shows_a_usage_without_redis() {
    let (s, t) = server_with_a_lock();
    rejects(&s, &t, &["exec", "mylock"], &["--command", "PROGRAM"]);
    let o = with_lock_env(&s, &["exec", "mylock"]);
    let usage = stderr(&o)
        .lines()
        .find(|l| l.starts_with("Usage:"))
        .unwrap_or_default()
        .to_string();
    assert!(
        usage.contains("-c <COMMAND>") && usage.contains("-- <PROGRAM>"),
        "{usage}"
    );
    assert!(!usage.contains("--redis"), "{usage}");
    assert_eq!(s.get("lockctl:mylock"), None);
}

#[test]
fn acquire_help_shows_only_the_safe_eval_pattern() {
    let o = run(lockctl().args(["acquire", "--help"]));
    let help = stdout(&o);
    assert!(!help.contains("eval \"$(lockctl"), "{help}");
    assert!(help.contains("lock=$(lockctl acquire"), "{help}");
    assert!(help.contains("|| exit"), "{help}");
    assert!(help.contains("eval \"$lock\""), "{help}");
    for page in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/man")).unwrap() {
        let text = std::fs::read_to_string(page.unwrap().path()).unwrap();
        assert!(
            !text.contains("eval \"$(lockctl"),
            "a man page shows the unsafe form"
        );
    }
}

#[test]
fn redis_file_missing_empty_or_bad() {
    let (s, t) = server_with_a_lock();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.conf");
    let empty = dir.path().join("empty.conf");
    std::fs::write(&empty, "# nothing yet\n\n   \n").unwrap();
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, format!("{}\n# next\nhttp://u:Secr3tPw@x\n", s.url())).unwrap();
    for (file, words) in [
        (
            &missing,
            &["--redis-file", "missing.conf", "cannot read"][..],
        ),
        (&empty, &["--redis-file", "empty.conf", "lists no URL"]),
        (&bad, &["bad.conf, line 3", "--redis", "unknown scheme"]),
    ] {
        let f = file.to_str().unwrap();
        rejects(&s, &t, &["--redis-file", f, "acquire", "new", "-n"], words);
        rejects(
            &s,
            &t,
            &["--redis-file", f, "release", "held", "--token", &t],
            words,
        );
    }
    let o = run(lockctl().args(["--redis-file", bad.to_str().unwrap(), "status", "held"]));
    assert!(!stderr(&o).contains("Secr3tPw"), "{}", stderr(&o));
}
