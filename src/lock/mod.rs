//! The lock engine: one code path over N Redis masters, of which a single instance is the case N = 1.
//!
//! # One attempt
//!
//! Round 1 runs `acquire.lua` on every node in parallel: where the key is free (and the node is not in
//! restart quarantine) it sets `key = token NX PX ttl`, increments the fencing counter and records the
//! holder, atomically, in one round trip. With a quorum (`N/2 + 1`) of wins, the fencing token is
//! `T = max` of the counters returned. For N > 1, round 2 (`fence.lua`) raises the counter to at least
//! `T` on each won node whose counter is below `T`, while the lock there still holds our token; only
//! nodes where the counter is `>= T` under our lock count. Nodes that already returned `T` need no
//! round 2, so in the steady state a grant is one round trip per node.
//!
//! The attempt is timed on the boot-time clock from before the first request to after the last reply:
//! `validity = TTL - elapsed - (TTL * drift + 2ms)`. It succeeds with a quorum and validity > 0. A
//! failed attempt is rolled back (`release.lua`) on every node where it may have left a key: the ones
//! it won and the ones whose answer never came. The nodes that answered "held by someone else" hold
//! nothing of ours, and a lock held by another token is never touched.
//!
//! # Why fencing tokens strictly increase, without consensus
//!
//! Take two grants A then B of the same lock. Each holds a quorum, and two majorities of the same N
//! nodes share at least one node `n`. On `n`, A's hold ended before B's began (the key is set NX, so two
//! holds on one node cannot overlap). While A held `n`, its counter there was raised to at least
//! `T_A` (round 1 or round 2, both under A's token). B's round-1 increment on `n` came after, so it
//! returned more than `T_A`, and `T_B`, a maximum that includes it, is greater than `T_A`. The one
//! assumption: no node loses its counter, i.e. persistence (see `doctor`). A renewal that re-creates a
//! key lost in a restart raises that node's counter to the holder's token for the same reason.
//!
//! # Restart quarantine
//!
//! A node restarted without its data has forgotten the locks it granted. `acquire.lua` reads the node's
//! uptime in the same script (no extra round trip) and refuses to vote while it is below the
//! quarantine (default: the TTL), by which time every lease it could have granted has expired or been
//! renewed elsewhere: Redlock's delayed-restart rule, enforced by the client.

pub mod keys;
pub mod node;
pub mod quorum;
pub mod wait;

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, Value};

use crate::clock::Stamp;
use crate::config::Settings;
use crate::exit::LockError;
use crate::trace;
pub use keys::LockKeys;
use node::{Node, NodeFailure};
pub use wait::{WaitPolicy, Wake, Wakeup};

pub(crate) const ACQUIRE_LUA: &str = include_str!("scripts/acquire.lua");
pub(crate) const FENCE_LUA: &str = include_str!("scripts/fence.lua");
pub(crate) const RELEASE_LUA: &str = include_str!("scripts/release.lua");
pub(crate) const RENEW_LUA: &str = include_str!("scripts/renew.lua");
pub(crate) const STATUS_LUA: &str = include_str!("scripts/status.lua");
pub(crate) const BREAK_LUA: &str = include_str!("scripts/break.lua");

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
static FENCE: LazyLock<Script> = LazyLock::new(|| Script::new(FENCE_LUA));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
pub(crate) static STATUS: LazyLock<Script> = LazyLock::new(|| Script::new(STATUS_LUA));
pub(crate) static BREAK: LazyLock<Script> = LazyLock::new(|| Script::new(BREAK_LUA));

/// The source of one of lockctl's scripts, for an EVAL when its EVALSHA keeps missing.
pub(crate) fn script_source(script: &Script) -> Option<&'static str> {
    [
        (&*ACQUIRE, ACQUIRE_LUA),
        (&*FENCE, FENCE_LUA),
        (&*RELEASE, RELEASE_LUA),
        (&*RENEW, RENEW_LUA),
        (&*STATUS, STATUS_LUA),
        (&*BREAK, BREAK_LUA),
    ]
    .into_iter()
    .find(|(s, _)| s.get_hash() == script.get_hash())
    .map(|(_, source)| source)
}

/// Who holds a lock: stored beside it so that `status`, `list` and waiting clients can say.
#[derive(Debug, Clone)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    pub cmd: String,
}

/// Longest holder command line stored, in bytes.
const MAX_HOLDER_CMD: usize = 1024;

