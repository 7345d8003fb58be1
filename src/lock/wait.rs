//! Waiting for a busy lock without polling.
//!
//! A waiter is queued (see `queue.rs`), and a release, a break or the departure of the waiter ahead
//! publishes on the wake channel of the waiter it lets in, and of no other. After the first refused
//! attempt the waiter subscribes to its own channel on every node and only then retries, so a wake
//! that comes between the refusal and the subscription is not missed: it either lets the retry win or
//! arrives as a message. Between attempts the waiter sleeps on a channel that three things can wake: a
//! message on its wake channel (retry at once), a signal (give up cleanly), or the end of the sleep.
//! A waiter behind the head sleeps the heartbeat interval its place earned (see `queue.rs`), less
//! the time its attempt took, between attempts, each of which keeps its place; at most [`super::queue::HEARTBEAT`] while a subscription
//! is missing, since a node may then bring its expiry down with a wake it cannot hear, and at most
//! a node's hint while a waiter ahead is pending there (woken and not heard from), so that the node
//! drops a stopped one when its expiry passes. On a single
//! node the head sleeps until woken or its heartbeat too: the release wakes it on its own channel,
//! so polling would only cost commands. With several nodes the head's sleep backs off exponentially
//! with uniform random jitter, up to a heartbeat, since a split vote needs its retries spread out.
//! Either never outlasts the holder's remaining TTL or a node's remaining quarantine, so an expiry is
//! noticed when it happens. When the server publishes keyspace notifications
//! (`notify-keyspace-events`), a `del`, `expired` or `evicted` event on the key wakes the head too,
//! which covers clients that release without publishing; the others ignore them. A subscription that
//! drops (the node restarted) wakes the waiter, which subscribes again. Each confirmation is read
//! and checked: a SUBSCRIBE that an ACL refuses is no subscription (traced under `-v`), and the
//! keyspace channel, whose `&` rule is optional (docs/security.md), is subscribed to on its own, so
//! that its refusal costs only the keyspace wakes.
//!
//! Only a change on a node that refused us can change the next answer, so keyspace events elsewhere
//! (other waiters rolling back a split vote) are ignored. Two refusals have no release to wait for:
//! - the restart quarantine leaves too few nodes to form a quorum: the waiter sleeps until the
//!   quarantine that unblocks one ends, whatever is released meanwhile (every waiter's rollback
//!   publishes, and waking on them made waiters storm the nodes);
//! - too few nodes answered (Redis unavailable): the waiter retries with a capped, jittered backoff
//!   until its deadline, and says since when Redis is unavailable. `-n` gives up at once.
//!
//! While waiting, a terminal gets a spinner on stderr; a log (cron, CI) gets one line when the wait
//! starts, one whenever the reason changes (a holder, the quarantine, an outage) and one every 30
//! seconds; `-q` silences them, except that one line says so when the quarantine is what holds the
//! wait up, since that is not the routine busy `-q` is meant for.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, SystemTime};

use indicatif::{ProgressBar, ProgressStyle};

use super::keys::LockKeys;
use super::node::Node;
use super::queue::HEARTBEAT;
use crate::clock::Stamp;
use crate::{log, trace};

/// Interval of the plain progress lines when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(30);
/// First backoff ceiling; it doubles per refused attempt up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(10);
/// Largest sleep between attempts when no release, expiry or quarantine end is known to come sooner.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// First backoff ceiling while Redis is unavailable; it doubles per attempt up to [`BACKOFF_MAX`].
const OUTAGE_BACKOFF_START: Duration = Duration::from_millis(100);
/// Added at random to a sleep until a quarantine ends, so that waiters do not all retry at once.
const QUARANTINE_JITTER: Duration = Duration::from_millis(100);
/// Least time between two attempts to subscribe on nodes whose subscription failed or dropped.
const RESUBSCRIBE_EVERY: Duration = Duration::from_secs(5);
/// How often an idle subscriber thread checks whether its wait is over, so that it closes its
/// connection soon after the lock is won instead of holding it while an `exec` child runs.
const SUBSCRIBER_IDLE_CHECK: Duration = Duration::from_secs(10);

