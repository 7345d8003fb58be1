//! Operator commands: `status`, `list`, `break`, `doctor`.
//!
//! They read what the engine writes and never take a lock themselves. A lock is judged the way the
//! engine grants it: it is held when one token stands on a quorum of the nodes, free when no token
//! can stand on a quorum even counting the nodes that did not answer, and undecided otherwise (too
//! few answers to tell, which exits 69 like every other "no quorum" case). Holder details come from
//! the holder hash only when it names the token that is in the lock key, so a stale or foreign record
//! is never shown as the holder; a lock set by a canonical client (plain `SET NX PX`) is held by an
//! unknown holder.

pub mod breaking;
pub mod doctor;
pub mod list;
pub mod status;

use std::collections::HashMap;

use redis::Value;
use serde_json::{json, Value as Json};

use crate::lock::keys::LockKeys;
use crate::lock::node::{Node, NodeFailure};
use crate::lock::queue::WaiterRecord;
use crate::lock::{describe_holder_note, quorum, Engine, STATUS};
use crate::output::human_ms;

/// The holder hash, when it belongs to the token in the lock key.
#[derive(Debug, Clone, Default)]
pub(crate) struct HolderRecord {
    pub fence: Option<u64>,
    pub host: String,
    pub pid: String,
    pub cmd: String,
    /// `--note`.
    pub note: String,
    /// Server time of the grant, in Unix milliseconds.
    pub acquired_ms: Option<i64>,
    /// The limit of the grant (1 for a plain lock).
    pub limit: Option<usize>,
}

impl HolderRecord {
    /// Builds the record from hash fields, if it names `token`.
    pub fn from_fields(fields: &[(String, String)], token: &str) -> Option<HolderRecord> {
        let get = |k: &str| {
            fields
                .iter()
                .find(|(f, _)| f == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        if get("token") != token {
            return None;
        }
        Some(HolderRecord {
            fence: get("fence").parse().ok(),
            host: get("host"),
            pid: get("pid"),
            cmd: get("cmd"),
            note: get("note"),
            acquired_ms: get("acquired_ms").parse().ok(),
            limit: get("limit").parse().ok(),
        })
    }

    /// `host pid 123 (cmd), note: TEXT`.
    pub fn describe(&self) -> String {
        describe_holder_note(&self.host, &self.pid, &self.cmd, &self.note)
            .unwrap_or_else(|| "unknown".into())
    }

    pub fn json(&self) -> Json {
        json!({
            "host": self.host,
            "pid": self.pid.parse::<u64>().ok(),
            "cmd": self.cmd,
            "note": (!self.note.is_empty()).then_some(&self.note),
        })
    }
}

/// What one node says about one lock.
#[derive(Debug, Clone, Default)]
pub(crate) struct NodeView {
    /// The token in the lock key.
    pub token: Option<String>,
    /// PTTL of the lock key: -1 no expiry, -2 no key.
    pub pttl: i64,
    /// The fencing counter, when it was read.
    pub counter: Option<u64>,
    pub holder: Option<HolderRecord>,
    /// The node's clock (TIME), in Unix milliseconds.
    pub server_ms: Option<i64>,
    /// How long the node has been up (`status` only).
    pub uptime_s: Option<u64>,
    /// The limit recorded for a semaphore (`status` only).
    pub limit: Option<usize>,
    /// The held slots from 2 on, each seen as a lock of its own (`status` only).
    pub slots: Vec<(usize, NodeView)>,
    /// The live waiters in queue order (`status` only).
    pub waiters: Vec<WaiterRecord>,
    /// The number of queued waiters (`list` only).
    pub waiting: Option<u64>,
}

impl NodeView {
    /// How long the holder has held the lock, by the node's own clock.
    pub fn age_ms(&self) -> Option<i64> {
        let acquired = self.holder.as_ref()?.acquired_ms?;
        Some((self.server_ms? - acquired).max(0))
    }

    /// Remaining TTL in ms; `None` when the key does not expire.
    pub fn ttl_ms(&self) -> Option<i64> {
        (self.pttl >= 0).then_some(self.pttl)
    }

    /// Builds a view from the reply of the `STATUS` script.
    fn from_status(v: Value) -> Option<NodeView> {
        let Value::Array(items) = v else {
            return None;
        };
        let token = items.first().and_then(text);
        let fields = items.get(3).map(pairs).unwrap_or_default();
        let holder = token
            .as_deref()
            .and_then(|t| HolderRecord::from_fields(&fields, t));
        let counter = items.get(2).and_then(text).and_then(|s| s.parse().ok());
        let server_ms = items.get(4).and_then(server_ms);
        let slots = match items.get(7) {
            Some(Value::Array(slots)) => slots
                .iter()
                .filter_map(|s| {
                    let Value::Array(s) = s else { return None };
                    let slot = usize::try_from(int(s.first()?)?).ok()?;
                    let token = text(s.get(1)?)?;
                    let fields = s.get(3).map(pairs).unwrap_or_default();
                    Some((
                        slot,
                        NodeView {
                            holder: HolderRecord::from_fields(&fields, &token),
                            token: Some(token),
                            pttl: int(s.get(2)?)?,
                            counter,
                            server_ms,
                            ..NodeView::default()
                        },
                    ))
                })
                .collect(),
            _ => Vec::new(),
        };
        let waiters = match items.get(8) {
            Some(Value::Array(w)) => w
                .chunks(3)
                .filter_map(|c| {
                    let id = text(c.first()?)?;
                    let mut r = WaiterRecord::parse(&id, &text(c.get(1)?)?);
                    r.ticket = text(c.get(2)?)?.parse::<f64>().ok().map(|t| t as u64);
                    Some(r)
                })
                .collect(),
            _ => Vec::new(),
        };
        Some(NodeView {
            waiters,
            waiting: None,
            pttl: items.get(1).and_then(int)?,
            counter,
            holder,
            server_ms,
            uptime_s: items
                .get(5)
                .and_then(int)
                .and_then(|u| u64::try_from(u).ok()),
            limit: items
                .get(6)
                .and_then(int)
                .and_then(|l| usize::try_from(l).ok()),
            slots,
            token,
        })
    }
}

/// A bulk or simple string as text; `None` for nil.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Okay => Some("OK".into()),
        Value::Int(i) => Some(i.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// An integer reply, or a string holding one.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        other => text(other)?.trim().parse().ok(),
    }
}

/// A flat `field, value, ...` array (HGETALL, CONFIG GET) as pairs.
pub(crate) fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => items
            .chunks(2)
            .filter_map(|c| Some((text(c.first()?)?, text(c.get(1)?)?)))
            .collect(),
        Value::Map(m) => m
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A TIME reply (`[seconds, microseconds]`) in Unix milliseconds.
pub(crate) fn server_ms(v: &Value) -> Option<i64> {
    let Value::Array(t) = v else { return None };
    Some(int(t.first()?)? * 1000 + int(t.get(1)?)? / 1000)
}

/// The verdict over all nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    /// One token stands on a quorum.
    Held,
    /// No token can stand on a quorum, even counting the nodes that did not answer.
    Free,
    /// Too few nodes answered to tell.
    Unknown,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Held => "held",
            State::Free => "free",
            State::Unknown => "unknown",
        }
    }
}

