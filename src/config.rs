//! Validated options: everything the user typed, checked before any Redis call.
//!
//! Bad input must lose nothing, so every value is checked here, up front, and a failure exits 2 with a
//! message that names the option and says how to fix it. Secrets are handled here too: URLs are kept
//! whole for connecting but only ever shown through [`redact`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::{ConnectionArgs, TimingArgs};
use crate::exit::LockError;
pub use crate::parse::{
    parse_drift_factor, parse_duration_or_zero, parse_positive_duration, parse_ttl, DEFAULT_TTL,
    MIN_TTL,
};

/// The default node when neither `-r` nor `LOCKCTL_REDIS` is given.
pub const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

/// Longest lock name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;

/// Checks a lock name: non-empty UTF-8, no control characters, at most 512 bytes.
pub fn check_name(name: &str) -> Result<(), LockError> {
    let bad = |why: &str| LockError::Usage(format!("invalid lock NAME: {why}"));
    if name.is_empty() {
        return Err(bad("it is empty; give a name such as 'nightly-backup'"));
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(bad(&format!(
            "it is {} bytes long; the limit is {MAX_NAME_BYTES} bytes",
            name.len()
        )));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(bad(&format!(
            "it contains the control character {c:?}; use printable characters only"
        )));
    }
    Ok(())
}

/// Checks a `--note`: at most [`crate::lock::queue::MAX_NOTE`] bytes, no control characters; an empty
/// note is none.
pub fn check_note(note: Option<&str>) -> Result<Option<&str>, LockError> {
    let Some(note) = note.filter(|n| !n.is_empty()) else {
        return Ok(None);
    };
    let max = crate::lock::queue::MAX_NOTE;
    if note.len() > max {
        return Err(LockError::Usage(format!(
            "invalid --note: it is {} bytes long; the limit is {max} bytes (put a link to the \
             details in the note instead)",
            note.len()
        )));
    }
    if let Some(c) = note.chars().find(|c| c.is_control()) {
        return Err(LockError::Usage(format!(
            "invalid --note: it contains the control character {c:?}; use one line of printable \
             characters"
        )));
    }
    Ok(Some(note))
}

/// Checks the key prefix: no control characters, which lockctl reserves for its auxiliary keys.
pub fn check_prefix(prefix: &str) -> Result<(), LockError> {
    if let Some(c) = prefix.chars().find(|c| c.is_control()) {
        return Err(LockError::Usage(format!(
            "invalid --prefix: it contains the control character {c:?}; use printable characters only"
        )));
    }
    if prefix.len() > MAX_NAME_BYTES {
        return Err(LockError::Usage(format!(
            "invalid --prefix: longer than {MAX_NAME_BYTES} bytes"
        )));
    }
    Ok(())
}

/// Checks a token given to release or renew.
pub fn check_token(token: Option<String>) -> Result<String, LockError> {
    let token = token.ok_or_else(|| {
        LockError::Usage(
            "no token: pass --token TOKEN or set LOCKCTL_TOKEN (acquire --format env sets it)"
                .into(),
        )
    })?;
    if token.is_empty() || token.len() > 1024 || token.chars().any(|c| c.is_control()) {
        return Err(LockError::Usage(
            "invalid --token: expected the token that acquire printed (32 hex digits)".into(),
        ));
    }
    Ok(token)
}

/// One node, as given on the command line.
#[derive(Clone)]
pub struct NodeSpec {
    /// The URL as given, secrets included: only for connecting.
    pub url: String,
    /// The URL with any password replaced by `***`: for every message.
    pub display: String,
    /// True for `rediss://`.
    pub tls: bool,
    /// What stands behind the URL.
    pub topology: Topology,
    /// `?replicas=N`: how many replicas must acknowledge a grant or renewal (`None`: every replica
    /// connected to the master at the time).
    pub replicas: Option<usize>,
}