/// How long to wait for a busy lock.
#[derive(Debug, Clone, Copy)]
pub enum WaitPolicy {
    /// One attempt.
    NoWait,
    /// Until this much time has passed.
    For(Duration),
    /// Until the lock is ours.
    Forever,
}

/// What wakes a waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// Our wake channel was published on node `.0`, or its subscription dropped.
    Released(usize),
    /// A keyspace event on the lock key (deleted, expired, evicted) on node `.0`.
    Changed(usize),
    /// A terminating signal arrived.
    Signal(i32),
}

/// The channel that wakes a waiter; its sender is shared with the signal handler.
pub struct Wakeup {
    tx: Sender<Wake>,
    rx: Receiver<Wake>,
}

impl Default for Wakeup {
    fn default() -> Self {
        Self::new()
    }
}

impl Wakeup {
    pub fn new() -> Wakeup {
        let (tx, rx) = mpsc::channel();
        Wakeup { tx, rx }
    }

    /// A sender for whoever may wake the waiter.
    pub fn sender(&self) -> Sender<Wake> {
        self.tx.clone()
    }

    /// A signal that arrived, if any; release announcements are dropped (the caller retries anyway).
    pub fn pending_signal(&self) -> Option<i32> {
        while let Ok(w) = self.rx.try_recv() {
            if let Wake::Signal(s) = w {
                return Some(s);
            }
        }
        None
    }

    fn recv_timeout(&self, d: Duration) -> Option<Wake> {
        match self.rx.recv_timeout(d) {
            Ok(w) => Some(w),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }
}

pub(crate) enum Verdict {
    Retry,
    GiveUp,
    Signal(i32),
}

/// Why the last attempt was refused, as far as waiting goes.
pub(crate) enum Pause<'a> {
    /// Held elsewhere: wait for a release on one of the `busy` nodes, an expiry (`retry_in`) or the
    /// end of the backoff.
    Busy {
        busy: &'a [bool],
        retry_in: Option<Duration>,
    },
    /// No quorum can vote until a quarantine ends, in this long.
    Quarantine(Duration),
    /// Too few nodes answered.
    Outage,
}

impl Pause<'_> {
    /// Which of the three reasons, so that a wait line is written when the reason changes.
    fn kind(&self) -> u8 {
        match self {
            Pause::Busy { .. } => 0,
            Pause::Quarantine(_) => 1,
            Pause::Outage => 2,
        }
    }
}

/// The state of one wait.
pub(crate) struct Waiter {
    name: String,
    channel: String,
    /// Queued (somewhere), and first in line (on a quorum).
    queued: bool,
    head: bool,
    /// The heartbeat interval the nodes gave at the last attempt (see `queue.rs`).
    interval: Duration,
    /// Come back sooner: a node has a pending waiter ahead (see `queue.rs`).
    hint: Option<Duration>,
    key: String,
    deadline: Option<Stamp>,
    started: Stamp,
    /// Per node: its subscription is confirmed and has not dropped.
    subscribed: Vec<Arc<AtomicBool>>,
    last_subscribe: Option<Stamp>,
    /// Set when the wait is over; the subscriber threads then close their connections.
    over: Arc<AtomicBool>,
    backoff: Duration,
    outage_backoff: Duration,
    /// When the current run of "unavailable" refusals began (wall clock, for people).
    outage_since: Option<(Stamp, SystemTime)>,
    spinner: Option<ProgressBar>,
    next_line: Option<Stamp>,
    /// The kind of pause the last line described.
    last_kind: Option<u8>,
    /// The quarantine line was written despite `-q`.
    told_quiet: bool,
    /// When the attempt now being answered began: the last return of `Retry` (or the start).
    attempt_started: Stamp,
}

