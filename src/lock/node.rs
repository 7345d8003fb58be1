//! One Redis node: a lazily opened connection with hard timeouts, and scripts sent with EVALSHA.
//!
//! One node timeout bounds each call as a whole: the name lookup, the connect, the handshake (TLS,
//! AUTH, SELECT) and the command together, so a stopped or black-holed server costs at most about one
//! timeout and never hangs a command. A holder's renewal is bounded by the time left on its lease as
//! well ([`Node::limit`]), so no renewal call outlives the lease it renews. Scripts go out as EVALSHA;
//! on NOSCRIPT their source goes out with EVAL, which also caches it, so a `SCRIPT FLUSH` or a
//! failover to a server that never saw the scripts costs one round trip more and changes nothing.
//!
//! After a timeout the connection still owes us a reply, so it can no longer be used for
//! request/response; it is kept only to send a rollback without waiting ([`Node::send_only`]), which the
//! server runs after the command that timed out, in order, should it ever wake up; unless it had
//! read that command when it stopped: it then cannot write the reply to the connection closed on our
//! exit, and drops it unread at the resume. So a rollback goes on a new connection too
//! ([`Node::send_on_new`]), with a record that stops the late command (`Engine::rollback`).
//!
//! A connection found dropped (`CLIENT KILL`, a server restart), reused or just opened, is reopened
//! once, at once: every lockctl script leaves the same state when it runs twice. A new connection is
//! no safer than an old one: an operator's `CLIENT KILL TYPE normal` can land between its connect and
//! its first command.
//!
//! The reply to the second send may differ from the first's: a release that ran before its
//! connection dropped has deleted the key, and the second send finds nothing of ours. Taken as it
//! comes, that reported a lease held throughout as lost (exit 76). Taking every empty answer to a
//! second send as ours is wrong the other way: usually the first send never ran (the server had
//! restarted), and a key lost with a server restarted without data must still be reported lost.
//! Nor does the run id settle it: a release is often the first command on its connection (every
//! `lockctl release`), whose `INFO` reply is lost with the script's, and the same server (same run
//! id) may have lost the key between the sends to `lockctl break`, an expiry (unknown to a
//! `lockctl release` given a token) or an eviction. What is decided is whether the first send ran
//! on the data the second one finds, and the server keeps that itself: a release that deletes our
//! keys records which slots, under the token, for a little longer than the call can last
//! (`release.lua`), and a send that finds nothing of ours reads the record back, as the answer the
//! first send got. The record holds the release call's own random id, which the second send
//! carries too, and answers only a send with that id (so a first send never finds one): the token
//! alone cannot tell this call's first send from an earlier release of the same token (`lockctl
//! release --token T` run twice, a job releasing through `LOCKCTL_TOKEN`), and a token that holds
//! nothing any more must still be told so when its second release's reply is cut. A key lost
//! before the release, or with a restart without data between the sends, leaves no record: still
//! "not ours" (76). A record lost with a restart just after the first send ran gives "not ours" for
//! a release that did run: that rare false report is the one left. The other scripts need no
//! record: a grant or renewal sent again answers as the first did.
//!
//! lockctl's own signals are never why a read fails: a socket read with a timeout fails with
//! `EINTR` even under `SA_RESTART`, so they are blocked in every thread but the one that receives
//! them (`crate::signals`). SIGSTOP cannot be blocked: a read under way when lockctl is stopped and
//! continued fails all the same. The reply is not read again on that connection (redis-rs then skips
//! the next reply, taking it for the one it gave up on): the connection is dropped and the command
//! sent again, as above, and again after each further cut read for as long as the call has time
//! left, since a cut read says nothing about the server and each one takes a stop of its own; to
//! the same server, not through the URL's node again (a cluster's redirect each time). So
//! does a cut read of the `INFO` that follows a new connection's first reply, or of `WAIT` (whose
//! new connection waits for this write only once the command went out on it); a cut handshake
//! (AUTH, SELECT, TLS) is made again.
//!
//! A node reaches its server through its endpoint (`super::endpoint`): the URL's server, a cluster's
//! slot owner (MOVED and ASK are followed here, within the node timeout), or the master a Sentinel
//! names. The first reply on each new connection is followed by `INFO` (of the sections it needs,
//! [`CHECKED_SECTIONS`]): a replica is refused (or,
//! behind Sentinel, the master is asked for again), the replicas in sync are counted for `WAIT` after
//! a grant or renewal, and the run id tells two endpoints that reach one server apart. It comes after
//! the first command, not before, so that command is on its way to a server that stopped answering
//! just as it would be on an old connection, and in the same write, so it costs no round trip. A
//! grant or renewal on a kept connection carries `INFO replication` the same way: replicas come and
//! go, and reading them afresh must not double the operation's round trips.
//!
//! A failure is either an outage (no answer: 69 when it costs the quorum) or a refusal (the server
//! answered and refuses: wrong credentials, an ACL, a replica, a renamed command, a redirect that
//! cannot be followed; 78), which [`Node::refused`] tells the engine. A refusal raised inside a script
//! names the script's line, whose command lockctl names in the message. A channel that the ACL
//! refuses is named as such, with the `&` rules: the scripts check it before their first write, so
//! such a refusal left nothing behind on that node (see `acquire.lua`).
//!
//! Opening a connection has parts that no socket timeout bounds, or bounds one by one: the name lookup
//! (`getaddrinfo` takes no timeout at all), a unix-socket connect (std's `UnixStream::connect` takes
//! none, and it blocks for as long as a stopped server's accept queue is full), and redis-rs gives the
//! handshake its own timeout after the connect's. So a connection to a host name is opened on a
//! helper thread that the caller stops waiting for when the call's time is up ([`connect`]); a node
//! keeps at most one such connect outstanding and picks it up on its next call rather than queueing
//! more. Where every step can be bounded on the calling thread, no helper is started, since starting
//! it and waiting for it cost a measurable part of a whole invocation (`bench/RESULTS.md`): a URL
//! without a user, a password or a database (so there is no handshake to bound), whose server is a
//! TCP address given as an IP (no lookup; the connect has a timeout) or a unix socket (its connect is
//! interrupted at the deadline by a signal to the calling thread, [`Alarm`]).
//!
//! Redirects, the `INFO` after a new connection's first reply and `WAIT` all fit in the same call's
//! time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisError, RedisResult, Value};

use super::endpoint::{cluster::MAX_REDIRECTS, Endpoint, EndpointError, OnReplica};
use crate::clock::Stamp;
use crate::config::{NodeSpec, TlsFiles};
use crate::exit::LockError;
use crate::trace;

/// Why a node did not answer.
#[derive(Debug, Clone)]
pub struct NodeFailure {
    /// What went wrong, with the node's redacted URL.
    pub reason: String,
    /// The command may have reached the server and run there; a rollback must go to this node.
    pub maybe_applied: bool,
}

/// One vote: a Redis master, reached through its endpoint (standalone, cluster, Sentinel).
pub struct Node {
    /// The node's URL, redacted.
    pub display: String,
    client: Client,
    secret_url: String,
    conn: Option<Connection>,
    /// What `conn` owes: the writes whose replies were not read (the command that timed out, and
    /// what was sent behind it without waiting). Empty when the connection is in step.
    owed: Owed,
    /// The bytes the current call writes, as far as known (for `owed` when it times out).
    sending: usize,
    /// The last call failed after its command went out on a connection that was then dropped
    /// unanswered (its read cut by a stop of lockctl, and sent again): a stopped server still runs
    /// it when it resumes, as it runs one that timed out.
    left_behind: bool,
    timeout: Duration,
    /// Calls must also end by then (the end of the lease they renew).
    until: Option<Stamp>,
    /// A connect still blocked after an earlier call gave up on it.
    pending: Mutex<Option<Receiver<RedisResult<Connection>>>>,
    endpoint: Endpoint,
    /// Replicas of the master on `conn` that must acknowledge a grant or renewal, read in the
    /// current call's write (or by the INFO after a new connection's first command); `None` otherwise.
    replicas: Option<usize>,
    /// `?replicas=N` of the URL.
    want_replicas: Option<usize>,
    /// The most replicas each master (by address) had at a grant or renewal so far.
    seen: std::collections::HashMap<String, usize>,
    /// The last call failed because the node answered and refuses (see [`Node::refused`]).
    refused: AtomicBool,
    /// The run id of the server `conn` reached.
    run_id: Option<String>,
    /// How often that server runs its cron (`1000 / hz` ms), which is when it answers a `WAIT` that
    /// timed out: read from its `INFO`, Redis' default (hz 10) until then.
    tick: Duration,
    /// Connect to a replica too (`doctor`, which reports it rather than refuses it).
    accept_replica: bool,
    /// The server on `conn` was checked ([`Node::check_server`]).
    checked: bool,
    /// The server refused a call as a replica of another master, or was promoted under the same run
    /// id, since the current grant's attempt began (see [`Node::was_replica`]).
    was_replica: bool,
    /// The run id and `master_replid` of the last `INFO` read from a plain URL's server.
    history: Option<(String, String)>,
}

/// Why a server is not the master this node wants.
enum Check {
    /// Ask the endpoint for the master again.
    Rediscover,
    /// The read of INFO was cut by a stop of lockctl (`EINTR`): nothing is known of the server.
    Cut,
    /// Refused, or INFO failed.
    Fail(NodeFailure),
}

/// The bytes of a command's RESP encoding, from the lengths of its parts.
fn packed_len(parts: impl IntoIterator<Item = usize>) -> usize {
    let digits = |n: usize| n.max(1).ilog10() as usize + 1;
    let (count, bytes) = parts.into_iter().fold((0, 0), |(count, bytes), len| {
        (count + 1, bytes + 1 + digits(len) + 2 + len + 2)
    });
    1 + digits(count) + 2 + bytes
}

/// How much a stopped server reads of a plain connection at a time (Redis's `PROTO_IOBUF_LEN`), and
/// the most plaintext one TLS record carries.
const SERVER_READ: usize = 16 * 1024;

/// The writes a connection owes replies to, and whether a server that reads them only after
/// lockctl closed the connection (a stopped server, resumed after a signalled waiter's exit) still
/// runs the last of them. It reads until the first command is complete, runs what that read
/// brought, and frees the connection when a reply cannot be written: over a unix socket at once
/// (the first read: three writes of 7 KB, two ran; of 14 KB, one), over TCP and TLS after one
/// read more at least, and over TLS one read is one record, one write of up to 16 KB (three small
/// writes, two ran; a 20 KB write and two small ones, the first two ran; Redis 7.0). Counted as
/// plain reads for TCP, which at times read further (three writes of 14 KB all ran; five of
/// 20 KB, two).
#[derive(Debug, Default, Clone, Copy)]
struct Owed {
    writes: u8,
    /// The bytes (and TLS records) of the first write, and of all of them.
    first: usize,
    bytes: usize,
    first_records: usize,
    records: usize,
}