/// What one `-r` reaches: the endpoint kinds of `lock::endpoint`.
#[derive(Clone, PartialEq)]
pub enum Topology {
    /// `redis://`, `rediss://`, `unix://`: one server, or any node of a Redis Cluster (found out from
    /// its redirects).
    Direct,
    /// `redis+cluster://`: seed URLs of one cluster (secrets included), the first also in `url`.
    Cluster { seeds: Vec<String> },
    /// `redis+sentinel://`: the Sentinels' URLs (with `LOCKCTL_SENTINEL_*` credentials) and the name
    /// of the master they watch; `url` holds the data nodes' credentials, db and TLS.
    Sentinel {
        sentinels: Vec<String>,
        master: String,
    },
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.display)
    }
}

/// TLS files for `rediss://` nodes.
#[derive(Debug, Clone, Default)]
pub struct TlsFiles {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// Everything the engine needs to reach the nodes.
#[derive(Debug, Clone)]
pub struct Settings {
    pub nodes: Vec<NodeSpec>,
    pub prefix: String,
    pub node_timeout: Duration,
    pub drift_factor: f64,
    /// `None`: the TTL of the operation.
    pub quarantine: Option<Duration>,
    pub tls: TlsFiles,
}

impl Settings {
    /// Validates the global options.
    pub fn from_args(conn: &ConnectionArgs, timing: &TimingArgs) -> Result<Settings, LockError> {
        check_prefix(&conn.prefix)?;
        let mut nodes = Vec::new();
        if let Some(path) = &conn.redis_file {
            for (line, url) in read_redis_file(path)? {
                nodes.push(check_url(&url).map_err(|e| {
                    LockError::Usage(format!("{}, line {line}: {e}", path.display()))
                })?);
            }
        } else if conn.redis.is_empty() {
            nodes.push(check_url(DEFAULT_REDIS)?);
        } else {
            let pieces: Vec<&str> = conn.redis.iter().map(|s| s.trim()).collect();
            for url in join_multi_host(&pieces) {
                nodes.push(check_url(&url)?);
            }
        }
        // The same server twice (another spelling, another db, another user) is not an independent
        // node: counting it twice would let one server decide a quorum.
        let servers: Vec<Vec<String>> = nodes.iter().map(NodeSpec::servers).collect();
        for (i, a) in nodes.iter().enumerate() {
            let twice = nodes[..i].iter().zip(&servers).find(|(b, server)| {
                b.url == a.url || server.iter().any(|s| servers[i].contains(s))
            });
            if let Some((b, _)) = twice {
                return Err(LockError::Usage(format!(
                    "invalid --redis: {} and {} reach the same server, cluster or Sentinel group; \
                     each -r is one vote, so Redlock needs independent endpoints",
                    b.display, a.display
                )));
            }
        }
        Ok(Settings {
            nodes,
            prefix: conn.prefix.clone(),
            node_timeout: conn.node_timeout,
            drift_factor: timing.drift_factor,
            quarantine: timing.quarantine,
            tls: TlsFiles {
                ca: conn.tls_ca.clone(),
                cert: conn.tls_cert.clone(),
                key: conn.tls_key.clone(),
            },
        })
    }
}

/// The URLs in a `--redis-file`, with their line numbers: one per line; blank lines and lines
/// starting with `#` are skipped. The file exists to keep passwords out of command lines, so one that
/// others can read draws a warning (not an error: the operator may have reasons, and a lock job that
/// stops running is worse).
fn read_redis_file(path: &Path) -> Result<Vec<(usize, String)>, LockError> {
    use std::os::unix::fs::PermissionsExt;
    let shown = path.display();
    let text = std::fs::read_to_string(path).map_err(|e| {
        LockError::Usage(format!(
            "cannot read --redis-file {shown}: {e}; create it with one Redis URL per line \
             (chmod 600), or give the nodes with --redis URL"
        ))
    })?;
    if let Ok(meta) = std::fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o044 != 0 {
            crate::complain!(
                "warning: --redis-file {shown} is readable by {} (mode {mode:03o}) and may hold \
                 passwords; make it private: chmod 600 {shown}",
                if mode & 0o004 != 0 {
                    "everyone"
                } else {
                    "its group"
                }
            );
        }
    }
    let urls: Vec<(usize, String)> = text
        .lines()
        .enumerate()
        .map(|(i, line)| (i + 1, line.trim()))
        .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
        .map(|(n, line)| (n, line.to_string()))
        .collect();
    if urls.is_empty() {
        return Err(LockError::Usage(format!(
            "--redis-file {shown} lists no URL; put one Redis URL per line, such as \
             redis://:PASSWORD@10.0.0.5:6379"
        )));
    }
    Ok(urls)
}

