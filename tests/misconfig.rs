//! Exit 78: a node that answers but refuses is a misconfiguration, not an outage.
//!
//! Each refusal is made for real on a redis-server the test starts: a password (`requirepass`), an
//! ACL user without a command lockctl needs (`ACL SETUSER ... -info`, `-time`), renamed commands
//! (`--rename-command`), a replica (`--replicaof`). Every command that talks to Redis (acquire,
//! release, renew, status, exec) exits 78 with a message that names the node, the refusal and the fix,
//! writes nothing, and `doctor` reports a failure. A node that does not answer stays 69, and a Redlock
//! quorum failure that mixes the two is 78 only when the refusals alone leave no quorum.

mod support;

use support::*;

const ADMIN_PW: &str = "Adm1nPassw0rd78";
const USER_PW: &str = "Us3rPassw0rd78";

/// The commands that talk to Redis, each with the arguments it needs; a refusing node must stop
/// every one of them with 78.
fn every_command() -> Vec<Vec<&'static str>> {
    let token = "0123456789abcdef0123456789abcdef";
    vec![
        vec!["acquire", "job", "-n"],
        vec!["acquire", "job", "-w", "2s"],
        vec!["release", "job", "--token", token],
        vec!["renew", "job", "--token", token],
        vec!["status", "job"],
        vec!["exec", "job", "-n", "--", "sh", "-c", "echo child-ran"],
    ]
}

/// Runs every command against `url`; each must exit 78 with every needle in its message, run no
/// child, and leak no password.
fn refused_everywhere(url: &str, needles: &[&str]) {
    for args in every_command() {
        let o = run(lockctl().args(["-r", url]).args(&args));
        let err = stderr(&o);
        assert_eq!(code(&o), 78, "{args:?} on {url}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: {n:?} not in: {err}");
        }
        assert!(
            !stdout(&o).contains("child-ran"),
            "the child ran without a lock"
        );
        assert!(
            !err.contains(ADMIN_PW) && !err.contains(USER_PW),
            "a password leaked: {err}"
        );
    }
}

/// `doctor` on `url` exits 1 with a `fail` line that contains `needle`.
fn doctor_fails(url: &str, needle: &str) {
    let o = run(lockctl().args(["-r", url, "doctor"]));
    let out = stdout(&o);
    assert_eq!(code(&o), 1, "doctor on {url}: {out}\n{}", stderr(&o));
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("fail") && l.contains(needle)),
        "no failure naming {needle:?}: {out}"
    );
    assert!(!out.contains("0 failure(s)"), "{out}");
}

fn admin(s: &Server) -> redis::Connection {
    let url = format!("unix://{}?pass={ADMIN_PW}", s.socket().display());
    redis::Client::open(url).unwrap().get_connection().unwrap()
}

fn keys(c: &mut redis::Connection) -> Vec<String> {
    redis::cmd("KEYS").arg("*").query(c).unwrap()
}

#[test]
fn wrong_or_missing_password_exits_78() {
    let s = Server::start_tcp();
    let () = s.cmd(&["CONFIG", "SET", "requirepass", ADMIN_PW]);
    let port = s.port.unwrap();
    refused_everywhere(
        &format!("redis://:WrongPassw0rd@127.0.0.1:{port}"),
        &[
            "127.0.0.1",
            "refused",
            "check the user and password in the URL",
        ],
    );
    refused_everywhere(
        &format!("redis://127.0.0.1:{port}"),
        &["127.0.0.1", "refused", "requires a password"],
    );
    doctor_fails(
        &format!("redis://:WrongPassw0rd@127.0.0.1:{port}"),
        "password",
    );
    assert!(keys(&mut admin(&s)).is_empty(), "nothing was written");
}

/// An ACL user that has everything but one command.
fn user_without(s: &Server, command: &str) -> String {
    let mut c = admin(s);
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(format!(">{USER_PW}"))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .arg(format!("-{command}"))
        .query(&mut c)
        .unwrap();
    format!("unix://{}?user=locker&pass={USER_PW}", s.socket().display())
}

#[test]
fn acl_without_a_needed_command_exits_78_naming_it() {
    let s = Server::start();
    let () = s.cmd(&["CONFIG", "SET", "requirepass", ADMIN_PW]);
    // INFO: refused on connect (the replication check) and inside the scripts.
    let url = user_without(&s, "info");
    refused_everywhere(&url, &["redis.sock", "refused", "+info"]);
    for args in every_command() {
        let err = stderr(&run(lockctl().args(["-r", &url]).args(&args)));
        // Named by the server ('info', a command of its own) or by lockctl (INFO, inside a script).
        assert!(
            err.contains("'info'") || err.contains("could not run: INFO]"),
            "{args:?}: {err}"
        );
    }
    doctor_fails(&url, "info");
    // TIME: only the scripts run it; the server's message names a script line, lockctl the command.
    let url = user_without(&s, "time");
    for args in [&["acquire", "job", "-n"][..], &["status", "job"]] {
        let o = run(lockctl().args(["-r", &url]).args(args));
        let err = stderr(&o);
        assert_eq!(code(&o), 78, "{err}");
        assert!(err.contains("TIME") && err.contains("+time"), "{err}");
        // The command is named right after the refusal's text, before the fix.
        assert!(
            err.contains("[the command the script could not run: TIME] (the ACL user lacks"),
            "{err}"
        );
    }
    doctor_fails(&url, "TIME");
    let mut c = admin(&s);
    assert!(
        keys(&mut c).iter().all(|k| k.ends_with("\u{1f}fence")),
        "no lock key was left: {:?}",
        keys(&mut c)
    );
}

