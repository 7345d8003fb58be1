//! The renewal thread: keeps the lease alive while the job runs, and decides when it is lost.
//!
//! It renews every TTL/3 from the start of the last successful renewal, with the compare-and-pexpire
//! script on every node. The lease's local deadline is the start of the last successful renewal (or of
//! the winning attempt) plus the validity it returned, which already subtracts the round trip and the
//! clock-drift allowance; it is measured on the boot-time clock (`clock.rs`). A failed renewal (a node
//! timeout, a dropped connection) is retried until that deadline, each call bounded by the node timeout
//! and by the time left before the deadline, so no call outlives the lease. The lease is lost when a
//! quorum answers that the lock is no longer ours, or when the deadline passes, which includes lockctl
//! itself having been stopped, paused or suspended past it.
//!
//! The deadline is enforced by a timer of its own (`deadline.rs`), not by this thread between calls:
//! the child is stopped the moment the deadline passes, whatever renewal call is in flight, and no
//! renewal can revive a lease that already ran out.
//!
//! When a renewal puts back a key that a restarted node lost (see `renew.lua`), the grant records that
//! node's new run id, so that a later disappearance of the key there (a `break`, an eviction) is taken
//! for what it is and ends the lease, instead of being undone as another restart.
//!
//! Between renewals the thread sleeps on a condition variable, waking at most once a second to
//! re-read the boot-time clock: about 0 % CPU.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::deadline::Deadline;
use super::supervisor::Supervisor;
use super::watcher::Link;
use crate::clock::{Boottime, Stamp};
use crate::exit::LockError;
use crate::lock::{Engine, Grant, Holder};
use crate::trace;

/// The longest the renewal thread sleeps without re-reading the boot-time clock.
const CLOCK_RECHECK: Duration = Duration::from_secs(1);

/// What the renewal thread and the main thread share: the engine, which the main thread takes
/// back to release with, and the stop request, under one lock, which a renewal holds from its
/// check of the request to its end. So no renewal starts once the engine is taken, and the main
/// thread waits only for a renewal in flight, never for the thread to wake up and exit.
struct Shared {
    stopped: bool,
    engine: Option<Engine>,
    /// Why the thread found the lease lost, if it did.
    lost: Option<String>,
}

type Stop = (Mutex<Shared>, Condvar);

fn shared(stop: &Stop) -> std::sync::MutexGuard<'_, Shared> {
    stop.0.lock().unwrap_or_else(|e| e.into_inner())
}

/// A running renewal thread and its deadline timer.
pub struct Lease {
    stop: Arc<Stop>,
    deadline: Arc<Deadline>,
}

impl Lease {
    /// Starts renewing `grant` and the timer of its deadline; on loss, tells `supervisor`.
    pub fn start(
        engine: Engine,
        grant: Grant,
        holder: Holder,
        supervisor: Arc<Supervisor>,
        watcher: Link,
    ) -> std::io::Result<Lease> {
        let deadline = Deadline::new(Arc::new(Boottime), grant.started.add(grant.validity));
        let name = grant.keys.name.clone();
        let sup = Arc::clone(&supervisor);
        deadline.start(move |at| {
            lose(&sup, &name, expired(at));
        })?;
        let stop = Arc::new((
            Mutex::new(Shared {
                stopped: false,
                engine: Some(engine),
                lost: None,
            }),
            Condvar::new(),
        ));
        let stop2 = Arc::clone(&stop);
        let deadline2 = Arc::clone(&deadline);
        let spawned = std::thread::Builder::new()
            .name("renew".into())
            .stack_size(256 * 1024)
            .spawn(move || {
                let mut grant = grant;
                renew_loop(
                    &mut grant,
                    &holder,
                    &supervisor,
                    &deadline2,
                    &watcher,
                    &stop2,
                );
            });
        if let Err(e) = spawned {
            deadline.disarm();
            return Err(e);
        }
        Ok(Lease { stop, deadline })
    }

    /// Stops renewing and disarms the timer; returns the engine and, if the lease was lost (now or
    /// before), why. Waits for a renewal in flight, not for the thread: it ends by itself.
    pub fn stop(self) -> (Engine, Option<String>) {
        let passed = self.deadline.disarm();
        let (mut engine, lost) = {
            let mut st = shared(&self.stop);
            st.stopped = true;
            self.stop.1.notify_all();
            let engine = st.engine.take().expect("the engine is taken back once");
            (engine, st.lost.take())
        };
        engine.limit_calls(None);
        (engine, lost.or_else(|| passed.map(expired)))
    }
}

