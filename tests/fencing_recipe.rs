//! The README's fencing recipe, run as written: a holder whose lease ran out cannot overwrite the
//! work of the holder that came after it, because the storage refuses the smaller fence.
//!
//! The block between the `fencing-recipe` markers of README.md is extracted and run with `sh`
//! against sqlite3 and a real redis-server, so the documentation cannot drift from what works.

mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::*;

/// The shell code of the recipe, from README.md.
fn recipe() -> String {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("read README.md");
    let start = readme
        .find("<!-- fencing-recipe:start -->")
        .expect("README.md has the fencing-recipe:start marker");
    let end = readme
        .find("<!-- fencing-recipe:end -->")
        .expect("README.md has the fencing-recipe:end marker");
    let block = &readme[start..end];
    let code = block
        .split_once("```sh\n")
        .and_then(|(_, rest)| rest.split_once("```"))
        .expect("the recipe is a ```sh block")
        .0;
    assert!(code.contains("fence < $LOCKCTL_FENCE"), "{code}");
    code.to_string()
}

/// Runs the recipe in `dir` as worker `who`; `generate_report` writes `who` after `hook` has run.
fn worker(s: &Server, dir: &Path, who: &str, hook: &str) -> Child {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_lockctl")).parent().unwrap();
    let script = format!("generate_report() {{ {hook}; echo {who}; }}\n{}", recipe());
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(script)
        .current_dir(dir)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in lockctl_on(s).get_envs() {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.spawn().expect("run sh")
}

fn sql(dir: &Path, query: &str) -> String {
    let o = Command::new("sqlite3")
        .arg("app.db")
        .arg(query)
        .current_dir(dir)
        .output()
        .expect("sqlite3 is required by the tests (apt-get install sqlite3, or ./scripts/test)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn a_stale_holder_cannot_overwrite_a_newer_one() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();

    // A takes the lock, then stalls in generate_report until B has finished.
    let a = worker(
        &s,
        dir.path(),
        "A",
        "touch a.started; while [ ! -e b.done ]; do sleep 0.05; done",
    );
    assert!(
        eventually(Duration::from_secs(30), || dir
            .path()
            .join("a.started")
            .exists()),
        "A never started its work"
    );
    // A's lease runs out meanwhile (here: the key is gone, as after an expiry), and B gets the lock.
    assert!(s.get("lockctl:report").is_some());
    let _: i64 = s.cmd(&["DEL", "lockctl:report"]);
    let b = wait_output(worker(&s, dir.path(), "B", "true"), Duration::from_secs(60));
    assert_eq!(code(&b), 0, "B: {}", stderr(&b));
    let stored = || -> (String, u64) {
        let row = sql(dir.path(), "SELECT body, fence FROM reports");
        let (body, fence) = row.rsplit_once('|').unwrap();
        (body.trim().to_string(), fence.trim().parse().unwrap())
    };
    let (body, b_fence) = stored();
    assert_eq!(body, "B");
    std::fs::write(dir.path().join("b.done"), "").unwrap();

    // A wakes up and tries to write with its smaller fence: refused.
    let a = wait_output(a, Duration::from_secs(60));
    assert_eq!(code(&a), 76, "A: {}", stderr(&a));
    assert!(
        stderr(&a).contains("a newer lock holder already wrote"),
        "{}",
        stderr(&a)
    );
    assert_eq!(stored(), ("B".to_string(), b_fence));

    // A later holder writes again, with a larger fence.
    let c = wait_output(worker(&s, dir.path(), "C", "true"), Duration::from_secs(60));
    assert_eq!(code(&c), 0, "C: {}", stderr(&c));
    let (body, c_fence) = stored();
    assert_eq!(body, "C");
    assert!(c_fence > b_fence, "{b_fence} then {c_fence}");
    assert_eq!(
        s.get("lockctl:report"),
        None,
        "the recipe releases the lock"
    );
}
