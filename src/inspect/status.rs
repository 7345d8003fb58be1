//! `status NAME`: who holds a lock, for how long already and for how long still.
//!
//! Each node is read once, atomically, by the `STATUS` script (token, TTL, fencing counter, holder
//! record and the node's own TIME), all nodes in parallel. The holder's age is the node's TIME minus
//! the grant time the node itself wrote, so it does not depend on this host's clock. The exit status
//! answers the question scripts ask: 0 held, 1 free, 69 when too few nodes answered to tell.
//!
//! The script also reads each node's uptime, so `status` shows which nodes are in the restart
//! quarantine that `acquire` would apply (`--quarantine`, or the default TTL's), since when and for how
//! much longer, and whether it keeps a free lock from being granted: otherwise a lock that nobody can
//! take reads as plainly "free".
//!
//! A semaphore (`--limit N`) is read in the same round trip: each held slot is judged as a lock of its
//! own (held when its token stands on a quorum), the name is held when any slot is, and every slot's
//! holder is shown. The single-holder fields describe the first held slot, so a plain lock reads as
//! it always did.
//!
//! It reads the queue in the same call: the live waiters in the order they will be served (merged
//! over the nodes by their ticket), with how long each has waited by the node's clock.

use std::time::Duration;

use serde_json::{json, Value as Json};

use super::{json_ttl, show_ttl, survey, table, Merged, NodeView, State};
use crate::cli::{ReportFormat, StatusArgs};
use crate::config::{check_name, Settings};
use crate::exit::Exit;
use crate::lock::keys::LockKeys;
use crate::lock::quarantine::{self, Quarantined};
use crate::lock::queue::WaiterRecord;
use crate::lock::Engine;
use crate::output::human_ms;

/// The TTL `acquire` and `exec` use by default, whose quarantine `status` shows without
/// `--quarantine`.
const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The restart quarantine as `acquire` would meet it now.
struct Quarantine {
    /// Its length.
    length: Duration,
    /// The nodes in it.
    nodes: Vec<Quarantined>,
    /// How long until a quorum can vote, when the quarantine stands in the way.
    blocks: Option<Duration>,
}

impl Quarantine {
    fn of(m: &Merged, length: Duration) -> Quarantine {
        let mut nodes = Vec::new();
        for (i, v) in m.views.iter().enumerate() {
            let Some(up) = v.as_ref().ok().and_then(|v| v.uptime_s) else {
                continue;
            };
            let remaining = quarantine::remaining(length, up);
            if remaining.is_zero() {
                continue;
            }
            nodes.push(Quarantined {
                node: i,
                remaining,
                uptime_s: Some(up),
            });
        }
        let blocks = quarantine::unblocked_in(m.views.len(), m.quorum, &nodes);
        Quarantine {
            length,
            nodes,
            blocks,
        }
    }

    fn remaining_ms(&self, node: usize, view: &NodeView) -> Option<u64> {
        view.uptime_s?;
        Some(
            self.nodes
                .iter()
                .find(|q| q.node == node)
                .map_or(0, |q| q.remaining.as_millis() as u64),
        )
    }
}

pub fn run(settings: &Settings, args: &StatusArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    let mut engine = Engine::new(settings)?;
    let keys = engine.keys(&args.name);
    let surveyed = survey(&mut engine, &keys);
    engine.check_independent()?;
    let length = settings.quarantine.unwrap_or(DEFAULT_TTL);
    let q = Quarantine::of(&surveyed, length);
    let names: Vec<String> = engine.nodes().iter().map(|n| n.display.clone()).collect();
    let slots = Slots::of(&surveyed);
    let merged = &slots.primary;
    match args.format {
        ReportFormat::Plain => {
            let text = plain(
                &keys,
                merged,
                &q,
                engine.nodes(),
                &names,
                slots.rows(),
                &surveyed,
            );
            crate::output::emit(&text)?
        }
        ReportFormat::Json => {
            let mut json = to_json(&keys, merged, &q, &names, &surveyed);
            json["limit"] = json!(slots.limit);
            json["holders"] = slots.json();
            crate::output::emit(&format!("{json}\n"))?
        }
    }
    Ok(match merged.state {
        State::Held => Exit::Success,
        State::Free => Exit::Failure,
        State::Unknown => {
            let err = engine.unavailable(merged.answered, merged.failures().join("; "));
            crate::complain!("cannot tell whether '{}' is held: {err}", keys.name);
            err.exit(Exit::Busy)
        }
    })
}

