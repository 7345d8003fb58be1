//! TLS, credentials and ACLs against real servers, and what `break` and `list` may touch.
//!
//! The TLS tests make a throwaway CA and certificates with `openssl` and start redis-server with
//! `--tls-port`, so verification is the real thing: rustls checks the chain against `--tls-ca` and the
//! host against the certificate's subjectAltName (an IP address must be listed as an IP SAN; a common
//! name is never enough). They fail, never skip, when `openssl` is missing.
//!
//! The ACL test runs every command under the minimal ACL that docs/security.md recommends, and the
//! server's `ACL LOG` proves that nothing was refused along the way.

mod support;

use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

use support::tls::{Pki, TlsServer};

/// acquire, check the key on the server, renew, release: all through `cmd_for()`.
fn full_cycle(server: &Server, mut cmd_for: impl FnMut() -> Command, name: &str) {
    let grant = acquire_json(&mut cmd_for(), name, &["-n"]);
    let token = grant["token"].as_str().unwrap().to_string();
    assert_eq!(
        server.get(&format!("lockctl:{name}")).as_deref(),
        Some(token.as_str())
    );
    let o = run(cmd_for().args(["renew", name, "--token", &token]));
    assert_eq!(code(&o), 0, "renew: {}", stderr(&o));
    let o = run(cmd_for().args(["release", name, "--token", &token]));
    assert_eq!(code(&o), 0, "release: {}", stderr(&o));
    assert_eq!(server.get(&format!("lockctl:{name}")), None);
}

/// Only fencing counters (which never expire) may be left behind.
fn assert_no_lock_keys(server: &Server) {
    let keys: Vec<String> = server
        .keys()
        .into_iter()
        .filter(|k| !k.ends_with("\u{1f}fence"))
        .collect();
    assert!(keys.is_empty(), "keys left: {keys:?}");
}

// ---------------------------------------------------------------------------------------------
// TLS

#[test]
fn tls_with_the_ca_works_by_ip_and_by_name() {
    let pki = Pki::new("IP:127.0.0.1,DNS:localhost");
    let tls = TlsServer::start(&pki, false);
    for host in ["127.0.0.1", "localhost"] {
        full_cycle(
            &tls.server,
            || {
                let mut c = lockctl();
                c.args(["-r", &tls.url(host), "--tls-ca", &pki.arg("ca.crt")]);
                c
            },
            &format!("tls-{host}"),
        );
    }
    // The CA from the environment.
    full_cycle(
        &tls.server,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", tls.url("127.0.0.1"))
                .env("LOCKCTL_TLS_CA", pki.path("ca.crt"));
            c
        },
        "tls-env",
    );
}

