//! `doctor`: checks every node against the known ways a Redis lock fails.
//!
//! Each node is probed in parallel with read-only commands (PING, TIME, INFO, ROLE, CONFIG GET), every
//! one bounded by the node timeout, and each hazard becomes one finding: `ok`, `warn` or `fail`, what
//! was found and what to do. `fail` is for setups that break locks outright (a replica, an
//! `allkeys-*` eviction policy that can evict the fencing counter, an unreachable node, two URLs that
//! reach one server, a server older than the supported minimum); `warn` for the ones that can lose a
//! lock in a failure (asynchronous replication, `volatile-*` eviction, persistence that loses recent
//! writes, a recent restart, a skewed clock, an even node count). Managed services often rename or
//! refuse CONFIG: the affected checks then say "could not check" (a warning: an unknown hazard is not
//! an absent one) and the rest go on.
//!
//! Fences: a fencing counter lost with a node's data starts again from the server's clock in
//! microseconds (see `lock/mod.rs`), which is above every fence handed out before as long as the
//! server's clock does not step back across the restart and no counter ran ahead of the clock (more
//! than one grant per microsecond, or a counter raised to another node's fence by a Redlock grant
//! while that node's clock was ahead). The `fences` check looks for counters ahead of the clock in a
//! bounded sample of the locks under the prefix; the `clock` check compares the server's clock with
//! this host's.
//!
//! Clock offset: the node's TIME is compared with the midpoint of this host's wall clock before and
//! after the call, so the measurement error is at most half the round trip. lockctl itself times
//! leases on the monotonic clock, so an offset alone breaks nothing, but Redis expires keys by its own
//! wall clock: a server clock that jumps expires locks early. NTP keeps hosts within tens of
//! milliseconds, so an offset beyond [`CLOCK_WARN`] (after subtracting the measurement error) means at
//! least one of the two clocks is not disciplined and may be stepped later.

mod permissions;
mod topology;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Value;
use serde_json::{json, Value as Json};

use super::{int, pairs, server_ms, text};
use crate::cli::{DoctorArgs, ReportFormat};
use crate::config::Settings;
use crate::exit::Exit;
use crate::lock::node::Node;
use crate::lock::{keys, quorum, Engine};
use crate::output::human_ms;

/// Clock offset above which a node's clock is reported: far beyond NTP's error, far below a lease.
pub const CLOCK_WARN: Duration = Duration::from_secs(1);

/// The oldest Redis lockctl supports: 6.2 brought the ACL channel rules (`&pattern`, `resetchannels`)
/// of the minimal ACL in docs/security.md, and is the oldest release the test suite runs on.
const MIN_REDIS: (u32, u32) = (6, 2);
const MIN_REDIS_TEXT: &str = "Redis 6.2";
/// Valkey began as Redis 7.2.4, so every Valkey release qualifies.
const MIN_VALKEY: (u32, u32) = (7, 2);
const MIN_VALKEY_TEXT: &str = "Valkey 7.2";

/// The CONFIG parameters the checks read.
const CONFIG_KEYS: [&str; 5] = [
    "maxmemory-policy",
    "appendonly",
    "appendfsync",
    "no-appendfsync-on-rewrite",
    "save",
];