impl Owed {
    fn add(&mut self, len: usize) {
        let records = len.div_ceil(SERVER_READ).max(1);
        if self.writes == 0 {
            self.first = len;
            self.first_records = records;
        }
        self.writes = self.writes.saturating_add(1);
        self.bytes += len;
        self.records += records;
    }

    /// True when a stopped server reads every owed write of the connection closed before it resumed.
    fn all_read(&self, tls: bool) -> bool {
        if tls {
            self.records <= self.first_records + 1
        } else {
            self.bytes <= self.first.div_ceil(SERVER_READ).max(1) * SERVER_READ
        }
    }
}

impl Node {
    /// A node that connects on first use.
    pub fn new(spec: &NodeSpec, tls: &TlsFiles, timeout: Duration) -> Result<Node, LockError> {
        let client = open_client(spec, tls)?;
        Ok(Node {
            display: spec.display.clone(),
            endpoint: Endpoint::new(spec, &client)?,
            client,
            secret_url: spec.url.clone(),
            conn: None,
            owed: Owed::default(),
            sending: SERVER_READ,
            left_behind: false,
            timeout,
            until: None,
            pending: Mutex::new(None),
            replicas: None,
            want_replicas: spec.replicas,
            seen: std::collections::HashMap::new(),
            refused: AtomicBool::new(false),
            run_id: None,
            tick: DEFAULT_TICK,
            accept_replica: false,
            checked: false,
            was_replica: false,
            history: None,
        })
    }

    /// True when the last failed call failed because the node answered and refuses (wrong
    /// credentials, an ACL, a replica, a renamed command, a redirect it cannot follow): retrying will
    /// not help. A later success (a rollback after the refusal) leaves it as it is.
    pub fn refused(&self) -> bool {
        self.refused.load(Ordering::Relaxed)
    }

    /// True once the server was a replica of another master since the attempt that won the
    /// current grant began (a plain URL's server; behind Sentinel the master is found again, and a
    /// cluster's replicas are followed). Seen two ways: it refused a call as a replica, or it was
    /// promoted under the same run id since the last read (a `REPLICAOF` and a `REPLICAOF NO ONE`
    /// both between two renewals, which no call saw; see [`Node::note_history`]). Whatever it
    /// holds since came from that master, and stays that master's copy after a promotion back: a
    /// holder's renewals do not count there again (see [`super::Engine::renew_grant`]). Seen in
    /// the winning attempt's own replies, it counts too: the flip may have come between the grant's
    /// script and the `INFO` read with it.
    pub fn was_replica(&self) -> bool {
        self.was_replica
    }

    /// An attempt at a grant begins: a demotion seen before it (while waiting, the node refused)
    /// does not concern a grant the node votes for now.
    pub fn begin_attempt(&mut self) {
        self.was_replica = false;
    }

    /// Keeps the server's replication history from an `INFO` that has it, and tells a promotion
    /// under the same run id since the last read. A master's `master_replid` changes in three
    /// cases: it is promoted (`REPLICAOF NO ONE`; the old id becomes its `master_replid2`), it
    /// follows another master (it takes that one's, and says `role:slave`), or it makes its backlog
    /// for a first replica, or for one that comes after the backlog was freed (a new id, and
    /// `master_replid2` cleared to zeros). Only the first two are a demotion; the third is a
    /// replica attached under a holder, which must not end its lease. A restart (a new run id) is
    /// the restart rules' (`renew.lua`), and a refusal as a replica resets the history: the
    /// promotion that follows is known already. Only a plain URL's server: behind Sentinel a
    /// failover is followed, and a cluster node's replicas are too.
    fn note_history(&mut self, info: &Info) {
        let (Some(replid), Some(run_id)) = (info.master_replid, self.run_id.as_deref()) else {
            return;
        };
        if !self.endpoint.is_standalone() || info.cluster_enabled == Some(b"1") {
            return;
        }
        let demoted = info.role == Some(b"slave")
            || info
                .master_replid2
                .is_some_and(|id| id.iter().any(|&b| b != b'0'));
        if let Some((seen_run, seen_replid)) = &self.history {
            if seen_run == run_id && seen_replid.as_bytes() == replid {
                // Every renewal reads it: nothing to copy when nothing changed.
                return;
            }
            if seen_run == run_id && demoted {
                trace!(
                    "{}: the server's replication id changed ({seen_replid} to {}): it followed \
                     another master, or was promoted, since the last read",
                    self.display,
                    String::from_utf8_lossy(replid)
                );
                self.was_replica = true;
            }
        }
        self.history = Some((
            run_id.to_string(),
            String::from_utf8_lossy(replid).into_owned(),
        ));
    }

    /// The client, for callers that need a connection of their own (pub/sub).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// True when the last command timed out and its reply is still owed.
    pub fn is_stale(&self) -> bool {
        self.owed.writes > 0 || self.left_behind
    }

    /// The node timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Lets this node connect to a replica, for `doctor`, which reports a replica rather than stops
    /// at it (writes there still fail, READONLY).
    pub fn accept_replica(&mut self) {
        self.accept_replica = true;
    }

    /// The run id of the server this node talks to, once it answered: after a redirect, the slot's
    /// owner; behind Sentinel, the master. Two nodes with one run id are one vote counted twice.
    pub fn server_id(&self) -> Option<&str> {
        self.run_id.as_deref()
    }

    /// What stands behind this node, for `doctor`: `standalone`, `cluster` or `sentinel`, and the
    /// server it talks to now (`host:port`).
    pub fn topology(&self) -> (&'static str, String) {
        let kind = match &self.endpoint {
            Endpoint::Standalone(_) => "standalone",
            Endpoint::Cluster(_) => "cluster",
            Endpoint::Sentinel(_) => "sentinel",
        };
        (kind, super::endpoint::addr_of(&self.client))
    }