impl Waiter {
    pub fn new(keys: &LockKeys, channel: &str, policy: WaitPolicy, nodes: usize) -> Waiter {
        let now = Stamp::now();
        // One attempt is a deadline that has already passed when the attempt ends.
        let deadline = match policy {
            WaitPolicy::NoWait => Some(now),
            WaitPolicy::For(d) => Some(now.add(d)),
            WaitPolicy::Forever => None,
        };
        Waiter {
            name: keys.name.clone(),
            channel: channel.to_string(),
            queued: false,
            head: true,
            interval: HEARTBEAT,
            hint: None,
            key: keys.key.clone(),
            deadline,
            started: now,
            subscribed: (0..nodes)
                .map(|_| Arc::new(AtomicBool::new(false)))
                .collect(),
            last_subscribe: None,
            over: Arc::new(AtomicBool::new(false)),
            backoff: BACKOFF_START,
            outage_backoff: OUTAGE_BACKOFF_START,
            outage_since: None,
            spinner: None,
            next_line: None,
            last_kind: None,
            told_quiet: false,
            attempt_started: now,
        }
    }

    /// Where the waiter stands since its last attempt, and when it must heartbeat.
    pub fn queued(&mut self, queued: bool, head: bool, interval: Duration, hint: Option<Duration>) {
        self.queued = queued;
        self.head = head;
        self.interval = interval;
        self.hint = hint;
    }

    /// Per node: the wake subscription stands.
    pub fn listening(&self) -> Vec<bool> {
        self.subscribed
            .iter()
            .map(|s| s.load(Ordering::Relaxed))
            .collect()
    }