/// One lock as seen by all nodes.
#[derive(Debug, Clone)]
pub(crate) struct Merged {
    pub views: Vec<Result<NodeView, NodeFailure>>,
    pub quorum: usize,
    pub answered: usize,
    /// The token on the most nodes.
    pub token: Option<String>,
    /// On how many nodes that token stands.
    pub agree: usize,
    pub state: State,
}

impl Merged {
    /// Merges the views of all nodes (in node order; failures included).
    pub fn new(views: Vec<Result<NodeView, NodeFailure>>) -> Merged {
        let n = views.len();
        let quorum = quorum::quorum(n);
        let answered = views.iter().filter(|v| v.is_ok()).count();
        let mut counts: HashMap<&str, usize> = HashMap::new();
        let mut order: Vec<&str> = Vec::new();
        for t in views.iter().flatten().filter_map(|v| v.token.as_deref()) {
            let c = counts.entry(t).or_insert(0);
            if *c == 0 {
                order.push(t);
            }
            *c += 1;
        }
        // The first token seen wins a tie, so the answer is stable in node order.
        let (token, agree) = order.iter().fold((None, 0), |(bt, bc), t| match counts[t] {
            c if c > bc => (Some(t.to_string()), c),
            _ => (bt, bc),
        });
        let state = if answered < quorum {
            State::Unknown
        } else if agree >= quorum {
            State::Held
        } else if agree + (n - answered) >= quorum {
            State::Unknown
        } else {
            State::Free
        };
        Merged {
            views,
            quorum,
            answered,
            token,
            agree,
            state,
        }
    }

