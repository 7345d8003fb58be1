//! The command line, as clap definitions and nothing else.
//!
//! Values that need more than a type (URLs, lock names, the combination of flags) are checked in
//! [`crate::config`], which turns these structs into validated options before any Redis call; no other
//! module depends on clap. Durations are parsed here already, through the leaf module
//! [`crate::parse`], so that clap's message names the offending flag.
//!
//! Every option that configures lockctl has an environment variable `LOCKCTL_<OPTION>`, so a crontab,
//! a systemd unit or a CI job can set it once. Two rules make that predictable: an empty variable
//! counts as unset (`LOCKCTL_QUARANTINE=` in a unit file must not break every command), and a flag on
//! the command line beats a variable that says the opposite (`-n` wins over an exported
//! `LOCKCTL_WAIT`). Clap knows neither rule, so [`parse`] applies them around it. Two options have no
//! variable on purpose: `exec -c COMMAND` (what to run is not a setting) and `break --yes` (an
//! override must be asked for where it is used). `LOCKCTL_TOKEN` is read by `release` and `renew`
//! themselves, because it counts only for the lock named by `LOCKCTL_NAME`.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::builder::BoolishValueParser;
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Args, FromArgMatches, Parser, Subcommand, ValueEnum};

use crate::parse::{
    parse_drift_factor, parse_duration_or_zero, parse_positive_duration, parse_ttl,
};

/// Distributed locks on Redis for shell scripts, cron jobs and CI pipelines.
///
/// One Redis URL is a single instance; several URLs are Redlock over independent masters with a
/// majority quorum. Every grant carries a fencing token that strictly increases.
///
/// Options can also be set by the environment variable shown with each; an empty variable counts as
/// unset, and a flag on the command line wins over the environment.
#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(after_long_help = "Exit status:
  0    success (status: the lock is held)
  1    status: free; doctor: a failure found; any other error
  2    usage error: a bad flag, value, name or URL; nothing was changed in Redis
  69   Redis unavailable: no quorum of nodes answered
  75   busy: not acquired in time (-E N replaces it)
  76   lease lost, or the token does not hold the lock
  78   misconfigured: a node answered but refuses (password, ACL, replica, renamed command)
  exec passes the command's status through (128+N if signal N killed it).

Examples:
  # Skip a cron run while the previous one still holds the lock
  lockctl exec nightly-report -n -q -- /usr/local/bin/nightly-report
  # Keep the passwords out of ps, crontabs and CI logs: one URL per line, mode 600
  lockctl --redis-file /etc/lockctl/redis.conf status nightly-report
  # Redlock over three independent masters
  lockctl -r redis://10.0.0.1 -r redis://10.0.0.2 -r redis://10.0.0.3 exec deploy -- ./deploy.sh")]