/// `-r` and `LOCKCTL_REDIS` split URLs at commas, which also separate the hosts of one
/// `redis+cluster://` or `redis+sentinel://` URL: a piece without a scheme after such a URL is one of
/// its hosts, and is joined back.
pub fn join_multi_host(pieces: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(pieces.len());
    for piece in pieces {
        match out.last_mut() {
            Some(last)
                if !piece.contains("://")
                    && !piece.is_empty()
                    && last.split_once("://").is_some_and(|(s, _)| {
                        s.ends_with("+cluster") || s.ends_with("+sentinel")
                    }) =>
            {
                last.push(',');
                last.push_str(piece);
            }
            _ => out.push(piece.to_string()),
        }
    }
    out
}

/// The server a URL points at (`host:port` or the socket path), whatever its user, password or db.
fn server_of(url: &str) -> Option<String> {
    use redis::ConnectionAddr;
    let info = redis::IntoConnectionInfo::into_connection_info(url).ok()?;
    Some(match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{}:{port}", host.to_ascii_lowercase())
        }
        ConnectionAddr::Unix(path) => format!("unix:{}", path.display()),
        _ => return None,
    })
}

impl NodeSpec {
    /// What this endpoint reaches, as `host:port`, `unix:PATH` or `sentinel:host:port/MASTER`:
    /// two endpoints that share one of these are not independent.
    fn servers(&self) -> Vec<String> {
        match &self.topology {
            Topology::Direct => server_of(&self.url).into_iter().collect(),
            Topology::Cluster { seeds } => seeds.iter().filter_map(|u| server_of(u)).collect(),
            Topology::Sentinel { sentinels, master } => sentinels
                .iter()
                .filter_map(|u| server_of(u))
                .map(|s| format!("sentinel:{s}/{master}"))
                .collect(),
        }
    }
}

/// `?replicas=N` of a node URL.
fn replicas_param(query: Option<&str>) -> Result<Option<usize>, String> {
    let Some(query) = query else { return Ok(None) };
    let mut found = None;
    for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
        if k == "replicas" {
            if v == "all" {
                found = None;
                continue;
            }
            found = Some(v.parse::<usize>().map_err(|_| {
                format!(
                    "replicas={v} is not a number; use ?replicas=N (the replicas that must \
                     acknowledge each grant and renewal; 0 turns the wait off) or ?replicas=all"
                )
            })?);
        }
    }
    Ok(found)
}