    /// The masters of the Redis Cluster this node belongs to (`host:port`, from `CLUSTER NODES`);
    /// empty when it is not a cluster node.
    pub fn cluster_masters(&mut self) -> Result<Vec<String>, NodeFailure> {
        let enabled = self.call("INFO cluster", |c| {
            redis::cmd("INFO").arg("cluster").query::<Value>(c)
        })?;
        if Info::of(&enabled).cluster_enabled != Some(b"1") {
            return Ok(Vec::new());
        }
        let nodes = self.call("CLUSTER NODES", |c| {
            redis::cmd("CLUSTER").arg("NODES").query::<String>(c)
        })?;
        // `<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <state> <slots...>`
        let mut masters: Vec<String> = nodes
            .lines()
            .filter_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let flags = f.get(2)?;
                let serves = f.len() > 8;
                (flags.split(',').any(|x| x == "master") && !flags.contains("fail") && serves)
                    .then(|| f[1].split(['@', ',']).next().unwrap_or("").to_string())
            })
            .filter(|a| !a.is_empty())
            .collect();
        masters.sort();
        Ok(masters)
    }

    /// A node for the server at `addr` (`host:port`) with this node's credentials, TLS and timeout:
    /// one master of a cluster, for `list` and `doctor`.
    pub fn at(&self, addr: &str) -> Result<Node, NodeFailure> {
        let client = super::endpoint::client_at(&self.client, addr).map_err(|e| NodeFailure {
            reason: format!("{}: cluster node {addr}: {e}", self.display),
            maybe_applied: false,
        })?;
        Ok(Node {
            display: format!("{} (master {addr})", self.display),
            endpoint: Endpoint::Standalone(super::endpoint::standalone::Standalone::new(&client)),
            client,
            secret_url: self.secret_url.clone(),
            conn: None,
            owed: Owed::default(),
            sending: SERVER_READ,
            left_behind: false,
            timeout: self.timeout,
            until: None,
            pending: Mutex::new(None),
            replicas: None,
            want_replicas: self.want_replicas,
            seen: std::collections::HashMap::new(),
            refused: AtomicBool::new(false),
            run_id: None,
            tick: DEFAULT_TICK,
            accept_replica: false,
            checked: false,
            was_replica: false,
            history: None,
        })
    }

    /// Bounds every later call to end by `until` too (`None`: the node timeout alone).
    pub fn limit(&mut self, until: Option<Stamp>) {
        self.until = until;
    }

    /// The time one call may take from now: the node timeout, or less if the limit is nearer.
    fn budget(&self) -> Duration {
        self.until
            .map_or(self.timeout, |until| self.timeout.min(until.remaining()))
    }

    /// Opens a new connection, within the node timeout.
    pub fn open(&self) -> Result<Connection, NodeFailure> {
        self.open_by(Instant::now() + self.budget())
    }

    /// Opens a new connection by `deadline`, with read and write timeouts set.
    fn open_by(&self, deadline: Instant) -> Result<Connection, NodeFailure> {
        let started = Instant::now();
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let conn = connect(&self.client, deadline, &mut pending)
            .and_then(|c| bounded(c, self.timeout))
            .map_err(|e| NodeFailure {
                reason: self.describe(&e, "cannot connect"),
                maybe_applied: false,
            })?;
        trace!("{}: connected in {:.3} ms", self.display, ms(started));
        Ok(conn)
    }

    /// Runs `f` on this node's connection, opening it if needed; connecting, following redirects and
    /// `f` together end within the node timeout (and by the limit, if one is set).
    pub fn call<T>(
        &mut self,
        what: &str,
        f: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, NodeFailure> {
        let mut f = f;
        self.sending = SERVER_READ;
        self.call_with(what, false, |c, _| (f(c), None))
    }

    /// [`Node::call`]; `durable`: a write that must reach the master's replicas before it counts.
    /// `f` is told which `INFO` it may send right behind its command, in the same write, and return
    /// the reply of (see [`Node::eval`]): all of it when the connection is new and its server not yet
    /// checked; the replication section when a durable write goes out on a kept connection, so that
    /// counting the replicas for `WAIT` costs no round trip of its own.
    fn call_with<T>(
        &mut self,
        what: &str,
        durable: bool,
        f: impl FnMut(&mut Connection, Along) -> (RedisResult<T>, Option<RedisResult<Value>>),
    ) -> Result<T, NodeFailure> {
        let result = self.exchange(what, durable, f);
        // A count of replicas serves only the call whose write read it: one left by a call that
        // failed, or that wrote nothing durable, would let a later grant skip a replica that
        // joined meanwhile.
        self.replicas = None;
        result
    }

    fn exchange<T>(
        &mut self,
        what: &str,
        durable: bool,
        mut f: impl FnMut(&mut Connection, Along) -> (RedisResult<T>, Option<RedisResult<Value>>),
    ) -> Result<T, NodeFailure> {
        let budget = self.budget();
        let deadline = Instant::now() + budget;
        if self.is_stale() {
            self.conn = None;
            self.owed = Owed::default();
            self.left_behind = false;
        }
        if budget.is_zero() {
            return Err(NodeFailure {
                reason: format!("{}: no time left for {what}", self.display),
                maybe_applied: false,
            });
        }
        let started = Instant::now();
        // Once a send may have reached a server, a later failure may leave its effect behind.
        let mut sent = false;
        let mut resent = false;
        let mut rediscovered = false;
        let mut hops = 0;
        // A redirect to an address that is not `host:port`: a misconfigured cluster.
        let mut unfollowable = false;
        let mut ask: Option<Connection> = None;
        let result = loop {
            if ask.is_none() && self.conn.is_none() {
                match self.connect_target(deadline) {
                    Ok(c) => {
                        self.conn = Some(c);
                        self.checked = false;
                    }
                    Err(mut fail) => {
                        fail.maybe_applied |= sent;
                        return Err(fail);
                    }
                }
            }
            let (result, asked, info) = match ask.take() {
                Some(mut c) => (
                    run_by(&mut c, deadline, &mut |c: &mut Connection| {
                        redis::cmd("ASKING").query::<()>(c)
                    })
                    .and_then(|_| run_by(&mut c, deadline, &mut |c| f(c, Along::Nothing).0)),
                    true,
                    None,
                ),
                None => {
                    let along = if !self.checked {
                        Along::All
                    } else if durable && self.replicas.is_none() {
                        Along::Replication
                    } else {
                        Along::Nothing
                    };
                    let conn = self.conn.as_mut().expect("connection just opened");
                    let (result, info) = match limit_by(conn, deadline) {
                        Ok(()) => f(conn, along),
                        Err(e) => (Err(e), None),
                    };
                    let demoted = match &info {
                        Some(Ok(v)) if along == Along::Replication => {
                            let read = Info::of(v);
                            self.replicas = Some(read.online_replicas);
                            self.note_history(&read);
                            read.role == Some(b"slave")
                        }
                        _ => false,
                    };
                    if demoted {
                        // The master this connection was checked on has become a replica (a
                        // `REPLICAOF` by hand or a failover that kept the connection): checked
                        // again with this reply, it is refused, or behind Sentinel the master
                        // is found again, as on a new connection. A replica that accepts writes
                        // ran the script; the failure says so and the grant is rolled back.
                        self.checked = false;
                        (result, false, info)
                    } else if along == Along::Replication {
                        // Unread or failed: `replicate` asks on its own and reports the failure.
                        (result, false, None)
                    } else {
                        (result, false, info)
                    }
                }
            };
            sent = true;
            // A reply, or READONLY (a replica: say which master it follows, or find the master).
            let answered = match &result {
                Ok(_) => true,
                Err(e) => is_readonly(e),
            };
            if answered && !asked && !self.checked {
                match self.check_server(deadline, info) {
                    Ok(()) => self.checked = true,
                    Err(Check::Rediscover) if !rediscovered => {
                        rediscovered = true;
                        self.conn = None;
                        self.endpoint.lost();
                        continue;
                    }
                    Err(Check::Rediscover) => {
                        self.refused.store(false, Ordering::Relaxed);
                        return Err(NodeFailure {
                            reason: format!(
                                "{}{}: the Sentinels name a replica as the master (a failover \
                                 under way?)",
                                self.display,
                                self.endpoint.describe_target()
                            ),
                            maybe_applied: true,
                        });
                    }
                    // The command's reply was read, INFO's was not: the connection owes it. The
                    // command goes again on a new connection (it leaves the same state, and a
                    // release answers from its record), whose INFO checks the server.
                    Err(Check::Cut) => {
                        trace!("{}: INFO cut by a stop; sending again", self.display);
                        resent = true;
                        self.conn = None;
                        continue;
                    }
                    Err(Check::Fail(fail)) => return Err(fail),
                }
            }
            match result {
                Err(e) if !e.is_timeout() && (e.is_connection_dropped() || e.is_io_error()) => {
                    // A read cut by a stop of lockctl (EINTR) says nothing about the server, and
                    // each one takes a stop of its own: sent again while the call has time left, or
                    // two stops in a row failed a call that ran (`lockctl release` exit 69).
                    if asked || (resent && !is_interrupted(&e)) {
                        break Err(e);
                    }
                    trace!("{}: connection dropped ({e}); reconnecting", self.display);
                    resent = true;
                    self.conn = None;
                    self.left_behind |= is_interrupted(&e);
                    // The server is where it was: going back to the URL's node (a cluster's seed,
                    // the Sentinels) cost each cut read a redirect, and five stops in one call
                    // made it a redirect loop (78).
                    if !is_interrupted(&e) {
                        self.endpoint.lost();
                    }
                }
                Err(e) if e.redirect_node().is_some() && hops < MAX_REDIRECTS => {
                    hops += 1;
                    let (addr, slot) = e.redirect_node().expect("checked");
                    let addr = addr.to_string();
                    let is_ask = e.code() == Some("ASK");
                    trace!(
                        "{}: slot {slot} {} {addr}",
                        self.display,
                        if is_ask { "asks for" } else { "moved to" }
                    );
                    if is_ask {
                        let left = left(deadline);
                        match self.endpoint.ask(&addr).and_then(|client| {
                            client
                                .get_connection_with_timeout(left)
                                .and_then(|c| bounded(c, left))
                        }) {
                            Ok(c) => ask = Some(c),
                            Err(e) => {
                                unfollowable = e.kind() == redis::ErrorKind::InvalidClientConfig;
                                break Err(e);
                            }
                        }
                    } else {
                        match self.endpoint.moved(&addr) {
                            Ok(client) => {
                                self.client = client;
                                self.conn = None;
                                self.replicas = None;
                            }
                            Err(e) => {
                                unfollowable = true;
                                break Err(e);
                            }
                        }
                    }
                }
                Err(e)
                    if is_readonly(&e)
                        && !rediscovered
                        && self.endpoint.on_replica() == OnReplica::Rediscover =>
                {
                    trace!(
                        "{}: the master became a replica; asking again",
                        self.display
                    );
                    rediscovered = true;
                    self.conn = None;
                    self.endpoint.lost();
                }
                Ok(v) if durable && !asked => match self.replicate(deadline) {
                    Ok(()) => break Ok(v),
                    // The read of INFO or WAIT cut by a stop of lockctl: the connection owes that
                    // reply, and a WAIT on a new one would not wait for this write. The command
                    // goes again on a new connection (it leaves the same state) and waits there.
                    Err(None) => {
                        trace!("{}: WAIT cut by a stop; sending again", self.display);
                        resent = true;
                        self.conn = None;
                    }
                    Err(Some(fail)) => return Err(fail),
                },
                other => break other,
            }
        };
        match result {
            Ok(v) => {
                // Answered: what a cut read left behind ran first or leaves the same state.
                self.left_behind = false;
                trace!("{}: {what} in {:.3} ms", self.display, ms(started));
                Ok(v)
            }
            Err(e) => {
                let mut fail = self.failure(&e, what, budget);
                if unfollowable {
                    self.refused.store(true, Ordering::Relaxed);
                    fail.reason.push_str(
                        " (refused: the cluster redirected to an address that is not host:port; \
                         check cluster-announce-ip and cluster-announce-port)",
                    );
                }
                if hops >= MAX_REDIRECTS && e.redirect_node().is_some() {
                    self.refused.store(true, Ordering::Relaxed);
                    fail.reason.push_str(&format!(
                        " (still redirected after {MAX_REDIRECTS} hops: the cluster's slot map is \
                         changing or inconsistent; check CLUSTER SHARDS)"
                    ));
                }
                fail.maybe_applied |= resent;
                trace!(
                    "{}: {what} failed after {:.3} ms: {}",
                    self.display,
                    ms(started),
                    fail.reason
                );
                Err(fail)
            }
        }
    }

    /// A new connection to the endpoint's current server; a cluster's other seeds are tried when it
    /// cannot be reached, each within what is left of the node timeout.
    fn connect_target(&mut self, deadline: Instant) -> Result<Connection, NodeFailure> {
        self.client = self
            .endpoint
            .target(left(deadline))
            .map_err(|e| self.endpoint_failure(e))?;
        let mut fail = match self.open_by(deadline) {
            Ok(c) => return Ok(c),
            Err(fail) => fail,
        };
        let mut reasons = vec![fail.reason.clone()];
        for _ in 0..self.endpoint.alternatives() {
            self.endpoint.lost();
            if Instant::now() >= deadline {
                break;
            }
            self.client = self
                .endpoint
                .target(left(deadline))
                .map_err(|e| self.endpoint_failure(e))?;
            match self.open_by(deadline) {
                Ok(c) => return Ok(c),
                Err(f) => reasons.push(f.reason),
            }
        }
        self.endpoint.lost();
        fail.reason = reasons.join("; ");
        Err(fail)
    }

    /// The first reply on a new connection is followed by `INFO` ([`CHECKED_SECTIONS`]): the
    /// server's role (a replica is refused, or behind Sentinel the master is asked for again), its
    /// replicas in sync, whether it is a cluster node, and its run id. It comes after the first
    /// command rather than before, so that a command to a server that stopped answering is on its way
    /// all the same, as it would be on an old connection. `sent`: its reply, when the first command
    /// sent it along (one round trip for both); otherwise it is asked for here.
    fn check_server(
        &mut self,
        deadline: Instant,
        sent: Option<RedisResult<Value>>,
    ) -> Result<(), Check> {
        let conn = self.conn.as_mut().expect("connection in use");
        let info = sent.unwrap_or_else(|| {
            run_by(conn, deadline, &mut |c: &mut Connection| {
                c.send_packed_command(&info_commands(&CHECKED_SECTIONS))?;
                read_sections(c, CHECKED_SECTIONS.len())
            })
        });
        let reply = match info {
            Ok(v) => v,
            Err(e) if is_interrupted(&e) => return Err(Check::Cut),
            Err(e) => {
                let budget = self.budget();
                let mut fail = self.failure(&e, "INFO", budget);
                fail.maybe_applied = true;
                return Err(Check::Fail(fail));
            }
        };
        let info = Info::of(&reply);
        // `INFO replication` (a kept connection's check) has no run id: the one read keeps.
        if info.run_id.is_some() {
            self.run_id = info_text(info.run_id);
        }
        if let Some(tick) = info.tick() {
            self.tick = tick;
        }
        self.note_history(&info);
        let clustered = info.cluster_enabled == Some(b"1");
        self.replicas = Some(info.online_replicas);
        if info.role != Some(b"slave") || clustered {
            // A cluster replica redirected the command to its master already.
            return Ok(());
        }
        let master = format!(
            "{}:{}",
            info_text(info.master_host).as_deref().unwrap_or("?"),
            info_text(info.master_port).as_deref().unwrap_or("?")
        );
        if self.endpoint.on_replica() == OnReplica::Rediscover {
            trace!(
                "{}: {} is a replica of {master}; asking the Sentinels again",
                self.display,
                super::endpoint::addr_of(&self.client)
            );
            return Err(Check::Rediscover);
        }
        if self.accept_replica {
            return Ok(());
        }
        self.refused.store(true, Ordering::Relaxed);
        self.was_replica = true;
        self.history = None;
        Err(Check::Fail(NodeFailure {
            reason: format!(
                "{}{}: refused: this is a replica of {master}, which cannot hold locks; use the \
                 master, or a redis+sentinel://SENTINEL:PORT/MASTER URL that finds it",
                self.display,
                self.endpoint.describe_target()
            ),
            maybe_applied: true,
        }))
    }

    /// After a grant or renewal on the master: waits until its replicas have it (`WAIT`), within the
    /// node timeout. A master that lost its replicas to a failover is asked about again next time.
    /// `Err(None)`: a read was cut by a stop of lockctl (`EINTR`), which says nothing of the replicas.
    fn replicate(&mut self, deadline: Instant) -> Result<(), Option<NodeFailure>> {
        let budget = self.budget();
        let conn = self.conn.as_mut().expect("connection in use");
        let connected = match self.replicas.take() {
            // Read on connect, or in the write that carried this grant or renewal.
            Some(n) => n,
            None => match run_by(conn, deadline, &mut |c: &mut Connection| {
                redis::cmd("INFO").arg("replication").query::<Value>(c)
            }) {
                Ok(v) => Info::of(&v).online_replicas,
                Err(e) if is_interrupted(&e) => return Err(None),
                Err(e) => return Err(Some(self.failure(&e, "INFO replication", budget))),
            },
        };
        // Fewer replicas than this master had before: one may have been promoted, and a write
        // acknowledged by the others would not be on the new master. Only `?replicas=N` overrides it.
        let addr = super::endpoint::addr_of(&self.client);
        let seen = self.seen.entry(addr).or_insert(0);
        let need = self.want_replicas.unwrap_or(connected.max(*seen));
        *seen = (*seen).max(connected);
        if need == 0 {
            return Ok(());
        }
        let wait_ms = (wait_for(left(deadline), self.tick).as_millis() as u64).max(1);
        let conn = self.conn.as_mut().expect("connection in use");
        let acked = if connected < need {
            Ok(connected as i64)
        } else {
            run_by(conn, deadline, &mut |c: &mut Connection| {
                redis::cmd("WAIT").arg(need).arg(wait_ms).query::<i64>(c)
            })
        };
        match acked {
            Ok(n) if n >= need as i64 => {
                trace!("{}: {n} replica(s) acknowledged", self.display);
                Ok(())
            }
            Ok(n) => {
                // Replicas gone or lagging: a failover may be under way. Start afresh next time.
                self.conn = None;
                self.endpoint.lost();
                Err(Some(NodeFailure {
                    reason: format!(
                        "{}{}: only {n} of {need} replica(s) acknowledged the write within the \
                         node timeout ({} connected); a failover could lose it",
                        self.display,
                        self.endpoint.describe_target(),
                        connected
                    ),
                    maybe_applied: true,
                }))
            }
            Err(e) if is_interrupted(&e) => Err(None),
            Err(e) => {
                let mut fail = self.failure(&e, "WAIT", budget);
                fail.maybe_applied = true;
                Err(Some(fail))
            }
        }
    }

    fn endpoint_failure(&self, e: EndpointError) -> NodeFailure {
        self.refused.store(e.refused, Ordering::Relaxed);
        NodeFailure {
            reason: format!("{}: {}", self.display, e.text),
            maybe_applied: false,
        }
    }

    /// Runs a lockctl script on this node. A grant or renewal (acquire, fence, renew) on a master with
    /// replicas counts only once they have it (see [`super::endpoint`]).
    pub fn eval(
        &mut self,
        what: &str,
        script: &super::LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, NodeFailure> {
        let durable = script.durable;
        let source = Some(script.source);
        let sizes = || keys.iter().chain(args).map(|a| a.len());
        // `INFO` may go along in the same write: at most the check's three sections.
        self.sending = packed_len([7, 40, 2].into_iter().chain(sizes()))
            + CHECKED_SECTIONS
                .iter()
                .map(|section| packed_len([4, section.len()]))
                .sum::<usize>();
        let fell_back = std::cell::Cell::new(false);
        let eval_source = |conn: &mut Connection, e: RedisError| match source {
            Some(source) => redis::cmd("EVAL")
                .arg(source)
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .query(conn),
            None => Err(e),
        };
        let eval_source = |conn: &mut Connection, e: RedisError| {
            fell_back.set(true);
            eval_source(conn, e)
        };
        let result = self.call_with(what, durable, |conn, along| {
            if along != Along::Nothing {
                return evalsha_then_info(conn, script, keys, args, along, eval_source);
            }
            let evalsha = redis::cmd("EVALSHA")
                .arg(script.sha1)
                .arg(keys.len())
                .arg(keys)
                .arg(args)
                .query(conn);
            let result = match evalsha {
                // A server that never saw the script (new, restarted, flushed): its source, which
                // also caches it there, in one round trip rather than `SCRIPT LOAD` and a retry.
                Err(e) if e.code() == Some("NOSCRIPT") => eval_source(conn, e),
                other => other,
            };
            (result, None)
        });
        if fell_back.get() && self.is_stale() {
            // What is owed is the script's text, sent after the NOSCRIPT reply was read.
            self.owed = Owed::default();
            self.owed.add(packed_len(
                [4, source.map_or(0, str::len), 2]
                    .into_iter()
                    .chain(sizes()),
            ));
        }
        result.map_err(|mut fail| {
            // A script stops at the command that failed; the ones before it stay applied. Not so
            // for a channel the ACL refuses: every PUBLISH that may be refused comes before the
            // script's first write (the probe, acquire.lua).
            if fail.reason.contains("@user_script") && !is_channel_refusal(&fail.reason) {
                fail.maybe_applied = true;
            }
            if let Some(which) = source.and_then(|s| script_command(&fail.reason, s)) {
                // Named first, before the fix: "refused: ... [INFO] (the ACL user lacks ...)".
                let after = fail.reason.find("refused: ").unwrap_or(0);
                match fail.reason[after..].find(" (").map(|i| i + after) {
                    Some(at) => fail.reason.insert_str(at, &which),
                    None => fail.reason.push_str(&which),
                }
            }
            fail
        })
    }

    /// As [`Node::eval`], for a script that may run late, and twice, with no harm (a release, a
    /// rollback, a leave): when the call times out, it waits in a stopped server's socket as
    /// EVALSHA, which a server that never ran the script answers NOSCRIPT to nobody at its resume;
    /// the script's text then follows on that connection ([`Node::send_only`]), so that it runs.
    pub fn eval_even_late(
        &mut self,
        what: &str,
        script: &super::LuaScript,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, NodeFailure> {
        let result = self.eval(what, script, keys, args);
        if result.is_err() && self.is_stale() {
            self.send_only(script.source, keys, args);
        }
        result
    }

    /// Sends a script without waiting for its reply (a rollback to a node that timed out, a waiter's
    /// leave on a signal); the connection then owes replies and serves only further sends of this
    /// kind. The script text goes along (EVAL), since no NOSCRIPT reply would be read. With no
    /// connection, one is opened within the node timeout: a stopped server's kernel still accepts it
    /// and keeps what is sent, which the server runs when it resumes. The text goes without its
    /// comment lines ([`compact`]).
    ///
    /// True when it went out where the server will read it (it may still lose it: see [`compact`]).
    /// Over TLS each send is a record of its own, and a stopped server reads, of a connection closed
    /// before it resumed, no more than its first two records (Redis 7.0: two of three and two of
    /// five, 5 runs of 5 each; plain TCP ran all five): a third write behind the command that timed
    /// out (the waiter's leave behind its attempt and that attempt's rollback, which lockctl's exit
    /// then closes) still goes out, but counts as not sent.
    pub fn send_only(&mut self, source: &str, keys: &[&str], args: &[&str]) -> bool {
        if self.conn.is_none() {
            let deadline = Instant::now() + self.budget();
            if let Ok(c) = self.connect_target(deadline) {
                self.conn = Some(c);
            }
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(compact(source)).arg(keys.len()).arg(keys).arg(args);
        let packed = cmd.get_packed_command();
        let sent = self
            .conn
            .as_mut()
            .is_some_and(|conn| conn.send_packed_command(&packed).is_ok());
        if !sent {
            self.conn = None;
            self.owed = Owed::default();
            return false;
        }
        // Kept for what else goes out without waiting (a waiter's leave after the rollback of its
        // grant), so that the server runs it after this; the next call with a reply reconnects.
        self.owed.add(packed.len());
        if !self.owed.all_read(is_tls(&self.client)) {
            trace!(
                "{}: sent without waiting, as write {} ({} bytes owed) behind an unanswered \
                 one: a stopped server does not read that far into a connection closed before \
                 it resumed",
                self.display,
                self.owed.writes,
                self.owed.bytes
            );
            return false;
        }
        trace!("{}: sent without waiting", self.display);
        true
    }

    /// [`Node::send_only`] on a new connection, to a node whose last command timed out (a
    /// rollback, behind the attempt that timed out: see `Engine::rollback`). The new connection
    /// then serves what else goes out without waiting, in order behind this; the old one is closed.
    /// A stopped server's kernel accepts the connection, so it costs no round trip. A handshake that
    /// needs an answer goes along instead, in the same write: `AUTH` and `SELECT`, which the server
    /// runs before the script (a 480-byte name's rollback fell past the first read of the old
    /// connection, which alone carried it, and a grant nobody held kept the lock for its TTL). Only
    /// when the old connection cannot carry it, though: the script runs whatever that `AUTH`
    /// answers, so where it fails (the user's password changed while lockctl ran) it runs as the
    /// `default` user, if that user may (docs/security.md). Behind `AUTH` the server reads no
    /// further than its first read (its reply ends a closed connection): a script past 16 KB there
    /// is lost. Not TLS, whose handshake a stopped server never completes: the old connection alone
    /// carries the send there. A connect that fails (within the node timeout) loses it the same
    /// way. True when it went out where the server reads it.
    pub fn send_on_new(&mut self, source: &str, keys: &[&str], args: &[&str]) -> bool {
        if is_tls(&self.client) {
            trace!(
                "{}: no new connection (its TLS handshake waits for the server's answer)",
                self.display
            );
            return false;
        }
        let info = self.client.get_connection_info().clone();
        let settings = info.redis_settings().clone();
        let handshake = settings.password().is_some() || settings.db() != 0;
        if handshake && self.conn.is_some() && self.owed.all_read(false) {
            // The old connection carries it where the server reads it; an `AUTH` whose answer
            // nobody reads is sent only when it must be (see below).
            trace!(
                "{}: no new connection (the old one carries it)",
                self.display
            );
            return false;
        }
        let mut packed = Vec::new();
        if let Some(password) = settings.password() {
            let mut auth = redis::cmd("AUTH");
            auth.arg(settings.username()).arg(password);
            packed.extend(auth.get_packed_command());
        }
        if settings.db() != 0 {
            packed.extend(redis::cmd("SELECT").arg(settings.db()).get_packed_command());
        }
        let bare =
            info.set_redis_settings(redis::RedisConnectionInfo::default().set_skip_set_lib_name());
        let Ok(client) = Client::open(bare) else {
            return false;
        };
        let deadline = Instant::now() + self.budget();
        let conn = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            connect(&client, deadline, &mut pending).and_then(|c| bounded(c, self.timeout))
        };
        let Ok(mut conn) = conn else {
            return false;
        };
        // The handshake's commands count as the first write: their reply, which a closed
        // connection cannot take, ends what the server reads of it.
        let mut owed = Owed::default();
        if !packed.is_empty() {
            owed.add(packed.len());
        }
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(compact(source)).arg(keys.len()).arg(keys).arg(args);
        let script = cmd.get_packed_command();
        owed.add(script.len());
        packed.extend(script);
        if conn.send_packed_command(&packed).is_err() {
            return false;
        }
        self.conn = Some(conn);
        self.owed = owed;
        if !self.owed.all_read(false) {
            trace!(
                "{}: sent on a new connection too, without waiting, past the server's first \
                 read behind AUTH or SELECT ({} bytes)",
                self.display,
                self.owed.bytes
            );
            return false;
        }
        trace!(
            "{}: sent on a new connection too, without waiting",
            self.display
        );
        true
    }

    fn failure(&mut self, e: &RedisError, what: &str, budget: Duration) -> NodeFailure {
        // `describe` sets it again for a refusal.
        self.refused.store(false, Ordering::Relaxed);
        if e.is_timeout() {
            self.owed = Owed::default();
            self.owed.add(self.sending);
            let within = if budget < self.timeout {
                format!("the time left on the lease ({} ms)", budget.as_millis())
            } else {
                format!(
                    "the node timeout ({})",
                    humantime::format_duration(self.timeout)
                )
            };
            NodeFailure {
                reason: format!(
                    "{}{}: no answer to {what} within {within}{}",
                    self.display,
                    self.endpoint.describe_target(),
                    if self.display.starts_with("rediss") {
                        " (a stopped server, or a port that does not speak TLS?)"
                    } else {
                        ""
                    }
                ),
                maybe_applied: true,
            }
        } else if e.is_io_error() || e.is_connection_dropped() {
            self.conn = None;
            self.endpoint.lost();
            NodeFailure {
                reason: self.describe(e, what),
                maybe_applied: true,
            }
        } else {
            NodeFailure {
                reason: self.describe(e, what),
                maybe_applied: false,
            }
        }
    }

    /// An error message that never contains the URL's secrets. A refusal (see [`refusal`]) marks the
    /// node as refusing and says what to fix.
    fn describe(&self, e: &RedisError, what: &str) -> String {
        let mut text = e.to_string().replace(&self.secret_url, &self.display);
        // No server or library message is known to echo the password; this makes sure none does.
        if let Some(pw) = self
            .client
            .get_connection_info()
            .redis_settings()
            .password()
        {
            if pw.len() >= 4 && text.contains(pw) {
                text = text.replace(pw, "***");
            }
        }
        if e.kind() == redis::ErrorKind::Parse && text.contains("Parse error at") {
            // The reply could not be read as RESP at all: the bytes the parser choked on mean
            // nothing to the user, the port does.
            self.refused.store(false, Ordering::Relaxed);
            return format!(
                "{}: {what}: this does not look like a Redis server: it answered with something \
                 other than the Redis protocol (an HTTP server?); check the host and port",
                self.display
            );
        }
        // The server quotes the first arguments of an unknown command: a script hash, keys, a token.
        if let Some(cut) = text.find(", with args beginning with") {
            text.truncate(cut);
        }
        let node = format!("{}{}", self.display, self.endpoint.describe_target());
        let refused = refusal(e, &text);
        self.refused.store(refused.is_some(), Ordering::Relaxed);
        if let Some(fix) = refused {
            return format!("{node}: {what}: refused: {text}{fix}");
        }
        let hint = hint(e, &text, self.display.starts_with("rediss"));
        format!("{node}: {what}: {text}{hint}")
    }
}

/// The rules an ACL user needs, for the default prefix (see docs/security.md for another).
pub const ACL_RULES: &str = "~lockctl:* ~{lockctl:* ~{*}?lockctl:* &lockctl:* &{lockctl:* \
    &{*}?lockctl:* &__keyspace@*__:lockctl:* +evalsha +eval +script|load +subscribe +get +set +incr \
    +hset +hmget +hgetall +pttl +pexpire +del +publish +info +time +wait +scan +ping +role \
    +config|get +exists +hget +hdel +zadd +zrem +zrange +zrangebyscore +zrank +zscore +zcount +zcard \
    +pubsub|numsub";

/// The channel rules of [`ACL_RULES`].
pub const ACL_CHANNELS: &str = "&lockctl:* &{lockctl:* &{*}?lockctl:* &__keyspace@*__:lockctl:*";

/// A refusal for want of a channel rule (`&`): PUBLISH or SUBSCRIBE directly (NOPERM), or PUBLISH in
/// a script, as Redis 6.2, Redis 7 and Valkey word them.
pub(crate) fn is_channel_refusal(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    text.contains("can't publish to the channel")
        || text.contains("permissions to access a channel")
        || text.contains("permissions to access one of the channels")
}

/// A script's text without its comment lines, for what goes out without waiting. A waiter that
/// stops during a node's stall leaves behind, on one connection, its last attempt, a rollback and
/// its leave, and the server runs them when it resumes; the connection is closed by then, and the
/// server stops with the first reply it cannot write, so only what its first read takes in (16 KB)
/// runs. With the comments the rollback and the leave came to 16 KB, and the leave was lost.
fn compact(source: &str) -> String {
    source
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            !l.is_empty() && !l.starts_with("--")
        })
        .flat_map(|l| [l, "\n"])
        .collect()
}