pub struct Cli {
    #[command(flatten)]
    pub connection: ConnectionArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    #[command(flatten)]
    pub output: OutputArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the Redis nodes are and how to reach them.
#[derive(Debug, Args)]
#[command(next_help_heading = "Connection")]
pub struct ConnectionArgs {
    /// Redis node URL; repeat for Redlock over several masters
    ///
    /// redis://[user:password@]host[:port][/db], rediss:// for TLS, or unix:///path/to/socket
    /// (also redis+unix://); any node of a Redis Cluster works too (redirects are followed).
    /// redis+cluster://host:port,host:port gives seeds of one cluster;
    /// redis+sentinel://host:port,host:port/MASTER[/db] finds MASTER through Sentinel
    /// (LOCKCTL_SENTINEL_USERNAME/PASSWORD for the Sentinels). Each URL is one vote: one URL is a
    /// single instance; N URLs need a quorum of N/2+1. On a master with replicas, each grant and
    /// renewal waits (WAIT, one more round trip) until every replica in sync has it; ?replicas=N
    /// waits for N instead (0: off). Percent-encode '@', '/', '?' and '#' in a password (%40, %2F,
    /// %3F, %23). Passwords are never printed.
    /// Example: -r redis://10.0.0.1 -r redis://10.0.0.2 -r redis://10.0.0.3
    /// [default: redis://127.0.0.1:6379]
    #[arg(
        short = 'r',
        long = "redis",
        value_name = "URL",
        env = "LOCKCTL_REDIS",
        value_delimiter = ',',
        global = true,
        hide_env_values = true
    )]
    pub redis: Vec<String>,

    /// File with the node URLs, one per line, instead of --redis
    ///
    /// Keeps passwords out of crontabs, CI logs and `ps`. Blank lines and lines starting with `#`
    /// are skipped. Make it readable by its owner only (chmod 600): lockctl warns otherwise.
    /// Example: --redis-file /etc/lockctl/redis.conf
    #[arg(long, value_name = "FILE", env = "LOCKCTL_REDIS_FILE", global = true)]
    pub redis_file: Option<PathBuf>,

    /// Key prefix for lock keys
    ///
    /// The lock NAME is stored under the key PREFIX+NAME. An empty prefix is allowed.
    #[arg(
        long,
        value_name = "PREFIX",
        env = "LOCKCTL_PREFIX",
        default_value = "lockctl:",
        global = true
    )]
    pub prefix: String,

    /// Bound on connecting to, and on each command to, one node
    ///
    /// An unresponsive node (stopped, black-holed) costs at most about this long. Keep it far below
    /// the TTL. Example: --node-timeout 200ms
    #[arg(long, value_name = "DUR", env = "LOCKCTL_NODE_TIMEOUT", default_value = "500ms",
          value_parser = parse_positive_duration,
        allow_hyphen_values = true, global = true)]
    pub node_timeout: std::time::Duration,

    /// CA certificate (PEM) to verify rediss:// servers instead of the system roots
    #[arg(long, value_name = "FILE", env = "LOCKCTL_TLS_CA", global = true)]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) for rediss:// servers that require one (with --tls-key)
    #[arg(
        long,
        value_name = "FILE",
        env = "LOCKCTL_TLS_CERT",
        requires = "tls_key",
        global = true
    )]
    pub tls_cert: Option<PathBuf>,

    /// Private key (PEM) of the client certificate (with --tls-cert)
    #[arg(
        long,
        value_name = "FILE",
        env = "LOCKCTL_TLS_KEY",
        requires = "tls_cert",
        global = true
    )]
    pub tls_key: Option<PathBuf>,
}

/// Redlock timing.
#[derive(Debug, Args)]
#[command(next_help_heading = "Timing")]
pub struct TimingArgs {
    /// Clock drift allowance as a fraction of the TTL
    ///
    /// validity = TTL - elapsed - (TTL * drift-factor + 2ms).
    #[arg(long, value_name = "F", env = "LOCKCTL_DRIFT_FACTOR", default_value = "0.01",
        value_parser = parse_drift_factor, allow_negative_numbers = true, global = true)]
    pub drift_factor: f64,

    /// Nodes up for less than this do not vote [default: the TTL]
    ///
    /// The delayed-restart rule: a node that restarted may have lost a lock it granted, so it counts
    /// toward no quorum until every lease it could have held has expired. Set it to the longest TTL
    /// in use. 0 disables the rule: only for a test server you just started yourself.
    #[arg(long, value_name = "DUR", env = "LOCKCTL_QUARANTINE", value_parser = parse_duration_or_zero,
        allow_hyphen_values = true,
          global = true)]
    pub quarantine: Option<std::time::Duration>,
}

/// Diagnostics.
#[derive(Debug, Args)]
#[command(next_help_heading = "Output")]
pub struct OutputArgs {
    /// No diagnostics on stderr (results and errors still print)
    #[arg(short, long, global = true, env = "LOCKCTL_QUIET", action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new())]
    pub quiet: bool,

