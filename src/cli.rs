//! The command line, as clap definitions and nothing else.
//!
//! Values that need more than a type (URLs, lock names, the combination of flags) are checked in
//! [`crate::config`], which turns these structs into validated options before any Redis call; no other
//! module depends on clap. Durations are parsed here already, through [`crate::config::parse_positive_duration`]
//! and friends, so that clap's message names the offending flag.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::{
    parse_drift_factor, parse_duration_or_zero, parse_positive_duration, parse_ttl,
};

/// Distributed locks on Redis for shell scripts, cron jobs and CI pipelines.
///
/// One Redis URL is a single instance; several URLs are Redlock over independent masters with a
/// majority quorum. Every grant carries a fencing token that strictly increases.
#[derive(Debug, Parser)]
#[command(
    name = "lockctl",
    version,
    propagate_version = true,
    max_term_width = 100
)]
#[command(
    after_long_help = "Exit codes: 0 success, 1 failure (status: free), 2 usage error, \
69 Redis unavailable, 75 busy, 76 lease lost / not the owner; exec passes the child's status through."
)]
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
    /// (also redis+unix://). One URL is a single instance; N URLs need a quorum of N/2+1.
    /// Passwords are never printed. Example: -r redis://10.0.0.1 -r redis://10.0.0.2 -r redis://10.0.0.3
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
    #[arg(long, value_name = "F", default_value = "0.01", value_parser = parse_drift_factor,
        allow_negative_numbers = true, global = true)]
    pub drift_factor: f64,

    /// Nodes up for less than this do not vote [default: the TTL]
    ///
    /// The delayed-restart rule: a node that restarted may have lost a lock it granted, so it counts
    /// toward no quorum until every lease it could have held has expired. 0 disables the rule.
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
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    pub quiet: bool,

    /// Log each step with its timing on stderr
    #[arg(short, long, global = true)]
    pub verbose: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Acquire a lock and print its token
    ///
    /// Waits until the lock is free (like flock), or -w DUR, or -n for one attempt. The lease lasts
    /// --ttl; keep it with `renew`, end it with `release`.
    ///
    /// Example: eval "$(lockctl acquire backup --ttl 5m --format env)"
    Acquire(AcquireArgs),

    /// Release a lock, only if TOKEN still holds it
    ///
    /// Exit 0 when the token held the lock on a quorum, 76 when it did not (expired, broken, taken).
    /// A lock held by another token is never touched.
    ///
    /// Example: lockctl release backup --token "$LOCKCTL_TOKEN"
    Release(ReleaseArgs),

    /// Extend a lease, only if TOKEN still holds the lock; prints the new validity in ms
    ///
    /// Example: lockctl renew backup --ttl 5m
    Renew(RenewArgs),

    /// Run a command while holding the lock, renewing it, and release it afterwards
    ///
    /// The child gets LOCKCTL_NAME, LOCKCTL_KEY, LOCKCTL_TOKEN and LOCKCTL_FENCE. If the lease is lost
    /// the child's process group gets SIGTERM, then SIGKILL after --kill-after, and lockctl exits 76.
    /// Otherwise lockctl exits with the child's status (128+N for signal N).
    ///
    /// Example (cron): lockctl exec nightly-report -n -- /usr/local/bin/report --full
    Exec(ExecArgs),

    /// Show who holds a lock (exit 0 held, 1 free)
    Status(StatusArgs),

    /// List held locks whose name matches a glob
    List(ListArgs),

    /// Delete a lock whoever holds it (operator override)
    ///
    /// The fencing counter is kept, so the broken holder's token stays stale for fenced storage.
    Break(BreakArgs),

    /// Check the nodes for hazards that break locks
    ///
    /// Replication and failover, eviction policy, persistence, recent restarts, clock offset, latency,
    /// node count. Each finding is ok, warn or fail, with what to do.
    Doctor(DoctorArgs),

    /// Print a shell completion script
    ///
    /// Example: lockctl completions bash > /etc/bash_completion.d/lockctl
    Completions(CompletionsArgs),
}

/// How long to wait for a busy lock.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Lease time to live
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl,
        allow_hyphen_values = true)]
    pub ttl: std::time::Duration,

    /// Give up after DUR (humantime or seconds; -w 0 = -n) [default: wait forever]
    #[arg(short = 'w', long = "wait", value_name = "DUR", value_parser = parse_duration_or_zero,
        allow_hyphen_values = true)]
    pub wait: Option<std::time::Duration>,

    /// One attempt: fail at once if the lock is busy
    #[arg(short = 'n', long = "no-wait", conflicts_with = "wait")]
    pub no_wait: bool,

    /// Exit code when the lock is busy, instead of 75
    #[arg(short = 'E', long = "conflict-exit-code", value_name = "N",
          value_parser = clap::value_parser!(u8),
        allow_negative_numbers = true)]
    pub conflict_exit_code: Option<u8>,
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    /// Lock name (UTF-8, no control characters, at most 512 bytes)
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Output: plain prints the token; env prints `export` lines for eval; json prints an object
    #[arg(long, value_enum, default_value_t = GrantFormat::Plain)]
    pub format: GrantFormat,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Lock name
    pub name: String,
    /// The token that acquire printed
    #[arg(
        long,
        value_name = "TOKEN",
        env = "LOCKCTL_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    /// Lock name
    pub name: String,
    /// The token that acquire printed
    #[arg(
        long,
        value_name = "TOKEN",
        env = "LOCKCTL_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// New time to live from now
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl,
        allow_hyphen_values = true)]
    pub ttl: std::time::Duration,
}

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Lock name
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
    /// After SIGTERM, wait this long before SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = parse_positive_duration,
        allow_hyphen_values = true)]
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
    #[arg(long, value_enum, default_value_t = ReportFormat::Plain)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Glob over lock names (*, ?, [abc], \ escapes)
    #[arg(default_value = "*")]
    pub pattern: String,
    /// Output format
    #[arg(long, value_enum, default_value_t = ReportFormat::Plain)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct BreakArgs {
    /// Lock name
    pub name: String,
    /// Do not ask; required when stdin is not a terminal
    #[arg(short = 'y', long)]
    pub yes: bool,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// The lease TTL your jobs use (uptime and latency are judged against it)
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = parse_ttl,
        allow_hyphen_values = true)]
    pub ttl: std::time::Duration,
    /// Output format
    #[arg(long, value_enum, default_value_t = ReportFormat::Plain)]
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

/// The clap command, for completions and man pages.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Parses the process's arguments; exits 2 with clap's message on a usage error.
pub fn parse() -> Cli {
    <Cli as Parser>::parse()
}
