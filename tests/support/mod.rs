//! Test support: real `redis-server` processes and the real `lockctl` binary.
//!
//! Each [`Server`] is a redis-server of its own, in a temporary directory, listening on a unix socket
//! (or a free loopback port), killed when dropped. Tests fail, never skip, when redis-server is missing.
//! [`lockctl`] builds a command for the binary under test with a clean `LOCKCTL_*` environment.
#![allow(dead_code)]

pub mod acl;
pub mod hammer;
pub mod holder;
pub mod proxy;
pub mod queue;
pub mod stopped;
pub mod tagged;
pub mod tls;
pub mod topology;
pub mod watchers;

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The redis-server binary, or a failing test that says how to get it.
pub fn redis_server_bin() -> String {
    let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    match Command::new(&bin).arg("--version").output() {
        Ok(o) if o.status.success() => bin,
        _ => panic!(
            "redis-server is required by the tests and was not found ({bin}); \
             install it (apt-get install redis-server) or run ./scripts/test, which does"
        ),
    }
}

/// A real redis-server, killed on drop.
pub struct Server {
    child: Option<Child>,
    /// The running server's, for signals: `running()` may have reaped it already.
    pidfd: Option<PidFd>,
    dir: tempfile::TempDir,
    pub port: Option<u16>,
    extra: Vec<String>,
    /// Another binary than `REDIS_SERVER` ([`Server::of_binary`]).
    bin: Option<String>,
}

impl Server {
    /// A server on a unix socket, no persistence.
    pub fn start() -> Server {
        Self::build(None, &[])
    }

    /// A server on a unix socket with extra arguments (`["--maxmemory-policy", "allkeys-lru"]`).
    pub fn with_args(extra: &[&str]) -> Server {
        Self::build(None, extra)
    }

    /// A server on a free loopback TCP port.
    pub fn start_tcp() -> Server {
        Self::build(Some(free_port()), &[])
    }

    /// A server on the given loopback TCP port (one a client was already pointed at).
    pub fn tcp_on(port: u16) -> Server {
        Self::build(Some(port), &[])
    }

    /// A server tried first on `port` (a port a test holds, to see the server move), then on free
    /// ones.
    pub fn tcp_tried_on(port: u16) -> Server {
        Self::build(Some(port), &[])
    }

    /// A server on a free loopback TCP port with extra arguments.
    pub fn tcp_with_args(extra: &[&str]) -> Server {
        Self::build(Some(free_port()), extra)
    }

    /// A TCP master whose full sync to a new replica starts only 20 s after the replica asks
    /// (diskless, delayed): a master made its replica with `REPLICAOF` keeps its own data, the
    /// lock keys among them, for that long. The demotion scenes of the replication reviews.
    pub fn slow_to_sync() -> Server {
        Self::tcp_with_args(&[
            "--repl-diskless-sync",
            "yes",
            "--repl-diskless-sync-delay",
            "20",
        ])
    }

    fn build(port: Option<u16>, extra: &[&str]) -> Server {
        let dir = tempfile::Builder::new()
            .prefix("lockctl-redis-")
            .tempdir()
            .unwrap();
        let mut s = Server {
            child: None,
            pidfd: None,
            dir,
            port,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            bin: None,
        };
        s.first_launch();
        s
    }

    /// The first start. A port [`free_port`] chose may be taken by another test process's pick
    /// between the choice and the server's bind; such a server exits at once ("Address already in
    /// use"), and is started on another port: no client knows the first one yet. A restart keeps
    /// its port ([`Server::launch`]), since clients already point at it.
    fn first_launch(&mut self) {
        for _ in 0..5 {
            match self.try_launch() {
                Ok(()) => return,
                Err(log) if self.port.is_some() && log.contains("Address already in use") => {
                    self.port = Some(free_port())
                }
                Err(log) => self.not_started(&log),
            }
        }
        self.launch();
    }

    /// The socket path.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("redis.sock")
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The URL lockctl should use.
    pub fn url(&self) -> String {
        match self.port {
            Some(p) => format!("redis://127.0.0.1:{p}"),
            None => format!("unix://{}", self.socket().display()),
        }
    }

