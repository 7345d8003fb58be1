//! Waiting for a busy lock without polling.
//!
//! The release script publishes on the lock's channel. After the first refused attempt the waiter
//! subscribes on every node and only then retries, so a release that happens between the refusal and
//! the subscription is not missed: it either lets the retry win or arrives as a message. Between
//! attempts the waiter sleeps on a channel that three things can wake: a release message (retry at
//! once), a signal (give up cleanly), or the end of the sleep. The sleep backs off exponentially with
//! uniform random jitter, which breaks Redlock split votes, and never outlasts the holder's remaining
//! TTL or a node's remaining quarantine, so an expiry is noticed when it happens. When the server
//! publishes keyspace notifications (`notify-keyspace-events`), a `del`, `expired` or `evicted` event on the key
//! wakes the waiter too, which covers clients that release without publishing.
//!
//! While waiting, a terminal gets a spinner on stderr; a log (cron, CI) gets one line when the wait
//! starts and one every 30 seconds; `-q` silences both.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use super::keys::LockKeys;
use super::node::Node;
use crate::clock::Stamp;
use crate::{log, trace};

/// Interval of the plain progress lines when stderr is not a terminal.
const LINE_EVERY: Duration = Duration::from_secs(30);
/// First backoff ceiling; it doubles per refused attempt up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(10);
/// Largest sleep between attempts when no release, expiry or quarantine end is known to come sooner.
const BACKOFF_MAX: Duration = Duration::from_secs(2);
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
    /// A release (or expiry) was announced on some node.
    Released,
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

/// The state of one wait.
pub(crate) struct Waiter {
    name: String,
    channel: String,
    key: String,
    deadline: Option<Stamp>,
    started: Stamp,
    subscribed: bool,
    /// Set when the wait is over; the subscriber threads then close their connections.
    over: Arc<AtomicBool>,
    backoff: Duration,
    spinner: Option<ProgressBar>,
    next_line: Option<Stamp>,
    /// When the attempt now being answered began: the last return of `Retry` (or the start).
    attempt_started: Stamp,
}

impl Waiter {
    pub fn new(keys: &LockKeys, policy: WaitPolicy) -> Waiter {
        let now = Stamp::now();
        // One attempt is a deadline that has already passed when the attempt ends.
        let deadline = match policy {
            WaitPolicy::NoWait => Some(now),
            WaitPolicy::For(d) => Some(now.add(d)),
            WaitPolicy::Forever => None,
        };
        Waiter {
            name: keys.name.clone(),
            channel: keys.channel.clone(),
            key: keys.key.clone(),
            deadline,
            started: now,
            subscribed: false,
            over: Arc::new(AtomicBool::new(false)),
            backoff: BACKOFF_START,
            spinner: None,
            next_line: None,
            attempt_started: now,
        }
    }

    fn retry(&mut self) -> Verdict {
        self.attempt_started = Stamp::now();
        Verdict::Retry
    }

    /// Called after a refused attempt: sleeps until it is worth trying again.
    pub fn wait(
        &mut self,
        nodes: &[Node],
        holder: Option<&str>,
        retry_in: Option<Duration>,
        wake: &Wakeup,
    ) -> Verdict {
        let last_attempt = self.attempt_started.elapsed();
        if self.deadline.is_some_and(Stamp::passed) {
            self.finish();
            return Verdict::GiveUp;
        }
        if !self.subscribed {
            self.subscribed = true;
            subscribe(nodes, &self.channel, &self.key, wake.sender(), &self.over);
            // Subscribed before retrying: no release can now go unnoticed.
            return self.retry();
        }
        self.progress(holder);

        let ceiling = self.backoff;
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        let mut sleep = ceiling.mul_f64(0.5 + fastrand::f64() * 0.5);
        if let Some(r) = retry_in {
            sleep = sleep.min(r + Duration::from_millis(1));
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
        match wake.recv_timeout(sleep) {
            Some(Wake::Signal(s)) => {
                self.finish();
                Verdict::Signal(s)
            }
            Some(Wake::Released) => {
                trace!("woken by a release of '{}'", self.name);
                if nodes.len() > 1 {
                    // One release wakes every waiter. Retrying in lockstep splits the votes again,
                    // and each split holds the others off for a whole attempt (a stopped node makes
                    // that a node timeout), then wakes them all again with its rollback: a livelock.
                    // So each waits a random part of two attempts' time, Redlock's random delay.
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
            None => self.retry(),
        }
    }

    fn progress(&mut self, holder: Option<&str>) {
        if !log::enabled() {
            return;
        }
        let holder = holder.unwrap_or("an unknown holder");
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
            spinner.set_message(format!("waiting for lock '{}' held by {holder}", self.name));
        } else if self.next_line.is_none_or(Stamp::passed) {
            crate::log::line(format_args!(
                "lockctl: waiting for lock '{}' held by {holder} (waited {waited})",
                self.name
            ));
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

/// Subscribes to the release channel (and the key's keyspace events) on every node, each on a
/// connection of its own served by a thread, and returns once every subscription is confirmed or has
/// failed (bounded by the node timeout). The threads end within [`SUBSCRIBER_IDLE_CHECK`] of `over`.
fn subscribe(nodes: &[Node], channel: &str, key: &str, tx: Sender<Wake>, over: &Arc<AtomicBool>) {
    let (ready_tx, ready_rx) = mpsc::channel::<bool>();
    for node in nodes {
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
                let conn = client
                    .get_connection_with_timeout(timeout)
                    .and_then(|c| super::node::bounded(c, timeout));
                let mut conn = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        trace!("{display}: cannot subscribe: {e}");
                        let _ = ready_tx.send(false);
                        return;
                    }
                };
                let mut pubsub = conn.as_pubsub();
                if let Err(e) = pubsub.subscribe(&channels) {
                    trace!("{display}: cannot subscribe: {e}");
                    let _ = ready_tx.send(false);
                    return;
                }
                let _ = ready_tx.send(true);
                drop(ready_tx);
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
                            let relevant = msg.get_channel_name() == channels[0]
                                || matches!(
                                    payload.as_str(),
                                    "del" | "expired" | "evicted" | "unlink"
                                );
                            if relevant && tx.send(Wake::Released).is_err() {
                                break;
                            }
                        }
                        Err(e) if e.is_timeout() => {}
                        Err(_) => break,
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
    let subscribed = (0..nodes.len())
        .map_while(|_| ready_rx.recv_timeout(deadline.remaining()).ok())
        .filter(|&ok| ok)
        .count();
    trace!(
        "subscribed to releases on {subscribed}/{} node(s)",
        nodes.len()
    );
}