impl Holder {
    /// This host, `pid`, and the command line `cmd`, with the passwords of any URLs in it hidden,
    /// then cut to [`MAX_HOLDER_CMD`] bytes (redacting the whole line first, so the cut never decides
    /// what a URL looks like).
    pub fn new(pid: u32, cmd: &str) -> Holder {
        Holder {
            host: hostname(),
            pid,
            cmd: truncate(crate::config::redact_urls(cmd), MAX_HOLDER_CMD),
        }
    }
}

/// Cuts a string to at most `max` bytes on a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Formats holder fields as shown to people: `host pid 123 (cmd)`.
pub fn describe_holder(host: &str, pid: &str, cmd: &str) -> Option<String> {
    if host.is_empty() && pid.is_empty() {
        return None;
    }
    let mut s = format!("{host} pid {pid}");
    if !cmd.is_empty() {
        s.push_str(&format!(" ({cmd})"));
    }
    Some(s)
}

/// A successful acquisition.
#[derive(Debug, Clone)]
pub struct Grant {
    pub keys: LockKeys,
    /// 128 random bits, 32 lowercase hex digits.
    pub token: String,
    /// The fencing token: strictly increases across grants of this lock.
    pub fence: u64,
    pub ttl: Duration,
    /// How long the lock is certainly ours, counted from `started`.
    pub validity: Duration,
    /// When the attempt that won began (boot-time clock).
    pub started: Stamp,
    /// When its last reply arrived.
    pub finished: Stamp,
    pub nodes: usize,
    pub quorum: usize,
    /// Per node, the server's run id when it granted this lock (empty where it did not): a renewal
    /// that finds the key gone from a node whose run id changed knows the node restarted.
    pub run_ids: Vec<String>,
}

impl Grant {
    /// What a holder's command is told: `LOCKCTL_NAME`, `LOCKCTL_KEY`, `LOCKCTL_TOKEN`, `LOCKCTL_FENCE`.
    pub fn env(&self) -> [(&'static str, String); 4] {
        [
            ("LOCKCTL_NAME", self.keys.name.clone()),
            ("LOCKCTL_KEY", self.keys.key.clone()),
            ("LOCKCTL_TOKEN", self.token.clone()),
            ("LOCKCTL_FENCE", self.fence.to_string()),
        ]
    }
}

/// Why an attempt did not win.
#[derive(Debug, Default)]
struct Refusal {
    /// Nodes that answered at all.
    answered: usize,
    /// The current holder, as one node described it.
    holder: Option<String>,
    /// The shortest time after which a node may change its answer (a holder's TTL, a quarantine).
    retry_in: Option<Duration>,
    quarantined: usize,
    /// The attempt won a quorum but took longer than the TTL allows.
    too_slow: Option<String>,
    failures: Vec<String>,
}

enum Round1 {
    Won(u64, String),
    Busy { pttl: i64, holder: Option<String> },
    Quarantined(u64),
}

/// The engine over a set of nodes.
pub struct Engine {
    nodes: Vec<Node>,
    prefix: String,
    drift_factor: f64,
    quarantine: Option<Duration>,
}

impl Engine {
    /// Builds the engine; nothing connects until the first command.
    pub fn new(settings: &Settings) -> Result<Engine, LockError> {
        let nodes = settings
            .nodes
            .iter()
            .map(|spec| Node::new(spec, &settings.tls, settings.node_timeout))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Engine {
            nodes,
            prefix: settings.prefix.clone(),
            drift_factor: settings.drift_factor,
            quarantine: settings.quarantine,
        })
    }

    /// The keys of lock `name`.
    pub fn keys(&self, name: &str) -> LockKeys {
        LockKeys::new(&self.prefix, name)
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The nodes, for commands that talk to them directly.
    pub fn nodes_mut(&mut self) -> &mut [Node] {
        &mut self.nodes
    }

    /// A majority of the nodes.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.nodes.len())
    }

    /// "Redis unavailable": only `reachable` nodes answered, or too few to decide.
    fn unavailable(&self, reachable: usize, detail: String) -> LockError {
        LockError::Unavailable {
            nodes: self.nodes.len(),
            reachable,
            quorum: self.quorum(),
            detail,
        }
    }