#[test]
fn renamed_commands_exit_78_and_doctor_fails() {
    for (renamed, needle) in [("EVALSHA", "EVALSHA"), ("INFO", "INFO"), ("EVAL", "EVAL")] {
        let s = Server::with_args(&["--rename-command", renamed, ""]);
        let url = s.url();
        if renamed == "EVAL" {
            // EVALSHA still works, so locks do; only the rollback after a timeout (EVAL) cannot
            // reach the server: doctor must say so.
            doctor_fails(&url, "EVAL");
            continue;
        }
        refused_everywhere(&url, &["refused", needle, "renamed or disabled"]);
        doctor_fails(&url, needle);
        // A script that fails part-way was rolled back; only a fencing counter (which never goes
        // down, so an extra increment is harmless) may have moved.
        assert!(
            s.keys().iter().all(|k| k.ends_with("\u{1f}fence")),
            "no lock was left: {:?}",
            s.keys()
        );
    }
}

#[test]
fn a_replica_exits_78_and_names_the_fix() {
    let master = Server::start_tcp();
    let replica = Server::tcp_with_args(&[
        "--replicaof",
        "127.0.0.1",
        &master.port.unwrap().to_string(),
    ]);
    // Synced as both ends see it: the replica's link is up a moment before its master, which lockctl
    // asks, lists it online (after the replica's first acknowledgement).
    assert!(
        eventually(std::time::Duration::from_secs(90), || {
            replica
                .cmd::<String>(&["INFO", "replication"])
                .contains("master_link_status:up")
                && master
                    .cmd::<String>(&["INFO", "replication"])
                    .contains("state=online")
        }),
        "the replica never synced"
    );
    let url = replica.url();
    // The write's READONLY reply is the server's answer: lockctl checks the server and names the
    // master it follows.
    let follows = format!("a replica of 127.0.0.1:{}", master.port.unwrap());
    refused_everywhere(
        &url,
        &["replica", "use the master", "redis+sentinel://", &follows],
    );
    doctor_fails(&url, "replica");
    // The master works, and counts its replica for the grant.
    let o = run(lockctl_on(&master).args(["-v", "acquire", "job", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("1 replica(s) acknowledged"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn a_mixed_redlock_failure_is_78_only_when_refusals_alone_prevent_a_quorum() {
    let ok = Server::start();
    let refusing_a = Server::with_args(&["--rename-command", "EVALSHA", ""]);
    let refusing_b = Server::with_args(&["--rename-command", "EVALSHA", ""]);
    let mut down = Server::start();
    let down_url = down.url();
    down.kill();

    // One refuses, one is down, one grants: a quorum of 2 is still possible once the down node
    // returns, so this is an outage.
    let urls = [ok.url(), refusing_a.url(), down_url.clone()].join(",");
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", &urls)
        .args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(stderr(&o).contains("renamed or disabled"), "{}", stderr(&o));

    // Two refuse: no quorum is possible whatever the third does.
    let urls = [refusing_a.url(), refusing_b.url(), down_url].join(",");
    let o = run(lockctl()
        .env("LOCKCTL_REDIS", &urls)
        .args(["acquire", "job", "-n"]));
    assert_eq!(code(&o), 78, "{}", stderr(&o));
    assert!(
        stderr(&o).contains("2 of 3 node(s) answered but refuse"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        ok.get("lockctl:job"),
        None,
        "the failed attempt was rolled back"
    );
}

/// A refusal comes back the same until someone changes the setup, so a client that may wait does
/// not: `acquire -w` and `exec -w` stop at the first refused attempt with 78, long before their
/// deadline (bounded here generously), on one node and when refusals leave Redlock no quorum.
#[test]
fn a_waiting_client_stops_at_a_refusal_instead_of_waiting_for_its_deadline() {
    let s = Server::start_tcp();
    let () = s.cmd(&["CONFIG", "SET", "requirepass", ADMIN_PW]);
    let wrong = format!("redis://:WrongPassw0rd@127.0.0.1:{}", s.port.unwrap());
    let refusing = Server::with_args(&["--rename-command", "EVALSHA", ""]);
    let ok = Server::start();
    let redlock = [wrong.clone(), refusing.url(), ok.url()].join(",");
    for urls in [&wrong, &redlock] {
        for args in [
            &["acquire", "job", "-w", "30s"][..],
            &[
                "exec",
                "job",
                "-w",
                "120s",
                "--",
                "sh",
                "-c",
                "echo child-ran",
            ],
        ] {
            let started = std::time::Instant::now();
            let o = run(lockctl().env("LOCKCTL_REDIS", urls).args(args));
            let took = started.elapsed();
            assert_eq!(code(&o), 78, "{args:?} on {urls}: {}", stderr(&o));
            assert!(
                took < std::time::Duration::from_secs(15),
                "{args:?} on {urls} waited {took:?} for a refusal to go away"
            );
            assert!(!stdout(&o).contains("child-ran"));
        }
    }
    assert_eq!(
        ok.get("lockctl:job"),
        None,
        "the refused attempt was rolled back"
    );
}

#[test]
fn a_node_that_does_not_answer_stays_69() {
    let mut s = Server::start();
    let url = s.url();
    s.kill();
    for args in every_command() {
        let o = run(lockctl()
            .args(["-r", &url, "--node-timeout", "200ms"])
            .args(&args));
        assert_eq!(code(&o), 69, "{args:?}: {}", stderr(&o));
    }
}
