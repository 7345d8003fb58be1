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
//! Every member is reaped under the same mutex, and the group is marked gone there as soon as none is
//! left, so a signal is never sent to a recycled ID (see `child.rs`). One case is noticed by looking
//! rather than by an exit: the last members leaving the group (`setsid`); the group ID is free from
//! then until lockctl looks again (a tenth of a second at most), and only a wrap-around of the whole
//! PID space in that time could hand it to another process.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use super::child::{exited, group_exists, kill_group, reap, Ended};
use super::watcher::Link;
use crate::trace;

/// How often the group is looked for while no child exits (see [`Supervisor::wait_job`]).
const GROUP_POLL: Duration = Duration::from_millis(100);

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
            self.watcher.handling();
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

    /// Waits until no process of the job's group is left; returns how the direct child `pid` ended.
    ///
    /// A reaper thread blocks in `waitid` for any child (the group's members, and adopted orphans
    /// that left the group) and reaps each as it exits. Exits are not the only way a group empties:
    /// its last members may leave it (`setsid`), which wakes no `waitid` (the kernel wakes a
    /// `waitid(P_PGID)` only for a child that is still in the group). So this thread also looks every
    /// [`GROUP_POLL`] whether the group still exists.
    pub fn wait_job(self: &Arc<Self>, pid: u32) -> std::io::Result<Ended> {
        let (tx, rx) = mpsc::channel();
        let this = Arc::clone(self);
        std::thread::Builder::new()
            .name("reaper".into())
            .stack_size(64 * 1024)
            .spawn(move || loop {
                match exited() {
                    Ok(Some((p, how))) => {
                        this.reap(p);
                        if tx.send(Ok((p, how))).is_err() {
                            return;
                        }
                    }
                    // No child left at all.
                    Ok(None) => return,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                }
            })?;
        let mut ended = None;
        loop {
            if let Some(how) = ended.filter(|_| self.state().exited) {
                return Ok(how);
            }
            match rx.recv_timeout(GROUP_POLL) {
                Ok(Ok((p, how))) if p == pid => {
                    ended = Some(how);
                    if !self.state().exited {
                        trace!("the command exited ({how:?}); waiting for the rest of its group");
                    }
                }
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {
                    self.check_gone(&mut self.state());
                }
                // No child of ours is left, but the group may still have members that are not
                // (their parent left the group): look for it until it is gone.
                Err(RecvTimeoutError::Disconnected) if ended.is_some() => {
                    std::thread::sleep(GROUP_POLL);
                    self.check_gone(&mut self.state());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(std::io::Error::other(
                        "the command ended without an exit status",
                    ))
                }
            }
        }
    }
}