    /// Log each step with its timing on stderr
    #[arg(short, long, global = true, env = "LOCKCTL_VERBOSE", action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new())]
    pub verbose: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire a lock and print its token
    ///
    /// Waits until the lock is free (like flock), or -w DUR, or -n for one attempt. The lease lasts
    /// --ttl; keep it with `renew`, end it with `release`. Keep the output in a variable before
    /// eval, so that a busy or unreachable lock stops the script (a shell ignores the status of a
    /// command substitution inside eval, even under set -e).
    #[command(after_long_help = "Exit status:
  0    acquired; the token (or the env lines, or the JSON) is on stdout
  69   Redis unavailable: no quorum of nodes answered
  75   busy: not acquired within -w, or at once with -n (-E N replaces it)
  2    usage error; nothing was changed in Redis

Examples:
  # In a script: stop if the lock is not acquired, then use its variables
  lock=$(lockctl acquire backup --ttl 10m -w 5m --format env) || exit
  eval \"$lock\"
  trap 'lockctl release backup' EXIT
  # The token alone
  token=$(lockctl acquire backup -n) || exit")]
    Acquire(AcquireArgs),

    /// Release a lock, only if TOKEN still holds it
    ///
    /// A lock held by another token is never touched. The token is --token, or LOCKCTL_TOKEN when
    /// LOCKCTL_NAME is unset or names this lock (as after `eval` of `acquire --format env`, or
    /// inside `exec`). The token alone finds its slot of a --limit N semaphore; its keys in every
    /// slot are deleted, and it held the lock only if one slot had a quorum of them.
    #[command(after_long_help = "Exit status:
  0    released: the token held one slot of the lock on a quorum of nodes
  76   the token does not hold the lock (expired, broken, or taken by another holder)
  69   Redis unavailable: too few nodes answered to tell
  2    usage error (no token, bad name); nothing was changed in Redis

Examples:
  lockctl release backup --token \"$token\"
  # After eval of acquire --format env: LOCKCTL_TOKEN is used
  lockctl release backup")]
    Release(ReleaseArgs),

    /// Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms
    ///
    /// Without --ttl the lease gets the TTL it was granted with again (30s for a lock that lockctl
    /// did not grant, such as a redis-py Lock's). The token is --token, or LOCKCTL_TOKEN when
    /// LOCKCTL_NAME is unset or names this lock. The token alone finds its slot of a --limit N
    /// semaphore: the slot where a quorum of nodes holds it, which alone is extended (a stray key
    /// of the token in another slot is no vote and is not extended).
    #[command(after_long_help = "Exit status:
  0    renewed; the new validity in milliseconds is on stdout
  76   the token does not hold the lock any more
  69   Redis unavailable: too few nodes answered to tell
  2    usage error (no token, bad name or TTL); nothing was changed in Redis

Examples:
  # Between two long steps of a script that acquired with --ttl 10m: 10 more minutes
  lockctl renew backup
  lockctl renew backup --ttl 1h --token \"$token\"")]
    Renew(RenewArgs),

    /// Run a command while holding the lock, renewing it, and release it afterwards
    ///
    /// The command gets LOCKCTL_NAME, LOCKCTL_KEY, LOCKCTL_TOKEN, LOCKCTL_FENCE and LOCKCTL_SLOT (1, or
    /// the slot of a --limit N semaphore). If the lease is
    /// lost every process it started gets SIGTERM, then SIGKILL after --kill-after, and lockctl exits
    /// 76. Otherwise lockctl exits with the command's status (128+N for signal N). The lock is held
    /// until every process the command started has exited, background ones and those in other process
    /// groups or sessions included; a process that must outlive the job is handed to a service
    /// manager (systemd-run, at now), and then runs outside the lock.
    #[command(
        override_usage = "lockctl exec [OPTIONS] <NAME> (-c <COMMAND> | -- <PROGRAM> [ARGS]...)",
        after_long_help = "Exit status:
  N    the command's exit status, or 128+N if signal N killed it
  75   busy: not acquired within -w, or at once with -n (-E N replaces it); the command did not run
  69   Redis unavailable: no quorum of nodes answered; the command did not run
  76   the lease was lost (the command was stopped, or the release found the lock gone)
  2    usage error; nothing was run and nothing was changed in Redis