    /// The views that hold the leading token.
    pub fn agreeing(&self) -> impl Iterator<Item = &NodeView> {
        self.views
            .iter()
            .flatten()
            .filter(move |v| v.token.is_some() && v.token == self.token)
    }

    /// The holder record, from the first agreeing node that has one.
    pub fn holder_view(&self) -> Option<&NodeView> {
        self.agreeing().find(|v| v.holder.is_some())
    }

    pub fn holder(&self) -> Option<&HolderRecord> {
        self.holder_view().and_then(|v| v.holder.as_ref())
    }

    /// How long the lock still stands on a quorum: the quorum-th longest TTL among the agreeing nodes
    /// (the longest when there is no quorum). `Some(None)`: it does not expire. `None`: nobody holds it.
    pub fn ttl_ms(&self) -> Option<Option<i64>> {
        let mut ttls: Vec<Option<i64>> = self.agreeing().map(NodeView::ttl_ms).collect();
        if ttls.is_empty() {
            return None;
        }
        // Descending, with "no expiry" the longest of all.
        ttls.sort_by(|a, b| match (a, b) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, _) => std::cmp::Ordering::Less,
            (_, None) => std::cmp::Ordering::Greater,
            (Some(x), Some(y)) => y.cmp(x),
        });
        Some(ttls[(self.quorum - 1).min(ttls.len() - 1)])
    }

    /// The live waiters over all nodes, in queue order: each once, by the largest ticket any node
    /// has for it (the one every node orders it by once its heartbeat has reached them).
    pub fn waiters(&self) -> Vec<WaiterRecord> {
        let mut all: Vec<WaiterRecord> = Vec::new();
        for w in self.views.iter().flatten().flat_map(|v| &v.waiters) {
            match all.iter_mut().find(|a| a.id == w.id) {
                Some(a) => a.ticket = a.ticket.max(w.ticket),
                None => all.push(w.clone()),
            }
        }
        all.sort_by(|a, b| (a.ticket, &a.id).cmp(&(b.ticket, &b.id)));
        all
    }

    /// The server time of the first node that answered, in Unix milliseconds.
    pub fn server_ms(&self) -> Option<i64> {
        self.views.iter().flatten().find_map(|v| v.server_ms)
    }

    /// The number of waiters: the most any node counts.
    pub fn waiting(&self) -> u64 {
        self.views
            .iter()
            .flatten()
            .filter_map(|v| v.waiting)
            .max()
            .unwrap_or(0)
    }

    /// The largest fencing counter among the nodes that answered.
    pub fn counter(&self) -> Option<u64> {
        self.views.iter().flatten().filter_map(|v| v.counter).max()
    }

    /// The semaphore's limit as the nodes record it (1 for a plain lock).
    pub fn limit(&self) -> usize {
        let recorded = self.views.iter().flatten().filter_map(|v| v.limit).max();
        let by_holder = self
            .views
            .iter()
            .flatten()
            .filter_map(|v| v.holder.as_ref().and_then(|h| h.limit))
            .max();
        recorded.or(by_holder).unwrap_or(1).max(1)
    }

    /// Each slot seen as a lock of its own, slot 1 first, then every slot above it that a node
    /// holds (a plain lock: slot 1 alone).
    pub fn slots(&self) -> Vec<(usize, Merged)> {
        let mut numbers: Vec<usize> = self
            .views
            .iter()
            .flatten()
            .flat_map(|v| v.slots.iter().map(|(i, _)| *i))
            .collect();
        numbers.sort_unstable();
        numbers.dedup();
        let mut out = vec![(1, Merged::new(self.views.clone()))];
        for i in numbers {
            let views = self
                .views
                .iter()
                .map(|v| match v {
                    Ok(v) => Ok(v
                        .slots
                        .iter()
                        .find(|(j, _)| *j == i)
                        .map(|(_, s)| s.clone())
                        .unwrap_or(NodeView {
                            pttl: -2,
                            counter: v.counter,
                            server_ms: v.server_ms,
                            ..NodeView::default()
                        })),
                    Err(f) => Err(f.clone()),
                })
                .collect();
            out.push((i, Merged::new(views)));
        }
        out
    }

    /// Failure reasons of the nodes that did not answer.
    pub fn failures(&self) -> Vec<String> {
        self.views
            .iter()
            .filter_map(|v| v.as_ref().err().map(|f| f.reason.clone()))
            .collect()
    }
}

