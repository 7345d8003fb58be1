//! Who may signal the child, and when: the stop policy.
//!
//! Four threads can want the job stopped: the signal thread (SIGINT, SIGTERM or SIGHUP sent to
//! lockctl), the deadline timer and the renewal thread (the lease was lost), and the main thread
//! (which only waits and reaps). The job is every descendant of lockctl: the child's process group and
//! whatever left it (`procs.rs`). The policy, in one place:
//!
//! 1. A first signal sent to lockctl is forwarded as is to the job (its process group, and each
//!    descendant outside it, once); a lost lease sends SIGTERM to it.
//! 2. If the job has not exited `--kill-after` later, it gets SIGKILL.
//! 3. A second signal sent to lockctl escalates to SIGKILL at once.
//! 4. The job is over when lockctl has no child left, not when the direct child exits: processes
//!    left behind keep the lease (it is renewed) and, if it is lost, get the same SIGTERM and SIGKILL,
//!    since no part of the job may go on without the lock. Once the job is gone, nothing is sent to
//!    it any more: its IDs may be reused.
//!
//! Every child is reaped under the same mutex, and the job is marked gone there as soon as none is
//! left, so a signal is never sent to the group's ID once it may be recycled (see `child.rs`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::child::{exited, has_children, kill_job, reap, Ended};
use super::watcher::Link;
use crate::trace;

#[derive(Default)]
struct State {
    /// No process of the group is left.
    exited: bool,
    /// A stop signal went out and the SIGKILL timer runs.
    stopping: bool,
    /// The direct child, whose PID is the group's ID, has been reaped: the ID may be reused.
    leader_reaped: bool,
    /// Signals received by lockctl while the child ran.
    signals: u32,
    /// Why the lease was lost, if it was.
    lost: Option<String>,
}

/// Shared control over the running child.
pub struct Supervisor {
    pgid: u32,
    kill_after: Duration,
    watcher: Link,
    state: Mutex<State>,
    exited: Condvar,
}

impl Supervisor {
    pub fn new(pgid: u32, kill_after: Duration, watcher: Link) -> Arc<Supervisor> {
        Arc::new(Supervisor {
            pgid,
            kill_after,
            watcher,
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
            self.kill(&st, libc::SIGKILL);
        } else {
            trace!("forwarding signal {signal} to process group {}", self.pgid);
            self.kill(&st, signal);
            self.arm_kill_timer(&mut st);
        }
    }

    /// The lease is gone: SIGTERM now, SIGKILL after `--kill-after`. True the first time (the caller
    /// says why; later reports add nothing).
    pub fn lease_lost(self: &Arc<Self>, reason: String) -> bool {
        let st = self.state();
        self.lose(st, reason)
    }

    /// The watcher is gone or stopped: the lease is lost as for [`Self::lease_lost`], unless the
    /// job is over already (the watcher then stands down).
    pub fn watcher_lost(self: &Arc<Self>, reason: String) -> bool {
        let st = self.state();
        !st.exited && self.lose(st, reason)
    }

    /// True once no process of the job is left.
    pub fn over(&self) -> bool {
        self.state().exited
    }

    fn lose(self: &Arc<Self>, mut st: MutexGuard<'_, State>, reason: String) -> bool {
        let first = st.lost.is_none();
        if first {
            st.lost = Some(reason);
        }
        if !st.exited && !st.stopping {
            self.watcher.handling();
            self.kill(&st, libc::SIGTERM);
            self.arm_kill_timer(&mut st);
        }
        first
    }

    /// Sends `signal` to the job: its group while the group's ID is surely still its own, and every
    /// other descendant.
    fn kill(&self, st: &State, signal: i32) {
        kill_job(
            (!st.leader_reaped).then_some(self.pgid),
            signal,
            self.watcher.pid(),
        );
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
                    this.kill(&st, libc::SIGKILL);
                }
            });
        if spawned.is_err() {
            // No thread for the timer: do not let the child outlive the lease.
            self.kill(st, libc::SIGKILL);
        }
    }

    /// SIGKILL to the whole group at once, for paths where the child cannot be supervised; the caller
    /// reaps it right after.
    pub fn kill_now(&self) {
        let mut st = self.state();
        if !st.exited {
            self.kill(&st, libc::SIGKILL);
            st.exited = true;
            self.exited.notify_all();
        }
    }

    /// Why the lease was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        self.state().lost.clone()
    }

    /// Reaps `pid`, an exited child, then marks the job gone if lockctl has no child left: both under
    /// the lock, so that no signal can go out between the reap and the check.
    fn reap(&self, pid: u32) {
        let mut st = self.state();
        if pid == self.pgid {
            // The group's ID is about to be free: nobody may signal it as a group any more.
            self.watcher.forget_group();
            st.leader_reaped = true;
        }
        if pid as i32 == self.watcher.pid() {
            // lockctl's own child (lockctl is a PID 1): its PID is about to be free.
            self.watcher.gone();
        }
        reap(pid);
        if !st.exited && !has_children(self.watcher.pid()) {
            st.exited = true;
            self.exited.notify_all();
        }
    }

    /// Waits until lockctl has no child left (no descendant, then: see `child::has_children`), reaping
    /// each as it exits; returns how the direct child `pid` ended.
    pub fn wait_job(self: &Arc<Self>, pid: u32) -> std::io::Result<Ended> {
        let mut ended = None;
        loop {
            match exited()? {
                Some((p, how)) => {
                    self.reap(p);
                    if p == pid {
                        ended = Some(how);
                        if !self.state().exited {
                            trace!("the command exited ({how:?}); waiting for the rest of the job");
                        }
                    }
                    // Only the watcher may be left, as lockctl's child (see `has_children`).
                    if self.state().exited {
                        if let Some(ended) = ended {
                            return Ok(ended);
                        }
                    }
                }
                None => {
                    let mut st = self.state();
                    st.exited = true;
                    self.exited.notify_all();
                    return ended.ok_or_else(|| {
                        std::io::Error::other("the command ended without an exit status")
                    });
                }
            }
        }
    }
}
