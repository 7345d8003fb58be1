//! Attacks on the release record (`{key}\x1frelease\x1f<token>`, the id of the call that deleted):
//! a release, and the release at the end of `exec`, exits 0 only when this call deleted the
//! holder's key; it never deletes another holder's key; the record shows no holder. Real
//! redis-servers started here (so their restart quarantine is off: each holds nothing from before),
//! and a loopback proxy that cuts a script's reply, with a `break` (and a new holder's grant), a
//! FLUSHALL, made just before the script reaches the server or just after it ran.

mod support;

use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use support::*;

type Hook = Box<dyn FnOnce() + Send>;

/// A loopback proxy in front of `upstream`: on its first connection the first script's reply is
/// cut, `before` running as the script comes (before the server sees it) and `cut` once it ran;
/// later connections are relayed. Returns the port and whether the cut was made.
fn cutting_proxy(upstream: u16, before: Hook, cut: Hook) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let made = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&made);
    let mut hooks = Some((before, cut));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            match hooks.take() {
                Some((before, cut)) => {
                    let done = Arc::clone(&done);
                    proxy::cut_the_scripts_reply(client, server, before, move || {
                        cut();
                        done.store(true, Ordering::SeqCst)
                    })
                }
                None => proxy::pass_through(client, server),
            }
        }
    });
    (port, made)
}

fn db1(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/1")
}

/// lockctl on `urls`, no quarantine (every server here was just started by the test), a node
/// timeout of 5 s.
fn on(urls: &[String]) -> std::process::Command {
    let mut c = lockctl();
    c.args(["--quarantine", "0", "--node-timeout", "5s"]);
    for u in urls {
        c.args(["-r", u]);
    }
    c
}

