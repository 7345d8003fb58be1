//! `list [PATTERN]`: every held lock whose name matches a glob.
//!
//! Built for keyspaces of millions of keys, so memory never grows with the keyspace:
//! - SCAN with `MATCH <escaped prefix><PATTERN>`, `COUNT` and `TYPE string`, never KEYS, so the
//!   server filters and the client sees only candidate lock keys, a batch at a time. Glob
//!   metacharacters in the prefix are escaped: the pattern applies to the NAME only.
//! - Auxiliary keys (fencing counters, holder hashes) are dropped by name (`keys::is_lock_key`).
//! - Each batch is read with one pipelined round trip per node (GET, PTTL, HMGET of the holder hash,
//!   TIME), on all nodes in parallel, so a batch costs one round trip, not one per key.
//! - The replies of a batch are read one by one and the read stops at the first error: a stopped
//!   node costs one node timeout, then it is marked failed and never asked again during this
//!   listing, so one unresponsive node costs about one node timeout for the whole `list`, whatever
//!   the number of batches or keys. (redis-rs's own pipeline read goes on reading every remaining
//!   reply after an I/O error, each read waiting the full timeout: three per key, up to 3001 per
//!   batch.) The batch is not one Lua script because a script's keys must share one hash slot on
//!   Redis Cluster, and the keys of one SCAN batch do not; pipelined single-key commands work
//!   there. Behind a cluster endpoint (any `-r` whose server has `cluster_enabled:1`), every master
//!   from `CLUSTER NODES` is scanned, and a batch is read on every master: its owner answers, the
//!   others reply MOVED, which reads as absent. A key whose slot moves during the listing may read
//!   as absent.
//! - Redlock merges the nodes without a map of every name: the nodes are scanned one after another,
//!   each batch is read on every node, and a name is printed for the first node (in order) that holds
//!   it, since that node's complete scan lists it (SCAN returns every key present for the whole
//!   scan). A lock that comes or goes during the listing may or may not be shown, as with any snapshot.
//!   If a node fails part-way through its own scan, the names it had already listed may be listed
//!   again by a later node (its rows say on how many nodes each lock stands); the listing then also
//!   says it is incomplete.
//! - Rows are sorted and aligned when there are at most [`SORT_LIMIT`] of them; beyond that, the rows
//!   held so far are printed and the rest stream out in scan order with the same column widths.
//! - A semaphore (`--limit N`) is one row: a lock key whose batch read finds the name's `limit` key
//!   is read again whole with the status script (every slot, one round trip per node), and a second
//!   scan per node looks for `limit` keys, which find the semaphores whose slot 1 is free while
//!   another slot is held (a lock key alone would miss them). The names found that way are kept
//!   until the end, so memory grows with the number of semaphores, not of keys. That scan matches
//!   names without braces; a braced name's semaphore is listed while its slot 1 is held.

use std::io::{self, Write};
use std::sync::Mutex;

use anyhow::Context;
use redis::{Connection, Value};
use serde_json::{json, Value as Json};

use super::{
    int, json_ttl, row_line, server_ms, show_ttl, survey, text, HolderRecord, Merged, NodeView,
    State,
};
use crate::cli::{ListArgs, ReportFormat};
use crate::config::Settings;
use crate::exit::{Exit, LockError};
use crate::lock::keys::{is_lock_key, LockKeys};
use crate::lock::node::{Node, NodeFailure};
use crate::lock::{quorum, Engine};
use crate::output::human_ms;
use crate::say;

/// Keys asked of SCAN per call: a few hundred microseconds of server time per batch.
const SCAN_COUNT: usize = 1000;

/// Rows kept for sorting before the listing switches to streaming.
pub const SORT_LIMIT: usize = 10_000;

/// Holder hash fields read for each lock.
const HOLDER_FIELDS: [&str; 7] = [
    "token",
    "fence",
    "host",
    "pid",
    "cmd",
    "acquired_ms",
    "note",
];

