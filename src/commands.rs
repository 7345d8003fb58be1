//! `acquire`, `release`, `renew` and `completions`: thin layers over the engine.
//!
//! `release` and `renew` take their token from `--token`, or else from `$LOCKCTL_TOKEN`, but only
//! when `$LOCKCTL_NAME` is unset or names the same lock: inside `exec outer` (or after `eval` of one
//! lock's variables) the inherited token belongs to that lock, and spending it on another one would
//! fail as "not the owner" (76) instead of saying that no token was given.

use anyhow::Context;

use crate::cli::{AcquireArgs, GrantFormat, ReleaseArgs, RenewArgs, WaitArgs};
use crate::config::{check_name, check_note, check_token, Settings, DEFAULT_TTL};
use crate::exit::{Exit, LockError};
use crate::lock::{Engine, Holder, WaitPolicy, Wake, Wakeup};
use crate::{output, say, signals};

/// The wait policy and busy exit code of `acquire` and `exec`.
pub fn wait_policy(args: &WaitArgs) -> (WaitPolicy, Exit) {
    let policy = if args.no_wait {
        WaitPolicy::NoWait
    } else {
        match args.wait {
            Some(d) => WaitPolicy::For(d),
            None => WaitPolicy::Forever,
        }
    };
    let busy = args.conflict_exit_code.map_or(Exit::Busy, Exit::Raw);
    (policy, busy)
}

/// Prints a lock failure (busy only as a diagnostic, since `-n` in cron makes it routine; a refusal
/// by the restart quarantine always, since it is not) and gives its exit status.
pub fn report(err: &LockError, busy: Exit) -> Exit {
    match err {
        LockError::Busy { .. } | LockError::Interrupted(..) | LockError::Superseded { .. } => {
            say!("{err}")
        }
        _ => crate::complain!("{err}"),
    }
    err.exit(busy)
}

/// Reports a failed acquire attempt: a signal that came during it (`signal`) ends the command as at
/// any other moment, so it is reported as the interruption rather than as the attempt's error.
pub fn report_failed_attempt(err: LockError, signal: Option<i32>, busy: Exit) -> Exit {
    report(
        &signal.map_or(err, |s| LockError::Interrupted(s, None)),
        busy,
    )
}

/// The parent process and its command line: `acquire` exits at once, so its caller (the script that
/// will hold the lock) is the holder worth naming.
fn parent_holder() -> Holder {
    let ppid = std::os::unix::process::parent_id();
    let cmd = std::fs::read(format!("/proc/{ppid}/cmdline"))
        .map(|raw| {
            raw.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    Holder::new(ppid, &cmd)
}

pub fn acquire(settings: &Settings, args: &AcquireArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    let note = check_note(args.wait.note.as_deref())?;
    let (policy, busy) = wait_policy(&args.wait);
    let mut engine = Engine::new(settings)?;
    engine.supersede(args.wait.supersede);
    let keys = engine.keys(&args.name);
    let wake = Wakeup::new();
    // One attempt needs no signal thread: a signal that came during it is read afterwards.
    let mut caught = None;
    if matches!(policy, WaitPolicy::NoWait) {
        caught = Some(signals::catch().context("cannot install signal handlers")?);
    } else {
        let tx = wake.sender();
        signals::listen(move |s| {
            let _ = tx.send(Wake::Signal(s));
        })
        .context("cannot install signal handlers")?;
    }
    let holder = parent_holder().with_note(note);
    let grant = match engine.acquire(
        &keys,
        args.wait.ttl,
        policy,
        &holder,
        usize::from(args.wait.limit),
        &wake,
    ) {
        Ok(g) => g,
        Err(e) => {
            let signal = caught
                .as_mut()
                .and_then(signals::Caught::first)
                .or_else(|| wake.pending_signal());
            return Ok(report_failed_attempt(e, signal, busy));
        }
    };
    if let Some(signal) = caught.as_mut().and_then(signals::Caught::first) {
        // As the engine does when a waiter's signal comes with the grant: give it back.
        if let Err(e) = engine.release(&keys, &grant.token) {
            crate::complain!(
                "the lock won as the signal came could not be given back ({e}); it expires \
                 within {} ms",
                args.wait.ttl.as_millis()
            );
        }
        return Ok(report(&LockError::Interrupted(signal, None), busy));
    }
    let text = match args.format {
        GrantFormat::Plain => format!("{}\n", grant.token),
        GrantFormat::Env => output::grant_env(&grant),
        GrantFormat::Json => format!("{}\n", output::grant_json(&grant)),
    };
    if let Err(e) = output::emit(&text) {
        // Nobody will ever learn the token: give the lock back rather than strand it for a TTL.
        let _ = engine.release(&keys, &grant.token);
        return Err(e.context("the lock was released"));
    }
    Ok(Exit::Success)
}

/// The token for `release` or `renew` of `name` (see the module docs).
fn token_for(name: &str, given: &Option<String>) -> Result<String, LockError> {
    if given.is_some() {
        return check_token(given.clone());
    }
    // An empty variable counts as unset, as every LOCKCTL_ variable does.
    let var = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    match (var("LOCKCTL_TOKEN"), var("LOCKCTL_NAME")) {
        (Some(_), Some(owner)) if owner != name => Err(LockError::Usage(format!(
            "no token for lock '{name}': LOCKCTL_TOKEN holds the token of lock '{owner}' \
             (LOCKCTL_NAME); pass --token TOKEN with the token that acquire printed for '{name}'"
        ))),
        (inherited, _) => check_token(inherited),
    }
}

pub fn release(settings: &Settings, args: &ReleaseArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    let token = token_for(&args.name, &args.token)?;
    let mut engine = Engine::new(settings)?;
    let keys = engine.keys(&args.name);
    Ok(match engine.release(&keys, &token) {
        Ok(_) => Exit::Success,
        Err(e) => report(&e, Exit::Busy),
    })
}

pub fn renew(settings: &Settings, args: &RenewArgs) -> anyhow::Result<Exit> {
    check_name(&args.name)?;
    let token = token_for(&args.name, &args.token)?;
    let mut engine = Engine::new(settings)?;
    let keys = engine.keys(&args.name);
    let renewed = match args.ttl {
        Some(ttl) => engine.renew(&keys, &token, ttl),
        None => engine.renew_keeping_ttl(&keys, &token, DEFAULT_TTL),
    };
    Ok(match renewed {
        Ok(validity) => {
            output::emit(&format!("{}\n", validity.as_millis()))?;
            Exit::Success
        }
        Err(e) => report(&e, Exit::Busy),
    })
}

pub fn completions(shell: clap_complete::Shell) -> anyhow::Result<Exit> {
    let mut cmd = crate::cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "lockctl", &mut script);
    output::emit(&String::from_utf8_lossy(&script))?;
    Ok(Exit::Success)
}