/// Loads the scripts (database 1), so that the first `EVALSHA` through a proxy runs its script.
fn warm_up(direct: &str) {
    let warm = acquire_json(&mut on(&[direct.to_string()]), "warm", &[]);
    let t = warm["token"].as_str().unwrap();
    let o = run(on(&[direct.to_string()]).args(["release", "warm", "--token", t]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

fn get_in_db1(s: &Server, key: &str) -> Option<String> {
    let mut c = s.conn();
    let () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    redis::cmd("GET").arg(key).query(&mut c).unwrap()
}

/// `lockctl break NAME` then a new holder's grant (with `extra`), on `direct`; the new token goes
/// to `slot`. `held`: the break finds a key to delete (else its exit code is not looked at).
fn break_and_take(
    direct: String,
    name: &'static str,
    extra: &'static [&'static str],
    held: bool,
) -> (Hook, Arc<std::sync::Mutex<Option<String>>>) {
    let slot = Arc::new(std::sync::Mutex::new(None));
    let out = Arc::clone(&slot);
    let hook: Hook = Box::new(move || {
        let o = run(on(std::slice::from_ref(&direct)).args(["break", name, "--yes"]));
        if held {
            assert_eq!(code(&o), 0, "break: {}", stderr(&o));
        }
        let g = acquire_json(&mut on(&[direct]), name, extra);
        *out.lock().unwrap() = Some(g["token"].as_str().unwrap().to_string());
    });
    (hook, slot)
}

/// Two `lockctl release --token T` of one token at once: exactly one exits 0, the other 76, the key
/// is gone, and `status` and `list` show no holder. Ten rounds.
#[test]
fn two_releases_of_one_token_at_once_give_one_success() {
    let s = Server::start_tcp();
    let direct = vec![db1(s.port.unwrap())];
    for round in 0..10 {
        let g = acquire_json(&mut on(&direct), "both", &["--ttl", "120s"]);
        let t = g["token"].as_str().unwrap();
        let spawn = || {
            on(&direct)
                .args(["release", "both", "--token", t])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let (a, b) = (spawn(), spawn());
        let limit = std::time::Duration::from_secs(30);
        let (a, b) = (wait_output(a, limit), wait_output(b, limit));
        let mut codes = [code(&a), code(&b)];
        codes.sort();
        assert_eq!(
            codes,
            [0, 76],
            "round {round}: {} / {}",
            stderr(&a),
            stderr(&b)
        );
        assert_eq!(get_in_db1(&s, "lockctl:both"), None);
        // The winner's record is there; it shows no holder.
        let st = run(on(&direct).args(["status", "both"]));
        assert!(stdout(&st).contains("free"), "{}", stdout(&st));
        let l = run(on(&direct).args(["list"]));
        assert_eq!(stdout(&l), "", "list showed: {}", stdout(&l));
    }
}

/// The lock is broken and taken by another holder just before the release's script reaches the
/// server; the script's reply is cut and the release sent again. Neither send deleted anything:
/// 76, and the new holder's key stays, shown by `status`. With `--limit 2`, for the holder of slot 2.
#[test]
fn a_break_before_the_first_send_leaves_the_release_not_ours() {
    for limit in [None, Some("2")] {
        let s = Server::start_tcp();
        let direct = db1(s.port.unwrap());
        warm_up(&direct);
        let mut extra: Vec<&'static str> = vec!["--ttl", "120s"];
        if let Some(l) = limit {
            extra.extend(["--limit", l]);
        }
        let extra: &'static [&'static str] = Box::leak(extra.into_boxed_slice());
        let mut g = acquire_json(&mut on(std::slice::from_ref(&direct)), "early", extra);
        if limit.is_some() {
            g = acquire_json(&mut on(std::slice::from_ref(&direct)), "early", extra);
            assert_eq!(g["slot"], 2, "{g}");
        }
        let token = g["token"].as_str().unwrap();
        let (hook, other) = break_and_take(direct.clone(), "early", extra, true);
        let (port, made) = cutting_proxy(s.port.unwrap(), hook, Box::new(|| {}));
        let o = run(on(&[db1(port)]).args(["release", "early", "--token", token]));
        let err = stderr(&o);
        assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
        assert_eq!(
            code(&o),
            76,
            "limit {limit:?}: released a broken lock: {err}"
        );
        let other = other
            .lock()
            .unwrap()
            .clone()
            .expect("the new holder's token");
        assert_eq!(get_in_db1(&s, "lockctl:early"), Some(other), "{err}");
        let st = run(on(&[direct]).args(["status", "early"]));
        assert!(!stdout(&st).contains("free"), "{}", stdout(&st));
    }
}

/// The release's first send deletes the key and its reply is cut; before the resend the lock is
/// broken (nothing left to break) and taken by another holder. This call did delete: exit 0, and
/// the new holder's key stays.
#[test]
fn a_break_after_the_first_send_leaves_the_release_done() {
    let s = Server::start_tcp();
    let direct = db1(s.port.unwrap());
    warm_up(&direct);
    let g = acquire_json(
        &mut on(std::slice::from_ref(&direct)),
        "late",
        &["--ttl", "120s"],
    );
    let token = g["token"].as_str().unwrap();
    let (hook, other) = break_and_take(direct.clone(), "late", &["--ttl", "120s"], false);
    let (port, made) = cutting_proxy(s.port.unwrap(), Box::new(|| {}), hook);
    let o = run(on(&[db1(port)]).args(["release", "late", "--token", token]));
    let err = stderr(&o);
    assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
    assert_eq!(code(&o), 0, "{err}");
    let other = other
        .lock()
        .unwrap()
        .clone()
        .expect("the new holder's token");
    assert_eq!(get_in_db1(&s, "lockctl:late"), Some(other), "{err}");
}

/// Redlock on three nodes: node 2's key expired (a 1 ms PEXPIRE), node 0's is broken just before the
/// release's script reaches it and its reply is cut. Only node 1 deleted: 76, never 0.
#[test]
fn a_redlock_release_cut_on_a_broken_node_and_expired_on_another_is_lost() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start_tcp()).collect();
    let direct: Vec<String> = servers.iter().map(|s| db1(s.port.unwrap())).collect();
    for d in &direct {
        warm_up(d);
    }
    let g = acquire_json(&mut on(&direct), "three", &["--ttl", "120s"]);
    let token = g["token"].as_str().unwrap();
    let n: i64 = servers[2].cmd(&[
        "EVAL",
        "redis.call('SELECT', 1) return redis.call('PEXPIRE', KEYS[1], 1)",
        "1",
        "lockctl:three",
    ]);
    assert_eq!(n, 1, "node 2 held the key");
    assert!(
        eventually(std::time::Duration::from_secs(10), || get_in_db1(
            &servers[2],
            "lockctl:three"
        )
        .is_none()),
        "node 2's key did not expire"
    );
    let node0 = direct[0].clone();
    let hook: Hook = Box::new(move || {
        let o = run(on(&[node0]).args(["break", "three", "--yes"]));
        assert_eq!(code(&o), 0, "break: {}", stderr(&o));
    });
    let (port, made) = cutting_proxy(servers[0].port.unwrap(), hook, Box::new(|| {}));
    let through = [db1(port), direct[1].clone(), direct[2].clone()];
    let o = run(on(&through).args(["release", "three", "--token", token]));
    let err = stderr(&o);
    assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
    assert_eq!(code(&o), 76, "released on one node of three: {err}");
    for s in &servers {
        assert_eq!(get_in_db1(s, "lockctl:three"), None, "{err}");
    }
}

