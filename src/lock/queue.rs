//! The queue of waiters: first come, first served, in every mode.
//!
//! Without a queue every release wakes every waiter and the fastest retry wins, so a deploy that
//! waited longest can land last, and N waiters cost O(N²) commands. Here each waiter has a place:
//!
//! - **A ticket orders the queue the same way on every node.** The first refused attempt queues the
//!   caller in the same script call (no extra round trip on a single node), with the ticket
//!   `max(counter + 1, server time in µs)`, so the order survives a restart that lost the counter.
//!   With several nodes the waiter's ticket is the largest any node gave, like the fence, and every
//!   later call carries it, so every node orders by the same number; when the nodes' tickets differ
//!   the waiter sends it once more at once, which puts it on a quorum before it waits. The proof is in
//!   `docs/queue.md`.
//! - **Liveness by heartbeat, at a cost bounded per handoff.** A waiter re-runs its attempt once an
//!   interval (counted from the start of the last one), and each attempt sets its expiry to three
//!   intervals and a slack of two node timeouts, since an attempt may take up to one; any script
//!   that reads the queue drops the waiters whose expiry passed. The node picks the interval from the waiter's place:
//!   [`HEARTBEAT`] at the front (the first `limit + 1`), then longer with the square of the distance
//!   from it, up to [`LONGEST`], so that the k-th waiter does not pay k holds' worth of heartbeats.
//!   A script that moves waiters into the front brings their expiry down to [`ALIVE`] and wakes
//!   them: a live one beats at once and learns its 1 s, a dead one is gone within [`ALIVE`]. So a
//!   killed or stopped waiter holds up the next one by at most `ALIVE + HEARTBEAT` when its turn
//!   comes, wherever in the queue it died. A waiter that stops waiting (granted, `-w`, a signal)
//!   leaves at once with `leave.lua`, on every node in parallel; on a signal without waiting for the
//!   answers. A waiter whose own loop paused longer than three of its intervals between the starts of
//!   two attempts (it was stopped) may have been dropped, so it gives up its ticket and queues again
//!   at the back. An outage is no such pause: the waiter keeps trying through it, keeps its ticket,
//!   and the nodes put it back at that ticket.
//! - **A node's own stall is not the waiters' death.** A node that was stopped (SIGSTOP, a paused
//!   VM) sees every expiry pass at once when it resumes. Each node keeps the time of the last script
//!   that looked at its queue (`seen`); an expiry that passed since, with no script here in the two
//!   front heartbeats before it, moves once to a front lifetime from now and its waiter is woken,
//!   instead of being dropped (except for the waiters that no longer listen, which died), so the
//!   live ones beat again in time. A waiter woken this way or to the front is pending until it
//!   beats, and the waiters behind it are told to beat at the front's pace meanwhile, so that a
//!   stopped one is dropped when its expiry passes (`front.lua`, `docs/queue.md`). A grant that
//!   is rolled back (it lost, or its reply timed out and the node ran it late) puts the waiter back
//!   where it stood.
//! - **Wake only whom the release lets in.** Each waiter listens on a channel of its own; a release,
//!   a break, or the departure of a waiter at the head publishes to the first waiters that a free slot
//!   lets in, and to nobody else. Waiters behind the head sleep until woken or until their heartbeat.
//!
//! The grant rule (in `acquire.lua`): `free` slots, `ahead` live waiters queued before the caller;
//! granted iff `ahead < free`. An attempt with `-n` is never queued, and counts every live waiter as
//! ahead of it.

use std::time::Duration;

use super::keys::LockKeys;
use super::node::Node;
use super::quorum;
use crate::clock::Stamp;

/// How often a waiter at the front of the queue re-runs its attempt (its heartbeat, which doubles as
/// a retry); waiters further back are told a longer interval by the nodes.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a waiter stays queued after its last heartbeat: three of its intervals, which is this
/// at the front of the queue.
pub const ALIVE: Duration = Duration::from_secs(3);
/// The longest heartbeat interval the nodes give a waiter far back (`front.lua`'s `keep_time`
/// counts on it, written there as 30000 ms, for a waiter it could not wake).
pub const LONGEST: Duration = Duration::from_secs(30);
/// Longest `--note`, in bytes.
pub const MAX_NOTE: usize = 512;

