//! Who may signal the child, and when: the stop policy.
//!
//! Three threads can want the child stopped: the signal thread (SIGINT, SIGTERM or SIGHUP sent to
//! lockctl), the lease thread (the lease was lost) and the main thread (which only waits). The policy,
//! in one place:
//!
//! 1. A first signal sent to lockctl is forwarded as is to the child's process group; a lost lease
//!    sends SIGTERM to it.
//! 2. If the child has not exited `--kill-after` later, its group gets SIGKILL.
//! 3. A second signal sent to lockctl escalates to SIGKILL at once.
//! 4. Once the child has exited nothing is sent to it any more: its process-group ID may be reused.
//!    If the lease was lost, whatever is left of the group then is killed, since no part of the job may
//!    go on without the lock.
//!
//! The main thread marks the child as exited under the same mutex, before reaping it, so a signal is
//! never sent to a recycled ID (see `child.rs`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::child::{group_exists, kill_group};
use crate::trace;

#[derive(Default)]
struct State {
    exited: bool,
    /// A stop signal went out and the SIGKILL timer runs.
    stopping: bool,
    /// Signals received by lockctl while the child ran.
    signals: u32,
    /// Why the lease was lost, if it was.
    lost: Option<String>,
}

/// Shared control over the running child.
pub struct Supervisor {
    pgid: u32,
    kill_after: Duration,
    state: Mutex<State>,
    exited: Condvar,
}

impl Supervisor {
    pub fn new(pgid: u32, kill_after: Duration) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            pgid,
            kill_after,
            state: Mutex::new(State::default()),
            exited: Condvar::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A signal sent to lockctl: forward it, or escalate on the second one.
    pub fn forward(self: &Arc<Self>, signal: i32) {
        let mut st = self.state();
        if st.exited {
            return;
        }
        st.signals += 1;
        if st.signals > 1 {
            trace!("second signal: SIGKILL to process group {}", self.pgid);
            kill_group(self.pgid, libc::SIGKILL);
        } else {
            trace!("forwarding signal {signal} to process group {}", self.pgid);
            kill_group(self.pgid, signal);
            self.arm_kill_timer(&mut st);
        }
    }

    /// The lease is gone: SIGTERM now, SIGKILL after `--kill-after`.
    pub fn lease_lost(self: &Arc<Self>, reason: String) {
        let mut st = self.state();
        if st.lost.is_none() {
            st.lost = Some(reason);
        }
        if st.exited {
            return;
        }
        if !st.stopping {
            kill_group(self.pgid, libc::SIGTERM);
            self.arm_kill_timer(&mut st);
        }
    }

    fn arm_kill_timer(self: &Arc<Self>, st: &mut State) {
        if st.stopping {
            return;
        }
        st.stopping = true;
        let this = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("kill-after".into())
            .stack_size(64 * 1024)
            .spawn(move || {
                let st = this.state();
                let (st, _) = this
                    .exited
                    .wait_timeout_while(st, this.kill_after, |s| !s.exited)
                    .unwrap_or_else(|e| e.into_inner());
                if !st.exited {
                    trace!("child still running after --kill-after: SIGKILL");
                    kill_group(this.pgid, libc::SIGKILL);
                }
            });
        if spawned.is_err() {
            // No thread for the timer: do not let the child outlive the lease.
            kill_group(self.pgid, libc::SIGKILL);
        }
    }

    /// SIGKILL to the whole group at once, for paths where the child cannot be supervised; the caller
    /// reaps it right after.
    pub fn kill_now(&self) {
        let mut st = self.state();
        if !st.exited {
            kill_group(self.pgid, libc::SIGKILL);
            st.exited = true;
            self.exited.notify_all();
        }
    }

    /// The child has exited (not yet reaped). Returns why the lease was lost, if it was.
    pub fn mark_exited(&self) -> Option<String> {
        let mut st = self.state();
        st.exited = true;
        self.exited.notify_all();
        if st.lost.is_some() && group_exists(self.pgid) {
            // The child is an unreaped zombie, so the group ID is still ours.
            kill_group(self.pgid, libc::SIGKILL);
        }
        st.lost.clone()
    }
}