/// SCAN calls of the `fences` check per node, each over [`SCAN_COUNT`] keys: a bounded sample.
const FENCE_SCANS: usize = 10;
/// Keys asked of each SCAN call.
const SCAN_COUNT: usize = 1000;
/// Most fencing counters compared with the clock per node.
const FENCE_SAMPLE: usize = 1000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    fn as_str(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One line of the report.
struct Finding {
    /// The node's redacted URL; `None` for findings about the whole setup.
    node: Option<String>,
    check: &'static str,
    level: Level,
    found: String,
    advice: Option<String>,
}

/// What one node told us.
#[derive(Default)]
struct Probe {
    node: String,
    unreachable: Option<String>,
    rtt: Duration,
    /// Node clock minus this host's clock, and the measurement's error bound, in ms.
    clock: Option<(i64, i64)>,
    info: Option<HashMap<String, String>>,
    info_error: Option<String>,
    /// `(role, replicas)` from ROLE, or from INFO when ROLE is refused.
    role: Option<(String, usize, String)>,
    config: HashMap<&'static str, Result<String, String>>,
    /// The node answered but refuses (credentials, ACL, a replica, renamed commands).
    refused: bool,
    /// The scripts and commands lockctl needs, run on a scratch lock.
    permissions: Option<permissions::Check>,
    /// Fencing counters sampled under the prefix, or why they could not be read.
    fences: Option<Result<FenceSample, String>>,
}

/// The fencing counters of one node compared with its clock.
#[derive(Default)]
struct FenceSample {
    /// Counters compared.
    sampled: usize,
    /// The whole keyspace was scanned (not just a sample).
    complete: bool,
    /// Lock keys whose counter is ahead of the server's clock, with how far ahead in microseconds.
    ahead: Vec<(String, u128)>,
}

impl Probe {
    fn info(&self, key: &str) -> Option<&str> {
        self.info.as_ref()?.get(key).map(String::as_str)
    }

    fn config(&self, key: &str) -> Result<&str, String> {
        match self.config.get(key) {
            Some(Ok(v)) => Ok(v),
            Some(Err(e)) => Err(e.clone()),
            None => Err("not read".into()),
        }
    }
}

pub fn run(settings: &Settings, args: &DoctorArgs) -> anyhow::Result<Exit> {
    let mut engine = Engine::new(settings)?;
    let n = engine.nodes().len();
    let quorum = engine.quorum();
    let prefix = engine.prefix().to_string();
    let probes = quorum::all(engine.nodes_mut(), |_, node| {
        node.accept_replica();
        probe(node, &prefix)
    });
    let reachable = probes
        .iter()
        .filter(|p| p.unreachable.is_none() || p.refused)
        .count();

    let mut findings = setup_findings(settings, args.ttl, &probes, quorum);
    let shards = topology::survey(engine.nodes_mut(), &probes);
    findings.extend(topology::findings(&shards));
    for p in &probes {
        findings.extend(node_findings(p, settings, args.ttl));
    }
    // Every master of a cluster, each checked like a node of its own.
    let mut shard_probes = Vec::new();
    for shard in shards {
        for mut master in shard.masters {
            let p = probe(&mut master, &prefix);
            findings.extend(node_findings(&p, settings, args.ttl));
            shard_probes.push(p);
        }
    }
    let mut probes = probes;
    probes.extend(shard_probes);
    let failures = findings.iter().filter(|f| f.level == Level::Fail).count();
    let warnings = findings.iter().filter(|f| f.level == Level::Warn).count();
    let exit = if reachable < quorum {
        Exit::Unavailable
    } else if failures > 0 {
        Exit::Failure
    } else {
        Exit::Success
    };
    match args.format {
        ReportFormat::Plain => {
            crate::output::emit(&format!(
                "{}{failures} failure(s), {warnings} warning(s); {reachable} of {n} node(s) \
                 reachable, quorum {quorum}\n",
                plain(&findings, &probes)
            ))?;
        }
        ReportFormat::Json => {
            let doc = json!({
                "ok": failures == 0 && reachable >= quorum,
                "exit_code": exit.code(),
                "nodes": n,
                "quorum": quorum,
                "reachable": reachable,
                "ttl_ms": args.ttl.as_millis() as u64,
                "node_timeout_ms": settings.node_timeout.as_millis() as u64,
                "failures": failures,
                "warnings": warnings,
                "findings": findings.iter().map(finding_json).collect::<Vec<_>>(),
                "servers": probes
                    .iter()
                    .map(|p| server_json(p, settings.quarantine.unwrap_or(args.ttl)))
                    .collect::<Vec<_>>(),
            });
            crate::output::emit(&format!("{doc}\n"))?;
        }
    }
    if exit == Exit::Unavailable {
        crate::complain!(
            "Redis unavailable: {reachable} of {n} node(s) answered, a quorum needs {quorum}"
        );
    }
    Ok(exit)
}

/// Probes one node; every command is bounded by the node timeout.
fn probe(node: &mut Node, prefix: &str) -> Probe {
    let mut p = Probe {
        node: node.display.clone(),
        rtt: Duration::MAX,
        ..Probe::default()
    };
    // The best of three round trips: the first may include connecting, the others show the network.
    for _ in 0..3 {
        let ping = node.call("PING", |c| {
            let t = Instant::now();
            redis::cmd("PING").query::<Value>(c).map(|_| t.elapsed())
        });
        match ping {
            Ok(d) => p.rtt = p.rtt.min(d),
            Err(f) => {
                p.refused = node.refused();
                p.unreachable = Some(f.reason);
                return p;
            }
        }
    }
    p.clock = node
        .call("TIME", |c| {
            let before = unix_ms();
            let v: Value = redis::cmd("TIME").query(c)?;
            let after = unix_ms();
            Ok(server_ms(&v).map(|s| (s - (before + after) / 2, (after - before) / 2 + 1)))
        })
        .ok()
        .flatten();
    // A node that stops answering mid-probe costs one node timeout, not one per remaining check:
    // what was not asked is reported as "could not check".
    if node.is_stale() {
        return p;
    }
    match node.call("INFO", |c| redis::cmd("INFO").query::<Value>(c)) {
        Ok(v) => p.info = text(&v).map(|t| parse_info(&t)),
        Err(f) => p.info_error = Some(f.reason),
    }
    if node.is_stale() {
        return p;
    }
    p.role = node
        .call("ROLE", |c| redis::cmd("ROLE").query::<Value>(c))
        .ok()
        .and_then(|v| parse_role(&v))
        .or_else(|| {
            let role = p.info("role")?.to_string();
            let replicas = p
                .info("connected_slaves")
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            let master = match (p.info("master_host"), p.info("master_port")) {
                (Some(h), Some(port)) => format!("{h}:{port}"),
                _ => String::new(),
            };
            Some((role, replicas, master))
        });
    // ROLE lists only replicas in sync; INFO counts the ones still syncing too.
    let syncing = p.info("connected_slaves").and_then(|s| s.parse().ok());
    if let (Some((_, replicas, _)), Some(syncing)) = (p.role.as_mut(), syncing) {
        *replicas = (*replicas).max(syncing);
    }
    for key in CONFIG_KEYS {
        let r = node
            .call("CONFIG GET", |c| {
                redis::cmd("CONFIG").arg("GET").arg(key).query::<Value>(c)
            })
            .map_err(|f| f.reason)
            .and_then(|v| {
                pairs(&v)
                    .into_iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v)
                    .ok_or_else(|| format!("the server does not know {key}"))
            });
        p.config.insert(key, r);
        if node.is_stale() {
            break;
        }
    }
    if !node.is_stale() {
        p.permissions = Some(permissions::check(node, prefix));
        p.fences = Some(sample_fences(node, prefix));
    }
    p
}

