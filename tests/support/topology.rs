//! Real topologies for the endpoint tests: a Sentinel group (a master, two replicas, three Sentinels)
//! and a Redis Cluster (three masters, three replicas), all on loopback ports, killed on drop.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::process::Stdio as PipeStdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::{
    code, collect_stderr, eventually, free_port, lockctl, redis_server_bin, replicas_acknowledge,
    run, wait_output, Server,
};

/// lockctl with `LOCKCTL_REDIS` set to `url`.
pub fn lockctl_on_url(url: &str) -> Command {
    let mut c = lockctl();
    c.env("LOCKCTL_REDIS", url);
    c
}

/// A process killed (SIGCONT, then SIGKILL) and reaped on drop.
pub struct Proc {
    pub child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    /// The `requirepass` it was started with.
    pub password: Option<String>,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// A connection to it on its TCP port.
    pub fn conn(&self) -> redis::Connection {
        let auth = self
            .password
            .as_ref()
            .map_or(String::new(), |p| format!(":{p}@"));
        let c = redis::Client::open(format!("redis://{auth}127.0.0.1:{}", self.port))
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(5))
            .expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c
    }

    /// Runs one command on it.
    pub fn cmd<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let mut c = redis::cmd(args[0]);
        for a in &args[1..] {
            c.arg(*a);
        }
        c.query(&mut self.conn())
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Only while it is unreaped (`kill` reaps): its PID is ours until then.
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: kill(2) on our own child, not reaped.
            unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        }
        self.kill();
    }
}

fn ping(port: u16, password: Option<&str>) -> bool {
    let auth = password.map_or(String::new(), |p| format!(":{p}@"));
    redis::Client::open(format!("redis://{auth}127.0.0.1:{port}"))
        .ok()
        .and_then(|c| {
            c.get_connection_with_timeout(Duration::from_millis(500))
                .ok()
        })
        .is_some_and(|mut c| redis::cmd("PING").query::<String>(&mut c).is_ok())
}

/// INFO field `key` of the server on `port`.
pub fn info_field(port: u16, section: &str, key: &str) -> Option<String> {
    let mut c = redis::Client::open(format!("redis://127.0.0.1:{port}"))
        .ok()?
        .get_connection_with_timeout(Duration::from_secs(2))
        .ok()?;
    let info: String = redis::cmd("INFO").arg(section).query(&mut c).ok()?;
    info.lines().find_map(|l| {
        l.strip_prefix(&format!("{key}:"))
            .map(|v| v.trim().to_string())
    })
}

/// A Sentinel-managed master named `mymaster`: one master, two replicas, three Sentinels.
pub struct SentinelGroup {
    pub master: Server,
    pub replicas: Vec<Server>,
    pub sentinels: Vec<Proc>,
}

/// The master name the Sentinels watch.
pub const MASTER_NAME: &str = "mymaster";

impl SentinelGroup {
    /// Starts the group and waits until every Sentinel sees both replicas and the other Sentinels.
    pub fn start() -> SentinelGroup {
        Self::start_with(None)
    }

    /// The group, with Sentinels that require `sentinel_password` (`requirepass`).
    pub fn start_with(sentinel_password: Option<&str>) -> SentinelGroup {
        Self::start_custom(sentinel_password, 2, |port| port)
    }