/// Two `lockctl release --token T` of one token at once, on Redlock (three nodes, the key on each)
/// and on slot 2 of a `--limit 2` semaphore (one node): exactly one exits 0, the other 76, and
/// every key of the token is gone. Ten rounds each.
#[test]
fn two_releases_at_once_on_redlock_and_on_a_slot_give_one_success() {
    let servers: Vec<Server> = (0..3).map(|_| Server::start_tcp()).collect();
    let all: Vec<String> = servers.iter().map(|s| db1(s.port.unwrap())).collect();
    for (urls, extra) in [
        (all.clone(), &["--ttl", "120s"][..]),
        (all[..1].to_vec(), &["--ttl", "120s", "--limit", "2"][..]),
    ] {
        for round in 0..10 {
            let mut g = acquire_json(&mut on(&urls), "pair", extra);
            let first = if extra.contains(&"--limit") {
                let first = g;
                g = acquire_json(&mut on(&urls), "pair", extra);
                assert_eq!(g["slot"], 2, "{g}");
                Some(first)
            } else {
                None
            };
            let t = g["token"].as_str().unwrap();
            let spawn = || {
                on(&urls)
                    .args(["release", "pair", "--token", t])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            };
            let (a, b) = (spawn(), spawn());
            let limit = std::time::Duration::from_secs(30);
            let (a, b) = (wait_output(a, limit), wait_output(b, limit));
            let mut codes = [code(&a), code(&b)];
            codes.sort();
            assert_eq!(
                codes,
                [0, 76],
                "{} node(s), round {round}: {} / {}",
                urls.len(),
                stderr(&a),
                stderr(&b)
            );
            for s in &servers[..urls.len()] {
                assert_eq!(get_in_db1(s, &slot_key("pair", 2)), None);
                match &first {
                    None => assert_eq!(get_in_db1(s, "lockctl:pair"), None),
                    Some(f) => {
                        assert_eq!(
                            get_in_db1(s, "lockctl:pair").as_deref(),
                            f["token"].as_str()
                        );
                        let o = run(on(&urls).args([
                            "release",
                            "pair",
                            "--token",
                            f["token"].as_str().unwrap(),
                        ]));
                        assert_eq!(code(&o), 0, "{}", stderr(&o));
                    }
                }
            }
        }
    }
}