    /// The server's pid.
    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("server running").id() as i32
    }

    fn launch(&mut self) {
        if let Err(log) = self.try_launch() {
            self.not_started(&log)
        }
    }

    /// Fails the test with the end of the server's log, which says why it did not start.
    fn not_started(&self, log: &str) -> ! {
        let lines: Vec<&str> = log.lines().collect();
        panic!(
            "redis-server did not start; the end of its output and {}:\n{}",
            self.dir.path().join("redis.log").display(),
            lines[lines.len().saturating_sub(10)..].join("\n")
        )
    }

    /// Starts the server and waits until it answers; `Err` with its log when it exited first or
    /// did not answer within 20 s.
    fn try_launch(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(self.socket());
        let bin = self.bin.clone().unwrap_or_else(redis_server_bin);
        let mut cmd = Command::new(bin);
        cmd.arg("--port")
            .arg(self.port.unwrap_or(0).to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--unixsocket")
            .arg(self.socket())
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"))
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            // A bad directive is told here, before the log file is open.
            .stderr(std::fs::File::create(self.dir.path().join("stderr")).unwrap());
        let child = cmd.spawn().expect("start redis-server");
        self.pidfd = Some(PidFd::of(&child));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(mut c) = self.try_conn() {
                if redis::cmd("PING").query::<String>(&mut c).is_ok() {
                    return Ok(());
                }
            }
            // How it ended, if it did (a signal shows here, not in its log).
            let ended = match self.child.as_mut().map(|c| c.try_wait()) {
                Some(Ok(Some(status))) => Some(format!("it exited: {status}\n")),
                Some(Ok(None)) => None,
                other => Some(format!("its state could not be read: {other:?}\n")),
            };
            if ended.is_some() || Instant::now() >= deadline {
                self.kill();
                let read = |f: &str| std::fs::read_to_string(self.dir.path().join(f));
                let stderr = read("stderr").unwrap_or_default();
                let how = ended.unwrap_or_else(|| "no PING answered within 20 s\n".into());
                // Last, so that the test's message (the last lines) shows it.
                return Err(stderr + &read("redis.log").unwrap_or_default() + &how);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn try_conn(&self) -> redis::RedisResult<redis::Connection> {
        let url = format!("unix://{}", self.socket().display());
        let client = redis::Client::open(url)?;
        // A connect with a timeout fails with EINTR when a signal interrupts it, or when this test
        // process is stopped and continued (signal(7)); it happened once, in a side-by-side CI run
        // (properties.rs), from a source not found. The server is there: try again.
        // The timeout also bounds the connection's hello (`CLIENT SETINFO`): a server with
        // `--appendfsync always` on a slow disk answered it later than 2 s once in CI (EAGAIN,
        // renew_record_review.rs), so it is as long as a command's read timeout.
        let mut tries = 0;
        let c = loop {
            match client.get_connection_with_timeout(Duration::from_secs(10)) {
                Err(e) if tries < 5 && e.to_string().contains("Interrupted system call") => {
                    tries += 1
                }
                other => break other?,
            }
        };
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        Ok(c)
    }

    /// A direct connection for inspecting and tampering with keys.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn().expect("connect to test redis-server")
    }

    /// Runs one command on the server. Its read cut by a stop and continue of this test process
    /// (EINTR, as in `try_conn`; seen again in a CI run, stopcont_review.rs on Valkey 8, source not
    /// found) is sent again on a new connection: the commands tests send are reads, or writes that
    /// leave the same state when sent twice.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        let mut tries = 0;
        loop {
            match c.query(&mut self.conn()) {
                Err(e) if tries < 5 && e.to_string().contains("Interrupted system call") => {
                    tries += 1
                }
                other => return other.expect("redis command"),
            }
        }
    }

    /// The keys on the server, sorted, without the records releases leave for a few seconds
    /// (`...\x1frelease\x1f<token>`, see `release.lua`): what a test compares is the lock's state, and
    /// a record only answers the same release sent again. `tests/unavailable.rs` looks at them.
    pub fn keys(&self) -> Vec<String> {
        let mut k: Vec<String> = self.cmd(&["KEYS", "*"]);
        k.retain(|k| !is_release_record(k));
        k.sort();
        k
    }

    /// The lock key's value (the holder's token), if any.
    pub fn get(&self, key: &str) -> Option<String> {
        self.cmd(&["GET", key])
    }

    /// The server's clock (`TIME`) in microseconds: where a new fencing counter starts.
    pub fn clock_us(&self) -> u64 {
        let t: Vec<u64> = self.cmd(&["TIME"]);
        t[0] * 1_000_000 + t[1]
    }

    /// Sends a signal to the server process.
    pub fn signal(&self, sig: i32) {
        self.pidfd.as_ref().expect("server running").signal(sig);
    }

    /// SIGSTOP: the server stops answering but keeps its sockets.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// SIGCONT.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// kill -9 and reap.
    pub fn kill(&mut self) {
        self.pidfd = None;
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// kill -9, then start again on the same socket/port with no data.
    pub fn restart_empty(&mut self) {
        self.kill();
        self.launch();
    }

    /// kill -9, then start again on the same socket/port and directory: a server with an AOF loads
    /// it, as a real one does after a crash.
    pub fn restart_in_place(&mut self) {
        self.kill();
        self.launch();
    }

    /// True while the process runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A stopped server must be continued to die promptly.
        if let Some(p) = &self.pidfd {
            p.signal(libc::SIGCONT);
        }
        self.kill();
    }
}

