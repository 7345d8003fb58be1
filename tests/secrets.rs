//! A password given in a URL appears in no output: not on success, not in errors, not with `-v`.
//!
//! The servers really require the password (`requirepass`, an ACL user with the default user off), so
//! the tests also show that the password given is the one used. The password is set once the server is
//! up (`CONFIG SET`, `ACL SETUSER`) because the harness checks readiness without logging in; the server
//! enforces it the same way as `--requirepass` on its command line.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use support::*;

const PASSWORD: &str = "Sup3rS3cretPw";
const USER_PASSWORD: &str = "AlicesOwnPw42";
const WRONG: &str = "WrongGuessPw77";

/// Runs a command and checks that none of the secrets appears in stdout or stderr.
fn clean(cmd: &mut Command) -> Output {
    let o = run(cmd);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    for secret in [PASSWORD, USER_PASSWORD, WRONG] {
        assert!(!all.contains(secret), "a password leaked:\n{all}");
    }
    o
}

/// acquire, renew and release through `url`, each with `-v`; all succeed and leak nothing.
fn full_cycle(url: &str) {
    let o = clean(lockctl().args(["-v", "-r", url, "acquire", "job", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("***"),
        "-v shows the redacted URL: {}",
        stderr(&o)
    );
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let token = g["token"].as_str().unwrap();
    let o = clean(lockctl().args(["-v", "-r", url, "acquire", "job", "-w", "500ms"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    let o = clean(lockctl().args(["-v", "-r", url, "renew", "job", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = clean(lockctl().args(["-v", "-r", url, "release", "job", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = clean(lockctl().args(["-v", "-r", url, "release", "job", "--token", token]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}

/// A TCP server that requires [`PASSWORD`] from the default user.
fn server_with_password() -> Server {
    let s = Server::start_tcp();
    let ok: String = s.cmd(&["CONFIG", "SET", "requirepass", PASSWORD]);
    assert_eq!(ok, "OK");
    s
}

#[test]
fn requirepass_password_never_printed() {
    let s = server_with_password();
    let port = s.port.unwrap();
    full_cycle(&format!("redis://:{PASSWORD}@127.0.0.1:{port}"));
    full_cycle(&format!("redis://default:{PASSWORD}@127.0.0.1:{port}/0"));
    full_cycle(&format!("unix://{}?pass={PASSWORD}", s.socket().display()));

    // Through the environment as well, and in --help, which shows env variables.
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{port}");
    let o = clean(
        lockctl()
            .env("LOCKCTL_REDIS", &url)
            .args(["-v", "acquire", "env", "-n"]),
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = clean(
        lockctl()
            .env("LOCKCTL_REDIS", &url)
            .args(["acquire", "--help"]),
    );
    assert_eq!(code(&o), 0);
    assert!(stdout(&o).contains("LOCKCTL_REDIS"));
}

#[test]
fn acl_user_password_never_printed() {
    let s = Server::start_tcp();
    let alice = format!(">{USER_PASSWORD}");
    let ok: String = s.cmd(&["ACL", "SETUSER", "alice", "on", &alice, "~*", "&*", "+@all"]);
    assert_eq!(ok, "OK");
    let ok: String = s.cmd(&["ACL", "SETUSER", "default", "off"]);
    assert_eq!(ok, "OK");
    let port = s.port.unwrap();
    full_cycle(&format!("redis://alice:{USER_PASSWORD}@127.0.0.1:{port}"));
}

#[test]
fn wrong_or_missing_password_fails_without_printing_it() {
    let s = server_with_password();
    let port = s.port.unwrap();
    for url in [
        format!("redis://:{WRONG}@127.0.0.1:{port}"),
        format!("redis://nobody:{WRONG}@127.0.0.1:{port}"),
        format!("redis://127.0.0.1:{port}"),
    ] {
        for args in [
            &["-v", "acquire", "job", "-n"][..],
            &[
                "-v",
                "release",
                "job",
                "--token",
                "0123456789abcdef0123456789abcdef",
            ],
            &[
                "-v",
                "renew",
                "job",
                "--token",
                "0123456789abcdef0123456789abcdef",
            ],
        ] {
            let o = clean(lockctl().args(["-r", &url]).args(args));
            assert_ne!(code(&o), 0, "{args:?}");
            assert!(
                stderr(&o).contains("password") || stderr(&o).contains("NOAUTH"),
                "{args:?}: the error says what is wrong: {}",
                stderr(&o)
            );
        }
    }
    let keys: Vec<String> = {
        let mut c = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("KEYS").arg("*").query(&mut c).unwrap()
    };
    assert!(keys.is_empty(), "{keys:?}");
}

#[test]
fn unreachable_node_with_a_password_is_redacted() {
    let port = free_port();
    let url = format!("redis://user:{PASSWORD}@127.0.0.1:{port}");
    let o = clean(lockctl().args(["-v", "-r", &url, "acquire", "job", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(stderr(&o).contains("user:***@127.0.0.1"), "{}", stderr(&o));
}

#[test]
fn bad_urls_with_passwords_are_redacted() {
    for url in [
        format!("http://user:{PASSWORD}@127.0.0.1:6379"),
        format!("gopher://:{PASSWORD}@host"),
        format!("redis://user:{PASSWORD}@[::1"),
        format!("redis://user:{PASSWORD}@127.0.0.1:notaport"),
        PASSWORD.to_string(),
        format!("unix:///tmp/x.sock?password={PASSWORD}&db=x"),
    ] {
        let o = clean(lockctl().args(["-v", "-r", &url, "acquire", "job", "-n"]));
        assert_eq!(code(&o), 2, "{url}: {}", stderr(&o));
        assert!(stderr(&o).contains("--redis"), "{}", stderr(&o));
    }
}

/// A private `--redis-file` naming `url`, in `dir`.
fn redis_file(dir: &std::path::Path, url: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let file = dir.join("redis.conf");
    std::fs::write(&file, format!("# lock nodes\n\n{url}\n")).unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
    file
}

/// Every value stored on the server (strings and hashes), as one text.
fn everything_stored(s: &Server) -> String {
    let mut c = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{}", s.port.unwrap()))
        .unwrap()
        .get_connection()
        .unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
    let mut all = keys.join("\n");
    for k in keys {
        let t: String = redis::cmd("TYPE").arg(&k).query(&mut c).unwrap();
        let v: Vec<String> = match t.as_str() {
            "hash" => redis::cmd("HGETALL").arg(&k).query(&mut c).unwrap(),
            "string" => vec![redis::cmd("GET").arg(&k).query(&mut c).unwrap()],
            _ => vec![],
        };
        all.push('\n');
        all.push_str(&v.join("\n"));
    }
    all
}

#[test]
fn password_from_redis_file_reaches_no_argv_log_output_or_holder() {
    let s = server_with_password();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", s.port.unwrap());
    let file = redis_file(dir.path(), &url, 0o600);
    let f = file.to_str().unwrap();

    // A holder through exec, and a waiter through the environment variable, both with -v.
    let mut holder = lockctl()
        .args([
            "-v",
            "--redis-file",
            f,
            "exec",
            "job",
            "--",
            "sh",
            "-c",
            "echo ready; sleep 30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let holder_err = collect_stderr(holder.stderr.take().unwrap());
    let _ready = wait_for_line(
        holder.stdout.take().unwrap(),
        "ready",
        Duration::from_secs(30),
    );
    let mut waiter = lockctl()
        .env("LOCKCTL_REDIS_FILE", f)
        .args(["-v", "acquire", "job", "-w", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let waiter_pid = waiter.id() as i32;
    let waiter_err = collect_stderr(waiter.stderr.take().unwrap());
    // The waiter is waiting (it said so) and its command line holds no password.
    std::thread::sleep(Duration::from_millis(500));
    assert!(alive(waiter_pid));
    for pid in [waiter_pid, holder.id() as i32] {
        let argv = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        assert!(
            !String::from_utf8_lossy(&argv).contains(PASSWORD),
            "argv of {pid} holds the password"
        );
    }
    // An acquire whose caller's command line (stored as the holder) names the file.
    let o = run(Command::new("sh")
        .arg("-c")
        .arg(format!(
            "LOCKCTL_QUARANTINE=0 {} --redis-file {f} acquire second -n; sleep 0.1",
            env!("CARGO_BIN_EXE_lockctl")
        ))
        .env_remove("LOCKCTL_REDIS"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // Nothing stored in Redis (holder records, command lines) holds it; nor does status.
    let stored = everything_stored(&s);
    assert!(
        stored.contains("--redis-file"),
        "the holder record names the file: {stored}"
    );
    assert!(!stored.contains(PASSWORD), "{stored}");
    let o = clean(lockctl().args(["-v", "--redis-file", f, "status", "job"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = clean(lockctl().args(["--redis-file", f, "list", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    kill(holder.id() as i32, libc::SIGTERM);
    holder.wait().unwrap();
    kill(waiter_pid, libc::SIGTERM);
    waiter.wait().unwrap();
    let logs = format!(
        "{}{}",
        holder_err.join().unwrap(),
        waiter_err.join().unwrap()
    );
    assert!(logs.contains("***"), "-v shows the redacted URL: {logs}");
    assert!(!logs.contains(PASSWORD), "{logs}");

    // Errors: a wrong password in the file, and a node that is down.
    let wrong = redis_file(
        dir.path(),
        &format!("redis://:{WRONG}@127.0.0.1:{}", s.port.unwrap()),
        0o600,
    );
    let o = clean(
        lockctl()
            .arg("--redis-file")
            .arg(&wrong)
            .args(["-v", "acquire", "x", "-n"]),
    );
    assert_ne!(code(&o), 0);
    let down = redis_file(
        dir.path(),
        &format!("redis://:{PASSWORD}@127.0.0.1:{}", free_port()),
        0o600,
    );
    let o = clean(
        lockctl()
            .arg("--redis-file")
            .arg(&down)
            .args(["-v", "acquire", "x", "-n"]),
    );
    assert_eq!(code(&o), 69, "{}", stderr(&o));
}

#[test]
fn redis_file_readable_by_others_draws_a_warning() {
    let s = server_with_password();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{}", s.port.unwrap());
    for (mode, who) in [(0o644, "everyone"), (0o640, "its group")] {
        let file = redis_file(dir.path(), &url, mode);
        // Even with -q: it is about the operator's secrets, not a routine diagnostic.
        let o = clean(
            lockctl()
                .arg("--redis-file")
                .arg(&file)
                .args(["-q", "status", "x"]),
        );
        assert_eq!(code(&o), 1, "the command still runs: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains("warning") && err.contains(who), "{err}");
        assert!(
            err.contains(&format!("chmod 600 {}", file.display())),
            "{err}"
        );
    }
}

#[test]
fn password_with_at_and_slash_works_percent_encoded() {
    let s = Server::start_tcp();
    let pw = "p@ss/w0rd?#x";
    let ok: String = s.cmd(&["CONFIG", "SET", "requirepass", pw]);
    assert_eq!(ok, "OK");
    let port = s.port.unwrap();
    // As typed: a usage error that says to percent-encode, without the password.
    let o = run(lockctl().args([
        "-r",
        &format!("redis://:{pw}@127.0.0.1:{port}"),
        "acquire",
        "a",
        "-n",
    ]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("%2F") && !stderr(&o).contains("w0rd"),
        "{}",
        stderr(&o)
    );
    // Percent-encoded as the message says: it authenticates.
    let encoded = "p%40ss%2Fw0rd%3F%23x";
    let o = run(lockctl().args([
        "-r",
        &format!("redis://:{encoded}@127.0.0.1:{port}"),
        "acquire",
        "a",
        "-n",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A password with '@' alone needs no encoding.
    let s = Server::start_tcp();
    let ok: String = s.cmd(&["CONFIG", "SET", "requirepass", "at@sign"]);
    assert_eq!(ok, "OK");
    let port = s.port.unwrap();
    let o = run(lockctl().args([
        "-r",
        &format!("redis://:at@sign@127.0.0.1:{port}"),
        "acquire",
        "b",
        "-n",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

/// Every command that reports a node's failure names the node, and the name never carries the
/// password: a wrong password, a database the server refuses, a port nobody listens on, and a
/// stopped server (the node timeout's message), each through every command.
#[test]
fn errors_that_name_a_node_never_show_its_password() {
    let s = server_with_password();
    let port = s.port.unwrap();
    let stopped = server_with_password();
    let stopped_port = stopped.port.unwrap();
    stopped.pause();
    let nobody = free_port();
    let cases = [
        (
            format!("redis://:{WRONG}@127.0.0.1:{port}"),
            format!("redis://:***@127.0.0.1:{port}"),
        ),
        (
            format!("redis://:{PASSWORD}@127.0.0.1:{port}/99"),
            format!("redis://:***@127.0.0.1:{port}/99"),
        ),
        (
            format!("redis://user:{PASSWORD}@127.0.0.1:{nobody}/2"),
            format!("redis://user:***@127.0.0.1:{nobody}/2"),
        ),
        (
            format!("unix://{}?pass={PASSWORD}&db=99", s.socket().display()),
            format!("unix://{}?pass=***&db=99", s.socket().display()),
        ),
        (
            format!("redis://:{PASSWORD}@127.0.0.1:{stopped_port}"),
            format!("redis://:***@127.0.0.1:{stopped_port}"),
        ),
    ];
    let token = "0123456789abcdef0123456789abcdef";
    let commands: [&[&str]; 8] = [
        &["acquire", "job", "-n"],
        &["release", "job", "--token", token],
        &["renew", "job", "--token", token],
        &["exec", "job", "-n", "--", "true"],
        &["status", "job"],
        &["list"],
        &["break", "job", "--yes"],
        &["doctor"],
    ];
    for (url, shown) in &cases {
        for args in commands {
            let o = clean(
                lockctl()
                    .args(["-v", "--node-timeout", "300ms", "-r", url])
                    .args(args),
            );
            assert_ne!(code(&o), 0, "{args:?} through {shown}");
            let all = format!("{}{}", stdout(&o), stderr(&o));
            assert!(
                all.contains(&format!("{shown}: ")),
                "{args:?}: the error names the node as {shown}:\n{all}"
            );
        }
    }
    // Redlock: the summary of several nodes' failures, one node per server.
    let distinct = [&cases[0], &cases[2], &cases[4]];
    let urls = distinct.map(|(u, _)| u.as_str()).join(",");
    let o = clean(lockctl().env("LOCKCTL_REDIS", &urls).args([
        "--node-timeout",
        "300ms",
        "acquire",
        "job",
        "-n",
    ]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    for (_, shown) in distinct {
        assert!(
            stderr(&o).contains(shown.as_str()),
            "{shown}: {}",
            stderr(&o)
        );
    }
    stopped.resume();

    // A server that stops while a holder is connected: the renewal's timeout names the node.
    let held = server_with_password();
    let held_port = held.port.unwrap();
    let url = format!("redis://:{PASSWORD}@127.0.0.1:{held_port}");
    let child = lockctl()
        .args(["-v", "--node-timeout", "300ms", "-r", &url])
        .args([
            "exec",
            "held",
            "--ttl",
            "1s",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The command runs once the grant is complete (the key alone can be there before lockctl has
    // its reply, and a server paused then fails the attempt, not a renewal).
    let mut child = child;
    let _out = wait_for_line(
        child.stdout.take().unwrap(),
        "ready",
        std::time::Duration::from_secs(30),
    );
    held.pause();
    let o = wait_output(child, std::time::Duration::from_secs(60));
    held.resume();
    let all = format!("{}{}", stdout(&o), stderr(&o));
    for secret in [PASSWORD, USER_PASSWORD, WRONG] {
        assert!(!all.contains(secret), "a password leaked:\n{all}");
    }
    assert_eq!(code(&o), 76, "{all}");
    assert!(
        all.contains(&format!("redis://:***@127.0.0.1:{held_port}: no answer")),
        "the renewal's timeout names the node: {all}"
    );

    let keys: Vec<String> = {
        let mut c = redis::Client::open(format!("redis://:{PASSWORD}@127.0.0.1:{port}"))
            .unwrap()
            .get_connection()
            .unwrap();
        redis::cmd("KEYS").arg("*").query(&mut c).unwrap()
    };
    assert!(keys.is_empty(), "{keys:?}");
}
