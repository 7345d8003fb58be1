//! Validated options: everything the user typed, checked before any Redis call.
//!
//! Bad input must lose nothing, so every value is checked here, up front, and a failure exits 2 with a
//! message that names the option and says how to fix it. Secrets are handled here too: URLs are kept
//! whole for connecting but only ever shown through [`redact`].

use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{ConnectionArgs, TimingArgs};
use crate::exit::LockError;

/// The default node when neither `-r` nor `LOCKCTL_REDIS` is given.
pub const DEFAULT_REDIS: &str = "redis://127.0.0.1:6379";

/// Longest accepted duration: anything beyond a year is a typo, not a lease.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 3600);

/// Longest lock name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;

/// Parses `250ms`, `30s`, `1h30m` (humantime) or a bare, possibly fractional, number of seconds.
/// Zero is allowed here; see [`parse_positive_duration`].
pub fn parse_duration_or_zero(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration; use e.g. 250ms, 30s, 2m, 1h30m or seconds like 0.5".into());
    }
    if s.starts_with('-') {
        return Err("a duration cannot be negative".into());
    }
    let d = if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        let secs: f64 = s
            .parse()
            .map_err(|_| format!("'{s}' is not a number of seconds; use e.g. 10, 0.5 or 30s"))?;
        if secs > MAX_DURATION.as_secs_f64() {
            return Err(too_long());
        }
        Duration::from_secs_f64(secs)
    } else {
        humantime::parse_duration(s)
            .map_err(|e| format!("{e}; use e.g. 250ms, 30s, 2m, 1h30m or seconds like 0.5"))?
    };
    if d > MAX_DURATION {
        return Err(too_long());
    }
    Ok(d)
}

fn too_long() -> String {
    "longer than a year; that is surely a typo".into()
}

/// A duration of at least one millisecond (TTL, node timeout): Redis counts in milliseconds.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    let d = parse_duration_or_zero(text)?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    if d < Duration::from_millis(1) {
        return Err("must be at least 1ms".into());
    }
    Ok(d)
}

/// Shortest lease worth asking for: the fixed clock-drift allowance alone is 2 ms, so a shorter TTL
/// could never be granted and would only ever look busy.
pub const MIN_TTL: Duration = Duration::from_millis(10);

/// A lease TTL: at least [`MIN_TTL`].
pub fn parse_ttl(text: &str) -> Result<Duration, String> {
    let d = parse_positive_duration(text)?;
    if d < MIN_TTL {
        return Err(
            "must be at least 10ms: the clock-drift allowance alone is 2ms, so a shorter lease \
             could never be granted"
                .into(),
        );
    }
    Ok(d)
}

/// The Redlock clock-drift factor: a fraction of the TTL in [0, 0.5).
pub fn parse_drift_factor(text: &str) -> Result<f64, String> {
    let f: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("'{text}' is not a number; use a fraction such as 0.01"))?;
    if !(0.0..0.5).contains(&f) {
        return Err("must be at least 0 and below 0.5 (0.01 is the usual value)".into());
    }
    Ok(f)
}

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
        let urls: Vec<&str> = if conn.redis.is_empty() {
            vec![DEFAULT_REDIS]
        } else {
            conn.redis.iter().map(|s| s.trim()).collect()
        };
        let mut nodes = Vec::with_capacity(urls.len());
        for url in urls {
            nodes.push(check_url(url)?);
        }
        // The same server twice (another spelling, another db, another user) is not an independent
        // node: counting it twice would let one server decide a quorum.
        let servers: Vec<Option<String>> = nodes.iter().map(|n| server_of(&n.url)).collect();
        for (i, a) in nodes.iter().enumerate() {
            let twice = nodes[..i]
                .iter()
                .zip(&servers)
                .any(|(b, server)| b.url == a.url || (server.is_some() && *server == servers[i]));
            if twice {
                return Err(LockError::Usage(format!(
                    "invalid --redis: {} is the same server as another URL; Redlock needs \
                     independent nodes",
                    a.display
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

/// Checks one node URL and makes its redacted form.
pub fn check_url(url: &str) -> Result<NodeSpec, LockError> {
    let display = redact(url);
    let bad = |why: String| LockError::Usage(format!("invalid --redis URL {display}: {why}"));
    if url.is_empty() {
        return Err(LockError::Usage(
            "invalid --redis: empty URL; use e.g. redis://127.0.0.1:6379".into(),
        ));
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
                "unknown scheme '{other}'; use redis://, rediss:// (TLS) or unix://"
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
    Ok(NodeSpec {
        url: url.to_string(),
        display,
        tls,
    })
}

/// Query parameters shown as they are: none of them can hold a secret.
const SHOWN_QUERY_KEYS: [&str; 3] = ["db", "user", "protocol"];

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
    fn durations() {
        assert_eq!(
            parse_duration_or_zero("1.5").unwrap(),
            Duration::from_millis(1500)
        );
        assert_eq!(
            parse_duration_or_zero("250ms").unwrap(),
            Duration::from_millis(250)
        );
        assert_eq!(
            parse_duration_or_zero("1h30m").unwrap(),
            Duration::from_secs(5400)
        );
        assert!(parse_positive_duration("0").is_err());
        assert!(parse_positive_duration("0s").is_err());
        assert!(parse_duration_or_zero("-1").is_err());
        assert!(parse_duration_or_zero("abc").is_err());
        assert!(parse_duration_or_zero("1e400").is_err());
        assert!(parse_duration_or_zero("100y").is_err());
        assert!(parse_duration_or_zero("nan").is_err());
    }

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
    fn names() {
        assert!(check_name("ok-name").is_ok());
        assert!(check_name("").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(513)).is_err());
        assert!(check_name(&"x".repeat(512)).is_ok());
    }
}
