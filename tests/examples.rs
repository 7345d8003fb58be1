//! The recipes under `examples/`, run as written against a real redis-server.
//!
//! Each recipe file is read here and its shell is run: the cron line (after its five time fields,
//! with the crontab's variables), the `run:` blocks of the GitHub Actions job and the `script:` items
//! of the GitLab CI job (with their `env:` / `variables:`), the systemd service's `ExecStart=` (with its
//! `Environment=`), and the shell script. The systemd units also go through `systemd-analyze verify`,
//! which must print nothing. What a test has to replace is said where it does: the path of the job
//! the recipe runs, the node file or secret, and for `systemd-analyze` (which checks that `ExecStart=`
//! is executable) `/usr/bin/lockctl` by the binary under test.
//!
//! The YAML files are read with a few lines of code, not a YAML library: they keep to block scalars
//! (`run: |`), one-line lists (`- command`) and `KEY: value` maps, which is all the recipes need.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const PASSWORD: &str = "ExampleS3cret";

fn example(path: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// A password-protected server, and a private node file that names it.
struct Setup {
    server: Server,
    dir: tempfile::TempDir,
    file: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let server = Server::start_tcp();
        let ok: String = server.cmd(&["CONFIG", "SET", "requirepass", PASSWORD]);
        assert_eq!(ok, "OK");
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("redis.conf");
        std::fs::write(&file, format!("# nodes\n{}\n", self_url(&server))).unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        Setup { server, dir, file }
    }

    fn url(&self) -> String {
        self_url(&self.server)
    }

    /// The lock key's value, read over the unix socket with the password.
    fn get(&self, key: &str) -> Option<String> {
        let mut c = redis::Client::open(format!(
            "unix://{}?pass={PASSWORD}",
            self.server.socket().display()
        ))
        .unwrap()
        .get_connection()
        .unwrap();
        redis::cmd("GET").arg(key).query(&mut c).unwrap()
    }

    /// A job script in the work directory: logs `start NAME`, waits for the file `go`, logs `end NAME`.
    fn job(&self, name: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let log = self.dir.path().join("log");
        let go = self.dir.path().join("go");
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\necho \"start $WHO\" >> {log}\nwhile [ ! -e {go} ]; do sleep 0.02; done\n\
                 echo \"end $WHO\" >> {log}\n",
                log = log.display(),
                go = go.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    fn go(&self) {
        std::fs::write(self.dir.path().join("go"), "").unwrap();
    }
}

fn self_url(s: &Server) -> String {
    format!("redis://:{PASSWORD}@127.0.0.1:{}", s.port.unwrap())
}

/// A shell with only what a job has: the lockctl under test on PATH and the system's tools.
fn shell(program: &str, script: &str, env: &[(String, String)], cwd: &Path) -> Command {
    let bin = Path::new(env!("CARGO_BIN_EXE_lockctl")).parent().unwrap();
    let mut c = Command::new(program);
    c.args(["-e", "-c", script])
        .current_dir(cwd)
        .env_clear()
        .env(
            "PATH",
            format!("{}:/usr/local/bin:/usr/bin:/bin", bin.display()),
        )
        .env("HOME", cwd)
        // The test servers are seconds old; the quarantine would refuse them (see the README).
        .env("LOCKCTL_QUARANTINE", "0")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// Runs `first` until its job has started, then `second`, which must wait for it (or skip), then lets
/// the jobs finish. Returns both outputs.
fn contend(
    s: &Setup,
    first: &mut Command,
    second: &mut Command,
) -> (std::process::Output, std::process::Output) {
    let a = first.env("WHO", "A").spawn().unwrap();
    assert!(
        eventually(Duration::from_secs(30), || s.log().contains("start A")),
        "the first job never started"
    );
    let b = second.env("WHO", "B").spawn().unwrap();
    // B must not start its job while A holds the lock.
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        !s.log().contains("start B"),
        "B ran while A held the lock: {}",
        s.log()
    );
    s.go();
    let a = wait_output(a, Duration::from_secs(60));
    let b = wait_output(b, Duration::from_secs(60));
    (a, b)
}

/// The lines of the block under `key:` (a `|` block scalar, or a list of `- item`), de-indented.
fn yaml_block(text: &str, key: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start().trim_start_matches("- ");
        let Some(rest) = trimmed.strip_prefix(&format!("{key}:")) else {
            continue;
        };
        let indent = line.len() - line.trim_start().len();
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > indent)
            .copied()
            .collect();
        let rest = rest.trim();
        if rest == "|" {
            let inner = body
                .iter()
                .find(|l| !l.trim().is_empty())
                .map_or(0, |l| l.len() - l.trim_start().len());
            out.extend(
                body.iter()
                    .map(|l| l.get(inner..).unwrap_or("").to_string()),
            );
        } else if rest.is_empty() {
            out.extend(
                body.iter()
                    .filter_map(|l| l.trim().strip_prefix("- ").map(str::to_string)),
            );
        } else {
            out.push(rest.to_string());
        }
    }
    out
}