    /// True when the wait's deadline has passed.
    pub fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(Stamp::passed)
    }

    fn retry(&mut self) -> Verdict {
        self.attempt_started = Stamp::now();
        Verdict::Retry
    }

    /// Called after a refused attempt: sleeps until it is worth trying again. `reason` says what
    /// the wait is for; `loud` lines are shown even with `-q`.
    pub fn wait(
        &mut self,
        nodes: &[Node],
        pause: Pause<'_>,
        reason: &str,
        loud: bool,
        wake: &Wakeup,
    ) -> Verdict {
        let last_attempt = self.attempt_started.elapsed();
        if self.deadline.is_some_and(Stamp::passed) {
            self.finish();
            return Verdict::GiveUp;
        }
        if matches!(pause, Pause::Outage) {
            self.outage_since
                .get_or_insert_with(|| (Stamp::now(), SystemTime::now()));
        } else {
            self.outage_since = None;
            self.outage_backoff = OUTAGE_BACKOFF_START;
        }
        if matches!(pause, Pause::Busy { .. }) && self.subscribe_missing(nodes, wake) {
            // Subscribed before retrying: no release can now go unnoticed.
            return self.retry();
        }
        self.progress(&pause, reason, loud);

        // The heartbeat the nodes asked for; 1 s while a node may hold us without a subscription
        // to wake us there, since it brings our expiry down to 3 s when we reach the front.
        let interval = if self.subscribed.iter().all(|s| s.load(Ordering::Relaxed)) {
            self.interval
        } else {
            self.interval.min(HEARTBEAT)
        };
        // A pending waiter ahead: beat at the pace a node asked for, so that it drops the waiter
        // when its expiry passes.
        let interval = self.hint.map_or(interval, |h| interval.min(h));
        // The next heartbeat: an interval from the start of the last attempt, which may have taken
        // up to a node timeout, with a little jitter so that the waiters do not all beat at once
        // (nor in step with anything else that counts whole seconds).
        let beat = interval
            .mul_f64(0.8 + fastrand::f64() * 0.2)
            .saturating_sub(last_attempt);
        let mut sleep = match pause {
            // Behind the head: only a wake or the heartbeat.
            Pause::Busy { .. } if self.queued && !self.head => beat,
            // The head on a single node: the release publishes on its own channel, so it sleeps
            // until woken, the holder's lease ends, or its heartbeat (no split vote to spread out).
            Pause::Busy { retry_in, .. } if self.queued && self.subscribed.len() == 1 => {
                retry_in.map_or(HEARTBEAT, |r| r + Duration::from_millis(1))
            }
            Pause::Busy { retry_in, .. } => {
                let ceiling = self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                let sleep = ceiling.mul_f64(0.5 + fastrand::f64() * 0.5);
                retry_in.map_or(sleep, |r| sleep.min(r + Duration::from_millis(1)))
            }
            Pause::Quarantine(until) => until + QUARANTINE_JITTER.mul_f64(fastrand::f64()),
            Pause::Outage => {
                let ceiling = self.outage_backoff;
                self.outage_backoff = (self.outage_backoff * 2).min(BACKOFF_MAX);
                ceiling.mul_f64(0.5 + fastrand::f64() * 0.5)
            }
        };
        if self.queued {
            // The heartbeat keeps the waiter's place, whatever the wait is for.
            sleep = sleep.min(beat);
        }
        if let Some(d) = self.deadline {
            sleep = sleep.min(d.remaining());
        }
        if let Some(l) = self.next_line {
            sleep = sleep.min(l.remaining().max(Duration::from_millis(1)));
        }
        trace!(
            "waiting up to {:.1} ms for '{}'",
            sleep.as_secs_f64() * 1000.0,
            self.name
        );
        let until = Stamp::now().add(sleep);
        loop {
            match wake.recv_timeout(until.remaining()) {
                None => return self.retry(),
                Some(Wake::Signal(s)) => {
                    self.finish();
                    return Verdict::Signal(s);
                }
                Some(Wake::Released(_)) => {
                    // Our own channel: whoever published it let us in (or told us we were
                    // superseded); only we compete for the slot, so no random pause.
                    trace!(
                        "woken by a release of '{}' (on our wake channel)",
                        self.name
                    );
                    return self.retry();
                }
                Some(Wake::Changed(i)) => {
                    let Pause::Busy { busy, .. } = pause else {
                        continue;
                    };
                    if !self.head || !busy.get(i).copied().unwrap_or(false) {
                        // Behind the head, or someone else's key on a node that granted us.
                        continue;
                    }
                    trace!("woken by a keyspace event on '{}'", self.name);
                    return self.after_release(nodes.len(), last_attempt, wake);
                }
            }
        }
    }

    /// After a release: at once with one node; with several, after a random pause.
    fn after_release(&mut self, nodes: usize, last_attempt: Duration, wake: &Wakeup) -> Verdict {
        if nodes > 1 {
            // One release wakes every waiter. Retrying in lockstep splits the votes again, and each
            // split holds the others off for a whole attempt (a stopped node makes that a node
            // timeout), then wakes them all again with its rollback: a livelock. So each waits a
            // random part of two attempts' time, Redlock's random delay.
            let spread = (last_attempt * 2).max(Duration::from_millis(2));
            let mut pause = spread.mul_f64(fastrand::f64());
            if let Some(d) = self.deadline {
                pause = pause.min(d.remaining());
            }
            let until = Stamp::now().add(pause);
            while !until.passed() {
                if let Some(Wake::Signal(s)) = wake.recv_timeout(until.remaining()) {
                    self.finish();
                    return Verdict::Signal(s);
                }
            }
        }
        self.retry()
    }

    /// Subscribes on the nodes without a live subscription, at most every [`RESUBSCRIBE_EVERY`];
    /// true when it tried.
    fn subscribe_missing(&mut self, nodes: &[Node], wake: &Wakeup) -> bool {
        let missing: Vec<bool> = self
            .subscribed
            .iter()
            .map(|s| !s.load(Ordering::Relaxed))
            .collect();
        if !missing.iter().any(|&m| m)
            || self
                .last_subscribe
                .is_some_and(|t| t.elapsed() < RESUBSCRIBE_EVERY)
        {
            return false;
        }
        self.last_subscribe = Some(Stamp::now());
        subscribe(
            nodes,
            &missing,
            &self.subscribed,
            &self.channel,
            &self.key,
            wake.sender(),
            &self.over,
        );
        true
    }

    fn progress(&mut self, pause: &Pause<'_>, reason: &str, loud: bool) {
        let what = match (pause, self.outage_since) {
            (Pause::Busy { .. }, _) => format!("waiting for lock '{}' {reason}", self.name),
            (Pause::Outage, Some((since, wall))) => format!(
                "waiting for lock '{}': Redis unavailable since {} ({}): {reason}",
                self.name,
                humantime::format_rfc3339_seconds(wall),
                humantime::format_duration(Duration::from_secs(since.elapsed().as_secs()))
            ),
            _ => format!("waiting for lock '{}': {reason}", self.name),
        };
        let kind = pause.kind();
        let changed = self.last_kind.replace(kind) != Some(kind);
        if !log::enabled() {
            if loud && !self.told_quiet {
                self.told_quiet = true;
                crate::log::line(format_args!("lockctl: {what}"));
            }
            return;
        }
        let waited =
            humantime::format_duration(Duration::from_secs(self.started.elapsed().as_secs()));
        if std::io::stderr().is_terminal() {
            let spinner = self.spinner.get_or_insert_with(|| {
                let pb = ProgressBar::new_spinner();
                pb.set_style(
                    ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                        .expect("valid template"),
                );
                pb.enable_steady_tick(Duration::from_millis(120));
                pb
            });
            spinner.set_message(what);
        } else if changed || self.next_line.is_none_or(Stamp::passed) {
            crate::log::line(format_args!("lockctl: {what} (waited {waited})"));
            self.next_line = Some(Stamp::now().add(LINE_EVERY));
        }
    }

    /// Clears the spinner and lets the subscriber threads go.
    pub fn finish(&mut self) {
        self.over.store(true, Ordering::Relaxed);
        if let Some(s) = self.spinner.take() {
            s.finish_and_clear();
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        self.finish();
    }
}