Examples:
  # cron: skip this run while the previous one is still going
  lockctl exec nightly-report -n -q -- /usr/local/bin/nightly-report --full
  # CI: one deployment at a time, wait up to 30 minutes
  lockctl exec deploy-production -w 30m --ttl 2m -- ./deploy.sh
  # At most 4 builds at once on the shared runners
  lockctl exec heavy-builds --limit 4 -- make -j8
  # A shell command line
  lockctl exec cache-rebuild -c 'rebuild --all && touch /var/run/rebuilt'"
    )]
    Exec(ExecArgs),

    /// Show who holds a lock (exit 0 held, 1 free)
    ///
    /// A semaphore (--limit N) shows every slot's holder; the limit is read from Redis.
    #[command(after_long_help = "Exit status:
  0    the lock is held
  1    the lock is free
  69   Redis unavailable: too few nodes answered to tell

Examples:
  lockctl status deploy-production
  lockctl status deploy-production --format json")]
    Status(StatusArgs),

    /// List held locks whose name matches a glob
    ///
    /// A --limit N semaphore is one row, with its held slots out of N and each slot's holder.
    #[command(after_long_help = "Exit status:
  0    listed (also when nothing matches)
  69   Redis unavailable: fewer than a quorum of nodes could be scanned
  2    usage error (an empty pattern)

Examples:
  lockctl list
  lockctl list 'deploy-*' --format json")]
    List(ListArgs),

    /// Delete a lock whoever holds it (operator override)
    ///
    /// The fencing counter is kept, so the broken holder's token stays stale for fenced storage.
    /// A semaphore (--limit N) loses every holder, or only the one named by --token.
    #[command(after_long_help = "Exit status:
  0    the lock was broken
  1    the lock was free, or the answer was no
  69   fewer than a quorum of nodes answered (deleted where possible)
  2    no terminal to ask on and no --yes

Examples:
  lockctl break deploy-production
  lockctl break deploy-production --yes
  # One holder of a --limit N semaphore
  lockctl break licences --token 3f1c... --yes")]
    Break(BreakArgs),

    /// Check the nodes for hazards that break locks
    ///
    /// Replication and failover, eviction policy, persistence, recent restarts, clock offset, latency,
    /// node count. Each finding is ok, warn or fail, with what to do.
    #[command(after_long_help = "Exit status:
  0    no failure found
  1    at least one failure found
  69   fewer than a quorum of nodes reachable

Examples:
  lockctl doctor --ttl 10m
  lockctl -r redis://10.0.0.1 -r redis://10.0.0.2 -r redis://10.0.0.3 doctor --format json")]
    Doctor(DoctorArgs),

    /// Print a shell completion script
    #[command(after_long_help = "Exit status:
  0    the script was printed
  2    unknown shell

Examples:
  lockctl completions bash > /etc/bash_completion.d/lockctl
  lockctl completions zsh > \"${fpath[1]}/_lockctl\"")]
    Completions(CompletionsArgs),
}

