//! Where a lock lives in Redis.
//!
//! The lock key `<prefix><NAME>` is a plain string holding the token, so canonical clients (redis-py's
//! `Lock`, redsync, node-redlock) on the same key exclude each other with lockctl. Two auxiliary keys
//! sit beside it: the fencing counter (never expires) and the holder hash (expires with the lock), and
//! releases are announced on a channel named the same way. A semaphore (`--limit N`) adds slots 2..N,
//! each a plain string key with a holder hash of its own (`slot\x1f<i>`, `holder\x1f<i>`; slot 1 is
//! the lock key), and a `limit` key recording N; `--limit 1` adds nothing. While anyone waits, the
//! queue's keys are there too (`queue`, `alive`, `waiters`, `tickets`, `superseded`, `seen`; they expire a
//! few seconds after the last waiter leaves), and each waiter listens on a wake channel of its own
//! (see `queue.rs`). A release leaves a record of what it deleted (`release\x1f<token>`) for a
//! little longer than the node timeout, which a release sent again reads (see `release.lua`); the
//! rollback of an attempt that timed out on a node leaves one there for the attempt's TTL, which
//! that attempt reads should it run late (its tombstone, `acquire.lua`); a break leaves its answer
//! beside them (`release\x1fbreak.<id>`) for a break sent again (`break.lua`).
//!
//! Two rules shape their names:
//!
//! - **Every key of a lock is in the lock key's cluster slot**, so one script can touch all of them on
//!   Redis Cluster. An auxiliary name starts with a hash tag `{T}` whose slot is the lock key's.
//! - **Two names never share a key.** An auxiliary name is built so that the lock key can be read back
//!   from it, and no other lock key gives the same name.
//!
//! A lock key with no brace at all gets `{<key>}\x1f<kind>`: the key is its own tag. (This is the
//! layout of earlier versions; existing fencing counters stay where they are.) A lock key with a brace
//! cannot be wrapped that way (`{x}` would give `{{x}}\x1f...`, whose tag is `{x`, and `x` and `{x}`
//! shared keys), so it gets `{T}\x1f<key>\x1f<kind>`, where `T` is the key's own hash tag when it has
//! one (Redis Cluster's rule: the text between the first `{` and the next `}`, if not empty) and
//! otherwise the smallest decimal number whose slot is the whole key's slot. Such a name contains two
//! separators and a plain key's names one, so the two layouts never meet; within each layout the lock
//! key is spelled out in full. The separator is U+001F, which no lock name or prefix may contain, so no
//! auxiliary key is ever mistaken for a lock key.

/// Separator that marks auxiliary keys; forbidden in names and prefixes.
pub const AUX_SEPARATOR: char = '\u{1f}';

/// Number of hash slots in Redis Cluster.
const SLOTS: u16 = 16384;

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
    /// The semaphore's limit N (`--limit`), kept while any of its slots is held; absent for a plain
    /// lock.
    pub limit: String,
    /// `<slot base><i>` is slot i's key for i >= 2 (slot 1 is `key`).
    pub slot_base: String,
    /// `<holder base><i>` is slot i's holder hash for i >= 2 (slot 1's is `holder`).
    pub holder_base: String,
    /// The queue of waiters: waiter id by ticket (see `queue.rs`).
    pub queue: String,
    /// Waiter id by heartbeat expiry, in server milliseconds.
    pub alive: String,
    /// Waiter id to its record (JSON: host, pid, cmd, note, since_ms, ticket).
    pub waiters: String,
    /// The ticket counter.
    pub tickets: String,
    /// Displaced waiter id to the record of the waiter that superseded it (expires after a minute).
    pub superseded: String,
    /// The server time of the last script that looked at the queue, so that a node notices its own
    /// stall (see `front.lua`).
    pub seen: String,
    /// Prefix of the per-waiter wake channels: `<wake>\x1f<waiter id>`.
    pub wake: String,
    /// `<release base><token>` records the slots that token's release deleted, briefly.
    pub release_base: String,
}

impl LockKeys {
    /// The wake channel of waiter `id`.
    pub fn wake_channel(&self, id: &str) -> String {
        format!("{}{AUX_SEPARATOR}{id}", self.wake)
    }