/// When a node answered but refuses, what to fix; `None` for everything else. These replies come
/// back the same until someone changes the setup, so they exit 78 rather than 69.
fn refusal(e: &RedisError, text: &str) -> Option<String> {
    let code = e.code().unwrap_or("");
    let fix = if e.kind() == redis::ErrorKind::AuthenticationFailed || code == "WRONGPASS" {
        " (wrong user or password: check the user and password in the URL)".to_string()
    } else if code == "NOAUTH" || text.contains("unauthenticated") {
        " (the server requires a password: redis://:PASSWORD@host or redis://USER:PASSWORD@host)"
            .to_string()
    } else if is_channel_refusal(text) {
        format!(
            " (the ACL user may not PUBLISH on lockctl's channels, which every release, break \
             and wait uses: it needs the command +publish and, for the default prefix, the \
             channel rules {ACL_CHANNELS} (Redis 7 and Valkey give a new user no channel: \
             acl-pubsub-default); this command changed nothing on this node, so a lock it was to \
             release or break is still held here. All it needs: {ACL_RULES}; see the ACL recipe \
             in docs/security.md)"
        )
    } else if code == "NOPERM"
        || text.contains("can't run this command")
        || text.contains("can't access at least one of the")
        || text.to_ascii_lowercase().contains("no permissions to")
    {
        format!(
            " (the ACL user lacks a command, key or channel lockctl needs; for the default prefix \
             it needs: {ACL_RULES}; see the ACL recipe in docs/security.md)"
        )
    } else if code == "READONLY" || text.contains("READONLY You can't write") {
        " (this is a replica; use the master, or a redis+sentinel://SENTINEL:PORT/MASTER URL that \
         finds it)"
            .to_string()
    } else if text.contains("unknown command")
        || text.contains("Unknown Redis command")
        || text.contains("Unknown command called from script")
    {
        " (the command is renamed or disabled on this server (rename-command); lockctl needs EVAL, \
         EVALSHA, SCRIPT LOAD, INFO, WAIT and the commands its scripts run under their own names)"
            .to_string()
    } else if code == "CROSSSLOT" {
        " (the lock's keys are in different cluster slots; use a name without '{' or '}')"
            .to_string()
    } else if e.redirect_node().is_some() {
        " (a redirect that could not be followed)".to_string()
    } else {
        return None;
    };
    Some(fix)
}