/// How long to wait for a busy lock.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Lease time to live
    ///
    /// How long the lock outlives a holder that dies without releasing it. `exec` renews it every
    /// TTL/3, so it need not cover the whole job. Example: --ttl 2m
    #[arg(long, value_name = "DUR", env = "LOCKCTL_TTL", default_value = "30s",
        value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: std::time::Duration,

    /// Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]
    #[arg(short = 'w', long = "wait", value_name = "DUR", env = "LOCKCTL_WAIT",
        value_parser = parse_duration_or_zero, allow_hyphen_values = true)]
    pub wait: Option<std::time::Duration>,

    /// One attempt: fail at once if the lock is busy
    #[arg(short = 'n', long = "no-wait", env = "LOCKCTL_NO_WAIT", action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new())]
    pub no_wait: bool,

    /// Exit code when the lock is busy, instead of 75
    ///
    /// Example: -E 0 makes a skipped cron run a success.
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N",
        env = "LOCKCTL_CONFLICT_EXIT_CODE", value_parser = clap::value_parser!(u8),
        allow_negative_numbers = true)]
    pub conflict_exit_code: Option<u8>,

    /// Slots: up to N holders at once (a counting semaphore) [1..=1000]
    ///
    /// Each holder gets its own token, its slot number (LOCKCTL_SLOT) and a fence that increases
    /// across all holders of NAME. Every client of NAME must give the same N: another N is a usage
    /// error (exit 2) while anything of NAME is held. release, renew, status, list and break find
    /// the slots themselves and take no --limit. Example: --limit 3
    #[arg(long, value_name = "N", env = "LOCKCTL_LIMIT", default_value = "1",
        value_parser = clap::value_parser!(u16).range(1..=1000), allow_negative_numbers = true)]
    pub limit: u16,
    /// Free text kept with the holder and waiter records (a CI job URL, a ticket)
    ///
    /// Shown by status, list, wait lines, busy messages and break. At most 512 bytes, no control
    /// characters. Example: --note "$CI_JOB_URL"
    #[arg(long, value_name = "TEXT", env = "LOCKCTL_NOTE")]
    pub note: Option<String>,

    /// Newest wins among waiters: displace the older waiters of NAME
    ///
    /// The waiters queued before this one stop waiting and exit busy (75, or -E), saying who
    /// superseded them; the holder is never touched. For a deploy queue where only the latest
    /// commit matters. Waiters are otherwise served in arrival order. Only for a caller that waits:
    /// with -n or -w 0 it is a usage error (exit 2).
    #[arg(long, env = "LOCKCTL_SUPERSEDE", action = ArgAction::SetTrue,
        value_parser = BoolishValueParser::new())]
    pub supersede: bool,
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// Lock name (UTF-8, no control characters, at most 512 bytes)
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Output: plain prints the token; env prints `export` lines for eval; json prints an object
    #[arg(long, value_enum, env = "LOCKCTL_FORMAT", default_value_t = GrantFormat::Plain)]
    pub format: GrantFormat,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Lock name
    pub name: String,
    /// The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// Lock name
    pub name: String,
    /// The token that acquire printed [default: $LOCKCTL_TOKEN, when $LOCKCTL_NAME is unset or NAME]
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
    /// New time to live from now [default: the TTL of the grant; 30s for a lock lockctl did not grant]
    #[arg(long, value_name = "DUR", env = "LOCKCTL_TTL", value_parser = parse_ttl,
        allow_hyphen_values = true)]
    pub ttl: Option<std::time::Duration>,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Lock name
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// After SIGTERM, wait this long before SIGKILL
    #[arg(long, value_name = "DUR", env = "LOCKCTL_KILL_AFTER", default_value = "10s",
        value_parser = parse_positive_duration, allow_hyphen_values = true)]
    pub kill_after: std::time::Duration,
    /// Run COMMAND with `sh -c`
    #[arg(
        short = 'c',
        long = "command",
        value_name = "COMMAND",
        conflicts_with = "program",
        required_unless_present = "program"
    )]
    pub command: Option<OsString>,
    /// Program and arguments, after `--`
    #[arg(
        value_name = "PROGRAM",
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    pub program: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Lock name
    pub name: String,
    /// Output format
    #[arg(long, value_enum, env = "LOCKCTL_FORMAT", default_value_t = ReportFormat::Plain)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Glob over lock names (*, ?, [abc], \ escapes)
    #[arg(default_value = "*")]
    pub pattern: String,
    /// Output format
    #[arg(long, value_enum, env = "LOCKCTL_FORMAT", default_value_t = ReportFormat::Plain)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct BreakArgs {
    /// Lock name
    pub name: String,
    /// Do not ask; required when stdin is not a terminal
    #[arg(short = 'y', long)]
    pub yes: bool,
    /// Break only the holder with this token (one slot of a --limit N semaphore) [default: every
    /// holder]
    #[arg(long, value_name = "TOKEN")]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The lease TTL your jobs use (uptime and latency are judged against it)
    #[arg(long, value_name = "DUR", env = "LOCKCTL_TTL", default_value = "30s",
        value_parser = parse_ttl, allow_hyphen_values = true)]
    pub ttl: std::time::Duration,
    /// Output format
    #[arg(long, value_enum, env = "LOCKCTL_FORMAT", default_value_t = ReportFormat::Plain)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// Shell
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// Output of a grant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GrantFormat {
    /// The token alone
    Plain,
    /// Shell `export` lines, for eval
    Env,
    /// One JSON object
    Json,
}

