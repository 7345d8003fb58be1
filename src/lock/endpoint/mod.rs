//! Endpoints: what one `-r` reaches, and how a node finds the server that holds a lock behind it.
//!
//! Each `-r` is one vote in the quorum, whatever stands behind it: a standalone master
//! ([`standalone`]), a Redis Cluster ([`cluster`]) or a Sentinel-managed master with replicas
//! ([`sentinel`]). The quorum engine counts votes and never learns which kind it talks to: the
//! [`Node`](super::node::Node) asks its endpoint where to connect, and tells it what the server said
//! (a redirect, a replica where a master was expected, a dropped connection).
//!
//! Every kind goes through the same checks on a new connection: one `INFO` after its first reply
//! says whether the server is a master, how many replicas it has in sync, and its run id. A grant or
//! renewal on a master with replicas is reported only after `WAIT` confirms that the replicas have
//! it, so the replica a failover promotes holds the lock too (see `docs/topologies.md` for what that
//! costs and what it cannot cover).
//!
//! The `redis` crate has cluster and Sentinel clients of its own; lockctl does not use them, because
//! both own their connections: the cluster client reads the whole slot map (`CLUSTER SLOTS`) and
//! connects to every master before the first command, retries with its own backoff outside the node
//! timeout, and gives no plain connection on which a rollback can be sent without waiting; the Sentinel
//! client hands out a client for the master but neither checks its role nor bounds the discovery by
//! one timeout. A lock touches one hash slot, so following a redirect is one reconnect, and finding a
//! master is one `SENTINEL get-master-addr-by-name`: small enough to write here, under the node's
//! timeouts, its EVALSHA/NOSCRIPT handling and its stale-connection rules.

pub mod cluster;
pub mod sentinel;
pub mod standalone;

use std::time::Duration;

use redis::{Client, ConnectionAddr, RedisResult};

use crate::config::{NodeSpec, Topology};
use crate::exit::LockError;

/// Why an endpoint could not name a server.
#[derive(Debug)]
pub struct EndpointError {
    /// What happened (no secrets).
    pub text: String,
    /// The endpoint answered and refuses (exit 78), rather than did not answer (exit 69).
    pub refused: bool,
}

/// What a server that is not a master means for this endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnReplica {
    /// Refuse: the URL names a replica.
    Refuse,
    /// Ask the endpoint for the current master again (a failover happened).
    Rediscover,
}

/// One `-r`.
pub enum Endpoint {
    Standalone(standalone::Standalone),
    Cluster(cluster::Cluster),
    Sentinel(sentinel::Sentinel),
}

impl Endpoint {
    /// The endpoint of `spec`; `client` is the client built from `spec.url` (the data nodes'
    /// credentials, db and TLS), from which every other server's client is derived.
    pub fn new(spec: &NodeSpec, client: &Client) -> Result<Endpoint, LockError> {
        Ok(match &spec.topology {
            Topology::Direct => Endpoint::Standalone(standalone::Standalone::new(client)),
            Topology::Cluster { seeds } => {
                let mut clients = vec![client.clone()];
                for seed in &seeds[1..] {
                    let addr = redis::IntoConnectionInfo::into_connection_info(seed.as_str())
                        .ok()
                        .and_then(|i| match i.addr() {
                            ConnectionAddr::Tcp(h, p)
                            | ConnectionAddr::TcpTls {
                                host: h, port: p, ..
                            } => Some(format!("{h}:{p}")),
                            _ => None,
                        });
                    let c = addr
                        .and_then(|a| client_at(client, &a).ok())
                        .ok_or_else(|| {
                            LockError::Usage(format!(
                                "invalid seed {} in {}",
                                crate::config::redact(seed),
                                spec.display
                            ))
                        })?;
                    clients.push(c);
                }
                Endpoint::Cluster(cluster::Cluster::new(clients))
            }
            Topology::Sentinel { sentinels, master } => {
                Endpoint::Sentinel(sentinel::Sentinel::new(sentinels, master, client)?)
            }
        })
    }

    /// The client of the server to talk to now.
    pub fn target(&mut self, timeout: Duration) -> Result<Client, EndpointError> {
        match self {
            Endpoint::Standalone(s) => Ok(s.current.clone()),
            Endpoint::Cluster(c) => Ok(c.current()),
            Endpoint::Sentinel(s) => s.master(timeout),
        }
    }

    /// A MOVED reply: the slot lives on `addr` from now on.
    pub fn moved(&mut self, addr: &str) -> RedisResult<Client> {
        let client = client_at(&self.template(), addr)?;
        match self {
            Endpoint::Standalone(s) => s.current = client.clone(),
            Endpoint::Cluster(c) => c.moved(client.clone()),
            Endpoint::Sentinel(s) => s.moved(client.clone()),
        }
        Ok(client)
    }

    /// An ASK reply: this one command goes to `addr`.
    pub fn ask(&self, addr: &str) -> RedisResult<Client> {
        client_at(&self.template(), addr)
    }

    /// The server could not be reached or dropped the connection: the next target may differ.
    pub fn lost(&mut self) {
        match self {
            // The URL's own server again: after a redirect, it names the slot's new owner.
            Endpoint::Standalone(s) => s.current = s.own.clone(),
            Endpoint::Cluster(c) => c.next_seed(),
            Endpoint::Sentinel(s) => s.forget(),
        }
    }

    /// Other servers to try when the current one cannot be reached: a cluster's other seeds.
    pub fn alternatives(&self) -> usize {
        match self {
            Endpoint::Cluster(c) => c.seeds().len() - 1,
            _ => 0,
        }
    }

    /// A plain URL's server (neither a cluster nor behind Sentinel).
    pub fn is_standalone(&self) -> bool {
        matches!(self, Endpoint::Standalone(_))
    }

    /// What a replica where a master was expected means.
    pub fn on_replica(&self) -> OnReplica {
        match self {
            Endpoint::Sentinel(_) => OnReplica::Rediscover,
            _ => OnReplica::Refuse,
        }
    }

    /// The current server, for messages: `(master 127.0.0.1:6380)` behind a Sentinel or after a
    /// redirect, empty when it is the URL's own server.
    pub fn describe_target(&self) -> String {
        let (client, own) = match self {
            Endpoint::Standalone(s) => (Some(&s.current), &s.own),
            Endpoint::Cluster(c) => (Some(c.current_ref()), c.own()),
            Endpoint::Sentinel(s) => (s.current(), s.own()),
        };
        match client {
            Some(c) if addr_of(c) != addr_of(own) => format!(" (at {})", addr_of(c)),
            _ => String::new(),
        }
    }

    fn template(&self) -> Client {
        match self {
            Endpoint::Standalone(s) => s.own.clone(),
            Endpoint::Cluster(c) => c.own().clone(),
            Endpoint::Sentinel(s) => s.own().clone(),
        }
    }
}

/// `host:port` or the socket path of a client, for messages (no credentials).
pub fn addr_of(client: &Client) -> String {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(h, p)
        | ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            format!("{h}:{p}")
        }
        ConnectionAddr::Unix(path) => path.display().to_string(),
        _ => "?".into(),
    }
}

/// A client for the server at `addr` (`host:port`, as MOVED, ASK and Sentinel give it) with the
/// credentials, db, protocol and TLS settings of `template`.
pub fn client_at(template: &Client, addr: &str) -> RedisResult<Client> {
    let bad = || {
        redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "not a host:port address",
            addr.to_string(),
        ))
    };
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    if host.is_empty() {
        return Err(bad());
    }
    let info = template.get_connection_info().clone();
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    Client::open(info.set_addr(addr))
}
