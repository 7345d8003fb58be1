//! The restart quarantine, as operators see it.
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
//! No node is spared for its persistence, however safe its settings look: the client can only read
//! the configuration and data the node has *after* the restart, and neither proves what it had when
//! it stopped. `appendfsync` may have been `everysec` until a `CONFIG SET` after the crash; an AOF
//! turned on by `CONFIG SET` is off again after a restart; a torn AOF tail is loaded anyway
//! (`aof-load-truncated yes`); an older copy of the data may have been restored. In each case the
//! lock's fencing counter is there (from an earlier grant) while the last grant is not, and a node
//! spared on that evidence handed a second client a lock the first still held (`tests/spared_aof.rs`).
//! An operator who knows the node kept its data lifts the quarantine with `--quarantine 0`.
//!
//! What this module says about a quarantine always names the node, how long ago it started (never
//! "restarted": a first start looks the same), how much longer it waits, and how an operator who knows
//! the node kept its data lifts it.

use std::time::Duration;

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
    until_uptime_step(
        (quarantine + Duration::from_secs(1)).saturating_sub(Duration::from_secs(uptime_s)),
    )
}

/// What is left of a quarantine as `acquire.lua` tells it (the length less the sure uptime),
/// rounded up to a whole second: the node lets a vote through only when its uptime, which counts
/// whole seconds, steps, so a part below a second ("votes in 50ms") ends at the next step, up to a
/// second later. A waiter that slept the part retried until the step came, refused every time.
pub fn until_uptime_step(told: Duration) -> Duration {
    Duration::from_secs(told.as_nanos().div_ceil(1_000_000_000) as u64)
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
        // A part below a second ends at an uptime step: 2050 ms votes at uptime 4, 1 ms at 2.
        let odd = Duration::from_millis(2050);
        assert_eq!(remaining(odd, 0), Duration::from_secs(4));
        assert_eq!(remaining(odd, 3), Duration::from_secs(1));
        assert_eq!(remaining(odd, 4), Duration::ZERO);
        let tiny = Duration::from_millis(1);
        assert_eq!(remaining(tiny, 1), Duration::from_secs(1));
        assert_eq!(remaining(tiny, 2), Duration::ZERO);
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
