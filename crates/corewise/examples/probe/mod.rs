//! What the cost probes (`switch_cost`, `spawn_cost`, `notify_cost`)
//! share: the count from the command line, a runtime on CPU 0 alone (one
//! core, so the figure is the cost itself, not a cross-core one), and the
//! exit on an error.

use std::fmt::Display;

/// The first command-line argument as a count, or `default`.
pub fn count(default: u64) -> u64 {
    std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// A runtime on CPU 0 alone, with neighbour awareness off (no helper
/// reads `/proc` during the run); exits with a message if there is none.
#[allow(dead_code)] // `notify_cost` needs two cores
pub fn runtime_on_cpu0(probe: &str) -> corewise::Runtime {
    corewise::Runtime::builder()
        .cpus([0])
        .neighbour_awareness(None)
        .build()
        .unwrap_or_else(|e| fail(probe, format!("no runtime on cpu 0: {e}")))
}

/// Prints `probe: message` and exits with status 1.
pub fn fail(probe: &str, message: impl Display) -> ! {
    eprintln!("{probe}: {message}");
    std::process::exit(1)
}