pub fn run(settings: &Settings, args: &ListArgs) -> anyhow::Result<Exit> {
    check_pattern(&args.pattern)?;
    let mut engine = Engine::new(settings)?;
    let prefix = engine.prefix().to_string();
    let matcher = format!("{}{}", glob_escape(&prefix), args.pattern);
    let n = engine.nodes().len();
    let quorum = engine.quorum();
    let mut out = Emitter::new(args.format, n > 1, &prefix, &args.pattern, n, quorum);
    let mut failed: Vec<Option<String>> = vec![None; n];
    let mut done = vec![false; n];
    let mut type_filter = true;

    // Behind a cluster endpoint every master is scanned, and a batch is read on every master (the
    // owner answers; the others answer MOVED, which reads as absent).
    let shards: Vec<Mutex<Vec<Node>>> = engine
        .nodes_mut()
        .iter_mut()
        .map(|node| match node.cluster_masters() {
            Ok(masters) => masters.iter().filter_map(|a| node.at(a).ok()).collect(),
            Err(_) => Vec::new(),
        })
        .map(Mutex::new)
        .collect();
    let sharded = |j: usize| !lock(&shards[j]).is_empty();

    for i in 0..n {
        if failed[i].is_some() {
            // Failed while reading another node's batch: not asked again.
            continue;
        }
        let sources = lock(&shards[i]).len().max(1);
        for src in 0..sources {
            if failed[i].is_some() {
                break;
            }
            let mut cursor = 0u64;
            loop {
                let scanned = if sharded(i) {
                    lock(&shards[i])[src].call("scan", |c| scan(c, cursor, &matcher, type_filter))
                } else {
                    engine.nodes_mut()[i].call("scan", |c| scan(c, cursor, &matcher, type_filter))
                };
                let (next, keys) = match scanned {
                    Ok(r) => r,
                    // Servers before 6.0 know no TYPE option: filter by reading instead.
                    Err(fail) if type_filter && cursor == 0 && fail.reason.contains("syntax") => {
                        type_filter = false;
                        continue;
                    }
                    Err(fail) => {
                        failed[i] = Some(fail.reason);
                        break;
                    }
                };
                cursor = next;
                let names: Vec<String> = keys
                    .iter()
                    .filter(|k| is_lock_key(k) && k.starts_with(prefix.as_bytes()))
                    .map(|k| String::from_utf8_lossy(&k[prefix.len()..]).into_owned())
                    .collect();
                if !names.is_empty() {
                    let lock_keys: Vec<LockKeys> = names
                        .iter()
                        .map(|name| LockKeys::new(&prefix, name))
                        .collect();
                    let reads = quorum::each(
                        engine.nodes_mut(),
                        |j| failed[j].is_none(),
                        |j, node| {
                            let mut masters = lock(&shards[j]);
                            if masters.is_empty() {
                                node.call("read batch", |c| read_batch(c, &lock_keys))
                            } else {
                                read_sharded(&mut masters, &lock_keys)
                            }
                        },
                    );
                    let mut per_node: Vec<Result<Vec<NodeView>, NodeFailure>> =
                        Vec::with_capacity(n);
                    for (j, r) in reads.into_iter().enumerate() {
                        per_node.push(match r {
                            Some(Ok(views)) => Ok(views),
                            Some(Err(fail)) => {
                                failed[j] = Some(fail.reason.clone());
                                Err(fail)
                            }
                            None => Err(NodeFailure {
                                reason: failed[j].clone().unwrap_or_default(),
                                maybe_applied: false,
                            }),
                        });
                    }
                    for (k, keys) in lock_keys.iter().enumerate() {
                        let holds =
                            |j: usize| per_node[j].as_ref().is_ok_and(|v| v[k].token.is_some());
                        // Listed already from an earlier node, or gone since the scan saw it.
                        if (0..i).any(|j| done[j] && holds(j)) || !holds(i) {
                            continue;
                        }
                        let views = (0..n)
                            .map(|j| match &per_node[j] {
                                Ok(v) => Ok(v[k].clone()),
                                Err(f) => Err(f.clone()),
                            })
                            .collect();
                        let merged = Merged::new(views);
                        let row = if merged.views.iter().flatten().any(|v| v.limit.is_some()) {
                            Row::semaphore(keys, survey(&mut engine, keys), Some(merged.waiting()))
                        } else {
                            Row::new(keys, merged)
                        };
                        if !out.push(row)? {
                            return Ok(Exit::Success);
                        }
                    }
                }
                if failed[i].is_some() {
                    // It failed reading its own batch: the rest of its scan could show nothing.
                    break;
                }
                if cursor == 0 {
                    break;
                }
            }
        }
        if failed[i].is_none() {
            done[i] = true;
        }
    }

    // Semaphores whose slot 1 is free: found by their limit key.
    let limits = format!("{{{}{}}}\u{1f}limit", glob_escape(&prefix), args.pattern);
    let mut seen = std::collections::HashSet::new();
    let sources: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| (0..lock(&shards[i]).len().max(1)).map(move |src| (i, src)))
        .collect();
    for (i, src) in sources {
        let mut cursor = 0u64;
        loop {
            if failed[i].is_some() {
                break;
            }
            let scanned = if sharded(i) {
                lock(&shards[i])[src].call("scan", |c| scan(c, cursor, &limits, type_filter))
            } else {
                engine.nodes_mut()[i].call("scan", |c| scan(c, cursor, &limits, type_filter))
            };
            let (next, found) = match scanned {
                Ok(r) => r,
                Err(f) => {
                    failed[i] = Some(f.reason);
                    break;
                }
            };
            cursor = next;
            for key in found {
                let key = String::from_utf8_lossy(&key).into_owned();
                let Some(name) = key
                    .strip_prefix(&format!("{{{prefix}"))
                    .and_then(|k| k.strip_suffix("}\u{1f}limit"))
                else {
                    continue;
                };
                let keys = LockKeys::new(&prefix, name);
                if keys.limit != key || !seen.insert(name.to_string()) {
                    continue;
                }
                let m = survey(&mut engine, &keys);
                if m.views.iter().flatten().any(|v| v.token.is_some())
                    || !m.slots().iter().any(|(_, s)| s.token.is_some())
                {
                    // Listed with its lock key, or nothing held any more.
                    continue;
                }
                if !out.push(Row::semaphore(&keys, m, None))? {
                    return Ok(Exit::Success);
                }
            }
            if cursor == 0 {
                break;
            }
        }
    }

    let answered = failed.iter().filter(|f| f.is_none()).count();
    if !out.finish(answered)? {
        return Ok(Exit::Success);
    }
    for reason in failed.iter().flatten() {
        say!("{reason}");
    }
    if answered < quorum {
        return Err(engine
            .unavailable(answered, "the listing is incomplete".into())
            .into());
    }
    if out.count == 0 {
        say!(
            "no held lock matches '{}' under the prefix '{prefix}'",
            args.pattern
        );
    }
    Ok(Exit::Success)
}