    /// The time a lease may be trusted less than its TTL: `TTL * drift + 2ms`.
    pub fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + Duration::from_millis(2)
    }

    /// Acquires the lock, waiting as `policy` says. Signals arrive through `wake` and end the wait.
    pub fn acquire(
        &mut self,
        keys: &LockKeys,
        ttl: Duration,
        policy: WaitPolicy,
        holder: &Holder,
        wake: &Wakeup,
    ) -> Result<Grant, LockError> {
        let mut waiter = wait::Waiter::new(keys, policy);
        loop {
            if let Some(signal) = wake.pending_signal() {
                waiter.finish();
                return Err(LockError::Interrupted(signal));
            }
            match self.attempt(keys, ttl, holder) {
                Ok(grant) => {
                    waiter.finish();
                    if let Some(signal) = wake.pending_signal() {
                        if let Err(e) = self.release(keys, &grant.token) {
                            crate::complain!(
                                "the lock won as the signal came could not be given back ({e}); \
                                 it expires within {} ms",
                                ttl.as_millis()
                            );
                        }
                        return Err(LockError::Interrupted(signal));
                    }
                    return Ok(grant);
                }
                Err(refusal) if refusal.answered < self.quorum() => {
                    waiter.finish();
                    return Err(self.unavailable(refusal.answered, refusal.failures.join("; ")));
                }
                Err(refusal) => {
                    let holder = refusal.holder.clone().or_else(|| {
                        (refusal.quarantined > 0).then(|| {
                            format!(
                                "nobody known: {} node(s) restarted recently and are in quarantine",
                                refusal.quarantined
                            )
                        })
                    });
                    let shown = holder.clone().or_else(|| {
                        refusal
                            .too_slow
                            .as_ref()
                            .map(|_| "nobody (the nodes answered too slowly)".into())
                    });
                    let verdict =
                        waiter.wait(&self.nodes, shown.as_deref(), refusal.retry_in, wake);
                    match verdict {
                        wait::Verdict::Retry => {}
                        wait::Verdict::GiveUp => {
                            if let (None, Some(slow)) = (&holder, refusal.too_slow) {
                                // Nobody holds it; Redis was too slow to grant it in time.
                                return Err(self.unavailable(refusal.answered, slow));
                            }
                            return Err(LockError::Busy {
                                name: keys.name.clone(),
                                holder,
                            });
                        }
                        wait::Verdict::Signal(signal) => {
                            return Err(LockError::Interrupted(signal))
                        }
                    }
                }
            }
        }
    }

    /// One attempt at the lock, rolled back where it did not win.
    fn attempt(
        &mut self,
        keys: &LockKeys,
        ttl: Duration,
        holder: &Holder,
    ) -> Result<Grant, Refusal> {
        let n = self.nodes.len();
        let quorum = self.quorum();
        let token = new_token();
        let ttl_ms = ttl.as_millis().to_string();
        let quarantine_ms = self.quarantine.unwrap_or(ttl).as_millis().to_string();
        let pid = holder.pid.to_string();
        let key_list = [keys.key.as_str(), keys.fence.as_str(), keys.holder.as_str()];
        let args = [
            token.as_str(),
            ttl_ms.as_str(),
            quarantine_ms.as_str(),
            holder.host.as_str(),
            pid.as_str(),
            holder.cmd.as_str(),
        ];

        let started = Stamp::now();
        let round1 = quorum::all(&mut self.nodes, |_, node| {
            node.eval("acquire", &ACQUIRE, &key_list, &args)
                .and_then(|v| parse_round1(v, &node.display))
        });

        let mut refusal = Refusal::default();
        let mut won: Vec<Option<u64>> = vec![None; n];
        let mut run_ids = vec![String::new(); n];
        let mut maybe_applied = vec![false; n];
        for (i, r) in round1.into_iter().enumerate() {
            match r {
                Ok(Round1::Won(fence, run_id)) => {
                    refusal.answered += 1;
                    won[i] = Some(fence);
                    run_ids[i] = run_id;
                }
                Ok(Round1::Busy { pttl, holder }) => {
                    refusal.answered += 1;
                    if pttl >= 0 {
                        refusal.retry_in =
                            min_opt(refusal.retry_in, Duration::from_millis(pttl as u64));
                    }
                    if refusal.holder.is_none() {
                        refusal.holder = holder;
                    }
                }
                Ok(Round1::Quarantined(ms)) => {
                    refusal.answered += 1;
                    refusal.quarantined += 1;
                    refusal.retry_in = min_opt(refusal.retry_in, Duration::from_millis(ms));
                }
                Err(fail) => {
                    maybe_applied[i] = fail.maybe_applied;
                    refusal.failures.push(fail.reason);
                }
            }
        }

        let mut fence = won.iter().flatten().copied().max().unwrap_or(0);
        if n > 1 && won.iter().flatten().count() >= quorum {
            fence = self.raise_fences(
                keys,
                &token,
                fence,
                &mut won,
                &mut maybe_applied,
                &mut refusal,
            );
        }
        let finished = Stamp::now();
        let elapsed = finished.elapsed_since(started);
        let wins = won.iter().flatten().count();
        let validity = ttl.checked_sub(elapsed + self.drift(ttl));
        trace!(
            "attempt on '{}': {wins}/{n} node(s) won, quorum {quorum}, {:.3} ms, fence {fence}",
            keys.name,
            elapsed.as_secs_f64() * 1000.0
        );
        match validity {
            Some(validity) if wins >= quorum && !validity.is_zero() => Ok(Grant {
                keys: keys.clone(),
                token,
                fence,
                ttl,
                validity,
                started,
                finished,
                nodes: n,
                quorum,
                run_ids: (0..n)
                    .map(|i| {
                        if won[i].is_some() {
                            std::mem::take(&mut run_ids[i])
                        } else {
                            String::new()
                        }
                    })
                    .collect(),
            }),
            _ => {
                let touched: Vec<bool> = (0..n)
                    .map(|i| won[i].is_some() || maybe_applied[i])
                    .collect();
                if touched.iter().any(|&t| t) {
                    self.rollback(keys, &token, &touched);
                }
                if wins >= quorum {
                    refusal.too_slow = Some(format!(
                        "the attempt won a quorum but took {:.1} ms, leaving no validity for a \
                         {} ms TTL; lower --node-timeout or raise --ttl",
                        elapsed.as_secs_f64() * 1000.0,
                        ttl.as_millis()
                    ));
                }
                Err(refusal)
            }
        }
    }

    /// Round 2 of a Redlock grant; returns the fencing token and drops the nodes that failed it.
    fn raise_fences(
        &mut self,
        keys: &LockKeys,
        token: &str,
        fence: u64,
        won: &mut [Option<u64>],
        maybe_applied: &mut [bool],
        refusal: &mut Refusal,
    ) -> u64 {
        let behind: Vec<bool> = won.iter().map(|f| f.is_some_and(|f| f < fence)).collect();
        if !behind.iter().any(|&b| b) {
            return fence;
        }
        let t = fence.to_string();
        let key_list = [keys.key.as_str(), keys.fence.as_str(), keys.holder.as_str()];
        let results = quorum::each(
            &mut self.nodes,
            |i| behind[i],
            |_, node| node.eval("raise fence", &FENCE, &key_list, &[token, &t]),
        );
        for (i, r) in results.into_iter().enumerate() {
            match r {
                None | Some(Ok(Value::Int(1))) => {}
                Some(Ok(_)) => won[i] = None,
                Some(Err(fail)) => {
                    // Our key from round 1 is still there: a failed attempt rolls it back with the
                    // others; a won one leaves it to expire or to the release, like a late reply.
                    won[i] = None;
                    maybe_applied[i] = true;
                    refusal.failures.push(fail.reason);
                }
            }
        }
        fence
    }

    /// Releases our token on the given nodes, in parallel; nodes that owe a reply get it sent blind.
    fn rollback(&mut self, keys: &LockKeys, token: &str, on: &[bool]) {
        let key_list = [keys.key.as_str(), keys.holder.as_str()];
        let args = [token, keys.channel.as_str()];
        quorum::each(
            &mut self.nodes,
            |i| on[i],
            |_, node| {
                if node.is_stale() {
                    node.send_only(RELEASE_LUA, &key_list, &args);
                } else {
                    let _ = node.eval("rollback", &RELEASE, &key_list, &args);
                }
            },
        );
    }

    /// Deletes the lock where it still holds `token`. Ok with the number of nodes released when they
    /// make a quorum.
    pub fn release(&mut self, keys: &LockKeys, token: &str) -> Result<usize, LockError> {
        let key_list = [keys.key.as_str(), keys.holder.as_str()];
        let args = [token, keys.channel.as_str()];
        let results = quorum::all(&mut self.nodes, |_, node| {
            node.eval("release", &RELEASE, &key_list, &args)
        });
        let (released, answered, failures) = tally(results);
        self.verdict(keys, released, answered, failures, "release")
            .map(|_| released)
    }

    /// Extends the lease where `token` still holds the lock. Returns the new validity.
    ///
    /// `recreate`, for a holder that knows its grant, lets a node that lost the key in a restart since
    /// the grant get it back, with its fencing counter raised to the grant's token.
    pub fn renew(
        &mut self,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
        recreate: Option<(&Grant, &Holder)>,
    ) -> Result<Duration, LockError> {
        let ttl_ms = ttl.as_millis().to_string();
        let (fence, host, pid, cmd) = match recreate {
            Some((grant, holder)) => (
                grant.fence.to_string(),
                holder.host.clone(),
                holder.pid.to_string(),
                holder.cmd.clone(),
            ),
            None => ("0".into(), String::new(), String::new(), String::new()),
        };
        let key_list = [keys.key.as_str(), keys.fence.as_str(), keys.holder.as_str()];
        let started = Stamp::now();
        let results = quorum::all(&mut self.nodes, |i, node| {
            let granted_by =
                recreate.map_or("", |(g, _)| g.run_ids.get(i).map_or("", |r| r.as_str()));
            let args = [token, &ttl_ms, &fence, granted_by, &host, &pid, &cmd];
            node.eval("renew", &RENEW, &key_list, &args)
        });
        let elapsed = started.elapsed();
        let (renewed, answered, failures) = tally(results);
        self.verdict(keys, renewed, answered, failures, "renew")?;
        match ttl.checked_sub(elapsed + self.drift(ttl)) {
            Some(v) if !v.is_zero() => Ok(v),
            _ => Err(LockError::Lost {
                name: keys.name.clone(),
                detail: format!(
                    "the renewal took {:.1} ms, leaving no validity",
                    elapsed.as_secs_f64() * 1000.0
                ),
            }),
        }
    }

    fn verdict(
        &self,
        keys: &LockKeys,
        held: usize,
        answered: usize,
        failures: Vec<String>,
        what: &str,
    ) -> Result<(), LockError> {
        let quorum = self.quorum();
        trace!(
            "{what} '{}': {held}/{} node(s) held our token",
            keys.name,
            self.nodes.len()
        );
        let unanswered = self.nodes.len() - answered;
        if held >= quorum {
            Ok(())
        } else if answered < quorum {
            Err(self.unavailable(answered, failures.join("; ")))
        } else if held + unanswered >= quorum {
            // Nodes that did not answer may still hold our token: nothing says the lease is lost,
            // only that this call could not confirm it (a renewal is retried until its deadline).
            Err(self.unavailable(
                answered,
                format!(
                    "our token is on {held} of them and the {unanswered} that did not answer \
                     decide; {}",
                    failures.join("; ")
                ),
            ))
        } else {
            let mut detail = "it expired, was broken, or was taken by another holder".to_string();
            if self.nodes.len() > 1 {
                detail = format!(
                    "held on {held} of {} node(s), a quorum needs {quorum}; {detail}",
                    self.nodes.len()
                );
            }
            Err(LockError::Lost {
                name: keys.name.clone(),
                detail,
            })
        }
    }
}