/// Subscribes to the release channel (and the key's keyspace events) on the `picked` nodes, each on a
/// connection of its own served by a thread, and returns once every subscription is confirmed or has
/// failed (bounded by the node timeout). `alive[i]` is true while node i's subscription stands; a
/// subscription that drops wakes the waiter. The threads end within [`SUBSCRIBER_IDLE_CHECK`] of
/// `over`.
fn subscribe(
    nodes: &[Node],
    picked: &[bool],
    alive: &[Arc<AtomicBool>],
    channel: &str,
    key: &str,
    tx: Sender<Wake>,
    over: &Arc<AtomicBool>,
) {
    let (ready_tx, ready_rx) = mpsc::channel::<bool>();
    let count = picked.iter().filter(|&&p| p).count();
    for (i, node) in nodes.iter().enumerate() {
        if !picked[i] {
            continue;
        }
        let alive = Arc::clone(&alive[i]);
        let client = node.client().clone();
        let timeout = node.timeout();
        let db = client.get_connection_info().redis_settings().db();
        let channels = [channel.to_string(), format!("__keyspace@{db}__:{key}")];
        let display = node.display.clone();
        let tx = tx.clone();
        let ready_tx = ready_tx.clone();
        let over = Arc::clone(over);
        let spawned = thread::Builder::new()
            .stack_size(128 * 1024)
            .spawn(move || {
                let started = std::time::Instant::now();
                let (mut conn, early) = loop {
                    let left = timeout
                        .saturating_sub(started.elapsed())
                        .max(Duration::from_millis(1));
                    let subscribed = client
                        .get_connection_with_timeout(left)
                        .and_then(|c| super::node::bounded(c, timeout))
                        .and_then(|mut c| {
                            let (keyspace, early) = subscribe_checked(&mut c, &channels)?;
                            if let Err(e) = keyspace {
                                trace!(
                                    "{display}: keyspace events refused ({e}); woken on the wake \
                                     channel only"
                                );
                            }
                            Ok((c, early))
                        });
                    match subscribed {
                        Ok(c) => break c,
                        // A connect or SUBSCRIBE whose read a stop of lockctl cut (EINTR) is made
                        // again on a new connection: counted as failed, it was tried again only
                        // 5 s later, and the release's wake went unheard meanwhile.
                        Err(e)
                            if super::node::is_interrupted(&e) && started.elapsed() < timeout => {}
                        Err(e) => {
                            trace!("{display}: cannot subscribe: {e}");
                            let _ = ready_tx.send(false);
                            return;
                        }
                    }
                };
                let mut pubsub = conn.as_pubsub();
                alive.store(true, Ordering::Relaxed);
                let _ = ready_tx.send(true);
                drop(ready_tx);
                if early && tx.send(Wake::Released(i)).is_err() {
                    std::mem::forget(pubsub);
                    return;
                }
                if pubsub
                    .set_read_timeout(Some(SUBSCRIBER_IDLE_CHECK))
                    .is_err()
                {
                    return;
                }
                while !over.load(Ordering::Relaxed) {
                    match pubsub.get_message() {
                        Ok(msg) => {
                            let payload: String = msg.get_payload().unwrap_or_default();
                            let wake = if msg.get_channel_name() == channels[0] {
                                Some(Wake::Released(i))
                            } else {
                                matches!(payload.as_str(), "del" | "expired" | "evicted" | "unlink")
                                    .then_some(Wake::Changed(i))
                            };
                            if wake.is_some_and(|w| tx.send(w).is_err()) {
                                break;
                            }
                        }
                        // A read cut by a stop of lockctl (EINTR) leaves the subscription as it
                        // was: a message is not a reply, so redis-rs skips nothing after it, and
                        // keeps what it had read of one. Taken as a drop, a Ctrl-Z and `fg` cost
                        // the wake: the waiter polled and subscribed again only 5 s later.
                        Err(e) if e.is_timeout() || super::node::is_interrupted(&e) => {}
                        Err(e) => {
                            trace!("{display}: subscription dropped: {e}");
                            alive.store(false, Ordering::Relaxed);
                            // A release may have gone unseen: the waiter retries and subscribes again.
                            let _ = tx.send(Wake::Released(i));
                            break;
                        }
                    }
                }
                // Closing the socket is all the server needs; an UNSUBSCRIBE round trip is not.
                std::mem::forget(pubsub);
            });
        if let Err(e) = spawned {
            // The closure, and its sender, are dropped: the wait below does not count on it.
            trace!("{}: no thread to subscribe: {e}", node.display);
        }
    }
    drop(ready_tx);
    // Connecting and subscribing each take at most a node timeout, except a unix-socket connect to a
    // server whose accept queue is full, which has no timeout (see `node.rs`): never wait past both.
    let limit = nodes.iter().map(Node::timeout).max().unwrap_or_default() * 2;
    let deadline = Stamp::now().add(limit);
    let subscribed = (0..count)
        .map_while(|_| ready_rx.recv_timeout(deadline.remaining()).ok())
        .filter(|&ok| ok)
        .count();
    trace!("subscribed to releases on {subscribed}/{count} node(s)");
}