/// A PATTERN must be a usable glob over names.
fn check_pattern(pattern: &str) -> Result<(), LockError> {
    if pattern.is_empty() {
        return Err(LockError::Usage(
            "invalid PATTERN: it is empty; use '*' for every lock, or e.g. 'deploy-*'".into(),
        ));
    }
    if let Some(c) = pattern.chars().find(|c| c.is_control()) {
        return Err(LockError::Usage(format!(
            "invalid PATTERN: it contains the control character {c:?}, which no lock name has"
        )));
    }
    Ok(())
}

/// Escapes Redis glob metacharacters, so the prefix matches only itself.
pub fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^' | '-') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One SCAN call: the next cursor and the keys of this batch.
fn scan(
    c: &mut Connection,
    cursor: u64,
    matcher: &str,
    type_filter: bool,
) -> redis::RedisResult<(u64, Vec<Vec<u8>>)> {
    let mut cmd = redis::cmd("SCAN");
    cmd.arg(cursor)
        .arg("MATCH")
        .arg(matcher)
        .arg("COUNT")
        .arg(SCAN_COUNT);
    if type_filter {
        cmd.arg("TYPE").arg("string");
    }
    cmd.query(c)
}

/// Locks a mutex, whether or not a thread panicked while holding it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Reads a batch on every master of a cluster; each lock is where its owner says it is.
fn read_sharded(masters: &mut [Node], keys: &[LockKeys]) -> Result<Vec<NodeView>, NodeFailure> {
    let mut merged: Option<Vec<NodeView>> = None;
    for m in masters.iter_mut() {
        let views = m.call("read batch", |c| read_batch(c, keys))?;
        merged = Some(match merged {
            None => views,
            Some(mut acc) => {
                for (a, v) in acc.iter_mut().zip(views) {
                    if a.token.is_none() && v.token.is_some() {
                        *a = v;
                    }
                }
                acc
            }
        });
    }
    Ok(merged.unwrap_or_default())
}

