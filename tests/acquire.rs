//! `acquire`, `release` and `renew` against a real redis-server: exit codes, tokens and fencing, the
//! output formats, the canonical `SET NX PX` layout, waiting, and script reloading.

mod support;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Acquires `name` and returns its token (plain output).
fn acquire(server: &Server, name: &str, extra: &[&str]) -> String {
    let o = run(lockctl_on(server).args(["acquire", name]).args(extra));
    assert_eq!(code(&o), 0, "acquire {name}: {}", stderr(&o));
    stdout(&o)
}

fn pttl(server: &Server, key: &str) -> i64 {
    server.cmd(&["PTTL", key])
}

fn is_token(t: &str) -> bool {
    t.len() == 32
        && t.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[test]
fn acquire_exit_codes_free_busy_and_conflict_code() {
    let s = Server::start();
    let token = acquire(&s, "job", &["--ttl", "60s"]);
    assert!(is_token(&token), "token {token:?}");

    let busy = run(lockctl_on(&s).args(["acquire", "job", "-n"]));
    assert_eq!(code(&busy), 75, "{}", stderr(&busy));
    assert_eq!(stdout(&busy), "", "a busy acquire prints no token");
    assert!(stderr(&busy).contains("busy"), "{}", stderr(&busy));

    let zero_wait = run(lockctl_on(&s).args(["acquire", "job", "-w", "0"]));
    assert_eq!(code(&zero_wait), 75, "-w 0 is -n");

    for n in ["0", "3", "255"] {
        let o = run(lockctl_on(&s).args(["acquire", "job", "-n", "-E", n]));
        assert_eq!(code(&o).to_string(), n, "-E {n} replaces 75");
        let o = run(lockctl_on(&s).args(["acquire", "job", "-n", "--conflict-exit-code", n]));
        assert_eq!(code(&o).to_string(), n, "--conflict-exit-code {n}");
    }
    // The holder is untouched by all of that.
    assert_eq!(s.get("lockctl:job").as_deref(), Some(token.as_str()));

    // -E changes only the busy code: a free lock is still 0.
    let o = run(lockctl_on(&s).args(["acquire", "other", "-n", "-E", "9"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn release_and_renew_exit_codes() {
    let s = Server::start();
    let token = acquire(&s, "job", &["--ttl", "20s"]);

    let o = run(lockctl_on(&s).args(["renew", "job", "--token", &token, "--ttl", "40s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let validity: u64 = stdout(&o).parse().expect("renew prints the validity in ms");
    assert!(
        validity > 30_000 && validity < 40_000,
        "validity {validity}"
    );
    let left = pttl(&s, "lockctl:job");
    assert!(
        left > 30_000 && left <= 40_000,
        "renew set the PTTL to about 40s: {left}"
    );

    let o = run(lockctl_on(&s).args(["release", "job", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:job"), None);

    // Released once: the token holds nothing any more.
    let o = run(lockctl_on(&s).args(["release", "job", "--token", &token]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert!(stderr(&o).contains("not held"), "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["renew", "job", "--token", &token]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:job"), None, "a failed renew creates nothing");
    // Never taken at all.
    let o = run(lockctl_on(&s).args(["release", "never", "--token", &token]));
    assert_eq!(code(&o), 76);
}

#[test]
fn renew_of_an_expired_lease_is_76() {
    let s = Server::start();
    let token = acquire(&s, "short", &["--ttl", "300ms"]);
    assert!(eventually(Duration::from_secs(10), || s
        .get("lockctl:short")
        .is_none()));
    let o = run(lockctl_on(&s).args(["renew", "short", "--token", &token]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    // One node: no count of nodes and quorum, which only Redlock needs.
    assert!(stderr(&o).contains("it expired"), "{}", stderr(&o));
    assert!(!stderr(&o).contains("quorum"), "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["release", "short", "--token", &token]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
}

#[test]
fn a_wrong_token_never_touches_another_holders_lock() {
    let s = Server::start();
    let token = acquire(&s, "job", &["--ttl", "60s"]);
    let wrong = "0123456789abcdef0123456789abcdef";
    let before = pttl(&s, "lockctl:job");
    assert!(before > 50_000 && before <= 60_000, "{before}");

    let o = run(lockctl_on(&s).args(["release", "job", "--token", wrong]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["renew", "job", "--token", wrong, "--ttl", "600s"]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));
    let o = run(lockctl_on(&s).args(["renew", "job", "--token", wrong, "--ttl", "1s"]));
    assert_eq!(code(&o), 76, "{}", stderr(&o));

    assert_eq!(s.get("lockctl:job").as_deref(), Some(token.as_str()));
    let after = pttl(&s, "lockctl:job");
    assert!(
        after <= before && after > before - 10_000,
        "the TTL was neither extended nor shortened: {before} then {after}"
    );
    let holder: Vec<String> = s.cmd(&["HMGET", "{lockctl:job}\u{1f}holder", "token"]);
    assert_eq!(holder, vec![token.clone()], "holder information kept");

    // The holder can still use its lock.
    let o = run(lockctl_on(&s).args(["release", "job", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
}

#[test]
fn fencing_tokens_strictly_increase_and_tokens_are_unique() {
    let s = Server::start();
    let mut last = 0u64;
    let mut tokens = HashSet::new();
    for i in 0..40 {
        let g = acquire_json(&mut lockctl_on(&s), "fenced", &["-n"]);
        let fence = g["fence"].as_u64().expect("fence is an integer");
        let token = g["token"].as_str().unwrap().to_string();
        assert!(fence > last, "grant {i}: fence {fence} after {last}");
        assert!(is_token(&token), "token {token:?}");
        assert!(tokens.insert(token.clone()), "token {token} repeated");
        last = fence;
        // Alternate lockctl's release with a plain DEL, as an operator or another client might do.
        if i % 2 == 0 {
            let o = run(lockctl_on(&s).args(["release", "fenced", "--token", &token]));
            assert_eq!(code(&o), 0, "{}", stderr(&o));
        } else {
            let _: i64 = s.cmd(&["DEL", "lockctl:fenced"]);
        }
    }
    // Another name has its own counter, which starts from the server's clock in microseconds.
    let before = s.clock_us();
    let g = acquire_json(&mut lockctl_on(&s), "other", &["-n"]);
    let fence = g["fence"].as_u64().unwrap();
    assert!(
        fence >= before && fence <= s.clock_us(),
        "{fence} from {before}"
    );
    // The counter never expires.
    assert_eq!(pttl(&s, "{lockctl:fenced}\u{1f}fence"), -1);
}

/// Fences keep increasing when a server comes back from an older snapshot: its counter, restored
/// behind the fences handed out since, is overtaken by the server's clock once a second has passed.
#[test]
fn fences_increase_across_a_restore_from_an_older_snapshot() {
    let mut s = Server::start();
    // The server is seconds old: the harness's quarantine 0 serves these grants.
    let grant = |s: &Server| -> u64 {
        let g = acquire_json(&mut lockctl_on(s), "restored", &["--ttl", "2s"]);
        let token = g["token"].as_str().unwrap();
        let o = run(lockctl_on(s).args(["release", "restored", "--token", token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        g["fence"].as_u64().unwrap()
    };
    let mut fences = vec![grant(&s)];
    let _: String = s.cmd(&["SAVE"]);
    for _ in 0..3 {
        fences.push(grant(&s));
    }
    // kill -9; redis-server starts again from the snapshot taken after the first grant.
    s.restart_empty();
    // The restarted server keeps the default quarantine (the TTL); the grant waits it out.
    let mut after = lockctl_on(&s);
    after.env_remove("LOCKCTL_QUARANTINE");
    let g = acquire_json(&mut after, "restored", &["--ttl", "2s", "-w", "30s"]);
    let last = g["fence"].as_u64().unwrap();
    assert!(fences.windows(2).all(|w| w[0] < w[1]), "{fences:?}");
    assert!(
        last > fences[3],
        "{fences:?}, then {last} after the restore"
    );
}

#[test]
fn json_output_has_the_contract_fields() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "report", &["--ttl", "45s"]);
    assert_eq!(g["name"], "report");
    assert_eq!(g["key"], "lockctl:report");
    assert!(is_token(g["token"].as_str().unwrap()));
    assert!(g["fence"].as_u64().unwrap() >= 1);
    assert_eq!(g["ttl_ms"].as_u64(), Some(45_000));
    let validity = g["validity_ms"].as_u64().unwrap();
    assert!(
        validity < 45_000 && validity > 40_000,
        "validity {validity} is below the TTL by the drift and the elapsed time"
    );
    assert_eq!(g["nodes"].as_u64(), Some(1));
    assert_eq!(g["quorum"].as_u64(), Some(1));
    assert_eq!(s.get("lockctl:report").as_deref(), g["token"].as_str());

    // With another prefix the key follows it.
    let o = run(lockctl_on(&s).args(["--prefix", "app/", "acquire", "report", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(g["key"], "app/report");
    assert_eq!(s.get("app/report").as_deref(), g["token"].as_str());
}

/// The lockctl binary, for shell scripts.
fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_lockctl")
}

#[test]
fn env_output_evals_in_sh_and_release_and_renew_read_the_token() {
    let s = Server::start();
    // A name that needs quoting.
    let name = "it's a \"job\" $HOME `x`";
    let script = r#"
        set -e
        eval "$("$LC" acquire "$NAME" --ttl 20s --format env)"
        [ "$LOCKCTL_NAME" = "$NAME" ] || { echo "bad name: $LOCKCTL_NAME"; exit 10; }
        echo "key=$LOCKCTL_KEY"
        echo "token=$LOCKCTL_TOKEN"
        echo "fence=$LOCKCTL_FENCE"
        echo "validity=$LOCKCTL_VALIDITY_MS"
        "$LC" renew "$NAME" --ttl 50s
        echo "renewed"
        "$LC" release "$NAME"
        echo "released"
        "$LC" release "$NAME" || echo "second release: $?"
    "#;
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(script).env("LC", bin()).env("NAME", name);
    for (k, v) in lockctl_on(&s).get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let o = run(&mut cmd);
    let out = stdout(&o);
    assert_eq!(code(&o), 0, "stdout:\n{out}\nstderr:\n{}", stderr(&o));
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .to_string()
    };
    assert_eq!(field("key"), format!("lockctl:{name}"));
    assert!(is_token(&field("token")));
    assert!(field("fence").parse::<u64>().unwrap() > 0);
    let validity: u64 = field("validity").parse().unwrap();
    assert!(validity > 15_000 && validity < 20_000, "{validity}");
    let renewed_validity: u64 = out
        .lines()
        .find_map(|l| l.parse().ok())
        .expect("renew printed the validity in ms");
    assert!(
        renewed_validity > 40_000 && renewed_validity < 50_000,
        "{renewed_validity}"
    );
    assert!(
        out.contains("renewed\nreleased\nsecond release: 76"),
        "{out}"
    );
    assert_eq!(s.get(&format!("lockctl:{name}")), None, "released");
}

#[test]
fn the_key_holds_exactly_the_token_with_a_px_ttl() {
    let s = Server::start();
    let token = acquire(&s, "canon", &["--ttl", "7500ms"]);
    let kind: String = s.cmd(&["TYPE", "lockctl:canon"]);
    assert_eq!(kind, "string");
    assert_eq!(s.get("lockctl:canon").as_deref(), Some(token.as_str()));
    let left = pttl(&s, "lockctl:canon");
    assert!(
        left > 5_500 && left <= 7_500,
        "PTTL {left} close to --ttl 7500ms"
    );
    // Fractional seconds are milliseconds too.
    acquire(&s, "frac", &["--ttl", "2.5"]);
    let left = pttl(&s, "lockctl:frac");
    assert!(
        left > 500 && left <= 2_500,
        "PTTL {left} close to --ttl 2.5"
    );
    // Holder information expires with the lock.
    let holder_left = pttl(&s, "{lockctl:canon}\u{1f}holder");
    assert!(holder_left > 0 && holder_left <= 7_500, "{holder_left}");
}

#[test]
fn a_canonical_client_and_lockctl_exclude_each_other() {
    let s = Server::start();
    let theirs = "canonical-client-token";
    let ok: Option<String> = s.cmd(&["SET", "lockctl:shared", theirs, "NX", "PX", "60000"]);
    assert_eq!(ok.as_deref(), Some("OK"));
    let o = run(lockctl_on(&s).args(["acquire", "shared", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:shared").as_deref(), Some(theirs));
    // lockctl's release is the canonical compare-and-delete, so it works on their token too.
    let o = run(lockctl_on(&s).args(["release", "shared", "--token", theirs]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));

    let token = acquire(&s, "shared", &["--ttl", "60s"]);
    let refused: Option<String> = s.cmd(&["SET", "lockctl:shared", theirs, "NX", "PX", "60000"]);
    assert_eq!(refused, None, "SET NX fails while lockctl holds the lock");
    assert_eq!(s.get("lockctl:shared").as_deref(), Some(token.as_str()));
    // The canonical release script deletes lockctl's key given lockctl's token.
    let canonical_release = "if redis.call('get', KEYS[1]) == ARGV[1] then \
        return redis.call('del', KEYS[1]) else return 0 end";
    let n: i64 = s.cmd(&["EVAL", canonical_release, "1", "lockctl:shared", &token]);
    assert_eq!(n, 1);
    let g = acquire_json(&mut lockctl_on(&s), "shared", &["-n"]);
    assert!(g["fence"].as_u64().unwrap() >= 2);
}

/// Starts `lockctl acquire` waiting on a held lock; returns it once it has printed its waiting line.
fn start_waiter(s: &Server, name: &str, extra: &[&str]) -> (std::process::Child, Instant) {
    let mut child = lockctl_on(s)
        .args(["acquire", name])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "waiter closed stderr before saying it waits"
        );
        if line.contains("waiting for lock") {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no waiting line"
        );
    }
    // Keep draining stderr so the waiter never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    });
    (child, started)
}

#[test]
fn waiters_are_woken_by_the_release_not_by_polling() {
    // Five locks, one waiter each, measured one after the other.
    let s = Server::start();
    let names: Vec<String> = (0..5).map(|i| format!("woken-{i}")).collect();
    let holders: Vec<String> = names
        .iter()
        .map(|n| acquire(&s, n, &["--ttl", "60s"]))
        .collect();
    let waiters: Vec<_> = names
        .iter()
        .map(|n| start_waiter(&s, n, &["--ttl", "60s"]).0)
        .collect();
    // Long enough for the backoff between attempts to reach its 2 s cap: a polling waiter would now
    // notice a release only after the rest of a 1 to 2 s sleep, about 0.75 s on average, and would
    // pass the bounds below (each under 1 s, all five under 2 s) only by a rare chance.
    std::thread::sleep(Duration::from_secs(5));

    let mut total = Duration::ZERO;
    for ((name, holder), waiter) in names.iter().zip(&holders).zip(waiters) {
        let key = format!("lockctl:{name}");
        assert_eq!(s.get(&key).as_deref(), Some(holder.as_str()));
        let released = Instant::now();
        let o = run(lockctl_on(&s).args(["release", name, "--token", holder]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let out = wait_output(waiter, Duration::from_secs(60));
        let took = released.elapsed();
        assert_eq!(code(&out), 0);
        let token = stdout(&out);
        assert!(is_token(&token));
        assert_eq!(s.get(&key).as_deref(), Some(token.as_str()));
        assert!(
            took < Duration::from_millis(1000),
            "{name}: the waiter took {took:?} after the release (the TTL had about a minute left)"
        );
        total += took;
    }
    assert!(
        total < Duration::from_secs(2),
        "five wake-ups took {total:?}"
    );
}

#[test]
fn a_waiter_reports_that_the_release_woke_it() {
    // The same as above, seen from inside: with -v the waiter logs what ended each sleep.
    let s = Server::start();
    let holder = acquire(&s, "woken-v", &["--ttl", "60s"]);
    let mut child = lockctl_on(&s)
        .args(["-v", "acquire", "woken-v"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = collect_stderr(child.stderr.take().unwrap());
    std::thread::sleep(Duration::from_secs(3));
    let o = run(lockctl_on(&s).args(["release", "woken-v", "--token", &holder]));
    assert_eq!(code(&o), 0);
    let out = wait_output(child, Duration::from_secs(60));
    assert_eq!(code(&out), 0);
    let log = err.join().unwrap();
    assert!(log.contains("woken by a release of 'woken-v'"), "{log}");
}

#[test]
fn wait_gives_up_after_the_wait_and_no_wait_at_once() {
    let s = Server::start();
    let holder = acquire(&s, "slow", &["--ttl", "60s"]);

    let t = Instant::now();
    let o = run(lockctl_on(&s).args(["acquire", "slow", "-w", "1s"]));
    let took = t.elapsed();
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(10),
        "-w 1s gave up after {took:?}"
    );
    let o = run(lockctl_on(&s).args(["acquire", "slow", "-w", "1s", "-E", "42"]));
    assert_eq!(code(&o), 42);

    let t = Instant::now();
    let o = run(lockctl_on(&s).args(["acquire", "slow", "-n"]));
    let took = t.elapsed();
    assert_eq!(code(&o), 75);
    assert!(took < Duration::from_secs(5), "-n took {took:?}");
    assert!(
        !stderr(&o).contains("waiting"),
        "-n does not wait: {}",
        stderr(&o)
    );
    assert_eq!(s.get("lockctl:slow").as_deref(), Some(holder.as_str()));
}

#[test]
fn a_waiter_gets_an_expired_lock_without_a_release() {
    let s = Server::start();
    let t = Instant::now();
    acquire(&s, "expiring", &["--ttl", "1500ms"]);
    let o = run(lockctl_on(&s).args(["acquire", "expiring", "-w", "30s"]));
    let took = t.elapsed();
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
}

/// The head waiter on one node sleeps until the holder's lease ends when it ends before the next
/// heartbeat (1 s): its sleep (`-v`: "waiting up to") is at most the lease's remaining 700 ms, plus
/// 1 ms, not a heartbeat's 800 to 1000 ms. A waiter that started after the lease ended waits for
/// nothing; the round is then tried again.
#[test]
fn a_head_waiter_sleeps_until_a_lease_that_ends_before_its_heartbeat() {
    let s = Server::start();
    let mut sleeps = Vec::new();
    for round in 0..5 {
        let name = format!("ending{round}");
        acquire(&s, &name, &["--ttl", "700ms"]);
        let o = run(lockctl_on(&s).args(["--verbose", "acquire", &name, "-w", "30s"]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        sleeps = stderr(&o)
            .lines()
            .filter_map(|l| l.split("waiting up to ").nth(1))
            .filter_map(|l| l.split(" ms").next()?.parse::<f64>().ok())
            .collect();
        if !sleeps.is_empty() {
            break;
        }
    }
    assert!(!sleeps.is_empty(), "no waiter waited in 5 rounds");
    assert!(sleeps.iter().all(|&ms| ms <= 701.0), "{sleeps:?}");
}

#[test]
fn progress_line_on_stderr_when_not_a_terminal_and_quiet_silences_it() {
    let s = Server::start();
    acquire(&s, "progress", &["--ttl", "60s"]);
    let o = run(lockctl_on(&s).args(["acquire", "progress", "-w", "1s"]));
    assert_eq!(code(&o), 75);
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("waiting for lock 'progress'"))
        .unwrap_or_else(|| panic!("no waiting line in {err:?}"));
    assert!(line.contains("held by"), "{line}");
    assert!(line.contains("pid"), "the line names the holder: {line}");
    assert!(line.contains("waited"), "{line}");
    assert!(!err.contains('\r'), "no spinner on a pipe: {err:?}");

    let o = run(lockctl_on(&s).args(["-q", "acquire", "progress", "-w", "1s"]));
    assert_eq!(code(&o), 75);
    assert_eq!(stderr(&o), "", "-q silences the progress and busy lines");
}

#[test]
fn script_flush_between_commands_changes_nothing() {
    let s = Server::start();
    let flush = || {
        let ok: String = s.cmd(&["SCRIPT", "FLUSH"]);
        assert_eq!(ok, "OK");
    };
    flush();
    let token = acquire(&s, "flushed", &["--ttl", "10s"]);
    flush();
    let o = run(lockctl_on(&s).args(["renew", "flushed", "--token", &token, "--ttl", "20s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(pttl(&s, "lockctl:flushed") > 10_000);
    flush();
    let o = run(lockctl_on(&s).args(["acquire", "flushed", "-n"]));
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    flush();
    let o = run(lockctl_on(&s).args(["release", "flushed", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let first: u64 = s
        .get("{lockctl:flushed}\u{1f}fence")
        .unwrap()
        .parse()
        .unwrap();
    flush();
    let g = acquire_json(&mut lockctl_on(&s), "flushed", &["-n"]);
    assert!(g["fence"].as_u64().unwrap() > first, "{g}");
}

#[test]
fn tcp_and_unix_socket_urls_both_work() {
    let s = Server::start_tcp();
    let token = acquire(&s, "tcp", &[]);
    let o = run(lockctl().args(["-r", &s.url(), "release", "tcp", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let unix = format!("redis+unix://{}", s.socket().display());
    let o = run(lockctl().args(["-r", &unix, "acquire", "unix", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:unix").as_deref(), Some(stdout(&o).as_str()));
}

#[test]
fn prefix_from_the_flag_the_environment_or_empty() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["--prefix", "", "acquire", "bare", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("bare").as_deref(), Some(stdout(&o).as_str()));
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_PREFIX", "ci/")
        .args(["acquire", "deploy", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let token = stdout(&o);
    assert_eq!(s.get("ci/deploy").as_deref(), Some(token.as_str()));
    // Another prefix is another lock.
    let o = run(lockctl_on(&s).args(["acquire", "deploy", "-n"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    // A token given by flag wins over LOCKCTL_TOKEN.
    let o = run(lockctl_on(&s)
        .env("LOCKCTL_PREFIX", "ci/")
        .env("LOCKCTL_TOKEN", "0123456789abcdef0123456789abcdef")
        .args(["release", "deploy", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("ci/deploy"), None);
}

#[test]
fn busy_names_only_the_current_holder() {
    let s = Server::start();
    let first = acquire_json(&mut lockctl_on(&s), "stale", &["--ttl", "60s"]);
    assert!(first["token"].is_string());
    // Another client replaces the lock behind lockctl's back: the old holder record is not its.
    let _: i64 = s.cmd(&["DEL", "lockctl:stale"]);
    let _: String = s.cmd(&["SET", "lockctl:stale", "canonical", "PX", "60000"]);
    let o = run(lockctl_on(&s).args(["acquire", "stale", "-n"]));
    assert_eq!(code(&o), 75);
    let err = stderr(&o);
    assert!(err.contains("lock 'stale' is busy"), "{err}");
    assert!(
        !err.contains(" pid "),
        "the old holder must not be named: {err}"
    );
}

/// A loopback relay to `port` that, once, drops the client's connection in place of passing on a
/// reply that is an array (the acquire script's): the server ran the command, the client never heard.
/// Returns the relay's port and a flag that says whether it dropped one.
fn relay_dropping_first_array_reply(
    port: u16,
) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::net::{Shutdown, TcpListener, TcpStream};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let relay_port = listener.local_addr().unwrap().port();
    let dropped = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&dropped);
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(mut client) = client else { return };
            let mut server = TcpStream::connect(("127.0.0.1", port)).unwrap();
            let (mut up_from, mut up_to) =
                (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut up_from, &mut up_to);
                let _ = up_to.shutdown(Shutdown::Write);
            });
            let flag = Arc::clone(&flag);
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while let Ok(n) = server.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if buf[0] == b'*' && !flag.swap(true, Ordering::SeqCst) {
                        break;
                    }
                    if client.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = client.shutdown(Shutdown::Both);
                let _ = server.shutdown(Shutdown::Both);
            });
        }
    });
    (relay_port, dropped)
}

/// The connection drops after the server granted the lock but before the reply came: lockctl sends
/// the attempt again on a new connection, and the server, finding the same token, says it is ours.
/// The grant is not lost (busy on our own key, left there for the TTL) and the counter moved once.
#[test]
fn an_attempt_sent_again_after_a_dropped_reply_still_wins() {
    let s = Server::start_tcp();
    let (relay, dropped) = relay_dropping_first_array_reply(s.port.unwrap());
    let o = run(lockctl()
        .args(["-r", &format!("redis://127.0.0.1:{relay}")])
        .args(["acquire", "resent", "-n", "--format", "json"]));
    assert!(
        dropped.load(std::sync::atomic::Ordering::SeqCst),
        "no reply was dropped"
    );
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(s.get("lockctl:resent").as_deref(), g["token"].as_str());
    let counter: String = s.cmd(&["GET", "{lockctl:resent}\u{1f}fence"]);
    assert_eq!(
        Some(counter.as_str()),
        g["fence"].as_u64().map(|f| f.to_string()).as_deref()
    );
}

// ------------------------------------------------------------------ the restart quarantine (issue 13)

/// A lockctl command with the default restart quarantine (the harness turns it off).
fn quarantined_on(s: &Server) -> Command {
    let mut c = lockctl_on(s);
    c.env_remove("LOCKCTL_QUARANTINE");
    c
}

/// A refusal by the quarantine says so, names the node, since when and for how much longer, how to
/// lift it, and that nobody holds the lock; `-q` does not hide it (it is not the routine busy).
fn assert_quarantine_message(err: &str, s: &Server) {
    assert!(err.contains("restart quarantine"), "{err}");
    assert!(err.contains(&s.url()), "names the node: {err}");
    assert!(
        err.contains("started") && err.contains("ago"),
        "since when: {err}"
    );
    assert!(err.contains("votes in"), "how much longer: {err}");
    assert!(err.contains("--quarantine 0"), "how to lift it: {err}");
    assert!(
        err.contains("LOCKCTL_QUARANTINE=0"),
        "how to lift it: {err}"
    );
    assert!(
        !err.contains("restarted"),
        "a first start looks the same: {err}"
    );
    assert!(
        !err.contains("node(s) in quarantine"),
        "one node: no count of nodes: {err}"
    );
}

#[test]
fn a_refusal_by_the_quarantine_is_named_and_not_silenced() {
    let mut s = Server::start_tcp();
    // A TTL the release comes well within, also on a loaded machine (at 1 s one CI run's release
    // found the lease gone: 76).
    let a = acquire(&s, "cron", &["--ttl", "20s"]);
    let o = run(lockctl_on(&s).args(["release", "cron", "--token", &a]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    s.restart_empty();

    for quiet in [false, true] {
        let mut c = quarantined_on(&s);
        if quiet {
            c.arg("-q");
        }
        // The README's cron line.
        let o = run(c.args(["exec", "cron", "-n", "--", "true"]));
        let err = stderr(&o);
        assert_eq!(code(&o), 75, "{err}");
        assert_quarantine_message(&err, &s);
        assert!(
            err.contains("no node says it is held"),
            "not a holder: {err}"
        );
        assert!(!err.contains("is busy"), "{err}");
    }
    let o = run(quarantined_on(&s).args(["acquire", "cron", "-n", "-E", "9"]));
    assert_eq!(code(&o), 9, "-E replaces the code: {}", stderr(&o));

    // The wait line says it too, and under -q once.
    let o = run(quarantined_on(&s).args(["acquire", "cron", "-w", "500ms"]));
    let err = stderr(&o);
    let line = err
        .lines()
        .find(|l| l.contains("waiting for lock 'cron'"))
        .unwrap_or_else(|| panic!("no wait line: {err}"));
    assert_quarantine_message(line, &s);
    let o = run(quarantined_on(&s).args(["-q", "acquire", "cron", "-w", "500ms"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 75, "{err}");
    assert_eq!(
        err.lines().filter(|l| l.contains("waiting")).count(),
        1,
        "{err}"
    );
    assert!(
        s.keys().iter().all(|k| !k.ends_with("cron")),
        "{:?}",
        s.keys()
    );

    // A routine busy stays silent under -q.
    let o = run(lockctl_on(&s).args(["acquire", "cron", "--ttl", "60s"]));
    assert_eq!(
        code(&o),
        0,
        "quarantine off for this server: {}",
        stderr(&o)
    );
    let o = run(quarantined_on(&s).args(["-q", "acquire", "cron", "-n", "--quarantine", "0"]));
    assert_eq!((code(&o), stderr(&o)), (75, String::new()));
}

/// No node is spared the quarantine for its persistence settings, however safe they look: what a
/// client can read after a restart does not prove what the node had when it stopped (see
/// `tests/spared_aof.rs` for the ways it lost a grant and gave a second holder). A server with an AOF
/// that fsyncs every write, killed and started again on its own data, stays in quarantine, and
/// `--quarantine 0` is how an operator who knows better lifts it.
#[test]
fn a_node_is_not_spared_for_its_persistence_settings() {
    let mut s = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    let a = acquire(&s, "kept", &["--ttl", "30s"]);
    let o = run(lockctl_on(&s).args(["release", "kept", "--token", &a]));
    assert_eq!(code(&o), 0);
    let first: u64 = s.get("{lockctl:kept}\u{1f}fence").unwrap().parse().unwrap();
    s.restart_in_place();
    assert!(
        s.cmd::<i64>(&["EXISTS", "{lockctl:kept}\u{1f}fence"]) == 1,
        "the AOF was loaded"
    );
    let o = run(quarantined_on(&s).args(["acquire", "kept", "-n", "--format", "json"]));
    let err = stderr(&o);
    assert_eq!(code(&o), 75, "{err}");
    assert_quarantine_message(&err, &s);
    assert_eq!(s.get("lockctl:kept"), None);
    // The operator lifts it, knowing the node kept its data: the next fence is still larger.
    let o = run(quarantined_on(&s).args([
        "acquire",
        "kept",
        "-n",
        "--quarantine",
        "0",
        "--format",
        "json",
    ]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let g: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(g["fence"].as_u64().unwrap() > first, "{g} after {first}");
}

/// Redis reports `uptime_in_seconds` as floor(now) - floor(start): a server started at x.9 s says
/// "up 1 s" 0.1 s later. The restart quarantine must not end early because of it. The server is
/// started at a wall-clock fraction of about .9 s, and `acquire -n` is tried in a loop with a 2 s
/// quarantine: the grant must come at least 2 s after the moment just before the server was spawned
/// (a lower bound only, so a slow machine cannot fail it). Checked on the server's clock too: a new
/// counter starts from the server's clock in microseconds, so the fence is the grant's time.
#[test]
fn quarantine_is_not_cut_short_by_the_uptime_rounding() {
    loop {
        let frac = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .subsec_millis();
        if (880..920).contains(&frac) {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let spawned_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    let spawned = Instant::now();
    let s = Server::start();
    let quarantine = Duration::from_secs(2);
    let grant = loop {
        let o = run(lockctl_on(&s).args([
            "acquire",
            "early",
            "-n",
            "--quarantine",
            "2s",
            "--ttl",
            "2s",
            "--format",
            "json",
        ]));
        let done = spawned.elapsed();
        match code(&o) {
            0 => {
                assert!(
                    done >= quarantine,
                    "granted {done:?} after the server was spawned, within the 2 s quarantine"
                );
                break serde_json::from_str::<serde_json::Value>(&stdout(&o)).unwrap();
            }
            75 => assert!(stderr(&o).contains("quarantine"), "{}", stderr(&o)),
            c => panic!("exit {c}: {}", stderr(&o)),
        }
        assert!(done < Duration::from_secs(30), "never granted");
        std::thread::sleep(Duration::from_millis(20));
    };
    let fence = grant["fence"].as_u64().unwrap();
    assert!(
        fence >= spawned_us + 2_000_000,
        "granted at {fence} µs by the server's clock, {} µs after the spawn",
        fence as i64 - spawned_us as i64
    );
}

/// A quarantine with a part below a second (`--quarantine 1ms`, or the default, a `--ttl 2050ms`)
/// ends at one of the node's uptime steps, which come a whole second apart; the node tells only that
/// part once its uptime is a step short ("votes in 1ms", "50ms"), through the whole last second.
/// A waiter that slept what it was told retried every few tens of milliseconds until the step came:
/// a quarantine of 1 ms cost one waiter 18 attempts, each refused. Three waiters, each on a lock of
/// its own on a server the test has just started, must all be granted once the quarantine ends,
/// each with its attempts paced by its heartbeat, at least 0.8 s apart: at most 3 + the whole wait
/// / 0.8 s, a margin of two attempts.
#[test]
fn a_quarantine_below_a_whole_second_is_waited_out_without_polling() {
    let s = Server::start();
    let started = Instant::now();
    let waiters: Vec<_> = [
        ("tiny1", &["--ttl", "5s", "--quarantine", "1ms"][..]),
        ("tiny2", &["--ttl", "5s", "--quarantine", "1ms"][..]),
        // The default quarantine: the TTL.
        ("odd", &["--ttl", "2050ms"][..]),
    ]
    .into_iter()
    .map(|(name, args)| {
        let mut c = quarantined_on(&s);
        c.args(["--verbose", "acquire", name, "-w", "30s"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    })
    .collect();
    let outputs: Vec<_> = waiters
        .into_iter()
        .map(|w| wait_output(w, Duration::from_secs(60)))
        .collect();
    let bound = 3.0 + started.elapsed().as_secs_f64() / 0.8;
    for o in outputs {
        let err = stderr(&o);
        assert_eq!(code(&o), 0, "{err}");
        assert!(err.contains("restart quarantine"), "{err}");
        let attempts = err.lines().filter(|l| l.contains("attempt on '")).count();
        assert!(
            attempts as f64 <= bound,
            "{attempts} attempts, at most {bound:.1} due: {err}"
        );
    }
}

/// The release still announces itself on the name's `released` channel, which lockctl's waiters
/// listened to before each had a wake channel of its own: an older client waiting there must not
/// sleep until its next poll (docs/queue.md).
#[test]
fn a_release_is_published_for_older_clients() {
    let s = Server::start();
    let token = acquire(&s, "old", &["--ttl", "60s"]);
    let mut con = s.conn();
    let mut sub = con.as_pubsub();
    sub.subscribe("{lockctl:old}\u{1f}released").unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let o = run(lockctl_on(&s).args(["release", "old", "--token", &token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let msg = sub
        .get_message()
        .expect("the release published nothing on the released channel within 20 s");
    assert_eq!(msg.get_payload::<String>().unwrap(), "released");
}

/// A lock deleted without a release (a canonical client's `DEL`, as redis-py's `Lock` does) wakes
/// the head of the queue through the key's keyspace events when the server sends them
/// (`notify-keyspace-events`), instead of leaving it to find the lock free at its next heartbeat.
/// The deletion is made while the waiter sleeps; one that lands during an attempt instead is
/// simply won by it, so the wake-up must show in one try of three.
#[test]
fn a_deletion_without_a_release_wakes_the_head_through_keyspace_events() {
    let s = Server::start();
    let _: String = s.cmd(&["CONFIG", "SET", "notify-keyspace-events", "Kg"]);
    let mut tries = Vec::new();
    for t in 0..3 {
        let name = format!("deleted{t}");
        let key = format!("lockctl:{name}");
        let _: String = s.cmd(&["SET", &key, "theirs", "PX", "60000"]);
        let o = change_during_a_sleep(
            lockctl_on(&s).args(["acquire", &name, "-w", "30s", "--verbose"]),
            || {
                let _: i64 = s.cmd(&["DEL", &key]);
            },
        );
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        assert_eq!(s.get(&key), Some(stdout(&o)));
        if stderr(&o).contains("woken by a keyspace event") {
            return;
        }
        tries.push(stderr(&o));
    }
    panic!("the deletion never woke the waiter: {tries:#?}");
}

/// A log (stderr not a terminal) gets a wait line whenever the reason changes, and only then (or
/// every 30 seconds): a waiter on a held lock writes one line however often it retries; once its
/// server stops it says at once that Redis is unavailable, and who holds the lock once the server
/// is back.
#[test]
fn a_wait_line_is_written_when_the_reason_changes() {
    let s = Server::start();
    let held = acquire(&s, "reason", &["--ttl", "60s"]);
    let mut waiter = lockctl_on(&s)
        .args(["--node-timeout", "300ms", "acquire", "reason", "-w", "25s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (seen, reader) = stderr_so_far(waiter.stderr.take().unwrap());
    let count = |what: &str| seen.lock().unwrap().matches(what).count();
    // The waiter's 25 s ends before a 30 s line would come.
    let bound = Duration::from_secs(20);
    // As docs/usage.md shows it.
    let busy = "lockctl: waiting for lock 'reason' held by ";
    assert!(eventually(bound, || count(busy) == 1));
    // Several retries (one a heartbeat, about a second), no new line.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(count("waiting for lock"), 1, "{}", seen.lock().unwrap());
    s.pause();
    let unavailable = eventually(bound, || count("Redis unavailable since") == 1);
    s.resume();
    assert!(unavailable, "{}", seen.lock().unwrap());
    assert!(
        eventually(bound, || count(busy) == 2),
        "{}",
        seen.lock().unwrap()
    );
    let o = run(lockctl_on(&s).args(["release", "reason", "--token", &held]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    reader.join().unwrap();
    let all = seen.lock().unwrap().clone();
    assert_eq!(code(&o), 0, "{all}");
    assert_eq!(count("waiting for lock"), 3, "one line per reason: {all}");
}

/// A waiter whose subscription is cut (`CLIENT KILL TYPE pubsub`, as a server restart or a proxy
/// would) notices at once, says so in its trace, subscribes again and is then woken by the
/// release, instead of waiting deaf with a subscription it takes for alive.
#[test]
fn a_cut_subscription_is_noticed_and_made_again() {
    let s = Server::start();
    let held = acquire(&s, "cut", &["--ttl", "60s"]);
    let mut waiter = lockctl_on(&s)
        .args(["acquire", "cut", "-w", "30s", "--verbose"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (seen, reader) = stderr_so_far(waiter.stderr.take().unwrap());
    let count = |what: &str| seen.lock().unwrap().matches(what).count();
    let bound = Duration::from_secs(20);
    let subscribed = "subscribed to releases on 1/1 node(s)";
    assert!(eventually(bound, || count(subscribed) == 1));
    let killed: i64 = s.cmd(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert_eq!(killed, 1);
    let noticed = eventually(bound, || count("subscription dropped") == 1);
    assert!(noticed, "{}", seen.lock().unwrap());
    // Subscribed again (at most every 5 s), then released.
    assert!(
        eventually(bound, || count(subscribed) == 2),
        "{}",
        seen.lock().unwrap()
    );
    let o = run(lockctl_on(&s).args(["release", "cut", "--token", &held]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let o = wait_output(waiter, Duration::from_secs(60));
    reader.join().unwrap();
    let all = seen.lock().unwrap().clone();
    assert_eq!(code(&o), 0, "{all}");
    let after = all.rsplit(subscribed).next().unwrap();
    assert!(after.contains("woken by a release"), "{all}");
}

/// Once a waiter wins, its subscriber connections close (within the subscriber's 10 s idle check),
/// instead of staying open while an `exec` command runs: a server counts every connection.
#[test]
fn a_waiter_that_won_closes_its_subscriptions_while_its_command_runs() {
    let s = Server::start();
    let held = acquire(&s, "idle", &["--ttl", "60s"]);
    let subscribers = || {
        let list: String = s.cmd(&["CLIENT", "LIST", "TYPE", "pubsub"]);
        list.lines().count()
    };
    let mut exec = lockctl_on(&s)
        .args([
            "exec",
            "idle",
            "-w",
            "30s",
            "--",
            "sh",
            "-c",
            "echo started; sleep 60",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(20), || subscribers() == 1));
    let o = run(lockctl_on(&s).args(["release", "idle", "--token", &held]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut out = BufReader::new(exec.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "started\n");
    let closed = eventually(Duration::from_secs(40), || subscribers() == 0);
    let running = exec.try_wait().unwrap().is_none();
    kill(exec.id() as i32, libc::SIGTERM);
    let o = wait_output(exec, Duration::from_secs(60));
    assert!(closed, "the subscription stayed open: {}", stderr(&o));
    assert!(running, "the command ended first: {}", stderr(&o));
}