/// KEYS of `acquire.lua`; `record`: the record of the attempt's token's release
/// ([`LockKeys::release_record`]), whose presence makes the attempt change nothing.
pub fn acquire_keys<'a>(keys: &'a LockKeys, record: &'a str) -> [&'a str; 11] {
    [
        &keys.key,
        &keys.fence,
        &keys.holder,
        &keys.limit,
        &keys.queue,
        &keys.alive,
        &keys.waiters,
        &keys.tickets,
        &keys.superseded,
        &keys.seen,
        record,
    ]
}

/// How an attempt may use the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One attempt: never queued, refused while anyone waits.
    Once,
    /// Queued on the first refusal.
    Wait,
    /// Queued, displacing the older waiters (`--supersede`); it becomes [`Mode::Wait`] once they
    /// were displaced (see [`Place::supersede_answered`]).
    Supersede,
}

impl Mode {
    /// The script's mode argument.
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Once => "n",
            Mode::Wait => "w",
            Mode::Supersede => "s",
        }
    }
}

/// One waiter's place in the queue, kept across its attempts.
#[derive(Debug)]
pub struct Place {
    /// 64 random bits, 16 hex digits: the waiter's member in the queue and its wake channel.
    pub id: String,
    pub mode: Mode,
    /// A `--supersede` waiter's next attempt may displace the older waiters: once a quorum (one
    /// node: the node) queued or granted it in an answer it read, so that an attempt refused by a
    /// majority, or left unanswered by a stopped node and run there after the waiter gave up,
    /// displaces nobody.
    armed: bool,
    /// The ticket every node orders this waiter by, once one was given.
    pub ticket: Option<u64>,
    /// Some node may have queued this waiter.
    pub queued: bool,
    /// A waiting attempt went out: a node may have queued this waiter although no answer said so
    /// (it timed out), so leaving must reach the nodes all the same.
    pub sent: bool,
    /// When the waiter's previous attempt started (boot-time clock, so a SIGSTOP counts).
    last_try: Option<Stamp>,
    /// The heartbeat interval of the last attempt: the shortest any node gave. The nodes keep the
    /// waiter three of their intervals after it, so this bounds the next attempt's start.
    pub interval: Duration,
    /// Sooner than `interval`: some node has a pending waiter ahead (woken to the front or moved
    /// after a stall, not heard from since) and wants a script run when its expiry passes.
    pub hint: Option<Duration>,
    /// How much longer than its interval an attempt may take (two node timeouts): the nodes keep
    /// the waiter this much longer than three intervals, and so does [`Place::check_lapse`].
    pub slack: Duration,
    /// Live waiters ahead of this one (on a quorum), and how many wait in all.
    pub position: Option<(u64, u64)>,
    /// Per node: its subscription to the wake channel stands. A node gives a waiter that does not
    /// listen there the front's heartbeat, since only heartbeats then show that it lives.
    pub listening: Vec<bool>,
    /// Per node: its clock (server ms) in its answer to the last attempt, which queued us, and
    /// when we read that answer (`None`: no such answer).
    pub heard: Vec<Option<(u64, Stamp)>>,
    /// Per node: this waiter may be queued there although no answer said so, and no later answer
    /// took it out: a send whose answer was never read (cut twice, timed out), or a grant rolled
    /// back there, which puts the waiter back at the place that grant took it from (a cut send
    /// may have queued it before its resend was granted). Leaving after a grant goes there too.
    pub unsure: Vec<bool>,
}

impl Place {
    pub fn new(mode: Mode, slack: Duration) -> Place {
        Place {
            slack,
            id: new_waiter_id(),
            mode,
            armed: false,
            ticket: None,
            queued: false,
            sent: false,
            last_try: None,
            interval: HEARTBEAT,
            hint: None,
            position: None,
            listening: Vec::new(),
            heard: Vec::new(),
            unsure: Vec::new(),
        }
    }