    /// The group with `n` replicas, each replicating from the port `via` gives for the master's
    /// (a proxy in front of it, to hold its writes back from them).
    pub fn start_custom(
        sentinel_password: Option<&str>,
        n: usize,
        via: impl Fn(u16) -> u16,
    ) -> SentinelGroup {
        let master = Server::start_tcp();
        let mport = master.port.unwrap().to_string();
        let upstream = via(master.port.unwrap()).to_string();
        let replicas: Vec<Server> = (0..n)
            .map(|_| Server::tcp_with_args(&["--replicaof", "127.0.0.1", &upstream]))
            .collect();
        for r in &replicas {
            assert!(
                eventually(Duration::from_secs(90), || info_field(
                    r.port.unwrap(),
                    "replication",
                    "master_link_status"
                )
                .as_deref()
                    == Some("up")),
                "a replica never synced"
            );
        }
        let sentinels: Vec<Proc> = (0..3)
            .map(|_| start_sentinel(&mport, sentinel_password))
            .collect();
        let group = SentinelGroup {
            master,
            replicas,
            sentinels,
        };
        for s in &group.sentinels {
            assert!(
                eventually(Duration::from_secs(90), || {
                    let r: redis::RedisResult<Vec<redis::Value>> =
                        s.cmd(&["SENTINEL", "replicas", MASTER_NAME]);
                    let o: redis::RedisResult<Vec<redis::Value>> =
                        s.cmd(&["SENTINEL", "sentinels", MASTER_NAME]);
                    matches!((r, o), (Ok(r), Ok(o)) if r.len() == n && o.len() == 2)
                }),
                "the Sentinels never saw the whole group"
            );
        }
        group
    }

    /// `redis+sentinel://` for the group.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The port of the master the Sentinels name now.
    pub fn master_port(&self) -> Option<u16> {
        for s in &self.sentinels {
            if let Ok(Some((_, port))) = s.cmd::<Option<(String, u16)>>(&[
                "SENTINEL",
                "get-master-addr-by-name",
                MASTER_NAME,
            ]) {
                return Some(port);
            }
        }
        None
    }

    /// The data server on `port`.
    pub fn server(&mut self, port: u16) -> &mut Server {
        std::iter::once(&mut self.master)
            .chain(self.replicas.iter_mut())
            .find(|s| s.port == Some(port))
            .expect("a server of the group")
    }
}

/// The redis-sentinel binary (Debian's `redis-sentinel` package), or redis-server in Sentinel mode.
fn sentinel_command() -> Command {
    match Command::new("redis-sentinel").arg("--version").output() {
        Ok(o) if o.status.success() => Command::new("redis-sentinel"),
        _ => {
            let mut c = Command::new(redis_server_bin());
            c.arg("--sentinel");
            c
        }
    }
}

