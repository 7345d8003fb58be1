//! The lease's local deadline and the timer that enforces it.
//!
//! The deadline is the start of the last successful renewal (or of the winning attempt) plus the
//! validity it returned. Once it passes, nothing says the lock is still ours: another client may be
//! granted it as soon as the key's TTL runs out in Redis, which is only the drift allowance later. So
//! the child must be stopped at that moment, whatever else lockctl is doing. The renewal thread cannot
//! do it: it spends most of its life blocked in a renewal call (up to the node timeout) or asleep
//! between renewals, and checking between calls let a child run on for most of a node timeout after
//! its deadline. A timer thread of its own does nothing but wait for the deadline.
//!
//! - It waits on the boot-time clock with an absolute wake-up ([`Clock::sleep_until`]), which counts
//!   suspended time: after a resume past the deadline it fires at once, where a sleep on the monotonic
//!   clock would go on for the length of the suspend.
//! - After each wake it re-reads the deadline: renewals only ever move it later, so a wake before the
//!   current deadline means sleeping again until it.
//! - A renewal never revives a passed deadline ([`Deadline::extend`] refuses once the clock has reached
//!   it, even if the timer has not woken yet), so the verdict "expired" cannot be undone by a renewal
//!   that started before it and answered after.
//! - The clock is a parameter, so the tests drive a clock that jumps (a suspend).

use std::sync::{Arc, Mutex, MutexGuard};

use crate::clock::{Clock, Stamp};

struct State {
    at: Stamp,
    /// The timer found the deadline passed.
    fired: bool,
    /// The job is over: the timer must not fire any more.
    disarmed: bool,
}

