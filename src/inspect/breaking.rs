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

use std::io::{self, BufRead, IsTerminal, Write};

use redis::Value;

use super::{pairs, survey, text, HolderRecord, State};
use crate::cli::BreakArgs;
use crate::config::{check_name, Settings};
use crate::exit::{Exit, LockError};
use crate::lock::{quorum, Engine, BREAK};
use crate::output::human_ms;
use crate::say;

/// What one node gave up.
struct Broken {
    node: String,
    token: String,
    holder: Option<HolderRecord>,
}

pub fn run(settings: &Settings, args: &BreakArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
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

    // On the interactive path, only the token the operator confirmed may be broken.
    let mut confirmed = String::new();
    if !args.yes {
        let m = survey(&mut engine, &keys);
        if m.answered < m.quorum {
            return Err(engine
                .unavailable(m.answered, m.failures().join("; "))
                .into());
        }
        let Some(token) = m.token.clone() else {
            say!("lock '{}' is free; nothing to break", keys.name);
            return Ok(Exit::Failure);
        };
        let mut what = m.holder().map_or_else(
            || "an unknown holder (no holder record)".to_string(),
            HolderRecord::describe,
        );
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
        let question = format!(
            "Break lock '{}' held by {what} (token {token})? The holder may still be running. [y/N] ",
            keys.name
        );
        if !confirm(&question)? {
            crate::complain!("lock '{}' left as it is", keys.name);
            return Ok(Exit::Failure);
        }
        confirmed = token;
    }

    let key_list = [keys.key.as_str(), keys.holder.as_str()];
    let args_list = [keys.channel.as_str(), confirmed.as_str()];
    let results = quorum::all(engine.nodes_mut(), |_, node| {
        node.eval("break", &BREAK, &key_list, &args_list)
            .map(|v| (node.display.clone(), v))
    });
    let mut broken = Vec::new();
    let mut failures = Vec::new();
    let mut answered = 0;
    let mut changed_hands = 0;
    for r in results {
        match r {
            Ok((node, v)) => {
                answered += 1;
                if matches!(&v, Value::Array(items) if items.get(2).is_some()) {
                    changed_hands += 1;
                }
                if let Some(b) = parse_break(node, v) {
                    broken.push(b);
                }
            }
            Err(fail) => failures.push(fail.reason),
        }
    }
    let quorum = quorum::quorum(n);

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
        say!("lock '{}' is free; nothing to break", keys.name);
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

/// The `BREAK` script's reply: `{token or nil, {holder field, value, ...}}`.
fn parse_break(node: String, v: Value) -> Option<Broken> {
    let Value::Array(items) = v else { return None };
    let token = items.first().and_then(text)?;
    let fields = items.get(1).map(pairs).unwrap_or_default();
    Some(Broken {
        holder: HolderRecord::from_fields(&fields, &token),
        node,
        token,
    })
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