    /// The script's mode argument: a `--supersede` waiter that may not displace yet waits as any
    /// other.
    pub fn mode_arg(&self) -> &'static str {
        match self.mode {
            Mode::Supersede if !self.armed => Mode::Wait.arg(),
            mode => mode.arg(),
        }
    }

    /// After a refused attempt of a `--supersede` waiter that `accepted` nodes queued or granted, of
    /// `quorum`: true when it should send its next attempt at once, the one that displaces. The
    /// waiters queued before it are displaced only in a round after a quorum took it in, so that
    /// an attempt refused by a majority (a peer's key, another `--limit`, too few nodes reached)
    /// displaces nobody on the others, nor one that a stopped node runs after the waiter gave up.
    /// The displacing round done on a quorum, it waits as any other waiter and displaces nobody
    /// again. `displacing`: of those, the nodes to which the attempt went in time to displace there
    /// (see [`Place::displace_until`]).
    pub fn supersede_answered(
        &mut self,
        accepted: usize,
        displacing: usize,
        quorum: usize,
    ) -> bool {
        if self.mode != Mode::Supersede {
            return false;
        }
        if self.armed {
            if displacing >= quorum {
                self.mode = Mode::Wait;
            }
            return false;
        }
        if accepted < quorum {
            return false;
        }
        self.armed = true;
        true
    }

    /// The script's deadline argument for node `i`, for an attempt started at `started` with that
    /// node's `timeout`: '' when the attempt does not displace; else the server time after which
    /// the node displaces nobody, '0' when no recent answer of the node gave its clock. The node
    /// answered at `t` (its clock) no later than we read it, and we wait for this attempt's answer
    /// at least `timeout` from `started`; so a node that runs the attempt by `t`, plus the time
    /// from reading to `started`, plus `timeout`, on its clock, runs it while we still wait for
    /// its answer (its clock may not run fast). Later, we may have given up: a stopped node runs
    /// what its socket buffered at the resume, also after we left.
    pub fn displace_until(&self, i: usize, started: Stamp, timeout: Duration) -> String {
        if self.mode_arg() != Mode::Supersede.arg() {
            return String::new();
        }
        match self.heard.get(i).copied().flatten() {
            Some((t, read)) => {
                let since = started.elapsed_since(read);
                let until = t
                    .saturating_add(u64::try_from(since.as_millis()).unwrap_or(u64::MAX))
                    .saturating_add(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX));
                until.to_string()
            }
            None => "0".to_string(),
        }
    }

    /// The ticket as the script's argument.
    pub fn ticket_arg(&self) -> String {
        self.ticket.map_or(String::new(), |t| t.to_string())
    }

    /// At the start of an attempt: a waiter whose own loop had a gap longer than its lifetime (three
    /// intervals and its slack, the bound the nodes keep it by) between two attempts (it was
    /// stopped) may have been dropped from the queue; it queues again behind those who kept
    /// waiting. An outage is no gap: the waiter kept trying at least once per interval (less the
    /// time an attempt took, which the slack covers), so it keeps its ticket and is put back at it.
    /// A `--supersede` waiter that may have been queued before such a gap queues again as a plain
    /// one: it may have displaced already (an attempt whose answer it never read may have run),
    /// and those queued since came after it.
    pub fn check_lapse(&mut self) {
        let now = Stamp::now();
        if self
            .last_try
            .is_some_and(|t| now.elapsed_since(t) > self.interval * 3 + self.slack)
        {
            self.ticket = None;
            if self.mode == Mode::Supersede && (self.sent || self.queued) {
                self.mode = Mode::Wait;
            }
        }
        self.last_try = Some(now);
    }

    /// True when no waiter stands ahead of this one.
    pub fn is_head(&self) -> bool {
        self.position.is_none_or(|(ahead, _)| ahead == 0)
    }

    /// `position 3 of 5`, for wait lines.
    pub fn describe(&self) -> Option<String> {
        let (ahead, waiting) = self.position?;
        Some(format!(
            "position {} of {}",
            ahead + 1,
            waiting.max(ahead + 1)
        ))
    }
}