/// Output of a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    /// Aligned text for people
    Plain,
    /// JSON for programs
    Json,
}

/// What `lockctl --version` prints, without building the command (`main.rs` answers it first).
pub const VERSION_LINE: &str =
    concat!(env!("CARGO_PKG_NAME"), " ", env!("CARGO_PKG_VERSION"), "\n");

/// The clap command, for completions and man pages.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses the process's arguments and environment; exits 2 with clap's message on a usage error.
///
/// A start-up of lockctl is most of what a cron job or a script pays for it, and building clap's
/// tree of every subcommand (each with the global options copied into it) was a third of an
/// `acquire -n` (`bench/RESULTS.md`, "The argument parser"). So the command line is parsed first
/// with a tree that holds only the subcommand it names ([`one_subcommand`]); whatever that tree
/// does not accept as it stands (help, a version flag, an error, a conflict) is parsed again with
/// the whole tree, which prints what it always printed.
pub fn parse() -> Cli {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(cli) = parse_with(one_subcommand(&args), &args) {
        return cli;
    }
    let mut cmd = without_empty_env(command());
    let matches = cmd
        .try_get_matches_from_mut(args)
        .unwrap_or_else(|e| e.exit());
    settled(&matches).unwrap_or_else(|e| {
        // The usage line of the command that was given, as clap's own errors show it.
        match matches
            .subcommand_name()
            .and_then(|n| cmd.find_subcommand_mut(n))
        {
            Some(sub) => e.format(sub).exit(),
            None => e.format(&mut cmd).exit(),
        }
    })
}

/// The options of the matches, with the conflicts between the command line and the environment
/// settled.
fn settled(matches: &ArgMatches) -> Result<Cli, clap::Error> {
    Cli::from_arg_matches(matches).and_then(|mut cli| {
        settle_conflicts(&mut cli, matches)?;
        Ok(cli)
    })
}

/// `args` parsed with `tree`, if it accepts them without a message of any kind.
fn parse_with(tree: Option<clap::Command>, args: &[OsString]) -> Option<Cli> {
    let matches = without_empty_env(tree?).try_get_matches_from(args).ok()?;
    settled(&matches).ok()
}

/// What the derive writes for a struct of arguments: it adds them to a command.
type Augment = fn(clap::Command) -> clap::Command;

/// Each subcommand's name and the derive's builder of its arguments, in the order of [`Command`].
/// `tests` below checks the list against the derived tree.
const SUBCOMMANDS: [(&str, Augment); 9] = [
    ("acquire", <AcquireArgs as Args>::augment_args),
    ("release", <ReleaseArgs as Args>::augment_args),
    ("renew", <RenewArgs as Args>::augment_args),
    ("exec", <ExecArgs as Args>::augment_args),
    ("status", <StatusArgs as Args>::augment_args),
    ("list", <ListArgs as Args>::augment_args),
    ("break", <BreakArgs as Args>::augment_args),
    ("doctor", <DoctorArgs as Args>::augment_args),
    ("completions", <CompletionsArgs as Args>::augment_args),
];

/// The top of the command tree without its subcommands: the global options and the settings the
/// derive gives [`Cli`] that change how a command line parses. Its texts (about, examples) are
/// left out: help is always printed from the whole tree.
fn top() -> clap::Command {
    let cmd = clap::Command::new("lockctl")
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .group(clap::ArgGroup::new("Cli").multiple(true));
    let cmd = <ConnectionArgs as Args>::augment_args(cmd);
    let cmd = <TimingArgs as Args>::augment_args(cmd);
    <OutputArgs as Args>::augment_args(cmd)
}

