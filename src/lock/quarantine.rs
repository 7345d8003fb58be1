//! The restart quarantine, as operators see it, and the nodes it may spare.
//!
//! A node that started recently may have forgotten locks it granted before it stopped: without
//! persistence, or with an AOF that is fsynced only every second, the last grants are gone. Until every
//! lease it could have granted has ended, its vote could hand a second client a lock that the first
//! still holds, so it does not vote: for the quarantine (default: the TTL of the request, the longest
//! lease that client could have been granted before the restart; clients with longer TTLs must say so
//! with `--quarantine`). The length covers a lease granted the instant before the crash and renewed
//! nowhere else; it is safe because no lease outlives its TTL without a renewal, and a renewal that
//! finds the key gone is refused or re-creates it on the node (see `renew.lua`).
//!
//! A node that provably kept its data is spared, per lock:
//! - it fsyncs every write before answering (`appendonly yes`, `appendfsync always`, and
//!   `no-appendfsync-on-rewrite no`, which keeps fsyncing while the AOF is rewritten), read with
//!   `CONFIG GET` once per node per process and only after the node first reports a quarantine, so the
//!   steady state pays nothing; a node that refuses CONFIG (an ACL, a renamed command) is not proven;
//! - and its data was loaded at start: `acquire.lua` skips the quarantine only when the lock's fencing
//!   counter exists there. The counter never expires and is written with every grant, so it survives
//!   only in loaded data; a name never granted on the node keeps the quarantine, which is conservative.
//!
//! What this module says about a quarantine always names the node, how long ago it started (never
//! "restarted": a first start looks the same), how much longer it waits, and how an operator who knows
//! the node kept its data lifts it.

use std::time::Duration;

use redis::Value;

use super::node::Node;
use crate::output::human_ms;

/// How an operator lifts the quarantine, and when that is safe.
pub const LIFT: &str = "if you know the node kept its data, --quarantine 0 (LOCKCTL_QUARANTINE=0) \
                        lifts the quarantine";

/// One node that refused to vote.
#[derive(Debug, Clone)]
pub struct Quarantined {
    /// Index of the node.
    pub node: usize,
    /// How much longer it refuses.
    pub remaining: Duration,
    /// How long it has been up, when it said.
    pub uptime_s: Option<u64>,
}

impl Quarantined {
    /// `redis://a started 3s ago and votes in 27s`.
    pub fn describe(&self, display: &str) -> String {
        let since = match self.uptime_s {
            Some(0) => "started less than 1s ago".into(),
            Some(s) => format!(
                "started {} ago",
                humantime::format_duration(Duration::from_secs(s))
            ),
            None => "started recently".into(),
        };
        format!(
            "{display} {since} and votes in {}",
            human_ms(self.remaining.as_millis() as i64)
        )
    }
}

/// How much longer a node up for `uptime_s` stays in a quarantine of length `quarantine`, by the rule
/// `acquire.lua` applies: Redis's `uptime_in_seconds` can read up to a second high, so only
/// `uptime_s - 1` seconds are sure.
pub fn remaining(quarantine: Duration, uptime_s: u64) -> Duration {
    if quarantine.is_zero() {
        return Duration::ZERO;
    }
    (quarantine + Duration::from_secs(1)).saturating_sub(Duration::from_secs(uptime_s))
}

/// When `quarantined` leaves fewer than `quorum` of `n` nodes able to vote, the time until enough of
/// them come out; `None` when the quarantine does not stand between us and a quorum.
pub fn unblocked_in(n: usize, quorum: usize, quarantined: &[Quarantined]) -> Option<Duration> {
    let voting = n - quarantined.len();
    if voting >= quorum {
        return None;
    }
    let mut left: Vec<Duration> = quarantined.iter().map(|q| q.remaining).collect();
    left.sort();
    left.get(quorum - voting - 1).copied()
}

/// What the quarantine is doing, for wait lines and refusals.
pub fn describe(nodes: &[Node], quarantined: &[Quarantined], quorum: usize) -> String {
    let list = quarantined
        .iter()
        .map(|q| q.describe(&nodes[q.node].display))
        .collect::<Vec<_>>()
        .join("; ");
    let n = nodes.len();
    let mut s = format!("restart quarantine: {list}");
    if n > 1 {
        s.push_str(&format!(
            " ({} of {n} node(s) in quarantine, a quorum needs {quorum})",
            quarantined.len()
        ));
    }
    s
}

/// True when the node fsyncs every write to its AOF before answering, also during rewrites. Anything
/// short of proof (CONFIG refused or renamed, an odd reply) is false.
pub fn keeps_data(node: &mut Node) -> bool {
    let read = node.call("CONFIG GET", |conn| {
        let mut pipe = redis::pipe();
        for p in ["appendonly", "appendfsync", "no-appendfsync-on-rewrite"] {
            pipe.cmd("CONFIG").arg("GET").arg(p);
        }
        pipe.query::<Vec<Value>>(conn)
    });
    let Ok(replies) = read else {
        return false;
    };
    // CONFIG GET answers `[name, value]` (a map in RESP3); nothing at all for an unknown name.
    let value = |i: usize, want: &str| {
        let v = match replies.get(i) {
            Some(Value::Array(items)) => items.get(1),
            Some(Value::Map(m)) => m.first().map(|(_, v)| v),
            _ => None,
        };
        matches!(v, Some(Value::BulkString(b)) if b.eq_ignore_ascii_case(want.as_bytes()))
    };
    value(0, "yes") && value(1, "always") && value(2, "no")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(node: usize, ms: u64) -> Quarantined {
        Quarantined {
            node,
            remaining: Duration::from_millis(ms),
            uptime_s: None,
        }
    }

    #[test]
    fn remaining_counts_only_the_sure_uptime() {
        let q = Duration::from_secs(30);
        assert_eq!(remaining(q, 0), Duration::from_secs(31));
        assert_eq!(remaining(q, 30), Duration::from_secs(1));
        assert_eq!(remaining(q, 31), Duration::ZERO);
        assert_eq!(remaining(Duration::ZERO, 0), Duration::ZERO);
    }

    #[test]
    fn the_quarantine_that_unblocks_a_quorum() {
        // One node: its own quarantine.
        assert_eq!(
            unblocked_in(1, 1, &[q(0, 500)]),
            Some(Duration::from_millis(500))
        );
        // Three nodes, one quarantined: two still vote.
        assert_eq!(unblocked_in(3, 2, &[q(1, 500)]), None);
        // Two quarantined: the first to come out makes two voters.
        assert_eq!(
            unblocked_in(3, 2, &[q(1, 900), q(2, 400)]),
            Some(Duration::from_millis(400))
        );
        // Five nodes, four quarantined: two must come out.
        assert_eq!(
            unblocked_in(5, 3, &[q(1, 900), q(2, 400), q(3, 700), q(4, 100)]),
            Some(Duration::from_millis(400))
        );
    }
}
