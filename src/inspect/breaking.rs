//! `break NAME`: the operator's override, deleting a lock whoever holds it.
//!
//! Breaking a lock lets a second holder in while the first may still be running, so it is never done
//! by accident: on a terminal lockctl shows the holder and asks; without a terminal (a script, cron)
//! it refuses unless `--yes` says the caller means it, and that refusal happens before any Redis call.
//!
//! The `BREAK` script deletes the lock key and the holder record on every node, whatever token is
//! there, and publishes on the release channel so waiting clients try at once. It returns what it
//! deleted, so the report names whom the lock was taken from. The fencing counter stays as it is: the
//! broken holder's fence is now stale, and the next grant's is higher, which is what lets fenced
//! storage reject the broken holder's late writes.
//!
//! A semaphore (`--limit N`) loses every holder, each named in the question and the report, or only
//! the one whose token `--token` gives. On a terminal only the tokens shown in the question are
//! broken: a holder that came after it is left as it is.
//!
//! A break sent again (its connection dropped, or its read was cut by a stop of lockctl, before the
//! reply) finds the answer its first send recorded on that node, if that one ran, and breaks nothing
//! more: `--yes` breaks whoever holds the lock when it runs, and run twice it took the lock from the
//! waiter its first send had just let in.

use std::io::{self, BufRead, IsTerminal, Write};

use redis::Value;

use super::{int, pairs, survey, text, HolderRecord, Merged, State};
use crate::cli::BreakArgs;
use crate::config::{check_name, Settings};
use crate::exit::{Exit, LockError};
use crate::lock::{new_token, quorum, Engine, BREAK};
use crate::output::human_ms;
use crate::say;

/// What one node gave up.
struct Broken {
    node: String,
    slot: usize,
    token: String,
    holder: Option<HolderRecord>,
}

pub fn run(settings: &Settings, args: &BreakArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    if args.token.is_some() {
        crate::config::check_token(args.token.clone())?;
    }
    if !args.yes && !io::stdin().is_terminal() {
        return Err(LockError::Usage(format!(
            "refusing to break lock '{}' without confirmation: stdin is not a terminal; \
             pass --yes to break it anyway",
            args.name
        ))
        .into());
    }
    let mut engine = Engine::new(settings)?;
    let keys = engine.keys(&args.name);
    let n = engine.nodes().len();

    // On the interactive path, only the tokens the operator confirmed may be broken; `--token` alone
    // may be broken on every path.
    let mut confirmed: Vec<String> = args.token.iter().cloned().collect();
    if !args.yes {
        let surveyed = survey(&mut engine, &keys);
        if surveyed.answered < surveyed.quorum {
            return Err(engine
                .unavailable(surveyed.answered, surveyed.failures().join("; "))
                .into());
        }
        let slots: Vec<(usize, Merged)> = surveyed
            .slots()
            .into_iter()
            .filter(|(_, m)| {
                m.token.is_some()
                    && args
                        .token
                        .as_ref()
                        .is_none_or(|t| m.token.as_ref() == Some(t))
            })
            .collect();
        if slots.is_empty() {
            match &args.token {
                Some(t) => say!(
                    "lock '{}' is not held by token {t}; nothing to break",
                    keys.name
                ),
                None => say!("lock '{}' is free; nothing to break", keys.name),
            }
            return Ok(Exit::Failure);
        }
        let semaphore = surveyed.limit() > 1 || slots.iter().any(|(i, _)| *i > 1);
        let what: Vec<String> = slots
            .iter()
            .map(|(i, m)| describe(m, n, semaphore.then_some(*i)))
            .collect();
        let question = format!(
            "Break lock '{}' held by {}? The holder{} may still be running. [y/N] ",
            keys.name,
            what.join("; and by "),
            if what.len() > 1 { "s" } else { "" }
        );
        if !confirm(&question)? {
            crate::complain!("lock '{}' left as it is", keys.name);
            return Ok(Exit::Failure);
        }
        confirmed = slots.into_iter().filter_map(|(_, m)| m.token).collect();
    }

    // A send that ran records its answer under this call's id, which its resend gets instead of
    // breaking whoever the first send let in (`break.lua`).
    let record = keys.break_record(&new_token());
    let [k1, k2, k3, k4, k5, k6, k7] = crate::lock::release_keys(&keys);
    let key_list = [k1, k2, k3, k4, k5, k6, k7, record.as_str()];
    let front_ms = engine.front_lifetime().as_millis().to_string();
    let keep_ms = (engine.slack() + std::time::Duration::from_secs(1))
        .as_millis()
        .to_string();
    let mut args_list = vec![
        keys.channel.as_str(),
        keys.slot_base.as_str(),
        keys.holder_base.as_str(),
        keys.wake.as_str(),
        front_ms.as_str(),
        keep_ms.as_str(),
    ];
    args_list.extend(confirmed.iter().map(String::as_str));
    let results = quorum::all(engine.nodes_mut(), |_, node| {
        node.eval("break", &BREAK, &key_list, &args_list)
            .map(|v| (node.display.clone(), v))
    });
    let mut broken = Vec::new();
    let mut failures = Vec::new();
    let mut answered = 0;
    let mut changed_hands = 0;
    // Nodes whose break may have run though no answer came (a timeout, or a reply cut by a stop of
    // lockctl with no time left to send it again).
    let mut maybe = 0;
    for r in results {
        match r {
            Ok((node, v)) => {
                answered += 1;
                let (mine, left) = parse_break(node, v);
                if left > 0 && !args.yes {
                    changed_hands += 1;
                }
                broken.extend(mine);
            }
            Err(fail) => {
                maybe += usize::from(fail.maybe_applied);
                failures.push(fail.reason);
            }
        }
    }
    let quorum = quorum::quorum(n);
    // Said because the operator's next step would be to run the break again: with `--yes` that
    // takes the lock from whoever the first one let in.
    if maybe > 0 {
        crate::complain!(
            "the break may have run on {maybe} node(s) that did not answer in time; see `lockctl \
             status {}` before breaking again",
            keys.name
        );
    }

    if changed_hands > 0 {
        crate::complain!(
            "lock '{}' changed hands on {changed_hands} node(s) while you answered; those were left \
             as they are; run break again to see the new holder",
            keys.name
        );
    }
    if broken.is_empty() {
        if answered < quorum {
            return Err(engine.unavailable(answered, failures.join("; ")).into());
        }
        if changed_hands > 0 {
            return Ok(Exit::Failure);
        }
        match &args.token {
            Some(t) => say!(
                "lock '{}' is not held by token {t}; nothing to break",
                keys.name
            ),
            None => say!("lock '{}' is free; nothing to break", keys.name),
        }
        return Ok(Exit::Failure);
    }
    crate::output::emit(&report(&keys.name, &broken, n))?;
    if answered < quorum {
        crate::complain!(
            "only {answered} of {n} node(s) answered; the others may still hold '{}': {}",
            keys.name,
            failures.join("; ")
        );
        return Ok(Exit::Unavailable);
    }
    for f in &failures {
        say!("{f}");
    }
    Ok(Exit::Success)
}