/// The command tree with only the subcommand that `args` name, or `None` when they name none (or
/// clap's own `help` first).
///
/// It parses a command line exactly as the whole tree does, or refuses it. The words before the
/// first one that names a subcommand name none, so both trees read them alike; both read that word
/// alike (both have it as a subcommand); if it begins the subcommand, both read the rest with the
/// same subcommand; if it was an option's value instead, a later word that names another
/// subcommand is one this tree lacks, and it refuses the line (no subcommand takes free words
/// before it: the top has no positional arguments and no inferred or external subcommands).
fn one_subcommand(args: &[OsString]) -> Option<clap::Command> {
    let word = args
        .iter()
        .skip(1)
        .find(|a| *a == "help" || SUBCOMMANDS.iter().any(|(name, _)| *a == *name))?;
    let (name, build) = SUBCOMMANDS.iter().find(|(name, _)| *word == **name)?;
    Some(top().subcommand(build(clap::Command::new(*name))))
}

/// `cmd` with the variables that are set but empty forgotten, so that they count as unset. Most
/// environments have none, and the tree is then left as it is (rebuilding every argument list
/// costs a start-up more than its parse).
fn without_empty_env(cmd: clap::Command) -> clap::Command {
    fn empty(arg: &clap::Arg) -> bool {
        arg.get_env()
            .and_then(std::env::var_os)
            .is_some_and(|v| v.is_empty())
    }
    fn forget_empty(arg: clap::Arg) -> clap::Arg {
        if empty(&arg) {
            arg.env(None)
        } else {
            arg
        }
    }
    let any = cmd.get_arguments().any(empty)
        || cmd
            .get_subcommands()
            .any(|sub| sub.get_arguments().any(empty));
    if !any {
        return cmd;
    }
    cmd.mut_args(forget_empty)
        .mut_subcommands(|sub| sub.mut_args(forget_empty))
}

/// Pairs of options that exclude each other: given both on the command line (or both in the
/// environment) they are a usage error; given one on the command line and the other in the
/// environment, the command line wins.
fn settle_conflicts(cli: &mut Cli, matches: &ArgMatches) -> Result<(), clap::Error> {
    if let Some(drop) = winner(
        matches,
        ("redis", "--redis"),
        ("redis_file", "--redis-file"),
    )? {
        match drop {
            Side::First => cli.connection.redis.clear(),
            Side::Second => cli.connection.redis_file = None,
        }
    }
    if let Some(drop) = winner(matches, ("quiet", "--quiet"), ("verbose", "--verbose"))? {
        match drop {
            Side::First => cli.output.quiet = false,
            Side::Second => cli.output.verbose = false,
        }
    }
    let (wait, sub) = match (&mut cli.command, matches.subcommand()) {
        (Command::Acquire(a), Some((_, sub))) => (&mut a.wait, sub),
        (Command::Exec(a), Some((_, sub))) => (&mut a.wait, sub),
        _ => return Ok(()),
    };
    if let Some(drop) = winner(sub, ("wait", "--wait"), ("no_wait", "--no-wait"))? {
        match drop {
            Side::First => wait.wait = None,
            Side::Second => wait.no_wait = false,
        }
    }
    let once = if wait.no_wait {
        Some("-n/--no-wait")
    } else if wait.wait.is_some_and(|d| d.is_zero()) {
        Some("-w 0")
    } else {
        None
    };
    if let (true, Some(once)) = (wait.supersede, once) {
        let supersede = match sub.value_source("supersede") {
            Some(ValueSource::EnvVariable) => "LOCKCTL_SUPERSEDE",
            _ => "--supersede",
        };
        return Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "{supersede} cannot be used with {once}: it only displaces waiters, and a single \
                 attempt never waits; drop one of them"
            ),
        ));
    }
    Ok(())
}

/// Which of two conflicting options to ignore.
enum Side {
    First,
    Second,
}