/// The `--version` banner of a server binary (`Redis server v=7.0.15 sha=...`), or a failing test.
pub fn server_banner(bin: &str) -> String {
    let o = Command::new(bin)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("run {bin} --version: {e}"));
    assert!(o.status.success(), "{bin} --version failed: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The family and version a banner names: `("redis", "7.0.15")`, `("valkey", "8.1.8")`.
pub fn server_family_version(banner: &str) -> (String, String) {
    let family = banner
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_lowercase();
    let version = banner
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no v= in the server banner {banner:?}"));
    (family, version.to_string())
}

/// The major version of the redis-server under test (Valkey counts its own: 8 for Valkey 8).
pub fn server_major_version() -> u32 {
    let (_, version) = server_family_version(&server_banner(&redis_server_bin()));
    version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("unparsable server version {version:?}"))
}

impl Server {
    /// The server's uptime in whole seconds, as it reports it (`uptime_in_seconds` is floor(now) -
    /// floor(start), so it can read a second high: lockctl's quarantine counts only `uptime - 1`).
    pub fn uptime(&self) -> u64 {
        let info: String = self.cmd(&["INFO", "server"]);
        info.lines()
            .find_map(|l| l.strip_prefix("uptime_in_seconds:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("uptime_in_seconds in INFO server")
    }

    /// A server on a unix socket that runs DEBUG (POPULATE, SLEEP). Redis 7 refuses DEBUG unless
    /// started with `--enable-debug-command yes`, an option that older servers reject at start-up.
    pub fn with_debug_command() -> Server {
        if server_major_version() >= 7 {
            Self::with_args(&["--enable-debug-command", "yes"])
        } else {
            Self::start()
        }
    }

    /// `DEBUG POPULATE count [prefix]` (a server from [`Server::with_debug_command`]). Filling
    /// hundreds of thousands of keys takes seconds on a busy machine, long enough for the read to
    /// end in EINTR or the harness's read timeout (a socket read with a timeout is not restarted after
    /// the process is stopped and resumed, signal(7)). POPULATE skips the keys that exist, so an I/O
    /// failure is retried on a new connection.
    pub fn populate(&self, count: usize, prefix: Option<&str>) {
        for attempt in 1..=5 {
            let mut cmd = redis::cmd("DEBUG");
            cmd.arg("POPULATE").arg(count).arg(prefix);
            match cmd.query::<()>(&mut self.conn()) {
                Ok(()) => return,
                Err(e) if e.is_io_error() && attempt < 5 => {
                    eprintln!("test support: DEBUG POPULATE {count}: {e}; sending it again")
                }
                Err(e) => panic!("DEBUG POPULATE {count}: {e}"),
            }
        }
    }

    /// A server of another binary than `REDIS_SERVER` (an older or other family's redis-server), on
    /// a unix socket, with extra arguments.
    pub fn of_binary(bin: &str, extra: &[&str]) -> Server {
        server_banner(bin);
        let dir = tempfile::Builder::new()
            .prefix("lockctl-redis-")
            .tempdir()
            .unwrap();
        let mut s = Server {
            child: None,
            pidfd: None,
            dir,
            port: None,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            bin: Some(bin.to_string()),
        };
        s.first_launch();
        s
    }
}

/// The URLs of `servers` as one LOCKCTL_REDIS value.
pub fn urls_of(servers: &[Server]) -> String {
    servers
        .iter()
        .map(Server::url)
        .collect::<Vec<_>>()
        .join(",")
}

/// Several independent servers, for Redlock.
pub struct Servers(pub Vec<Server>);

impl Servers {
    pub fn start(n: usize) -> Servers {
        Servers((0..n).map(|_| Server::start()).collect())
    }

    /// The URLs as one LOCKCTL_REDIS value.
    pub fn urls(&self) -> String {
        urls_of(&self.0)
    }

    /// Waits until every server votes under a quarantine of `secs` seconds (uptime - 1 s >= secs),
    /// so that a grant wins all of them: servers started one after the other may pass their uptime
    /// steps a second apart, and a grant from the others leaves the last one without a key.
    pub fn wait_out_quarantine(&self, secs: u64) {
        assert!(
            eventually(Duration::from_secs(secs + 10), || self
                .0
                .iter()
                .all(|s| s.uptime() > secs)),
            "the servers never passed a quarantine of {secs} s"
        );
    }

    /// A lockctl command pointed at all servers.
    pub fn lockctl(&self) -> Command {
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", self.urls());
        c
    }

    /// A lockctl command pointed at all servers but those at `missing`, whose places in the list
    /// name a socket where nothing listens: a call that misses them, as a node that is down would,
    /// and leaves them as they are. (A node stopped during the call does not miss it: what lockctl
    /// sent runs there when it resumes.)
    pub fn lockctl_missing(&self, missing: &[usize]) -> Command {
        let urls: Vec<String> = self
            .0
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if missing.contains(&i) {
                    format!("unix://{}", s.dir().join("nobody.sock").display())
                } else {
                    s.url()
                }
            })
            .collect();
        let mut c = lockctl();
        c.env("LOCKCTL_REDIS", urls.join(","));
        c
    }
}