/// Counts script replies: positive integers (held), answers, and failure reasons.
fn tally(results: Vec<Result<Value, NodeFailure>>) -> (usize, usize, Vec<String>) {
    let mut held = 0;
    let mut answered = 0;
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(Value::Int(x)) => {
                answered += 1;
                if x > 0 {
                    held += 1;
                }
            }
            Ok(_) => answered += 1,
            Err(fail) => failures.push(fail.reason),
        }
    }
    (held, answered, failures)
}

fn parse_round1(v: Value, node: &str) -> Result<Round1, NodeFailure> {
    let bad = || NodeFailure {
        reason: format!("{node}: unexpected reply from the acquire script"),
        maybe_applied: true,
    };
    let Value::Array(items) = v else {
        return Err(bad());
    };
    let int = |i: usize| match items.get(i) {
        Some(Value::Int(x)) => Some(*x),
        Some(Value::BulkString(b)) => std::str::from_utf8(b).ok()?.parse().ok(),
        _ => None,
    };
    let text = |i: usize| match items.get(i) {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::Int(x)) => x.to_string(),
        _ => String::new(),
    };
    match int(0) {
        Some(1) => {
            let fence: u64 = text(1).parse().map_err(|_| bad())?;
            Ok(Round1::Won(fence, text(2)))
        }
        Some(0) => Ok(Round1::Busy {
            pttl: int(1).unwrap_or(-1),
            holder: describe_holder(&text(2), &text(3), &text(4)),
        }),
        Some(2) => Ok(Round1::Quarantined(int(1).unwrap_or(0).max(0) as u64)),
        _ => Err(bad()),
    }
}

fn min_opt(a: Option<Duration>, b: Duration) -> Option<Duration> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// 128 bits from the operating system's CSPRNG, as 32 lowercase hex digits.
pub fn new_token() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    let mut s = String::with_capacity(32);
    for b in bytes {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// This machine's host name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length; gethostname writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