/// Decides a pair of conflicting options by where each came from (see [`settle_conflicts`]).
fn winner(m: &ArgMatches, a: (&str, &str), b: (&str, &str)) -> Result<Option<Side>, clap::Error> {
    let given = |id: &str| match m.value_source(id) {
        Some(ValueSource::CommandLine) => Some(true),
        Some(ValueSource::EnvVariable) => Some(false),
        _ => None,
    };
    let env_name = |flag: &str| format!("LOCKCTL_{}", flag[2..].replace('-', "_").to_uppercase());
    match (given(a.0), given(b.0)) {
        (Some(true), Some(false)) => Ok(Some(Side::Second)),
        (Some(false), Some(true)) => Ok(Some(Side::First)),
        (Some(true), Some(true)) => Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            format!("{} cannot be used with {}; give one of them", a.1, b.1),
        )),
        (Some(false), Some(false)) => Err(clap::Error::raw(
            clap::error::ErrorKind::ArgumentConflict,
            format!(
                "{} and {} are both set, but {} cannot be used with {}; unset one of them",
                env_name(a.1),
                env_name(b.1),
                a.1,
                b.1
            ),
        )),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `cmd` without what only help shows, so that two trees can be compared for how they parse.
    fn for_parsing(cmd: clap::Command) -> clap::Command {
        fn texts(cmd: clap::Command) -> clap::Command {
            cmd.about(None)
                .long_about(None)
                .after_long_help(None)
                .override_usage(None)
                .max_term_width(100)
        }
        texts(cmd).mut_subcommands(texts)
    }

    #[test]
    fn the_one_subcommand_trees_are_the_derived_tree_in_parts() {
        let derived = for_parsing(command());
        let names: Vec<&str> = derived.get_subcommands().map(|s| s.get_name()).collect();
        let listed: Vec<&str> = SUBCOMMANDS.iter().map(|(name, _)| *name).collect();
        assert_eq!(
            names, listed,
            "SUBCOMMANDS must list every subcommand, in order"
        );
        let parts = for_parsing(
            top().subcommands(
                SUBCOMMANDS
                    .iter()
                    .map(|(name, build)| build(clap::Command::new(*name))),
            ),
        );
        let (parts, derived) = (format!("{parts:#?}"), format!("{derived:#?}"));
        // The trees print as some 4,000 lines: show where they part.
        let first = parts.lines().zip(derived.lines()).position(|(a, b)| a != b);
        let around = |text: &str, at: usize| {
            let lines: Vec<&str> = text.lines().collect();
            lines[at.saturating_sub(12)..(at + 3).min(lines.len())].join("\n")
        };
        if let Some(at) = first {
            panic!(
                "the trees part at line {at}:\n--- in parts:\n{}\n--- derived:\n{}",
                around(&parts, at),
                around(&derived, at)
            );
        }
        assert_eq!(parts.lines().count(), derived.lines().count());
    }

    fn args(line: &str) -> Vec<OsString> {
        line.split(' ').map(OsString::from).collect()
    }

    #[test]
    fn a_line_is_parsed_alike_by_both_trees_or_refused_by_the_small_one() {
        let lines = [
            "lockctl acquire deploy -n --ttl 10s",
            "lockctl -r redis://a -r redis://b acquire deploy -w 5s --format json",
            "lockctl acquire status -n",
            "lockctl -r status acquire deploy",
            "lockctl --prefix exec release x -c true",
            "lockctl exec deploy -- status --help -r x",
            "lockctl release deploy --token abc -q",
            "lockctl renew deploy --ttl 1m --token t",
            "lockctl status deploy --format json -v",
            "lockctl list deploy-* --node-timeout 200ms",
            "lockctl break deploy --yes",
            "lockctl doctor --ttl 10m",
            "lockctl acquire deploy -n -w 5s",
            "lockctl acquire deploy --help",
            "lockctl acquire deploy -V",
            "lockctl help acquire",
            "lockctl acquire",
            "lockctl acquire x --ttl 1ms",
            "lockctl -q -v status x",
            "lockctl --redis-file f -r redis://a status x",
            "lockctl exec x -n --supersede -- true",
        ];
        let mut fast = 0;
        for line in lines {
            let args = args(line);
            let whole = command()
                .try_get_matches_from(&args)
                .ok()
                .and_then(|m| settled(&m).ok());
            if let Some(cli) = parse_with(one_subcommand(&args), &args) {
                fast += 1;
                assert_eq!(
                    Some(format!("{cli:?}")),
                    whole.map(|c| format!("{c:?}")),
                    "{line}"
                );
            }
        }
        assert!(fast >= 10, "only {fast} lines took the small tree");
    }
}
