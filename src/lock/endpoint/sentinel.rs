//! A Sentinel-managed master: `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]`.
//!
//! The master is found through the first Sentinel that answers `SENTINEL get-master-addr-by-name`
//! (in the order given, all within one node timeout), and a new connection checks with `INFO`
//! (after its first reply) that the server named really is a master: a Sentinel that has not yet
//! noticed a failover names the old master, which by then may be a replica. The answer is kept for the run; it
//! is asked for again when the master's connection drops or cannot be opened, when it replies
//! READONLY, when it turns out to be a replica, and when `WAIT` finds its replicas gone (a master
//! demoted or cut off by a failover keeps saying "master" for a while, but its replicas follow the new
//! master). Renewals and releases go through the same node, so they follow a failover too.
//!
//! On failover: every grant and renewal is confirmed by `WAIT` on the master's replicas, so the
//! replica Sentinel promotes holds the lock with its expiry; a holder that cannot renew on the new
//! master before its validity ends loses the lease (exit 76) rather than hold it on a demoted master.
//! What remains possible is in `docs/topologies.md`.
//!
//! The Sentinels are asked with `LOCKCTL_SENTINEL_USERNAME` / `LOCKCTL_SENTINEL_PASSWORD` when set;
//! the credentials in the URL are the data nodes'.

use std::time::{Duration, Instant};

use redis::{Client, IntoConnectionInfo, RedisConnectionInfo, Value};

use super::{addr_of, client_at, EndpointError};
use crate::exit::LockError;
use crate::trace;

/// The Sentinels, the master's name, and the master found.
pub struct Sentinel {
    sentinels: Vec<Client>,
    master: String,
    template: Client,
    current: Option<Client>,
}

impl Sentinel {
    pub fn new(urls: &[String], master: &str, template: &Client) -> Result<Sentinel, LockError> {
        let mut sentinels = Vec::with_capacity(urls.len());
        for url in urls {
            let info = url.as_str().into_connection_info().map_err(|e| {
                LockError::Usage(format!(
                    "invalid Sentinel address {}: {e}",
                    crate::config::redact(url)
                ))
            })?;
            let mut settings = RedisConnectionInfo::default().set_skip_set_lib_name();
            if let Some(user) = info.redis_settings().username() {
                settings = settings.set_username(user);
            }
            if let Some(pass) = info.redis_settings().password() {
                settings = settings.set_password(pass);
            }
            // The data nodes' TLS settings (CA, client certificate) apply to the Sentinels too.
            let addr = addr_text(&info);
            let client = client_at(template, &addr)
                .and_then(|c| {
                    let info = c.get_connection_info().clone().set_redis_settings(settings);
                    Client::open(info)
                })
                .map_err(|e| LockError::Usage(format!("invalid Sentinel address {addr}: {e}")))?;
            sentinels.push(client);
        }
        Ok(Sentinel {
            sentinels,
            master: master.to_string(),
            template: template.clone(),
            current: None,
        })
    }

    /// The master's client, asking the Sentinels when none is known.
    pub fn master(&mut self, timeout: Duration) -> Result<Client, EndpointError> {
        if let Some(c) = &self.current {
            return Ok(c.clone());
        }
        let c = self.discover(timeout)?;
        self.current = Some(c.clone());
        Ok(c)
    }

    /// Forget the master: the next call asks the Sentinels again.
    pub fn forget(&mut self) {
        self.current = None;
    }

    pub(super) fn moved(&mut self, to: Client) {
        self.current = Some(to);
    }

    pub(super) fn current(&self) -> Option<&Client> {
        self.current.as_ref()
    }

    pub(super) fn own(&self) -> &Client {
        &self.template
    }

    fn discover(&self, timeout: Duration) -> Result<Client, EndpointError> {
        let deadline = Instant::now() + timeout;
        let mut failures = Vec::new();
        // Sentinels that answered and refuse: an unknown master name, wrong credentials.
        let mut unknown = 0;
        for sentinel in &self.sentinels {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                failures.push(format!(
                    "{}: not asked, the node timeout ran out",
                    addr_of(sentinel)
                ));
                continue;
            }
            let asked = sentinel
                .get_connection_with_timeout(left)
                .and_then(|c| super::super::node::bounded(c, left))
                .and_then(|mut c| {
                    redis::cmd("SENTINEL")
                        .arg("get-master-addr-by-name")
                        .arg(&self.master)
                        .query::<Value>(&mut c)
                });
            match asked {
                Ok(Value::Array(a)) if a.len() == 2 => {
                    let text = |v: &Value| match v {
                        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                        Value::SimpleString(s) => s.clone(),
                        Value::Int(i) => i.to_string(),
                        _ => String::new(),
                    };
                    let addr = format!("{}:{}", text(&a[0]), text(&a[1]));
                    trace!(
                        "Sentinel {} names {addr} as master '{}'",
                        addr_of(sentinel),
                        self.master
                    );
                    return client_at(&self.template, &addr).map_err(|e| EndpointError {
                        text: format!("Sentinel {} named {addr}: {e}", addr_of(sentinel)),
                        refused: false,
                    });
                }
                Ok(_) => {
                    unknown += 1;
                    failures.push(format!(
                        "Sentinel {} knows no master named '{}'",
                        addr_of(sentinel),
                        self.master
                    ));
                }
                Err(e) => {
                    if e.kind() == redis::ErrorKind::AuthenticationFailed
                        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
                    {
                        unknown += 1;
                    }
                    failures.push(format!(
                        "Sentinel {}: {}{}",
                        addr_of(sentinel),
                        e,
                        if e.kind() == redis::ErrorKind::AuthenticationFailed
                            || matches!(e.code(), Some("NOAUTH" | "WRONGPASS"))
                        {
                            " (set LOCKCTL_SENTINEL_USERNAME / LOCKCTL_SENTINEL_PASSWORD for the \
                         Sentinels; the URL's credentials are the data nodes')"
                        } else {
                            ""
                        }
                    ))
                }
            }
        }
        let all_unknown = unknown > 0 && unknown == failures.len();
        Err(EndpointError {
            text: format!(
                "no Sentinel named a master: {}{}",
                failures.join("; "),
                if all_unknown {
                    " (check the master name: SENTINEL MASTERS on a Sentinel lists them)"
                } else {
                    ""
                }
            ),
            refused: all_unknown,
        })
    }
}

fn addr_text(info: &redis::ConnectionInfo) -> String {
    match info.addr() {
        redis::ConnectionAddr::Tcp(h, p)
        | redis::ConnectionAddr::TcpTls {
            host: h, port: p, ..
        } => {
            if h.contains(':') {
                format!("[{h}]:{p}")
            } else {
                format!("{h}:{p}")
            }
        }
        redis::ConnectionAddr::Unix(p) => p.display().to_string(),
        _ => String::new(),
    }
}