    /// The keys of lock `name` under `prefix`.
    pub fn new(prefix: &str, name: &str) -> LockKeys {
        let key = format!("{prefix}{name}");
        let base = if key.contains(['{', '}']) {
            let tag = match hash_tag(key.as_bytes()) {
                Some(tag) => String::from_utf8_lossy(tag).into_owned(),
                None => slot_twin(slot(key.as_bytes())),
            };
            format!("{{{tag}}}{AUX_SEPARATOR}{key}")
        } else {
            format!("{{{key}}}")
        };
        let aux = |kind: &str| format!("{base}{AUX_SEPARATOR}{kind}");
        LockKeys {
            name: name.to_string(),
            fence: aux("fence"),
            holder: aux("holder"),
            channel: aux("released"),
            limit: aux("limit"),
            slot_base: format!("{}{AUX_SEPARATOR}", aux("slot")),
            holder_base: format!("{}{AUX_SEPARATOR}", aux("holder")),
            queue: aux("queue"),
            alive: aux("alive"),
            waiters: aux("waiters"),
            tickets: aux("tickets"),
            superseded: aux("superseded"),
            seen: aux("seen"),
            wake: aux("wake"),
            release_base: format!("{}{AUX_SEPARATOR}", aux("release")),
            key,
        }
    }

    /// The key of slot `i` (1-based): the lock key itself for slot 1, so `--limit 1` is a plain lock.
    pub fn slot_key(&self, i: usize) -> String {
        if i <= 1 {
            self.key.clone()
        } else {
            format!("{}{i}", self.slot_base)
        }
    }

    /// The record of `token`'s release (see `release.lua`).
    pub fn release_record(&self, token: &str) -> String {
        format!("{}{token}", self.release_base)
    }

    /// The record of `token`'s renewal under a server's new run id, after a restart that kept the
    /// key (see `renew.lua`): a renewal sent again then never puts back a key broken meanwhile.
    pub fn renew_record(&self, token: &str) -> String {
        format!("{}renewed.{token}", self.release_base)
    }

    /// The record of the break call `id` (see `break.lua`): beside the release records, so that
    /// whatever skips those (`list`, `status`) skips it too.
    pub fn break_record(&self, id: &str) -> String {
        format!("{}break.{id}", self.release_base)
    }

    /// The holder hash of slot `i` (1-based).
    pub fn slot_holder(&self, i: usize) -> String {
        if i <= 1 {
            self.holder.clone()
        } else {
            format!("{}{i}", self.holder_base)
        }
    }
}

/// True when a key name is a lock key rather than one of lockctl's auxiliary keys.
pub fn is_lock_key(key: &[u8]) -> bool {
    !key.contains(&(AUX_SEPARATOR as u8))
}

/// The lock key whose fencing counter is named `aux`, if `aux` names a fencing counter.
pub fn lock_key_of_counter(aux: &[u8]) -> Option<&[u8]> {
    let body = aux.strip_suffix("\u{1f}fence".as_bytes())?;
    match body.iter().position(|&b| b == AUX_SEPARATOR as u8) {
        // `{T}\x1f<key>`
        Some(i) => Some(&body[i + 1..]),
        // `{<key>}`
        None => body.strip_prefix(b"{")?.strip_suffix(b"}"),
    }
}

/// Redis Cluster's hash tag: the bytes between the first `{` and the next `}`, when not empty.
fn hash_tag(key: &[u8]) -> Option<&[u8]> {
    let open = key.iter().position(|&b| b == b'{')?;
    let len = key[open + 1..].iter().position(|&b| b == b'}')?;
    (len > 0).then(|| &key[open + 1..open + 1 + len])
}

/// The cluster slot of a key: CRC16 of its hash tag (or of the whole key) modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key).unwrap_or(key)) % SLOTS
}

