//! A password given in a URL appears in no output: not on success, not in errors, not with `-v`.
//!
//! The servers really require the password (`requirepass`, an ACL user with the default user off), so
//! the tests also show that the password given is the one used. The password is set once the server is
//! up (`CONFIG SET`, `ACL SETUSER`) because the harness checks readiness without logging in; the server
//! enforces it the same way as `--requirepass` on its command line.

mod support;

use std::process::{Command, Output};

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