/// The slots of a name: a plain lock has slot 1 alone.
struct Slots {
    limit: usize,
    /// Every slot with a key on some node, slot 1 always.
    all: Vec<(usize, Merged)>,
    /// The first held slot (or slot 1), with the state of the whole name.
    primary: Merged,
}

impl Slots {
    fn of(m: &Merged) -> Slots {
        let all = m.slots();
        let state = if all.iter().any(|(_, s)| s.state == State::Held) {
            State::Held
        } else if all.iter().any(|(_, s)| s.state == State::Unknown) {
            State::Unknown
        } else {
            State::Free
        };
        let mut primary = all
            .iter()
            .find(|(_, s)| s.state == State::Held)
            .unwrap_or(&all[0])
            .1
            .clone();
        primary.state = state;
        Slots {
            limit: m.limit(),
            all,
            primary,
        }
    }

    /// The slots that hold a token somewhere.
    fn held(&self) -> impl Iterator<Item = &(usize, Merged)> {
        self.all.iter().filter(|(_, s)| s.token.is_some())
    }

    /// For a semaphore, the limit and one row per held slot; nothing for a plain lock.
    fn rows(&self) -> Vec<Vec<String>> {
        if self.limit <= 1 && self.all.len() == 1 {
            return Vec::new();
        }
        let held = self.held().filter(|(_, s)| s.state == State::Held).count();
        let mut rows = vec![vec![
            "limit".to_string(),
            format!("{} ({held} of {} slot(s) held)", self.limit, self.limit),
        ]];
        for (i, s) in self.held() {
            let mut line = s.holder().map_or_else(
                || "unknown holder (no holder record)".to_string(),
                |h| h.describe(),
            );
            if let Some(f) = s.holder().and_then(|h| h.fence) {
                line.push_str(&format!(", fence {f}"));
            }
            line.push_str(&format!(", ttl {}", show_ttl(s.ttl_ms())));
            if let Some(age) = s.holder_view().and_then(NodeView::age_ms) {
                line.push_str(&format!(", age {}", human_ms(age)));
            }
            if s.views.len() > 1 {
                line.push_str(&format!(", on {} of {} node(s)", s.agree, s.views.len()));
            }
            if s.state != State::Held {
                line.push_str(", not on a quorum");
            }
            line.push_str(&format!(", token {}", s.token.as_deref().unwrap_or("-")));
            rows.push(vec![format!("slot {i}"), line]);
        }
        rows
    }

    /// The `holders` array: one object per slot that holds a token somewhere.
    fn json(&self) -> Json {
        Json::Array(
            self.held()
                .map(|(i, s)| {
                    let holder = s.holder();
                    json!({
                        "slot": i,
                        "state": s.state.as_str(),
                        "token": s.token,
                        "holder": holder.map(|h| h.json()),
                        "fence": holder.and_then(|h| h.fence),
                        "acquired_ms": holder.and_then(|h| h.acquired_ms),
                        "age_ms": s.holder_view().and_then(NodeView::age_ms),
                        "ttl_ms": json_ttl(s.ttl_ms()),
                        "agree": s.agree,
                        "quorum_agrees": s.agree >= s.quorum,
                    })
                })
                .collect(),
        )
    }
}