/// The smallest decimal number `i` (as text) whose slot is `target`: a short hash tag for the slot of
/// a key that has no tag of its own. Every slot is reached below 110,000.
fn slot_twin(target: u16) -> String {
    (0u32..)
        .map(|i| i.to_string())
        .find(|s| crc16(s.as_bytes()) % SLOTS == target)
        .expect("every slot has a decimal twin")
}

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys with.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn all(k: &LockKeys) -> [String; 16] {
        [
            k.key.clone(),
            k.fence.clone(),
            k.holder.clone(),
            k.channel.clone(),
            k.limit.clone(),
            k.slot_key(2),
            k.slot_holder(2),
            k.slot_key(17),
            k.queue.clone(),
            k.alive.clone(),
            k.waiters.clone(),
            k.tickets.clone(),
            k.superseded.clone(),
            k.seen.clone(),
            k.wake.clone(),
            k.release_record("0123456789abcdef0123456789abcdef"),
        ]
    }

    #[test]
    fn crc16_matches_redis_cluster() {
        // The check value of CRC16-XMODEM, and slots Redis's CLUSTER KEYSLOT gives.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % SLOTS);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }

    #[test]
    fn plain_key_is_wrapped() {
        let k = LockKeys::new("lockctl:", "deploy");
        assert_eq!(k.key, "lockctl:deploy");
        assert_eq!(k.fence, "{lockctl:deploy}\u{1f}fence");
        assert_eq!(k.channel, "{lockctl:deploy}\u{1f}released");
        assert_eq!(k.slot_key(1), k.key);
        assert_eq!(k.slot_holder(1), k.holder);
        assert_eq!(k.slot_key(3), "{lockctl:deploy}\u{1f}slot\u{1f}3");
        assert_eq!(k.slot_holder(3), "{lockctl:deploy}\u{1f}holder\u{1f}3");
        assert_eq!(k.limit, "{lockctl:deploy}\u{1f}limit");
        assert_eq!(
            k.release_record("t"),
            "{lockctl:deploy}\u{1f}release\u{1f}t"
        );
        assert!(!is_lock_key(k.slot_key(2).as_bytes()));
    }

    #[test]
    fn tagged_key_keeps_its_tag() {
        let k = LockKeys::new("lockctl:", "{app}:x");
        assert_eq!(k.fence, "{app}\u{1f}lockctl:{app}:x\u{1f}fence");
        assert!(is_lock_key(k.key.as_bytes()));
        assert!(!is_lock_key(k.fence.as_bytes()));
    }

    #[test]
    fn every_key_of_a_lock_is_in_its_slot() {
        for name in [
            "x", "{x}", "a}b", "x{}y", "{}", "{", "}", "a{b", "}{x}", "{x}{y}",
        ] {
            for prefix in ["", "lockctl:", "{p}:"] {
                let k = LockKeys::new(prefix, name);
                let want = slot(k.key.as_bytes());
                for aux in &all(&k)[1..] {
                    assert_eq!(slot(aux.as_bytes()), want, "{aux:?} of {:?}", k.key);
                }
            }
        }
    }

    #[test]
    fn x_and_braced_x_share_nothing() {
        let a = LockKeys::new("", "x");
        let b = LockKeys::new("", "{x}");
        for ka in all(&a) {
            assert!(!all(&b).contains(&ka), "{ka:?} is shared");
        }
    }

    #[test]
    fn the_lock_key_is_read_back_from_its_counter() {
        for name in ["x", "{x}", "a}b", "{app}:x", "{}"] {
            for prefix in ["", "lockctl:"] {
                let k = LockKeys::new(prefix, name);
                assert_eq!(
                    lock_key_of_counter(k.fence.as_bytes()),
                    Some(k.key.as_bytes())
                );
                assert_eq!(lock_key_of_counter(k.holder.as_bytes()), None);
            }
        }
    }

    #[test]
    fn untagged_keys_with_braces_get_a_short_twin_tag() {
        let k = LockKeys::new("", "a}b");
        let tag = k.fence.split('}').next().unwrap().trim_start_matches('{');
        assert!(tag.parse::<u32>().is_ok(), "{:?}", k.fence);
        assert_eq!(slot(k.fence.as_bytes()), slot(b"a}b"));
    }

    #[test]
    fn every_slot_has_a_twin_below_a_million() {
        let mut seen = vec![false; SLOTS as usize];
        let mut left = SLOTS as usize;
        for i in 0u32..1_000_000 {
            let s = crc16(i.to_string().as_bytes()) % SLOTS;
            if !std::mem::replace(&mut seen[s as usize], true) {
                left -= 1;
                if left == 0 {
                    return;
                }
            }
        }
        panic!("{left} slots have no decimal twin below 10^6");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn two_names_never_share_a_key(
            a in "[a-c{}x]{1,6}",
            b in "[a-c{}x]{1,6}",
            prefix in "[{}p]{0,2}",
        ) {
            prop_assume!(a != b);
            let ka = LockKeys::new(&prefix, &a);
            let kb = LockKeys::new(&prefix, &b);
            for k in all(&ka) {
                prop_assert!(!all(&kb).contains(&k), "{:?} shared by {:?} and {:?}", k, a, b);
            }
        }

        #[test]
        fn aux_keys_share_the_lock_key_slot(name in "\\PC{1,12}", prefix in "[{}a:]{0,3}") {
            let k = LockKeys::new(&prefix, &name);
            let want = slot(k.key.as_bytes());
            for aux in &all(&k)[1..] {
                prop_assert_eq!(slot(aux.as_bytes()), want);
            }
        }
    }
}