impl std::ops::Index<usize> for Servers {
    type Output = Server;
    fn index(&self, i: usize) -> &Server {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for Servers {
    fn index_mut(&mut self, i: usize) -> &mut Server {
        &mut self.0[i]
    }
}

/// A free loopback port (bound and released; redis-server takes it right after).
/// A loopback TCP port nothing listens on: for a server a test starts, or an address that must
/// refuse. It is drawn below the kernel's ephemeral range (`ip_local_port_range`), with its cluster
/// bus port (+10000) below it too. A port `bind(0)` hands out is in that range, and once released any
/// outgoing connection of the suite (thousands, three test files at once) may take it before the
/// server meant for it binds; a server did not start once in CI that way, by the look of it (its log
/// was not kept; [`Server::launch`] now prints it). Below the range only another test process's
/// pick can take it: picks are random, and [`Server`] starts again on another port then.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static DRAWS: AtomicU64 = AtomicU64::new(0);
    const LOW: u64 = 10_000;
    const BUS: u64 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(32_768);
    let span = ephemeral.saturating_sub(LOW + BUS);
    if span < 1000 {
        // A machine whose ephemeral range starts low: the kernel's own choice.
        return TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
    }
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64;
    let seed = clock ^ (u64::from(std::process::id()) << 32);
    for _ in 0..1000 {
        let draw = DRAWS.fetch_add(1, Ordering::Relaxed);
        // splitmix64 of the seed and the draw: uniform over the span, apart across processes.
        let mut x = seed.wrapping_add(draw.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^= x >> 31;
        let port = (LOW + x % span) as u16;
        let free = |p: u16| TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + BUS as u16) {
            return port;
        }
    }
    panic!("no free loopback port below {ephemeral} after 1000 draws")
}

/// The binary under test, with no inherited `LOCKCTL_*` and restart quarantine off (the servers in
/// these tests are seconds old; quarantine tests set it explicitly).
/// Fails the test unless `tool` runs (`tool ARG`, e.g. `--version`): a test never passes by skipping
/// what it needs. `./scripts/test` installs every tool a test runs.
pub fn need_tool(tool: &str, arg: &str) {
    let ran = Command::new(tool)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        ran.is_ok(),
        "this test needs {tool} ({ran:?}): install it (./scripts/test does)"
    );
}