/// A deadline that only moves later, shared by the renewal thread and the timer.
pub struct Deadline {
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl Deadline {
    pub fn new(clock: Arc<dyn Clock>, at: Stamp) -> Arc<Deadline> {
        Arc::new(Deadline {
            clock,
            state: Mutex::new(State {
                at,
                fired: false,
                disarmed: false,
            }),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The current deadline.
    pub fn at(&self) -> Stamp {
        self.state().at
    }

    /// True once the deadline has passed.
    pub fn passed(&self) -> bool {
        let st = self.state();
        st.fired || self.clock.now() >= st.at
    }

    /// Moves the deadline to `at` if that is later. Returns false, changing nothing, if the deadline
    /// has already passed: a lease that ran out stays lost.
    ///
    /// `announce(at)` runs first, while the old deadline has not passed, and must have finished
    /// before it passes (checked after it returns): the watcher, which enforces the deadline too,
    /// finds the new one in its pipe whenever it wakes after the old one.
    pub fn extend(&self, at: Stamp, announce: impl FnOnce(Stamp)) -> bool {
        let mut st = self.state();
        if st.fired || self.clock.now() >= st.at {
            return false;
        }
        let at = st.at.max(at);
        announce(at);
        if self.clock.now() >= st.at {
            return false;
        }
        st.at = at;
        true
    }

    /// Stops the timer. Returns the deadline if it had passed by now.
    pub fn disarm(&self) -> Option<Stamp> {
        let mut st = self.state();
        st.disarmed = true;
        (st.fired || self.clock.now() >= st.at).then_some(st.at)
    }

    /// Starts the timer thread: `on_expire(deadline)` runs on it once the deadline passes, unless the
    /// timer was disarmed first. The thread is not joined: once disarmed it only sleeps until the
    /// deadline it last read and ends.
    pub fn start(
        self: &Arc<Self>,
        on_expire: impl FnOnce(Stamp) + Send + 'static,
    ) -> std::io::Result<()> {
        let this = Arc::clone(self);
        std::thread::Builder::new()
            .name("deadline".into())
            .stack_size(64 * 1024)
            .spawn(move || this.run(on_expire))?;
        Ok(())
    }

    fn run(&self, on_expire: impl FnOnce(Stamp)) {
        loop {
            let at = {
                let mut st = self.state();
                if st.disarmed {
                    return;
                }
                if self.clock.now() >= st.at {
                    st.fired = true;
                    st.at
                } else {
                    let at = st.at;
                    drop(st);
                    self.clock.sleep_until(at);
                    continue;
                }
            };
            on_expire(at);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::sync::Condvar;
    use std::time::Duration;

    /// A clock that moves only when told to, by any amount at once (a suspend and resume).
    #[derive(Default)]
    struct FakeClock {
        now: Mutex<Duration>,
        moved: Condvar,
    }

    impl FakeClock {
        fn set(&self, to: Duration) {
            *self.now.lock().unwrap() = to;
            self.moved.notify_all();
        }
    }

    impl Clock for FakeClock {
        fn now(&self) -> Stamp {
            Stamp::at(*self.now.lock().unwrap())
        }
        fn sleep_until(&self, until: Stamp) {
            let now = self.now.lock().unwrap();
            let _unused = self
                .moved
                .wait_while(now, |now| Stamp::at(*now) < until)
                .unwrap();
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn timer(clock: &Arc<FakeClock>, at: u64) -> (Arc<Deadline>, mpsc::Receiver<Stamp>) {
        let deadline = Deadline::new(Arc::clone(clock) as Arc<dyn Clock>, Stamp::at(secs(at)));
        let (tx, rx) = mpsc::channel();
        deadline
            .start(move |at| {
                let _ = tx.send(at);
            })
            .unwrap();
        (deadline, rx)
    }

    const QUIET: Duration = Duration::from_millis(100);
    /// Generous: the timer thread only has to be scheduled.
    const PROMPT: Duration = Duration::from_secs(10);

    #[test]
    fn fires_at_once_after_a_jump_past_the_deadline() {
        let clock = Arc::new(FakeClock::default());
        clock.set(secs(100));
        let (deadline, rx) = timer(&clock, 110);
        clock.set(secs(105));
        assert!(rx.recv_timeout(QUIET).is_err(), "fired before its time");
        // Suspended for an hour: on resume the deadline is long past.
        clock.set(secs(3705));
        assert_eq!(rx.recv_timeout(PROMPT), Ok(Stamp::at(secs(110))));
        assert!(deadline.passed());
        assert_eq!(deadline.disarm(), Some(Stamp::at(secs(110))));
    }

    #[test]
    fn a_renewal_moves_the_deadline_later_and_the_timer_follows() {
        let clock = Arc::new(FakeClock::default());
        let (deadline, rx) = timer(&clock, 10);
        clock.set(secs(5));
        assert!(deadline.extend(Stamp::at(secs(20)), |_| {}));
        assert!(
            deadline.extend(Stamp::at(secs(15)), |_| {}),
            "an earlier one is ignored"
        );
        assert_eq!(deadline.at(), Stamp::at(secs(20)));
        clock.set(secs(12));
        assert!(rx.recv_timeout(QUIET).is_err(), "the old deadline is gone");
        assert!(!deadline.passed());
        clock.set(secs(20));
        assert_eq!(rx.recv_timeout(PROMPT), Ok(Stamp::at(secs(20))));
    }

    #[test]
    fn renewals_never_revive_a_passed_deadline() {
        let clock = Arc::new(FakeClock::default());
        // No timer running: the refusal must not depend on the timer having woken up.
        let deadline = Deadline::new(Arc::clone(&clock) as Arc<dyn Clock>, Stamp::at(secs(10)));
        clock.set(secs(9));
        assert!(!deadline.passed());
        clock.set(secs(40));
        assert!(deadline.passed());
        // Nor is the watcher told of a new deadline once the old one has passed: it would then
        // leave the job running on a lease that ran out.
        let mut announced = None;
        assert!(!deadline.extend(Stamp::at(secs(50)), |at| announced = Some(at)));
        assert_eq!(
            announced, None,
            "a passed deadline was announced as extended"
        );
        assert_eq!(deadline.at(), Stamp::at(secs(10)));
        assert!(deadline.passed());
        // Disarmed before the timer woke, the deadline still counts as passed.
        assert_eq!(deadline.disarm(), Some(Stamp::at(secs(10))));
        // Nor once the timer has fired, whatever the clock says.
        let (deadline, rx) = timer(&clock, 45);
        clock.set(secs(45));
        rx.recv_timeout(PROMPT).unwrap();
        assert!(!deadline.extend(Stamp::at(secs(90)), |_| {}));
        assert_eq!(deadline.disarm(), Some(Stamp::at(secs(45))));
    }

    #[test]
    fn a_disarmed_timer_never_fires() {
        let clock = Arc::new(FakeClock::default());
        let (deadline, rx) = timer(&clock, 10);
        assert_eq!(deadline.disarm(), None, "not passed when disarmed");
        clock.set(secs(1000));
        assert!(rx.recv_timeout(QUIET).is_err());
    }

    #[test]
    fn the_real_clock_fires_the_timer() {
        let deadline = Deadline::new(
            Arc::new(crate::clock::Boottime),
            Stamp::now().add(Duration::from_millis(50)),
        );
        let (tx, rx) = mpsc::channel();
        deadline.start(move |at| tx.send(at).unwrap()).unwrap();
        let at = rx.recv_timeout(PROMPT).unwrap();
        assert!(Stamp::now() >= at);
    }
}