/// Reads a batch of locks on one node in one pipelined round trip.
fn read_batch(c: &mut Connection, keys: &[LockKeys]) -> redis::RedisResult<Vec<NodeView>> {
    let mut pipe = redis::pipe();
    for k in keys {
        pipe.cmd("GET").arg(&k.key);
        pipe.cmd("PTTL").arg(&k.key);
        pipe.cmd("HMGET").arg(&k.holder).arg(&HOLDER_FIELDS[..]);
        pipe.cmd("GET").arg(&k.limit);
        pipe.cmd("ZCARD").arg(&k.queue);
    }
    pipe.cmd("TIME");
    // Not `pipe.query`: it would wait out the read timeout once per remaining reply after the
    // first one timed out. Server errors arrive as `Value::ServerError` and read as absent.
    c.send_packed_command(&pipe.get_packed_pipeline())?;
    let mut replies: Vec<Value> = Vec::with_capacity(keys.len() * 5 + 1);
    for _ in 0..keys.len() * 5 + 1 {
        replies.push(c.recv_response()?);
    }
    let now = replies.last().and_then(server_ms);
    Ok(replies
        .chunks_exact(5)
        .map(|r| {
            let token = text(&r[0]);
            let fields: Vec<(String, String)> = match &r[2] {
                Value::Array(vals) => HOLDER_FIELDS
                    .iter()
                    .zip(vals)
                    .filter_map(|(f, v)| Some((f.to_string(), text(v)?)))
                    .collect(),
                _ => Vec::new(),
            };
            NodeView {
                holder: token
                    .as_deref()
                    .and_then(|t| HolderRecord::from_fields(&fields, t)),
                pttl: int(&r[1]).unwrap_or(-2),
                counter: None,
                server_ms: now,
                uptime_s: None,
                limit: int(&r[3]).and_then(|l| usize::try_from(l).ok()),
                slots: Vec::new(),
                waiters: Vec::new(),
                waiting: int(&r[4]).and_then(|n| u64::try_from(n).ok()),
                token,
            }
        })
        .collect())
}

/// One lock of the listing.
struct Row {
    name: String,
    key: String,
    /// The lock, or a semaphore's first held slot.
    merged: Merged,
    /// A semaphore: its limit and every slot that holds a token somewhere.
    slots: Option<(usize, Vec<(usize, Merged)>)>,
    /// The queued waiters (a semaphore's row is drawn from a slot, whose view has no queue).
    waiting: u64,
}

impl Row {
    fn new(keys: &LockKeys, merged: Merged) -> Row {
        Row {
            name: keys.name.clone(),
            key: keys.key.clone(),
            waiting: merged.waiting(),
            merged,
            slots: None,
        }
    }

