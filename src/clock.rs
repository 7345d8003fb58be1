//! The lease clock: `CLOCK_BOOTTIME`.
//!
//! Lease deadlines are local and must never be fooled by the wall clock (NTP steps, an operator's
//! `date -s`), so they are measured on a monotonic clock. Linux's `CLOCK_MONOTONIC`, which
//! `std::time::Instant` uses, stops while the machine is suspended, but Redis keeps counting the TTL
//! on the server: a laptop that sleeps through its lease would wake up believing it still holds it.
//! `CLOCK_BOOTTIME` is monotonic and keeps counting through suspend, so a lease measured on it expires
//! locally no later than on the server. A stopped process (SIGSTOP) is covered by both clocks.
//!
//! Measuring on it is not enough: the wait for a deadline must count suspended time too. Condition
//! variables and `thread::sleep` wait on `CLOCK_MONOTONIC`, so a sleep that spans a suspend ends
//! that much late. [`Boottime::sleep_until`] waits with `clock_nanosleep(CLOCK_BOOTTIME,
//! TIMER_ABSTIME)`, an absolute wake-up on the clock that counts suspend. Code that waits for a
//! deadline takes a [`Clock`], so its tests can drive a clock that jumps.

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

    /// The point `since_boot` after boot (for clocks other than the system's, such as a test's).
    pub fn at(since_boot: Duration) -> Stamp {
        Stamp(since_boot)
    }

    /// Time since boot.
    pub fn since_boot(self) -> Duration {
        self.0
    }
}

/// A clock that deadlines are read from and waited on: the boot-time clock in lockctl, a clock that
/// can jump (a suspend) in the tests of the code that waits on it.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Stamp;
    /// Blocks until `until` or a little later; may return early (a signal), so callers re-read
    /// [`Clock::now`].
    fn sleep_until(&self, until: Stamp);
}

/// `CLOCK_BOOTTIME`, waited on with `clock_nanosleep(TIMER_ABSTIME)`: an absolute wake-up on the
/// clock that counts suspend, so a sleep that spans a suspend ends as soon as the machine resumes
/// past its deadline. (`Condvar::wait_timeout` and `thread::sleep` wait on `CLOCK_MONOTONIC`, which
/// stops during a suspend: they would oversleep by the length of the suspend.)
#[derive(Debug, Clone, Copy, Default)]
pub struct Boottime;

impl Clock for Boottime {
    fn now(&self) -> Stamp {
        Stamp::now()
    }

    fn sleep_until(&self, until: Stamp) {
        let ts = libc::timespec {
            tv_sec: until.0.as_secs() as libc::time_t,
            tv_nsec: until.0.subsec_nanos() as libc::c_long,
        };
        // SAFETY: a valid timespec for the request and no remainder pointer (an absolute sleep
        // needs none). It returns 0 once the time is reached, or EINTR, after which callers
        // re-read the clock.
        unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_BOOTTIME,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boottime_sleeps_until_the_stamp() {
        let until = Stamp::now().add(Duration::from_millis(30));
        Boottime.sleep_until(until);
        assert!(Stamp::now() >= until);
    }

    #[test]
    fn sleeping_until_a_passed_stamp_returns() {
        Boottime.sleep_until(Stamp::at(Duration::ZERO));
    }
}
