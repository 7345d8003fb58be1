//! The one table of exit codes, and the errors that map onto them.
//!
//! Scripts branch on these numbers (`75` busy, `76` lease lost), so they live in one place and every
//! command returns them through [`Exit`]. Errors that callers must tell apart are typed
//! ([`LockError`]); everything else travels as `anyhow` and exits 1.
//!
//! 69 and 78 split "no quorum" by cause. A node that did not answer (down, stopped, unreachable) may
//! answer on the next try, so that is 69, "unavailable". A node that answered and refuses (wrong
//! password, an ACL without a command lockctl needs, a read-only replica, a renamed command, a
//! redirect that cannot be followed) will refuse again until someone changes the setup, so that is
//! 78, "misconfigured", with the fix in the message. With several nodes the two can mix: the failure is
//! 78 when the refusing nodes alone leave too few nodes for a quorum (even if every silent node came
//! back, no lock could be granted), and 69 otherwise. One exception: an acquire that any node's ACL
//! refuses for want of the channel rules is 78 whatever the quorum (`ChannelsRefused`): a lock
//! granted there could not be released on that node (docs/security.md).

use std::process::ExitCode;

/// Exit statuses of `lockctl`, as documented in the README and the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    /// Success; `status`: the lock is held.
    Success,
    /// `status`: free; `doctor`: a failure was found; any error not listed below.
    Failure,
    /// Usage error: a bad flag, value, name or URL. Nothing was changed in Redis.
    Usage,
    /// Redis unavailable: no quorum of nodes answered.
    Unavailable,
    /// Busy: the lock was not acquired in time (`-E` replaces this code).
    Busy,
    /// Lease lost, or the token does not hold the lock.
    Lost,
    /// Misconfigured: a node answered but refuses (credentials, ACL, a replica, a renamed command, a
    /// redirect that cannot be followed). Retrying cannot help; the setup must change.
    Misconfigured,
    /// A raw status, such as a child's exit code or 128+N for a signal.
    Raw(u8),
}

impl Exit {
    /// The numeric status.
    pub fn code(self) -> u8 {
        match self {
            Exit::Success => 0,
            Exit::Failure => 1,
            Exit::Usage => 2,
            Exit::Unavailable => 69,
            Exit::Busy => 75,
            Exit::Lost => 76,
            Exit::Misconfigured => 78,
            Exit::Raw(code) => code,
        }
    }

    /// The status a shell reports for a process killed by `signal`.
    pub fn from_signal(signal: i32) -> Exit {
        Exit::Raw(128u8.saturating_add(u8::try_from(signal).unwrap_or(127)))
    }
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit.code())
    }
}

/// Failures that decide the exit status. Each names what happened and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Bad input, found before any Redis call.
    #[error("{0}")]
    Usage(String),
    /// Not acquired: the lock is held elsewhere.
    #[error("lock '{name}' is busy{}", holder_suffix(.holder, *.waiting))]
    Busy {
        name: String,
        holder: Option<String>,
        /// Waiters in the queue.
        waiting: u64,
    },
    /// Not acquired: a `--supersede` waiter displaced this one from the queue.
    #[error("lock '{name}' not acquired: superseded in the queue by {by}")]
    Superseded { name: String, by: String },
    /// Not acquired: too few nodes may vote yet, because they started too recently (the restart
    /// quarantine). Exits like busy, but is never a routine refusal that `-q` hides.
    #[error("lock '{name}' not acquired, because of the {detail}")]
    Quarantined { name: String, detail: String },
    /// Fewer nodes than a quorum answered.
    #[error("Redis unavailable: {reachable} of {nodes} node(s) answered, a quorum needs {quorum}{}", detail_suffix(.detail))]
    Unavailable {
        nodes: usize,
        reachable: usize,
        quorum: usize,
        detail: String,
    },
    /// Nodes answered but refuse, and without them no quorum can be reached.
    #[error("Redis refuses: {refused} of {nodes} node(s) answered but refuse, a quorum needs {quorum}: {detail}")]
    Misconfigured {
        nodes: usize,
        refused: usize,
        quorum: usize,
        detail: String,
    },
    /// Nodes whose ACL refuses lockctl's channels: every node must allow them, or a release there
    /// would fail, so an acquire is refused (what its round did elsewhere rolled back).
    #[error("Redis refuses: {refused} of {nodes} node(s) answered but their ACL refuses lockctl's channels, which every node must allow (a release or break there would fail): {detail}")]
    ChannelsRefused {
        nodes: usize,
        refused: usize,
        detail: String,
    },
    /// The token does not hold the lock on a quorum.
    #[error("lock '{name}' is not held by this token{}", detail_suffix(.detail))]
    Lost { name: String, detail: String },
    /// A signal ended the wait before the lock was acquired; what it could not withdraw, if anything.
    #[error("interrupted by signal {0} while waiting; {kept}", kept = .1.as_deref().unwrap_or("nothing was left in Redis"))]
    Interrupted(i32, Option<String>),
}

fn holder_suffix(holder: &Option<String>, waiting: u64) -> String {
    match (holder, waiting) {
        (Some(h), 0) => format!(" (held by {h})"),
        (Some(h), n) => format!(" (held by {h}; {n} waiting)"),
        (None, 0) => String::new(),
        (None, n) => format!(" ({n} waiting ahead)"),
    }
}

fn detail_suffix(detail: &str) -> String {
    if detail.is_empty() {
        String::new()
    } else {
        format!(": {detail}")
    }
}

impl LockError {
    /// The exit status for this failure; `busy` is the code that `-E` chose for a busy lock.
    pub fn exit(&self, busy: Exit) -> Exit {
        match self {
            LockError::Usage(_) => Exit::Usage,
            LockError::Busy { .. }
            | LockError::Quarantined { .. }
            | LockError::Superseded { .. } => busy,
            LockError::Unavailable { .. } => Exit::Unavailable,
            LockError::Misconfigured { .. } | LockError::ChannelsRefused { .. } => {
                Exit::Misconfigured
            }
            LockError::Lost { .. } => Exit::Lost,
            LockError::Interrupted(signal, _) => Exit::from_signal(*signal),
        }
    }
}