    /// A semaphore from its full survey; `waiting`, the queue's entries where the batch read them
    /// (otherwise the survey's live waiters are counted).
    fn semaphore(keys: &LockKeys, surveyed: Merged, waiting: Option<u64>) -> Row {
        let waiting = waiting.unwrap_or_else(|| surveyed.waiters().len() as u64);
        let limit = surveyed.limit();
        let held: Vec<(usize, Merged)> = surveyed
            .slots()
            .into_iter()
            .filter(|(_, m)| m.token.is_some())
            .collect();
        let merged = held
            .iter()
            .find(|(_, m)| m.state == State::Held)
            .or(held.first())
            .map_or(surveyed, |(_, m)| m.clone());
        Row {
            name: keys.name.clone(),
            key: keys.key.clone(),
            merged,
            slots: Some((limit, held)),
            waiting,
        }
    }

    /// The holders of a semaphore on a quorum.
    fn held_slots(&self) -> Option<(usize, usize)> {
        let (limit, slots) = self.slots.as_ref()?;
        let held = slots.iter().filter(|(_, m)| m.state == State::Held).count();
        Some((held, *limit))
    }

    fn holder_cell(&self) -> String {
        let one = |m: &Merged| m.holder().map_or("unknown".into(), HolderRecord::describe);
        match &self.slots {
            None => one(&self.merged),
            Some((_, slots)) => {
                let (held, limit) = self.held_slots().unwrap_or_default();
                let who: Vec<String> = slots
                    .iter()
                    .map(|(i, m)| format!("slot {i}: {}", one(m)))
                    .collect();
                format!("{held}/{limit} held; {}", who.join("; "))
            }
        }
    }

    fn cells(&self, redlock: bool) -> Vec<String> {
        let m = &self.merged;
        let mut cells = vec![
            self.name.clone(),
            show_ttl(m.ttl_ms()),
            m.holder_view()
                .and_then(NodeView::age_ms)
                .map_or("-".into(), human_ms),
            m.holder()
                .and_then(|h| h.fence)
                .map_or("-".into(), |f| f.to_string()),
        ];
        if redlock {
            cells.push(format!("{}/{}", m.agree, m.views.len()));
        }
        cells.push(self.waiting.to_string());
        cells.push(self.holder_cell());
        cells
    }

    fn json(&self) -> Json {
        let m = &self.merged;
        json!({
            "name": self.name,
            "key": self.key,
            "state": m.state.as_str(),
            "token": m.token,
            "ttl_ms": json_ttl(m.ttl_ms()),
            "age_ms": m.holder_view().and_then(NodeView::age_ms),
            "fence": m.holder().and_then(|h| h.fence),
            "holder": m.holder().map(HolderRecord::json),
            "nodes_holding": m.agree,
            "quorum_agrees": m.agree >= m.quorum,
            "limit": self.held_slots().map_or(1, |(_, l)| l),
            "held_slots": self.held_slots().map_or(1, |(h, _)| h),
            "slots": self.slots.as_ref().map(|(_, slots)| {
                slots
                    .iter()
                    .map(|(i, m)| {
                        json!({
                            "slot": i,
                            "token": m.token,
                            "state": m.state.as_str(),
                            "ttl_ms": json_ttl(m.ttl_ms()),
                            "fence": m.holder().and_then(|h| h.fence),
                            "holder": m.holder().map(HolderRecord::json),
                        })
                    })
                    .collect::<Vec<_>>()
            }),
            "waiters": self.waiting,
        })
    }
}

/// Prints rows: sorted and aligned up to [`SORT_LIMIT`], streamed after that.
struct Emitter {
    format: ReportFormat,
    redlock: bool,
    head: Json,
    buffer: Vec<Row>,
    /// Column widths once streaming; `None` while buffering.
    widths: Option<Vec<usize>>,
    count: usize,
    out: io::BufWriter<io::Stdout>,
}

