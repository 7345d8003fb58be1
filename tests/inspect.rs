//! `status`, `list`, `break` and `doctor` against real redis-server processes.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::*;

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read the host name")
        .trim()
        .to_string()
}

fn json_of(o: &std::process::Output) -> Value {
    serde_json::from_str(&stdout(o))
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\nstderr: {}", stdout(o), stderr(o)))
}

/// What a measured run gave: exit code, stdout, stderr, peak RSS in KiB, wall time.
struct Measured {
    code: i32,
    stdout: String,
    stderr: String,
    max_rss_kib: u64,
    elapsed: Duration,
}

/// Runs lockctl under `/usr/bin/time -f %M`, which reports the peak RSS of lockctl alone. (wait4's
/// rusage from this process would not do: Linux carries the RSS peak of the forking test process over
/// `exec`.) Killed after `limit`.
fn run_measured(lockctl: &Command, limit: Duration) -> Measured {
    let rss_file = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new("/usr/bin/time");
    cmd.arg("-f").arg("%M").arg("-o").arg(rss_file.path());
    cmd.arg(lockctl.get_program()).args(lockctl.get_args());
    for (k, v) in lockctl.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let started = Instant::now();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run /usr/bin/time (apt-get install time)");
    let out = wait_output(child, limit);
    let elapsed = started.elapsed();
    let rss = std::fs::read_to_string(rss_file.path()).unwrap();
    Measured {
        code: code(&out),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: stderr(&out),
        max_rss_kib: rss
            .lines()
            .last()
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or_else(|| panic!("no RSS from /usr/bin/time: {rss}")),
        elapsed,
    }
}

// ---------------------------------------------------------------- status

#[test]
fn status_of_a_free_lock_exits_1() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["status", "nobody-here"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stdout(&o).contains("free"), "{}", stdout(&o));
    let j = json_of(&run(lockctl_on(&s).args([
        "status",
        "nobody-here",
        "--format",
        "json",
    ])));
    assert_eq!(j["state"], "free");
    assert_eq!(j["held"], false);
    assert!(j["token"].is_null() && j["holder"].is_null() && j["ttl_ms"].is_null());
    assert!(j["fence_counter"].is_null());
    assert!(s.keys().is_empty(), "status wrote to Redis: {:?}", s.keys());
}