/// Checks a `redis+cluster://` or `redis+sentinel://` URL (`rediss+` for TLS): several `host:port`
/// separated by commas, which `url` cannot parse, so the URL is taken apart here and each node's URL
/// is put together as `redis://` or `rediss://`.
fn check_multi_host_url(url: &str, display: &str) -> Result<NodeSpec, LockError> {
    let bad = |why: String| LockError::Usage(format!("invalid --redis URL {display}: {why}"));
    let (scheme, rest) = url.split_once("://").unwrap_or((url, ""));
    let (tls, sentinel) = match scheme {
        "redis+cluster" => (false, false),
        "rediss+cluster" => (true, false),
        "redis+sentinel" => (false, true),
        "rediss+sentinel" => (true, true),
        _ => unreachable!("only called for the multi-host schemes"),
    };
    let data_scheme = if tls { "rediss" } else { "redis" };
    let usage = if sentinel {
        format!("use {scheme}://[user:password@]host:port[,host:port...]/MASTER[/DB]")
    } else {
        format!("use {scheme}://[user:password@]host:port[,host:port...]")
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    if rest.contains('#') {
        return Err(bad(
            "a URL fragment (#...) is not supported; percent-encode '#' in a password as %23"
                .into(),
        ));
    }
    let (authority, path) = match rest.find('/') {
        // A password may hold '/' only percent-encoded; the authority ends at the last '@' before it.
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let hosts: Vec<&str> = hosts.split(',').map(str::trim).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(bad(format!("an empty host in the list; {usage}")));
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (master, db) = if sentinel {
        match segments.as_slice() {
            [master] => (Some(*master), None),
            [master, db] => (Some(*master), Some(*db)),
            [] => return Err(bad(format!("no master name; {usage}"))),
            _ => return Err(bad(format!("too many path segments; {usage}"))),
        }
    } else {
        match segments.as_slice() {
            [] => (None, None),
            [db] => (None, Some(*db)),
            _ => return Err(bad(format!("too many path segments; {usage}"))),
        }
    };
    if let Some(db) = db {
        if db.parse::<u32>().is_err() {
            return Err(bad(format!("the database '{db}' is not a number; {usage}")));
        }
        if !sentinel && db != "0" {
            return Err(bad("Redis Cluster has only database 0".into()));
        }
    }
    // Percent-decoding; a '+' stays a '+' as in any URL path.
    let master = master.map(|m| {
        url::form_urlencoded::parse(format!("m={}", m.replace('+', "%2B")).as_bytes())
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default()
    });
    let replicas = replicas_param(query).map_err(bad)?;
    let creds = userinfo.map_or(String::new(), |u| format!("{u}@"));
    let tail = format!(
        "{}{}",
        db.map_or(String::new(), |d| format!("/{d}")),
        query.map_or(String::new(), |q| format!("?{q}"))
    );
    let mut node_urls = Vec::with_capacity(hosts.len());
    for host in &hosts {
        let node = format!("{data_scheme}://{creds}{host}{tail}");
        let parsed = url::Url::parse(&node).ok().filter(|u| {
            u.host_str().is_some_and(|h| !h.is_empty()) && u.path().len() <= 1 + tail.len()
        });
        if parsed.is_none()
            || redis::IntoConnectionInfo::into_connection_info(node.as_str()).is_err()
        {
            return Err(bad(format!(
                "'{}' is not a host:port; {usage}",
                redact(&format!("{data_scheme}://{host}"))
                    .trim_start_matches(&format!("{data_scheme}://"))
            )));
        }
        node_urls.push(node);
    }
    let topology = match master {
        Some(master) => {
            let user = std::env::var("LOCKCTL_SENTINEL_USERNAME").unwrap_or_default();
            let pass = std::env::var("LOCKCTL_SENTINEL_PASSWORD").unwrap_or_default();
            let enc =
                |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            let sentinel_creds = match (user.is_empty(), pass.is_empty()) {
                (_, true) => String::new(),
                (true, false) => format!(":{}@", enc(&pass)),
                (false, false) => format!("{}:{}@", enc(&user), enc(&pass)),
            };
            Topology::Sentinel {
                sentinels: hosts
                    .iter()
                    .map(|h| format!("{data_scheme}://{sentinel_creds}{h}"))
                    .collect(),
                master,
            }
        }
        None => Topology::Cluster {
            seeds: node_urls.clone(),
        },
    };
    Ok(NodeSpec {
        url: node_urls.swap_remove(0),
        display: display.to_string(),
        tls,
        topology,
        replicas,
    })
}

/// Checks one node URL and makes its redacted form.
pub fn check_url(url: &str) -> Result<NodeSpec, LockError> {
    let display = redact(url);
    if [
        "redis+cluster://",
        "rediss+cluster://",
        "redis+sentinel://",
        "rediss+sentinel://",
    ]
    .iter()
    .any(|s| url.starts_with(s))
    {
        return check_multi_host_url(url, &display);
    }
    let bad = |why: String| LockError::Usage(format!("invalid --redis URL {display}: {why}"));
    if url.is_empty() {
        return Err(LockError::Usage(
            "invalid --redis: empty URL; use e.g. redis://127.0.0.1:6379".into(),
        ));
    }
    if let Some(why) = misspelt(url) {
        return Err(bad(why));
    }
    let parsed = url::Url::parse(url).map_err(|e| {
        bad(format!(
            "{e}; use redis://host:port, rediss://host:port or unix:///path"
        ))
    })?;
    let tls = match parsed.scheme() {
        "redis" => false,
        "rediss" => true,
        "unix" | "redis+unix" => {
            if parsed.path().is_empty() || parsed.path() == "/" {
                return Err(bad("no socket path; use unix:///path/to/redis.sock".into()));
            }
            false
        }
        other => {
            return Err(bad(format!(
                "unknown scheme '{other}'; use redis://, rediss:// (TLS), unix://, \
                 redis+cluster://host:port,host:port or redis+sentinel://host:port,host:port/MASTER"
            )))
        }
    };
    if !parsed.scheme().contains("unix") && parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host; use e.g. redis://127.0.0.1:6379".into()));
    }
    if parsed.scheme().contains("unix")
        && (parsed.host_str().is_some_and(|h| !h.is_empty())
            || !parsed.username().is_empty()
            || parsed.password().is_some())
    {
        return Err(bad(
            "a unix URL has no host or user info; use unix:///path/to/redis.sock?user=NAME&pass=PASSWORD"
                .into(),
        ));
    }
    if let Some(fragment) = parsed.fragment() {
        let why = if fragment == "insecure" {
            "#insecure would turn off certificate verification, which lockctl does not do; \
             give the CA that signed the server's certificate with --tls-ca FILE"
        } else {
            "a URL fragment (#...) is not supported; percent-encode '#' in a password as %23"
        };
        return Err(bad(why.into()));
    }
    if let Err(e) = redis::IntoConnectionInfo::into_connection_info(url) {
        return Err(bad(e.to_string().replace(url, &display)));
    }
    let replicas = replicas_param(parsed.query()).map_err(bad)?;
    Ok(NodeSpec {
        url: url.to_string(),
        display,
        tls,
        topology: Topology::Direct,
        replicas,
    })
}

/// What is wrong with a URL written the way people often mistype one, and how to write it.
fn misspelt(url: &str) -> Option<String> {
    let Some((_, rest)) = url.split_once("://") else {
        // `127.0.0.1:6379`, `/run/redis.sock`: no scheme. The text is repeated only when it looks
        // like a host and port, or a path, never a password pasted in the wrong place.
        let plain = url.rsplit_once(':').is_some_and(|(host, port)| {
            !port.is_empty()
                && port.bytes().all(|b| b.is_ascii_digit())
                && (host == "localhost" || host.contains(['.', ']']))
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        });
        let scheme = url.split_once(':').map_or("", |(s, _)| s);
        return Some(
            if ["redis", "rediss", "unix", "redis+unix"].contains(&scheme) {
                let example = if scheme.contains("unix") {
                    "/path/to/redis.sock"
                } else {
                    "host:port"
                };
                format!("'{scheme}:' must be followed by '//'; write {scheme}://{example}")
            } else if url.starts_with('/') && !url.contains(['?', '@']) {
                format!("no scheme; for a unix socket write unix://{url}")
            } else if plain {
                format!("no scheme; write redis://{url} (or rediss://{url} for TLS)")
            } else {
                "no scheme; write redis://[user:password@]host:port, rediss:// for TLS or \
                 unix:///path/to/redis.sock"
                    .into()
            },
        );
    };
    // The host part ends at the first `/`, `?` or `#`: an `@` after one means a password holds it.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    if url.starts_with("redis") && !url.contains("unix") && rest[end..].contains('@') {
        return Some(
            "the password seems to contain '/', '?' or '#', which end the host part of a URL; \
             percent-encode them in the password ('/' as %2F, '?' as %3F, '#' as %23, '@' as %40, \
             '%' as %25)"
                .into(),
        );
    }
    None
}