/// Compares a bounded sample of the fencing counters under `prefix` with the server's clock.
fn sample_fences(node: &mut Node, prefix: &str) -> Result<FenceSample, String> {
    let mut counters: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    let mut cursor = 0u64;
    let mut complete = false;
    // The permissions check's own scratch lock is not one of the user's.
    let scratch = format!("{prefix}{}", permissions::SCRATCH);
    for _ in 0..FENCE_SCANS {
        let (next, keys): (u64, Vec<Vec<u8>>) = node
            .call("SCAN", |c| {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(format!("*{}fence", keys::AUX_SEPARATOR))
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .arg("TYPE")
                    .arg("string")
                    .query(c)
            })
            .map_err(|f| f.reason)?;
        for k in keys {
            let lock = keys::lock_key_of_counter(&k)
                .filter(|l| l.starts_with(prefix.as_bytes()) && *l != scratch.as_bytes())
                .map(<[u8]>::to_vec);
            if let Some(lock) = lock {
                counters.push((lock, k));
            }
        }
        cursor = next;
        if cursor == 0 {
            complete = true;
            break;
        }
        if counters.len() >= FENCE_SAMPLE {
            break;
        }
    }
    counters.truncate(FENCE_SAMPLE);
    // One pipelined round trip: GET each counter (one key per command, so it works on Cluster),
    // then TIME, read after every counter so that no counter can be newer than the clock reading.
    let replies: Vec<Value> = node
        .call("GET", |c| {
            let mut pipe = redis::pipe();
            for (_, k) in &counters {
                pipe.cmd("GET").arg(k);
            }
            pipe.cmd("TIME");
            c.send_packed_command(&pipe.get_packed_pipeline())?;
            (0..=counters.len()).map(|_| c.recv_response()).collect()
        })
        .map_err(|f| f.reason)?;
    let now = match replies.last() {
        Some(Value::Array(t)) => match (t.first().and_then(int), t.get(1).and_then(int)) {
            (Some(s), Some(us)) => s as u128 * 1_000_000 + us as u128,
            _ => return Err("TIME gave no clock".into()),
        },
        _ => return Err("TIME gave no clock".into()),
    };
    let mut sample = FenceSample {
        sampled: 0,
        complete,
        ahead: Vec::new(),
    };
    for ((lock, _), v) in counters.iter().zip(&replies) {
        let Some(counter) = text(v).and_then(|t| t.parse::<u128>().ok()) else {
            continue;
        };
        sample.sampled += 1;
        if counter > now {
            sample
                .ahead
                .push((String::from_utf8_lossy(lock).into_owned(), counter - now));
        }
    }
    Ok(sample)
}

fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// The server's family and version from INFO. Valkey says `server_name:valkey` and `valkey_version`,
/// and keeps `redis_version:7.2.4` whatever its release, for clients that compare it.
#[derive(Clone, Copy)]
struct ServerVersion<'a> {
    family: &'static str,
    version: &'a str,
}

impl<'a> ServerVersion<'a> {
    fn of(p: &'a Probe) -> Option<Self> {
        if p.info("server_name") == Some("valkey") || p.info("valkey_version").is_some() {
            let version = p.info("valkey_version")?;
            Some(ServerVersion {
                family: "valkey",
                version,
            })
        } else {
            let version = p.info("redis_version")?;
            Some(ServerVersion {
                family: "redis",
                version,
            })
        }
    }

    fn name(&self) -> String {
        format!("{} {}", self.family, self.version)
    }

    fn minimum(&self) -> &'static str {
        if self.family == "valkey" {
            MIN_VALKEY_TEXT
        } else {
            MIN_REDIS_TEXT
        }
    }

    /// Compares major.minor with the minimum; a version that does not parse counts as older.
    fn supported(&self) -> bool {
        let min = if self.family == "valkey" {
            MIN_VALKEY
        } else {
            MIN_REDIS
        };
        let mut parts = self.version.split('.').map(|n| n.parse::<u32>().ok());
        match (parts.next().flatten(), parts.next().flatten()) {
            (Some(major), Some(minor)) => (major, minor) >= min,
            _ => false,
        }
    }
}