impl Emitter {
    fn new(
        format: ReportFormat,
        redlock: bool,
        prefix: &str,
        pattern: &str,
        nodes: usize,
        quorum: usize,
    ) -> Emitter {
        Emitter {
            format,
            redlock,
            head: json!({"prefix": prefix, "pattern": pattern, "nodes": nodes, "quorum": quorum}),
            buffer: Vec::new(),
            widths: None,
            count: 0,
            out: io::BufWriter::new(io::stdout()),
        }
    }

    fn header(&self) -> Vec<String> {
        let mut h: Vec<String> = ["NAME", "TTL", "AGE", "FENCE"].map(String::from).to_vec();
        if self.redlock {
            h.push("NODES".into());
        }
        h.push("WAITING".into());
        h.push("HOLDER".into());
        h
    }

    /// Adds a row; false once stdout is closed (`lockctl list | head`).
    fn push(&mut self, row: Row) -> anyhow::Result<bool> {
        self.count += 1;
        if self.widths.is_none() {
            self.buffer.push(row);
            if self.buffer.len() <= SORT_LIMIT {
                return Ok(true);
            }
            return self.flush_buffer();
        }
        let text = self.render(&row);
        self.write(&text)
    }

    /// Prints the buffered rows sorted, and fixes the column widths.
    fn flush_buffer(&mut self) -> anyhow::Result<bool> {
        self.buffer.sort_by(|a, b| a.name.cmp(&b.name));
        let header = self.header();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for row in &self.buffer {
            for (w, cell) in widths.iter_mut().zip(row.cells(self.redlock)) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let mut text = match self.format {
            ReportFormat::Plain => format!("{}\n", row_line(&header, &widths)),
            ReportFormat::Json => {
                let head = self.head.to_string();
                format!("{},\"locks\":[", &head[..head.len() - 1])
            }
        };
        self.widths = Some(widths);
        let rows = std::mem::take(&mut self.buffer);
        for (i, row) in rows.iter().enumerate() {
            if self.format == ReportFormat::Json && i > 0 {
                text.push(',');
            }
            text.push_str(&self.render_cells(row));
        }
        self.write(&text)
    }

    fn render(&self, row: &Row) -> String {
        match self.format {
            ReportFormat::Plain => self.render_cells(row),
            ReportFormat::Json => format!(",{}", self.render_cells(row)),
        }
    }

    fn render_cells(&self, row: &Row) -> String {
        match self.format {
            ReportFormat::Plain => {
                let widths = self.widths.as_deref().unwrap_or(&[]);
                format!("{}\n", row_line(&row.cells(self.redlock), widths))
            }
            ReportFormat::Json => format!("\n{}", row.json()),
        }
    }

    /// Ends the listing; false once stdout is closed.
    fn finish(&mut self, answered: usize) -> anyhow::Result<bool> {
        if self.widths.is_none()
            && (self.count > 0 || self.format == ReportFormat::Json)
            && !self.flush_buffer()?
        {
            return Ok(false);
        }
        if self.format == ReportFormat::Json {
            let tail = format!(
                "\n],\"count\":{},\"answered\":{answered},\"complete\":{}}}\n",
                self.count,
                answered == self.head["nodes"].as_u64().unwrap_or(0) as usize
            );
            if !self.write(&tail)? {
                return Ok(false);
            }
        }
        match self.out.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
            other => other.context("cannot write to stdout").map(|_| true),
        }
    }

    fn write(&mut self, text: &str) -> anyhow::Result<bool> {
        match self.out.write_all(text.as_bytes()) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(false),
            Err(e) => Err(e).context("cannot write to stdout"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_escaped() {
        assert_eq!(glob_escape("lockctl:"), "lockctl:");
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }

    #[test]
    fn patterns() {
        assert!(check_pattern("").is_err());
        assert!(check_pattern("a\u{1f}").is_err());
        assert!(check_pattern("deploy-*").is_ok());
    }
}