/// Slot `i`'s key of lock `name` under the default prefix (slot 1 is the lock key).
/// True for the record a release leaves for a few seconds (see [`Server::keys`]).
pub fn is_release_record(key: &str) -> bool {
    key.contains("\u{1f}release\u{1f}")
}

pub fn slot_key(name: &str, i: usize) -> String {
    if i == 1 {
        format!("lockctl:{name}")
    } else {
        format!("{{lockctl:{name}}}\u{1f}slot\u{1f}{i}")
    }
}

/// Every key on the server with its value (strings) or type, sorted: a snapshot to compare.
pub fn snapshot(s: &Server) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = s
        .keys()
        .into_iter()
        .map(|k| {
            let kind: String = s.cmd(&["TYPE", &k]);
            let v = match kind.as_str() {
                "string" => s.get(&k).unwrap_or_default(),
                "hash" => {
                    let mut fields: Vec<String> = s.cmd(&["HGETALL", &k]);
                    fields.sort();
                    fields.join(",")
                }
                "zset" => {
                    let members: Vec<String> = s.cmd(&["ZRANGE", &k, "0", "-1"]);
                    members.join(",")
                }
                other => other.to_string(),
            };
            (k, v)
        })
        .collect();
    out.sort();
    out
}

pub fn lockctl() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_lockctl"));
    for (k, _) in std::env::vars() {
        if k.starts_with("LOCKCTL_") {
            c.env_remove(k);
        }
    }
    c.env("LOCKCTL_QUARANTINE", "0").stdin(Stdio::null());
    c
}

/// [`lockctl`] with the restart quarantine on (its default, the TTL), for scenes that restart or
/// replace servers under a holder.
pub fn quarantined() -> Command {
    let mut c = lockctl();
    c.env_remove("LOCKCTL_QUARANTINE");
    c
}

/// A lockctl command pointed at one server.
pub fn lockctl_on(server: &Server) -> Command {
    let mut c = lockctl();
    c.env("LOCKCTL_REDIS", server.url());
    c
}

/// Runs a command to completion, with a generous bound so a hang fails the test instead of CI.
pub fn run(cmd: &mut Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    wait_output(child, Duration::from_secs(60))
}

/// A pidfd of a child, opened while the child is ours and unreaped: a signal through it reaches
/// that process or nothing, never a later process that got its PID after the reap (by
/// `try_wait`, `wait`, or a timeout racing the child's exit). Kernels before 5.3 have no pidfd:
/// the signal then goes by PID.
pub struct PidFd {
    fd: Option<OwnedFd>,
    pid: i32,
}

impl PidFd {
    /// Of `child`, which must not have been reaped yet.
    pub fn of(child: &Child) -> PidFd {
        let pid = child.id() as i32;
        // SAFETY: pidfd_open(2) on our own child, not reaped yet.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) } as i32;
        // SAFETY: a descriptor just opened, owned by nothing else.
        let fd = (raw >= 0).then(|| unsafe { OwnedFd::from_raw_fd(raw) });
        PidFd { fd, pid }
    }