/// A write refused by a replica: `READONLY`, or (Redis 6.2) a script error that quotes it.
fn is_readonly(e: &RedisError) -> bool {
    e.code() == Some("READONLY") || e.to_string().contains("READONLY You can't write")
}

/// For an error raised by a command inside one of lockctl's scripts, which command it was: the
/// server names the script's line (`@user_script:N`), and that line of the source names the command.
fn script_command(reason: &str, source: &str) -> Option<String> {
    let at = reason.find("@user_script:")? + "@user_script:".len();
    let line: usize = reason[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    let text = source.lines().nth(line.checked_sub(1)?)?;
    let commands: Vec<String> = text
        .split("redis.call(")
        .skip(1)
        .filter_map(|c| {
            c.trim_start()
                .strip_prefix('\'')
                .map(|c| c.split('\'').next().unwrap_or("").to_string())
        })
        .filter(|c| !c.is_empty())
        .collect();
    match commands.as_slice() {
        [] => None,
        [one] => Some(format!(" [the command the script could not run: {one}]")),
        many => Some(format!(
            " [the script could not run one of: {}]",
            many.join(", ")
        )),
    }
}

/// What lockctl reads of an `INFO` reply, found in one pass over its lines and borrowed from it.
/// A new connection's `INFO` had every default section (about 5 KB, 200 lines; now about 1 KB),
/// and copying each line into a pair of owned strings was about a fifth of a one-node
/// `acquire -n`'s instructions (callgrind); nothing but these fields is ever read. A key that shows twice counts
/// at its first line.
#[derive(Debug, Default, PartialEq)]
struct Info<'a> {
    run_id: Option<&'a [u8]>,
    role: Option<&'a [u8]>,
    cluster_enabled: Option<&'a [u8]>,
    master_host: Option<&'a [u8]>,
    master_port: Option<&'a [u8]>,
    /// The replication id: a master's own, a replica's master's.
    master_replid: Option<&'a [u8]>,
    /// The id before the last promotion (zeros when there is none).
    master_replid2: Option<&'a [u8]>,
    /// `hz` and `configured_hz` (Server section): how often the server runs its cron.
    hz: Option<&'a [u8]>,
    configured_hz: Option<&'a [u8]>,
    /// The replicas in sync (`slaveN:...state=online...`): one still loading a full copy cannot
    /// acknowledge anything yet.
    online_replicas: usize,
}

