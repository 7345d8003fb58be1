//! One Redis node: a lazily opened connection with hard timeouts, and scripts sent with EVALSHA.
//!
//! One node timeout bounds each call as a whole: the name lookup, the connect, the handshake (TLS,
//! AUTH, SELECT) and the command together, so a stopped or black-holed server costs at most about one
//! timeout and never hangs a command. A holder's renewal is bounded by the time left on its lease as
//! well ([`Node::limit`]), so no renewal call outlives the lease it renews. Scripts go out as EVALSHA and are
//! reloaded on NOSCRIPT (redis-rs's `Script` does that); should the script be gone again by the retry,
//! its source goes out with EVAL, so a `SCRIPT FLUSH` or a failover to a server that never saw the
//! scripts changes nothing.
//!
//! After a timeout the connection still owes us a reply, so it can no longer be used for
//! request/response; it is kept only to send a rollback without waiting ([`Node::send_only`]), which the
//! server runs after the command that timed out, in order, should it ever wake up. A connection found
//! dropped (`CLIENT KILL`, a server restart), reused or just opened, is reopened once, at once: every
//! lockctl script leaves the same state when it runs twice. Its reply may differ: in the rare case where
//! the server ran a release and the connection dropped before the reply, the second send answers "not
//! ours". Usually the first send never arrived (the server had restarted), and treating every resend
//! as unsure would turn those clean answers into "unavailable"; the rare false "not ours" is the
//! smaller harm. A new connection is no safer than an old one: an operator's
//! `CLIENT KILL TYPE normal` can land between its connect and its first command.
//!
//! Opening a connection has parts that no socket timeout bounds, or bounds one by one: the name lookup
//! (`getaddrinfo` takes no timeout at all), a unix-socket connect (std's `UnixStream::connect` takes
//! none, and it blocks for as long as a stopped server's accept queue is full), and redis-rs gives the
//! handshake its own timeout after the connect's. So a connection is opened on a helper thread that the
//! caller stops waiting for when the call's time is up ([`connect`]); a node keeps at most one such
//! connect outstanding and picks it up on its next call rather than queueing more.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisError, RedisResult, Script, Value};

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

/// One Redis master.
pub struct Node {
    /// The node's URL, redacted.
    pub display: String,
    client: Client,
    secret_url: String,
    conn: Option<Connection>,
    /// A reply is outstanding on `conn` (the last command timed out).
    stale: bool,
    timeout: Duration,
    /// Calls must also end by then (the end of the lease they renew).
    until: Option<Stamp>,
    /// A connect still blocked after an earlier call gave up on it.
    pending: Mutex<Option<Receiver<RedisResult<Connection>>>>,
}

impl Node {
    /// A node that connects on first use.
    pub fn new(spec: &NodeSpec, tls: &TlsFiles, timeout: Duration) -> Result<Node, LockError> {
        Ok(Node {
            display: spec.display.clone(),
            client: open_client(spec, tls)?,
            secret_url: spec.url.clone(),
            conn: None,
            stale: false,
            timeout,
            until: None,
            pending: Mutex::new(None),
        })
    }

    /// The client, for callers that need a connection of their own (pub/sub).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// True when the last command timed out and its reply is still owed.
    pub fn is_stale(&self) -> bool {
        self.stale
    }

    /// The node timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
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

