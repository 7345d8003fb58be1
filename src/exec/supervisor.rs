//! Who may signal the child, and when: the stop policy.
//!
//! Four threads can want the job stopped: the signal thread (SIGINT, SIGTERM or SIGHUP sent to
//! lockctl), the deadline timer and the renewal thread (the lease was lost), and the main thread
//! (which only waits and reaps). The job is the child's whole process group. The policy, in one place:
//!
//! 1. A first signal sent to lockctl is forwarded as is to the job's process group; a lost lease
//!    sends SIGTERM to it.
//! 2. If the group has not exited `--kill-after` later, it gets SIGKILL.
//! 3. A second signal sent to lockctl escalates to SIGKILL at once.
//! 4. The job is over when no process of the group is left, not when the direct child exits: members
//!    left behind keep the lease (it is renewed) and, if it is lost, get the same SIGTERM and SIGKILL,
//!    since no part of the job may go on without the lock. Once the group is gone, nothing is sent to
//!    it any more: its ID may be reused.
//!
//! The main thread reaps every member under the same mutex and marks the group gone there as soon as
//! none is left, so a signal is never sent to a recycled ID (see `child.rs`).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::child::{exited, group_exists, kill_group, reap, Among, Ended};
use crate::trace;

#[derive(Default)]
struct State {
    /// No process of the group is left.
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

    /// The lease is gone: SIGTERM now, SIGKILL after `--kill-after`. True the first time (the caller
    /// says why; later reports add nothing).
    pub fn lease_lost(self: &Arc<Self>, reason: String) -> bool {
        let mut st = self.state();
        let first = st.lost.is_none();
        if first {
            st.lost = Some(reason);
        }
        if !st.exited && !st.stopping {
            kill_group(self.pgid, libc::SIGTERM);
            self.arm_kill_timer(&mut st);
        }
        first
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

    /// Why the lease was lost, if it was.
    pub fn lost(&self) -> Option<String> {
        self.state().lost.clone()
    }

    /// Reaps `pid`, an exited child, then marks the group gone if nothing of it is left: both under
    /// the lock, so that no signal can go out between the reap and the check.
    fn reap(&self, pid: u32) {
        let mut st = self.state();
        reap(pid);
        self.check_gone(&mut st);
    }

    fn check_gone(&self, st: &mut State) -> bool {
        if !st.exited && !group_exists(self.pgid) {
            st.exited = true;
            self.exited.notify_all();
        }
        st.exited
    }

    /// Waits until no process of the job's group is left, reaping its members and any other adopted
    /// child that has exited; returns how the direct child `pid` ended.
    pub fn wait_job(&self, pid: u32) -> std::io::Result<Ended> {
        let mut ended = None;
        loop {
            // Other exited children (orphans that left the group, then ended) are reaped as we go.
            while let Some((p, how)) = exited(Among::Any, false)? {
                self.take(p, how, pid, &mut ended);
            }
            let gone = self.state().exited;
            if gone && ended.is_some() {
                break;
            }
            let among = if gone {
                // The child left its own group (`setpgid`): wait for it alone.
                Among::Pid(pid)
            } else {
                Among::Group(self.pgid)
            };
            match exited(among, true)? {
                Some((p, how)) => self.take(p, how, pid, &mut ended),
                None => {
                    // No child of ours is left in the group, yet it exists: members whose parent
                    // left it. They are not ours to reap; look again shortly.
                    if !self.check_gone(&mut self.state()) {
                        std::thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        }
        Ok(ended.expect("the loop ends once the child has ended"))
    }

    /// Reaps `p`; records its status if it is the direct child `pid`.
    fn take(&self, p: u32, how: Ended, pid: u32, ended: &mut Option<Ended>) {
        self.reap(p);
        if p == pid {
            *ended = Some(how);
            if !self.state().exited {
                trace!("the command exited ({how:?}); waiting for the rest of its process group");
            }
        }
    }
}
