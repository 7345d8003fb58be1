//! Where a lock lives in Redis.
//!
//! The lock key `<prefix><NAME>` is a plain string holding the token, so canonical clients (redis-py's
//! `Lock`, redsync, node-redlock) on the same key exclude each other with lockctl. Two auxiliary keys
//! sit beside it: the fencing counter (never expires) and the holder hash (expires with the lock).
//!
//! Both must live in the lock key's hash slot so that one script can touch all three on Redis Cluster.
//! When the lock key carries a hash tag (`{...}`) the auxiliary keys append to it and share the tag;
//! otherwise they wrap the whole key in braces, which makes it their tag. Their names contain the
//! control character U+001F, which no lock name or prefix may contain, so an auxiliary key can never be
//! mistaken for, or collide with, the lock key of another name, whatever the prefix.

/// Separator that marks auxiliary keys; forbidden in names and prefixes.
pub const AUX_SEPARATOR: char = '\u{1f}';

/// The keys and channel of one lock.
#[derive(Debug, Clone)]
pub struct LockKeys {
    /// The lock name.
    pub name: String,
    /// `<prefix><name>`: holds the token.
    pub key: String,
    /// Fencing counter.
    pub fence: String,
    /// Holder information (host, pid, cmd, acquired_ms, token, fence).
    pub holder: String,
    /// Pub/sub channel on which releases are announced.
    pub channel: String,
}

impl LockKeys {
    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> LockKeys {
        let key = format!("{prefix}{name}");
        let base = if has_hash_tag(&key) || key.contains('}') {
            // Already tagged: the suffix keeps the tag. (A key with a stray '}' and no tag cannot be
            // wrapped; it stays on one slot only outside Cluster.)
            key.clone()
        } else {
            format!("{{{key}}}")
        };
        let aux = |kind: &str| format!("{base}{AUX_SEPARATOR}{kind}");
        LockKeys {
            name: name.to_string(),
            fence: aux("fence"),
            holder: aux("holder"),
            channel: aux("released"),
            key,
        }
    }
}

/// True when a key name is a lock key rather than one of lockctl's auxiliary keys.
pub fn is_lock_key(key: &[u8]) -> bool {
    !key.contains(&(AUX_SEPARATOR as u8))
}

/// Redis Cluster's rule: the slot is taken from the text between the first `{` and the next `}`,
/// when that text is not empty.
fn has_hash_tag(key: &str) -> bool {
    match key.find('{') {
        Some(open) => match key[open + 1..].find('}') {
            Some(len) => len > 0,
            None => false,
        },
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_key_is_wrapped() {
        let k = LockKeys::new("lockctl:", "deploy");
        assert_eq!(k.key, "lockctl:deploy");
        assert_eq!(k.fence, "{lockctl:deploy}\u{1f}fence");
    }

    #[test]
    fn tagged_key_keeps_its_tag() {
        let k = LockKeys::new("lockctl:", "{app}:x");
        assert_eq!(k.fence, "lockctl:{app}:x\u{1f}fence");
        assert!(is_lock_key(k.key.as_bytes()));
        assert!(!is_lock_key(k.fence.as_bytes()));
    }
}