/// Query parameters shown as they are: none of them can hold a secret.
const SHOWN_QUERY_KEYS: [&str; 4] = ["db", "user", "protocol", "replicas"];

/// The URL with every part that could hold a secret replaced by `***`.
///
/// Only what is known to be harmless is shown: the scheme, the host and port, a user name that comes
/// with a password, a numeric database, a unix socket path, and the `db`, `user` and `protocol` query
/// parameters. A password in the userinfo or in a query parameter becomes `***`; so does a lone user
/// name (`redis://secret@host` is how people mistype `redis://:secret@host`, and Redis ignores a user
/// without a password anyway), an unexpected path, query parameter or fragment, where a password with
/// an unescaped `/`, `?`, `&` or `#` ends up. Anything the URL parser rejects is shown as its scheme
/// alone.
pub fn redact(url: &str) -> String {
    if let Some(shown) = redact_multi_host(url) {
        return shown;
    }
    let opaque = || match url.split_once("://") {
        Some((scheme, _))
            if !scheme.is_empty()
                && scheme.len() <= 16
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+') =>
        {
            format!("{scheme}://…")
        }
        _ => "'…' (not a URL)".into(),
    };
    let Ok(mut u) = url::Url::parse(url) else {
        return opaque();
    };
    if u.cannot_be_a_base() {
        // `redis:user:secret@host`: everything after the scheme is one opaque path.
        return opaque();
    }
    if [Some(u.path()), u.query(), u.fragment()]
        .iter()
        .flatten()
        .any(|part| part.contains('@'))
    {
        // `redis://secret/with/slash@host`: a password with an unescaped `/`, `?` or `#` ended the
        // authority early, so the host and port hold pieces of it.
        return opaque();
    }
    let unix = u.scheme().contains("unix");
    if unix && u.host_str().is_some_and(|h| !h.is_empty()) {
        // A unix URL has no host; one that has is malformed, and its path may hold a secret.
        return opaque();
    }
    let hidden = if u.password().is_some() {
        u.set_password(Some("***"))
    } else if !u.username().is_empty() {
        u.set_username("***")
    } else {
        Ok(())
    };
    if hidden.is_err() {
        return opaque();
    }
    if !unix
        && !u
            .path()
            .trim_matches('/')
            .bytes()
            .all(|b| b.is_ascii_digit())
    {
        u.set_path("/***");
    }
    if u.fragment().is_some_and(|f| f != "insecure") {
        u.set_fragment(Some("***"));
    }
    if u.query().is_some() {
        let shown: Vec<String> = u
            .query_pairs()
            .map(|(k, v)| {
                if SHOWN_QUERY_KEYS.contains(&k.as_ref()) {
                    url::form_urlencoded::Serializer::new(String::new())
                        .append_pair(&k, &v)
                        .finish()
                } else if matches!(k.as_ref(), "pass" | "password") {
                    format!("{k}=***")
                } else {
                    "***".into()
                }
            })
            .collect();
        u.set_query(Some(&shown.join("&")));
    }
    u.to_string()
}