    pub fn signal(&self, sig: i32) {
        match &self.fd {
            // SAFETY: pidfd_send_signal(2) on a live descriptor; no siginfo.
            Some(fd) => unsafe {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    fd.as_raw_fd(),
                    sig,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
            },
            // SAFETY: kill(2) on the child's PID (kernels before 5.3 only).
            None => unsafe {
                libc::kill(self.pid, sig);
            },
        }
    }
}

/// Waits for a child's output, killing it after `limit`. The kill goes through a pidfd opened
/// while the child is ours and unreaped: by PID, a timeout that fires just after the child was
/// reaped (its exit right at `limit`) would signal whatever process has the number by then.
pub fn wait_output(child: Child, limit: Duration) -> Output {
    let pid = child.id() as i32;
    let pidfd = PidFd::of(&child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        if rx.recv_timeout(limit).is_err() {
            pidfd.signal(libc::SIGKILL);
            eprintln!("test support: killed pid {pid} after {limit:?}");
        }
    });
    let out = child.wait_with_output().expect("wait for child");
    let _ = tx.send(());
    out
}

/// stdout as a trimmed string.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// stderr as a string.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit code (panics on death by signal).
pub fn code(o: &Output) -> i32 {
    o.status
        .code()
        .unwrap_or_else(|| panic!("killed by a signal: {o:?}"))
}

/// Acquires `name` with the given extra args and returns its JSON grant.
pub fn acquire_json(cmd: &mut Command, name: &str, extra: &[&str]) -> serde_json::Value {
    let o = run(cmd.args(["acquire", name, "--format", "json"]).args(extra));
    assert_eq!(code(&o), 0, "acquire failed: {}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("acquire --format json prints JSON")
}

/// Reads lines from a child's stdout until one contains `needle`; returns the reader for more.
pub fn wait_for_line(out: ChildStdout, needle: &str, limit: Duration) -> BufReader<ChildStdout> {
    let mut reader = BufReader::new(out);
    let deadline = Instant::now() + limit;
    let mut line = String::new();
    loop {
        line.clear();
        let n = reader.read_line(&mut line).expect("read child stdout");
        assert!(n > 0, "child closed stdout before printing {needle:?}");
        if line.contains(needle) {
            return reader;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} line within {limit:?}"
        );
    }
}

/// The lines `err` has written so far, kept up to date by a thread (joined once `err` closes), for
/// a test that watches a running process's messages as they come.
pub fn stderr_so_far(
    err: ChildStderr,
) -> (
    std::sync::Arc<std::sync::Mutex<String>>,
    std::thread::JoinHandle<()>,
) {
    let seen = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let kept = seen.clone();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            let mut s = kept.lock().unwrap();
            s.push_str(&line);
            s.push('\n');
        }
    });
    (seen, reader)
}

/// Collects a child's stderr on a thread; join to get it.
pub fn collect_stderr(err: ChildStderr) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut BufReader::new(err), &mut s);
        s
    })
}

/// Sends `sig` to `pid`.
pub fn kill(pid: i32, sig: i32) {
    // SAFETY: kill(2) with a pid from a process the test started.
    unsafe { libc::kill(pid, sig) };
}

/// True while `pid` exists (zombies count as gone).
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// Whether `need` replicas acknowledge a write on the master behind `conn` (`WAIT`, a second per
/// try); the written `key` is deleted again. What a grant needs of a new replica, and more than its
/// `master_link_status:up` or its master's `state=online` say: after a diskless full sync, a replica
/// whose first `REPLCONF ACK` reaches the master before the master's RDB child has exited (late on a
/// loaded machine) gets the replication stream only with its next periodic ACK, up to a second
/// later, and a grant in that second is refused at the default 500 ms node timeout.
pub fn replicas_acknowledge(conn: &mut redis::Connection, key: &str, need: usize) -> bool {
    redis::cmd("SET")
        .arg(key)
        .arg("1")
        .query::<()>(conn)
        .is_ok()
        && redis::cmd("DEL").arg(key).query::<i64>(conn).is_ok()
        && redis::cmd("WAIT")
            .arg(need)
            .arg(1000)
            .query::<i64>(conn)
            .is_ok_and(|n| n >= need as i64)
}

