//! A review of two changes: the record a release leaves of what it deleted (read back by the same
//! release sent again after its reply was lost), and the handled signals blocked in every thread but
//! the one that receives them.
//!
//! Real faults only: redis-servers started here (so their restart quarantine is off: each holds
//! nothing from before), one stopped with SIGSTOP, and a loopback proxy that loses a script's reply
//! with its connection, or the script itself, before the server sees it.

mod support;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::*;

/// What the proxy does to the first script (`EVAL`, `EVALSHA`) on its first connection.
#[derive(Clone, Copy)]
enum Fault {
    /// The script reaches the server and runs; its reply is lost with the connection.
    CutTheReply,
    /// The script never reaches the server; the connection closes.
    DropTheScript,
}

/// A loopback proxy in front of `upstream`: its first connection suffers `fault`, every later one
/// is relayed. Returns the port and whether the fault was made.
fn faulty_proxy(upstream: u16, fault: Fault) -> (u16, Arc<AtomicBool>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let made = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&made);
    std::thread::spawn(move || {
        for (i, client) in listener.incoming().enumerate() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            if i == 0 {
                faulty(client, server, fault, Arc::clone(&done));
            } else {
                proxy::pass_through(client, server);
            }
        }
    });
    (port, made)
}

fn faulty(client: TcpStream, server: TcpStream, fault: Fault, made: Arc<AtomicBool>) {
    match fault {
        Fault::CutTheReply => proxy::cut_the_scripts_reply(
            client,
            server,
            || {},
            move || made.store(true, Ordering::SeqCst),
        ),
        Fault::DropTheScript => drop_the_script(client, server, made),
    }
}

/// Relays `client` to `server` until a script comes, then closes both without sending it.
fn drop_the_script(client: TcpStream, server: TcpStream, made: Arc<AtomicBool>) {
    let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    let (c_close, s_close) = (client.try_clone().unwrap(), server.try_clone().unwrap());
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 16384];
        while let Ok(n @ 1..) = c_in.read(&mut buf) {
            seen.extend_from_slice(&buf[..n]);
            if proxy::holds_a_script(&seen) {
                made.store(true, Ordering::SeqCst);
                let _ = c_close.shutdown(Shutdown::Both);
                let _ = s_close.shutdown(Shutdown::Both);
                return;
            }
            if s_out.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = s_out.shutdown(Shutdown::Write);
    });
    proxy::one_way(server, client);
}

/// lockctl on `url`, no quarantine (every server here was just started by the test), a node
/// timeout of 5 s: a release's record lasts 11 s.
fn on(url: &str) -> std::process::Command {
    let mut c = lockctl();
    c.args(["-r", url, "--quarantine", "0", "--node-timeout", "5s"]);
    c
}

