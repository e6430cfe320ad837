//! `corewise-bench`: benchmarks that run corewise and its peers (std::thread,
//! tokio, may, Go) side by side in one invocation and print a table.
//!
//! `main` is a thin dispatcher: each subcommand lives in its own module with
//! an `Args` type and a `run` function.

mod affinity;
mod blocking;
mod child_proc;
mod clock;
mod core_grant;
mod cores;
mod cpuset;
mod echo;
mod error;
mod kv;
mod neighbours;
mod output;
mod primitives;
mod procstat;
mod stats;
mod threads;

use clap::{Parser, Subcommand};

/// Command line of `corewise-bench`.
#[derive(Debug, Parser)]
#[command(name = "corewise-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// One subcommand per benchmark. New benchmarks (`core-grant`, `echo`,
/// `neighbours`, `cores`, `kv`, `threads`, `blocking`) add a variant here and a module of their own.
#[derive(Debug, Subcommand)]
enum Command {
    /// Primitive costs: creation, yield, condition notify, signal, creation
    /// throughput and idle CPU, for corewise and every peer.
    Primitives(primitives::Args),
    /// Core grant latency from the arbiter daemon: a free core, and a core
    /// reclaimed from a lower-priority application (needs root).
    CoreGrant(core_grant::CoreGrantArgs),
    /// The friendlypool experiment: fib tasks at a fixed rate through an
    /// ignorant, a corewise and an optimal pool beside 0-2 CPU-bound
    /// neighbour processes.
    Neighbours(neighbours::Args),
    /// Cores in use and latency while the load ramps 1 % -> 100 % -> 1 %.
    Cores(cores::Args),
    /// Echo server: corewise (io_uring, epoll) against tokio and a plain
    /// epoll loop, 1-1000 connections: throughput, p50/p99, syscalls/request.
    Echo(echo::Args),
    /// corewise-kv against memcached -t 1 on one server CPU: open-loop
    /// rate sweep, p50/p99/p99.9, peak throughput at p99 <= 1 ms.
    Kv(kv::Args),
    /// Many threads at once: 100 000 sleepers, 1 000 000 parked, for
    /// corewise, tokio, Go, may and std; thread-per-connection echo with
    /// many connections open: wall time, RSS per thread, p50/p99.
    Threads(threads::Args),
    /// A ticker thread's lateness while one thread per core makes blocking
    /// std calls (sleep, file reads, computing), for corewise, tokio, Go
    /// and std threads.
    Blocking(blocking::Args),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Primitives(args) => primitives::run(&args),
        Command::Neighbours(args) => neighbours::run(&args),
        Command::Cores(args) => cores::run(&args),
        Command::Echo(args) => echo::run(&args),
        Command::Kv(args) => kv::run(&args),
        Command::Threads(args) => threads::run(&args),
        Command::Blocking(args) => blocking::run(&args),
        Command::CoreGrant(args) => core_grant::run(args)
            .map(|_| ())
            .map_err(|e| error::BenchError::Machine(format!("core-grant: {e}"))),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corewise-bench: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