/// `key:value` lines of INFO.
fn parse_info(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// ROLE: `[master, offset, [replicas]]`, `[slave, host, port, state, offset]`, `[sentinel, ...]`.
fn parse_role(v: &Value) -> Option<(String, usize, String)> {
    let Value::Array(items) = v else { return None };
    let role = text(items.first()?)?;
    let replicas = match (role.as_str(), items.get(2)) {
        ("master", Some(Value::Array(r))) => r.len(),
        _ => 0,
    };
    let master = if role == "slave" {
        format!(
            "{}:{}",
            items.get(1).and_then(text).unwrap_or_default(),
            items.get(2).and_then(int).unwrap_or(0)
        )
    } else {
        String::new()
    };
    Some((role, replicas, master))
}

/// Findings about the whole set of nodes.
fn setup_findings(
    settings: &Settings,
    ttl: Duration,
    probes: &[Probe],
    quorum: usize,
) -> Vec<Finding> {
    let n = probes.len();
    let reachable = probes
        .iter()
        .filter(|p| p.unreachable.is_none() || p.refused)
        .count();
    let mut out = Vec::new();
    let mut add = |check, level, found: String, advice: Option<&str>| {
        out.push(Finding {
            node: None,
            check,
            level,
            found,
            advice: advice.map(String::from),
        })
    };
    match n {
        1 => add("nodes", Level::Ok, "single instance (a quorum of one)".into(), None),
        2 => add(
            "nodes",
            Level::Warn,
            "2 nodes: the quorum is 2, so either node failing stops every lock".into(),
            Some("use 3 (or 5) independent masters; an odd count tolerates the most failures"),
        ),
        _ if n % 2 == 0 => add(
            "nodes",
            Level::Warn,
            format!(
                "{n} nodes, an even count: quorum {quorum} tolerates {} failure(s), as {} nodes would",
                n - quorum,
                n - 1
            ),
            Some("use an odd number of independent masters"),
        ),
        _ => add(
            "nodes",
            Level::Ok,
            format!("{n} nodes, quorum {quorum}: tolerates {} failure(s)", n - quorum),
            None,
        ),
    }
    if reachable < quorum {
        add(
            "quorum",
            Level::Fail,
            format!("only {reachable} of {n} node(s) reachable, a quorum needs {quorum}: no lock can be granted"),
            Some("bring the unreachable nodes back or fix their URLs"),
        );
    } else {
        add(
            "quorum",
            Level::Ok,
            format!("{reachable} of {n} node(s) reachable, a quorum needs {quorum}"),
            None,
        );
    }
    match settings.quarantine {
        Some(q) if q.is_zero() => add(
            "quarantine",
            Level::Warn,
            "restart quarantine is off: a node restarted without its data votes at once and can \
             grant a lock that another client still holds"
                .into(),
            Some("leave --quarantine (LOCKCTL_QUARANTINE) unset, or at least the TTL"),
        ),
        Some(q) if q < ttl => add(
            "quarantine",
            Level::Warn,
            format!(
                "--quarantine {} is shorter than the TTL {}: a restarted node may vote while a lease \
                 it forgot is still running",
                humantime::format_duration(q),
                humantime::format_duration(ttl)
            ),
            Some("leave --quarantine unset (it follows the TTL), or at least the TTL"),
        ),
        q => add(
            "quarantine",
            Level::Ok,
            format!(
                "a node up for less than {} ({}) does not vote: by then every lease it may have \
                 forgotten in a restart has ended",
                humantime::format_duration(q.unwrap_or(ttl)),
                if q.is_some() { "--quarantine" } else { "the TTL, the default" }
            ),
            None,
        ),
    }
    if settings.node_timeout * 10 > ttl {
        add(
            "timeout",
            Level::Warn,
            format!(
                "--node-timeout {} is more than a tenth of the TTL {}: a slow node eats the lease's validity",
                humantime::format_duration(settings.node_timeout),
                humantime::format_duration(ttl)
            ),
            Some("lower --node-timeout or raise --ttl"),
        );
    }
    // Two URLs that reach one server make one node count twice toward the quorum.
    let mut seen: HashMap<&str, &str> = HashMap::new();
    for p in probes {
        if let Some(id) = p.info("run_id") {
            if let Some(first) = seen.insert(id, &p.node) {
                add(
                    "independence",
                    Level::Fail,
                    format!("{first} and {} are the same server (run_id {id})", p.node),
                    Some("give each --redis URL a different, independent master"),
                );
            }
        }
    }
    out
}

/// Findings about one node.
fn node_findings(p: &Probe, settings: &Settings, ttl: Duration) -> Vec<Finding> {
    let (node_timeout, quarantine) = (settings.node_timeout, settings.quarantine);
    let mut out = Vec::new();
    let mut add = |check, level, found: String, advice: Option<String>| {
        out.push(Finding {
            node: Some(p.node.clone()),
            check,
            level,
            found,
            advice,
        })
    };
    if let Some(reason) = &p.unreachable {
        if p.refused {
            add(
                "refused",
                Level::Fail,
                format!("answered but refuses: {reason}"),
                Some("fix the setup as the message says; every lock fails until then".into()),
            );
        } else {
            add(
                "reachable",
                Level::Fail,
                format!("unreachable: {reason}"),
                Some(
                    "start the server, fix the URL, or check the network and --node-timeout".into(),
                ),
            );
        }
        return out;
    }
    let server = ServerVersion::of(p);
    add(
        "reachable",
        Level::Ok,
        format!(
            "{}, answered PING",
            server.map_or("unknown server".into(), |s| s.name())
        ),
        None,
    );
    match server {
        Some(s) if s.supported() => add(
            "version",
            Level::Ok,
            format!("{} (supported: {} or later)", s.name(), s.minimum()),
            None,
        ),
        Some(s) => add(
            "version",
            Level::Fail,
            format!(
                "{} is older than {}, the oldest release lockctl supports and tests",
                s.name(),
                s.minimum()
            ),
            Some(format!(
                "upgrade to {} or later (see docs/compatibility.md)",
                s.minimum()
            )),
        ),
        None => add(
            "version",
            Level::Warn,
            format!(
                "could not check: {}",
                p.info_error.as_deref().unwrap_or("no version in INFO")
            ),
            Some(format!(
                "make sure the server is {MIN_REDIS_TEXT} or later, or Valkey"
            )),
        ),
    }

    let rtt_ms = p.rtt.as_secs_f64() * 1000.0;
    if p.rtt * 4 > node_timeout {
        add(
            "latency",
            Level::Warn,
            format!(
                "round trip {rtt_ms:.3} ms is over a quarter of --node-timeout {}",
                humantime::format_duration(node_timeout)
            ),
            Some("raise --node-timeout (keeping it far below the TTL) or use a closer node".into()),
        );
    } else {
        add(
            "latency",
            Level::Ok,
            format!(
                "round trip {rtt_ms:.3} ms, --node-timeout {}",
                humantime::format_duration(node_timeout)
            ),
            None,
        );
    }

    match &p.role {
        Some((role, _, master)) if role == "slave" => add(
            "role",
            Level::Fail,
            format!("a replica of {master}: it refuses writes, or loses them if replica-read-only is off"),
            Some("point --redis at the master, not a replica".into()),
        ),
        Some((role, _, _)) if role == "sentinel" => add(
            "role",
            Level::Fail,
            "a Sentinel, not a data node".into(),
            Some("point --redis at a master, not at Sentinel".into()),
        ),
        Some((_, replicas, _)) if *replicas > 0 => add(
            "replication",
            Level::Warn,
            format!(
                "a master with {replicas} replica(s): replication is asynchronous, so a failover \
                 can promote a replica that never saw a lock"
            ),
            Some(
                "use fencing tokens (LOCKCTL_FENCE) in the storage you protect, or Redlock over \
                 independent masters without failover"
                    .into(),
            ),
        ),
        Some(_) => add("role", Level::Ok, "a master without replicas".into(), None),
        None => add(
            "role",
            Level::Warn,
            format!("could not check: {}", p.info_error.as_deref().unwrap_or("ROLE and INFO refused")),
            Some("make sure this is a master: a replica cannot hold locks".into()),
        ),
    }
    if p.info("cluster_enabled") == Some("1") || p.info("redis_mode") == Some("cluster") {
        add(
            "cluster",
            Level::Warn,
            "Redis Cluster: failover promotes replicas asynchronously and can lose a lock".into(),
            Some("use fencing tokens (LOCKCTL_FENCE) in the storage you protect".into()),
        );
    }

    let (policy, source) = match p.config("maxmemory-policy") {
        Ok(v) => (Ok(v.to_string()), ""),
        Err(e) => match p.info("maxmemory_policy") {
            Some(v) => (Ok(v.to_string()), " (from INFO; CONFIG refused)"),
            None => (Err(e), ""),
        },
    };
    match policy {
        Ok(policy) if policy == "noeviction" => add(
            "eviction",
            Level::Ok,
            format!("maxmemory-policy noeviction{source}"),
            None,
        ),
        Ok(policy) if policy.starts_with("allkeys-") => add(
            "eviction",
            Level::Fail,
            format!(
                "maxmemory-policy {policy}{source}: under memory pressure any key can be evicted, \
                 held locks and fencing counters included"
            ),
            Some("set maxmemory-policy noeviction (CONFIG SET and redis.conf), or a separate instance for locks".into()),
        ),
        Ok(policy) => add(
            "eviction",
            Level::Warn,
            format!(
                "maxmemory-policy {policy}{source}: lock keys carry a TTL, so they are eviction \
                 candidates and a held lock can vanish"
            ),
            Some("set maxmemory-policy noeviction (CONFIG SET and redis.conf)".into()),
        ),
        Err(e) => add(
            "eviction",
            Level::Warn,
            format!("could not check maxmemory-policy: {e}"),
            Some("make sure maxmemory-policy is noeviction".into()),
        ),
    }

    add_persistence(p, &mut add);

    match &p.permissions {
        Some((level, found, advice)) => add("permissions", *level, found.clone(), advice.clone()),
        None => add(
            "permissions",
            Level::Warn,
            "could not check: the node stopped answering".into(),
            None,
        ),
    }

    let quarantine = quarantine.unwrap_or(ttl);
    match p.info("uptime_in_seconds").and_then(|s| s.parse::<u64>().ok()) {
        Some(up) if !crate::lock::quarantine::remaining(quarantine, up).is_zero() => add(
            "uptime",
            Level::Warn,
            format!(
                "started {} ago: in lockctl's restart quarantine (length {}) for another {}, it \
                 does not vote, since it may have forgotten locks it granted before it started",
                humantime::format_duration(Duration::from_secs(up)),
                humantime::format_duration(quarantine),
                human_ms(crate::lock::quarantine::remaining(quarantine, up).as_millis() as i64)
            ),
            Some(format!(
                "wait; {}; a node with appendonly yes, appendfsync always and \
                 no-appendfsync-on-rewrite no votes at once for locks whose fencing counter it kept",
                crate::lock::quarantine::LIFT
            )),
        ),
        Some(up) if Duration::from_secs(up) < ttl => add(
            "uptime",
            Level::Warn,
            format!(
                "started {} ago, less than the TTL {}: if it lost its data, it may have forgotten \
                 locks that are still held, and the quarantine ({}) no longer keeps it from voting",
                humantime::format_duration(Duration::from_secs(up)),
                humantime::format_duration(ttl),
                humantime::format_duration(quarantine)
            ),
            Some("leave --quarantine unset (it follows the TTL), or at least the TTL".into()),
        ),
        Some(up) => add(
            "uptime",
            Level::Ok,
            format!("up for {}", humantime::format_duration(Duration::from_secs(up))),
            None,
        ),
        None => add(
            "uptime",
            Level::Warn,
            format!("could not check: {}", p.info_error.as_deref().unwrap_or("no uptime in INFO")),
            None,
        ),
    }

    match p.clock {
        Some((offset, error)) if offset.abs() - error > CLOCK_WARN.as_millis() as i64 => add(
            "clock",
            Level::Warn,
            format!(
                "node clock is {} {} this host's (±{error} ms); Redis expires keys by its own clock, \
                 so a clock that is off may also jump",
                human_ms(offset.abs()),
                if offset > 0 { "ahead of" } else { "behind" }
            ),
            Some("run NTP (chrony, systemd-timesyncd) on the node and on this host; avoid stepping clocks".into()),
        ),
        Some((offset, error)) => add(
            "clock",
            Level::Ok,
            format!("node clock within {} ms of this host's (±{error} ms)", offset.abs()),
            None,
        ),
        None => add(
            "clock",
            Level::Warn,
            "could not check: TIME failed".into(),
            None,
        ),
    }

    let assumption = "a fencing counter lost with this node's data starts again from its clock, \
                      above every earlier fence while the clock never steps back across a restart \
                      and no counter runs ahead of it";
    match &p.fences {
        Some(Ok(sample)) if !sample.ahead.is_empty() => {
            let (lock, by) = &sample.ahead[0];
            add(
                "fences",
                Level::Warn,
                format!(
                    "{} of {} fencing counter(s) sampled are ahead of the server's clock (lock '{}' \
                     by {}): if this node lost its data now, the next fences could repeat earlier \
                     ones; {assumption}",
                    sample.ahead.len(),
                    sample.sampled,
                    lock,
                    human_ms((by / 1000) as i64)
                ),
                Some(
                    "keep the nodes' clocks synchronised (NTP) and never step them back; keep \
                     persistence on so counters survive restarts"
                        .into(),
                ),
            )
        }
        Some(Ok(sample)) => add(
            "fences",
            Level::Ok,
            format!(
                "{} fencing counter(s) {}, none ahead of the server's clock; {assumption}",
                sample.sampled,
                if sample.complete {
                    "under the prefix"
                } else {
                    "sampled under the prefix"
                }
            ),
            None,
        ),
        Some(Err(e)) => add(
            "fences",
            Level::Warn,
            format!("could not check the fencing counters: {e}"),
            None,
        ),
        None => add(
            "fences",
            Level::Warn,
            "could not check the fencing counters: the node stopped answering".into(),
            None,
        ),
    }
    out
}

/// Persistence: can a restart lose locks and, worse, fencing counters?
fn add_persistence(p: &Probe, add: &mut impl FnMut(&'static str, Level, String, Option<String>)) {
    let advice = Some(
        "set appendonly yes and appendfsync always so that locks survive a crash (a restart \
         without them ends every lease on the node); the restart quarantine keeps lost locks from \
         being granted twice, and lost fencing counters start again from the server's clock"
            .to_string(),
    );
    let aof = match p.config("appendonly") {
        Ok(v) => v == "yes",
        Err(e) => {
            let aof_info = p.info("aof_enabled").map_or(String::new(), |v| {
                format!(
                    " (INFO says AOF is {})",
                    if v == "1" { "on" } else { "off" }
                )
            });
            add(
                "persistence",
                Level::Warn,
                format!("could not check: {e}{aof_info}"),
                advice,
            );
            return;
        }
    };
    if aof {
        match p.config("appendfsync") {
            Ok("always") => match p.config("no-appendfsync-on-rewrite") {
                Ok("no") => add(
                    "persistence",
                    Level::Ok,
                    "AOF with appendfsync always".into(),
                    None,
                ),
                Ok(_) => add(
                    "persistence",
                    Level::Warn,
                    "AOF with appendfsync always, but no-appendfsync-on-rewrite yes: fsync is \
                     skipped while an AOF rewrite or an RDB save runs, so a crash then loses the \
                     writes of that time (up to about 30 s), the locks granted then included"
                        .into(),
                    Some(
                        "set no-appendfsync-on-rewrite no (CONFIG SET and redis.conf)".into(),
                    ),
                ),
                Err(e) => add(
                    "persistence",
                    Level::Warn,
                    format!(
                        "AOF with appendfsync always, could not check no-appendfsync-on-rewrite: {e}"
                    ),
                    Some("make sure no-appendfsync-on-rewrite is no".into()),
                ),
            },
            Ok(fsync) => {
                add(
                    "persistence",
                    Level::Warn,
                    format!(
                    "AOF with appendfsync {fsync}: a crash loses the last {} of writes, the locks \
                     granted then included",
                    if fsync == "everysec" { "second" } else { "seconds" }
                ),
                    advice,
                )
            }
            Err(e) => add(
                "persistence",
                Level::Warn,
                format!("AOF on, could not check appendfsync: {e}"),
                advice,
            ),
        }
        return;
    }
    match p.config("save") {
        Ok(save) if !save.trim().is_empty() => add(
            "persistence",
            Level::Warn,
            format!("RDB snapshots only (save {save}): a crash loses every write since the last snapshot"),
            advice,
        ),
        Ok(_) => add(
            "persistence",
            Level::Warn,
            "no persistence (no AOF, no RDB snapshots): a restart forgets every lock and ends its lease".into(),
            advice,
        ),
        Err(e) => add(
            "persistence",
            Level::Warn,
            format!("AOF off, could not check RDB snapshots: {e}"),
            advice,
        ),
    }
}

/// The findings about the setup, then each node's under its URL.
fn plain(findings: &[Finding], probes: &[Probe]) -> String {
    let line = |f: &Finding| {
        let mut s = format!("{:<4}  {:<12}  {}", f.level.as_str(), f.check, f.found);
        if let Some(a) = &f.advice {
            s.push_str(" — ");
            s.push_str(a);
        }
        s
    };
    let mut out = String::new();
    for f in findings.iter().filter(|f| f.node.is_none()) {
        out.push_str(&line(f));
        out.push('\n');
    }
    for p in probes {
        out.push_str(&format!("node {}\n", p.node));
        for f in findings
            .iter()
            .filter(|f| f.node.as_deref() == Some(&p.node))
        {
            out.push_str("  ");
            out.push_str(&line(f));
            out.push('\n');
        }
    }
    out
}

fn finding_json(f: &Finding) -> Json {
    json!({
        "node": f.node,
        "check": f.check,
        "level": f.level.as_str(),
        "found": f.found,
        "advice": f.advice,
    })
}

fn server_json(p: &Probe, quarantine: Duration) -> Json {
    let reachable = p.unreachable.is_none();
    let uptime = p
        .info("uptime_in_seconds")
        .and_then(|s| s.parse::<u64>().ok());
    json!({
        "node": p.node,
        "reachable": reachable,
        "error": p.unreachable,
        "family": ServerVersion::of(p).map(|s| s.family),
        "version": ServerVersion::of(p).map(|s| s.version),
        "role": p.role.as_ref().map(|r| r.0.clone()),
        "replicas": p.role.as_ref().map(|r| r.1),
        "uptime_s": uptime,
        "quarantine_remaining_ms": uptime
            .map(|up| crate::lock::quarantine::remaining(quarantine, up).as_millis() as u64),
        "latency_ms": reachable.then_some(p.rtt.as_secs_f64() * 1000.0),
        "clock_offset_ms": p.clock.map(|c| c.0),
        "clock_error_ms": p.clock.map(|c| c.1),
        "maxmemory_policy": p.config("maxmemory-policy").ok().or(p.info("maxmemory_policy")),
        "appendonly": p.config("appendonly").ok(),
        "appendfsync": p.config("appendfsync").ok(),
        "save": p.config("save").ok(),
    })
}