/// One holder as the question names it.
fn describe(m: &Merged, n: usize, slot: Option<usize>) -> String {
    let mut what = m.holder().map_or_else(
        || "an unknown holder (no holder record)".to_string(),
        HolderRecord::describe,
    );
    if let Some(i) = slot {
        what.push_str(&format!(", slot {i}"));
    }
    if let Some(f) = m.holder().and_then(|h| h.fence) {
        what.push_str(&format!(", fence {f}"));
    }
    if let Some(Some(ttl)) = m.ttl_ms() {
        what.push_str(&format!(", {} left", human_ms(ttl)));
    }
    if n > 1 {
        what.push_str(&format!(", on {} of {n} nodes", m.agree));
    }
    if m.state != State::Held {
        what.push_str(", not on a quorum");
    }
    format!("{what} (token {})", m.token.as_deref().unwrap_or_default())
}

/// The `BREAK` script's reply: `{{{slot, token, {holder field, value, ...}}, ...}, {token, ...}}`:
/// what was broken, and how many holders were left because nobody confirmed them.
fn parse_break(node: String, v: Value) -> (Vec<Broken>, usize) {
    let Value::Array(items) = v else {
        return (Vec::new(), 0);
    };
    let broken = match items.first() {
        Some(Value::Array(list)) => list
            .iter()
            .filter_map(|b| {
                let Value::Array(b) = b else { return None };
                let slot = usize::try_from(int(b.first()?)?).ok()?;
                let token = text(b.get(1)?)?;
                let fields = b.get(2).map(pairs).unwrap_or_default();
                Some(Broken {
                    holder: HolderRecord::from_fields(&fields, &token),
                    node: node.clone(),
                    slot,
                    token,
                })
            })
            .collect(),
        _ => Vec::new(),
    };
    let left = match items.get(1) {
        Some(Value::Array(l)) => l.len(),
        _ => 0,
    };
    (broken, left)
}

/// One line per distinct token taken away, naming its holder and fence.
fn report(name: &str, broken: &[Broken], n: usize) -> String {
    let mut tokens: Vec<&str> = Vec::new();
    for b in broken {
        if !tokens.contains(&b.token.as_str()) {
            tokens.push(&b.token);
        }
    }
    let mut out = String::new();
    for t in tokens {
        let mine: Vec<&Broken> = broken.iter().filter(|b| b.token == t).collect();
        let holder = mine.iter().find_map(|b| b.holder.as_ref());
        let who = holder.map_or_else(
            || "an unknown holder (no holder record)".to_string(),
            HolderRecord::describe,
        );
        let fence = holder
            .and_then(|h| h.fence)
            .map_or(String::new(), |f| format!(", fence {f}"));
        let slot = mine.iter().map(|b| b.slot).max().unwrap_or(1);
        let semaphore = slot > 1 || holder.and_then(|h| h.limit).unwrap_or(1) > 1;
        let fence = if semaphore {
            format!(", slot {slot}{fence}")
        } else {
            fence
        };
        let nodes = if n > 1 {
            let list: Vec<&str> = mine.iter().map(|b| b.node.as_str()).collect();
            format!(" on {} of {n} nodes ({})", mine.len(), list.join(", "))
        } else {
            String::new()
        };
        out.push_str(&format!(
            "broke lock '{name}': taken from {who}{fence}, token {t}{nodes}\n"
        ));
    }
    out
}

/// Asks on stderr and reads the answer from the terminal on stdin; only `y` or `yes` confirms.
fn confirm(question: &str) -> anyhow::Result<bool> {
    {
        // A closed stderr is no reason to panic: the answer decides, and no answer means no.
        let mut err = io::stderr().lock();
        let _ = err
            .write_all(question.as_bytes())
            .and_then(|()| err.flush());
    }
    let mut answer = String::new();
    // stdin is the terminal: `run` checked it before asking.
    io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(
        answer.trim().to_ascii_lowercase().as_str(),
        "y" | "yes"
    ))
}