impl<'a> Info<'a> {
    fn of(v: &'a Value) -> Self {
        let text = info_bytes(v);
        let mut info = Info::default();
        for line in text.split(|&b| b == b'\n') {
            let Some(colon) = line.iter().position(|&b| b == b':') else {
                continue;
            };
            let key = line[..colon].trim_ascii();
            let value = line[colon + 1..].trim_ascii();
            let slot = match key {
                b"run_id" => &mut info.run_id,
                b"role" => &mut info.role,
                b"cluster_enabled" => &mut info.cluster_enabled,
                b"master_host" => &mut info.master_host,
                b"master_port" => &mut info.master_port,
                b"master_replid" => &mut info.master_replid,
                b"master_replid2" => &mut info.master_replid2,
                b"hz" => &mut info.hz,
                b"configured_hz" => &mut info.configured_hz,
                k if k.starts_with(b"slave") && k[5..].iter().all(u8::is_ascii_digit) => {
                    if value.windows(12).any(|w| w == b"state=online") {
                        info.online_replicas += 1;
                    }
                    continue;
                }
                _ => continue,
            };
            slot.get_or_insert(value);
        }
        info
    }

    /// The server's cron period. `configured_hz` (Redis 5 and later) rather than `hz`, which
    /// Redis raises for a while when many clients are connected (`dynamic-hz`) and lowers again:
    /// the longer period is the one a `WAIT` may have to outlast.
    fn tick(&self) -> Option<Duration> {
        let hz: u64 = std::str::from_utf8(self.configured_hz.or(self.hz)?)
            .ok()?
            .parse()
            .ok()?;
        // Redis keeps hz within 1 to 500.
        Some(Duration::from_millis(1000 / hz.clamp(1, 500)))
    }
}

/// The text of an `INFO` reply, whichever way the protocol sent it; empty for any other reply.
fn info_bytes(v: &Value) -> &[u8] {
    match v {
        Value::BulkString(b) => b,
        Value::VerbatimString { text, .. } => text.as_bytes(),
        Value::SimpleString(s) => s.as_bytes(),
        _ => b"",
    }
}

/// Redis' cron period at its default hz (10).
const DEFAULT_TICK: Duration = Duration::from_millis(100);

/// How long a `WAIT` may last when `left` remains of the node timeout, on a server whose cron runs
/// every `tick`. A server answers a `WAIT` that timed out only at its next cron tick, up to a tick
/// late (Redis 7.0.15, each `WAIT` started just after a tick: 6 ms late at hz 100, 51 at hz 10, 550
/// at hz 1). So the server gives up a tick, and a tenth more for the way back, before our read
/// does, and the failure names how many replicas acknowledged. With the tenth alone, the answer
/// came after the read had given up in 9 of 30 grants started at random points of a tick (default
/// hz and node timeout, a replica that never acknowledged); none of 30 now. A `WAIT` shorter than a
/// quarter of what is left would fail replicas that are only slow: on a server whose tick is longer
/// than that, the read may end first, and the node fails without the count.
fn wait_for(left: Duration, tick: Duration) -> Duration {
    left.saturating_sub(left / 10 + tick).max(left / 4)
}

/// A field of an `INFO` reply as text (its bytes are ASCII from any server that speaks RESP).
fn info_text(field: Option<&[u8]>) -> Option<String> {
    field.map(|f| String::from_utf8_lossy(f).into_owned())
}

/// What to do about a failure that is not a refusal: TLS setups, a server that is not there.
fn hint(e: &RedisError, text: &str, tls: bool) -> &'static str {
    if matches!(e.code(), Some("TRYAGAIN")) {
        " (the lock's slot is being migrated between cluster nodes; it can be taken again once the \
         migration ends: wait with -w, or retry)"
    } else if text.contains("UnknownIssuer") || text.contains("BadSignature") {
        " (the server's certificate is not signed by a CA this host trusts: pass the CA that \
         signed it with --tls-ca FILE or LOCKCTL_TLS_CA)"
    } else if text.contains("NotValidForName") || text.contains("not valid for name") {
        " (the server's certificate does not name this host: connect by a name or IP address \
         listed in its subjectAltName)"
    } else if text.contains("Expired") || text.contains("NotValidYet") {
        " (the server's certificate is outside its validity period; check it and this host's clock)"
    } else if text.contains("CertificateRequired") || text.contains("HandshakeFailure") {
        " (the server may require a client certificate: pass --tls-cert FILE and --tls-key FILE)"
    } else if text.contains("CorruptMessage") || (tls && text.contains("InvalidContentType")) {
        " (is this a TLS port? rediss:// needs a server started with --tls-port)"
    } else if !tls && text.contains("reset by peer") {
        " (if the server accepts only TLS on this port, use rediss://)"
    } else if e.is_timeout() {
        " (is the server stopped or the port filtered?)"
    } else if e.is_connection_refusal() {
        " (is redis-server running there?)"
    } else {
        ""
    }
}

/// Runs `f` with the connection's reads and writes bounded by the time left until `deadline`.
fn run_by<T>(
    conn: &mut Connection,
    deadline: Instant,
    f: &mut impl FnMut(&mut Connection) -> RedisResult<T>,
) -> RedisResult<T> {
    limit_by(conn, deadline)?;
    f(conn)
}

/// Bounds the connection's reads and writes by the time left until `deadline`.
fn limit_by(conn: &mut Connection, deadline: Instant) -> RedisResult<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left < Duration::from_millis(1) {
        return Err(timed_out("no time left for the command"));
    }
    conn.set_read_timeout(Some(left))?;
    conn.set_write_timeout(Some(left))?;
    Ok(())
}

/// Which `INFO` goes out in the same write as a command (see [`Node::call_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Along {
    Nothing,
    /// The sections the first command on a new connection needs ([`CHECKED_SECTIONS`], for
    /// [`Node::check_server`]).
    All,
    /// The replicas in sync, read afresh for a durable write on a kept connection.
    Replication,
}

/// `EVALSHA` and `INFO` in one write, so that checking the server (the first command on a new
/// connection) or counting its replicas (a durable write) costs no round trip of its own; the
/// script's reply and INFO's come back in that order. `INFO`'s reply is read only after a reply to
/// the script (a server error counts): after a timeout or a dropped connection it is never read, as
/// the connection is not used again. On `NOSCRIPT` (a server that never saw the script, or flushed
/// it) the source goes out with `eval_source`, which also caches it there.
fn evalsha_then_info(
    conn: &mut Connection,
    script: &super::LuaScript,
    keys: &[&str],
    args: &[&str],
    along: Along,
    eval_source: impl FnOnce(&mut Connection, RedisError) -> RedisResult<Value>,
) -> (RedisResult<Value>, Option<RedisResult<Value>>) {
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(script.sha1).arg(keys.len()).arg(keys).arg(args);
    match command_then_info(conn, &evalsha, along) {
        // INFO's reply was lost (a timeout, a read cut by a stop): the connection owes it, and the
        // source sent on it would read that reply for its own. It is not used again.
        (Err(e), Some(Err(lost))) if e.code() == Some("NOSCRIPT") && lost.code().is_none() => {
            (Err(lost), None)
        }
        (Err(e), info) if e.code() == Some("NOSCRIPT") => (eval_source(conn, e), info),
        other => other,
    }
}

/// A command and `INFO` in one write (see [`evalsha_then_info`]); `INFO`'s reply is read only after
/// a reply to the command (a server error counts).
fn command_then_info(
    conn: &mut Connection,
    command: &redis::Cmd,
    along: Along,
) -> (RedisResult<Value>, Option<RedisResult<Value>>) {
    let mut both = command.get_packed_command();
    let sections: &[&str] = match along {
        Along::All => &CHECKED_SECTIONS,
        Along::Replication => &["replication"],
        Along::Nothing => &[],
    };
    both.extend_from_slice(&info_commands(sections));
    if let Err(e) = conn.send_packed_command(&both) {
        return (Err(e), None);
    }
    learn_cpu_features();
    let first = conn.recv_response().and_then(Value::extract_error);
    let replied = match &first {
        Ok(_) => true,
        Err(e) => e.code().is_some(),
    };
    if !replied {
        return (first, None);
    }
    (first, Some(read_sections(conn, sections.len())))
}

/// The `INFO` sections a new connection's check reads ([`Node::check_server`]): the run id and
/// cron period, the role and replicas, whether the server is a cluster node. Asked for one by one
/// (Redis before 7 takes one section per `INFO`), they cost the server about a third of the
/// default sections (2.6 us each against 22 us, Redis 7.0.15) and come to a fifth of their
/// 5 KB, which the client reads and scans.
const CHECKED_SECTIONS: [&str; 3] = ["server", "replication", "cluster"];

/// One `INFO` command for each of `sections`, packed to go out in one write.
fn info_commands(sections: &[&str]) -> Vec<u8> {
    let mut packed = Vec::new();
    for section in sections {
        packed.extend_from_slice(&redis::cmd("INFO").arg(*section).get_packed_command());
    }
    packed
}

/// The replies of `count` `INFO` commands sent together, as one text (each section ends its lines
/// with CRLF); the first failure if one fails. Every reply is read, so that the connection owes
/// nothing after a refusal.
fn read_sections(conn: &mut Connection, count: usize) -> RedisResult<Value> {
    let mut text = Vec::new();
    let mut failed = None;
    for _ in 0..count {
        match conn.recv_response().and_then(Value::extract_error) {
            Ok(v) => text.extend_from_slice(info_bytes(&v)),
            // A reply lost (a timeout, a cut read): the connection is not used again.
            Err(e) if e.code().is_none() => return Err(e),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(Value::BulkString(text)),
    }
}

/// Asks the CPU which vector instructions it has, once per process, while a reply is awaited.
///
/// The first search of a reply (the Redis client's parser finds each line's end with the memchr
/// crate) would ask then, after the reply came: `cpuid`, several times, which a virtual machine's
/// hypervisor answers slowly (7.6 us each on the host of `bench/RESULTS.md`; the question cost
/// about 50 us of a one-node `acquire -n`). Asked here, it overlaps the server's work. Later calls
/// read the answer kept by the standard library (one load).
fn learn_cpu_features() {
    #[cfg(target_arch = "x86_64")]
    {
        let _ = std::arch::is_x86_feature_detected!("avx2");
    }
}

fn timed_out(what: &str) -> RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string()).into()
}