/// Starts lockctl with `args` on `url`, no quarantine and a node timeout of `timeout`, its stderr
/// piped.
fn spawn_on(url: &str, timeout: &str, args: &[&str]) -> std::process::Child {
    lockctl()
        .args(["-r", url, "--quarantine", "0", "--node-timeout", timeout])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Loads the scripts on `s` (database 1) with a grant and its release, so that the first
/// `EVALSHA` through a proxy runs its script instead of failing NOSCRIPT.
fn warm_up(direct: &str) {
    let warm = acquire_json(&mut on(direct), "warm", &[]);
    let o = run(on(direct).args([
        "release",
        "warm",
        "--token",
        warm["token"].as_str().unwrap(),
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

fn get_in_db1(s: &Server, key: &str) -> Option<String> {
    let mut c = s.conn();
    let () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    redis::cmd("GET").arg(key).query(&mut c).unwrap()
}

/// `lockctl release --token T` run by hand a second time, after another holder took the lock, must
/// say the token holds nothing (76) however its connection fares. When the second release's reply
/// is cut, it is sent again, and the resend reads the record the *first* release left (a release
/// sent again read `{key}\x1frelease\x1f<token>` without knowing which send wrote it: exit 0,
/// "released: the token held one slot of the lock", while the lock was another holder's (5 of 5).
/// The record told that some release of this token deleted the key in the last 11 s, not that this
/// one did; it now carries the id of the release call that wrote it, and only that call's resend
/// reads it. The code before the record exits 76 here.
#[test]
fn a_second_release_of_a_token_whose_reply_is_cut_is_still_not_ours() {
    a_second_release_through(Fault::CutTheReply, true);
}

/// As above, with the second release's script lost before the server saw it (its connection closed
/// under it): the resend is the only send that ran, it deleted nothing, and it answered with the
/// first release's record (exit 0 where 76 is due, 5 of 5, before the record carried the call's
/// id). No other holder here: the lock is simply free, released a moment before by the same token.
#[test]
fn a_second_release_of_a_token_whose_script_was_lost_is_still_not_ours() {
    a_second_release_through(Fault::DropTheScript, false);
}

fn a_second_release_through(fault: Fault, taken: bool) {
    let s = Server::start_tcp();
    let direct = format!("redis://127.0.0.1:{}/1", s.port.unwrap());
    warm_up(&direct);
    let g = acquire_json(&mut on(&direct), "twice", &["--ttl", "120s"]);
    let token = g["token"].as_str().unwrap().to_string();
    let o = run(on(&direct).args(["release", "twice", "--token", &token]));
    assert_eq!(code(&o), 0, "the first release: {}", stderr(&o));
    let other = if taken {
        let b = acquire_json(&mut on(&direct), "twice", &["--ttl", "120s"]);
        Some(b["token"].as_str().unwrap().to_string())
    } else {
        None
    };
    let (port, made) = faulty_proxy(s.port.unwrap(), fault);
    let url = format!("redis://127.0.0.1:{port}/1");
    let o = run(on(&url).args(["release", "twice", "--token", &token]));
    let err = stderr(&o);
    assert!(
        made.load(Ordering::SeqCst),
        "the proxy made no fault: {err}"
    );
    assert_eq!(get_in_db1(&s, "lockctl:twice"), other, "{err}");
    assert_eq!(
        code(&o),
        76,
        "a token that no longer held the lock was reported released: {err}"
    );
}

/// The record outlives the call that may send the release again, and no more: with a 1 s node
/// timeout it is kept three seconds (two node timeouts and a second) and then gone; while it is
/// there, `status` says the lock is free, `list` shows no lock, `break` finds nothing to break
/// (and leaves a record of that answer, which goes the same way).
#[test]
fn the_record_expires_and_inspection_ignores_it() {
    let s = Server::start_tcp();
    let url = s.url();
    let fast = || {
        let mut c = lockctl();
        c.args(["-r", &url, "--quarantine", "0", "--node-timeout", "1s"]);
        c
    };
    let g = acquire_json(&mut fast(), "brief", &["--limit", "2"]);
    let token = g["token"].as_str().unwrap();
    let o = run(fast().args(["release", "brief", "--token", token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let record = format!("{{lockctl:brief}}\u{1f}release\u{1f}{token}");
    let pttl: i64 = s.cmd(&["PTTL", &record]);
    assert!(pttl > 0 && pttl <= 3_000, "the record's PTTL: {pttl} ms");
    let o = run(fast().args(["status", "brief"]));
    assert!(stdout(&o).contains("free"), "{}", stdout(&o));
    let o = run(fast().args(["list"]));
    assert_eq!(stdout(&o), "", "list showed: {}", stdout(&o));
    let o = run(fast().args(["break", "brief", "--yes"]));
    assert!(stderr(&o).contains("nothing to break"), "{}", stderr(&o));
    assert!(
        eventually(Duration::from_secs(10), || s.get(&record).is_none()),
        "the record stayed"
    );
    // The break's own record (its answer, for a break sent again) goes the same way.
    let only_the_fence = || {
        let left: Vec<String> = s.cmd(&["KEYS", "*"]);
        left.iter().all(|k| k.ends_with("\u{1f}fence"))
    };
    let left: Vec<String> = s.cmd(&["KEYS", "*"]);
    assert!(
        eventually(Duration::from_secs(10), only_the_fence),
        "left behind: {left:?}"
    );
}

/// Redlock on three nodes: the third has lost the key (deleted there, as an eviction or a restart
/// without data would), and the first loses the release's reply with its connection. The resend
/// there reads the record, so the release holds on two of three, a quorum: exit 0, every key gone.
/// Without the record (the code before it) the first node answers "not ours" and the release
/// reports the lease lost (76).
#[test]
fn a_redlock_release_with_one_reply_cut_is_done() {
    // TCP servers: the proxy is a TCP one.
    let servers: Vec<Server> = (0..3).map(|_| Server::start_tcp()).collect();
    let direct: Vec<String> = servers
        .iter()
        .map(|s| format!("redis://127.0.0.1:{}/1", s.port.unwrap()))
        .collect();
    for d in &direct {
        warm_up(d);
    }
    let (port, made) = faulty_proxy(servers[0].port.unwrap(), Fault::CutTheReply);
    let through = [
        format!("redis://127.0.0.1:{port}/1"),
        direct[1].clone(),
        direct[2].clone(),
    ];
    let all = |urls: &[String]| {
        let mut c = lockctl();
        c.args(["--quarantine", "0", "--node-timeout", "5s"]);
        for u in urls {
            c.args(["-r", u]);
        }
        c
    };
    let g = acquire_json(&mut all(&direct), "three", &["--ttl", "120s"]);
    let token = g["token"].as_str().unwrap();
    let mut c = servers[2].conn();
    let () = redis::cmd("SELECT").arg(1).query(&mut c).unwrap();
    let n: i64 = redis::cmd("DEL")
        .arg("lockctl:three")
        .query(&mut c)
        .unwrap();
    assert_eq!(n, 1, "the third node held the key");
    let o = run(all(&through).args(["release", "three", "--token", token]));
    let err = stderr(&o);
    assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
    assert_eq!(code(&o), 0, "{err}");
    for s in &servers {
        assert_eq!(get_in_db1(s, "lockctl:three"), None, "{err}");
    }
}

/// A semaphore (`--limit 2`): the holder of slot 2 releases, its reply is cut; the resend reads
/// the record of slot 2 and the release is done (exit 0), slot 2's key gone and slot 1's holder
/// untouched. Without the record (the code before it): 76.
#[test]
fn a_slot_release_with_its_reply_cut_is_done() {
    let s = Server::start_tcp();
    let direct = format!("redis://127.0.0.1:{}/1", s.port.unwrap());
    warm_up(&direct);
    let first = acquire_json(&mut on(&direct), "pair", &["--limit", "2", "--ttl", "120s"]);
    let second = acquire_json(&mut on(&direct), "pair", &["--limit", "2", "--ttl", "120s"]);
    assert_eq!(second["slot"], 2, "{second}");
    let (port, made) = faulty_proxy(s.port.unwrap(), Fault::CutTheReply);
    let url = format!("redis://127.0.0.1:{port}/1");
    let token = second["token"].as_str().unwrap();
    let o = run(on(&url).args(["release", "pair", "--token", token]));
    let err = stderr(&o);
    assert!(made.load(Ordering::SeqCst), "no reply was cut: {err}");
    assert_eq!(code(&o), 0, "{err}");
    assert_eq!(get_in_db1(&s, &slot_key("pair", 2)), None, "{err}");
    assert_eq!(
        get_in_db1(&s, "lockctl:pair").as_deref(),
        first["token"].as_str(),
        "{err}"
    );
}

/// A handled signal that comes while a one-shot attempt (`acquire -n`, `acquire -w 0`, `exec -n`)
/// waits for a node that does not answer (a redis-server stopped with SIGSTOP) must end the command
/// with 128+N, as it does at any other moment, once the attempt (which runs to the node timeout)
/// is over. The command used to report the failure (69, "Redis unavailable"): the signal, held
/// pending (`catch`) or queued on the wake channel, was looked at only after a successful attempt,
/// so a script's `kill` was answered as an outage. Not new with the blocked mask: the code before
/// it exits 69 too.
#[test]
fn a_signal_during_a_one_shot_attempt_is_not_lost() {
    let s = Server::start_tcp();
    warm_up(&s.url());
    s.pause();
    let mut seen = Vec::new();
    for args in [
        &["acquire", "stuck", "-n"][..],
        &["acquire", "stuck", "-w", "0"][..],
        &["exec", "stuck", "-n", "--", "true"][..],
    ] {
        let child = spawn_on(&s.url(), "3s", args);
        // Its attempt is under way: the stopped server accepts the connection, never answers.
        std::thread::sleep(Duration::from_millis(700));
        kill(child.id() as i32, libc::SIGTERM);
        let o = wait_output(child, Duration::from_secs(60));
        seen.push(format!(
            "{}: {:?} {}",
            args[0],
            o.status.code(),
            stderr(&o).trim()
        ));
    }
    s.resume();
    assert!(
        seen.iter().all(|l| l.contains(": Some(143) ")),
        "SIGTERM lost: {seen:#?}"
    );
}

/// A handled signal ends a waiting `acquire -w` at once, also while a node call is under way: the
/// node stopped (SIGSTOP) and the node timeout long (30 s), SIGTERM comes a second in. The wait
/// ends only when the node call times out (about 30 s): the main thread is in the node's read and
/// the signal only queues a wake-up it looks at between attempts. `exec -w` is checked the same way.
/// Not new with the blocked mask: the code before it took as long.
#[test]
#[ignore = "open: the signal ends the wait only once the node call in flight returns, within the \
            node timeout (docs/guarantees.md); ending it at once needs the call to be abandoned \
            from the signal thread, not a small change (failed 1 of 1: 143 after about 30 s)"]
fn a_signal_ends_a_wait_while_a_node_call_hangs() {
    let s = Server::start_tcp();
    warm_up(&s.url());
    s.pause();
    let mut seen = Vec::new();
    for args in [
        &["acquire", "stuck", "-w", "120s"][..],
        &["exec", "stuck", "-w", "120s", "--", "true"][..],
    ] {
        let child = spawn_on(&s.url(), "30s", args);
        std::thread::sleep(Duration::from_secs(1));
        let sent = Instant::now();
        kill(child.id() as i32, libc::SIGTERM);
        let o = wait_output(child, Duration::from_secs(90));
        seen.push((args[0], o.status.code(), sent.elapsed()));
    }
    s.resume();
    assert!(
        seen.iter()
            .all(|(_, c, t)| *c == Some(143) && *t < Duration::from_secs(10)),
        "not ended at once (bound 10 s, node timeout 30 s): {seen:?}"
    );
}

/// Each handled signal ends a wait for a held lock at once, with its own number (128+N), in
/// `acquire -w` and in `exec -w`.
#[test]
fn every_handled_signal_ends_a_wait_with_its_number() {
    let s = Server::start_tcp();
    let holder = acquire_json(&mut on(&s.url()), "busy", &["--ttl", "120s"]);
    assert!(holder["token"].is_string());
    let mut wrong = Vec::new();
    for sig in HANDLED {
        for args in [
            &["acquire", "busy", "-w", "120s"][..],
            &["exec", "busy", "-w", "120s", "--", "true"][..],
        ] {
            let child = on(&s.url())
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            let pid = child.id() as i32;
            assert!(
                eventually(Duration::from_secs(30), || receives_signals(pid)),
                "no signal thread"
            );
            // The wait is under way: the lock is held for two minutes.
            std::thread::sleep(Duration::from_millis(300));
            let sent = Instant::now();
            kill(pid, sig);
            let o = wait_output(child, Duration::from_secs(60));
            let took = sent.elapsed();
            if o.status.code() != Some(128 + sig) || took > Duration::from_secs(10) {
                wrong.push((sig, args[0], o.status, took));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:?}");
}

const HANDLED: [i32; 7] = [
    libc::SIGINT,
    libc::SIGTERM,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGALRM,
];

/// True once `pid` runs its signal-receiving thread (its handlers are in place).
fn receives_signals(pid: i32) -> bool {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|tasks| {
            tasks.flatten().any(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == "signals")
            })
        })
        .unwrap_or(false)
}

/// The job of `exec` starts with the signal mask and the dispositions lockctl was started with, bar
/// lockctl's own handling: started plainly, nothing blocked and no handled signal ignored (every
/// lockctl thread but one blocks the handled signals, and exec keeps a mask); started with SIGINT,
/// SIGUSR1 and SIGWINCH blocked, exactly those blocked in the job (`signals::for_the_job` unblocks
/// only what lockctl's parent had not blocked). Ignored ones are not all handed on: SIGWINCH, which
/// lockctl does not handle, stays ignored; SIGHUP and SIGUSR2, which it does, are back to their
/// default action (see the nohup test below). The job is `grep`
/// itself, reading its own status: a shell clears the mask of the children it forks.
#[test]
fn the_job_starts_with_the_mask_lockctl_was_started_with() {
    let s = Server::start_tcp();
    let bit = |sig: i32| 1u64 << (sig - 1);
    let handled = HANDLED.iter().fold(0, |m, &s| m | bit(s));
    let masks_of = |blocked: &'static [i32], ignored: &'static [i32]| {
        let mut c = on(&s.url());
        c.args([
            "exec",
            "masks",
            "--",
            "grep",
            "-E",
            "^Sig(Blk|Ign)",
            "/proc/self/status",
        ]);
        // SAFETY: sigprocmask and signal on the forked child's own state before exec.
        unsafe {
            c.pre_exec(move || {
                let mut set: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut set);
                for &sig in blocked {
                    libc::sigaddset(&mut set, sig);
                }
                libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
                for &sig in ignored {
                    libc::signal(sig, libc::SIG_IGN);
                }
                Ok(())
            });
        }
        let o = run(&mut c);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = stdout(&o);
        let field = |name: &str| {
            let line = out.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        (field("SigBlk"), field("SigIgn"), out.clone())
    };
    let (blk, ign, out) = masks_of(&[], &[]);
    assert_eq!(blk, 0, "{out}");
    assert_eq!(ign & handled, 0, "{out}");
    let (blk, ign, out) = masks_of(
        &[libc::SIGUSR1, libc::SIGINT, libc::SIGWINCH],
        &[libc::SIGHUP, libc::SIGUSR2, libc::SIGWINCH],
    );
    assert_eq!(
        blk,
        bit(libc::SIGUSR1) | bit(libc::SIGINT) | bit(libc::SIGWINCH),
        "{out}"
    );
    assert_eq!(ign & handled, 0, "{out}");
    assert_ne!(ign & bit(libc::SIGWINCH), 0, "{out}");
}

/// `nohup lockctl exec -- job`: lockctl's parent ignores SIGHUP. The contract forwards SIGHUP sent
/// to lockctl, and a script's `lockctl exec -- job &` has SIGINT and SIGQUIT ignored by its shell,
/// where `kill -INT $!` must still stop the job: so lockctl takes a handled signal whatever its
/// parent left it, forwards it, and the job gets its default action back (its trap runs: exit 5
/// here). `nohup` belongs in front of the job (`src/signals.rs`, docs/usage.md).
#[test]
fn a_hangup_ignored_by_lockctl_s_parent_reaches_the_job() {
    let s = Server::start_tcp();
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let mut c = on(&s.url());
    c.args(["exec", "nohup", "--", "sh", "-c"])
        .arg(format!(
            "trap 'exit 5' HUP; touch '{}'; sleep 2 & wait",
            started.display()
        ))
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: signal on the forked child's own state before exec, as nohup does.
    unsafe {
        c.pre_exec(|| {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            Ok(())
        });
    }
    let child = c.spawn().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || started.exists()),
        "the job never started"
    );
    kill(child.id() as i32, libc::SIGHUP);
    let o = wait_output(child, Duration::from_secs(60));
    assert_eq!(
        code(&o),
        5,
        "the hangup did not reach the job's trap: {}",
        stderr(&o)
    );
}
