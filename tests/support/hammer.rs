//! Stops of a real lockctl (SIGSTOP) while it waits in a socket read: a read with a timeout then
//! fails with EINTR when lockctl continues, and the command goes again on a new connection. Here are
//! the stop itself, the hammer that stops many lockctl processes over and over, a lockctl traced (`-v`) for such tests, the scripts cached beforehand, and a
//! proxy that holds a reply back so that lockctl waits in its read for as long as a test wants.
//!
//! Each test file passes its own bound on a hung lockctl (`bound`).

use std::io::Read;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{
    code, eventually, kill, lockctl_on, queue, run, stderr, stderr_so_far, stdout, wait_output,
    Server, Servers,
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

/// Stops every process it attacks, all at once, for 1 to `max_stop_ms` ms, continues them, and
/// again after 1 to 5 ms, until it is finished. A process leaves the set before it is reaped, so
/// its pid is never signalled after it could be reused.
pub struct Hammer {
    pids: Arc<Mutex<Vec<i32>>>,
    over: Arc<AtomicBool>,
    stops: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Hammer {
    pub fn start(max_stop_ms: u64) -> Hammer {
        Hammer::with_long_stops(max_stop_ms, 0, 0)
    }

    /// As [`Hammer::start`], but one stop in `every` (at random; 0: none) lasts `long_ms`.
    pub fn with_long_stops(max_stop_ms: u64, every: u64, long_ms: u64) -> Hammer {
        let pids: Arc<Mutex<Vec<i32>>> = Arc::default();
        let over: Arc<AtomicBool> = Arc::default();
        let stops: Arc<AtomicU64> = Arc::default();
        let (p, o, s) = (pids.clone(), over.clone(), stops.clone());
        let thread = std::thread::spawn(move || {
            let mut rng = fastrand::Rng::new();
            while !o.load(Ordering::Relaxed) {
                {
                    let pids = p.lock().unwrap();
                    if !pids.is_empty() {
                        for &pid in pids.iter() {
                            kill(pid, libc::SIGSTOP);
                        }
                        let ms = if every > 0 && rng.u64(0..every) == 0 {
                            long_ms
                        } else {
                            rng.u64(1..=max_stop_ms)
                        };
                        std::thread::sleep(Duration::from_millis(ms));
                        for &pid in pids.iter() {
                            kill(pid, libc::SIGCONT);
                        }
                        s.fetch_add(1, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(rng.u64(1..=5)));
            }
        });
        Hammer {
            pids,
            over,
            stops,
            thread: Some(thread),
        }
    }

    /// Spawns `cmd` under attack.
    pub fn spawn(&self, cmd: &mut Command) -> Attacked {
        let child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn lockctl");
        self.pids.lock().unwrap().push(child.id() as i32);
        Attacked {
            child,
            pids: Some(self.pids.clone()),
        }
    }

    /// Puts a running child under attack.
    pub fn adopt(&self, child: Child) -> Attacked {
        self.pids.lock().unwrap().push(child.id() as i32);
        Attacked {
            child,
            pids: Some(self.pids.clone()),
        }
    }

    /// Stops hammering; the number of stops it made.
    pub fn finish(mut self) -> u64 {
        self.over.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.stops.load(Ordering::Relaxed)
    }
}

impl Drop for Hammer {
    fn drop(&mut self) {
        self.over.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A process under attack.
pub struct Attacked {
    child: Child,
    pids: Option<Arc<Mutex<Vec<i32>>>>,
}

impl Attacked {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `sig` to the process after `after`, unless it has exited by then (checked under the
    /// set's lock, which the process leaves before it is reaped).
    pub fn signal_after(&self, after: Duration, sig: i32) {
        let (pid, pids) = (self.pid(), self.pids.clone());
        std::thread::spawn(move || {
            std::thread::sleep(after);
            if let Some(pids) = pids {
                let held = pids.lock().unwrap();
                if held.contains(&pid) {
                    kill(pid, sig);
                }
            }
        });
    }

    /// Waits for the process to exit (killed after `limit`), takes it out of the attacked set before
    /// reaping it, and returns its output.
    pub fn output(mut self, limit: Duration) -> Output {
        let pid = self.pid();
        let read = |r: Option<Box<dyn Read + Send>>| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                v
            })
        };
        let out = read(self.child.stdout.take().map(|o| Box::new(o) as _));
        let err = read(self.child.stderr.take().map(|e| Box::new(e) as _));
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let watchdog = std::thread::spawn(move || {
            if rx.recv_timeout(limit).is_err() {
                kill(pid, libc::SIGCONT);
                kill(pid, libc::SIGKILL);
                eprintln!("test: killed pid {pid} after {limit:?}");
            }
        });
        // Exited, not yet reaped: the pid stays ours until `wait`.
        // SAFETY: waitid(2) on our own child, with a zeroed siginfo for it to fill.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            );
        }
        if let Some(pids) = &self.pids {
            pids.lock().unwrap().retain(|&p| p != pid);
        }
        let status = self.child.wait().expect("reap lockctl");
        let _ = tx.send(());
        watchdog.join().unwrap();
        Output {
            status,
            stdout: out.join().unwrap(),
            stderr: err.join().unwrap(),
        }
    }
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

    /// With `s` paused before lockctl was started (lockctl's read of it waits; paused only once
    /// lockctl runs, a loaded machine may let it have its answer first): stops lockctl in that
    /// read, resumes `s` (it runs the first send), runs `during` while lockctl is still stopped,
    /// then continues lockctl.
    pub fn cut_once(&self, s: &Server, during: impl FnOnce()) {
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

/// Runs `cmd` (traced, on three servers, its call to the third still awaited when the other two
/// have answered: the third is paused first) and cuts its read of the third's answer once
/// ([`Traced::cut_once`]), `during` running while lockctl is stopped.
pub fn cut_on_the_third(
    servers: &Servers,
    cmd: &mut Command,
    bound: std::time::Duration,
    during: impl FnOnce(),
) -> Traced {
    let (a, b, c) = (&servers[0], &servers[1], &servers[2]);
    c.pause();
    let traced = Traced::spawn(cmd, bound);
    traced.wait_for(&format!("{}: acquire in", a.url()), 1);
    traced.wait_for(&format!("{}: acquire in", b.url()), 1);
    traced.cut_once(c, during);
    traced
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