/// Reads one lock on every node in parallel with the `STATUS` script: one round trip per node.
pub(crate) fn survey(engine: &mut Engine, keys: &LockKeys) -> Merged {
    let key_list = [
        keys.key.as_str(),
        keys.fence.as_str(),
        keys.holder.as_str(),
        keys.limit.as_str(),
        keys.queue.as_str(),
        keys.alive.as_str(),
        keys.waiters.as_str(),
        keys.seen.as_str(),
    ];
    let front_ms = engine.front_lifetime().as_millis().to_string();
    let args = [
        keys.slot_base.as_str(),
        keys.holder_base.as_str(),
        keys.wake.as_str(),
        front_ms.as_str(),
    ];
    let views = quorum::all(engine.nodes_mut(), |_, node: &mut Node| {
        let v = node.eval("status", &STATUS, &key_list, &args)?;
        NodeView::from_status(v).ok_or_else(|| NodeFailure {
            reason: format!("{}: unexpected reply from the status script", node.display),
            maybe_applied: false,
        })
    });
    Merged::new(views)
}

/// A TTL for people: `12.5s`, `no expiry`, `-`.
pub(crate) fn show_ttl(ttl: Option<Option<i64>>) -> String {
    match ttl {
        None => "-".into(),
        Some(None) => "no expiry".into(),
        Some(Some(ms)) => human_ms(ms),
    }
}

/// A TTL for programs: ms, -1 for no expiry, null when not held.
pub(crate) fn json_ttl(ttl: Option<Option<i64>>) -> Json {
    match ttl {
        None => Json::Null,
        Some(None) => json!(-1),
        Some(Some(ms)) => json!(ms),
    }
}

/// Aligns rows into columns two spaces apart; the last column is not padded.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    // A row's last cell is not padded, so it does not widen its column for the others: a node's
    // error message in `status` would push every other node's columns right.
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c).filter(|_| c + 1 < r.len()))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        out.push_str(&row_line(r, &widths));
        out.push('\n');
    }
    out
}

/// One row padded to `widths` (cells wider than their column just push the rest right).
pub(crate) fn row_line(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        if i + 1 == row.len() {
            line.push_str(cell);
        } else {
            let w = widths.get(i).copied().unwrap_or(0);
            line.push_str(cell);
            let pad = w.saturating_sub(cell.chars().count()) + 2;
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    line.trim_end().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(token: &str, pttl: i64) -> Result<NodeView, NodeFailure> {
        Ok(NodeView {
            token: Some(token.into()),
            pttl,
            ..NodeView::default()
        })
    }

    fn free() -> Result<NodeView, NodeFailure> {
        Ok(NodeView {
            pttl: -2,
            ..NodeView::default()
        })
    }

    fn down() -> Result<NodeView, NodeFailure> {
        Err(NodeFailure {
            reason: "down".into(),
            maybe_applied: false,
        })
    }

    #[test]
    fn verdicts() {
        assert_eq!(Merged::new(vec![held("a", 5)]).state, State::Held);
        assert_eq!(Merged::new(vec![free()]).state, State::Free);
        assert_eq!(Merged::new(vec![down()]).state, State::Unknown);
        let m = Merged::new(vec![held("a", 900), free(), held("a", 1000)]);
        assert_eq!((m.state, m.agree), (State::Held, 2));
        // The lock stands on a quorum of 2 until the second longest TTL runs out.
        assert_eq!(m.ttl_ms(), Some(Some(900)));
        assert_eq!(
            Merged::new(vec![held("a", 5), free(), free()]).state,
            State::Free
        );
        // One holder and one silent node: the silent one may hold it too.
        assert_eq!(
            Merged::new(vec![held("a", 5), free(), down()]).state,
            State::Unknown
        );
        assert_eq!(
            Merged::new(vec![held("a", 5), held("b", 5), held("c", 5)]).state,
            State::Free
        );
        assert_eq!(Merged::new(vec![held("a", -1)]).ttl_ms(), Some(None));
    }

    #[test]
    fn holder_must_name_the_token() {
        let f = vec![
            ("token".to_string(), "x".to_string()),
            ("pid".into(), "7".into()),
        ];
        assert!(HolderRecord::from_fields(&f, "y").is_none());
        assert_eq!(HolderRecord::from_fields(&f, "x").unwrap().pid, "7");
    }

    #[test]
    fn aligned() {
        let t = table(&[
            vec!["a".into(), "bb".into(), "c".into()],
            vec!["ccc".into(), "d".into(), "e".into()],
        ]);
        assert_eq!(t, "a    bb  c\nccc  d   e\n");
    }
}