/// A `redis+cluster://` or `redis+sentinel://` URL redacted host by host: each `host:port` goes through
/// [`redact`] as a `redis://` URL with the userinfo, the master name is shown (percent-encoded, it names
/// no secret), and the rest as [`redact`] shows it.
fn redact_multi_host(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(
        scheme,
        "redis+cluster" | "rediss+cluster" | "redis+sentinel" | "rediss+sentinel"
    ) {
        return None;
    }
    let opaque = format!("{scheme}://…");
    if rest.contains('#') {
        return Some(opaque);
    }
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if path.contains('@') {
        return Some(opaque);
    }
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    let mut shown_user = String::new();
    let mut shown_hosts = Vec::new();
    for host in hosts.split(',') {
        let one = match userinfo {
            Some(u) => redact(&format!("redis://{u}@{host}")),
            None => redact(&format!("redis://{host}")),
        };
        let Some(after) = one.strip_prefix("redis://") else {
            return Some(opaque);
        };
        let (user, h) = match after.rsplit_once('@') {
            Some((u, h)) => (format!("{u}@"), h),
            None => (String::new(), after),
        };
        shown_user = user;
        shown_hosts.push(h.trim_end_matches('/').to_string());
    }
    let shown_path: String = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            if s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._~%+".contains(c))
            {
                format!("/{s}")
            } else {
                let enc: String = url::form_urlencoded::byte_serialize(s.as_bytes()).collect();
                format!("/{enc}")
            }
        })
        .collect();
    let shown_query = query.map_or(String::new(), |q| {
        let r = redact(&format!("redis://h/?{q}"));
        r.split_once('?')
            .map_or(String::new(), |(_, q)| format!("?{q}"))
    });
    Some(format!(
        "{scheme}://{shown_user}{}{shown_path}{shown_query}",
        shown_hosts.join(",")
    ))
}

