//! Errors of the benchmark harness.

use std::io;

/// Everything that can stop a benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Pinning a thread to a CPU failed (CPU absent or not allowed).
    #[error("cannot pin thread to cpu {cpu}: {source}")]
    Pin {
        /// The CPU asked for.
        cpu: usize,
        /// The OS error.
        source: io::Error,
    },
    /// The machine or the process's affinity does not offer what the
    /// benchmark needs.
    #[error("unsuitable machine: {0}")]
    Machine(String),
    /// A wait inside a measurement did not finish in time.
    #[error("timed out waiting during {0}")]
    Timeout(&'static str),
    /// A thread of the benchmark panicked or could not be started.
    #[error("benchmark thread failed: {0}")]
    Thread(String),
    /// Building or starting a runtime failed.
    #[error("runtime {runtime}: {message}")]
    Runtime {
        /// Which runtime.
        runtime: &'static str,
        /// What went wrong.
        message: String,
    },
    /// An I/O error (files, child processes, output).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: io::Error,
    },
    /// JSON encoding or decoding failed.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
}

impl BenchError {
    /// Wraps an I/O error with a short description of what was being done.
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        BenchError::Io {
            context: context.into(),
            source,
        }
    }
}