/// `KEY: value` pairs of the maps under `key:`, leaving out `${{ ... }}` values (secrets).
fn yaml_vars(text: &str, key: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if line.trim() != format!("{key}:") {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        for l in lines[i + 1..]
            .iter()
            .take_while(|l| l.len() - l.trim_start().len() > indent)
        {
            if let Some((k, v)) = l.trim().split_once(": ") {
                if !k.starts_with('#') && !v.contains("${{") {
                    out.push((k.to_string(), v.trim().to_string()));
                }
            }
        }
    }
    out
}

#[test]
fn cron_line_skips_a_run_while_the_previous_one_holds_the_lock() {
    let s = Setup::new();
    let crontab = example("cron/nightly-report.crontab");
    let mut env = Vec::new();
    let mut jobs = Vec::new();
    for line in crontab.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_once('=') {
            Some((k, v)) if !k.contains(' ') => env.push((k.to_string(), v.to_string())),
            _ => jobs.push(
                line.split_whitespace()
                    .skip(5)
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
        }
    }
    assert_eq!(jobs.len(), 1, "{crontab}");
    assert!(
        env.iter().any(|(k, _)| k == "LOCKCTL_REDIS_FILE"),
        "{env:?}"
    );
    // This test's node file and job stand in for the ones the recipe names.
    for (k, v) in &mut env {
        if k == "LOCKCTL_REDIS_FILE" {
            *v = s.file.display().to_string();
        }
    }
    let job = s.job("nightly-report");
    let line = jobs[0].replace("/usr/local/bin/nightly-report", job.to_str().unwrap());
    let (a, b) = contend(
        &s,
        &mut shell("/bin/sh", &line, &env, s.dir.path()),
        &mut shell("/bin/sh", &line, &env, s.dir.path()),
    );
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    // The skipped run: exit 75, and nothing at all for cron to mail.
    assert_eq!(code(&b), 75, "{}", stderr(&b));
    assert_eq!((stdout(&b), stderr(&b)), (String::new(), String::new()));
    assert_eq!(s.log(), "start A\nend A\n");
    assert_eq!(s.get("lockctl:nightly-report"), None, "released");
}

#[test]
fn systemd_units_verify_and_their_command_runs() {
    let s = Setup::new();
    let service = example("systemd/nightly-report.service");
    let timer = example("systemd/nightly-report.timer");
    assert!(
        service.lines().any(|l| l == "SuccessExitStatus=75"),
        "{service}"
    );
    assert!(
        timer.contains("Unit=") || timer.contains("[Timer]"),
        "{timer}"
    );
    // systemd-analyze checks that ExecStart= is executable: the binary under test stands in for
    // /usr/bin/lockctl, which is where the package installs it.
    let units = tempfile::tempdir().unwrap();
    let bin = env!("CARGO_BIN_EXE_lockctl");
    std::fs::write(
        units.path().join("nightly-report.service"),
        service.replace("/usr/bin/lockctl", bin),
    )
    .unwrap();
    std::fs::write(units.path().join("nightly-report.timer"), &timer).unwrap();
    let o = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(units.path().join("nightly-report.service"))
        .arg(units.path().join("nightly-report.timer"))
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze is required ({e}); install systemd, or run ./scripts/test")
        });
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "",
        "systemd-analyze found problems in the units"
    );

    // ExecStart= with Environment=, as systemd would run it; 75 when another host holds the lock.
    let mut env = Vec::new();
    let mut exec = String::new();
    for line in service.lines() {
        if let Some(kv) = line.strip_prefix("Environment=") {
            let (k, v) = kv.split_once('=').unwrap();
            let v = if k == "LOCKCTL_REDIS_FILE" {
                s.file.display().to_string()
            } else {
                v.to_string()
            };
            env.push((k.to_string(), v));
        }
        if let Some(cmd) = line.strip_prefix("ExecStart=") {
            exec = cmd.to_string();
        }
    }
    let job = s.job("nightly-report");
    let exec = exec
        .replace("/usr/bin/lockctl", bin)
        .replace("/usr/local/bin/nightly-report", job.to_str().unwrap());
    let (a, b) = contend(
        &s,
        &mut shell("/bin/sh", &exec, &env, s.dir.path()),
        &mut shell("/bin/sh", &exec, &env, s.dir.path()),
    );
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    assert_eq!(code(&b), 75, "{}", stderr(&b));
    assert!(stderr(&b).contains("busy"), "{}", stderr(&b));
    assert_eq!(s.log(), "start A\nend A\n");
}