#[test]
fn tls_without_the_ca_fails_verification_clearly() {
    let pki = Pki::new("IP:127.0.0.1,DNS:localhost");
    let tls = TlsServer::start(&pki, false);
    let cases: [(&str, Vec<String>); 2] = [
        ("system roots", vec![]),
        (
            "another CA",
            vec!["--tls-ca".into(), pki.arg("other-ca.crt")],
        ),
    ];
    for (what, extra) in cases {
        let o = run(lockctl()
            .args(["-r", &tls.url("127.0.0.1")])
            .args(&extra)
            .args(["acquire", "x", "-n"]));
        let err = stderr(&o);
        assert_eq!(code(&o), 69, "{what}: {err}");
        assert!(
            err.contains("certificate"),
            "{what}: says it is about the certificate: {err}"
        );
        assert!(
            err.contains("--tls-ca"),
            "{what}: says to use --tls-ca: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
    assert!(tls.server.keys().is_empty());
}

#[test]
fn an_ip_address_must_be_in_the_certificates_subject_alt_name() {
    // Common name 127.0.0.1, but only a DNS SAN: good for localhost, not for the IP address.
    let pki = Pki::new("DNS:localhost");
    let tls = TlsServer::start(&pki, false);
    let ca = pki.arg("ca.crt");
    let o = run(lockctl().args([
        "-r",
        &tls.url("127.0.0.1"),
        "--tls-ca",
        &ca,
        "acquire",
        "x",
        "-n",
    ]));
    let err = stderr(&o);
    assert_eq!(code(&o), 69, "{err}");
    assert!(
        err.contains("subjectAltName"),
        "says the name does not match: {err}"
    );
    assert!(tls.server.keys().is_empty());
    let o = run(lockctl().args([
        "-r",
        &tls.url("localhost"),
        "--tls-ca",
        &ca,
        "acquire",
        "x",
        "-n",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn tls_client_certificates() {
    let pki = Pki::new("IP:127.0.0.1");
    let tls = TlsServer::start(&pki, true);
    let url = tls.url("127.0.0.1");
    let ca = pki.arg("ca.crt");
    full_cycle(
        &tls.server,
        || {
            let mut c = lockctl();
            c.args(["-r", &url, "--tls-ca", &ca]).args([
                "--tls-cert",
                &pki.arg("client.crt"),
                "--tls-key",
                &pki.arg("client.key"),
            ]);
            c
        },
        "mtls",
    );
    full_cycle(
        &tls.server,
        || {
            let mut c = lockctl();
            c.env("LOCKCTL_REDIS", &url)
                .env("LOCKCTL_TLS_CA", &ca)
                .env("LOCKCTL_TLS_CERT", pki.path("client.crt"))
                .env("LOCKCTL_TLS_KEY", pki.path("client.key"));
            c
        },
        "mtls-env",
    );
    // No client certificate: refused by the server, and the message says what to pass.
    let o = run(lockctl().args(["-r", &url, "--tls-ca", &ca, "acquire", "x", "-n"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 69, "{err}");
    assert!(
        err.contains("--tls-cert") && err.contains("--tls-key"),
        "{err}"
    );
    assert!(
        !tls.server.keys().iter().any(|k| k.contains("lockctl:x")),
        "{:?}",
        tls.server.keys()
    );
}

#[test]
fn waiting_and_exec_work_over_tls() {
    let pki = Pki::new("IP:127.0.0.1");
    let tls = TlsServer::start(&pki, true);
    let base = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", tls.url("127.0.0.1"))
            .env("LOCKCTL_TLS_CA", pki.path("ca.crt"))
            .env("LOCKCTL_TLS_CERT", pki.path("client.crt"))
            .env("LOCKCTL_TLS_KEY", pki.path("client.key"));
        c
    };
    let grant = acquire_json(&mut base(), "shared", &["--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let waiter = base()
        .args(["acquire", "shared", "-w", "50s", "--ttl", "60s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The waiter subscribes to its wake channel over its own TLS connection.
    let channel = "{lockctl:shared}\u{1f}wake\u{1f}*";
    assert!(
        eventually(Duration::from_secs(20), || {
            let n: Vec<String> = tls.server.cmd(&["PUBSUB", "CHANNELS", channel]);
            n.len() == 1
        }),
        "the waiter never subscribed over TLS"
    );
    let started = Instant::now();
    let o = run(base().args(["release", "shared", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // Woken by the release, far sooner than the 60 s the holder's lease had left.
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let new_token = stdout(&o);
    assert_eq!(
        tls.server.get("lockctl:shared").as_deref(),
        Some(new_token.as_str())
    );

    let o = run(base().args([
        "exec",
        "job",
        "-n",
        "--ttl",
        "2s",
        "-c",
        "echo \"$LOCKCTL_FENCE\"",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stdout(&o).parse::<u64>().is_ok_and(|f| f > 0),
        "{}",
        stdout(&o)
    );
    assert_eq!(tls.server.get("lockctl:job"), None);
}

#[test]
fn plain_and_tls_mixed_up_fail_clearly_and_promptly() {
    let pki = Pki::new("IP:127.0.0.1");
    let tls = TlsServer::start(&pki, false);
    // redis:// to a TLS port: the server drops the connection.
    let o = run(lockctl().args([
        "-r",
        &format!("redis://127.0.0.1:{}", tls.port),
        "acquire",
        "x",
        "-n",
    ]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    // rediss:// to a plain port: no handshake ever comes back; the node timeout ends it.
    let plain = Server::start_tcp();
    let started = Instant::now();
    let url = format!("rediss://127.0.0.1:{}", plain.port.unwrap());
    let o = run(lockctl()
        .args([
            "-r",
            &url,
            "--node-timeout",
            "300ms",
            "--tls-ca",
            &pki.arg("ca.crt"),
        ])
        .args(["acquire", "x", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(stderr(&o).contains("TLS"), "{}", stderr(&o));
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "no hang: {:?}",
        started.elapsed()
    );
    assert_no_lock_keys(&tls.server);
    assert_no_lock_keys(&plain);
}

#[test]
fn bad_tls_options_are_usage_errors() {
    let pki = Pki::new("IP:127.0.0.1");
    let tls = TlsServer::start(&pki, true);
    let url = tls.url("127.0.0.1");
    let missing = pki.arg("missing.pem");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (vec!["--tls-ca".into(), missing.clone()], "--tls-ca"),
        (vec!["--tls-ca".into(), pki.arg("server.ext")], "--tls-ca"),
        (vec!["--tls-ca".into(), pki.arg("ca.key")], "--tls-ca"),
        (
            vec![
                "--tls-cert".into(),
                pki.arg("client.key"),
                "--tls-key".into(),
                pki.arg("client.key"),
            ],
            "--tls-cert",
        ),
        (
            vec!["--tls-cert".into(), pki.arg("client.crt")],
            "--tls-key",
        ),
        (
            vec!["--tls-key".into(), pki.arg("client.key")],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                missing.clone(),
                "--tls-key".into(),
                pki.arg("client.key"),
            ],
            "--tls-cert",
        ),
        (
            vec![
                "--tls-cert".into(),
                pki.arg("client.crt"),
                "--tls-key".into(),
                pki.arg("client.ext"),
            ],
            "key",
        ),
    ];
    for (extra, needle) in cases {
        let o = run(lockctl()
            .args(["-r", &url])
            .args(&extra)
            .args(["acquire", "x", "-n"]));
        let err = stderr(&o);
        assert_eq!(code(&o), 2, "{extra:?}: {err}");
        assert!(err.contains(needle), "{extra:?}: names {needle}: {err}");
    }
    // Turning verification off in the URL is refused, pointing at --tls-ca.
    let o = run(lockctl().args(["-r", &format!("{url}#insecure"), "acquire", "x", "-n"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--tls-ca"), "{}", stderr(&o));
    assert!(tls.server.keys().is_empty());
}

// ---------------------------------------------------------------------------------------------
// Credentials and ACLs

const ADMIN_PW: &str = "Adm1nPassw0rdXYZ";
const LOCKER_PW: &str = "L0ckerPassw0rdQRS";
const WRONG_PW: &str = "Wr0ngGuessKLM";

/// A TCP server whose default user needs [`ADMIN_PW`]; returns it and an admin connection (over the
/// unix socket, with the password).
fn server_with_requirepass() -> (Server, redis::Connection) {
    let s = Server::start_tcp();
    let ok: String = s.cmd(&["CONFIG", "SET", "requirepass", ADMIN_PW]);
    assert_eq!(ok, "OK");
    let url = format!("unix://{}?pass={ADMIN_PW}", s.socket().display());
    let admin = redis::Client::open(url).unwrap().get_connection().unwrap();
    (s, admin)
}

/// The keys, without the records releases leave for a few seconds (see `Server::keys`).
fn admin_keys(admin: &mut redis::Connection) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(admin).unwrap();
    keys.retain(|k| !is_release_record(k));
    keys
}

fn leaks(o: &std::process::Output) -> bool {
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    [ADMIN_PW, LOCKER_PW, WRONG_PW]
        .iter()
        .any(|pw| all.contains(pw))
}

#[test]
fn requirepass_and_wrong_passwords() {
    let (s, mut admin) = server_with_requirepass();
    let port = s.port.unwrap();
    let tcp = format!("redis://:{ADMIN_PW}@127.0.0.1:{port}");
    let unix = format!("unix://{}?pass={ADMIN_PW}", s.socket().display());
    for url in [&tcp, &unix] {
        let grant = acquire_json(lockctl().args(["-r", url]), "pw", &["-n"]);
        let token = grant["token"].as_str().unwrap();
        let o = run(lockctl().args(["-r", url, "-v", "release", "pw", "--token", token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(!leaks(&o), "{}", stderr(&o));
    }
    let wrong = [
        (format!("redis://:{WRONG_PW}@127.0.0.1:{port}"), "password"),
        (
            format!("redis://default:{WRONG_PW}@127.0.0.1:{port}"),
            "password",
        ),
        (
            format!("unix://{}?pass={WRONG_PW}", s.socket().display()),
            "password",
        ),
        (format!("redis://127.0.0.1:{port}"), "requires a password"),
    ];
    for (url, needle) in &wrong {
        for verbose in [false, true] {
            let mut cmd = lockctl();
            cmd.args(["-r", url]);
            if verbose {
                cmd.arg("-v");
            }
            for args in [
                &["acquire", "pw", "-n"][..],
                &["acquire", "pw", "-w", "1s", "--format", "json"],
            ] {
                let o = run(cmd_clone(&cmd).args(args));
                let err = stderr(&o);
                // The server answered and refuses: a misconfiguration (78), not an outage (69).
                assert_eq!(code(&o), 78, "{url}: {err}");
                assert!(err.contains(needle), "{needle:?} in {err}");
                assert!(!leaks(&o), "a password leaked: {err}");
                assert!(stdout(&o).is_empty());
            }
        }
    }
    assert!(admin_keys(&mut admin)
        .iter()
        .all(|k| k.ends_with("\u{1f}fence")));
    let held: Option<String> = redis::cmd("GET")
        .arg("lockctl:pw")
        .query(&mut admin)
        .unwrap();
    assert_eq!(held, None, "no lock was created with a wrong password");
}

/// `Command` is not `Clone`; rebuild one with the same program, args and env.
fn cmd_clone(c: &Command) -> Command {
    let mut n = Command::new(c.get_program());
    n.args(c.get_args());
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => n.env(k, v),
            None => n.env_remove(k),
        };
    }
    n.stdin(std::process::Stdio::null());
    n
}

/// The minimal ACL of docs/security.md, for the default prefix `lockctl:`.
const MINIMAL_ACL: &[&str] = &[
    "resetkeys",
    "resetchannels",
    "-@all",
    "~lockctl:*",
    "~{lockctl:*",
    "~{*}?lockctl:*",
    "&lockctl:*",
    "&{lockctl:*",
    "&{*}?lockctl:*",
    "&__keyspace@*__:lockctl:*",
    "+evalsha",
    "+eval",
    "+script|load",
    "+subscribe",
    "+get",
    "+set",
    "+incr",
    "+hset",
    "+hmget",
    "+hgetall",
    "+pttl",
    "+pexpire",
    "+del",
    "+publish",
    "+info",
    "+time",
    "+wait",
    "+scan",
    "+ping",
    "+role",
    "+config|get",
    "+exists",
    "+hget",
    "+hdel",
    "+zadd",
    "+zrem",
    "+zrange",
    "+zrangebyscore",
    "+zrank",
    "+zscore",
    "+zcount",
    "+zcard",
    "+pubsub|numsub",
];

fn acl_denials(admin: &mut redis::Connection) -> Vec<String> {
    let log: Vec<redis::Value> = redis::cmd("ACL").arg("LOG").query(admin).unwrap();
    log.iter().map(|entry| format!("{entry:?}")).collect()
}

#[test]
fn everything_works_under_the_minimal_acl() {
    let (s, mut admin) = server_with_requirepass();
    let port = s.port.unwrap();
    let mut setuser = redis::cmd("ACL");
    setuser
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{LOCKER_PW}"))
        .arg(MINIMAL_ACL);
    let () = setuser.query(&mut admin).unwrap();
    let url = format!("redis://locker:{LOCKER_PW}@127.0.0.1:{port}");
    let as_locker = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        c
    };
    let get = |admin: &mut redis::Connection, k: &str| -> Option<String> {
        redis::cmd("GET").arg(k).query(admin).unwrap()
    };

    // acquire, renew, status, list, release; also a name with its own hash tag, and one whose braces
    // make no tag.
    for name in ["job", "{app}:job", "a}b"] {
        let grant = acquire_json(&mut as_locker(), name, &["-n", "--ttl", "60s"]);
        let token = grant["token"].as_str().unwrap().to_string();
        assert_eq!(
            get(&mut admin, &format!("lockctl:{name}")).as_deref(),
            Some(token.as_str())
        );
        let o = run(as_locker().args(["renew", name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let o = run(as_locker().args(["status", name, "--format", "json"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let o = run(as_locker().args(["list", "--format", "json"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(stdout(&o).contains(&token), "{}", stdout(&o));
        let o = run(as_locker().args(["release", name, "--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }

    // A waiter subscribes (its wake channel and keyspace events) and is woken by the release.
    let grant = acquire_json(&mut as_locker(), "wait", &["--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let waiter = as_locker()
        .args(["acquire", "wait", "-w", "50s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || {
            let wake: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg("{lockctl:wait}\u{1f}wake\u{1f}*")
                .query(&mut admin)
                .unwrap();
            let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg("__keyspace@0__:lockctl:wait")
                .query(&mut admin)
                .unwrap();
            wake.len() == 1 && n.iter().all(|(_, subs)| *subs >= 1)
        }),
        "the waiter could not subscribe under the minimal ACL"
    );
    let started = Instant::now();
    let o = run(as_locker().args(["release", "wait", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    // exec renews (every TTL/3) while the child outlives the TTL, then releases.
    let o = run(as_locker().args([
        "exec",
        "run",
        "-n",
        "--ttl",
        "2s",
        "-c",
        "sleep 3; echo done",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(stdout(&o), "done");

    // break and doctor.
    acquire_json(&mut as_locker(), "stuck", &["-n"]);
    let o = run(as_locker().args(["break", "stuck", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(get(&mut admin, "lockctl:stuck"), None);
    let o = run(as_locker().args(["doctor"]));
    assert!(
        !stderr(&o).contains("NoPerm") && !stdout(&o).contains("NoPerm"),
        "{}",
        stdout(&o)
    );

    // Scripts flushed: EVALSHA gets NOSCRIPT and SCRIPT LOAD is allowed.
    let () = redis::cmd("SCRIPT").arg("FLUSH").query(&mut admin).unwrap();
    let grant = acquire_json(&mut as_locker(), "after-flush", &["-n"]);
    assert!(grant["fence"].as_u64().unwrap() >= 1);

    let denials = acl_denials(&mut admin);
    assert!(
        denials.is_empty(),
        "the minimal ACL refused something: {denials:#?}"
    );
}

#[test]
fn an_acl_without_the_aux_key_pattern_fails_clearly() {
    let (s, mut admin) = server_with_requirepass();
    let port = s.port.unwrap();
    // The common mistake: ~lockctl:* alone, forgetting the {lockctl:...} auxiliary keys.
    let acl: Vec<&str> = MINIMAL_ACL
        .iter()
        .copied()
        .filter(|r| *r != "~{lockctl:*")
        .collect();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{LOCKER_PW}"))
        .arg(&acl)
        .query(&mut admin)
        .unwrap();
    let url = format!("redis://locker:{LOCKER_PW}@127.0.0.1:{port}");
    for verbose in [&[][..], &["-v"]] {
        let o = run(lockctl()
            .args(["-r", &url])
            .args(verbose)
            .args(["acquire", "job", "-n"]));
        let err = stderr(&o);
        assert_eq!(code(&o), 78, "{err}");
        assert!(
            err.contains("~{lockctl:*") && err.contains("docs/security.md"),
            "{err}"
        );
        assert!(!leaks(&o), "{err}");
    }
    assert!(admin_keys(&mut admin).is_empty(), "nothing was written");
}

// ---------------------------------------------------------------------------------------------
// break and list stay under the prefix

#[test]
fn break_and_list_touch_only_keys_under_the_prefix() {
    let s = Server::start();
    // Keys that are not lockctl's: other prefixes, look-alikes, a hash under the prefix, and
    // strings that glob patterns would match if the prefix were not escaped.
    let foreign: &[(&str, &str)] = &[
        ("app:job", "0123456789abcdef0123456789abcdef"),
        ("lockctlx", "v"),
        ("lockctl", "v"),
        ("{lockctl:job}", "v"),
        ("LOCKCTL:job", "v"),
    ];
    for (k, v) in foreign {
        let () = s.cmd(&["SET", k, v]);
    }
    let () = s.cmd(&["HSET", "lockctl:a-hash", "f", "v"]);
    let () = s.cmd(&["SET", "ab:glob", "v"]);
    let () = s.cmd(&["SET", "ax:glob", "v"]);
    let () = s.cmd(&["SET", "x:glob", "v"]);
    // Our locks, and locks under other prefixes, including glob characters in the prefix.
    let job = acquire_json(&mut lockctl_on(&s), "job", &["-n"]);
    acquire_json(&mut lockctl_on(&s), "other", &["-n"]);
    acquire_json(lockctl_on(&s).args(["--prefix", "team:"]), "job", &["-n"]);
    acquire_json(lockctl_on(&s).args(["--prefix", "a*:"]), "glob", &["-n"]);
    acquire_json(lockctl_on(&s).args(["--prefix", "[x]:"]), "glob", &["-n"]);

    let names = |prefix: &str, pattern: &str| -> Vec<String> {
        let o = run(lockctl_on(&s).args(["--prefix", prefix, "list", pattern, "--format", "json"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
        let mut n: Vec<String> = v["locks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["name"].as_str().unwrap().to_string())
            .collect();
        n.sort();
        n
    };
    assert_eq!(names("lockctl:", "*"), ["job", "other"]);
    assert_eq!(names("lockctl:", "j*"), ["job"]);
    assert_eq!(names("team:", "*"), ["job"]);
    assert_eq!(
        names("a*:", "*"),
        ["glob"],
        "the prefix is literal, not a glob"
    );
    assert_eq!(names("[x]:", "*"), ["glob"]);

    let before = s.keys();
    // Breaking a name held only under another prefix deletes nothing.
    let o = run(lockctl_on(&s).args(["--prefix", "lockctl:", "break", "glob", "--yes"]));
    assert_ne!(code(&o), 2, "{}", stderr(&o));
    assert_eq!(s.keys(), before);
    // Breaking ours deletes the lock key and its holder record, nothing else; the fence stays.
    let o = run(lockctl_on(&s).args(["break", "job", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let gone: Vec<&String> = before.iter().filter(|k| !s.keys().contains(k)).collect();
    assert_eq!(gone, ["lockctl:job", "{lockctl:job}\u{1f}holder"]);
    assert_eq!(
        s.get("{lockctl:job}\u{1f}fence"),
        Some(job["fence"].to_string())
    );
    for (k, v) in foreign {
        assert_eq!(s.get(k).as_deref(), Some(*v), "{k} survived");
    }
    assert!(
        s.get("team:job").is_some() && s.get("a*:glob").is_some() && s.get("[x]:glob").is_some()
    );
    assert_eq!(s.cmd::<String>(&["TYPE", "lockctl:a-hash"]), "hash");
}

#[test]
fn a_holders_command_line_keeps_no_password() {
    let (s, mut admin) = server_with_requirepass();
    let url = format!("redis://:{ADMIN_PW}@127.0.0.1:{}", s.port.unwrap());
    let bin = env!("CARGO_BIN_EXE_lockctl");
    // The usual cron line: a shell runs lockctl with the URL on its command line, and that shell is
    // the holder whose command line acquire records.
    let script = format!("'{bin}' -r '{url}' acquire from-sh -n --ttl 60s >/dev/null; true");
    let o = run(Command::new("sh")
        .args(["-c", &script])
        .env("LOCKCTL_QUARANTINE", "0"));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let holder: Vec<String> = redis::cmd("HGETALL")
        .arg("{lockctl:from-sh}\u{1f}holder")
        .query(&mut admin)
        .unwrap();
    let cmd = holder
        .iter()
        .skip_while(|f| *f != "cmd")
        .nth(1)
        .expect("cmd field");
    assert!(
        cmd.contains("acquire from-sh") && cmd.contains(":***@127.0.0.1"),
        "{cmd}"
    );
    assert!(!cmd.contains(ADMIN_PW), "stored in Redis: {cmd}");
    for args in [
        &["status", "from-sh"][..],
        &["list"],
        &["list", "--format", "json"],
    ] {
        let o = run(lockctl().env("LOCKCTL_REDIS", &url).args(args));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert!(stdout(&o).contains("acquire from-sh"), "{}", stdout(&o));
        assert!(!leaks(&o), "{args:?}: {}", stdout(&o));
    }
    // exec records its child's command line: here one with the URL as an argument. The child
    // reads the lock's status while it holds it.
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", &url)
        .args(["exec", "from-exec", "-n", "--"])
        .args(["sh", "-c", &format!("'{bin}' status from-exec"), &url]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains(":***@127.0.0.1"), "{}", stdout(&o));
    assert!(!leaks(&o), "{}", stdout(&o));
}

#[test]
fn help_and_usage_errors_show_no_secret_from_the_environment() {
    let url = format!("redis://:{ADMIN_PW}@127.0.0.1:1");
    for args in [
        &["--help"][..],
        &["release", "--help"],
        &["renew", "--help"],
        &["acquire"],
        &["release"],
        &["acquire", "x", "--bogus"],
    ] {
        let o = run(lockctl()
            .env("LOCKCTL_REDIS", &url)
            .env("LOCKCTL_TOKEN", LOCKER_PW)
            .args(args));
        assert!(!leaks(&o), "{args:?}: {}{}", stdout(&o), stderr(&o));
        assert!(matches!(code(&o), 0 | 2), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn passwords_with_url_characters_work_percent_encoded() {
    let (s, mut admin) = server_with_requirepass();
    let raw = "Pa@ss:w/rd?#1,%x&=Z";
    let encoded = "Pa%40ss%3Aw%2Frd%3F%231%2C%25x%26%3DZ";
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("odd")
        .arg("on")
        .arg(format!(">{raw}"))
        .arg(MINIMAL_ACL)
        .query(&mut admin)
        .unwrap();
    let port = s.port.unwrap();
    let sock = s.socket().display().to_string();
    for url in [
        format!("redis://odd:{encoded}@127.0.0.1:{port}"),
        format!("unix://{sock}?user=odd&pass={encoded}"),
    ] {
        for args in [
            &["-v", "acquire", "enc", "-n", "--format", "json"][..],
            &["status", "enc"],
        ] {
            let o = run(lockctl().env("LOCKCTL_REDIS", &url).args(args));
            assert_eq!(code(&o), 0, "{url}: {}", stderr(&o));
            let all = format!("{}{}", stdout(&o), stderr(&o));
            assert!(!all.contains(raw) && !all.contains(encoded), "{all}");
        }
        let () = redis::cmd("DEL")
            .arg("lockctl:enc")
            .query(&mut admin)
            .unwrap();
    }
}