/// Opens a connection to `client` (name lookup, connect, TLS, AUTH, SELECT) by `deadline`; see the
/// module docs. `pending` holds a connect that an earlier call stopped waiting for, and gets this one
/// if it does not finish in time.
pub fn connect(
    client: &Client,
    deadline: Instant,
    pending: &mut Option<Receiver<RedisResult<Connection>>>,
) -> RedisResult<Connection> {
    let timeout = deadline.saturating_duration_since(Instant::now());
    if timeout.is_zero() {
        return Err(timed_out("connect timed out"));
    }
    if pending.is_none() {
        if let Some(result) = connect_here(client, deadline) {
            return result;
        }
    }
    loop {
        let (rx, earlier) = match pending.take() {
            Some(rx) => (rx, true),
            None => {
                let timeout = deadline.saturating_duration_since(Instant::now());
                let (tx, rx) = mpsc::sync_channel(1);
                let client = client.clone();
                std::thread::Builder::new()
                    .name("connect".into())
                    .stack_size(128 * 1024)
                    .spawn(move || {
                        let _ = tx.send(client.get_connection_with_timeout(timeout));
                    })?;
                (rx, false)
            }
        };
        match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            // An earlier connect that finished too late for its own setup: try afresh.
            Ok(Err(_)) if earlier => continue,
            // A handshake read (AUTH, SELECT, TLS) cut by a stop of lockctl (EINTR) says nothing
            // of the server: a `lockctl release` failed as unavailable and left the lock held.
            Ok(Err(e)) if is_interrupted(&e) => continue,
            Ok(result) => return result,
            Err(RecvTimeoutError::Timeout) => {
                *pending = Some(rx);
                return Err(timed_out(
                    "connect timed out: no connection and handshake within the time allowed",
                ));
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(
                    std::io::Error::other("the connect thread ended without a result").into(),
                )
            }
        }
    }
}

const CONNECT_TIMED_OUT: &str =
    "connect timed out: no connection and handshake within the time allowed";

/// Connects on the calling thread when every step is bounded there (see the module docs); `None`
/// for a host name, or a URL with a user, a password or a database, which the caller connects to on
/// a helper thread: redis-rs gives each reply of that handshake (AUTH, SELECT) the whole timeout.
fn connect_here(client: &Client, deadline: Instant) -> Option<RedisResult<Connection>> {
    use redis::ConnectionAddr;
    let timeout = deadline.saturating_duration_since(Instant::now());
    let info = client.get_connection_info();
    let settings = info.redis_settings();
    if settings.username().is_some() || settings.password().is_some() || settings.db() != 0 {
        return None;
    }
    match info.addr() {
        ConnectionAddr::Tcp(host, _) | ConnectionAddr::TcpTls { host, .. }
            if host.parse::<std::net::IpAddr>().is_ok() =>
        {
            Some(client.get_connection_with_timeout(timeout))
        }
        ConnectionAddr::Unix(_) => {
            let alarm = Alarm::arm(timeout).ok()?;
            let result = client.get_connection_with_timeout(timeout);
            drop(alarm);
            Some(match result {
                Err(e) if e.kind() == redis::ErrorKind::Io && Instant::now() >= deadline => {
                    Err(timed_out(CONNECT_TIMED_OUT))
                }
                Err(e) if is_interrupted(&e) => Err(timed_out(CONNECT_TIMED_OUT)),
                other => other,
            })
        }
        _ => None,
    }
}

/// True when `client` speaks TLS.
fn is_tls(client: &Client) -> bool {
    matches!(
        client.get_connection_info().addr(),
        redis::ConnectionAddr::TcpTls { .. }
    )
}

/// True for a system call cut by a signal, or by a stop and continue of lockctl (`EINTR`).
pub(crate) fn is_interrupted(e: &RedisError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::Interrupted)
        || e.to_string().contains("Interrupted system call")
}

/// A signal to the calling thread once a time has passed, interrupting the system call it blocks in
/// (a unix-socket connect to a server whose accept queue is full has no timeout of its own). The
/// handler does nothing and is installed without `SA_RESTART`, so the call fails with `EINTR`.
/// Dropping the alarm deletes its timer; a signal already on its way is then handled in user space
/// at once, interrupting nothing.
struct Alarm(libc::timer_t);

extern "C" fn on_alarm(_: libc::c_int) {}

/// The signal the connect alarm is delivered with: a job's process resets its handler before exec
/// (`exec/child.rs`).
pub fn alarm_signal() -> libc::c_int {
    // Above the real-time signals glibc keeps for itself (SIGRTMIN() already skips those).
    libc::SIGRTMIN() + 4
}

impl Alarm {
    fn arm(after: Duration) -> std::io::Result<Alarm> {
        static INSTALLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let installed = *INSTALLED.get_or_init(|| {
            // SAFETY: a zeroed sigaction is valid; the handler is async-signal-safe (it does nothing).
            unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_alarm as *const () as libc::sighandler_t;
                action.sa_flags = 0;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(alarm_signal(), &action, std::ptr::null_mut()) == 0
            }
        });
        if !installed {
            return Err(std::io::Error::other("cannot install the alarm's handler"));
        }
        // SAFETY: sigevent is plain old data; the timer is created for this thread and owned below.
        let timer = unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_THREAD_ID;
            event.sigev_signo = alarm_signal();
            event.sigev_notify_thread_id = libc::gettid();
            let mut timer: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut event, &mut timer) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            timer
        };
        let alarm = Alarm(timer);
        let at = after.max(Duration::from_micros(1));
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: at.as_secs() as libc::time_t,
                tv_nsec: at.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: `alarm.0` is a live timer; `spec` is a valid itimerspec.
        if unsafe { libc::timer_settime(alarm.0, 0, &spec, std::ptr::null_mut()) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(alarm)
    }
}

impl Drop for Alarm {
    fn drop(&mut self) {
        // SAFETY: the timer was created by `arm` and is deleted once.
        unsafe { libc::timer_delete(self.0) };
    }
}

/// What is left until `deadline`, at least 1 ms.
fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