/// 64 bits from the operating system's CSPRNG, as 16 lowercase hex digits.
pub fn new_waiter_id() -> String {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the operating system's random source failed");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Takes waiter `id` out of the queue on the `on` nodes, in parallel. `blind`: send without waiting
/// for the answers (on a signal, whose exit must not wait for Redis: at most for a connect, within
/// the node timeout, on a node whose connection an earlier timeout closed).
/// `front`: a front lifetime with the waiter's slack. Returns how many of those nodes it could not
/// reach (no connection, or no answer when it waits for one).
pub fn leave(
    nodes: &mut [Node],
    keys: &LockKeys,
    id: &str,
    on: &[bool],
    blind: bool,
    front: Duration,
) -> usize {
    let key_list = [
        keys.key.as_str(),
        keys.queue.as_str(),
        keys.alive.as_str(),
        keys.waiters.as_str(),
        keys.tickets.as_str(),
        keys.limit.as_str(),
        keys.seen.as_str(),
    ];
    let alive_ms = front.as_millis().to_string();
    let args = [
        id,
        keys.wake.as_str(),
        keys.slot_base.as_str(),
        alive_ms.as_str(),
    ];
    // In parallel: a node without a connection opens one first (`Node::send_only`).
    let went = quorum::each(
        nodes,
        |i| on[i],
        |_, node| {
            if blind || node.is_stale() {
                node.send_only(super::LEAVE_LUA, &key_list, &args)
            } else {
                // A second leave finds the waiter gone.
                node.eval_even_late("leave the queue", &super::LEAVE, &key_list, &args)
                    .is_ok()
            }
        },
    );
    went.iter().filter(|w| **w == Some(false)).count()
}

/// One waiter as `status` shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WaiterRecord {
    pub id: String,
    pub host: String,
    pub pid: String,
    pub cmd: String,
    pub note: String,
    /// When it was queued (server milliseconds since the epoch).
    pub since_ms: Option<u64>,
    pub ticket: Option<u64>,
}

