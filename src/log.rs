//! Diagnostics on stderr: `-q` silences them, `-v` adds one line per step with its timing.
//!
//! A process-wide switch is enough for a command-line tool and keeps the engine free of logger
//! plumbing. Every line starts with `lockctl:` so it stands out from a child's own output. Writing a
//! diagnostic never fails a command: a stderr nobody reads any more is not a reason to stop renewing.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

static LEVEL: AtomicU8 = AtomicU8::new(1);
static START: OnceLock<Instant> = OnceLock::new();

/// Sets the level: 0 quiet, 1 normal, 2 verbose.
pub fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
    START.get_or_init(Instant::now);
}

/// True unless `-q` was given.
pub fn enabled() -> bool {
    LEVEL.load(Ordering::Relaxed) >= 1
}

/// True with `-v`.
pub fn verbose() -> bool {
    LEVEL.load(Ordering::Relaxed) >= 2
}

/// Milliseconds since the process set its log level, for `-v` timings.
pub fn elapsed_ms() -> f64 {
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}

/// Writes one line to stderr. A failed write is ignored, unlike `eprintln!`, which panics: when
/// stderr is a pipe whose reader has gone, the renewal thread must still get to stop the command.
/// The line goes out in one write, so that the output of the job, which shares the terminal or the
/// CI log, cannot land in the middle of it (stderr is unbuffered: `writeln!` writes piece by piece).
pub fn line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let text = format!("{args}\n");
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// A diagnostic line, unless `-q`.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        if $crate::log::enabled() {
            $crate::log::line(format_args!("lockctl: {}", format_args!($($arg)*)));
        }
    };
}

/// An error or warning line, printed even with `-q`.
#[macro_export]
macro_rules! complain {
    ($($arg:tt)*) => {
        $crate::log::line(format_args!("lockctl: {}", format_args!($($arg)*)))
    };
}

/// A step with its timing, only with `-v`.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::log::verbose() {
            $crate::log::line(format_args!(
                "lockctl: [{:>9.3} ms] {}",
                $crate::log::elapsed_ms(),
                format_args!($($arg)*)
            ));
        }
    };
}
