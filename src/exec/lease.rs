//! The renewal thread: keeps the lease alive while the child runs, and decides when it is lost.
//!
//! It renews every TTL/3 from the start of the last successful renewal, with the compare-and-pexpire
//! script on every node. The lease's local deadline is the start of the last successful renewal (or of
//! the winning attempt) plus the validity it returned, which already subtracts the round trip and the
//! clock-drift allowance; it is measured on the boot-time clock (`clock.rs`). A failed renewal (a node
//! timeout, a dropped connection) is retried, each call bounded by the node timeout, until that
//! deadline. The lease is lost when a quorum answers that the lock is no longer ours, or when the
//! deadline passes, which includes lockctl itself having been stopped or paused past it: after SIGCONT
//! the deadline is checked before anything else, and no renewal can revive a lease that already ran out.
//!
//! Between renewals the thread sleeps on a condition variable: no polling, about 0 % CPU.

use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::supervisor::Supervisor;
use crate::clock::Stamp;
use crate::exit::LockError;
use crate::lock::{Engine, Grant, Holder};
use crate::trace;

/// A running renewal thread.
pub struct Lease {
    stop: Arc<(Mutex<bool>, Condvar)>,
    handle: JoinHandle<(Engine, Option<String>)>,
}

impl Lease {
    /// Starts renewing `grant`; on loss, tells `supervisor`.
    pub fn start(
        engine: Engine,
        grant: Grant,
        holder: Holder,
        supervisor: Arc<Supervisor>,
    ) -> std::io::Result<Lease> {
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("renew".into())
            .stack_size(256 * 1024)
            .spawn(move || renew_loop(engine, &grant, &holder, &supervisor, &stop2))?;
        Ok(Lease { stop, handle })
    }

    /// Stops renewing; returns the engine and, if the lease was lost (now or before), why.
    pub fn stop(self) -> (Engine, Option<String>) {
        {
            let (lock, cond) = &*self.stop;
            *lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
            cond.notify_all();
        }
        self.handle.join().expect("renewal thread panicked")
    }
}

/// Sleeps until `until` or a stop request; true if stopped.
fn sleep_until(stop: &(Mutex<bool>, Condvar), until: Stamp) -> bool {
    let (lock, cond) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        if *stopped {
            return true;
        }
        let left = until.remaining();
        if left.is_zero() {
            return false;
        }
        stopped = cond
            .wait_timeout(stopped, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

fn renew_loop(
    mut engine: Engine,
    grant: &Grant,
    holder: &Holder,
    supervisor: &Arc<Supervisor>,
    stop: &(Mutex<bool>, Condvar),
) -> (Engine, Option<String>) {
    let ttl = grant.ttl;
    let interval = ttl / 3;
    let retry_gap = (ttl / 20).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut last = grant.started;
    let mut deadline = grant.started.add(grant.validity);
    let lose = |reason: String| {
        // The command is stopped first: nothing, not even a diagnostic, may come before that.
        supervisor.lease_lost(reason.clone());
        crate::say!(
            "lease on '{}' lost: {reason}; stopping the command",
            grant.keys.name
        );
        Some(reason)
    };
    let expired = |deadline: Stamp| {
        format!(
            "its validity ran out {} ago without a successful renewal",
            humantime::format_duration(Duration::from_millis(
                Stamp::now().elapsed_since(deadline).as_millis() as u64
            ))
        )
    };
    loop {
        if sleep_until(stop, last.add(interval)) {
            // Stopped because the child exited: was the lease still valid then?
            return (engine, deadline.passed().then(|| expired(deadline)));
        }
        loop {
            if deadline.passed() {
                return (engine, lose(expired(deadline)));
            }
            let started = Stamp::now();
            match engine.renew(&grant.keys, &grant.token, ttl, Some((grant, holder))) {
                Ok(validity) => {
                    deadline = deadline.max(started.add(validity));
                    last = started;
                    trace!(
                        "renewed '{}': valid for {} ms",
                        grant.keys.name,
                        validity.as_millis()
                    );
                    break;
                }
                Err(LockError::Lost { detail, .. }) => {
                    return (
                        engine,
                        lose(format!("the lock is no longer ours ({detail})")),
                    );
                }
                Err(e) => {
                    trace!("renewal failed, retrying until the deadline: {e}");
                    let next = Stamp::now().add(retry_gap).min(deadline);
                    if sleep_until(stop, next) {
                        return (engine, deadline.passed().then(|| expired(deadline)));
                    }
                }
            }
        }
    }
}
