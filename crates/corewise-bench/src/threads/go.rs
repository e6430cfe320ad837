//! The `go` column of `threads`: goroutines, measured by a small Go program
//! (bench/go-threads) that is built once per run with `go build`, like the
//! `primitives` benchmark's Go peer.
//!
//! The program runs `sleepers` and `parked` itself and prints the same
//! one-line JSON outcome as the Rust children; for `connections` it is a
//! goroutine-per-connection echo server driven by the same generator as
//! the other servers. When `go` is absent or the build fails, every Go
//! cell says so as `skipped: ...`.

use crate::primitives::go::build_bench_program;
use std::path::PathBuf;
use std::process::Command;

/// GOMAXPROCS for `sleepers` and `parked`: two, like corewise's two cores
/// and tokio's and may's two workers.
pub const PROCS: usize = 2;

/// The built Go program, or why there is none.
pub struct GoPeer {
    bin: Result<PathBuf, String>,
}

impl GoPeer {
    /// Finds `go` and builds bench/go-threads next to this executable.
    pub fn build() -> Self {
        GoPeer {
            bin: build_bench_program("go-threads"),
        }
    }

    /// The command that runs `scenario` (sleepers, parked or serve) with
    /// `n` goroutines and GOMAXPROCS `procs`; `Err` is the cell's text.
    pub fn command(&self, scenario: &str, n: usize, procs: usize) -> Result<Command, String> {
        let bin = self.bin.as_ref().map_err(|e| format!("skipped: {e}"))?;
        let mut c = Command::new(bin);
        c.args(["-scenario", scenario, "-n", &n.to_string()])
            .env("GOMAXPROCS", procs.to_string());
        Ok(c)
    }
}
