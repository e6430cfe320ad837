//! `corewise-kv`: memcached's command line, corewise underneath.

use clap::Parser;
use corewise_kv::config::{Args, Io, Mode};
use corewise_kv::exec::Shared;
use corewise_kv::listen::Listener;
use corewise_kv::{process, server};
use std::process::ExitCode;
use std::sync::Arc;

fn main() -> ExitCode {
    let args = Args::parse();
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("corewise-kv: {e}");
            return ExitCode::from(64);
        }
    };
    if !corewise_kv::store::slabs::set_layout(config.growth_factor, config.slab_min) {
        eprintln!("corewise-kv: -f/-n: slab classes already chosen");
        return ExitCode::FAILURE;
    }
    server::raise_fd_limit();
    if config.enable_coredumps {
        if let Err(e) = process::enable_coredumps() {
            eprintln!("corewise-kv: -r: {e}");
            // memcached's exit status here (EX_OSERR).
            return ExitCode::from(71);
        }
    }
    // Listening first, as root if started so (a low port), and while the
    // terminal still shows an error; then memcached's process set-up,
    // which must come before the runtime starts any thread.
    let bound = match &config.unix_socket {
        Some(path) => Listener::unix(path, config.unix_mask)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display())),
        None => server::bind(&config.listen, config.port)
            .map(Listener::from)
            .map_err(|e| format!("cannot listen on {}:{}: {e}", config.listen, config.port)),
    };
    let listener = match bound {
        Ok(l) => l,
        Err(e) => {
            eprintln!("corewise-kv: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = listener.set_backlog(config.backlog) {
        eprintln!("corewise-kv: -b {}: {e}", config.backlog);
        return ExitCode::FAILURE;
    }
    if let Some(user) = &config.user {
        if let Err(e) = process::switch_user(user) {
            eprintln!("corewise-kv: -u {user}: {e}");
            return ExitCode::FAILURE;
        }
    }
    if config.daemon {
        if let Err(e) = process::detach() {
            eprintln!("corewise-kv: -d: {e}");
            return ExitCode::FAILURE;
        }
    }
    if let Some(p) = &config.pid_file {
        if let Err(e) = process::write_pid_file(p) {
            eprintln!("corewise-kv: -P {}: {e}", p.display());
            return ExitCode::FAILURE;
        }
    }
    let mut b = corewise::Runtime::builder()
        .max_cores(config.threads)
        .idle_spin(std::time::Duration::from_micros(config.idle_spin_us));
    let cpus_allowed = config
        .cpus
        .as_ref()
        .map_or(config.threads, |c| c.len().min(config.threads));
    if config.mode == Mode::Dispatch && cpus_allowed >= 2 {
        // The dispatcher holds a core of its own; without a second core
        // held from the start, the workers would have none until the
        // policy scales up (and none at all under a neighbour cap of 1).
        b = b.min_cores(2);
    }
    b = b.io_backend(match config.io {
        Io::Epoll => corewise::io::IoBackend::Epoll,
        Io::Uring => corewise::io::IoBackend::Uring,
    });
    if let Some(p) = &config.arbiter {
        b = b.arbiter_socket_or_local(p.clone());
    }
    if let Some(cpus) = &config.cpus {
        b = b.cpus(cpus.clone());
    }
    let rt = match b.build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("corewise-kv: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(p) = &config.arbiter {
        if rt.arbiter_kind() != corewise::arbiter::ArbiterKind::Daemon {
            eprintln!(
                "corewise-kv: arbiter daemon at {} not reachable; using the in-process arbiter",
                p.display()
            );
        }
    }
    if config.verbose > 0 {
        eprintln!(
            "corewise-kv: listening on {} ({} mode, {} cores max, {} backend)",
            listener.address(),
            config.mode,
            config.threads,
            rt.io_backend()
        );
    }
    let shared = Arc::new(Shared::new(config));
    match server::serve(&rt, listener, shared) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("corewise-kv: {e}");
            ExitCode::FAILURE
        }
    }
}
