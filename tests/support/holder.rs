//! A running `lockctl exec -v`, watched through its stderr line by line as lockctl writes it
//! (`acquired '…'`, `renewed '…'`, `renewal failed`, `lease on … lost`). The replication reviews
//! count the renewals after a chosen line, so that no assertion depends on the machine's speed.
//! Each test file builds its own command (URL, quarantine, `-n` or `-w`) and hands it here.

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{code, eventually, lockctl, stderr_lines, wait_output, PidFd};

pub struct Holder {
    child: Child,
    /// Its stderr so far, one entry a line.
    pub lines: Arc<Mutex<Vec<String>>>,
    reader: JoinHandle<()>,
}

impl Holder {
    /// Starts `cmd` (a lockctl command), its stdout dropped and its stderr read line by line.
    pub fn spawn(cmd: &mut Command) -> Holder {
        let mut child = cmd
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lockctl");
        let (lines, reader) = stderr_lines(&mut child);
        Holder {
            child,
            lines,
            reader,
        }
    }

    /// `lockctl -r URL exec NAME --ttl TTL -v EXTRA.. -- sleep SECS` (the restart quarantine off:
    /// see [`lockctl`]), not waiting for its grant.
    pub fn exec(url: &str, name: &str, ttl: &str, extra: &[&str], secs: &str) -> Holder {
        Holder::spawn(
            lockctl()
                .args(["-r", url, "exec", name, "--ttl", ttl, "-v"])
                .args(extra)
                .args(["--", "sleep", secs]),
        )
    }

    /// Waits until it reports its grant of `name` (30 s at most; the test fails otherwise).
    pub fn granted(&self, name: &str) {
        assert!(
            eventually(Duration::from_secs(30), || self
                .count(&format!("acquired '{name}'"))
                >= 1),
            "no grant: {:#?}",
            self.lines.lock().unwrap()
        );
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// The lines so far.
    pub fn len(&self) -> usize {
        self.lines.lock().unwrap().len()
    }

    /// The lines containing `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.count_from(0, needle)
    }

    /// The lines containing `needle` from line `from` on.
    pub fn count_from(&self, from: usize, needle: &str) -> usize {
        self.lines.lock().unwrap()[from..]
            .iter()
            .filter(|l| l.contains(needle))
            .count()
    }

    /// Waits for lockctl's own end (120 s at most, then it is killed); its exit code and stderr.
    pub fn finish(self) -> (i32, Vec<String>) {
        let o = wait_output(self.child, Duration::from_secs(120));
        self.reader.join().unwrap();
        let lines = self.lines.lock().unwrap().clone();
        (code(&o), lines)
    }

    /// SIGTERM, then [`Holder::finish`].
    pub fn stop(self) -> (i32, Vec<String>) {
        PidFd::of(&self.child).signal(libc::SIGTERM);
        self.finish()
    }
}

/// lockctl's words for a lease lost to a node demoted since the grant.
pub fn demotion_named(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| l.contains("became a replica of another master"))
}