/// Key-value lines, then one line per node in Redlock mode.
fn plain(
    keys: &LockKeys,
    m: &Merged,
    q: &Quarantine,
    nodes: &[crate::lock::node::Node],
    names: &[String],
    slots: Vec<Vec<String>>,
    queue: &Merged,
) -> String {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut kv = |k: &str, v: String| rows.push(vec![k.to_string(), v]);
    kv("lock", keys.name.clone());
    kv("key", keys.key.clone());
    let n = m.views.len();
    let state = match m.state {
        State::Free if m.token.is_some() => format!(
            "free (a leftover key on {} of {n} node(s), short of the quorum of {})",
            m.agree, m.quorum
        ),
        State::Unknown => format!(
            "unknown (only {} of {n} node(s) answered, too few to tell)",
            m.answered
        ),
        other => other.as_str().to_string(),
    };
    let state = match (m.state, q.blocks) {
        (State::Free, Some(d)) => format!(
            "{state}, but no quorum can vote for another {}: restart quarantine",
            human_ms(d.as_millis() as i64)
        ),
        _ => state,
    };
    kv("state", state);
    if let Some(token) = &m.token {
        kv(
            "holder",
            match m.holder() {
                Some(h) => h.describe(),
                None => "unknown (no holder record: set by another client, e.g. a canonical \
                         SET NX PX lock)"
                    .into(),
            },
        );
        if let Some(age) = m.holder_view().and_then(NodeView::age_ms) {
            kv("age", human_ms(age));
        }
        kv("ttl", show_ttl(m.ttl_ms()));
        if let Some(fence) = m.holder().and_then(|h| h.fence) {
            kv("fence", fence.to_string());
        }
        kv("token", token.clone());
    }
    kv("counter", counter_line(m));
    let waiters = queue.waiters();
    kv("waiters", waiters.len().to_string());
    if !q.nodes.is_empty() {
        kv(
            "quarantine",
            format!(
                "{} (length {}); {}",
                quarantine::describe(nodes, &q.nodes, m.quorum),
                humantime::format_duration(q.length),
                quarantine::LIFT
            ),
        );
    }
    if n > 1 {
        kv(
            "quorum",
            format!(
                "{} of {n} node(s) agree on the token, a quorum needs {}; {} answered",
                m.agree, m.quorum, m.answered
            ),
        );
    }
    rows.extend(slots);
    let mut out = table(&rows);
    if !waiters.is_empty() {
        let now = queue.server_ms();
        let queue: Vec<Vec<String>> = waiters
            .iter()
            .enumerate()
            .map(|(i, w)| {
                vec![
                    format!("  {}", i + 1),
                    w.describe(),
                    format!("waited {}", waited_ms(now, w).map_or("-".into(), human_ms)),
                ]
            })
            .collect();
        out.push_str("queue\n");
        out.push_str(&table(&queue));
    }
    if n > 1 || m.answered == 0 {
        let mut node_rows = Vec::new();
        for (i, (name, view)) in names.iter().zip(&m.views).enumerate() {
            node_rows.push(match view {
                Ok(v) => vec![
                    format!("  {name}"),
                    if v.token.is_some() { "held" } else { "free" }.into(),
                    v.token.as_deref().map_or("-".into(), short_token),
                    format!("ttl {}", show_ttl(v.token.as_ref().map(|_| v.ttl_ms()))),
                    format!(
                        "counter {}",
                        v.counter.map_or("-".into(), |c| c.to_string())
                    ),
                    match (v.uptime_s, q.remaining_ms(i, v)) {
                        (Some(up), Some(left)) if left > 0 => format!(
                            "up {}, in quarantine for {}",
                            humantime::format_duration(Duration::from_secs(up)),
                            human_ms(left as i64)
                        ),
                        (Some(up), _) => {
                            format!("up {}", humantime::format_duration(Duration::from_secs(up)))
                        }
                        _ => "up -".into(),
                    },
                ],
                Err(e) => vec![format!("  {name}"), "error".into(), e.reason.clone()],
            });
        }
        out.push_str("nodes\n");
        out.push_str(&table(&node_rows));
    }
    out
}