#[test]
fn status_of_a_held_lock_names_holder_age_ttl_and_fence() {
    let s = Server::start();
    let first = acquire_json(&mut lockctl_on(&s), "deploy", &[]);
    let token = first["token"].as_str().unwrap();
    assert_eq!(
        code(&run(
            lockctl_on(&s).args(["release", "deploy", "--token", token])
        )),
        0
    );
    let grant = acquire_json(&mut lockctl_on(&s), "deploy", &["--ttl", "40s"]);
    let fence = grant["fence"].as_u64().unwrap();
    assert!(
        fence > first["fence"].as_u64().unwrap(),
        "{grant} after {first}"
    );
    let pid = std::process::id();

    let o = run(lockctl_on(&s).args(["status", "deploy"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("held"), "{text}");
    assert!(
        text.contains(&format!("{} pid {pid}", hostname())),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("fence") && l.ends_with(&fence.to_string())),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("age")), "{text}");

    let o = run(lockctl_on(&s).args(["status", "deploy", "--format", "json"]));
    assert_eq!(code(&o), 0);
    let j = json_of(&o);
    assert_eq!(j["name"], "deploy");
    assert_eq!(j["key"], "lockctl:deploy");
    assert_eq!(j["state"], "held");
    assert_eq!(j["held"], true);
    assert_eq!(j["token"], grant["token"]);
    assert_eq!(j["holder"]["host"], hostname());
    assert_eq!(j["holder"]["pid"].as_u64(), Some(pid as u64));
    let own_cmd = std::env::args().next().unwrap();
    assert!(
        j["holder"]["cmd"].as_str().unwrap().starts_with(&own_cmd),
        "{j}"
    );
    let age = j["age_ms"].as_i64().unwrap();
    assert!((0..60_000).contains(&age), "{j}");
    assert!(
        j["acquired_ms"].as_i64().unwrap() > 1_600_000_000_000,
        "{j}"
    );
    let ttl = j["ttl_ms"].as_i64().unwrap();
    assert!(ttl > 0 && ttl <= 40_000, "{j}");
    assert_eq!(j["fence"].as_u64(), Some(fence));
    assert_eq!(j["fence_counter"].as_u64(), Some(fence));
    assert_eq!(
        (j["nodes"].as_u64(), j["quorum"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(
        (j["answered"].as_u64(), j["agree"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(j["quorum_agrees"], true);
    let per = j["per_node"].as_array().unwrap();
    assert_eq!(per.len(), 1);
    assert_eq!(per[0]["node"], s.url());
    assert_eq!(per[0]["token"], grant["token"]);
    assert_eq!(per[0]["fence_counter"].as_u64(), Some(fence));
}

#[test]
fn status_of_a_canonical_client_lock_is_held_by_an_unknown_holder() {
    let s = Server::start();
    let _: () = s.cmd(&["SET", "lockctl:canon", "their-token", "NX", "PX", "60000"]);
    let o = run(lockctl_on(&s).args(["status", "canon"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("unknown"), "{}", stdout(&o));
    let j = json_of(&run(
        lockctl_on(&s).args(["status", "canon", "--format", "json"])
    ));
    assert_eq!(j["state"], "held");
    assert_eq!(j["token"], "their-token");
    assert!(
        j["holder"].is_null() && j["fence"].is_null() && j["age_ms"].is_null(),
        "{j}"
    );
    assert!(j["ttl_ms"].as_i64().unwrap() > 0);
}

#[test]
fn status_in_redlock_mode_shows_each_node_and_the_quorum() {
    let mut s = Servers::start(3);
    let set = |srv: &Server, key: &str, token: &str| {
        let _: () = srv.cmd(&["SET", key, token, "NX", "PX", "60000"]);
    };
    set(&s[0], "lockctl:two", "tok-a");
    set(&s[2], "lockctl:two", "tok-a");
    let o = run(s.lockctl().args(["status", "two", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(j["state"], "held");
    assert_eq!(
        (
            j["agree"].as_u64(),
            j["quorum"].as_u64(),
            j["nodes"].as_u64()
        ),
        (Some(2), Some(2), Some(3))
    );
    assert_eq!(j["quorum_agrees"], true);
    assert_eq!(j["token"], "tok-a");
    let per = j["per_node"].as_array().unwrap();
    let held: Vec<bool> = per.iter().map(|v| v["held"].as_bool().unwrap()).collect();
    assert_eq!(held, [true, false, true]);
    assert_eq!(per[1]["node"], s[1].url());
    let plain = stdout(&run(s.lockctl().args(["status", "two"])));
    assert!(plain.contains("2 of 3 node(s) agree"), "{plain}");
    for srv in &s.0 {
        assert!(plain.contains(&srv.url()), "{plain}");
    }

    // On one node of three, no quorum holds it: free.
    set(&s[1], "lockctl:one", "tok-b");
    let o = run(s.lockctl().args(["status", "one", "--format", "json"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        (j["state"].as_str(), j["agree"].as_u64()),
        (Some("free"), Some(1))
    );
    assert_eq!(j["quorum_agrees"], false);

    // One holder, one free node, one silent node: the silent one may hold it too, so nobody can tell.
    s[2].kill();
    let o = run(s
        .lockctl()
        .args(["--node-timeout", "300ms", "status", "one"]));
    assert_eq!(code(&o), 69, "{}{}", stdout(&o), stderr(&o));
    // The silent node's error does not push the other nodes' columns apart.
    let o = run(s
        .lockctl()
        .args(["--node-timeout", "300ms", "status", "two"]));
    let plain = stdout(&o);
    let row = |i: usize| {
        plain
            .lines()
            .find(|l| l.trim_start().starts_with(&s[i].url()))
            .unwrap_or_else(|| panic!("no row for node {i}: {plain}"))
    };
    assert!(row(2).contains("error"), "{plain}");
    assert!(row(0).contains("tok-a  ttl "), "{plain}");
    assert!(row(1).contains("  -      ttl "), "{plain}");
    // Two nodes silent: no quorum answered.
    s[1].kill();
    let o = run(s
        .lockctl()
        .args(["--node-timeout", "300ms", "status", "two"]));
    assert_eq!(code(&o), 69, "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("Redis unavailable"), "{}", stderr(&o));
}

// ---------------------------------------------------------------- list

fn listed_names(j: &Value) -> Vec<String> {
    let mut v: Vec<String> = j["locks"]
        .as_array()
        .unwrap_or_else(|| panic!("no locks array: {j}"))
        .iter()
        .map(|l| l["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn list_filters_by_pattern_and_leaves_out_auxiliary_keys() {
    let s = Server::start();
    for name in ["deploy-a", "deploy-b", "backup"] {
        acquire_json(&mut lockctl_on(&s), name, &[]);
    }
    let _: () = s.cmd(&["SET", "other:deploy-c", "x"]);
    let _: () = s.cmd(&["HSET", "lockctl:deploy-hash", "f", "v"]);
    assert!(
        s.keys().iter().any(|k| k.contains('\u{1f}')),
        "no auxiliary keys to leave out"
    );

    let o = run(lockctl_on(&s).args(["list", "deploy-*", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(listed_names(&j), ["deploy-a", "deploy-b"]);
    assert_eq!(j["count"].as_u64(), Some(2));
    assert_eq!(j["complete"], true);
    let first = &j["locks"][0];
    assert_eq!(
        first["holder"]["pid"].as_u64(),
        Some(std::process::id() as u64)
    );
    let counter: String = s.cmd(&["GET", "{lockctl:deploy-a}\u{1f}fence"]);
    assert_eq!(first["fence"].as_u64(), counter.parse().ok());
    assert!(first["ttl_ms"].as_i64().unwrap() > 0);

    let o = run(lockctl_on(&s).args(["list"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[0].starts_with("NAME") && lines[0].contains("HOLDER"),
        "{text}"
    );
    let names: Vec<&str> = lines[1..]
        .iter()
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["backup", "deploy-a", "deploy-b"], "sorted by name");
    assert!(
        !text.contains('\u{1f}') && !text.contains("fence}") && !text.contains("other"),
        "{text}"
    );
    // Aligned: the TTL column starts at the same place on every line.
    let col = lines[0].find("TTL").unwrap();
    for l in &lines[1..] {
        assert!(
            l[..col].ends_with("  ") && !l[col..].starts_with(' '),
            "not aligned: {text}"
        );
    }

    let o = run(lockctl_on(&s).args(["list", "nomatch-*"]));
    assert_eq!((code(&o), stdout(&o).as_str()), (0, ""));
}

#[test]
fn list_applies_the_glob_to_the_name_not_to_the_prefix() {
    let s = Server::start();
    let mut c = lockctl_on(&s);
    c.args(["--prefix", "a*["]);
    acquire_json(&mut c, "x", &[]);
    // Matched by the unescaped glob `a*[*`, but not under the prefix `a*[`.
    let _: () = s.cmd(&["SET", "ab[y", "t"]);
    let o = run(lockctl_on(&s).args(["--prefix", "a*[", "list", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(listed_names(&json_of(&o)), ["x"]);
}

#[test]
fn list_in_redlock_mode_merges_the_nodes() {
    let s = Servers::start(3);
    acquire_json(&mut s.lockctl(), "everywhere", &[]);
    for i in [1, 2] {
        let _: () = s[i].cmd(&["SET", "lockctl:two-of-three", "t2", "PX", "60000"]);
    }
    let _: () = s[2].cmd(&["SET", "lockctl:remnant", "t3", "PX", "60000"]);
    let o = run(s.lockctl().args(["list", "--format", "json"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        listed_names(&j),
        ["everywhere", "remnant", "two-of-three"],
        "each name once"
    );
    let by = |n: &str| {
        j["locks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["name"] == n)
            .unwrap()
            .clone()
    };
    assert_eq!(by("everywhere")["nodes_holding"].as_u64(), Some(3));
    assert_eq!(by("two-of-three")["nodes_holding"].as_u64(), Some(2));
    assert_eq!(by("two-of-three")["quorum_agrees"], true);
    assert_eq!(by("remnant")["quorum_agrees"], false);
    let text = stdout(&run(s.lockctl().args(["list"])));
    assert!(text.lines().next().unwrap().contains("NODES"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("two-of-three") && l.contains("2/3")),
        "{text}"
    );
}

#[test]
fn list_without_a_quorum_of_nodes_exits_69() {
    let mut s = Servers::start(3);
    acquire_json(&mut s.lockctl(), "somewhere", &[]);
    s[0].kill();
    let o = run(s
        .lockctl()
        .args(["--node-timeout", "300ms", "list", "--format", "json"]));
    assert_eq!(
        code(&o),
        0,
        "one node down of three still lists: {}",
        stderr(&o)
    );
    let j = json_of(&o);
    assert_eq!(listed_names(&j), ["somewhere"]);
    assert_eq!(
        (j["answered"].as_u64(), j["complete"].as_bool()),
        (Some(2), Some(false))
    );
    s[1].kill();
    let o = run(s.lockctl().args(["--node-timeout", "300ms", "list"]));
    assert_eq!(code(&o), 69, "{}{}", stdout(&o), stderr(&o));
    assert!(stderr(&o).contains("Redis unavailable"), "{}", stderr(&o));
}

/// Continues a stopped server when dropped, so a failing assertion leaves no stopped process behind.
struct Resume<'a>(&'a Server);

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        self.0.resume();
    }
}

#[test]
fn list_with_a_stopped_node_costs_about_one_node_timeout() {
    let s = Servers((0..3).map(|_| Server::with_debug_command()).collect());
    for name in ["alpha", "beta", "gamma"] {
        acquire_json(&mut s.lockctl(), name, &["--ttl", "10m"]);
    }
    // Several SCAN batches of lock keys on the remaining quorum (3000 replies per batch).
    for i in [0, 1] {
        s[i].populate(2500, Some("lockctl:bulk"));
    }
    s[2].pause();
    let _resume = Resume(&s[2]);
    let started = Instant::now();
    let child = s
        .lockctl()
        .args(["--node-timeout", "200ms", "list", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let o = wait_output(child, Duration::from_secs(120));
    let elapsed = started.elapsed();
    assert_eq!(code(&o), 0, "a quorum answered: {}", stderr(&o));
    // About one node timeout (200ms) plus the listing itself; reading every remaining reply of a
    // batch with the full timeout each would take minutes.
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}");
    let j = json_of(&o);
    let names = listed_names(&j);
    assert_eq!(names.len(), 2503, "{:?}", &names[..names.len().min(5)]);
    for name in ["alpha", "beta", "gamma", "bulk:0", "bulk:2499"] {
        assert!(names.iter().any(|n| n == name), "{name} listed");
    }
    let alpha = j["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == "alpha")
        .unwrap();
    assert_eq!(alpha["nodes_holding"].as_u64(), Some(2));
    assert_eq!(alpha["quorum_agrees"], true);
    assert_eq!(
        (j["answered"].as_u64(), j["complete"].as_bool()),
        (Some(2), Some(false))
    );
    assert!(
        stderr(&o).contains(&s[2].url()) && stderr(&o).contains("node timeout"),
        "{}",
        stderr(&o)
    );

    // status says the counter is unknown, not "never granted", when a node did not answer.
    let o = run(s
        .lockctl()
        .args(["--node-timeout", "200ms", "status", "never-taken"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    let counter = stdout(&o)
        .lines()
        .find(|l| l.starts_with("counter"))
        .unwrap_or_default()
        .to_string();
    assert!(
        counter.contains("unknown") && !counter.contains("never granted"),
        "{counter}"
    );
    let o = run(lockctl_on(&s[2]).args(["--node-timeout", "200ms", "status", "alpha"]));
    assert_eq!(code(&o), 69, "{}", stderr(&o));
    assert!(
        stdout(&o).contains("unknown (no node answered)"),
        "{}",
        stdout(&o)
    );
    assert!(!stdout(&o).contains("never granted"), "{}", stdout(&o));
}

#[test]
fn list_scans_300k_keys_quickly_with_bounded_memory() {
    let s = Server::with_debug_command();
    s.populate(300_000, None);
    for name in ["job-1", "job-2"] {
        acquire_json(&mut lockctl_on(&s), name, &["--ttl", "10m"]);
    }
    let m = run_measured(
        lockctl_on(&s).args(["list", "job-*"]),
        Duration::from_secs(120),
    );
    assert_eq!(m.code, 0, "{}", m.stderr);
    let names: Vec<&str> = m
        .stdout
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert_eq!(names, ["job-1", "job-2"], "{}", m.stdout);
    // Seconds in a debug build on a busy machine; the bound only proves the scan does not crawl.
    assert!(m.elapsed < Duration::from_secs(60), "took {:?}", m.elapsed);
    assert!(m.max_rss_kib < 48 * 1024, "peak RSS {} KiB", m.max_rss_kib);
}

#[test]
fn list_streams_300k_matching_locks_with_bounded_memory() {
    let s = Server::with_debug_command();
    // 300k keys under the prefix: each is a lock key as far as any client can tell.
    s.populate(300_000, Some("lockctl:bulk"));
    let m = run_measured(
        lockctl_on(&s).args(["list", "bulk:*"]),
        Duration::from_secs(300),
    );
    assert_eq!(m.code, 0, "{}", m.stderr);
    assert_eq!(
        m.stdout.lines().count(),
        300_001,
        "a header and one line per lock"
    );
    // Holding every row would take well over 100 MB; streaming past the sort limit keeps it small.
    assert!(m.max_rss_kib < 48 * 1024, "peak RSS {} KiB", m.max_rss_kib);
}

// ---------------------------------------------------------------- break

#[test]
fn break_refuses_without_a_terminal_and_leaves_the_lock() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "precious", &[]);
    let before = s.keys();
    let o = run(lockctl_on(&s).args(["break", "precious"]));
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("--yes"), "{}", stderr(&o));
    assert_eq!(s.get("lockctl:precious").as_deref(), g["token"].as_str());
    assert_eq!(s.keys(), before);
}

#[test]
fn break_with_yes_takes_the_lock_and_keeps_the_fencing_counter() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "stuck", &[]);
    let fence = g["fence"].as_u64().unwrap();
    let o = run(lockctl_on(&s).args(["break", "stuck", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains(&format!("pid {}", std::process::id())),
        "{text}"
    );
    assert!(text.contains(g["token"].as_str().unwrap()), "{text}");
    assert!(text.contains(&format!("fence {fence}")), "{text}");
    assert_eq!(s.get("lockctl:stuck"), None);
    assert_eq!(
        s.keys(),
        ["{lockctl:stuck}\u{1f}fence"],
        "only the fencing counter is left"
    );
    assert_eq!(s.get("{lockctl:stuck}\u{1f}fence"), Some(fence.to_string()));

    let next = acquire_json(&mut lockctl_on(&s), "stuck", &[]);
    assert!(next["fence"].as_u64().unwrap() > fence, "{next}");

    let o = run(lockctl_on(&s).args(["break", "never-held", "--yes"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
    assert!(stderr(&o).contains("free"), "{}", stderr(&o));
}

#[test]
fn break_on_a_terminal_asks_first() {
    let s = Server::start();
    let g = acquire_json(&mut lockctl_on(&s), "asked", &[]);
    let token = g["token"].as_str().unwrap().to_string();
    // `script` gives lockctl a pseudo-terminal as stdin; the answer is typed into it.
    let on_tty = |answer: &str| {
        let c = lockctl_on(&s);
        let bin = env!("CARGO_BIN_EXE_lockctl");
        let mut cmd = Command::new("script");
        cmd.args(["-qec", &format!("{bin} break asked"), "/dev/null"]);
        for (k, v) in c.get_envs() {
            match v {
                Some(v) => cmd.env(k, v),
                None => cmd.env_remove(k),
            };
        }
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run script(1) from util-linux");
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(answer.as_bytes())
            .unwrap();
        wait_output(child, Duration::from_secs(60))
    };
    let o = on_tty("n\n");
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let shown = format!("{}{}", stdout(&o), stderr(&o));
    assert!(shown.contains("[y/N]") && shown.contains(&token), "{shown}");
    assert_eq!(s.get("lockctl:asked"), Some(token.clone()));

    let o = on_tty("y\n");
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("broke lock 'asked'"), "{}", stdout(&o));
    assert_eq!(s.get("lockctl:asked"), None);
}

/// Reads a child's output on a thread, so a test can wait for a prompt that ends without a newline.
fn output_reader(
    mut out: impl std::io::Read + Send + 'static,
) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    rx
}

/// The lock changes hands while the operator reads the question: the answer confirms the holder
/// that was shown, so the new holder's key stays, and break says so.
#[test]
fn break_leaves_a_holder_that_came_after_the_question() {
    use std::io::Write;
    let s = Server::start();
    let first = acquire_json(&mut lockctl_on(&s), "moved", &["--ttl", "60s"]);
    let first_token = first["token"].as_str().unwrap().to_string();
    let c = lockctl_on(&s);
    let mut cmd = Command::new("script");
    // `script` gives lockctl a pseudo-terminal; what it shows there comes out on script's stdout.
    cmd.args([
        "-qec",
        &format!("{} break moved", env!("CARGO_BIN_EXE_lockctl")),
        "/dev/null",
    ]);
    for (k, v) in c.get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run script(1) from util-linux");
    let mut answer = child.stdin.take().unwrap();
    let chunks = output_reader(child.stdout.take().unwrap());
    let mut screen = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !screen.contains("[y/N]") {
        let left = deadline.saturating_duration_since(Instant::now());
        match chunks.recv_timeout(left) {
            Ok(bytes) => screen.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => panic!("no question within 30 s: {screen}"),
        }
    }
    assert!(screen.contains(&first_token), "{screen}");

    // Before the answer, the first holder lets go and another takes the lock.
    let o = run(lockctl_on(&s).args(["release", "moved", "--token", &first_token]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let second = acquire_json(&mut lockctl_on(&s), "moved", &["--ttl", "60s"]);
    let second_token = second["token"].as_str().unwrap().to_string();
    let holder_before: Vec<String> = s.cmd(&["HGETALL", "{lockctl:moved}\u{1f}holder"]);

    answer.write_all(b"y\n").unwrap();
    let o = wait_output(child, Duration::from_secs(60));
    drop(answer);
    while let Ok(bytes) = chunks.recv_timeout(Duration::from_secs(5)) {
        screen.push_str(&String::from_utf8_lossy(&bytes));
    }
    assert_eq!(code(&o), 1, "{screen}{}", stderr(&o));
    assert!(screen.contains("changed hands"), "break says so: {screen}");
    assert!(!screen.contains("broke lock"), "{screen}");
    assert_eq!(
        s.get("lockctl:moved"),
        Some(second_token),
        "the new holder's lock was broken"
    );
    assert!(s.cmd::<i64>(&["PTTL", "lockctl:moved"]) > 50_000);
    let holder_after: Vec<String> = s.cmd(&["HGETALL", "{lockctl:moved}\u{1f}holder"]);
    assert!(!holder_after.is_empty());
    assert_eq!(
        holder_after, holder_before,
        "the new holder's record changed"
    );
}

/// A break wakes the waiters at once, as a release does, instead of leaving them to sleep out their
/// backoff. With -v the waiter logs what ended its sleep.
#[test]
fn break_wakes_the_waiters() {
    use std::io::BufRead;
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "awaited", &["--ttl", "60s"]);
    let mut waiter = lockctl_on(&s)
        .args(["-v", "acquire", "awaited", "--ttl", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(waiter.stderr.take().unwrap());
    let mut log = String::new();
    while !log.contains("waiting for lock") {
        assert!(
            err.read_line(&mut log).unwrap() > 0,
            "the waiter ended: {log}"
        );
    }
    let rest = collect_stderr(err.into_inner());
    // Subscribed and asleep in its backoff.
    std::thread::sleep(Duration::from_secs(3));
    let o = run(lockctl_on(&s).args(["break", "awaited", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = wait_output(waiter, Duration::from_secs(60));
    log.push_str(&rest.join().unwrap());
    assert_eq!(code(&out), 0, "{log}");
    assert_eq!(s.get("lockctl:awaited"), Some(stdout(&out)));
    assert!(log.contains("woken by a release of 'awaited'"), "{log}");
}

#[test]
fn break_in_redlock_mode_clears_every_node() {
    let s = Servers::start(3);
    let g = acquire_json(&mut s.lockctl(), "multi", &[]);
    let o = run(s.lockctl().args(["break", "multi", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("on 3 of 3 nodes"), "{}", stdout(&o));
    for srv in &s.0 {
        assert_eq!(srv.get("lockctl:multi"), None);
        assert_eq!(srv.keys(), ["{lockctl:multi}\u{1f}fence"]);
    }
    let next = acquire_json(&mut s.lockctl(), "multi", &[]);
    assert!(next["fence"].as_u64() > g["fence"].as_u64());
}

/// With an empty prefix, the lock keys `x` and `{x}` used to share their fencing counter and holder
/// record (`{x}\x1ffence`): one counter for two locks, and `status x` showed `{x}`'s holder. Now a key
/// with a brace gets auxiliary keys of another shape, and the two locks share nothing.
#[test]
fn names_x_and_braced_x_share_no_key() {
    let s = Server::start();
    let on = || {
        let mut c = lockctl_on(&s);
        c.args(["--prefix", ""]);
        c
    };
    let braced = acquire_json(&mut on(), "{x}", &["--ttl", "30s"]);
    let o = run(on().args(["status", "x", "--format", "json"]));
    assert_eq!(code(&o), 1, "x is free: {}", stdout(&o));
    let j = json_of(&o);
    assert!(j["holder"].is_null(), "{j}");
    assert!(j["fence_counter"].is_null(), "x has no counter yet: {j}");

    let plain = acquire_json(&mut on(), "x", &["--ttl", "30s"]);
    let o = run(on().args(["release", "x", "--token", plain["token"].as_str().unwrap()]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let again = acquire_json(&mut on(), "x", &[]);
    assert!(again["fence"].as_u64() > plain["fence"].as_u64());

    // `{x}`'s record and counter are its own: status of each shows its own token and fence.
    let o = run(on().args(["status", "{x}", "--format", "json"]));
    let j = json_of(&o);
    assert_eq!(j["token"], braced["token"], "{j}");
    assert_eq!(j["fence"], braced["fence"], "{j}");
    assert_eq!(j["fence_counter"], braced["fence"], "{j}");
    let o = run(on().args(["status", "x", "--format", "json"]));
    let j = json_of(&o);
    assert_eq!(j["token"], again["token"], "{j}");
    assert_eq!(j["fence"], again["fence"], "{j}");
    assert_eq!(j["fence_counter"], again["fence"], "{j}");
    let keys = s.keys();
    assert_eq!(keys.len(), 6, "two locks of three keys each: {keys:?}");
}

// ---------------------------------------------------------------- doctor

/// The finding lines of a plain doctor report for `check`.
fn finding<'a>(text: &'a str, check: &str) -> Vec<&'a str> {
    text.lines()
        .map(str::trim_start)
        .filter(|l| l.split_whitespace().nth(1) == Some(check))
        .collect()
}

#[test]
fn doctor_passes_a_plain_node_with_a_persistence_warning() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["doctor"]));
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    let p = finding(&text, "persistence");
    assert!(p.len() == 1 && p[0].starts_with("warn"), "{text}");
    assert!(finding(&text, "eviction")[0].starts_with("ok"), "{text}");
    assert!(finding(&text, "role")[0].starts_with("ok"), "{text}");
    assert!(finding(&text, "reachable")[0].starts_with("ok"), "{text}");
    assert!(finding(&text, "clock")[0].starts_with("ok"), "{text}");
    // The test server is seconds old: shorter than the TTL.
    assert!(finding(&text, "uptime")[0].starts_with("warn"), "{text}");
    assert!(
        !text.lines().any(|l| l.trim_start().starts_with("fail")),
        "{text}"
    );
    // The harness turns the restart quarantine off; doctor calls that out.
    assert!(
        finding(&text, "quarantine")[0].starts_with("warn"),
        "{text}"
    );
    let o = run(lockctl_on(&s)
        .env_remove("LOCKCTL_QUARANTINE")
        .args(["doctor"]));
    assert!(
        finding(&stdout(&o), "quarantine")[0].starts_with("ok"),
        "{}",
        stdout(&o)
    );
}

#[test]
fn doctor_json_lists_findings_and_servers() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["doctor", "--format", "json", "--ttl", "2s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let j = json_of(&o);
    assert_eq!(j["ok"], true);
    assert_eq!(j["exit_code"].as_u64(), Some(0));
    assert_eq!(
        (
            j["nodes"].as_u64(),
            j["quorum"].as_u64(),
            j["reachable"].as_u64()
        ),
        (Some(1), Some(1), Some(1))
    );
    assert_eq!(j["ttl_ms"].as_u64(), Some(2000));
    assert_eq!(j["failures"].as_u64(), Some(0));
    assert!(j["warnings"].as_u64().unwrap() >= 1);
    for f in j["findings"].as_array().unwrap() {
        for field in ["node", "check", "level", "found", "advice"] {
            assert!(f.get(field).is_some(), "{field} missing in {f}");
        }
        assert!(["ok", "warn", "fail"].contains(&f["level"].as_str().unwrap()));
    }
    let srv = &j["servers"][0];
    assert_eq!(srv["node"], s.url());
    assert_eq!(srv["role"], "master");
    assert_eq!(srv["maxmemory_policy"], "noeviction");
    assert_eq!(srv["appendonly"], "no");
    assert!(srv["latency_ms"].as_f64().unwrap() >= 0.0);
    assert!(srv["clock_offset_ms"].as_i64().is_some());
}

/// `appendfsync always` is not enough when `no-appendfsync-on-rewrite yes` skips the fsync while a
/// rewrite runs: doctor says so (it used to report such a node "ok").
#[test]
fn doctor_warns_when_fsync_is_skipped_during_rewrites() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let s = Server::with_args(&[&aof[..], &["--no-appendfsync-on-rewrite", "yes"]].concat());
    let o = run(lockctl_on(&s).args(["doctor"]));
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let text = stdout(&o);
    let p = finding(&text, "persistence");
    assert!(p.len() == 1 && p[0].starts_with("warn"), "{text}");
    assert!(
        p[0].contains("no-appendfsync-on-rewrite yes")
            && p[0].contains("set no-appendfsync-on-rewrite no"),
        "{text}"
    );

    let s = Server::with_args(&[&aof[..], &["--no-appendfsync-on-rewrite", "no"]].concat());
    let text = stdout(&run(lockctl_on(&s).args(["doctor"])));
    assert!(finding(&text, "persistence")[0].starts_with("ok"), "{text}");
}

/// A fencing counter lost with a node's data starts again from the server's clock, which is safe
/// only while no counter is ahead of that clock: doctor compares the counters under the prefix with
/// the server's clock and names one that is ahead.
#[test]
fn doctor_finds_fencing_counters_ahead_of_the_clock() {
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "fine", &[]);
    // Under another prefix: not ours to judge.
    let far = (s.clock_us() + 3_600_000_000).to_string();
    let _: () = s.cmd(&["SET", "{other:z}\u{1f}fence", &far]);
    let text = stdout(&run(lockctl_on(&s).args(["doctor"])));
    let f = finding(&text, "fences");
    assert!(f.len() == 1 && f[0].starts_with("ok"), "{text}");
    assert!(
        f[0].contains("1 fencing counter(s) under the prefix"),
        "{text}"
    );
    assert!(
        f[0].contains("steps back"),
        "the assumption is stated: {text}"
    );

    let _: () = s.cmd(&["SET", "{lockctl:ahead}\u{1f}fence", &far]);
    let text = stdout(&run(lockctl_on(&s).args(["doctor"])));
    let f = finding(&text, "fences");
    assert!(f.len() == 1 && f[0].starts_with("warn"), "{text}");
    assert!(
        f[0].contains("1 of 2") && f[0].contains("'lockctl:ahead'"),
        "{text}"
    );
}

#[test]
fn doctor_warns_on_volatile_eviction() {
    let s = Server::with_args(&["--maxmemory-policy", "volatile-lru"]);
    let o = run(lockctl_on(&s).args(["doctor"]));
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let text = stdout(&o);
    let e = finding(&text, "eviction");
    assert!(
        e[0].starts_with("warn") && e[0].contains("volatile-lru") && e[0].contains("noeviction"),
        "{text}"
    );
}

#[test]
fn doctor_fails_on_allkeys_eviction() {
    let s = Server::with_args(&["--maxmemory-policy", "allkeys-lru"]);
    let o = run(lockctl_on(&s).args(["doctor"]));
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let text = stdout(&o);
    assert!(finding(&text, "eviction")[0].starts_with("fail"), "{text}");
}

#[test]
fn doctor_fails_on_a_replica_and_warns_on_a_master_with_replicas() {
    let master = Server::start_tcp();
    let port = master.port.unwrap().to_string();
    let replica = Server::with_args(&["--replicaof", "127.0.0.1", &port]);
    let o = run(lockctl_on(&replica).args(["doctor"]));
    assert_eq!(code(&o), 1, "{}", stdout(&o));
    let text = stdout(&o);
    let r = finding(&text, "role");
    assert!(
        r[0].starts_with("fail") && r[0].contains("replica"),
        "{text}"
    );

    assert!(
        eventually(Duration::from_secs(30), || {
            let info: String = master.cmd(&["INFO", "replication"]);
            info.contains("connected_slaves:1")
        }),
        "the replica never connected"
    );
    let o = run(lockctl_on(&master).args(["doctor"]));
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    let text = stdout(&o);
    let r = finding(&text, "replication");
    assert!(
        r[0].starts_with("warn") && r[0].contains("fencing"),
        "{text}"
    );
}

#[test]
fn doctor_says_could_not_check_when_config_is_renamed() {
    let s = Server::with_args(&["--rename-command", "CONFIG", ""]);
    let o = run(lockctl_on(&s).args(["doctor"]));
    assert_eq!(code(&o), 0, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    let p = finding(&text, "persistence");
    assert!(
        p[0].starts_with("warn") && p[0].contains("could not check"),
        "{text}"
    );
    // The policy is still known from INFO; the other checks went on.
    assert!(finding(&text, "eviction")[0].starts_with("ok"), "{text}");
    assert!(finding(&text, "clock")[0].starts_with("ok"), "{text}");
    let j = json_of(&run(lockctl_on(&s).args(["doctor", "--format", "json"])));
    assert!(j["servers"][0]["appendonly"].is_null(), "{j}");
}

#[test]
fn doctor_in_redlock_mode_reports_node_counts_and_unreachable_nodes() {
    let s = Servers::start(3);
    let dead = format!("redis://127.0.0.1:{}", free_port());
    let mut c = s.lockctl();
    c.env("LOCKCTL_REDIS", format!("{},{dead}", s.urls()));
    let o = run(c.args(["--node-timeout", "300ms", "doctor"]));
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(
        finding(&text, "nodes")[0].starts_with("warn") && text.contains("even"),
        "{text}"
    );
    let unreachable: Vec<&str> = finding(&text, "reachable")
        .into_iter()
        .filter(|l| l.starts_with("fail"))
        .collect();
    assert_eq!(unreachable.len(), 1, "{text}");
    assert!(text.contains(&dead), "{text}");

    let mut c = lockctl();
    c.env("LOCKCTL_REDIS", format!("{},{}", s[0].url(), s[1].url()));
    let o = run(c.args(["doctor"]));
    assert_eq!(code(&o), 0, "{}", stdout(&o));
    assert!(
        finding(&stdout(&o), "nodes")[0].starts_with("warn"),
        "{}",
        stdout(&o)
    );

    let mut c = lockctl();
    let dead2 = format!("redis://127.0.0.1:{}", free_port());
    c.env("LOCKCTL_REDIS", format!("{},{dead},{dead2}", s[0].url()));
    let o = run(c.args(["--node-timeout", "300ms", "doctor", "--format", "json"]));
    assert_eq!(code(&o), 69, "{}{}", stdout(&o), stderr(&o));
    let j = json_of(&o);
    assert_eq!(
        (j["reachable"].as_u64(), j["ok"].as_bool()),
        (Some(1), Some(false))
    );
}

#[test]
fn doctor_fails_when_two_urls_reach_the_same_server() {
    let s = Server::start_tcp();
    let mut c = lockctl();
    // The socket and the TCP port of one server: two URLs, one node.
    c.env(
        "LOCKCTL_REDIS",
        format!("unix://{},{}", s.socket().display(), s.url()),
    );
    let o = run(c.args(["doctor"]));
    assert_eq!(code(&o), 1, "{}{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("same server"), "{text}");
}

// ---------------------------------------------------------------- bad input

#[test]
fn bad_input_exits_2_and_changes_nothing() {
    let s = Server::start();
    acquire_json(&mut lockctl_on(&s), "kept", &[]);
    let before = s.keys();
    let cases: &[(&[&str], &str)] = &[
        (&["status", ""], "NAME"),
        (&["status", "a\u{7}b"], "NAME"),
        (&["status", "kept", "--format", "xml"], "--format"),
        (&["break", "", "--yes"], "NAME"),
        (&["break", "kept\n", "--yes"], "NAME"),
        (&["list", ""], "PATTERN"),
        (&["list", "--format", "yaml"], "--format"),
        (&["doctor", "--ttl", "0"], "--ttl"),
        (&["doctor", "--ttl", "soon"], "--ttl"),
    ];
    for (args, mentions) in cases {
        let o = run(lockctl_on(&s).args(*args));
        assert_eq!(code(&o), 2, "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(mentions),
            "{args:?} should name {mentions}: {}",
            stderr(&o)
        );
        assert_eq!(s.keys(), before, "{args:?} changed Redis");
    }
}

#[test]
fn list_scans_and_never_uses_keys() {
    let s = Server::start();
    for name in ["a", "b", "c"] {
        acquire_json(&mut lockctl_on(&s), name, &["--ttl", "60s"]);
    }
    let _: String = s.cmd(&["CONFIG", "RESETSTAT"]);
    let o = run(lockctl_on(&s).args(["list"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let stats: String = s.cmd(&["INFO", "commandstats"]);
    assert!(stats.contains("cmdstat_scan:"), "{stats}");
    assert!(
        !stats.contains("cmdstat_keys:"),
        "list must never send KEYS: {stats}"
    );
}

// ---------------------------------------------------------------- the restart quarantine

/// Issue 13 item 1: `status` said "free" (exit 1) and `doctor` nothing specific while the quarantine
/// kept every client out. Both now say which node, since when, for how much longer, and how to lift
/// it; JSON carries the same per node.
#[test]
fn status_and_doctor_show_the_quarantine() {
    let mut servers = Servers::start(3);
    // Two nodes restarted without data, so that no quorum can vote. (Node 0, seconds old too, is in
    // quarantine as well: the point here is what is shown.)
    servers[1].restart_empty();
    servers[2].restart_empty();
    let mut c = servers.lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    let o = run(c.args(["status", "q"]));
    let text = stdout(&o);
    assert_eq!(code(&o), 1, "free: {text}{}", stderr(&o));
    let line = |k: &str| {
        text.lines()
            .find(|l| l.starts_with(k))
            .unwrap_or_else(|| panic!("no {k} line: {text}"))
            .to_string()
    };
    assert!(
        line("state").contains("no quorum can vote for another"),
        "{text}"
    );
    let q = line("quarantine");
    for s in &servers.0 {
        assert!(q.contains(&s.url()), "{text}");
    }
    assert!(q.contains("started") && q.contains("votes in"), "{text}");
    assert!(
        q.contains("--quarantine 0") && q.contains("LOCKCTL_QUARANTINE=0"),
        "{text}"
    );
    assert!(!text.contains("restarted"), "{text}");
    assert!(text.contains("in quarantine for"), "per node: {text}");

    let mut c = servers.lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    let j = json_of(&run(c.args(["status", "q", "--format", "json"])));
    assert_eq!(j["quarantine_ms"], 30_000, "{j}");
    assert_eq!(j["quarantined"], 3, "{j}");
    assert!(j["quorum_votes_in_ms"].as_u64().unwrap() > 20_000, "{j}");
    for n in j["per_node"].as_array().unwrap() {
        assert!(n["uptime_s"].as_u64().unwrap() < 10, "{j}");
        assert!(
            n["quarantine_remaining_ms"].as_u64().unwrap() > 20_000,
            "{j}"
        );
    }
    // With the quarantine off, nothing is in it.
    let j = json_of(&run(servers
        .lockctl()
        .args(["status", "q", "--format", "json"])));
    assert_eq!(
        (j["quarantined"].as_u64(), j["quorum_votes_in_ms"].as_u64()),
        (Some(0), Some(0))
    );
    assert_eq!(j["per_node"][0]["quarantine_remaining_ms"], 0, "{j}");

    let mut c = servers.lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    let o = run(c.args(["doctor"]));
    let text = stdout(&o);
    let uptime = finding(&text, "uptime");
    assert_eq!(uptime.len(), 3, "{text}");
    for u in uptime {
        assert!(u.starts_with("warn"), "{text}");
        assert!(
            u.contains("restart quarantine") && u.contains("for another"),
            "{u}"
        );
        assert!(u.contains("--quarantine 0"), "{u}");
        assert!(!u.contains("restarted"), "{u}");
    }
    let mut c = servers.lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    let j = json_of(&run(c.args(["doctor", "--format", "json"])));
    for srv in j["servers"].as_array().unwrap() {
        assert!(
            srv["quarantine_remaining_ms"].as_u64().unwrap() > 20_000,
            "{j}"
        );
    }
}

/// A node that fsyncs every write and kept this lock's counter is still shown in quarantine: its
/// settings after the restart prove nothing about what it had before (see `tests/spared_aof.rs`).
#[test]
fn status_shows_an_aof_node_in_quarantine_after_a_restart() {
    let mut s = Server::with_args(&["--appendonly", "yes", "--appendfsync", "always"]);
    acquire_json(&mut lockctl_on(&s), "kept", &["--ttl", "1s"]);
    s.restart_in_place();
    let mut c = lockctl_on(&s);
    c.env_remove("LOCKCTL_QUARANTINE");
    let j = json_of(&run(c.args(["status", "kept", "--format", "json"])));
    assert!(j["per_node"][0].get("quarantine_spared").is_none(), "{j}");
    assert!(
        j["per_node"][0]["quarantine_remaining_ms"]
            .as_u64()
            .unwrap()
            > 0,
        "{j}"
    );
    assert!(j["quorum_votes_in_ms"].as_u64().unwrap() > 0, "{j}");
}

/// `break` still announces itself on the name's `released` channel, which lockctl's waiters
/// listened to before each had a wake channel of its own: an older client waiting there must not
/// sleep until its next poll (docs/queue.md).
#[test]
fn a_break_is_published_for_older_clients() {
    let s = Server::start();
    let o = run(lockctl_on(&s).args(["acquire", "old", "--ttl", "60s"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let mut con = s.conn();
    let mut sub = con.as_pubsub();
    sub.subscribe("{lockctl:old}\u{1f}released").unwrap();
    sub.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let o = run(lockctl_on(&s).args(["break", "old", "--yes"]));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert_eq!(s.get("lockctl:old"), None, "broken");
    let msg = sub
        .get_message()
        .expect("break published nothing on the released channel within 20 s");
    assert_eq!(msg.get_payload::<String>().unwrap(), "broken");
}