/// The connection with its reads and writes bounded by `timeout`.
pub fn bounded(conn: Connection, timeout: Duration) -> RedisResult<Connection> {
    conn.set_read_timeout(Some(timeout))?;
    conn.set_write_timeout(Some(timeout))?;
    Ok(conn)
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Builds the client for one node; TLS material is read here, once.
fn open_client(spec: &NodeSpec, tls: &TlsFiles) -> Result<Client, LockError> {
    use redis::IntoConnectionInfo;
    let usage = |what: String| LockError::Usage(what);
    let info = spec
        .url
        .as_str()
        .into_connection_info()
        .map_err(|e| usage(format!("invalid --redis URL {}: {e}", spec.display)))?;
    // No CLIENT SETINFO on connect: it would cost a round trip on every invocation.
    let settings = info.redis_settings().clone().set_skip_set_lib_name();
    let info = info.set_redis_settings(settings);
    if !spec.tls {
        return Client::open(info)
            .map_err(|e| usage(format!("invalid --redis URL {}: {e}", spec.display)));
    }
    // TLS is set up only for rediss:// nodes, so plain invocations pay nothing for it.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if tls.ca.is_none() && tls.cert.is_none() {
        return Client::open(info)
            .map_err(|e| usage(format!("invalid --redis URL {}: {e}", spec.display)));
    }
    let read = |flag: &str, path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| usage(format!("cannot read {flag} {}: {e}", path.display())))
    };
    // A file without a certificate would fail every handshake with a misleading message ("unknown
    // issuer", "certificate required"): refuse it here, before anything is sent.
    let read_certs = |flag: &str, path: &std::path::Path| {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let pem = read(flag, path)?;
        if !CertificateDer::pem_slice_iter(&pem).any(|c| c.is_ok()) {
            return Err(usage(format!(
                "invalid {flag} {}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
                path.display()
            )));
        }
        Ok(pem)
    };
    let root_cert = tls
        .ca
        .as_deref()
        .map(|p| read_certs("--tls-ca", p))
        .transpose()?;
    let client_tls = match (&tls.cert, &tls.key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read_certs("--tls-cert", cert)?,
            client_key: read("--tls-key", key)?,
        }),
        _ => None,
    };
    Client::build_with_tls(
        info,
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| usage(format!("TLS setup for {} failed: {e}", spec.display)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a call counts as sent (`Node::sending`) includes the check's `INFO` commands.
    #[test]
    fn the_checks_info_commands_are_counted_in_what_a_call_sends() {
        let counted: usize = CHECKED_SECTIONS
            .iter()
            .map(|section| packed_len([4, section.len()]))
            .sum();
        assert_eq!(counted, info_commands(&CHECKED_SECTIONS).len());
    }

    /// `packed_len` counts what redis-rs writes.
    #[test]
    fn packed_len_is_the_encoded_length() {
        let long = "k".repeat(12_345);
        for parts in [
            vec!["EVALSHA", "0123", "2", "a", ""],
            vec!["EVAL", &long, "10"],
        ] {
            let mut cmd = redis::cmd(parts[0]);
            cmd.arg(&parts[1..]);
            let want = cmd.get_packed_command().len();
            assert_eq!(packed_len(parts.iter().map(|p| p.len())), want, "{parts:?}");
        }
    }

    /// The reads measured on a stopped Redis 7.0 (see [`Owed`]).
    #[test]
    fn owed_writes_past_the_servers_reads_count_as_lost() {
        let after = |tls: bool, writes: &[usize]| {
            let mut owed = Owed::default();
            writes
                .iter()
                .map(|&w| {
                    owed.add(w);
                    owed.all_read(tls)
                })
                .collect::<Vec<_>>()
        };
        let k = 1024;
        assert_eq!(after(true, &[100, 100, 100]), [true, true, false]);
        assert_eq!(after(true, &[20 * k, 100, 100]), [true, true, false]);
        assert_eq!(after(false, &[7 * k, 7 * k, 7 * k]), [true, true, false]);
        assert_eq!(after(false, &[14 * k, 14 * k]), [true, false]);
        assert_eq!(after(false, &[20 * k, 10 * k, 3 * k]), [true, true, false]);
    }

    /// The digests build.rs wrote are the ones Redis gives the scripts (`redis::Script` hashes a
    /// source as Redis does): with a wrong one every call would miss and send its script whole.
    #[test]
    fn the_scripts_digests_are_their_sha1() {
        use crate::lock::{ACQUIRE, BREAK, FENCE, LEAVE, RELEASE, RENEW, STATUS};
        for s in [&ACQUIRE, &FENCE, &RELEASE, &RENEW, &STATUS, &BREAK, &LEAVE] {
            assert_eq!(s.sha1, redis::Script::new(s.source).get_hash());
        }
        assert!(ACQUIRE
            .source
            .starts_with(include_str!("scripts/front.lua")));
        assert!(ACQUIRE
            .source
            .ends_with(include_str!("scripts/acquire.lua")));
        assert_eq!(FENCE.source, include_str!("scripts/fence.lua"));
        // Those that grant or extend a lock wait for the replicas.
        let durable =
            [&ACQUIRE, &FENCE, &RENEW, &RELEASE, &STATUS, &BREAK, &LEAVE].map(|s| s.durable);
        assert_eq!(durable, [true, true, true, false, false, false, false]);
    }

    /// What a waiter stopped during a stall leaves on one connection (an attempt by EVALSHA with its
    /// arguments, a rollback, a leave) must fit in the server's first read of it (see `compact`).
    /// The scripts leave 2 KB for the keys and arguments: enough for names and prefixes of up to
    /// about 200 bytes; longer ones lose the leave (`tests/queue_review5.rs`, ignored).
    #[test]
    fn a_rollback_and_a_leave_fit_in_one_read() {
        let blind = compact(crate::lock::RELEASE_LUA).len() + compact(crate::lock::LEAVE_LUA).len();
        assert!(blind + 2048 < 16 * 1024, "{blind} bytes");
        let kept = compact("-- why\nlocal a = 1 -- a\n\n  -- more\nreturn a\n");
        assert_eq!(kept, "local a = 1 -- a\nreturn a\n");
    }

    #[test]
    fn a_script_error_names_the_command_on_its_line() {
        let source = "local a = redis.call('GET', KEYS[1])\nlocal t = redis.call('TIME')\n\
                      return {redis.call('PTTL', KEYS[1]), redis.call('HGETALL', KEYS[2])}";
        let reason = |line: usize| {
            format!(
                "refused: The user executing the script can't run this command script: ab, \
                 on @user_script:{line}."
            )
        };
        assert_eq!(
            script_command(&reason(2), source).as_deref(),
            Some(" [the command the script could not run: TIME]")
        );
        assert_eq!(
            script_command(&reason(3), source).as_deref(),
            Some(" [the script could not run one of: PTTL, HGETALL]")
        );
        assert_eq!(script_command(&reason(9), source), None);
        assert_eq!(script_command("no line here", source), None);
    }

    /// Only a TLS connection cannot be opened to a stopped server: `AUTH` and `SELECT` go along
    /// with the script instead ([`Node::send_on_new`]).
    #[test]
    fn which_connections_a_stopped_server_cannot_open() {
        let tls = |url: &str| is_tls(&Client::open(url).unwrap());
        assert!(!tls("redis://:pw@127.0.0.1:6379"));
        assert!(!tls("unix:///tmp/redis.sock?db=1"));
        assert!(tls("rediss://127.0.0.1:6379"));
    }

    #[test]
    fn refusals_and_outages() {
        let auth = RedisError::from((redis::ErrorKind::AuthenticationFailed, "denied"));
        assert!(refusal(&auth, "denied").is_some());
        let io: RedisError = std::io::Error::from(std::io::ErrorKind::ConnectionRefused).into();
        assert!(refusal(&io, "connection refused").is_none());
        let unknown = RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "unknown command 'EVALSHA'".to_string(),
        ));
        assert!(refusal(&unknown, &unknown.to_string()).is_some());
        // Redis 6.2 quotes a replica's refusal inside a script error; Valkey words unknown commands
        // in scripts its own way.
        for text in [
            "Error running script (call to f_1): @user_script:44: @user_script: 44: -READONLY \
             You can't write against a read only replica.",
            "Unknown command called from script script: 34c4, on @user_script:15.",
        ] {
            let e = RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                text.to_string(),
            ));
            assert!(refusal(&e, text).is_some(), "{text}");
        }
        // A channel refused by the ACL, directly and in a script, as Redis 7, Redis 6.2 and Valkey 8
        // word it: named as a channel, with the `&` rules.
        for text in [
            "NOPERM this user has no permissions to access one of the channels used as arguments",
            "The user executing the script can't publish to the channel mentioned in the command \
             script: 4b36, on @user_script:1.",
            "Error running script (call to f_4b36): @user_script:1: @user_script: 1: The user \
             executing the script can't publish to the channel mentioned in the command",
            "NOPERM No permissions to access a channel",
            "ACL failure in script: No permissions to access a channel script: 4b36, on \
             @user_script:1.",
        ] {
            let e = RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                text.to_string(),
            ));
            assert!(is_channel_refusal(text), "{text}");
            let fix = refusal(&e, text).unwrap_or_default();
            assert!(
                fix.contains(ACL_CHANNELS) && fix.contains("(the ACL user "),
                "{text}: {fix}"
            );
        }
        assert!(!is_channel_refusal("can't access at least one of the keys"));
    }

    #[test]
    fn the_acl_rules_named_are_the_recipes() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/security.md"));
        let start = doc.find("ACL SETUSER ").expect("the recipe");
        let end = start + doc[start..].find("```").expect("its end");
        let recipe: Vec<&str> = doc[start..end]
            .split_whitespace()
            .skip_while(|w| *w != "-@all")
            .skip(1)
            .collect();
        assert_eq!(ACL_RULES.split_whitespace().collect::<Vec<_>>(), recipe);
        let channels: Vec<&str> = ACL_RULES
            .split_whitespace()
            .filter(|r| r.starts_with('&'))
            .collect();
        assert_eq!(
            ACL_CHANNELS.split_whitespace().collect::<Vec<_>>(),
            channels
        );
    }

    #[test]
    fn only_replicas_in_sync_count() {
        let reply = Value::BulkString(
            b"# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
              slave0:ip=127.0.0.1,port=1,state=online,offset=5,lag=0\r\n\
              slave1:ip=127.0.0.1,port=2,state=wait_bgsave,offset=0,lag=0\r\n\
              slave2:ip=127.0.0.1,port=3,state=online,offset=5,lag=1\r\n\
              slave_read_only:1\r\n"
                .to_vec(),
        );
        assert_eq!(Info::of(&reply).online_replicas, 2);
    }

    #[test]
    fn an_info_reply_gives_its_fields_as_the_server_wrote_them() {
        let text = "# Server\r\nredis_version:7.0.15\r\nrun_id:ab12\r\n\r\n# Replication\r\n\
                    role:slave\r\nmaster_host:10.0.0.1\r\nmaster_port:6380\r\n\
                    master_link_status:up\r\n# Cluster\r\ncluster_enabled:0\r\n";
        let want = Info {
            run_id: Some(b"ab12"),
            role: Some(b"slave"),
            cluster_enabled: Some(b"0"),
            master_host: Some(b"10.0.0.1"),
            master_port: Some(b"6380"),
            master_replid: None,
            master_replid2: None,
            hz: None,
            configured_hz: None,
            online_replicas: 0,
        };
        for reply in [
            Value::BulkString(text.as_bytes().to_vec()),
            Value::SimpleString(text.to_string()),
            Value::VerbatimString {
                format: redis::VerbatimFormat::Text,
                text: text.to_string(),
            },
        ] {
            assert_eq!(Info::of(&reply), want);
        }
        assert_eq!(Info::of(&Value::Nil), Info::default());
        // A key met twice counts at its first line; a value keeps its inner colons.
        let twice = Value::BulkString(b"role:master\nrole:slave\nrun_id:a:b\n".to_vec());
        assert_eq!(Info::of(&twice).role, Some(&b"master"[..]));
        assert_eq!(Info::of(&twice).run_id, Some(&b"a:b"[..]));
    }

    #[test]
    fn the_cron_period_comes_from_configured_hz_then_hz() {
        let tick = |text: &str| Info::of(&Value::BulkString(text.as_bytes().to_vec())).tick();
        let ms = |n| Some(Duration::from_millis(n));
        // Redis 7 with dynamic hz raised by its clients: the configured period.
        assert_eq!(tick("hz:40\r\nconfigured_hz:10\r\n"), ms(100));
        // Redis 4 says only hz.
        assert_eq!(tick("hz:2\r\n"), ms(500));
        assert_eq!(tick("configured_hz:500\r\nhz:500\r\n"), ms(2));
        // Out of Redis' range, or not a number: clamped, or not read.
        assert_eq!(tick("hz:0\r\n"), ms(1000));
        assert_eq!(tick("hz:9000\r\n"), ms(2));
        assert_eq!(tick("hz:ten\r\n"), None);
        assert_eq!(tick("role:master\r\n"), None);
    }

    #[test]
    fn a_wait_ends_a_tick_and_a_tenth_before_the_read() {
        let ms = Duration::from_millis;
        assert_eq!(wait_for(ms(500), ms(100)), ms(350));
        assert_eq!(wait_for(ms(2000), ms(500)), ms(1300));
        assert_eq!(wait_for(ms(500), ms(2)), ms(448));
        // A tick as long as what is left: a quarter of it, not nothing.
        assert_eq!(wait_for(ms(500), ms(1000)), ms(125));
        assert_eq!(wait_for(ms(0), ms(100)), ms(0));
    }

    /// The parser before `Info` (each line copied into a pair of owned strings, looked up by the
    /// first line with the key), kept here as the reference `Info` must agree with.
    fn fields_as_before(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        #[test]
        fn info_reads_what_the_copying_parser_read(
            lines in proptest::collection::vec(
                (
                    "[ \t]{0,2}(run_id|role|cluster_enabled|master_host|master_port|master_replid|master_replid2|hz|configured_hz|slave|slave[0-9]{1,2}|slave_read_only|slavex|# Server|)[ \t]{0,2}",
                    proptest::option::of("[ \t]{0,2}[a-z0-9=,.:]{0,24}(state=online)?[a-z0-9=,]{0,6}[ \t]{0,2}"),
                    proptest::bool::ANY,
                ),
                0..24,
            )
        ) {
            let text: String = lines
                .iter()
                .map(|(k, v, cr)| {
                    let v = v.as_ref().map(|v| format!(":{v}")).unwrap_or_default();
                    format!("{k}{v}{}\n", if *cr { "\r" } else { "" })
                })
                .collect();
            let before = fields_as_before(&text);
            let get = |k: &str| {
                before.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_bytes())
            };
            let online = before
                .iter()
                .filter(|(k, v)| {
                    k.starts_with("slave")
                        && k[5..].bytes().all(|b| b.is_ascii_digit())
                        && v.contains("state=online")
                })
                .count();
            let reply = Value::BulkString(text.clone().into_bytes());
            let info = Info::of(&reply);
            proptest::prop_assert_eq!(info.run_id, get("run_id"), "{:?}", text);
            proptest::prop_assert_eq!(info.role, get("role"), "{:?}", text);
            proptest::prop_assert_eq!(info.cluster_enabled, get("cluster_enabled"), "{:?}", text);
            proptest::prop_assert_eq!(info.master_host, get("master_host"), "{:?}", text);
            proptest::prop_assert_eq!(info.master_port, get("master_port"), "{:?}", text);
            proptest::prop_assert_eq!(info.master_replid, get("master_replid"), "{:?}", text);
            proptest::prop_assert_eq!(info.master_replid2, get("master_replid2"), "{:?}", text);
            proptest::prop_assert_eq!(info.hz, get("hz"), "{:?}", text);
            proptest::prop_assert_eq!(info.configured_hz, get("configured_hz"), "{:?}", text);
            proptest::prop_assert_eq!(info.online_replicas, online, "{:?}", text);
        }
    }
}
