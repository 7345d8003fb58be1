//! Results on stdout: plain for people, `env` for `eval`, JSON for programs.

use serde_json::json;

use crate::lock::Grant;

/// Writes a result to stdout. A closed stdout (`lockctl status x | head -0`) is an error that exits 1
/// with a message, never a panic.
pub fn emit(text: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .context("cannot write the result to stdout")
}

/// Quotes a value for a POSIX shell: single quotes, with each `'` written as `'\''`.
pub fn shell_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `export` lines for `eval "$(lockctl acquire NAME --format env)"`.
pub fn grant_env(g: &Grant) -> String {
    let validity = ("LOCKCTL_VALIDITY_MS", g.validity.as_millis().to_string());
    g.env()
        .iter()
        .chain(std::iter::once(&validity))
        .map(|(k, v)| format!("export {k}={}\n", shell_quote(v)))
        .collect()
}

/// One JSON object describing a grant.
pub fn grant_json(g: &Grant) -> serde_json::Value {
    json!({
        "name": g.keys.name,
        "key": g.keys.key,
        "token": g.token,
        "fence": g.fence,
        "ttl_ms": g.ttl.as_millis() as u64,
        "validity_ms": g.validity.as_millis() as u64,
        "nodes": g.nodes,
        "quorum": g.quorum,
        "slot": g.slot,
        "limit": g.limit,
    })
}

/// Milliseconds as a short human duration (`1.5s`, `250ms`, `2m 3s`).
pub fn human_ms(ms: i64) -> String {
    if ms < 0 {
        return "-".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    if ms < 60_000 {
        return format!("{:.1}s", ms as f64 / 1000.0);
    }
    humantime::format_duration(std::time::Duration::from_secs(ms as u64 / 1000)).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a'b"), "'a'\\''b'");
        assert_eq!(shell_quote(""), "''");
    }
}
