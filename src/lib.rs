//! lockctl: distributed locks on Redis, for the shell and for Rust.
//!
//! The command-line tool is the main product; this library is its engine, usable on its own:
//! [`lock::Engine`] acquires, renews and releases [`lock::Grant`]s on one Redis instance or on Redlock
//! over N independent masters, through one code path (a single instance is a quorum of one). Every
//! grant carries a fencing token that strictly increases, also across Redlock quorums.
//!
//! ```no_run
//! use lockctl::config::{check_url, Settings, TlsFiles};
//! use lockctl::lock::{Engine, Holder, WaitPolicy, Wakeup};
//! use std::time::Duration;
//!
//! let settings = Settings {
//!     nodes: vec![check_url("redis://127.0.0.1:6379").unwrap()],
//!     prefix: "lockctl:".into(),
//!     node_timeout: Duration::from_millis(500),
//!     drift_factor: 0.01,
//!     quarantine: None,
//!     tls: TlsFiles::default(),
//! };
//! let mut engine = Engine::new(&settings).unwrap();
//! let keys = engine.keys("nightly-report");
//! let holder = Holder::new(std::process::id(), "report");
//! let ttl = Duration::from_secs(30);
//! // The last number is the limit: 1 for a lock, N for a semaphore of N slots.
//! let grant = engine
//!     .acquire(&keys, ttl, WaitPolicy::NoWait, &holder, 1, &Wakeup::new())
//!     .unwrap();
//! println!("fence {}", grant.fence);
//! engine.release(&keys, &grant.token).unwrap();
//! ```

pub mod cli;
pub mod clock;
pub mod commands;
pub mod config;
pub mod exec;
pub mod exit;
pub mod inspect;
pub mod lock;
pub mod log;
pub mod output;
pub mod parse;
pub mod signals;

use cli::{Cli, Command};
use config::Settings;
pub use exit::{Exit, LockError};

/// Runs one invocation and returns its exit status. Every error is printed here, once.
pub fn run(cli: Cli) -> Exit {
    log::set_level(if cli.output.quiet {
        0
    } else if cli.output.verbose {
        2
    } else {
        1
    });
    match dispatch(cli) {
        Ok(exit) => exit,
        Err(err) => match err.downcast_ref::<LockError>() {
            Some(e) => commands::report(e, Exit::Busy),
            None => {
                complain!("{err:#}");
                Exit::Failure
            }
        },
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<Exit> {
    if let Command::Completions(args) = &cli.command {
        return commands::completions(args.shell);
    }
    let settings = Settings::from_args(&cli.connection, &cli.timing)?;
    for node in &settings.nodes {
        trace!("node {}", node.display);
    }
    match &cli.command {
        Command::Acquire(a) => commands::acquire(&settings, a),
        Command::Release(a) => commands::release(&settings, a),
        Command::Renew(a) => commands::renew(&settings, a),
        Command::Exec(a) => exec::run(&settings, a),
        Command::Status(a) => inspect::status::run(&settings, a),
        Command::List(a) => inspect::list::run(&settings, a),
        Command::Break(a) => inspect::breaking::run(&settings, a),
        Command::Doctor(a) => inspect::doctor::run(&settings, a),
        Command::Completions(_) => unreachable!("handled above"),
    }
}
