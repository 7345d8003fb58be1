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
//! The same script keeps the queue of waiters (`queue.rs`): a node grants only when no live waiter
//! is queued ahead of the caller, and queues a refused waiter in the same call, so an uncontended
//! grant and a waiter's enqueue cost no round trip of their own.
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
//! returned more than `T_A`, and `T_B`, a maximum that includes it, is greater than `T_A`. A renewal
//! that re-creates a key lost in a restart raises that node's counter to the holder's token for the
//! same reason.
//!
//! That argument needs `n` to keep its counter. When a node loses its data, its counter would start
//! again from zero. So a grant that finds no counter starts it from the server's clock in
//! microseconds, and every other grant takes `max(counter + 1, the clock's current second in
//! microseconds)`: a node that lost its counter starts again above every fence it handed out before,
//! as long as its clock does not step back across the restart and no counter ran ahead of the clock
//! (more than one grant per microsecond, or round 2 raising a counter to the fence of a node whose
//! clock is ahead). Those are the remaining assumptions; `doctor` checks the server's clock against
//! this host's and looks for counters ahead of the clock. The whole second, not the microsecond, is
//! what keeps the nodes' counters equal from one grant to the next, so that a steady-state grant still
//! needs no round 2; the clock is read inside `acquire.lua`, so it costs no round trip either.
//!
//! # Restart quarantine
//!
//! A node restarted without its data has forgotten the locks it granted. `acquire.lua` reads the node's
//! uptime in the same script (no extra round trip) and refuses to vote while it is below the
//! quarantine (default: the TTL), by which time every lease it could have granted has expired or been
//! renewed elsewhere: Redlock's delayed-restart rule, enforced by the client. Redis reports the uptime
//! in whole seconds as `floor(now) - floor(start)`, up to one second more than the truth, so a node
//! votes only once `uptime - 1 s` covers the quarantine; a node whose uptime cannot be read does not
//! vote for the whole period (fail closed). No node is spared for its persistence settings: what
//! a client can read after a restart does not prove what the node had when it stopped (see
//! `quarantine.rs`).
//!
//! A holder's renewal may put its key back on a node that lost it in a restart (`renew.lua`), under
//! the same quarantine rule: a node still in quarantine counts as "not ours", so a holder that lost a
//! majority of its keys this way loses its lease, and one that lost a minority keeps it and gets its
//! key back there once the quarantine ends. The holder then records the node's new run id, so a later
//! `break` or eviction on that node is final. Consequence: with a single node, a restart without data
//! ends the lease (unless the quarantine is off).
//!
//! # Slots
//!
//! With `--limit N` a name has N slots, and each slot is a mutex of its own key: slot 1 is the lock
//! key, so `--limit 1` is the plain lock. A per-node count would not do for Redlock (three holders
//! can each win a different pair of three nodes while no node counts more than two), so round 1 takes
//! the lowest free slot on each node, the attempt wins the slot that a quorum granted, and the other
//! grants are rolled back; a split vote is retried at once asking for the most voted slot. All slots
//! share the fencing counter; round 2 of a semaphore confirms the fence only where its own raise set
//! it, so that holders of different slots at the same time never share a fence
//! (`docs/queue.md`).
//!
//! # One server, one vote
//!
//! Every round-1 reply carries the server's run id. Two nodes of one attempt that answer with the same
//! run id are one server reached through two spellings (`localhost` and `127.0.0.1`, a socket and a
//! port; two nodes of one cluster, which redirect to the slot's owner; two Sentinel URLs for one
//! master), which would count one vote twice: the attempt is rolled back and fails as a usage error.
//! Renewals, releases and `status` check the same from the run id each node read on connecting
//! ([`Engine::check_independent`]).

pub mod endpoint;
pub mod keys;
pub mod node;
pub mod quarantine;
pub mod queue;
pub mod quorum;
pub mod wait;

use std::sync::LazyLock;
use std::time::Duration;

use redis::Value;

use crate::clock::Stamp;
use crate::config::Settings;
use crate::exit::LockError;
use crate::trace;
pub use keys::LockKeys;
use node::{Node, NodeFailure};
use quarantine::Quarantined;
pub use wait::{WaitPolicy, Wake, Wakeup};

/// One of lockctl's Lua scripts, called by its digest (`EVALSHA`) and sent whole only to a server
/// that does not have it yet.
#[derive(Debug)]
pub struct LuaScript {
    pub source: &'static str,
    /// The SHA1 of `source` in hex, computed when lockctl was built.
    pub sha1: &'static str,
    /// It grants or extends a lock: its writes must reach the master's replicas before they count.
    pub durable: bool,
}

// Each script's text and `LuaScript`: ACQUIRE_LUA and ACQUIRE, FENCE_LUA and FENCE, and so on for
// RELEASE, RENEW, STATUS, BREAK and LEAVE (build.rs).
include!(concat!(env!("OUT_DIR"), "/scripts.rs"));