/// Waits until `cond` holds, checking every few milliseconds, up to `limit`.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    cond()
}

/// Runs `cmd`, a waiting `acquire --verbose`, until its trace says it sleeps for at least 300 ms
/// before its next attempt, then `during` (a change to the lock, made while the waiter sleeps);
/// returns the waiter's output, its stderr whole. The sleep bounds nothing: it only places the
/// change between two attempts, where a wake-up can be told from a retry.
pub fn change_during_a_sleep(cmd: &mut Command, during: impl FnOnce()) -> Output {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn lockctl");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let started = Instant::now();
    loop {
        let mut line = String::new();
        let n = err.read_line(&mut line).expect("read lockctl's stderr");
        assert!(n > 0, "the waiter exited before sleeping: {seen}");
        seen.push_str(&line);
        let ms = line
            .split("waiting up to ")
            .nth(1)
            .and_then(|rest| rest.split(" ms").next())
            .and_then(|ms| ms.parse::<f64>().ok());
        if ms.is_some_and(|ms| ms >= 300.0) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no sleep of 300 ms or more: {seen}"
        );
    }
    during();
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let mut out = wait_output(child, Duration::from_secs(60));
    seen.push_str(&rest.join().unwrap());
    out.stderr = seen.into_bytes();
    out
}

/// Collects `child`'s piped stderr line by line, on a thread of its own, as the child writes it:
/// for tests that watch a running lockctl's `-v` trace. The lines so far, and the reader (joined
/// once the child has exited, it has every line).
pub fn stderr_lines(
    child: &mut Child,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    std::thread::JoinHandle<()>,
) {
    let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = std::sync::Arc::clone(&lines);
    let err = child.stderr.take().expect("stderr piped");
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { return };
            sink.lock().unwrap().push(line);
        }
    });
    (lines, reader)
}

// ---- Replication -------------------------------------------------------------------------------

/// The replicas in sync, as `master` lists them (`slaveN:...state=online...`).
pub fn online_replicas(master: &Server) -> usize {
    let info: String = master.cmd(&["INFO", "replication"]);
    info.lines()
        .filter(|l| l.starts_with("slave") && l.contains("state=online"))
        .count()
}

/// `n` new replicas of `master` (TCP), once it lists them in sync and they acknowledge a write:
/// a replica listed online may still be loading its copy, and a grant's `WAIT` would go
/// unanswered.
pub fn replicas_in_sync(master: &Server, n: usize) -> Vec<Server> {
    let port = master.port.expect("a TCP master").to_string();
    let before = online_replicas(master);
    let replicas: Vec<Server> = (0..n)
        .map(|_| Server::tcp_with_args(&["--replicaof", "127.0.0.1", &port]))
        .collect();
    let mut conn = master.conn();
    assert!(
        eventually(Duration::from_secs(90), || online_replicas(master)
            == before + n
            && replicas_acknowledge(&mut conn, "probe", before + n)),
        "the replicas did not come online: {}",
        master.cmd::<String>(&["INFO", "replication"])
    );
    replicas
}

/// `master_replid` of `server`'s `INFO replication`.
pub fn replid(server: &Server) -> String {
    replication_field(server, "master_replid")
}

/// How many times the server has run `cmd` (lower case, as `INFO commandstats` names it).
pub fn commandstat_calls(s: &Server, cmd: &str) -> u64 {
    let info: String = s.cmd(&["INFO", "commandstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
        .and_then(|v| v.split(',').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A field of the server's `INFO replication` ("" when it has none).
pub fn replication_field(server: &Server, field: &str) -> String {
    let info: String = server.cmd(&["INFO", "replication"]);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or("")
        .trim()
        .to_string()
}

/// A loopback port where nothing listens: a `REPLICAOF` to it keeps the server's own data (no
/// sync ever starts).
pub fn nowhere() -> String {
    free_port().to_string()
}