    /// Runs `f` on this node's connection, opening it if needed; connecting and `f` together end
    /// within the node timeout (and by the limit, if one is set).
    pub fn call<T>(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut Connection) -> redis::RedisResult<T>,
    ) -> Result<T, NodeFailure> {
        let budget = self.budget();
        let deadline = Instant::now() + budget;
        if self.stale {
            self.conn = None;
            self.stale = false;
        }
        if budget.is_zero() {
            return Err(NodeFailure {
                reason: format!("{}: no time left for {what}", self.display),
                maybe_applied: false,
            });
        }
        if self.conn.is_none() {
            self.conn = Some(self.open_by(deadline)?);
        }
        let started = Instant::now();
        let result = match run_by(
            self.conn.as_mut().expect("connection just opened"),
            deadline,
            &mut f,
        ) {
            Err(e) if !e.is_timeout() && (e.is_connection_dropped() || e.is_io_error()) => {
                trace!("{}: connection dropped ({e}); reconnecting", self.display);
                self.conn = None;
                self.conn = Some(self.open_by(deadline).map_err(|mut fail| {
                    fail.maybe_applied = true;
                    fail
                })?);
                run_by(
                    self.conn.as_mut().expect("connection just opened"),
                    deadline,
                    &mut f,
                )
            }
            other => other,
        };
        match result {
            Ok(v) => {
                trace!("{}: {what} in {:.3} ms", self.display, ms(started));
                Ok(v)
            }
            Err(e) => {
                let fail = self.failure(&e, what, budget);
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

    /// Runs a lockctl script on this node.
    pub fn eval(
        &mut self,
        what: &str,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<Value, NodeFailure> {
        self.call(what, |conn| {
            let mut inv = script.prepare_invoke();
            for k in keys {
                inv.key(*k);
            }
            for a in args {
                inv.arg(*a);
            }
            match inv.invoke(conn) {
                // Flushed again between the reload and the retry (`SCRIPT FLUSH` in a loop, a
                // failover mid-call): send the source itself, which cannot miss.
                Err(e) if e.code() == Some("NOSCRIPT") => match super::script_source(script) {
                    Some(source) => redis::cmd("EVAL")
                        .arg(source)
                        .arg(keys.len())
                        .arg(keys)
                        .arg(args)
                        .query(conn),
                    None => Err(e),
                },
                other => other,
            }
        })
    }

    /// Sends a script without waiting for its reply (a rollback to a node that timed out), then closes
    /// the connection. The script text goes along (EVAL), since no NOSCRIPT reply would be read.
    pub fn send_only(&mut self, source: &str, keys: &[&str], args: &[&str]) {
        if let Some(conn) = self.conn.as_mut() {
            let mut cmd = redis::cmd("EVAL");
            cmd.arg(source).arg(keys.len()).arg(keys).arg(args);
            let _ = conn.send_packed_command(&cmd.get_packed_command());
            trace!("{}: rollback sent without waiting", self.display);
        }
        self.conn = None;
        self.stale = false;
    }

    fn failure(&mut self, e: &RedisError, what: &str, budget: Duration) -> NodeFailure {
        if e.is_timeout() {
            self.stale = true;
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
                    "{}: no answer to {what} within {within}{}",
                    self.display,
                    if self.display.starts_with("rediss:") {
                        " (a stopped server, or a port that does not speak TLS?)"
                    } else {
                        ""
                    }
                ),
                maybe_applied: true,
            }
        } else if e.is_io_error() || e.is_connection_dropped() {
            self.conn = None;
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

    /// An error message that never contains the URL's secrets.
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
            return format!(
                "{}: {what}: this does not look like a Redis server: it answered with something \
                 other than the Redis protocol (an HTTP server?); check the host and port",
                self.display
            );
        }
        let hint = hint(e, &text, self.display.starts_with("rediss:"));
        format!("{}: {what}: {text}{hint}", self.display)
    }
}

/// What to do about a failure, for the failures users cause themselves: credentials, ACLs, TLS.
fn hint(e: &RedisError, text: &str, tls: bool) -> &'static str {
    if e.kind() == redis::ErrorKind::AuthenticationFailed || matches!(e.code(), Some("WRONGPASS")) {
        " (check the user and password in the URL)"
    } else if matches!(e.code(), Some("NOAUTH")) || text.contains("unauthenticated") {
        " (the server requires a password: redis://:PASSWORD@host or redis://USER:PASSWORD@host)"
    } else if matches!(e.code(), Some("NOPERM")) {
        " (the ACL user needs the keys ~PREFIX* and ~{PREFIX*, the channels &PREFIX*, &{PREFIX* and \
         &__keyspace@*__:PREFIX*, and EVALSHA, EVAL, SCRIPT LOAD, SUBSCRIBE and the commands the \
         scripts run; see the ACL recipe in docs/security.md)"
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
    let left = deadline.saturating_duration_since(Instant::now());
    if left < Duration::from_millis(1) {
        return Err(timed_out("no time left for the command"));
    }
    conn.set_read_timeout(Some(left))?;
    conn.set_write_timeout(Some(left))?;
    f(conn)
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
    loop {
        let (rx, earlier) = match pending.take() {
            Some(rx) => (rx, true),
            None => {
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