/// Runs a CI job's shell twice at once: the second waits for the first, then deploys too.
fn ci_job(program: &str, script: &str, env: Vec<(String, String)>, s: &Setup) {
    // The job the recipe runs, ./deploy.sh in the working directory.
    s.job("deploy.sh");
    let (a, b) = contend(
        s,
        &mut shell(program, script, &env, s.dir.path()),
        &mut shell(program, script, &env, s.dir.path()),
    );
    assert_eq!(code(&a), 0, "{}", stderr(&a));
    assert_eq!(code(&b), 0, "{}", stderr(&b));
    assert_eq!(s.log(), "start A\nend A\nstart B\nend B\n");
    // B said whom it waited for, and never showed the password.
    assert!(
        stderr(&b).contains("waiting for lock 'deploy-production'"),
        "{}",
        stderr(&b)
    );
    for o in [&a, &b] {
        let all = format!("{}{}", stdout(o), stderr(o));
        assert!(!all.contains(PASSWORD), "{all}");
    }
    assert_eq!(s.get("lockctl:deploy-production"), None, "released");
}

#[test]
fn github_actions_job_deploys_one_at_a_time() {
    let s = Setup::new();
    let workflow = example("github-actions/deploy.yml");
    let run = yaml_block(&workflow, "run").join("\n");
    assert!(run.contains("lockctl exec deploy-production"), "{run}");
    let mut env = yaml_vars(&workflow, "env");
    assert!(
        env.contains(&("LOCKCTL_TTL".into(), "2m".into())),
        "{env:?}"
    );
    // The secret the workflow reads.
    assert!(workflow.contains("LOCKCTL_REDIS: ${{ secrets.LOCKCTL_REDIS }}"));
    env.push(("LOCKCTL_REDIS".into(), s.url()));
    // GitHub runs `run:` with `bash -e`.
    ci_job("bash", &run, env, &s);
}

#[test]
fn gitlab_ci_job_deploys_one_at_a_time() {
    let s = Setup::new();
    let pipeline = example("gitlab-ci/gitlab-ci.yml");
    let script = yaml_block(&pipeline, "script").join("\n");
    assert!(
        script.contains("lockctl exec deploy-production"),
        "{script}"
    );
    let mut env = yaml_vars(&pipeline, "variables");
    assert!(
        env.contains(&("LOCKCTL_TTL".into(), "2m".into())),
        "{env:?}"
    );
    // The CI/CD variable of type File: GitLab sets it to the path of a file with its value.
    env.push(("LOCKCTL_REDIS_FILE".into(), s.file.display().to_string()));
    ci_job("sh", &script, env, &s);
}

#[test]
fn backup_script_acquires_renews_and_releases() {
    let s = Setup::new();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/backup.sh");
    let src = s.dir.path().join("data");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("table.csv"), "id,value\n1,42\n").unwrap();
    let archive = s.dir.path().join("backup.tar.gz");
    let env = vec![(
        "LOCKCTL_REDIS_FILE".to_string(),
        s.file.display().to_string(),
    )];
    let run_it = |extra: &[(String, String)]| {
        let mut c = shell(
            "/bin/sh",
            "exec sh \"$0\" \"$1\" \"$2\"",
            &[env.clone(), extra.to_vec()].concat(),
            s.dir.path(),
        );
        c.args([script.as_os_str(), src.as_os_str(), archive.as_os_str()]);
        run(&mut c)
    };
    let o = run_it(&[]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let fence = stdout(&o)
        .split("(fence ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|f| f.parse::<u64>().ok());
    assert!(fence.is_some_and(|f| f > 0), "{}", stdout(&o));
    let listed = Command::new("tar")
        .arg("-tzf")
        .arg(&archive)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&listed.stdout).contains("table.csv"));
    assert_eq!(s.get("lockctl:backup"), None, "released on exit");

    // While someone else holds the lock: exit 75 after BACKUP_WAIT, and no archive written.
    std::fs::remove_file(&archive).unwrap();
    let holder = run(lockctl()
        .arg("--redis-file")
        .arg(&s.file)
        .args(["acquire", "backup", "--ttl", "60s"]));
    assert_eq!(code(&holder), 0, "{}", stderr(&holder));
    let o = run_it(&[("BACKUP_WAIT".into(), "300ms".into())]);
    assert_eq!(code(&o), 75, "{}", stderr(&o));
    assert!(!archive.exists());
    assert_eq!(
        s.get("lockctl:backup"),
        Some(stdout(&holder)),
        "the holder's lock is untouched"
    );
}
