//! Terminating signals (SIGINT, SIGTERM, SIGHUP), received on a thread of their own.
//!
//! lockctl must never die between setting a key and reporting it, nor leave a child unsupervised, so
//! these signals are never left to their default action: a dedicated thread receives them (through
//! signal-hook's self-pipe, which is async-signal-safe) and hands each one to the command, which decides
//! what it means: end a wait cleanly, or forward it to the child's process group. The signal number
//! matters (a child must get the signal that was sent), which is why this uses signal-hook's iterator
//! rather than a Ctrl-C callback.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// The signals lockctl handles.
pub const HANDLED: [i32; 3] = [SIGINT, SIGTERM, SIGHUP];

/// Starts receiving the handled signals; `on_signal` runs on the receiving thread for each one.
pub fn listen(mut on_signal: impl FnMut(i32) + Send + 'static) -> std::io::Result<()> {
    let mut signals = Signals::new(HANDLED)?;
    std::thread::Builder::new()
        .name("signals".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            for signal in signals.forever() {
                on_signal(signal);
            }
        })?;
    Ok(())
}