impl WaiterRecord {
    /// Reads the JSON record `acquire.lua` stores (`cjson` writes numbers and strings as given).
    pub fn parse(id: &str, json: &str) -> WaiterRecord {
        let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let text = |k: &str| match &v[k] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Number(n) => n.to_string(),
            _ => String::new(),
        };
        let num = |k: &str| {
            let t = text(k);
            t.parse::<u64>()
                .ok()
                .or_else(|| t.parse::<f64>().ok().map(|f| f as u64))
        };
        WaiterRecord {
            id: id.to_string(),
            host: text("host"),
            pid: text("pid"),
            cmd: text("cmd"),
            note: text("note"),
            since_ms: num("since_ms"),
            ticket: num("ticket"),
        }
    }

    /// `host pid 123 (cmd), note: TEXT`.
    pub fn describe(&self) -> String {
        super::describe_holder_note(&self.host, &self.pid, &self.cmd, &self.note)
            .unwrap_or_else(|| "an unknown waiter".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back() {
        let r = WaiterRecord::parse(
            "ab",
            r#"{"host":"h","pid":"12","cmd":"deploy","note":"job 7","since_ms":1764510000123,"ticket":"1764510000123456"}"#,
        );
        assert_eq!(r.since_ms, Some(1764510000123));
        assert_eq!(r.ticket, Some(1764510000123456));
        assert_eq!(r.describe(), "h pid 12 (deploy), note: job 7");
        assert_eq!(
            WaiterRecord::parse("x", "not json").describe(),
            "an unknown waiter"
        );
    }

    /// `supersede_answered`'s verdict on an attempt, and the mode the next attempt is sent with.
    fn answered(
        p: &mut Place,
        accepted: usize,
        displacing: usize,
        quorum: usize,
    ) -> (bool, &'static str) {
        let again = p.supersede_answered(accepted, displacing, quorum);
        (again, p.mode_arg())
    }

    #[test]
    fn a_superseder_displaces_once_a_quorum_took_it_in() {
        // Redlock 3: it waits as any waiter until two nodes took it in, then displaces.
        let mut p = Place::new(Mode::Supersede, Duration::ZERO);
        assert_eq!(p.mode_arg(), "w");
        assert_eq!(answered(&mut p, 1, 0, 2), (false, "w"));
        assert_eq!(answered(&mut p, 2, 0, 2), (true, "s"));
        // The displacing attempt reached one node in time: the next one displaces too.
        assert_eq!(answered(&mut p, 3, 1, 2), (false, "s"));
        assert_eq!(answered(&mut p, 3, 2, 2), (false, "w"));
        assert_eq!(p.mode, Mode::Wait);
        // One node alike: an attempt it never read an answer of displaces nobody.
        let mut one = Place::new(Mode::Supersede, Duration::ZERO);
        assert_eq!(one.mode_arg(), "w");
        assert_eq!(answered(&mut one, 0, 0, 1), (false, "w"));
        assert_eq!(answered(&mut one, 1, 0, 1), (true, "s"));
        assert_eq!(answered(&mut one, 1, 1, 1), (false, "w"));
        let mut plain = Place::new(Mode::Wait, Duration::ZERO);
        assert_eq!(answered(&mut plain, 3, 3, 2), (false, "w"));
        assert_eq!(Place::new(Mode::Once, Duration::ZERO).mode_arg(), "n");
    }

    #[test]
    fn a_displacing_attempt_is_bounded_by_the_last_answer() {
        let mut p = Place::new(Mode::Supersede, Duration::ZERO);
        let now = Stamp::now();
        // Not displacing yet: no deadline.
        assert_eq!(p.displace_until(0, now, Duration::from_millis(500)), "");
        p.supersede_answered(1, 0, 1);
        // No answer of that node gave its clock: it displaces nobody.
        assert_eq!(p.displace_until(0, now, Duration::from_millis(500)), "0");
        let read = Stamp::at(now.since_boot() - Duration::from_millis(300));
        p.heard = vec![Some((1_000_000, read)), None];
        let until: u64 = p
            .displace_until(0, now, Duration::from_millis(500))
            .parse()
            .unwrap();
        // Its clock then, the 300 ms since we read it (to the ms, down), and the node timeout.
        assert!((1_000_799..=1_000_800).contains(&until), "{until}");
        assert_eq!(p.displace_until(1, now, Duration::from_millis(500)), "0");
    }

    #[test]
    fn a_lapsed_superseder_queues_again_as_a_plain_waiter() {
        let mut p = Place::new(Mode::Supersede, Duration::ZERO);
        p.check_lapse();
        p.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 2));
        // Nothing went out yet: it may still displace.
        p.check_lapse();
        assert_eq!(p.mode, Mode::Supersede);
        p.sent = true;
        p.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 2));
        p.check_lapse();
        assert_eq!(p.mode, Mode::Wait);
        assert_eq!(p.mode_arg(), "w");
    }

    #[test]
    fn a_lapsed_waiter_queues_again() {
        let mut p = Place::new(Mode::Wait, Duration::ZERO);
        assert_eq!(p.id.len(), 16);
        p.ticket = Some(5);
        p.check_lapse();
        p.check_lapse();
        assert_eq!(p.ticket, Some(5));
        p.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 2));
        p.check_lapse();
        assert_eq!(p.ticket, None);
        // Far back the nodes keep it three of its longer intervals: the same gap is no lapse.
        p.ticket = Some(7);
        p.interval = HEARTBEAT * 10;
        p.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 2));
        p.check_lapse();
        assert_eq!(p.ticket, Some(7));
        p.last_try = Some(Stamp::at(Stamp::now().since_boot() - p.interval * 4));
        p.check_lapse();
        assert_eq!(p.ticket, None);
        // A slow node timeout's slack: the nodes keep the waiter longer, and so does its loop.
        let mut slow = Place::new(Mode::Wait, Duration::from_secs(6));
        slow.ticket = Some(8);
        slow.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 2));
        slow.check_lapse();
        assert_eq!(slow.ticket, Some(8));
        slow.last_try = Some(Stamp::at(Stamp::now().since_boot() - ALIVE * 4));
        slow.check_lapse();
        assert_eq!(slow.ticket, None);
        p.ticket = Some(6);
        p.position = Some((2, 5));
        assert_eq!(p.describe().as_deref(), Some("position 3 of 5"));
        assert!(!p.is_head());
    }
}