/// `SUBSCRIBE` to the wake channel and to the keyspace channel, as two commands in one write, with
/// each confirmation read and checked: redis-rs's `PubSub::subscribe` takes any reply, a refusal
/// (`-NOPERM` from an ACL without the channel's `&` rule) included, for a confirmation, and the
/// waiter believed it listened where it did not. One SUBSCRIBE of both channels is refused as a
/// whole when either is, so the keyspace channel goes on its own: without its rule the waiter still
/// hears its wake channel. Returns whether the keyspace subscription stands (or the server's
/// refusal), and whether a message came on the wake channel between the two confirmations; an error
/// when the wake channel's subscription failed.
fn subscribe_checked(
    conn: &mut redis::Connection,
    channels: &[String; 2],
) -> redis::RedisResult<(redis::RedisResult<()>, bool)> {
    let mut both = redis::cmd("SUBSCRIBE")
        .arg(&channels[0])
        .get_packed_command();
    both.extend_from_slice(
        &redis::cmd("SUBSCRIBE")
            .arg(&channels[1])
            .get_packed_command(),
    );
    conn.send_packed_command(&both)?;
    let mut early = false;
    let mut replies = Vec::with_capacity(2);
    while replies.len() < 2 {
        let v = conn.recv_response()?;
        if let Some(msg) = redis::Msg::from_value(&v) {
            early |= msg.get_channel_name() == channels[0];
            continue;
        }
        // A confirmation (`subscribe`, or RESP3's push) or the server's refusal.
        replies.push(v.extract_error().map(|_| ()));
    }
    let keyspace = replies.pop().expect("two replies");
    replies.pop().expect("two replies")?;
    Ok((keyspace, early))
}
