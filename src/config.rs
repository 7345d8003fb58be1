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
            for url in &conn.redis {
                nodes.push(check_url(url.trim())?);
            }
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
