//! `corewise-arbiter`: run the core arbiter daemon, or query it.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use corewise_arbiter::config::Config;
use corewise_arbiter::daemon::{self, Backend, Options, DEFAULT_SOCKET};
use corewise_arbiter::topology::CpuList;

#[derive(Parser)]
#[command(
    name = "corewise-arbiter",
    version,
    about = "Core arbiter: grants whole cores to applications"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum BackendArg {
    Auto,
    CgroupV1,
    CgroupV2,
    Affinity,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the daemon in the foreground (structured logs on stderr).
    Run {
        /// Listening socket.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Fencing backend.
        #[arg(long, value_enum, default_value = "auto")]
        backend: BackendArg,
        /// cgroup directory to confine all cgroup work to.
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
        /// CPUs to manage (kernel list format, e.g. 0-3); default: all online.
        #[arg(long)]
        cpus: Option<CpuList>,
        /// Number of CPUs kept unmanaged (at least 1).
        #[arg(long, default_value_t = 1)]
        unmanaged: usize,
        /// Release timeout before a core is reclaimed by force, in milliseconds.
        #[arg(long, default_value_t = 10.0)]
        reclaim_timeout_ms: f64,
        /// TOML file with per-user limits.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Emit logs as JSON.
        #[arg(long)]
        json_logs: bool,
        /// Run under SCHED_FIFO at this priority (1-99) for low grant latency.
        #[arg(long)]
        rt_priority: Option<u32>,
        /// Drop a client that leaves a frame (or, on a new connection, its
        /// first message) incomplete this long, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        frame_timeout_ms: u64,
        /// With --backend auto: when no cpuset hierarchy is usable, run with
        /// the weaker affinity-only backend instead of refusing to start.
        #[arg(long)]
        allow_affinity_fallback: bool,
        /// Busy-poll this many microseconds after asking for a release (0: never).
        #[arg(long, default_value_t = 200)]
        release_spin_us: u64,
        /// Keep a managed core that was just freed in the polling idle state
        /// for this many microseconds (0: never), so granting it again does
        /// not wait for the CPU to wake from a deep idle state.
        #[arg(long, default_value_t = 1000)]
        warm_window_us: u64,
    },
    /// Print who holds which core.
    Status {
        /// Daemon socket.
        #[arg(long, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Machine-readable output (one JSON object).
        #[arg(long)]
        json: bool,
        /// Give up when the daemon has not answered within this many
        /// seconds (it is stopped or stuck).
        #[arg(long, default_value_t = corewise_arbiter::client::STATUS_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout_s: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Run {
            socket,
            backend,
            cgroup_root,
            cpus,
            unmanaged,
            reclaim_timeout_ms,
            config,
            json_logs,
            rt_priority,
            release_spin_us,
            warm_window_us,
            frame_timeout_ms,
            allow_affinity_fallback,
        } => {
            let filter = tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            // Colour only for a terminal: a journal or a log file gets none.
            let sub = tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr);
            if json_logs {
                sub.json().init();
            } else {
                sub.init();
            }
            let config = match config {
                Some(p) => match Config::load(&p) {
                    Ok(c) => c,
                    Err(e) => {
                        eprintln!("corewise-arbiter: {e}");
                        return ExitCode::from(2);
                    }
                },
                None => Config::default(),
            };
            if !(reclaim_timeout_ms.is_finite() && reclaim_timeout_ms >= 0.0) {
                eprintln!("corewise-arbiter: invalid --reclaim-timeout-ms");
                return ExitCode::from(2);
            }
            let opts = Options {
                socket,
                backend: match backend {
                    BackendArg::Auto => Backend::Auto,
                    BackendArg::CgroupV1 => Backend::CgroupV1,
                    BackendArg::CgroupV2 => Backend::CgroupV2,
                    BackendArg::Affinity => Backend::Affinity,
                },
                cgroup_root,
                cpus,
                unmanaged,
                reclaim_timeout: Duration::from_secs_f64(reclaim_timeout_ms / 1000.0),
                config,
                rt_priority,
                release_spin: Duration::from_micros(release_spin_us),
                warm_window: Duration::from_micros(warm_window_us),
                frame_timeout: Duration::from_millis(frame_timeout_ms.max(1)),
                affinity_fallback: allow_affinity_fallback,
            };
            match daemon::run(opts) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = %e, "core arbiter failed");
                    ExitCode::FAILURE
                }
            }
        }
        Cmd::Status {
            socket,
            json,
            timeout_s,
        } => match corewise_arbiter::client::status_within(
            &socket,
            std::time::Duration::from_secs(timeout_s),
        ) {
            Ok(entries) => {
                if json {
                    print!("{}", corewise_arbiter::status::format_json(&entries));
                } else {
                    print!("{}", corewise_arbiter::status::format_table(&entries));
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("corewise-arbiter: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