/// The release's first send deletes the key, its reply is cut, and the server's data is lost
/// (FLUSHALL) before the resend: the record went with it, so the resend finds nothing of this call.
/// The release cannot show it deleted: 76 (the lost-lease answer), never a guess.
#[test]
fn a_release_whose_record_was_lost_between_the_sends_is_not_reported_done() {
    let s = Server::start_tcp();
    let port = s.port.unwrap();
    let direct = db1(port);
    warm_up(&direct);
    let g = acquire_json(
        &mut on(std::slice::from_ref(&direct)),
        "wiped",
        &["--ttl", "120s"],
    );
    let token = g["token"].as_str().unwrap();
    let flush: Hook = Box::new(move || {
        let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    });
    let (proxy_port, made) = cutting_proxy(port, Box::new(|| {}), flush);
    let o = run(on(&[db1(proxy_port)]).args(["release", "wiped", "--token", token]));
    let err = stderr(&o);
    assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
    assert_eq!(code(&o), 76, "{err}");
    assert_eq!(get_in_db1(&s, "lockctl:wiped"), None, "{err}");
}

/// `lockctl exec` whose lock is taken from it while the job runs, and the job then exits 0: the
/// release at the end deletes nothing, so exec exits 76 and the key it lost stays. Two ways to lose
/// it: `break` and another holder's grant; and the job's own `lockctl release --token
/// $LOCKCTL_TOKEN` (another release call of the same token, whose record sits beside the key for
/// the end's release to find).
#[test]
fn exec_whose_lock_was_taken_or_released_by_another_call_exits_76() {
    let s = Server::start_tcp();
    let direct = db1(s.port.unwrap());
    let lockctl_bin = env!("CARGO_BIN_EXE_lockctl");
    for by_the_job in [false, true] {
        let go = s.dir().join(format!("go-{by_the_job}"));
        let job = if by_the_job {
            format!(
                "{lockctl_bin} -r {direct} --quarantine 0 release job --token \"$LOCKCTL_TOKEN\" \
                 || exit 3; while [ ! -e {go} ]; do sleep 0.05; done",
                go = go.display()
            )
        } else {
            format!("while [ ! -e {} ]; do sleep 0.05; done", go.display())
        };
        let child = on(std::slice::from_ref(&direct))
            .args(["exec", "job", "--ttl", "120s", "-c", &job])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if !by_the_job {
            let held = || get_in_db1(&s, "lockctl:job").is_some();
            assert!(
                eventually(std::time::Duration::from_secs(20), held),
                "exec took no lock"
            );
        }
        let other = if by_the_job {
            let record = "{lockctl:job}\u{1f}release\u{1f}";
            let released = || {
                let mut c = s.conn();
                let () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
                let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut c).unwrap();
                // The earlier break's record (`break.<id>`) sits beside the releases' ones.
                keys.iter().any(|k| {
                    k.strip_prefix(record)
                        .is_some_and(|t| !t.starts_with("break."))
                })
            };
            assert!(
                eventually(std::time::Duration::from_secs(20), released),
                "the job's release left no record"
            );
            assert_eq!(get_in_db1(&s, "lockctl:job"), None);
            None
        } else {
            let o = run(on(std::slice::from_ref(&direct)).args(["break", "job", "--yes"]));
            assert_eq!(code(&o), 0, "break: {}", stderr(&o));
            let g = acquire_json(
                &mut on(std::slice::from_ref(&direct)),
                "job",
                &["--ttl", "120s"],
            );
            Some(g["token"].as_str().unwrap().to_string())
        };
        std::fs::write(&go, "").unwrap();
        let o = wait_output(child, std::time::Duration::from_secs(60));
        let err = stderr(&o);
        assert_eq!(
            code(&o),
            76,
            "by the job: {by_the_job}: a lost lease reported as released: {err}"
        );
        assert_eq!(get_in_db1(&s, "lockctl:job"), other, "{err}");
        if let Some(t) = other {
            let o = run(on(std::slice::from_ref(&direct)).args(["release", "job", "--token", &t]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
        }
    }
}
