//! The lease clock: `CLOCK_BOOTTIME`.
//!
//! Lease deadlines are local and must never be fooled by the wall clock (NTP steps, an operator's
//! `date -s`), so they are measured on a monotonic clock. Linux's `CLOCK_MONOTONIC`, which
//! `std::time::Instant` uses, stops while the machine is suspended, but Redis keeps counting the TTL
//! on the server: a laptop that sleeps through its lease would wake up believing it still holds it.
//! `CLOCK_BOOTTIME` is monotonic and keeps counting through suspend, so a lease measured on it expires
//! locally no later than on the server. A stopped process (SIGSTOP) is covered by both clocks.

use std::time::Duration;

/// A point on the boot-time clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stamp(Duration);

impl Stamp {
    /// Now.
    pub fn now() -> Stamp {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec and CLOCK_BOOTTIME exists on every Linux
        // that Rust supports; the call cannot fail with these arguments.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) };
        debug_assert_eq!(rc, 0);
        Stamp(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
    }

    /// Time since this stamp (zero if the stamp lies in the future).
    pub fn elapsed(self) -> Duration {
        Stamp::now().0.saturating_sub(self.0)
    }

    /// Time from `earlier` to this stamp (zero if `earlier` is later).
    pub fn elapsed_since(self, earlier: Stamp) -> Duration {
        self.0.saturating_sub(earlier.0)
    }

    /// This stamp moved forward by `d`.
    #[allow(clippy::should_implement_trait)] // a stamp plus a span; `+` would read as arithmetic on stamps
    pub fn add(self, d: Duration) -> Stamp {
        Stamp(self.0 + d)
    }

    /// Time from now until this stamp (zero if it has passed).
    pub fn remaining(self) -> Duration {
        self.0.saturating_sub(Stamp::now().0)
    }

    /// True once this stamp is in the past.
    pub fn passed(self) -> bool {
        Stamp::now() >= self
    }
}