/// The fencing counter: "never granted" only when every node answered, since a node that did not
/// answer may hold the only counter (or the largest one).
fn counter_line(m: &Merged) -> String {
    let n = m.views.len();
    match (m.counter(), m.answered) {
        (_, 0) => "unknown (no node answered)".into(),
        (Some(c), a) if a == n => c.to_string(),
        (Some(c), a) => format!("{c} (largest on the {a} of {n} node(s) that answered)"),
        (None, a) if a == n => "none (never granted by lockctl)".into(),
        (None, a) => format!(
            "unknown (none on the {a} of {n} node(s) that answered; the others may hold one)"
        ),
    }
}

/// How long a waiter has waited, by the node's clock.
fn waited_ms(now: Option<i64>, w: &WaiterRecord) -> Option<i64> {
    Some((now? - i64::try_from(w.since_ms?).ok()?).max(0))
}

fn short_token(t: &str) -> String {
    if t.chars().count() > 12 {
        format!("{}…", t.chars().take(12).collect::<String>())
    } else {
        t.to_string()
    }
}

fn to_json(keys: &LockKeys, m: &Merged, q: &Quarantine, names: &[String], queue: &Merged) -> Json {
    let holder = m.holder();
    let per_node: Vec<Json> = m
        .views
        .iter()
        .zip(names)
        .enumerate()
        .map(|(i, (v, name))| match v {
            Ok(v) => json!({
                "node": name,
                "answered": true,
                "error": null,
                "held": v.token.is_some(),
                "token": v.token,
                "ttl_ms": json_ttl(v.token.as_ref().map(|_| v.ttl_ms())),
                "fence": v.holder.as_ref().and_then(|h| h.fence),
                "fence_counter": v.counter,
                "holder": v.holder.as_ref().map(|h| h.json()),
                "age_ms": v.age_ms(),
                "uptime_s": v.uptime_s,
                "quarantine_remaining_ms": q.remaining_ms(i, v),
            }),
            Err(e) => json!({
                "node": name,
                "answered": false,
                "error": e.reason,
                "held": null,
                "token": null,
                "ttl_ms": null,
                "fence": null,
                "fence_counter": null,
                "holder": null,
                "age_ms": null,
                "uptime_s": null,
                "quarantine_remaining_ms": null,
            }),
        })
        .collect();
    let now = queue.server_ms();
    let waiters: Vec<Json> = queue
        .waiters()
        .iter()
        .enumerate()
        .map(|(i, w)| {
            json!({
                "position": i + 1,
                "id": w.id,
                "host": w.host,
                "pid": w.pid.parse::<u64>().ok(),
                "cmd": w.cmd,
                "note": (!w.note.is_empty()).then_some(&w.note),
                "since_ms": w.since_ms,
                "waited_ms": waited_ms(now, w),
                "ticket": w.ticket,
            })
        })
        .collect();
    json!({
        "name": keys.name,
        "key": keys.key,
        "state": m.state.as_str(),
        "waiters": waiters,
        "held": m.state == State::Held,
        "token": m.token,
        "holder": holder.map(|h| h.json()),
        "acquired_ms": holder.and_then(|h| h.acquired_ms),
        "age_ms": m.holder_view().and_then(NodeView::age_ms),
        "ttl_ms": json_ttl(m.ttl_ms()),
        "fence": holder.and_then(|h| h.fence),
        "fence_counter": m.counter(),
        "nodes": m.views.len(),
        "quorum": m.quorum,
        "answered": m.answered,
        "agree": m.agree,
        "quorum_agrees": m.agree >= m.quorum,
        "quarantine_ms": q.length.as_millis() as u64,
        "quarantined": q.nodes.len(),
        "quorum_votes_in_ms": q.blocks.map_or(0, |d| d.as_millis() as u64),
        "per_node": per_node,
    })
}