/// Stops the command first (nothing, not even a diagnostic, may come before that), then says why,
/// once.
fn lose(supervisor: &Arc<Supervisor>, name: &str, reason: String) -> Option<String> {
    if supervisor.lease_lost(reason.clone()) {
        crate::say!("lease on '{name}' lost: {reason}; stopping the command");
    }
    Some(reason)
}

/// Why a lease whose deadline was `at` is lost.
fn expired(at: Stamp) -> String {
    let late = Stamp::now().elapsed_since(at);
    if late < Duration::from_millis(1) {
        "its validity ran out without a successful renewal".into()
    } else {
        format!(
            "its validity ran out {} ago without a successful renewal",
            humantime::format_duration(Duration::from_millis(late.as_millis() as u64))
        )
    }
}

/// Sleeps until `until` (boot-time clock) or a stop request; true if stopped.
///
/// The deadline does not depend on this sleep (the timer enforces it), but a renewal should not come
/// late either: the condition variable waits on the monotonic clock, which stops during a suspend,
/// so the wait is cut into steps of at most [`CLOCK_RECHECK`] that re-read the boot-time clock, and
/// the renewal due during a suspend goes out within that time of the resume.
fn sleep_until(stop: &Stop, until: Stamp) -> bool {
    let mut st = shared(stop);
    loop {
        if st.stopped {
            return true;
        }
        let left = until.remaining();
        if left.is_zero() {
            return false;
        }
        let left = left.min(CLOCK_RECHECK);
        st = stop
            .1
            .wait_timeout(st, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn renew_loop(
    grant: &mut Grant,
    holder: &Holder,
    supervisor: &Arc<Supervisor>,
    deadline: &Deadline,
    watcher: &Link,
    stop: &Stop,
) {
    let ttl = grant.ttl;
    let interval = ttl / 3;
    let retry_gap = (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut last = grant.started;
    // Lost for good. The timer stops the command; saying so here too keeps the verdict from
    // depending on which thread runs first.
    let name = grant.keys.name.clone();
    let ran_out = || {
        deadline
            .passed()
            .then(|| lose(supervisor, &name, expired(deadline.at())))
            .flatten()
    };
    loop {
        if sleep_until(stop, last.add(interval)) {
            return;
        }
        loop {
            // Held to the end of the renewal: once stopped, the engine is the main thread's.
            let mut st = shared(stop);
            if st.stopped {
                return;
            }
            if let Some(reason) = ran_out() {
                st.lost = Some(reason);
                return;
            }
            let Some(engine) = st.engine.as_mut() else {
                return;
            };
            // No call may outlive the lease.
            engine.limit_calls(Some(deadline.at()));
            let started = Stamp::now();
            match engine.renew_grant(grant, holder) {
                Ok(validity) => {
                    let mut guarded = true;
                    if !deadline.extend(started.add(validity), |at| {
                        guarded = watcher.deadline(at);
                    }) {
                        // Answered after the deadline: too late to count.
                        st.lost = ran_out();
                        return;
                    }
                    if !guarded && !supervisor.over() {
                        // (Once the job is over, the watcher was told to stand down: no loss.)
                        // Without its watcher, the command would outlive a lockctl that dies or is
                        // stopped: that is a lease nobody enforces, so it ends here.
                        let reason = "its watcher process (lockctl-guard) is gone, so the command \
                                      could outlive lockctl"
                            .to_string();
                        st.lost = lose(supervisor, &grant.keys.name, reason);
                        return;
                    }
                    last = started;
                    trace!(
                        "renewed '{}': valid for {} ms",
                        grant.keys.name,
                        validity.as_millis()
                    );
                    break;
                }
                Err(LockError::Lost { detail, .. }) => {
                    let reason = format!("the lock is no longer ours ({detail})");
                    st.lost = lose(supervisor, &grant.keys.name, reason);
                    return;
                }
                Err(e) => {
                    drop(st);
                    trace!("renewal failed, retrying until the deadline: {e}");
                    let next = Stamp::now().add(retry_gap).min(deadline.at());
                    if sleep_until(stop, next) {
                        return;
                    }
                }
            }
        }
    }
}
