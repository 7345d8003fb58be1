//! Stops of a real lockctl (SIGSTOP) while it waits in a socket read: a read with a timeout then
//! fails with EINTR when lockctl continues, and the command goes again on a new connection. Here are
//! the stop itself, a lockctl traced (`-v`) for such tests, the scripts cached beforehand, and a
//! proxy that holds a reply back so that lockctl waits in its read for as long as a test wants.
//!
//! Each test file passes its own bound on a hung lockctl (`bound`).

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{
    code, eventually, kill, lockctl_on, queue, run, stderr, stderr_so_far, stdout, wait_output,
    Server,
};

/// True when a thread of `pid` is blocked reading a socket (a node's reply). The thread named
/// `signals` always is (signal-hook's self-pipe is a socket pair), and does not count.
pub fn reading_a_socket(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().any(|t| {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim() == "signals" {
            return false;
        }
        let call = std::fs::read_to_string(t.path().join("syscall")).unwrap_or_default();
        let mut f = call.split_whitespace();
        let nr: i64 = f.next().and_then(|n| n.parse().ok()).unwrap_or(-1);
        let fd = f
            .next()
            .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
        (nr == libc::SYS_read || nr == libc::SYS_recvfrom)
            && fd.is_some_and(|fd| {
                std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
                    .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"))
            })
    })
}

/// True once `pid` is stopped (state T).
pub fn stopped(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('T'))
        })
        .unwrap_or(false)
}

/// Stops `pid` once it waits in a socket read: the read then fails with EINTR when it continues.
pub fn stop_in_a_read(pid: i32, bound: Duration) {
    assert!(
        eventually(bound, || reading_a_socket(pid)),
        "lockctl never waited for a reply"
    );
    kill(pid, libc::SIGSTOP);
    assert!(eventually(bound, || stopped(pid)), "lockctl did not stop");
}

/// A lockctl the test signals itself, its trace (`-v`) read as it comes. Dropped unfinished (a
/// test that failed), it is continued and killed, so that no stopped lockctl outlives the test.
pub struct Traced {
    child: Option<Child>,
    trace: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
    bound: Duration,
}

impl Traced {
    /// Spawns `cmd`; `bound` limits every wait on it.
    pub fn spawn(cmd: &mut Command, bound: Duration) -> Traced {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lockctl");
        let (trace, reader) = stderr_so_far(child.stderr.take().unwrap());
        Traced {
            child: Some(child),
            trace,
            reader: Some(reader),
            bound,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn count(&self, needle: &str) -> usize {
        self.trace.lock().unwrap().matches(needle).count()
    }

    pub fn trace(&self) -> String {
        self.trace.lock().unwrap().clone()
    }

    /// Waits until the trace holds `needle` `n` times.
    pub fn wait_for(&self, needle: &str, n: usize) {
        assert!(
            eventually(self.bound, || self.count(needle) >= n),
            "no {n}x {needle:?} in: {}",
            self.trace.lock().unwrap()
        );
    }

    /// Stops lockctl in its read and continues it, `times` times, each in the read of a new
    /// connection (the one it opened to send the command again); `during` runs while it is stopped
    /// the last time.
    pub fn interrupt(&self, times: usize, during: impl FnOnce()) {
        let pid = self.pid();
        for i in 0..times {
            // The i-th connection (the first, then one per resend) is the one waited on.
            self.wait_for("connected in", i + 1);
            stop_in_a_read(pid, self.bound);
            if i + 1 == times {
                break;
            }
            kill(pid, libc::SIGCONT);
            self.wait_for("reconnecting", i + 1);
        }
        during();
        kill(pid, libc::SIGCONT);
    }

    /// Pauses `s` (lockctl's next read waits), stops lockctl in that read, resumes `s` (it runs the
    /// first send), runs `during` while lockctl is still stopped, then continues lockctl.
    pub fn cut_once(&self, s: &Server, during: impl FnOnce()) {
        s.pause();
        stop_in_a_read(self.pid(), self.bound);
        s.resume();
        during();
        kill(self.pid(), libc::SIGCONT);
    }

    /// Exit code, stdout and the whole trace.
    pub fn finish(mut self) -> (i32, String, String) {
        let o = wait_output(self.child.take().expect("running"), self.bound);
        if let Some(r) = self.reader.take() {
            r.join().unwrap();
        }
        let trace = self.trace.lock().unwrap().clone();
        (code(&o), stdout(&o), trace)
    }
}

impl Drop for Traced {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let pid = c.id() as i32;
            kill(pid, libc::SIGCONT);
            kill(pid, libc::SIGKILL);
            let _ = c.wait();
        }
    }
}

/// Runs a grant, a renewal and a release on `s`, which caches their scripts there: a first send
/// is then an EVALSHA that runs, not one answered NOSCRIPT (whose reply a cut read never sees, so
/// that the script never runs at all).
pub fn warm(s: &Server) {
    let token = queue::hold(&mut lockctl_on(s), "warm");
    for args in [["renew", "warm"], ["release", "warm"]] {
        let o = run(lockctl_on(s).args(args).args(["--token", &token]));
        assert_eq!(code(&o), 0, "{}", stderr(&o));
    }
}

/// As [`warm`], and the break script too (a break that finds no lock).
pub fn warm_with_break(s: &Server) {
    warm(s);
    let o = run(lockctl_on(s).args(["break", "warm", "--yes"]));
    assert_eq!(code(&o), 1, "{}", stderr(&o));
}

/// A proxy in front of `upstream` that withholds the server's bytes on the first connection whose
/// client bytes so far satisfy `hold`, from then on (what the client sent still goes on, and runs).
/// Every other connection passes everything.
pub fn holding_proxy(upstream: u16, hold: fn(&[u8]) -> bool) -> u16 {
    use std::io::Write;
    use std::net::{TcpListener, TcpStream};
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let taken = Arc::new(AtomicBool::new(false));
    std::thread::spawn(move || {
        for client in listener.incoming() {
            let Ok(client) = client else { return };
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                continue;
            };
            let held = Arc::new(AtomicBool::new(false));
            let (mine, taken) = (Arc::clone(&held), Arc::clone(&taken));
            let (mut c_in, mut s_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            std::thread::spawn(move || {
                let mut seen = Vec::new();
                let mut buf = [0u8; 16384];
                while let Ok(n @ 1..) = c_in.read(&mut buf) {
                    seen.extend_from_slice(&buf[..n]);
                    // Set before the bytes go on to the server, hence before its reply comes.
                    if !mine.load(Ordering::SeqCst)
                        && hold(&seen)
                        && !taken.swap(true, Ordering::SeqCst)
                    {
                        mine.store(true, Ordering::SeqCst);
                    }
                    if s_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
            std::thread::spawn(move || {
                let (mut s_in, mut c_out) = (server, client);
                let mut buf = [0u8; 16384];
                while let Ok(n @ 1..) = s_in.read(&mut buf) {
                    if !held.load(Ordering::SeqCst) && c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            });
        }
    });
    port
}

/// True once `seen`, a client's bytes, hold two scripts (`EVAL`, `EVALSHA`).
pub fn two_scripts(seen: &[u8]) -> bool {
    let sent = seen
        .windows(13)
        .filter(|w| *w == b"$7\r\nEVALSHA\r\n")
        .count()
        + seen.windows(10).filter(|w| *w == b"$4\r\nEVAL\r\n").count();
    sent >= 2
}
