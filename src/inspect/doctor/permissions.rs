//! doctor's permission check: lockctl's real scripts, run on a scratch lock under the prefix.
//!
//! An ACL that lacks one command, a key pattern or a channel, or a server that renamed EVALSHA or
//! INFO, lets PING, INFO and CONFIG GET through and still fails every acquire. Reading the ACL would
//! need admin rights and would miss what the scripts do inside, so doctor does what a lock does:
//! acquire, raise the fence, renew, read, release and break a scratch lock (`SCRATCH` under the
//! prefix, held for at most [`SCRATCH_TTL`]), then the commands `list`, a rollback and a grant's
//! replication use directly (SCAN, EVAL, SCRIPT LOAD, WAIT). The scratch lock's fencing counter stays,
//! like every counter: one small key per prefix.

use std::time::Duration;

use redis::Value;

use super::Level;
use crate::inspect::list::glob_escape;
use crate::lock::node::Node;
use crate::lock::{
    new_token, LockKeys, ACQUIRE, BREAK, FENCE, RELEASE, RELEASE_LUA, RENEW, STATUS,
};

/// The scratch lock's name.
pub const SCRATCH: &str = "lockctl-doctor-scratch";

/// How long the scratch lock may stand if doctor dies before releasing it.
const SCRATCH_TTL: Duration = Duration::from_secs(5);

/// One finding: the level, what was found, what to do.
pub type Check = (Level, String, Option<String>);

/// Runs the checks on one node; `None` when everything passed, else the first refusal.
pub fn check(node: &mut Node, prefix: &str) -> Check {
    let keys = LockKeys::new(prefix, SCRATCH);
    let token = new_token();
    let ttl = SCRATCH_TTL.as_millis().to_string();
    let lock = [
        keys.key.as_str(),
        keys.fence.as_str(),
        keys.holder.as_str(),
        keys.limit.as_str(),
    ];
    let bases = [keys.slot_base.as_str(), keys.holder_base.as_str()];
    let record = keys.release_record(&token);
    let acquire_keys = crate::lock::queue::acquire_keys(&keys, &record);
    let queue = crate::lock::release_keys(&keys);
    let pid = std::process::id().to_string();
    let fail = |what: &str, reason: String| -> Check {
        (
            Level::Fail,
            format!("{what} failed: {reason}"),
            Some(
                "every lock would fail the same way; fix the server's ACL or renamed commands \
                 (see docs/security.md for the exact ACL rules)"
                    .into(),
            ),
        )
    };
    let host = crate::lock::hostname();
    let acquired = node.eval(
        "acquire (scratch)",
        &ACQUIRE,
        &acquire_keys,
        &[
            &token,
            &ttl,
            "0",
            &host,
            &pid,
            "lockctl doctor",
            "1",
            bases[0],
            bases[1],
            "",
            "",
            "",
            "n",
            "",
            &keys.wake,
            &crate::lock::ALIVE_MS,
        ],
    );
    // As a release runs it: with the record of what it deleted.
    let release_keys: Vec<&str> = queue.iter().copied().chain([record.as_str()]).collect();
    let id = crate::lock::new_token();
    let release = |node: &mut Node| {
        node.eval(
            "release (scratch)",
            &RELEASE,
            &release_keys,
            &[
                &token,
                &keys.channel,
                bases[0],
                bases[1],
                &keys.wake,
                &crate::lock::ALIVE_MS,
                "",
                "1000",
                &id,
            ],
        )
    };
    let won = match acquired {
        Err(f) => {
            // The script may have set the key before the command it could not run.
            let _ = release(node);
            return fail("the acquire script", f.reason);
        }
        Ok(Value::Array(items)) => match items.first() {
            Some(Value::Int(1)) => items.get(1).and_then(crate::inspect::text),
            _ => None,
        },
        Ok(_) => None,
    };
    if let Some(fence) = &won {
        let steps: [(&str, &crate::lock::LuaScript, Vec<&str>, Vec<&str>); 3] = [
            (
                "the fence script",
                &FENCE,
                lock.to_vec(),
                vec![&token, fence],
            ),
            (
                "the renew script",
                &RENEW,
                lock.to_vec(),
                vec![
                    &token, &ttl, fence, "", "", "", "", &ttl, "0", "", "1", bases[0], bases[1],
                    "", &keys.wake,
                ],
            ),
            (
                "the status script",
                &STATUS,
                vec![
                    &keys.key,
                    &keys.fence,
                    &keys.holder,
                    &keys.limit,
                    &keys.queue,
                    &keys.alive,
                    &keys.waiters,
                    &keys.seen,
                ],
                vec![bases[0], bases[1], &keys.wake, &crate::lock::ALIVE_MS],
            ),
        ];
        for (what, script, k, a) in steps {
            if let Err(f) = node.eval(what, script, &k, &a) {
                let _ = release(node);
                return fail(what, f.reason);
            }
        }
        if let Err(f) = release(node) {
            return fail("the release script", f.reason);
        }
    }
    // Only on a free scratch lock: with a confirmation token that cannot match, nothing is deleted.
    if let Err(f) = node.eval(
        "break (scratch)",
        &BREAK,
        &queue,
        &[
            &keys.channel,
            bases[0],
            bases[1],
            &keys.wake,
            &crate::lock::ALIVE_MS,
            "",
            "0",
        ],
    ) {
        return fail("the break script", f.reason);
    }
    let pattern = format!("{}*", glob_escape(prefix));
    // The scripts check one wake channel (the empty waiter id's) and send every other wake with
    // pcall, so rules that cover that one alone pass them; a waiter's own channel, under a new
    // random id that nobody listens on, shows whether a release's wake would reach anyone.
    let wake = keys.wake_channel(&crate::lock::queue::new_waiter_id());
    let direct: [(&str, redis::Cmd); 5] = [
        ("PUBLISH (a waiter's wake channel)", {
            let mut c = redis::cmd("PUBLISH");
            c.arg(&wake).arg("doctor");
            c
        }),
        ("SCAN (list)", {
            let mut c = redis::cmd("SCAN");
            c.arg(0).arg("MATCH").arg(&pattern).arg("COUNT").arg(10);
            c
        }),
        ("EVAL (rollback)", {
            let mut c = redis::cmd("EVAL");
            c.arg("return 1").arg(0);
            c
        }),
        ("SCRIPT LOAD (after a SCRIPT FLUSH)", {
            let mut c = redis::cmd("SCRIPT");
            c.arg("LOAD").arg(RELEASE_LUA);
            c
        }),
        ("WAIT (replication of grants)", {
            let mut c = redis::cmd("WAIT");
            c.arg(0).arg(1);
            c
        }),
    ];
    for (what, cmd) in direct {
        if let Err(f) = node.call(what, |c| cmd.query::<Value>(c)) {
            return fail(what, f.reason);
        }
    }
    (
        Level::Ok,
        format!(
            "{} the scratch lock '{SCRATCH}'; PUBLISH on a wake channel, SCAN, EVAL, SCRIPT LOAD \
             and WAIT allowed",
            if won.is_some() {
                "acquire, fence, renew, status, release and break ran on"
            } else {
                "the scratch lock was held by another doctor; acquire and break ran on"
            }
        ),
        None,
    )
}