/// Who holds a lock: stored beside it so that `status`, `list` and waiting clients can say.
#[derive(Debug, Clone)]
pub struct Holder {
    pub host: String,
    pub pid: u32,
    pub cmd: String,
    /// `--note`: free text shown wherever the holder or waiter is named.
    pub note: String,
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
            note: String::new(),
        }
    }

    /// The same holder with a `--note` (checked by `config::check_note`).
    pub fn with_note(mut self, note: Option<&str>) -> Holder {
        self.note = note.unwrap_or_default().to_string();
        self
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

/// [`describe_holder`] with the note, when there is one: `host pid 123 (cmd), note: TEXT`.
pub fn describe_holder_note(host: &str, pid: &str, cmd: &str, note: &str) -> Option<String> {
    let mut s = describe_holder(host, pid, cmd)?;
    if !note.is_empty() {
        s.push_str(&format!(", note: {note}"));
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
    /// Per node, when the last call that found our key there was sent (the grant's attempt, then
    /// each renewal that counted there): a server up since before then is not one that lost the key
    /// in a restart, and puts nothing back (`renew.lua`).
    pub confirmed: Vec<Stamp>,
    /// How many of its renewals have counted, and how many renewal calls were made.
    pub renewals: u64,
    pub calls: u64,
    /// Per node, the mark of the last put-back of our key learned of there (`renew.lua`'s `back`),
    /// and how many renewals had counted when it was learned: that key counts once a renewal has
    /// counted without it since.
    pub backs: Vec<Option<(String, u64)>>,
    /// The slot held, 1..=limit (slot 1 is the lock key itself).
    pub slot: usize,
    /// The number of slots of the name (`--limit`).
    pub limit: usize,
}

/// What a held grant's renewal brings to put a key back on a node that lost it in a restart
/// (`renew.lua`), and updates: the nodes' run ids and when each last had our key.
struct Recreate<'a> {
    fence: u64,
    run_ids: &'a mut Vec<String>,
    confirmed: &'a mut Vec<Stamp>,
    renewals: &'a mut u64,
    calls: &'a mut u64,
    backs: &'a mut Vec<Option<(String, u64)>>,
    holder: &'a Holder,
}

impl Grant {
    /// What a holder's command is told: `LOCKCTL_NAME`, `LOCKCTL_KEY`, `LOCKCTL_TOKEN`, `LOCKCTL_FENCE`,
    /// `LOCKCTL_SLOT`.
    pub fn env(&self) -> [(&'static str, String); 5] {
        [
            ("LOCKCTL_NAME", self.keys.name.clone()),
            ("LOCKCTL_KEY", self.keys.key.clone()),
            ("LOCKCTL_TOKEN", self.token.clone()),
            ("LOCKCTL_FENCE", self.fence.to_string()),
            ("LOCKCTL_SLOT", self.slot.to_string()),
        ]
    }
}

/// Why an attempt did not win.
#[derive(Debug, Default)]
struct Refusal {
    /// Nodes that answered at all.
    answered: usize,
    /// Nodes that granted in round 1 (the attempt was rolled back).
    wins: usize,
    /// The current holder, as one node described it.
    holder: Option<String>,
    /// The shortest time after which a node may change its answer (a holder's TTL, a quarantine).
    retry_in: Option<Duration>,
    /// Per node: it answered "held by someone else", so a release there may let a retry win.
    busy: Vec<bool>,
    /// The nodes that refused to vote because they started too recently.
    quarantined: Vec<Quarantined>,
    /// The attempt won a quorum but took longer than the TTL allows.
    too_slow: Option<String>,
    failures: Vec<String>,
    /// A mistake in the setup that no retry can fix.
    fatal: Option<LockError>,
    /// A quorum granted, but split over several slots: retry asking for this one, the most voted.
    split: Option<usize>,
    /// A `--supersede` waiter displaced us: its description.
    superseded: Option<String>,
    /// The nodes gave different tickets: send the largest at once, before waiting.
    reorder: bool,
    /// Nodes that queued us or granted (the grant may have been rolled back since).
    accepted: usize,
    /// Nodes that queued us in an attempt that could displace there (`--supersede`, in time).
    displacing: usize,
    /// The most waiters any node counted, besides us.
    waiting: u64,
    /// Nodes where no slot is held and only waiters queued ahead refused us (who may be held up by
    /// the same quarantine).
    queued_behind: usize,
}

enum Round1 {
    /// Granted: fence, run id, slot.
    Won(u64, String, usize),
    Busy {
        pttl: i64,
        holder: Option<String>,
        run_id: String,
        queue: QueueReply,
    },
    Quarantined {
        remaining_ms: u64,
        uptime_s: Option<u64>,
        run_id: String,
        queue: QueueReply,
    },
    /// The name is in use with another limit; `peer`: held by a client that is not lockctl (slot 1's
    /// key without a lockctl record, a plain lock).
    Mismatch {
        limit: i64,
        holder: Option<String>,
        peer: bool,
        run_id: String,
    },
    /// Displaced by a `--supersede` waiter: its record (JSON), run id.
    Superseded(String, String),
}

/// What round 2 of a grant raises the fence under: the slot's keys and our token.
#[derive(Clone, Copy)]
struct Round2<'a> {
    keys: [&'a str; 3],
    token: &'a str,
    /// A semaphore's grant: the counter must reach the fence by our own raise (see `fence.lua`).
    semaphore: bool,
}

/// Where a refused attempt stands in one node's queue.
#[derive(Debug, Default, Clone, Copy)]
struct QueueReply {
    /// The ticket this node orders us by (`None`: not queued).
    ticket: Option<u64>,
    ahead: u64,
    waiting: u64,
    /// When this node wants our next heartbeat (`None`: an older reply without one).
    interval: Option<Duration>,
    /// Come back within this while a waiter ahead is pending here (`front.lua`, `pending_ahead`).
    hint: Option<Duration>,
    /// The node's clock (server ms) as it answered (`None`: an older script).
    now_ms: Option<u64>,
}

/// The engine over a set of nodes.
pub struct Engine {
    nodes: Vec<Node>,
    prefix: String,
    drift_factor: f64,
    quarantine: Option<Duration>,
    supersede: bool,
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
            supersede: false,
        })
    }

    /// How much longer than its interval a waiter's attempt may take: two node timeouts (one for
    /// the attempt that ran late, one for the reply of a node that is stopped or unreachable). The
    /// nodes keep a waiter this much longer, and its own loop allows it (see `queue.rs`).
    pub(crate) fn slack(&self) -> Duration {
        self.nodes
            .iter()
            .map(Node::timeout)
            .max()
            .unwrap_or_default()
            * 2
    }

    /// A waiter's lifetime at the front of the queue: three heartbeats and our slack.
    pub(crate) fn front_lifetime(&self) -> Duration {
        queue::ALIVE + self.slack()
    }

    /// `--supersede`: a wait displaces the older waiters of the lock (never its holder).
    pub fn supersede(&mut self, on: bool) {
        self.supersede = on;
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

    /// Bounds every node call to end by `until` (the end of a lease) as well as within the node
    /// timeout; `None` leaves the node timeout alone.
    pub fn limit_calls(&mut self, until: Option<Stamp>) {
        for node in &mut self.nodes {
            node.limit(until);
        }
    }

    /// Refuses two nodes that reached one server, however they are spelled (another host name, a
    /// socket and a port, two nodes of one cluster, two Sentinel URLs for one master): counted twice,
    /// one server would decide a quorum. Each node knows the run id of the server it talked to (after
    /// redirects and Sentinel, the one that holds the lock); the check needs no round trip of its own
    /// and comes after a renewal's or release's round, and `status`'s, before its result is used (a
    /// grant compares the run ids of its round 1).
    pub fn check_independent(&self) -> Result<(), LockError> {
        for (i, a) in self.nodes.iter().enumerate() {
            let Some(id) = a.server_id() else { continue };
            if let Some(b) = self.nodes[..i].iter().find(|b| b.server_id() == Some(id)) {
                return Err(LockError::Usage(format!(
                    "invalid --redis: {} and {} reach the same server or cluster (run id {id}); \
                     each -r is one vote, so Redlock needs independent servers, clusters or \
                     Sentinel groups",
                    b.display, a.display
                )));
            }
        }
        Ok(())
    }

    /// A majority of the nodes.
    pub fn quorum(&self) -> usize {
        quorum::quorum(self.nodes.len())
    }

    /// "Redis unavailable": only `reachable` nodes answered, or too few to decide. "Misconfigured"
    /// instead when the nodes that answered but refused (see [`Node::refused`]) alone leave too few
    /// for a quorum.
    pub fn unavailable(&self, reachable: usize, detail: String) -> LockError {
        let refused = self
            .nodes
            .iter()
            .filter(|n| n.refused())
            .count()
            .min(self.nodes.len() - reachable.min(self.nodes.len()));
        if refused > 0 && self.nodes.len() - refused < self.quorum() {
            return LockError::Misconfigured {
                nodes: self.nodes.len(),
                refused,
                quorum: self.quorum(),
                detail,
            };
        }
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
        limit: usize,
        wake: &Wakeup,
    ) -> Result<Grant, LockError> {
        let mode = match policy {
            WaitPolicy::NoWait => queue::Mode::Once,
            WaitPolicy::For(d) if d.is_zero() => queue::Mode::Once,
            _ if self.supersede => queue::Mode::Supersede,
            _ => queue::Mode::Wait,
        };
        let mut place = queue::Place::new(mode, self.slack());
        let wake_channel = keys.wake_channel(&place.id);
        let mut waiter = wait::Waiter::new(keys, &wake_channel, policy, self.nodes.len());
        let all = vec![true; self.nodes.len()];
        // The slot to ask for: after a split vote, the most voted one, once.
        let mut want = None;
        loop {
            if let Some(signal) = wake.pending_signal() {
                waiter.finish();
                return Err(self.interrupted(keys, &place, signal));
            }
            place.check_lapse();
            place.listening = waiter.listening();
            match self.attempt(keys, ttl, holder, limit, want.take(), &mut place) {
                Ok(grant) => {
                    waiter.finish();
                    // Still queued where the grant was refused: leave there, or the next release
                    // on that node would wake us instead of the next waiter. Without a ticket from
                    // any node, only where we may be queued unawares (`Place::unsure`).
                    let elsewhere: Vec<bool> = (0..self.nodes.len())
                        .map(|i| {
                            grant.run_ids[i].is_empty()
                                && (place.queued || place.unsure.get(i) == Some(&true))
                        })
                        .collect();
                    if self.nodes.len() > 1 && elsewhere.contains(&true) {
                        self.leave(keys, &place, &elsewhere, false);
                    }
                    if let Some(signal) = wake.pending_signal() {
                        if let Err(e) = self.release(keys, &grant.token) {
                            crate::complain!(
                                "the lock won as the signal came could not be given back ({e}); \
                                 it expires within {} ms",
                                ttl.as_millis()
                            );
                        }
                        return Err(LockError::Interrupted(signal, None));
                    }
                    return Ok(grant);
                }
                Err(refusal) => {
                    let mut refusal = *refusal;
                    if let Some(fatal) = refusal.fatal.take() {
                        waiter.finish();
                        self.leave(keys, &place, &all, false);
                        return Err(fatal);
                    }
                    if let Some(by) = refusal.superseded.take() {
                        waiter.finish();
                        self.leave(keys, &place, &all, false);
                        return Err(LockError::Superseded {
                            name: keys.name.clone(),
                            by,
                        });
                    }
                    if let Some(slot) = refusal.split {
                        trace!("'{}': split vote, asking for slot {slot}", keys.name);
                        want = Some(slot);
                        continue;
                    }
                    if refusal.answered < self.quorum() {
                        // Nodes that refuse (78) refuse again: waiting cannot help.
                        let err = self.unavailable(refusal.answered, refusal.failures.join("; "));
                        if matches!(err, LockError::Misconfigured { .. }) {
                            waiter.finish();
                            self.leave(keys, &place, &all, false);
                            return Err(err);
                        }
                    }
                    let displace = place.supersede_answered(
                        refusal.accepted,
                        refusal.displacing,
                        self.quorum(),
                    );
                    if (refusal.reorder || displace) && !waiter.deadline_passed() {
                        // The nodes gave different tickets: put the largest on them before waiting.
                        // A --supersede waiter that a quorum took in displaces the older waiters in
                        // that same attempt (a round trip more only when the tickets agreed).
                        continue;
                    }
                    let quorum = self.quorum();
                    let (pause, mut reason) = if refusal.answered < quorum {
                        (wait::Pause::Outage, self.unavailable_detail(&refusal))
                    } else if let Some(until) =
                        quarantine::unblocked_in(self.nodes.len(), quorum, &refusal.quarantined)
                    {
                        (
                            wait::Pause::Quarantine(until),
                            self.quarantine_note(&refusal),
                        )
                    } else {
                        let pause = wait::Pause::Busy {
                            busy: &refusal.busy,
                            retry_in: refusal.retry_in,
                        };
                        (pause, self.busy_detail(&refusal))
                    };
                    if let Some(p) = place.describe() {
                        reason.push_str(&format!("; {p}"));
                    }
                    let loud = self.refused_by_quarantine(&refusal);
                    waiter.queued(place.queued, place.is_head(), place.interval, place.hint);
                    match waiter.wait(&self.nodes, pause, &reason, loud, wake) {
                        wait::Verdict::Retry => {}
                        wait::Verdict::GiveUp => {
                            self.leave(keys, &place, &all, false);
                            return Err(self.refused(keys, refusal));
                        }
                        wait::Verdict::Signal(signal) => {
                            return Err(self.interrupted(keys, &place, signal));
                        }
                    }
                }
            }
        }
    }

    /// Takes a waiter that stops waiting out of the queue on the `on` nodes (nothing when it was
    /// never queued); returns how many of them it could not reach.
    fn leave(&mut self, keys: &LockKeys, place: &queue::Place, on: &[bool], blind: bool) -> usize {
        if place.queued || place.sent {
            let front = self.front_lifetime();
            queue::leave(&mut self.nodes, keys, &place.id, on, blind, front)
        } else {
            0
        }
    }

    /// A waiter stopped by `signal`: it leaves the queue without waiting for the answers (its exit
    /// must not wait for Redis), so it cannot know that every node got the leave: a node killed -9
    /// over TCP takes it into a dead socket's buffer. It says what it knows: nothing was left when
    /// it never queued; otherwise on how many nodes its place could not even be sent where the
    /// server would read it (a stopped server over TLS: no new handshake completes, and a connection
    /// that owes the replies to an attempt and its rollback is read no further once closed) and that
    /// the rest went unconfirmed; a node that did not get it drops the entry when its expiry passes.
    fn interrupted(&mut self, keys: &LockKeys, place: &queue::Place, signal: i32) -> LockError {
        if !(place.queued || place.sent) {
            return LockError::Interrupted(signal, None);
        }
        let all = vec![true; self.nodes.len()];
        let missed = self.leave(keys, place, &all, true);
        let within = humantime::format_duration(Duration::from_secs(
            self.front_lifetime().as_secs_f64().ceil() as u64,
        ));
        let given_up = if missed > 0 {
            format!(
                "its place in the queue could not be withdrawn on {missed} of {} node(s) (no \
                 connection that would carry it)",
                self.nodes.len()
            )
        } else {
            "its place in the queue was given up without waiting for the answer".to_string()
        };
        LockError::Interrupted(
            signal,
            Some(format!(
                "{given_up}; a node that did not get it (one that died meanwhile) drops it within \
                 about {within} of its last heartbeat"
            )),
        )
    }

    /// The error for an attempt that was refused at the deadline: unavailable when too few nodes
    /// answered, the quarantine when it stood between us and a quorum, busy otherwise.
    fn refused(&self, keys: &LockKeys, refusal: Refusal) -> LockError {
        if refusal.answered < self.quorum() {
            return self.unavailable(refusal.answered, refusal.failures.join("; "));
        }
        if self.refused_by_quarantine(&refusal) {
            return LockError::Quarantined {
                name: keys.name.clone(),
                detail: self.quarantine_detail(&refusal),
            };
        }
        if let (None, Some(slow)) = (&refusal.holder, refusal.too_slow) {
            // Nobody holds it; Redis was too slow to grant it in time.
            return self.unavailable(refusal.answered, slow);
        }
        LockError::Busy {
            name: keys.name.clone(),
            holder: refusal.holder,
            waiting: refusal.waiting,
        }
    }

    /// True when the attempt would have won a quorum but for the nodes in quarantine.
    fn refused_by_quarantine(&self, refusal: &Refusal) -> bool {
        let q = refusal.quarantined.len();
        let open = refusal.wins + refusal.queued_behind;
        q > 0 && (open + q >= self.quorum() || self.nodes.len() - q < self.quorum())
    }

    /// `held by HOLDER`, for wait lines.
    fn busy_detail(&self, refusal: &Refusal) -> String {
        let mut s = match (&refusal.holder, &refusal.too_slow) {
            (Some(h), _) => format!("held by {h}"),
            (None, Some(_)) => "held by nobody (the nodes answered too slowly)".into(),
            (None, None) if !refusal.busy.iter().any(|&b| b) && refusal.waiting > 0 => {
                "free, and handed to the waiters queued first".into()
            }
            (None, None) => "held by an unknown holder".into(),
        };
        if !refusal.quarantined.is_empty() {
            s.push_str(&format!("; {}", self.quarantine_note(refusal)));
        }
        s
    }

    /// The nodes in quarantine and how to lift it, for wait lines.
    fn quarantine_note(&self, refusal: &Refusal) -> String {
        format!(
            "{}; {}",
            quarantine::describe(&self.nodes, &refusal.quarantined, self.quorum()),
            quarantine::LIFT
        )
    }

    /// What the quarantine holds up, who (if anyone) holds the lock, and how to lift it.
    fn quarantine_detail(&self, refusal: &Refusal) -> String {
        let holder = match &refusal.holder {
            Some(h) => format!("the nodes that vote say it is held by {h}"),
            None if refusal.busy.iter().any(|&b| b) => {
                "a node that votes says it is held by an unknown holder".into()
            }
            None => "no node says it is held".into(),
        };
        format!(
            "{}; {holder}. A node that started recently may have forgotten locks it granted \
             before, so it does not vote until they have all expired; {}",
            quarantine::describe(&self.nodes, &refusal.quarantined, self.quorum()),
            quarantine::LIFT
        )
    }

    /// How many nodes answered and why the others did not.
    fn unavailable_detail(&self, refusal: &Refusal) -> String {
        format!(
            "{} of {} node(s) answered, a quorum needs {}: {}",
            refusal.answered,
            self.nodes.len(),
            self.quorum(),
            refusal.failures.join("; ")
        )
    }

    /// One attempt at the lock, rolled back where it did not win.
    fn attempt(
        &mut self,
        keys: &LockKeys,
        ttl: Duration,
        holder: &Holder,
        limit: usize,
        want: Option<usize>,
        place: &mut queue::Place,
    ) -> Result<Grant, Box<Refusal>> {
        let n = self.nodes.len();
        let quorum = self.quorum();
        let token = new_token();
        let ttl_ms = ttl.as_millis().to_string();
        let quarantine_ms = self.quarantine.unwrap_or(ttl).as_millis().to_string();
        let pid = holder.pid.to_string();
        let limit_arg = limit.to_string();
        let want_arg = want.map_or(String::new(), |w| w.to_string());
        // Where this attempt's rollback leaves its record, should one go to a node that times out.
        let record = keys.release_record(&token);
        let key_list = queue::acquire_keys(keys, &record);
        let ticket = place.ticket_arg();
        let alive_ms = queue::ALIVE.as_millis().to_string();
        let longest_ms = queue::LONGEST.as_millis().to_string();
        let slack_ms = place.slack.as_millis().to_string();

        let started = Stamp::now();
        place.sent |= place.mode != queue::Mode::Once;
        // A displacing attempt displaces on a node only while we still wait for its answer there.
        let deadlines: Vec<String> = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| place.displace_until(i, started, node.timeout()))
            .collect();
        // A node seen as a replica while we waited, and a master now, counts for a grant it votes
        // for in this attempt; one seen as a replica, or promoted, in this attempt's replies does
        // not count for its renewals (`Node::was_replica`).
        for node in &mut self.nodes {
            node.begin_attempt();
        }
        let round1 = quorum::all(&mut self.nodes, |i, node| {
            let listening = if place.listening.get(i) == Some(&true) {
                "1"
            } else {
                ""
            };
            let args = [
                token.as_str(),
                ttl_ms.as_str(),
                quarantine_ms.as_str(),
                holder.host.as_str(),
                pid.as_str(),
                holder.cmd.as_str(),
                limit_arg.as_str(),
                keys.slot_base.as_str(),
                keys.holder_base.as_str(),
                want_arg.as_str(),
                place.id.as_str(),
                ticket.as_str(),
                place.mode_arg(),
                holder.note.as_str(),
                keys.wake.as_str(),
                alive_ms.as_str(),
                longest_ms.as_str(),
                listening,
                slack_ms.as_str(),
                deadlines[i].as_str(),
            ];
            let reply = node
                .eval("acquire", &ACQUIRE, &key_list, &args)
                .and_then(|v| parse_round1(v, &node.display));
            // When the answer was read: no sooner than the node gave it.
            (reply, Stamp::now())
        });

        let mut refusal = Refusal {
            busy: vec![false; n],
            ..Refusal::default()
        };
        let mut won: Vec<Option<u64>> = vec![None; n];
        // The slot each node granted.
        let mut slots = vec![0usize; n];
        // The limit in use, its holder if named, and whether that is a client that is not lockctl.
        let mut mismatch: Option<(i64, Option<String>, bool)> = None;
        let mut mismatched = vec![false; n];
        // Every node's run id, from every kind of answer; the grant keeps those of the nodes won.
        let mut run_ids = vec![String::new(); n];
        let mut maybe_applied = vec![false; n];
        let mut queued: Vec<QueueReply> = Vec::new();
        let mut heard = vec![None; n];
        // The reasons of the nodes whose ACL refused the probe of the channel rights.
        let mut channels_refused: Vec<String> = Vec::new();
        let mut refusal_displacing = 0;
        let mut hear = |i: usize, queue: &QueueReply, read: Stamp| {
            if queue.ticket.is_some() {
                heard[i] = queue.now_ms.map(|t| (t, read));
                if !matches!(deadlines[i].as_str(), "" | "0") {
                    refusal_displacing += 1;
                }
            }
        };
        for (i, (r, read)) in round1.into_iter().enumerate() {
            match r {
                Ok(Round1::Won(fence, run_id, slot)) => {
                    refusal.answered += 1;
                    refusal.wins += 1;
                    won[i] = Some(fence);
                    slots[i] = slot;
                    run_ids[i] = run_id;
                }
                Ok(Round1::Mismatch {
                    limit,
                    holder,
                    peer,
                    run_id,
                }) => {
                    refusal.answered += 1;
                    run_ids[i] = run_id;
                    mismatched[i] = true;
                    if mismatch.as_ref().is_none_or(|(_, h, p)| h.is_none() && !p) {
                        mismatch = Some((limit, holder, peer));
                    }
                }
                Ok(Round1::Busy {
                    pttl,
                    holder,
                    run_id,
                    queue,
                }) => {
                    hear(i, &queue, read);
                    queued.push(queue);
                    refusal.answered += 1;
                    refusal.busy[i] = true;
                    run_ids[i] = run_id;
                    if pttl >= 0 {
                        refusal.retry_in =
                            min_opt(refusal.retry_in, Duration::from_millis(pttl as u64));
                    }
                    if pttl == -2 {
                        refusal.queued_behind += 1;
                    }
                    if refusal.holder.is_none() {
                        refusal.holder = holder;
                    }
                }
                Ok(Round1::Quarantined {
                    remaining_ms,
                    uptime_s,
                    run_id,
                    queue,
                }) => {
                    hear(i, &queue, read);
                    queued.push(queue);
                    refusal.answered += 1;
                    run_ids[i] = run_id;
                    let remaining =
                        quarantine::until_uptime_step(Duration::from_millis(remaining_ms));
                    refusal.retry_in = min_opt(refusal.retry_in, remaining);
                    refusal.quarantined.push(Quarantined {
                        node: i,
                        remaining,
                        uptime_s,
                    });
                }
                Ok(Round1::Superseded(by, run_id)) => {
                    refusal.answered += 1;
                    run_ids[i] = run_id;
                    let record = queue::WaiterRecord::parse("", &by);
                    refusal.superseded = Some(record.describe());
                }
                Err(fail) => {
                    maybe_applied[i] = fail.maybe_applied;
                    if node::is_channel_refusal(&fail.reason) {
                        channels_refused.push(fail.reason.clone());
                    }
                    refusal.failures.push(fail.reason);
                }
            }
        }
        if !channels_refused.is_empty() {
            // A node whose ACL refuses the channels changed nothing (the probe comes first in
            // acquire.lua), but it would refuse this grant's release: the attempt goes back on the
            // nodes it touched, and the command is refused (78), waiting or not.
            let rolled_back = self.roll_back_touched(keys, &token, &won, &maybe_applied, ttl);
            let mut detail = channels_refused.join("; ");
            if rolled_back > 0 {
                detail.push_str(&format!(
                    "; the grants of the other {rolled_back} node(s) were rolled back (their \
                     fencing counters stay raised, as after any rollback)"
                ));
            }
            refusal.fatal = Some(LockError::ChannelsRefused {
                nodes: n,
                refused: channels_refused.len(),
                detail,
            });
            return Err(Box::new(refusal));
        }
        refusal.accepted = refusal.wins + queued.iter().filter(|q| q.ticket.is_some()).count();
        refusal.displacing = refusal_displacing;
        place.heard = heard;
        self.place(place, &queued, &mut refusal);

        if let Some((a, b)) = same_server(&run_ids) {
            self.roll_back_touched(keys, &token, &won, &maybe_applied, ttl);
            refusal.fatal = Some(LockError::Usage(format!(
                "invalid --redis: {} and {} reach the same server (run id {}), which would count \
                 its vote twice; list each server once",
                self.nodes[a].display,
                self.nodes[b].display,
                &run_ids[a][..run_ids[a].len().min(12)]
            )));
            return Err(Box::new(refusal));
        }
        // Nodes that disagree cannot make a mixed grant while a quorum of others answered and
        // agree (every grant needs a majority, and the majorities meet): they keep what a node that
        // missed a release, or came back from an old copy, still holds. They then refuse like a
        // holder and the others decide. Otherwise the limit differs where it counts (a node that
        // did not answer, or may not vote, may be one that disagrees): the user's mistake, exit 2.
        let against = mismatched.iter().filter(|&&m| m).count();
        let agree = (0..n)
            .filter(|&i| won[i].is_some() || refusal.busy[i])
            .count();
        if against > 0 && agree >= quorum {
            trace!(
                "attempt on '{}': {against} of {n} node(s) keep another --limit; the others decide",
                keys.name
            );
            for (busy, &m) in refusal.busy.iter_mut().zip(&mismatched) {
                *busy |= m;
            }
        } else if let Some((theirs, by, peer)) = mismatch {
            self.roll_back_touched(keys, &token, &won, &maybe_applied, ttl);
            let message = if peer {
                format!(
                    "{} is held by a client that is not lockctl (a plain lock with no lockctl \
                     record, limit 1); you asked for --limit {limit}: a name that other Redis lock \
                     clients use is a plain lock, so use --limit 1 (the default) there, or give \
                     the semaphore a name of its own",
                    keys.name
                )
            } else {
                let by = by.map_or(String::new(), |h| format!(" (held by {h})"));
                format!(
                    "{} is used with --limit {theirs}{by}; you asked for --limit {limit}: every \
                     client of a name must give the same --limit (or LOCKCTL_LIMIT)",
                    keys.name
                )
            };
            refusal.fatal = Some(LockError::Usage(message));
            return Err(Box::new(refusal));
        }

        // The slot granted by the most nodes (the lowest on a tie); grants of other slots go back.
        let mut votes = std::collections::BTreeMap::new();
        for i in 0..n {
            if won[i].is_some() {
                *votes.entry(slots[i]).or_insert(0usize) += 1;
            }
        }
        let slot = votes
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map_or(1, |(s, _)| *s);
        let strays: Vec<bool> = (0..n)
            .map(|i| won[i].is_some() && slots[i] != slot)
            .collect();
        if strays.iter().any(|&s| s) {
            if refusal.wins >= quorum && votes[&slot] < quorum && want.is_none() {
                refusal.split = Some(slot);
            }
            self.rollback(keys, &token, &strays, ttl);
            for i in 0..n {
                if strays[i] {
                    won[i] = None;
                }
            }
            refusal.wins = won.iter().flatten().count();
        }

        let mut fence = won.iter().flatten().copied().max().unwrap_or(0);
        if n > 1 && won.iter().flatten().count() >= quorum {
            // Round 2 on the slot won.
            let (key, holder) = (keys.slot_key(slot), keys.slot_holder(slot));
            let round2 = Round2 {
                keys: [&key, &keys.fence, &holder],
                token: &token,
                semaphore: limit > 1,
            };
            fence = self.raise_fences(&round2, fence, &mut won, &mut maybe_applied, &mut refusal);
        }
        place.unsure.resize(n, false);
        for i in 0..n {
            place.unsure[i] |= strays[i] || (won[i].is_none() && maybe_applied[i]);
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
                confirmed: vec![started; n],
                renewals: 0,
                calls: 0,
                backs: vec![None; n],
                slot,
                limit,
            }),
            _ => {
                let touched: Vec<bool> = (0..n)
                    .map(|i| won[i].is_some() || maybe_applied[i])
                    .collect();
                if touched.iter().any(|&t| t) {
                    self.rollback(keys, &token, &touched, ttl);
                }
                for (unsure, touched) in place.unsure.iter_mut().zip(touched) {
                    *unsure |= touched;
                }
                if wins >= quorum {
                    refusal.too_slow = Some(format!(
                        "the attempt won a quorum but took {:.1} ms, leaving no validity for a \
                         {} ms TTL; lower --node-timeout or raise --ttl",
                        elapsed.as_secs_f64() * 1000.0,
                        ttl.as_millis()
                    ));
                }
                Err(Box::new(refusal))
            }
        }
    }

    /// Updates the waiter's place from the nodes' answers: its ticket (the largest given) and its
    /// position (the quorum-th smallest, since a grant needs a
    /// quorum of nodes where nobody is ahead).
    fn place(&self, place: &mut queue::Place, replies: &[QueueReply], refusal: &mut Refusal) {
        let total = replies.iter().map(|q| q.waiting).max().unwrap_or(0);
        // The others: a busy message does not count the waiter that prints it.
        refusal.waiting = replies
            .iter()
            .map(|q| q.waiting.saturating_sub(u64::from(q.ticket.is_some())))
            .max()
            .unwrap_or(0);
        // Any node with a pending waiter ahead needs a script to run when its expiry passes.
        place.hint = replies
            .iter()
            .filter(|q| q.ticket.is_some())
            .filter_map(|q| q.hint)
            .min()
            .map(|h| h.max(queue::HEARTBEAT));
        let tickets: Vec<u64> = replies.iter().filter_map(|q| q.ticket).collect();
        let Some(&max) = tickets.iter().max() else {
            return;
        };
        // Every node keeps us three of its intervals: the shortest bounds the next heartbeat.
        place.interval = replies
            .iter()
            .filter(|q| q.ticket.is_some())
            .map(|q| q.interval.unwrap_or(queue::HEARTBEAT))
            .min()
            .unwrap_or(queue::HEARTBEAT)
            .clamp(queue::HEARTBEAT, queue::LONGEST);
        place.queued = true;
        let known = place.ticket == Some(max);
        place.ticket = Some(max);
        refusal.reorder = !known && tickets.iter().any(|&t| t != max);
        let mut ahead: Vec<u64> = replies
            .iter()
            .filter(|q| q.ticket.is_some())
            .map(|q| q.ahead)
            .collect();
        ahead.sort_unstable();
        let k = self.quorum().min(ahead.len()).saturating_sub(1);
        place.position = ahead.get(k).map(|&a| (a, total));
    }

    /// Round 2 of a Redlock grant; returns the fencing token and drops the nodes that failed it.
    fn raise_fences(
        &mut self,
        round2: &Round2,
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
        let Round2 {
            keys: key_list,
            token,
            semaphore,
        } = *round2;
        let strict = if semaphore { "1" } else { "" };
        let results = quorum::each(
            &mut self.nodes,
            |i| behind[i],
            |_, node| node.eval("raise fence", &FENCE, &key_list, &[token, &t, strict]),
        );
        for (i, r) in results.into_iter().enumerate() {
            match r {
                None | Some(Ok(Value::Int(1))) => {}
                Some(Ok(Value::Int(2))) => {
                    // Our key stays there: rolled back with the others if the attempt fails.
                    won[i] = None;
                    maybe_applied[i] = true;
                }
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

    /// An attempt refused as a whole (a setup error, whatever the votes): rolls it back on every
    /// node that granted it or may have applied it. Returns how many.
    fn roll_back_touched(
        &mut self,
        keys: &LockKeys,
        token: &str,
        won: &[Option<u64>],
        maybe_applied: &[bool],
        ttl: Duration,
    ) -> usize {
        let touched: Vec<bool> = won
            .iter()
            .zip(maybe_applied)
            .map(|(w, &m)| w.is_some() || m)
            .collect();
        let count = touched.iter().filter(|&&t| t).count();
        if count > 0 {
            self.rollback(keys, token, &touched, ttl);
        }
        count
    }

    /// Releases our token on the given nodes, in parallel; nodes that owe a reply get it sent blind.
    /// A waiter whose grant this was goes back to its place in the queue there. `ttl`: the attempt's.
    ///
    /// A node that owes the reply to the attempt itself (it timed out there: a stalled server) may
    /// run the attempt when it runs again, after lockctl has gone. The rollback behind it on the same
    /// connection is not enough: a server that read the attempt before it stopped cannot write the
    /// answer to the connection closed on exit, and drops it unread, rollback included; the grant
    /// (or a place in the queue) would stay for the lease's TTL, a dead vote that can cost a later
    /// attempt its quorum. So the rollback also goes on a new connection ([`Node::send_on_new`]),
    /// and there leaves a record under the token, the attempt's tombstone (`release.lua`), which
    /// `acquire.lua` reads first: the server runs its connections in any order, and whichever runs
    /// first nothing stays (the attempt first: the rollback deletes its grant; the rollback first:
    /// the attempt finds the record and changes nothing). What goes there without waiting after the
    /// rollback (a waiter's leave) follows it on the new connection.
    ///
    /// The record lives for the lease's TTL from the rollback's run. Both wait in the server's
    /// sockets and run once it runs again, one right after the other; only a second stall between
    /// the two could part them by more, and a grant that still came after the record would last a
    /// TTL, as before. Tokens are new per attempt, so it never stands in a later attempt's way.
    fn rollback(&mut self, keys: &LockKeys, token: &str, on: &[bool], ttl: Duration) {
        let key_list = release_keys(keys);
        let front_ms = self.front_lifetime().as_millis().to_string();
        let [a, b, c, d, e, f] = release_args(keys, token, &front_ms);
        let args = [a, b, c, d, e, f, "1"];
        let record = keys.release_record(token);
        let [k1, k2, k3, k4, k5, k6, k7] = key_list;
        let tomb_keys = [k1, k2, k3, k4, k5, k6, k7, record.as_str()];
        let ttl_ms = ttl.as_millis().max(1).to_string();
        let tomb_args = [a, b, c, d, e, f, "1", ttl_ms.as_str(), ""];
        quorum::each(
            &mut self.nodes,
            |i| on[i],
            |_, node| {
                if node.is_stale() {
                    node.send_only(RELEASE_LUA, &tomb_keys, &tomb_args);
                    node.send_on_new(RELEASE_LUA, &tomb_keys, &tomb_args);
                } else {
                    // Releasing a token twice finds nothing the second time. The attempt itself
                    // answered, so nothing of it can run later.
                    let _ = node.eval_even_late("rollback", &RELEASE, &key_list, &args);
                }
            },
        );
    }

    /// Deletes the lock where it still holds `token`. Ok with the number of nodes released when they
    /// make a quorum.
    pub fn release(&mut self, keys: &LockKeys, token: &str) -> Result<usize, LockError> {
        let record = keys.release_record(token);
        let [k1, k2, k3, k4, k5, k6, k7] = release_keys(keys);
        let key_list = [k1, k2, k3, k4, k5, k6, k7, record.as_str()];
        let front_ms = self.front_lifetime().as_millis().to_string();
        // The record outlives the call that may send the release again (one node timeout).
        let keep_ms = (self.slack() + Duration::from_secs(1))
            .as_millis()
            .to_string();
        // This call's own id, the same on its resend: only its own first send's record answers it.
        let id = new_token();
        let [a, b, c, d, e, f] = release_args(keys, token, &front_ms);
        let args = [a, b, c, d, e, f, "", &keep_ms, &id];
        let results = quorum::all(&mut self.nodes, |_, node| {
            // Lost on a stopped node, it would leave a late grant there for its TTL. Run twice, it
            // finds its own record the second time and deletes nothing more.
            node.eval_even_late("release", &RELEASE, &key_list, &args)
        });
        // Every key of the token is gone; the release held a lease only if one slot had a quorum.
        let (_, released, answered, failures) = tally_slots(results);
        self.verdict(keys, released, answered, failures, "release")
            .map(|_| released)
    }

    /// Extends the lease where `token` still holds the lock. Returns the new validity.
    pub fn renew(
        &mut self,
        keys: &LockKeys,
        token: &str,
        ttl: Duration,
    ) -> Result<Duration, LockError> {
        self.renew_with(keys, token, Some(ttl), ttl, None, None)
    }

    /// Like [`Engine::renew`] with the TTL the lock was granted with, which its holder record keeps;
    /// `fallback` for a key with no record of ours (a canonical client's). Returns the new validity.
    pub fn renew_keeping_ttl(
        &mut self,
        keys: &LockKeys,
        token: &str,
        fallback: Duration,
    ) -> Result<Duration, LockError> {
        self.renew_with(keys, token, None, fallback, None, None)
    }

    /// Extends a held grant's lease, as [`Engine::renew`], and lets a node that lost the key in a
    /// restart since it gave us the key get it back once it is past its restart quarantine, with
    /// its fencing counter raised to the grant's token (see `renew.lua`). Such a node's new run id is
    /// recorded in `grant.run_ids`, also when the renewal as a whole fails: the key is back there
    /// under that run id, so a later disappearance there is a `break` or an eviction, never undone.
    pub fn renew_grant(
        &mut self,
        grant: &mut Grant,
        holder: &Holder,
    ) -> Result<Duration, LockError> {
        let Grant {
            keys,
            token,
            ttl,
            fence,
            run_ids,
            confirmed,
            renewals,
            calls,
            backs,
            slot,
            limit,
            ..
        } = grant;
        self.renew_with(
            keys,
            token,
            Some(*ttl),
            *ttl,
            Some((*slot, *limit)),
            Some(Recreate {
                fence: *fence,
                run_ids,
                confirmed,
                renewals,
                calls,
                backs,
                holder,
            }),
        )
    }

    fn renew_with(
        &mut self,
        keys: &LockKeys,
        token: &str,
        ttl: Option<Duration>,
        fallback: Duration,
        slot: Option<(usize, usize)>,
        mut recreate: Option<Recreate>,
    ) -> Result<Duration, LockError> {
        let ttl_ms = ttl.map_or(String::new(), |t| t.as_millis().to_string());
        let fallback_ms = fallback.as_millis().to_string();
        let quarantine_ms = self
            .quarantine
            .unwrap_or(ttl.unwrap_or(fallback))
            .as_millis()
            .to_string();
        let (fence, host, pid, cmd, note) = match &recreate {
            Some(Recreate { fence, holder, .. }) => (
                fence.to_string(),
                holder.host.clone(),
                holder.pid.to_string(),
                holder.cmd.clone(),
                holder.note.clone(),
            ),
            None => (
                "0".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        let granted_by: Vec<String> = match &recreate {
            Some(r) => r.run_ids.to_vec(),
            None => Vec::new(),
        };
        let held_grant = recreate.is_some();
        // This call's number: a put-back records it, with the node's run id, as its mark.
        let call = match &mut recreate {
            Some(r) => {
                *r.calls += 1;
                r.calls.to_string()
            }
            None => String::new(),
        };
        let started = Stamp::now();
        // Per node, the uptime above which its server was up already when it last had our key.
        let up_before: Vec<String> = match &recreate {
            Some(r) => r
                .confirmed
                .iter()
                .zip(&self.nodes)
                .map(|(at, node)| {
                    (started.elapsed_since(*at) + node.timeout())
                        .as_millis()
                        .to_string()
                })
                .collect(),
            None => Vec::new(),
        };
        // A grant knows its slot; for a token alone it is the slot where the token has a quorum.
        let (slot, limit_arg) = match slot {
            Some((slot, limit)) => (slot, limit.to_string()),
            None => (self.find_slot(keys, token)?, String::new()),
        };
        let (slot_key, slot_holder, slot_arg) = (
            keys.slot_key(slot),
            keys.slot_holder(slot),
            slot.to_string(),
        );
        let record = keys.renew_record(token);
        let key_list = [
            slot_key.as_str(),
            keys.fence.as_str(),
            slot_holder.as_str(),
            keys.limit.as_str(),
            record.as_str(),
        ];
        // A held grant's renewals need no probe: its acquire probed (renew.lua).
        let probe = if recreate.is_some() {
            ""
        } else {
            keys.wake.as_str()
        };
        let mut results = quorum::all(&mut self.nodes, |i, node| {
            let granted_by = granted_by.get(i).map_or("", String::as_str);
            let up_before = up_before.get(i).map_or("", String::as_str);
            let args = [
                token,
                &ttl_ms,
                &fence,
                granted_by,
                &host,
                &pid,
                &cmd,
                &fallback_ms,
                &quarantine_ms,
                &limit_arg,
                &slot_arg,
                &keys.slot_base,
                &keys.holder_base,
                &note,
                probe,
                up_before,
                &call,
            ];
            node.eval("renew", &RENEW, &key_list, &args)
        });
        let elapsed = started.elapsed();
        // A key renewed or re-created for a holder that tracks run ids ({ttl, run id}) counts as held
        // with that TTL, and the node's current run id is recorded at once: after a restart that kept
        // the key as after one that lost it, a later disappearance on that node is final.
        let mut recreated = vec![false; self.nodes.len()];
        if let Some(Recreate {
            run_ids,
            renewals,
            backs,
            ..
        }) = &mut recreate
        {
            for (i, r) in results.iter_mut().enumerate() {
                if let Ok(Value::Array(items)) = r {
                    if let (Some(Value::BulkString(id)), Some(slot)) =
                        (items.get(1), run_ids.get_mut(i))
                    {
                        let id = String::from_utf8_lossy(id);
                        if *slot != id {
                            trace!("renew '{}': node {i} now has run id {id}", keys.name);
                            *slot = id.into_owned();
                        }
                    }
                    // A key put back counts once a renewal has counted without it since we
                    // learned of the put-back (`renew.lua`): the node was without it for a while,
                    // and may have granted the lock meanwhile; when it was put back is not known,
                    // only that it was before we learned of it (from this reply, or a later one
                    // if this one was lost or the request came late).
                    let waits = match items.get(2) {
                        Some(Value::BulkString(mark)) => {
                            let mark = String::from_utf8_lossy(mark);
                            let known = backs
                                .get(i)
                                .and_then(Option::as_ref)
                                .filter(|(m, _)| *m == mark)
                                .map(|(_, at)| *at);
                            if known.is_none() {
                                if let Some(b) = backs.get_mut(i) {
                                    *b = Some((mark.into_owned(), **renewals));
                                }
                            }
                            known.is_none_or(|at| at >= **renewals)
                        }
                        _ => false,
                    };
                    if waits {
                        trace!("renew '{}': node {i} got our key back", keys.name);
                        recreated[i] = true;
                        *r = Ok(Value::Int(0));
                    } else {
                        *r = Ok(items.first().cloned().unwrap_or(Value::Int(0)));
                    }
                }
            }
        }
        // A held grant's node that was a replica of another master since the grant (it refused a
        // call as one, or its replication id changed under the same run id: see
        // `Node::was_replica`) answers "not ours" from then on: the master it followed may have
        // granted the lock to another client meanwhile (its copy of our key kept while the full
        // sync from it was under way), and a promotion back (`REPLICAOF NO ONE`) leaves that copy
        // in place, which the renewals would count again. One node's lease ends there; a Redlock
        // grant goes on while a quorum of the others holds.
        let demoted = if held_grant {
            let mut n = 0;
            for (r, node) in results.iter_mut().zip(&self.nodes) {
                if node.was_replica() {
                    *r = Ok(Value::Int(0));
                    n += 1;
                }
            }
            n
        } else {
            0
        };
        // Where the key was found (or put back) this call, that is the node's latest confirmation.
        if let Some(Recreate { confirmed, .. }) = &mut recreate {
            for ((r, at), back) in results.iter().zip(confirmed.iter_mut()).zip(&recreated) {
                if *back || matches!(r, Ok(Value::Int(ms)) if *ms > 0) {
                    *at = started;
                }
            }
        }
        // Each node answers with the TTL it set; the shortest bounds the lease.
        let set = results
            .iter()
            .filter_map(|r| match r {
                Ok(Value::Int(ms)) if *ms > 0 => Some(Duration::from_millis(*ms as u64)),
                _ => None,
            })
            .min();
        let ttl = ttl.or(set).unwrap_or(fallback);
        // A restarted node still in quarantine (-1) counts as not ours, like any other "0": a holder
        // that lost a quorum of keys in restarts must not outlive a lease granted meanwhile.
        let restarted = results
            .iter()
            .filter(|r| matches!(r, Ok(Value::Int(-1))))
            .count();
        let back = recreated.iter().filter(|b| **b).count();
        let (renewed, answered, failures) = tally(results);
        let verdict = self.verdict(keys, renewed, answered, failures, "renew");
        if let (Ok(()), Some(r)) = (&verdict, &mut recreate) {
            *r.renewals += 1;
        }
        verdict.map_err(|e| match e {
            LockError::Lost { name, mut detail } if restarted + demoted + back > 0 => {
                if restarted > 0 {
                    detail += &format!(
                        "; {restarted} node(s) restarted without their data since and are in \
                             restart quarantine"
                    );
                }
                if demoted > 0 {
                    detail += &format!(
                        "; {demoted} node(s) became a replica of another master since the \
                             grant, and its copy of the lock is not ours to renew"
                    );
                }
                if back > 0 {
                    detail += &format!(
                        "; {back} node(s) had lost our key (a restart without its data) and \
                             got it back, which does not show that no one else held the lock \
                             there meanwhile"
                    );
                }
                LockError::Lost { name, detail }
            }
            e => e,
        })?;
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

    /// The slot where `token` holds a quorum of keys. A stray key of the token in another slot (a
    /// grant's late round-1 request that took another free slot on a node) is no vote for it.
    fn find_slot(&mut self, keys: &LockKeys, token: &str) -> Result<usize, LockError> {
        let key_list = [
            keys.key.as_str(),
            keys.fence.as_str(),
            keys.holder.as_str(),
            keys.limit.as_str(),
        ];
        let results = quorum::all(&mut self.nodes, |_, node| {
            let args = [
                token,
                "",
                "0",
                "",
                "",
                "",
                "",
                "",
                "0",
                "",
                "",
                &keys.slot_base,
                &keys.holder_base,
                "",
                &keys.wake,
            ];
            node.eval("renew (find the slot)", &RENEW, &key_list, &args)
        });
        let (slot, held, answered, failures) = tally_slots(results);
        self.verdict(keys, held, answered, failures, "renew")?;
        Ok(slot)
    }

    fn verdict(
        &self,
        keys: &LockKeys,
        held: usize,
        answered: usize,
        failures: Vec<String>,
        what: &str,
    ) -> Result<(), LockError> {
        self.check_independent()?;
        let quorum = self.quorum();
        trace!(
            "{what} '{}': {held}/{} node(s) held our token",
            keys.name,
            self.nodes.len()
        );
        let unanswered = self.nodes.len() - answered;
        if held >= quorum {
            // A node whose ACL refuses the channels changed nothing (its script checks them before
            // its first write), so its copy stays until its TTL. `acquire` refuses such a set of nodes
            // as a whole; a holder meets it only when the rules changed after its grant. Said, not
            // refused: the quorum did what was asked, and a refusal here would cost every Redlock
            // call a round of its own to check the rights first.
            for refused in failures.iter().filter(|f| node::is_channel_refusal(f)) {
                crate::complain!(
                    "warning: {what} '{}' done on {held} of {} node(s), a quorum; {refused}",
                    keys.name,
                    self.nodes.len()
                );
            }
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

/// The keys of `release.lua` (and of `break.lua`, which takes the same).
pub(crate) fn release_keys(keys: &LockKeys) -> [&str; 7] {
    [
        keys.key.as_str(),
        keys.holder.as_str(),
        keys.limit.as_str(),
        keys.queue.as_str(),
        keys.alive.as_str(),
        keys.waiters.as_str(),
        keys.seen.as_str(),
    ]
}

/// A queued waiter's lifetime at the front of the queue, in ms, as the scripts take it (without a
/// node timeout's slack: for `doctor`'s scratch lock).
pub(crate) static ALIVE_MS: LazyLock<String> =
    LazyLock::new(|| queue::ALIVE.as_millis().to_string());

/// The arguments of `release.lua`; `front_ms`: the front lifetime with our slack.
fn release_args<'a>(keys: &'a LockKeys, token: &'a str, front_ms: &'a str) -> [&'a str; 6] {
    [
        token,
        keys.channel.as_str(),
        keys.slot_base.as_str(),
        keys.holder_base.as_str(),
        keys.wake.as_str(),
        front_ms,
    ]
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

/// Counts the slot lists that `release.lua` and a slot-finding `renew.lua` answer, per slot: the slot
/// with the most nodes (the lowest on a tie), its node count, answers, and failure reasons.
fn tally_slots(results: Vec<Result<Value, NodeFailure>>) -> (usize, usize, usize, Vec<String>) {
    let mut votes: std::collections::BTreeMap<usize, usize> = std::collections::BTreeMap::new();
    let mut answered = 0;
    let mut failures = Vec::new();
    for r in results {
        match r {
            Ok(Value::Array(slots)) => {
                answered += 1;
                let mut seen = std::collections::BTreeSet::new();
                for s in slots {
                    if let Value::Int(s) = s {
                        if let Ok(s) = usize::try_from(s) {
                            if seen.insert(s) {
                                *votes.entry(s).or_default() += 1;
                            }
                        }
                    }
                }
            }
            Ok(_) => answered += 1,
            Err(fail) => failures.push(fail.reason),
        }
    }
    let (slot, held) = votes.into_iter().fold(
        (1, 0),
        |best, (s, n)| if n > best.1 { (s, n) } else { best },
    );
    (slot, held, answered, failures)
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
    let ms = |i: usize| {
        int(i)
            .and_then(|ms| u64::try_from(ms).ok())
            .map(Duration::from_millis)
    };
    let queue = |at: usize, interval: usize, hint: usize| QueueReply {
        ticket: text(at).parse().ok(),
        ahead: int(at + 1).unwrap_or(0).max(0) as u64,
        waiting: int(at + 2).unwrap_or(0).max(0) as u64,
        interval: ms(interval),
        hint: ms(hint).filter(|h| !h.is_zero()),
        now_ms: int(hint + 1).and_then(|t| u64::try_from(t).ok()),
    };
    match int(0) {
        Some(1) => {
            let fence: u64 = text(1).parse().map_err(|_| bad())?;
            let slot = int(3).and_then(|s| usize::try_from(s).ok()).unwrap_or(1);
            Ok(Round1::Won(fence, text(2), slot.max(1)))
        }
        Some(0) => Ok(Round1::Busy {
            pttl: int(1).unwrap_or(-1),
            holder: describe_holders(items.get(11))
                .or_else(|| describe_holder_note(&text(2), &text(3), &text(4), &text(9))),
            run_id: text(5),
            queue: queue(6, 10, 12),
        }),
        Some(2) => Ok(Round1::Quarantined {
            remaining_ms: int(1).unwrap_or(0).max(0) as u64,
            run_id: text(2),
            uptime_s: int(3).and_then(|u| u64::try_from(u).ok()),
            queue: queue(4, 7, 8),
        }),
        Some(3) => Ok(Round1::Mismatch {
            limit: int(1).unwrap_or(0),
            holder: describe_holder(&text(2), &text(3), &text(4)),
            peer: text(6) == "peer",
            run_id: text(5),
        }),
        Some(4) => Ok(Round1::Superseded(text(1), text(2))),
        _ => Err(bad()),
    }
}

/// Every holder of a semaphore from the acquire script's list (`{{slot, host, pid, cmd, note}, ...}`),
/// each as a plain lock's holder is named, with its slot: `h pid 1 (cmd), note: x, slot 1; ...`.
fn describe_holders(list: Option<&Value>) -> Option<String> {
    let Some(Value::Array(holders)) = list else {
        return None;
    };
    let text = |v: Option<&Value>| match v {
        Some(Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(Value::Int(x)) => x.to_string(),
        _ => String::new(),
    };
    let all: Vec<String> = holders
        .iter()
        .filter_map(|h| match h {
            Value::Array(f) => Some(format!(
                "{}, slot {}",
                describe_holder_note(
                    &text(f.get(1)),
                    &text(f.get(2)),
                    &text(f.get(3)),
                    &text(f.get(4))
                )
                .unwrap_or_else(|| "an unknown holder".into()),
                text(f.first())
            )),
            _ => None,
        })
        .collect();
    (!all.is_empty()).then(|| all.join("; "))
}

/// The first two nodes that answered with the same run id: one server reached twice.
fn same_server(run_ids: &[String]) -> Option<(usize, usize)> {
    run_ids.iter().enumerate().find_map(|(b, id)| {
        let a = run_ids[..b]
            .iter()
            .position(|other| !id.is_empty() && other == id)?;
        Some((a, b))
    })
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