/// `text` (a command line) with every URL in it redacted by [`redact`].
///
/// The holder of a lock is recorded with its command line, which `status`, `list`, `break` and waiting
/// clients print, and which is stored in Redis for anyone who can read the key: a script that runs
/// `lockctl -r redis://:secret@host acquire ...` must not publish its password that way. A URL is
/// taken to run from its scheme to the next whitespace, quote or comma.
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        let start = rest[..at]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-')))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let end = rest[at..]
            .find(|c: char| c.is_whitespace() || matches!(c, '\'' | '"' | '`' | ','))
            .map_or(rest.len(), |i| at + i);
        out.push_str(&rest[..start]);
        out.push_str(&redact(&rest[start..end]));
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redaction() {
        assert_eq!(
            redact("redis://user:s3cret@localhost:6379/2"),
            "redis://user:***@localhost:6379/2"
        );
        assert!(!redact("unix:///tmp/r.sock?pass=s3cret").contains("s3cret"));
        assert!(!redact("ftp://u:s3cret@x").contains("s3cret"));
        assert!(!redact("not a url s3cret").contains("s3cret"));
    }

    #[test]
    fn multi_host_urls_are_joined_back() {
        assert_eq!(
            join_multi_host(&[
                "redis+sentinel://a:1",
                "b:2",
                "c:3/m",
                "redis://x",
                "redis+cluster://d:4",
                "e:5"
            ]),
            [
                "redis+sentinel://a:1,b:2,c:3/m",
                "redis://x",
                "redis+cluster://d:4,e:5"
            ]
        );
        let spec = check_url("redis+sentinel://u:pw@a:1,b:2/my%2Bmaster/3?replicas=1").unwrap();
        assert_eq!(
            spec.display,
            "redis+sentinel://u:***@a:1,b:2/my%2Bmaster/3?replicas=1"
        );
        assert_eq!(spec.replicas, Some(1));
        assert!(spec.url.starts_with("redis://u:pw@a:1/3"));
        match spec.topology {
            Topology::Sentinel { sentinels, master } => {
                assert_eq!(master, "my+master");
                assert_eq!(sentinels.len(), 2);
            }
            _ => panic!("not a Sentinel URL"),
        }
        assert!(check_url("redis+cluster://a:1,b:2/3").is_err());
        assert!(!redact("rediss+cluster://:s3cret@a:1,b:2").contains("s3cret"));
    }

    #[test]
    fn names() {
        assert!(check_name("ok-name").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(513)).is_err());
        assert!(check_name(&"x".repeat(512)).is_ok());
    }
}