fn start_sentinel(master_port: &str, password: Option<&str>) -> Proc {
    let dir = tempfile::Builder::new()
        .prefix("lockctl-sentinel-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let conf: PathBuf = dir.path().join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/sentinel.log\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 5000\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n{auth}",
            dir = dir.path().display(),
            auth = password.map_or(String::new(), |p| format!("requirepass {p}\n"))
        ),
    )
    .unwrap();
    let mut cmd = sentinel_command();
    // Sentinel mode takes the config file first.
    let program = cmd.get_program().to_owned();
    let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
    cmd = Command::new(program);
    cmd.arg(&conf).args(args);
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-sentinel");
    let proc = Proc {
        child,
        port,
        dir,
        password: password.map(String::from),
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ping(port, password) {
        assert!(Instant::now() < deadline, "redis-sentinel did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    proc
}

/// A Redis Cluster of three masters and three replicas on loopback ports.
pub struct Cluster {
    pub nodes: Vec<Proc>,
}

impl Cluster {
    pub fn start() -> Cluster {
        let nodes: Vec<Proc> = (0..6).map(|_| start_cluster_node()).collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("redis-cli --cluster create (apt-get install redis-tools)");
        assert!(
            out.status.success(),
            "cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let c = Cluster { nodes };
        assert!(
            eventually(Duration::from_secs(90), || c.nodes.iter().all(|n| {
                n.cmd::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|i| i.contains("cluster_state:ok"))
            }) && c.replicas_synced()),
            "the cluster never became ok"
        );
        assert!(
            eventually(Duration::from_secs(90), || c.replicas_acknowledge()),
            "a master's replica never acknowledged a write"
        );
        c
    }

    /// Whether every master's replicas acknowledge a write ([`replicas_acknowledge`]), as a grant
    /// needs them to: the links being up is not enough.
    fn replicas_acknowledge(&self) -> bool {
        self.masters().into_iter().all(|m| {
            let need = self
                .nodes
                .iter()
                .filter(|n| {
                    info_field(n.port, "replication", "master_port").as_deref()
                        == Some(&m.to_string())
                })
                .count();
            let Some(key) = (0..1000)
                .map(|k| format!("cluster-ready-{k}"))
                .find(|k| self.owner(k) == m)
            else {
                return false;
            };
            let node = self.nodes.iter().find(|n| n.port == m).expect("a node");
            need > 0 && replicas_acknowledge(&mut node.conn(), &key, need)
        })
    }

    fn replicas_synced(&self) -> bool {
        self.nodes.iter().all(
            |n| match info_field(n.port, "replication", "role").as_deref() {
                Some("slave") => {
                    info_field(n.port, "replication", "master_link_status").as_deref() == Some("up")
                }
                Some("master") => true,
                _ => false,
            },
        )
    }

    /// The port of the master that owns `key`'s slot.
    pub fn owner(&self, key: &str) -> u16 {
        let slot: i64 = self.nodes[0].cmd(&["CLUSTER", "KEYSLOT", key]).unwrap();
        let slots: Vec<redis::Value> = self.nodes[0].cmd(&["CLUSTER", "SLOTS"]).unwrap();
        for range in slots {
            let redis::Value::Array(items) = range else {
                continue;
            };
            let int = |v: &redis::Value| match v {
                redis::Value::Int(i) => *i,
                _ => -1,
            };
            if int(&items[0]) <= slot && slot <= int(&items[1]) {
                if let redis::Value::Array(master) = &items[2] {
                    return int(&master[1]) as u16;
                }
            }
        }
        panic!("no owner for slot {slot}");
    }

    /// The ports of the masters.
    pub fn masters(&self) -> Vec<u16> {
        self.nodes
            .iter()
            .filter(|n| info_field(n.port, "replication", "role").as_deref() == Some("master"))
            .map(|n| n.port)
            .collect()
    }

    /// A master that does not own `key`'s slot.
    pub fn not_owner(&self, key: &str) -> u16 {
        let owner = self.owner(key);
        self.masters()
            .into_iter()
            .find(|p| *p != owner)
            .expect("another master")
    }

    /// The replica of the master on `port`.
    pub fn replica_of(&self, port: u16) -> u16 {
        self.nodes
            .iter()
            .find(|n| {
                info_field(n.port, "replication", "master_port").as_deref()
                    == Some(&port.to_string())
            })
            .map(|n| n.port)
            .expect("a replica")
    }
}

fn start_cluster_node() -> Proc {
    // A free port can be taken by another process between our probe and the server's bind: such a
    // server exits at once, and another port is tried.
    for _ in 0..5 {
        if let Some(p) = try_cluster_node() {
            return p;
        }
    }
    panic!("cluster node did not start (see its redis.log)");
}

fn try_cluster_node() -> Option<Proc> {
    let dir = tempfile::Builder::new()
        .prefix("lockctl-cluster-")
        .tempdir()
        .unwrap();
    let port = free_port();
    let child = Command::new(redis_server_bin())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .arg("--cluster-config-file")
        .arg(dir.path().join("nodes.conf"))
        .args(["--cluster-node-timeout", "2000"])
        .arg("--dir")
        .arg(dir.path())
        .args(["--save", "", "--appendonly", "no"])
        .arg("--logfile")
        .arg(dir.path().join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start redis-server");
    let mut proc = Proc {
        child,
        port,
        dir,
        password: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ping(port, None) {
        if matches!(proc.child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
            proc.kill();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(proc)
}

pub fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A child that logs `WHO start NS` and `WHO end NS` (also when SIGTERM ends it) to `log`.
pub fn logged_child(who: &str, log: &std::path::Path, secs: &str) -> String {
    let log = log.display();
    format!(
        "echo \"{who} start $(date +%s%N)\" >> {log}; \
         trap 'echo \"{who} end $(date +%s%N)\" >> {log}; exit 143' TERM; \
         sleep {secs} & wait $!; echo \"{who} end $(date +%s%N)\" >> {log}"
    )
}

/// Intervals per holder from the log; an interval without an end ends at `fallback_end`.
pub fn intervals(log: &std::path::Path, who: &str, fallback_end: u128) -> Vec<(u128, u128)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = Vec::new();
    let mut open: Option<u128> = None;
    for line in text.lines() {
        let parts: Vec<&str> = line.split_whitespace().collect();
        if parts.len() != 3 || parts[0] != who {
            continue;
        }
        let t: u128 = parts[2].parse().unwrap();
        match parts[1] {
            "start" => open = Some(t),
            _ => {
                if let Some(s) = open.take() {
                    out.push((s, t));
                }
            }
        }
    }
    if let Some(s) = open {
        out.push((s, fallback_end));
    }
    out
}

/// Runs an exec whose child logs its start and end on `url`, makes `failover` happen during it (and
/// waits until `moved` says it did) while a second client keeps trying the same lock, and checks that
/// the second client's children never overlap the first's, that the first holder kept its lease (0)
/// or lost it (76), and that the second client got the lock once the first was done.
pub fn no_two_holders(url: &str, failover: impl FnOnce(), moved: impl Fn() -> bool) {
    let url = url.to_string();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("holders.log");

    // A larger drift allowance than the default (10% of the TTL, 600 ms) leaves the child time to
    // log its end after SIGTERM before the key can expire on the new master, on a loaded machine.
    let mut a = lockctl_on_url(&url)
        .args([
            "-v",
            "--drift-factor",
            "0.1",
            "exec",
            "fo",
            "--ttl",
            "6s",
            "--kill-after",
            "1s",
            "-n",
            "--",
            "sh",
            "-c",
            &logged_child("A", &log, "8"),
        ])
        .stdout(PipeStdio::null())
        .stderr(PipeStdio::piped())
        .spawn()
        .unwrap();
    let a_err = collect_stderr(a.stderr.take().unwrap());
    assert!(
        eventually(Duration::from_secs(20), || std::fs::read_to_string(&log)
            .is_ok_and(|t| t.contains("A start"))),
        "the first holder never started"
    );

    let stop = Arc::new(AtomicBool::new(false));
    let b = {
        let (stop, url, log) = (Arc::clone(&stop), url.clone(), log.clone());
        std::thread::spawn(move || {
            let mut codes = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let o = run(lockctl_on_url(&url).args([
                    "exec",
                    "fo",
                    "-n",
                    "--ttl",
                    "6s",
                    "--",
                    "sh",
                    "-c",
                    &logged_child("B", &log, "0.2"),
                ]));
                codes.push(code(&o));
                std::thread::sleep(Duration::from_millis(100));
            }
            codes
        })
    };

    std::thread::sleep(Duration::from_millis(1500));
    failover();
    assert!(
        eventually(Duration::from_secs(90), moved),
        "no failover happened"
    );

    let a_out = wait_output(a, Duration::from_secs(60));
    let a_ended = now_ns();
    let a_code = code(&a_out);
    let a_log = a_err.join().unwrap();
    // The second client goes on long enough to get the lock once the first is done.
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let b_codes = b.join().unwrap();

    eprintln!("first holder: exit {a_code}; second client's exits: {b_codes:?}");
    assert!(
        a_code == 0 || a_code == 76,
        "the first holder kept its lease or lost it: exit {a_code}\n{a_log}"
    );
    let a_spans = intervals(&log, "A", a_ended);
    let b_spans = intervals(&log, "B", now_ns());
    assert_eq!(a_spans.len(), 1, "{a_spans:?}");
    let (a_start, a_end) = a_spans[0];
    for (b_start, b_end) in &b_spans {
        assert!(
            *b_end < a_start || *b_start > a_end,
            "two holders: A {a_start}..{a_end}, B {b_start}..{b_end}\nA exit {a_code}: {a_log}\n\
             B exits {b_codes:?}"
        );
    }
    assert!(
        b_codes.contains(&75),
        "the second client found the lock held: {b_codes:?}"
    );
    assert!(
        !b_spans.is_empty(),
        "the second client got the lock once the first was done: {b_codes:?}\n{a_log}"
    );
}
