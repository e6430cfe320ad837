//! The daemon: socket loop, startup (fence construction) and orderly exit.
//!
//! Why one thread with `poll`: every decision needs the whole state, messages
//! are rare (they only come when core needs change), and a single thread makes
//! the state machine trivially race-free. Signals arrive through a signalfd so
//! SIGINT/SIGTERM are ordinary events and teardown runs on the main path.

pub mod state;
pub mod task;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, IoSlice, Read};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::{PollFd, PollFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use thiserror::Error;

use crate::config::{Config, ConfigError, SocketAccess};
use crate::fence::{AffinityFence, CgroupFence, CgroupVersion, Fence, FenceError};
use crate::protocol::{
    decode_request, encode_response, Request, Response, HEADER_LEN, MAX_RESPONSE_PAYLOAD,
};
use crate::topology::{online_cpus, CoreId, CpuList, Topology};
use crate::warm::WarmCores;
use state::{ConnId, State};

/// Which fencing backend to use.
///
/// ```
/// use corewise_arbiter::daemon::{spawn, Backend, DaemonError, Options};
/// assert_eq!(Options::default().backend, Backend::Auto);
/// // An explicit cgroup backend fails to start where its hierarchy is missing
/// // (Auto would try the others, then refuse or fall back to Affinity).
/// let socket = std::env::temp_dir().join(format!("arbiter-backend-doc-{}.sock", std::process::id()));
/// let mut opts = Options {
///     socket: socket.clone(),
///     backend: Backend::CgroupV1,
///     cgroup_root: Some("/nonexistent/corewise".into()),
///     cpus: Some("0-1".parse().unwrap()),
///     ..Options::default()
/// };
/// opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// assert!(matches!(spawn(opts), Err(DaemonError::Fence(_))));
/// assert!(!socket.exists());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// cgroup v1 if writable, else v2, else affinity.
    Auto,
    /// cgroup v1 cpuset.
    CgroupV1,
    /// cgroup v2 threaded cpuset subtree.
    CgroupV2,
    /// sched_setaffinity only (weaker).
    Affinity,
}

/// Daemon settings (the `run` command line).
///
/// ```
/// # // Two CPUs this thread may run on that are not hyperthreads of one core
/// # // (one stays unmanaged, the other is managed); None on a smaller machine.
/// # fn two_cpus() -> Option<corewise_arbiter::topology::CpuList> {
/// #     use corewise_arbiter::topology::{CpuList, Topology};
/// #     let mask = rustix::thread::sched_getaffinity(None).ok()?;
/// #     let allowed: CpuList = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).collect();
/// #     let topo = Topology::read(&allowed);
/// #     let first = allowed.cores().next()?;
/// #     let other = allowed.cores().find(|&c| !topo.siblings(first).contains(&c))?;
/// #     Some([first, other].into_iter().collect())
/// # }
/// # // An in-process daemon on a temporary socket with the affinity-only
/// # // backend (no cgroups, no root needed).
/// # fn test_daemon(
/// #     name: &str,
/// #     tune: impl FnOnce(&mut corewise_arbiter::daemon::Options),
/// # ) -> Result<Option<(corewise_arbiter::daemon::DaemonHandle, std::path::PathBuf)>, Box<dyn std::error::Error>> {
/// #     use corewise_arbiter::daemon::{spawn, Backend, Options};
/// #     let Some(cpus) = two_cpus() else { return Ok(None) };
/// #     let socket = std::env::temp_dir().join(format!("arbiter-doc-{name}-{}.sock", std::process::id()));
/// #     let mut opts = Options {
/// #         socket: socket.clone(),
/// #         backend: Backend::Affinity,
/// #         cpus: Some(cpus),
/// #         warm_window: std::time::Duration::ZERO,
/// #         ..Options::default()
/// #     };
/// #     opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// #     tune(&mut opts);
/// #     Ok(Some((spawn(opts)?, socket)))
/// # }
/// use corewise_arbiter::daemon::{spawn, Backend, Options};
/// use std::time::Duration;
/// # let Some(cpus) = two_cpus() else { return Ok(()) };
/// let socket = std::env::temp_dir().join(format!("arbiter-options-doc-{}.sock", std::process::id()));
/// let mut opts = Options {
///     socket: socket.clone(),
///     backend: Backend::Affinity,
///     cpus: Some(cpus), // two CPUs: one stays unmanaged, one is managed
///     reclaim_timeout: Duration::from_millis(5),
///     warm_window: Duration::ZERO,
///     ..Options::default()
/// };
/// opts.config.defaults.max_cores = 1;
/// opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// let daemon = spawn(opts)?;
/// let app = corewise_arbiter::connect(&socket)?;
/// // The per-user limit from `config` clips the request.
/// assert!(app.set_requested_cores([3, 0, 0, 0, 0, 0, 0, 0])?.clipped);
/// drop(app);
/// daemon.stop()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct Options {
    /// Listening socket path.
    pub socket: PathBuf,
    /// Fencing backend.
    pub backend: Backend,
    /// cgroup directory under which everything is created.
    pub cgroup_root: Option<PathBuf>,
    /// CPUs the daemon may use (default: all online).
    pub cpus: Option<CpuList>,
    /// How many CPUs stay unmanaged (at least 1).
    pub unmanaged: usize,
    /// Release timeout before a forced reclaim.
    pub reclaim_timeout: Duration,
    /// Limits.
    pub config: Config,
    /// How long a client may take to complete a frame it started (and a
    /// new connection to send its first message, and a closing one to take
    /// its last reply); then it is disconnected.
    pub frame_timeout: Duration,
    /// With [`Backend::Auto`], fall back to the weaker affinity-only backend
    /// when no cpuset hierarchy is usable (otherwise the daemon refuses to
    /// start).
    pub affinity_fallback: bool,
    /// Run the daemon thread under SCHED_FIFO at this priority (1-99), so a
    /// busy unmanaged core does not delay grants; `None` keeps SCHED_OTHER.
    pub rt_priority: Option<u32>,
    /// After asking an application to release a core, the daemon polls its
    /// sockets without sleeping for up to this long (bounded by the release
    /// timeout), which shortens reclaims. Zero disables it.
    pub release_spin: Duration,
    /// How long a managed core that was just freed (or asked to be) is kept
    /// in the polling idle state, so that granting it again does not wait
    /// for the CPU to leave a deep idle state (see [`crate::warm`]). Zero
    /// disables it.
    pub warm_window: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            socket: PathBuf::from(DEFAULT_SOCKET),
            backend: Backend::Auto,
            cgroup_root: None,
            cpus: None,
            unmanaged: 1,
            reclaim_timeout: Duration::from_millis(10),
            config: Config::default(),
            frame_timeout: Duration::from_secs(2),
            affinity_fallback: false,
            rt_priority: None,
            release_spin: Duration::from_micros(200),
            warm_window: Duration::from_millis(1),
        }
    }
}

/// Default socket path.
///
/// ```
/// use corewise_arbiter::daemon::{Options, DEFAULT_SOCKET};
/// assert_eq!(Options::default().socket, std::path::Path::new(DEFAULT_SOCKET));
/// ```
pub const DEFAULT_SOCKET: &str = "/run/corewise-arbiter.sock";
/// Default cgroup v1 cpuset mount.
///
/// ```
/// use corewise_arbiter::daemon::{DEFAULT_V1_ROOT, DEFAULT_V2_ROOT};
/// use corewise_arbiter::fence::{CgroupVersion, CpusetHierarchy};
/// // Where the automatic backend looks, v1 first.
/// if let Some(h) = CpusetHierarchy::detect() {
///     let expected = if h.version == CgroupVersion::V1 { DEFAULT_V1_ROOT } else { DEFAULT_V2_ROOT };
///     assert_eq!(h.root, std::path::Path::new(expected));
/// }
/// assert!(std::path::Path::new(DEFAULT_V1_ROOT).ends_with("cpuset"));
/// ```
pub const DEFAULT_V1_ROOT: &str = "/sys/fs/cgroup/cpuset";
/// Default cgroup v2 mount.
///
/// ```
/// use corewise_arbiter::daemon::DEFAULT_V2_ROOT;
/// use corewise_arbiter::fence::{CgroupVersion, CpusetHierarchy};
/// // Without a v1 cpuset mount, the v2 root is the hierarchy when it hands
/// // children the cpuset controller.
/// let none = std::path::Path::new("/nonexistent");
/// let h = CpusetHierarchy::detect_at(none, std::path::Path::new(DEFAULT_V2_ROOT));
/// assert!(h.is_none_or(|h| h.version == CgroupVersion::V2));
/// ```
pub const DEFAULT_V2_ROOT: &str = "/sys/fs/cgroup";

/// Daemon failures.
///
/// ```
/// use corewise_arbiter::daemon::{spawn, DaemonError, Options};
/// // One CPU is not enough: one always stays unmanaged.
/// let opts = Options { cpus: Some("0".parse().unwrap()), ..Options::default() };
/// let err = spawn(opts).err().unwrap();
/// assert!(matches!(err, DaemonError::Settings(_)));
/// assert!(err.to_string().contains("at least 2 CPUs"));
/// ```
#[derive(Debug, Error)]
pub enum DaemonError {
    /// Bad settings.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// Fence setup or teardown failed.
    #[error(transparent)]
    Fence(#[from] FenceError),
    /// Socket or signal setup failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: io::Error,
    },
    /// Config file problem.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

fn io_op(op: &'static str) -> impl FnOnce(io::Error) -> DaemonError {
    move |source| DaemonError::Io { op, source }
}

fn build_fence(
    opts: &Options,
    all: &CpuList,
    managed: &[CoreId],
) -> Result<Box<dyn Fence>, DaemonError> {
    let v1 = || -> Result<Box<dyn Fence>, FenceError> {
        let root = opts
            .cgroup_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_V1_ROOT));
        Ok(Box::new(CgroupFence::new(
            CgroupVersion::V1,
            &root,
            all,
            managed,
        )?))
    };
    let v2 = || -> Result<Box<dyn Fence>, FenceError> {
        let root = opts
            .cgroup_root
            .clone()
            .unwrap_or_else(|| PathBuf::from(DEFAULT_V2_ROOT));
        Ok(Box::new(CgroupFence::new(
            CgroupVersion::V2,
            &root,
            all,
            managed,
        )?))
    };
    Ok(match opts.backend {
        Backend::CgroupV1 => v1()?,
        Backend::CgroupV2 => v2()?,
        Backend::Affinity => Box::new(AffinityFence::new(all)),
        Backend::Auto => match v1() {
            Ok(f) => f,
            Err(e1) => match v2() {
                Ok(f) => f,
                Err(e2) if opts.affinity_fallback => {
                    tracing::warn!(v1 = %e1, v2 = %e2, "no writable cpuset hierarchy; using the weaker affinity-only backend (--allow-affinity-fallback)");
                    Box::new(AffinityFence::new(all))
                }
                Err(e2) => {
                    return Err(DaemonError::Settings(format!(
                        "no usable cpuset hierarchy (cgroup v1: {e1}; cgroup v2: {e2}); \
                         give --cgroup-root a writable cpuset directory, or pass \
                         --allow-affinity-fallback to run with the weaker affinity-only backend"
                    )))
                }
            },
        },
    })
}

/// Blocks SIGINT/SIGTERM and returns a signalfd for them.
fn signal_fd() -> Result<OwnedFd, DaemonError> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it fully before
    // use, and the calls only read/write that local.
    unsafe {
        let mut set = MaybeUninit::<libc::sigset_t>::zeroed();
        libc::sigemptyset(set.as_mut_ptr());
        libc::sigaddset(set.as_mut_ptr(), libc::SIGINT);
        libc::sigaddset(set.as_mut_ptr(), libc::SIGTERM);
        if libc::pthread_sigmask(libc::SIG_BLOCK, set.as_ptr(), std::ptr::null_mut()) != 0 {
            return Err(DaemonError::Io {
                op: "pthread_sigmask",
                source: io::Error::last_os_error(),
            });
        }
        let fd = libc::signalfd(-1, set.as_ptr(), libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(DaemonError::Io {
                op: "signalfd",
                source: io::Error::last_os_error(),
            });
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Most client connections served at once; more are accepted and closed, so
/// a flood can neither exhaust the daemon's descriptors nor stall its loop.
///
/// ```
/// use corewise_arbiter::config::DEFAULT_MAX_CONNECTIONS;
/// use corewise_arbiter::daemon::MAX_CONNECTIONS;
/// // Room for many users, each at its default limit of connections.
/// assert!(MAX_CONNECTIONS >= 10 * DEFAULT_MAX_CONNECTIONS as usize);
/// ```
pub const MAX_CONNECTIONS: usize = 16384;

/// Raises the soft descriptor limit to the hard one (one socket per client
/// kernel thread adds up).
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

/// Puts the calling thread under SCHED_FIFO (rustix has no sched_setscheduler).
fn set_realtime(prio: u32) -> Result<(), DaemonError> {
    if !(1..=99).contains(&prio) {
        return Err(DaemonError::Settings(format!(
            "real-time priority {prio} is not in 1..=99"
        )));
    }
    let param = libc::sched_param {
        sched_priority: prio as i32,
    };
    // SAFETY: `param` is a valid, initialised sched_param that outlives the
    // call; pid 0 means the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
    if r != 0 {
        return Err(DaemonError::Io {
            op: "sched_setscheduler(SCHED_FIFO)",
            source: io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Checks the settings, builds the fence and binds the socket.
fn setup(opts: &Options) -> Result<(State, UnixListener), DaemonError> {
    if let Some(p) = opts.rt_priority {
        set_realtime(p)?;
    }
    let all = match &opts.cpus {
        Some(c) => c.clone(),
        None => online_cpus(),
    };
    if all.len() < 2 {
        return Err(DaemonError::Settings(
            "need at least 2 CPUs (one always stays unmanaged)".into(),
        ));
    }
    if all.iter().any(|c| c >= crate::shm::MAX_CPUS) {
        return Err(DaemonError::Settings("CPU number too large".into()));
    }
    let unmanaged = opts.unmanaged.max(1);
    if unmanaged >= all.len() {
        return Err(DaemonError::Settings(format!(
            "--unmanaged {unmanaged} leaves no core to manage out of {}",
            all.len()
        )));
    }
    let topo = Topology::read(&all);
    // Keep whole physical cores unmanaged: the lowest-numbered CPUs and their
    // hyperthread siblings.
    let mut keep = CpuList::new();
    for c in all.cores() {
        if keep.len() >= unmanaged {
            break;
        }
        for s in topo.siblings(c) {
            if all.contains(s as usize) {
                keep.insert(s as usize);
            }
        }
    }
    let managed: Vec<CoreId> = all
        .cores()
        .filter(|&c| !keep.contains(c as usize))
        .collect();
    if managed.is_empty() {
        return Err(DaemonError::Settings("no core left to manage".into()));
    }
    // Bind before touching cgroups, so a second daemon on the same socket
    // fails without disturbing the first one's sets.
    let access = opts.config.socket.resolve()?;
    let listener = bind(&opts.socket, &access)?;
    let fence = match build_fence(opts, &all, &managed) {
        Ok(f) => f,
        Err(e) => {
            let _ = std::fs::remove_file(&opts.socket);
            return Err(e);
        }
    };
    let mut state = State::new(
        fence,
        all.clone(),
        managed.clone(),
        topo,
        opts.reclaim_timeout,
        opts.config.clone(),
    );
    state.set_release_spin(opts.release_spin.min(opts.reclaim_timeout));
    let record = PathBuf::from(format!("{}.pmqos", opts.socket.display()));
    state.set_warm(WarmCores::new(
        Path::new(crate::warm::SYSFS_CPU_ROOT),
        &managed,
        opts.warm_window,
        Some(&record),
    ));
    tracing::info!(backend = state.fence_name(), cpus = %all, unmanaged = %keep, managed = ?managed, socket = %opts.socket.display(), "core arbiter started");
    Ok((state, listener))
}

fn finish(
    opts: &Options,
    mut state: State,
    result: Result<(), DaemonError>,
) -> Result<(), DaemonError> {
    if let Err(e) = &result {
        tracing::error!(error = %e, "daemon loop failed; cleaning up");
    }
    let teardown = state.shutdown();
    let _ = std::fs::remove_file(&opts.socket);
    tracing::info!("core arbiter stopped");
    result?;
    teardown?;
    Ok(())
}

/// Runs the daemon until SIGINT/SIGTERM; cleans up before returning.
///
/// Call it before starting other threads: SIGINT/SIGTERM are blocked on the
/// calling thread and read from a signalfd.
///
/// ```
/// # // Two CPUs this thread may run on that are not hyperthreads of one core
/// # // (one stays unmanaged, the other is managed); None on a smaller machine.
/// # fn two_cpus() -> Option<corewise_arbiter::topology::CpuList> {
/// #     use corewise_arbiter::topology::{CpuList, Topology};
/// #     let mask = rustix::thread::sched_getaffinity(None).ok()?;
/// #     let allowed: CpuList = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).collect();
/// #     let topo = Topology::read(&allowed);
/// #     let first = allowed.cores().next()?;
/// #     let other = allowed.cores().find(|&c| !topo.siblings(first).contains(&c))?;
/// #     Some([first, other].into_iter().collect())
/// # }
/// # // An in-process daemon on a temporary socket with the affinity-only
/// # // backend (no cgroups, no root needed).
/// # fn test_daemon(
/// #     name: &str,
/// #     tune: impl FnOnce(&mut corewise_arbiter::daemon::Options),
/// # ) -> Result<Option<(corewise_arbiter::daemon::DaemonHandle, std::path::PathBuf)>, Box<dyn std::error::Error>> {
/// #     use corewise_arbiter::daemon::{spawn, Backend, Options};
/// #     let Some(cpus) = two_cpus() else { return Ok(None) };
/// #     let socket = std::env::temp_dir().join(format!("arbiter-doc-{name}-{}.sock", std::process::id()));
/// #     let mut opts = Options {
/// #         socket: socket.clone(),
/// #         backend: Backend::Affinity,
/// #         cpus: Some(cpus),
/// #         warm_window: std::time::Duration::ZERO,
/// #         ..Options::default()
/// #     };
/// #     opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// #     tune(&mut opts);
/// #     Ok(Some((spawn(opts)?, socket)))
/// # }
/// use corewise_arbiter::daemon::{run, Backend, Options};
/// use std::time::Duration;
/// # let Some(cpus) = two_cpus() else { return Ok(()) };
/// let socket = std::env::temp_dir().join(format!("arbiter-run-doc-{}.sock", std::process::id()));
/// let mut opts = Options {
///     socket: socket.clone(),
///     backend: Backend::Affinity,
///     cpus: Some(cpus),
///     warm_window: Duration::ZERO,
///     ..Options::default()
/// };
/// opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// // Stands in for an operator: once the daemon answers, SIGTERM to the
/// // thread running it (the signal is blocked there and read by the daemon).
/// let (pid, tid) = (rustix::process::getpid(), rustix::thread::gettid());
/// let s = socket.clone();
/// let operator = std::thread::spawn(move || {
///     while corewise_arbiter::client::status(&s).is_err() {
///         std::thread::sleep(Duration::from_millis(1));
///     }
///     // SAFETY: tgkill takes plain integers.
///     unsafe { libc::syscall(libc::SYS_tgkill, pid.as_raw_nonzero().get(), tid.as_raw_nonzero().get(), libc::SIGTERM) };
/// });
/// run(opts)?; // returns once SIGTERM arrived and everything is cleaned up
/// operator.join().unwrap();
/// assert!(!socket.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn run(opts: Options) -> Result<(), DaemonError> {
    let sig = signal_fd()?;
    raise_fd_limit();
    let (mut state, listener) = setup(&opts)?;
    let result = serve(&listener, &mut state, &sig, opts.frame_timeout);
    finish(&opts, state, result)
}

/// A daemon running on a thread of the calling process (benchmarks, tools).
///
/// ```
/// # // Two CPUs this thread may run on that are not hyperthreads of one core
/// # // (one stays unmanaged, the other is managed); None on a smaller machine.
/// # fn two_cpus() -> Option<corewise_arbiter::topology::CpuList> {
/// #     use corewise_arbiter::topology::{CpuList, Topology};
/// #     let mask = rustix::thread::sched_getaffinity(None).ok()?;
/// #     let allowed: CpuList = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).collect();
/// #     let topo = Topology::read(&allowed);
/// #     let first = allowed.cores().next()?;
/// #     let other = allowed.cores().find(|&c| !topo.siblings(first).contains(&c))?;
/// #     Some([first, other].into_iter().collect())
/// # }
/// # // An in-process daemon on a temporary socket with the affinity-only
/// # // backend (no cgroups, no root needed).
/// # fn test_daemon(
/// #     name: &str,
/// #     tune: impl FnOnce(&mut corewise_arbiter::daemon::Options),
/// # ) -> Result<Option<(corewise_arbiter::daemon::DaemonHandle, std::path::PathBuf)>, Box<dyn std::error::Error>> {
/// #     use corewise_arbiter::daemon::{spawn, Backend, Options};
/// #     let Some(cpus) = two_cpus() else { return Ok(None) };
/// #     let socket = std::env::temp_dir().join(format!("arbiter-doc-{name}-{}.sock", std::process::id()));
/// #     let mut opts = Options {
/// #         socket: socket.clone(),
/// #         backend: Backend::Affinity,
/// #         cpus: Some(cpus),
/// #         warm_window: std::time::Duration::ZERO,
/// #         ..Options::default()
/// #     };
/// #     opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// #     tune(&mut opts);
/// #     Ok(Some((spawn(opts)?, socket)))
/// # }
/// use corewise_arbiter::daemon::{spawn, Backend, Options};
/// # let Some(cpus) = two_cpus() else { return Ok(()) };
/// let socket = std::env::temp_dir().join(format!("arbiter-handle-doc-{}.sock", std::process::id()));
/// let mut opts = Options { socket: socket.clone(), backend: Backend::Affinity, cpus: Some(cpus), ..Options::default() };
/// opts.warm_window = std::time::Duration::ZERO;
/// opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
/// let daemon = spawn(opts)?;
/// let app = corewise_arbiter::connect(&socket)?;
/// let table = corewise_arbiter::client::status(&socket)?;
/// assert!(table.iter().any(|e| e.pid == std::process::id()));
/// drop(app);
/// drop(daemon); // stops it, as `stop` does
/// assert!(!socket.exists());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct DaemonHandle {
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<Result<(), DaemonError>>>,
}

/// Starts the daemon on a new thread and returns once it is listening.
///
/// ```no_run
/// use corewise_arbiter::daemon::{spawn, Options};
/// let d = spawn(Options { socket: "/tmp/a.sock".into(), ..Options::default() })?;
/// // ... clients connect to /tmp/a.sock ...
/// d.stop()?;
/// # Ok::<(), corewise_arbiter::daemon::DaemonError>(())
/// ```
pub fn spawn(opts: Options) -> Result<DaemonHandle, DaemonError> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| io_op("pipe")(e.into()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("corewise-arbiter".into())
        .spawn(move || {
            let (mut state, listener) = match setup(&opts) {
                Ok(x) => {
                    let _ = tx.send(None);
                    x
                }
                Err(e) => {
                    let _ = tx.send(Some(e));
                    return Ok(());
                }
            };
            let result = serve(&listener, &mut state, &r, opts.frame_timeout);
            finish(&opts, state, result)
        })
        .map_err(io_op("spawn daemon thread"))?;
    match rx.recv() {
        Ok(None) => Ok(DaemonHandle {
            stop: Some(w),
            thread: Some(thread),
        }),
        Ok(Some(e)) => {
            let _ = thread.join();
            Err(e)
        }
        Err(_) => Err(DaemonError::Settings(
            "daemon thread died during setup".into(),
        )),
    }
}

impl DaemonHandle {
    /// Stops the daemon (as SIGTERM would) and waits for its cleanup.
    ///
    /// ```
    /// # // Two CPUs this thread may run on that are not hyperthreads of one core
    /// # // (one stays unmanaged, the other is managed); None on a smaller machine.
    /// # fn two_cpus() -> Option<corewise_arbiter::topology::CpuList> {
    /// #     use corewise_arbiter::topology::{CpuList, Topology};
    /// #     let mask = rustix::thread::sched_getaffinity(None).ok()?;
    /// #     let allowed: CpuList = (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| mask.is_set(c)).collect();
    /// #     let topo = Topology::read(&allowed);
    /// #     let first = allowed.cores().next()?;
    /// #     let other = allowed.cores().find(|&c| !topo.siblings(first).contains(&c))?;
    /// #     Some([first, other].into_iter().collect())
    /// # }
    /// # // An in-process daemon on a temporary socket with the affinity-only
    /// # // backend (no cgroups, no root needed).
    /// # fn test_daemon(
    /// #     name: &str,
    /// #     tune: impl FnOnce(&mut corewise_arbiter::daemon::Options),
    /// # ) -> Result<Option<(corewise_arbiter::daemon::DaemonHandle, std::path::PathBuf)>, Box<dyn std::error::Error>> {
    /// #     use corewise_arbiter::daemon::{spawn, Backend, Options};
    /// #     let Some(cpus) = two_cpus() else { return Ok(None) };
    /// #     let socket = std::env::temp_dir().join(format!("arbiter-doc-{name}-{}.sock", std::process::id()));
    /// #     let mut opts = Options {
    /// #         socket: socket.clone(),
    /// #         backend: Backend::Affinity,
    /// #         cpus: Some(cpus),
    /// #         warm_window: std::time::Duration::ZERO,
    /// #         ..Options::default()
    /// #     };
    /// #     opts.config.socket.group = Some(rustix::process::getegid().as_raw().to_string());
    /// #     tune(&mut opts);
    /// #     Ok(Some((spawn(opts)?, socket)))
    /// # }
    /// # let Some((daemon, socket)) = test_daemon("stop", |_| {})? else { return Ok(()) };
    /// // `daemon` was started with `spawn` on `socket`.
    /// let app = corewise_arbiter::connect(&socket)?;
    /// daemon.stop()?;
    /// // Applications were told, and the socket is gone.
    /// assert!(app.daemon_shutting_down());
    /// assert!(corewise_arbiter::connect(&socket).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn stop(mut self) -> Result<(), DaemonError> {
        self.stop_inner()
    }

    fn stop_inner(&mut self) -> Result<(), DaemonError> {
        if let Some(w) = self.stop.take() {
            let _ = rustix::io::write(&w, b"x");
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(DaemonError::Settings("daemon thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for DaemonHandle {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

fn bind(path: &Path, access: &SocketAccess) -> Result<UnixListener, DaemonError> {
    if path.exists() {
        // A live daemon answers; a stale socket file is replaced.
        if UnixStream::connect(path).is_ok() {
            return Err(DaemonError::Settings(format!(
                "another daemon is listening on {}",
                path.display()
            )));
        }
        let _ = std::fs::remove_file(path);
    }
    // Created owner-only, then given its owner, group and mode: nobody
    // else can connect in between.
    let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o177));
    let bound = UnixListener::bind(path);
    rustix::process::umask(old);
    let l = bound.map_err(io_op("bind"))?;
    set_socket_access(path, access)?;
    l.set_nonblocking(true).map_err(io_op("set_nonblocking"))?;
    Ok(l)
}

/// Gives the socket file its owner, group and mode through a descriptor of
/// the file itself, never by following the path: in a directory other users
/// may write to, the path could be swapped for a symlink between `bind` and
/// here, and root would change the owner and mode of the link's target.
/// The file must be a socket the daemon's user owns, or nothing is changed.
fn set_socket_access(path: &Path, access: &SocketAccess) -> Result<(), DaemonError> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags};
    let fd = rustix::fs::open(
        path,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| io_op("open socket file")(e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io_op("stat socket file")(e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Socket
        || st.st_uid != rustix::process::geteuid().as_raw()
    {
        return Err(DaemonError::Settings(format!(
            "{} was replaced after it was bound (not the daemon's socket); refusing to change it",
            path.display()
        )));
    }
    rustix::fs::chownat(
        &fd,
        "",
        Some(rustix::process::Uid::from_raw(access.uid)),
        Some(rustix::process::Gid::from_raw(access.gid)),
        AtFlags::EMPTY_PATH,
    )
    .map_err(|e| io_op("chown socket")(e.into()))?;
    // An `O_PATH` descriptor takes no `fchmod`; its `/proc` link names the
    // same file (the one opened above, whatever the path says now).
    let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
    std::fs::set_permissions(link, std::fs::Permissions::from_mode(access.mode))
        .map_err(io_op("chmod socket"))?;
    Ok(())
}

/// Most bytes of replies queued for one client that does not read them; a
/// client beyond it is disconnected. Two status tables (the largest reply)
/// fit; a client following the protocol has at most a few small replies
/// outstanding.
///
/// ```
/// use corewise_arbiter::daemon::MAX_OUTPUT;
/// use corewise_arbiter::protocol::{encode_response, Response, StatusEntry};
/// // Two of the largest replies, full status tables, fit.
/// let e = StatusEntry { pid: 1, uid: 0, name: "app".into(), requested: [0; 8], granted: vec![1, 2], preempted: 0 };
/// let table = encode_response(&Response::Status { entries: vec![e; 100_000] });
/// assert!(2 * table.len() <= MAX_OUTPUT);
/// ```
pub const MAX_OUTPUT: usize = 2 * (MAX_RESPONSE_PAYLOAD + HEADER_LEN);

/// Reads from one client per wake-up at most (bounds the work of a client
/// that trickles bytes without completing a request).
const MAX_READ_CHUNKS: usize = 16;

/// Requests handled from one client per wake-up at most, so that one client
/// that keeps sending cannot keep the loop from the others: every ready
/// client gets its turn in each pass of the loop.
///
/// ```
/// // A pass handles a few clients' bursts, not one client's backlog.
/// assert!(corewise_arbiter::daemon::MAX_REQUESTS_PER_WAKE <= 64);
/// ```
pub const MAX_REQUESTS_PER_WAKE: usize = 16;

/// Bytes of replies waiting for a client (beyond what its socket took)
/// from which the daemon stops reading its requests until it takes them.
/// A client that sends without reading thus costs nothing once its socket
/// and this much are full: its requests wait in its own socket, it is out
/// of the poll set, and after `--frame-timeout-ms` above the mark it is
/// disconnected. A client following the protocol has a few small replies
/// outstanding at most (an acknowledgement is 39 bytes, a grant 10).
///
/// ```
/// use corewise_arbiter::daemon::{MAX_OUTPUT, READ_HIGH_WATER};
/// assert!(READ_HIGH_WATER < MAX_OUTPUT);
/// ```
pub const READ_HIGH_WATER: usize = 4096;

/// `SO_SNDBUF` of a client's socket (see [`READ_HIGH_WATER`]): room for
/// hundreds of replies, while a client that never reads gets few handled.
const CLIENT_SNDBUF: usize = 8192;

struct Conn {
    stream: UnixStream,
    rbuf: Vec<u8>,
    /// Replies not yet taken by the socket.
    wbuf: Vec<u8>,
    pid: u32,
    uid: u32,
    /// Closed once its output is written (status replies).
    closing: bool,
    /// When the client must have completed what it started: its first
    /// message (a new connection), a partial frame, or taking its last
    /// reply (a closing connection).
    deadline: Option<Instant>,
    /// What the epoll set watches on it now.
    interest: EventFlags,
}

impl Conn {
    /// Writes as much queued output as the socket takes, never waiting.
    fn write_out(&mut self) -> io::Result<()> {
        while !self.wbuf.is_empty() {
            match rustix::net::send(&self.stream, &self.wbuf, SendFlags::NOSIGNAL) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.wbuf.drain(..n);
                }
                Err(rustix::io::Errno::INTR) => {}
                Err(rustix::io::Errno::AGAIN) => return Ok(()),
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Tells the client why it is being dropped (best effort, never
    /// waiting; the connection is closed right after).
    fn refuse(&mut self, why: &str) {
        self.wbuf.extend(encode_response(&Response::Error {
            message: why.to_string(),
        }));
        let _ = self.write_out();
    }

    /// Whether its unread replies keep its requests from being read.
    fn backpressured(&self) -> bool {
        self.wbuf.len() >= READ_HIGH_WATER
    }

    /// Whether a whole request (or a malformed one) is buffered.
    fn has_frame(&self) -> bool {
        !matches!(decode_request(&self.rbuf), Ok(None))
    }

    /// Whether a request waits in its buffer with nothing to stop it:
    /// handled in the next pass, as the socket may have nothing more to
    /// say.
    fn must_resume(&self) -> bool {
        !self.closing && !self.backpressured() && self.has_frame()
    }

    /// What to watch for: requests unless closing or too far behind in
    /// taking its replies, room to write while output waits.
    fn wanted(&self) -> EventFlags {
        let mut f = EventFlags::empty();
        if !self.closing && !self.backpressured() {
            f |= EventFlags::IN;
        }
        if !self.wbuf.is_empty() {
            f |= EventFlags::OUT;
        }
        f
    }
}

/// The connections, indexed so that a wake-up costs what is ready, not what
/// is open: an epoll set tells which are ready, and the deadlines are kept
/// sorted.
struct Conns {
    map: BTreeMap<ConnId, Conn>,
    per_uid: BTreeMap<u32, u32>,
    deadlines: BTreeSet<(Instant, ConnId)>,
    epoll: OwnedFd,
    next_id: ConnId,
    /// Connections with a whole request buffered (left by the per-client
    /// bound, or waiting while its replies were not taken) to handle in
    /// the next pass without waiting for their sockets.
    resume: Vec<ConnId>,
    /// Warnings about refused connections, spaced out.
    refusals: RefusalLog,
}

impl Conns {
    fn new() -> Result<Self, DaemonError> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)
            .map_err(|e| io_op("epoll_create")(e.into()))?;
        Ok(Self {
            map: BTreeMap::new(),
            per_uid: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            epoll,
            next_id: 1,
            resume: Vec::new(),
            refusals: RefusalLog::default(),
        })
    }

    fn insert(&mut self, c: Conn) -> Option<ConnId> {
        let id = self.next_id;
        let interest = c.wanted();
        if epoll::add(&self.epoll, &c.stream, EventData::new_u64(id), interest).is_err() {
            return None;
        }
        self.next_id += 1;
        *self.per_uid.entry(c.uid).or_default() += 1;
        if let Some(d) = c.deadline {
            self.deadlines.insert((d, id));
        }
        self.map.insert(id, Conn { interest, ..c });
        Some(id)
    }

    fn remove(&mut self, id: ConnId) -> bool {
        let Some(c) = self.map.remove(&id) else {
            return false;
        };
        // Closing the socket takes it out of the epoll set.
        if let Some(d) = c.deadline {
            self.deadlines.remove(&(d, id));
        }
        if let Some(n) = self.per_uid.get_mut(&c.uid) {
            *n -= 1;
            if *n == 0 {
                self.per_uid.remove(&c.uid);
            }
        }
        true
    }

    fn set_deadline(&mut self, id: ConnId, d: Option<Instant>) {
        let Some(c) = self.map.get_mut(&id) else {
            return;
        };
        if c.deadline == d {
            return;
        }
        if let Some(old) = c.deadline {
            self.deadlines.remove(&(old, id));
        }
        if let Some(new) = d {
            self.deadlines.insert((new, id));
        }
        c.deadline = d;
    }

    /// Sets or clears the deadline of `id` after what happened to it: it
    /// has one while it owes the daemon something - its first message (not
    /// yet registered), the rest of a frame, taking its replies (above
    /// [`READ_HIGH_WATER`]) or its last reply (closing). A deadline runs
    /// from when it began to owe, unless it made `progress` (completed a
    /// request, or took its replies below the mark).
    fn refresh_deadline(
        &mut self,
        id: ConnId,
        registered: bool,
        progress: bool,
        now: Instant,
        frame_timeout: Duration,
    ) {
        let Some(c) = self.map.get(&id) else {
            return;
        };
        let owes = c.closing || !registered || !c.rbuf.is_empty() || c.backpressured();
        let d = match c.deadline {
            _ if !owes => None,
            Some(d) if !progress => Some(d),
            _ => Some(now + frame_timeout),
        };
        self.set_deadline(id, d);
    }

    /// Brings the epoll interest of `id` in line with its state.
    fn sync_interest(&mut self, id: ConnId) {
        let Some(c) = self.map.get_mut(&id) else {
            return;
        };
        let want = c.wanted();
        if want != c.interest
            && epoll::modify(&self.epoll, &c.stream, EventData::new_u64(id), want).is_ok()
        {
            c.interest = want;
        }
    }
}

fn earliest(times: impl IntoIterator<Item = Option<Instant>>) -> Option<Instant> {
    times.into_iter().flatten().min()
}

fn serve(
    listener: &UnixListener,
    state: &mut State,
    sig: &OwnedFd,
    frame_timeout: Duration,
) -> Result<(), DaemonError> {
    let mut conns = Conns::new()?;
    let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
    // After EMFILE and the like the listener stays readable: it is left out
    // of the poll for a moment instead of the loop sleeping or spinning.
    let mut accept_paused_until: Option<Instant> = None;
    loop {
        let now = Instant::now();
        if accept_paused_until.is_some_and(|t| t <= now) {
            accept_paused_until = None;
        }
        let wake_at = if state.spin_until().is_some() || !conns.resume.is_empty() {
            Some(now)
        } else {
            earliest([
                state.next_deadline(),
                state.warm_deadline(),
                accept_paused_until,
                conns.deadlines.first().map(|d| d.0),
                conns.refusals.due(),
                // A set that could not be emptied is tried again soon.
                state.untidy().then(|| now + Duration::from_millis(1)),
            ])
        };
        let timeout = wake_at.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        // ppoll for its nanosecond timeout; the connections are behind the
        // epoll descriptor, read without waiting when it is ready.
        let (sig_ready, accept_ready, conns_ready) = {
            let listen_for = if accept_paused_until.is_some() {
                PollFlags::empty()
            } else {
                PollFlags::IN
            };
            let mut fds = [
                PollFd::new(sig, PollFlags::IN),
                PollFd::new(listener, listen_for),
                PollFd::new(&conns.epoll, PollFlags::IN),
            ];
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io_op("poll")(e.into())),
            }
            (
                !fds[0].revents().is_empty(),
                !fds[1].revents().is_empty(),
                !fds[2].revents().is_empty(),
            )
        };
        if sig_ready {
            tracing::info!("stop requested (signal), shutting down");
            return Ok(());
        }
        // Whole requests left buffered in the last pass come first.
        let mut readable: Vec<ConnId> = std::mem::take(&mut conns.resume);
        let mut writable: Vec<ConnId> = Vec::new();
        if conns_ready {
            events.clear();
            let zero = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            match epoll::wait(&conns.epoll, spare_capacity(&mut events), Some(&zero)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io_op("epoll_wait")(e.into())),
            }
            for ev in &events {
                // Copied out: the kernel's struct is packed.
                let (flags, data) = (ev.flags, ev.data);
                let id = data.u64();
                if flags.intersects(EventFlags::OUT) {
                    writable.push(id);
                }
                if flags.intersects(EventFlags::IN | EventFlags::HUP | EventFlags::ERR) {
                    readable.push(id);
                }
            }
        }
        let now = Instant::now();
        if accept_ready && accept(listener, &mut conns, state, now + frame_timeout) {
            accept_paused_until = Some(now + Duration::from_millis(10));
        }
        for id in writable {
            let Some(c) = conns.map.get_mut(&id) else {
                continue;
            };
            let was_behind = c.backpressured();
            match c.write_out() {
                Ok(()) if c.closing && c.wbuf.is_empty() => state.to_close.push(id),
                Ok(()) => {
                    let caught_up = was_behind && !c.backpressured();
                    if c.must_resume() {
                        conns.resume.push(id);
                    }
                    let registered = state.is_app(id) || state.is_thread(id);
                    conns.refresh_deadline(id, registered, caught_up, now, frame_timeout);
                    conns.sync_interest(id);
                }
                Err(_) => state.to_close.push(id),
            }
        }
        readable.sort_unstable();
        readable.dedup();
        for id in readable {
            let handled = match handle_readable(id, &mut conns.map, state) {
                Ok(n) => n,
                Err(why) => {
                    if let Some(why) = why {
                        tracing::warn!(conn = id, reason = %why, "dropping client");
                        if let Some(c) = conns.map.get_mut(&id) {
                            c.refuse(&why);
                        }
                    }
                    state.to_close.push(id);
                    continue;
                }
            };
            if conns.map.get(&id).is_some_and(Conn::must_resume) {
                conns.resume.push(id);
            }
            let registered = state.is_app(id) || state.is_thread(id);
            conns.refresh_deadline(id, registered, handled > 0, now, frame_timeout);
        }
        let late: Vec<ConnId> = conns
            .deadlines
            .iter()
            .take_while(|d| d.0 <= now)
            .map(|d| d.1)
            .collect();
        for id in late {
            conns.set_deadline(id, None);
            if let Some(c) = conns.map.get_mut(&id) {
                let what = if c.backpressured() {
                    "client does not take its replies; dropping it"
                } else {
                    "client too slow to complete a frame; dropping it"
                };
                tracing::warn!(conn = id, pid = c.pid, uid = c.uid, "{what}");
                c.refuse("timed out");
                state.to_close.push(id);
            }
        }
        state.expire(now);
        conns.refusals.flush(now);
        flush(&mut conns, state, frame_timeout);
        // After the replies: a grant's wake-up is not delayed by these writes.
        state.sync_warm(Instant::now());
        // Likewise: sets of cores given back are emptied now, not at their
        // next grant.
        state.tidy();
    }
}

/// Connections accepted in one pass of the loop, at most.
///
/// A local user who connects and closes in a loop keeps the backlog from
/// ever emptying: accepting until it was empty served nobody else for as
/// long as the flood lasted (registered clients' requests, the frame
/// deadlines, forced reclaims: a holder that flooded kept its core). The
/// listener is polled level-triggered, so what is left is taken in the
/// next pass, after the clients and the deadlines.
const ACCEPTS_PER_PASS: usize = 64;

/// Warnings about refused connections: counted per reason and user, and
/// written at most once a [`REFUSAL_LOG_EVERY`], one line per reason and
/// user with the count since the last (the count left when a flood stops
/// is written by the loop's next pass after the interval). A flood would
/// otherwise write a line per connection (about 50 000 a second here),
/// and a rate-limited journal would then drop the daemon's other
/// messages.
#[derive(Default)]
struct RefusalLog {
    last: Option<Instant>,
    unlogged: BTreeMap<(Refusal, u32), u64>,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Refusal {
    /// The daemon's cap on connections in all ([`MAX_CONNECTIONS`]).
    DaemonFull,
    /// The user's `max_connections`.
    UserCap,
}

/// See [`RefusalLog`].
const REFUSAL_LOG_EVERY: Duration = Duration::from_secs(1);

impl RefusalLog {
    /// A connection of `uid` refused at `now` for `why`.
    fn refused(&mut self, now: Instant, why: Refusal, uid: u32) {
        *self.unlogged.entry((why, uid)).or_insert(0) += 1;
        self.flush(now);
    }

    /// When counted refusals are due to be written (the loop wakes then).
    fn due(&self) -> Option<Instant> {
        if self.unlogged.is_empty() {
            return None;
        }
        Some(
            self.last
                .map_or_else(Instant::now, |t| t + REFUSAL_LOG_EVERY),
        )
    }

    /// What was counted, per reason and user, if the interval since the
    /// last warning has passed at `now` (and nothing otherwise).
    fn take_due(&mut self, now: Instant) -> BTreeMap<(Refusal, u32), u64> {
        if self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < REFUSAL_LOG_EVERY)
        {
            return BTreeMap::new();
        }
        let due = std::mem::take(&mut self.unlogged);
        if !due.is_empty() {
            self.last = Some(now);
        }
        due
    }

    /// Writes what was counted, if the interval since the last warning
    /// has passed.
    fn flush(&mut self, now: Instant) {
        for ((why, uid), n) in self.take_due(now) {
            match why {
                Refusal::DaemonFull => tracing::warn!(
                    uid,
                    refused = n,
                    "too many connections in all; refused (count since the last warning)"
                ),
                Refusal::UserCap => tracing::warn!(
                    uid,
                    refused = n,
                    "user has too many connections; refused (count since the last warning)"
                ),
            }
        }
    }
}

/// Accepts up to [`ACCEPTS_PER_PASS`] pending connections, enforcing the
/// global and per-user caps. Returns whether accepting should pause (out
/// of descriptors).
fn accept(
    listener: &UnixListener,
    conns: &mut Conns,
    state: &mut State,
    first_message_by: Instant,
) -> bool {
    for _ in 0..ACCEPTS_PER_PASS {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed; pausing new connections");
                return true;
            }
        };
        let cred = match rustix::net::sockopt::socket_peercred(&stream) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "no peer credentials; dropping");
                continue;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        // A small send buffer: what a client that does not read can make
        // the daemon produce before it stops reading that client (the
        // kernel doubles the value; a status table waits in the output
        // buffer instead).
        let _ = rustix::net::sockopt::set_socket_send_buffer_size(&stream, CLIENT_SNDBUF);
        let uid = cred.uid.as_raw();
        let mut c = Conn {
            stream,
            rbuf: Vec::new(),
            wbuf: Vec::new(),
            pid: cred.pid.as_raw_nonzero().get() as u32,
            uid,
            closing: false,
            deadline: Some(first_message_by),
            interest: EventFlags::empty(),
        };
        let max = state.limits_for(uid).max_connections;
        let open = conns.per_uid.get(&uid).copied().unwrap_or(0);
        if conns.map.len() >= MAX_CONNECTIONS {
            conns
                .refusals
                .refused(Instant::now(), Refusal::DaemonFull, uid);
            c.refuse("the daemon has too many connections");
            continue;
        }
        if open >= max {
            conns
                .refusals
                .refused(Instant::now(), Refusal::UserCap, uid);
            c.refuse(&format!(
                "user {uid} already has {max} connections (max_connections)"
            ));
            continue;
        }
        if conns.insert(c).is_none() {
            tracing::warn!(uid, "could not watch a new connection; dropping it");
        }
    }
    false
}

/// Queues the replies, writes what the sockets take, and closes what must
/// be closed, until stable. Never waits for a client.
fn flush(conns: &mut Conns, state: &mut State, frame_timeout: Duration) {
    let mut touched: Vec<ConnId> = Vec::new();
    loop {
        for (id, resp) in std::mem::take(&mut state.outbox) {
            if let Some(c) = conns.map.get_mut(&id) {
                c.wbuf.extend(encode_response(&resp));
                touched.push(id);
            }
        }
        touched.sort_unstable();
        touched.dedup();
        for id in touched.drain(..) {
            let Some(c) = conns.map.get_mut(&id) else {
                continue;
            };
            match c.write_out() {
                Err(e) => {
                    tracing::warn!(conn = id, error = %e, "write failed; dropping client");
                    state.to_close.push(id);
                }
                Ok(()) if c.wbuf.len() > MAX_OUTPUT => {
                    tracing::warn!(
                        conn = id,
                        pid = c.pid,
                        uid = c.uid,
                        queued = c.wbuf.len(),
                        "client does not read its replies; dropping it"
                    );
                    state.to_close.push(id);
                }
                Ok(()) if c.closing && c.wbuf.is_empty() => state.to_close.push(id),
                Ok(()) => {
                    // It may have caught up here (a reply of the daemon's
                    // own, such as a grant, found its socket drained).
                    if c.must_resume() {
                        conns.resume.push(id);
                    }
                    // A closing connection must take its last reply, a
                    // client behind on its replies must catch up.
                    let registered = state.is_app(id) || state.is_thread(id);
                    conns.refresh_deadline(id, registered, false, Instant::now(), frame_timeout);
                    conns.sync_interest(id);
                }
            }
        }
        let close = std::mem::take(&mut state.to_close);
        if close.is_empty() && state.outbox.is_empty() {
            break;
        }
        for id in close {
            if conns.remove(id) {
                state.remove_conn(id);
            }
        }
    }
}

/// Handles the requests of `id`, buffered first, then read from its
/// socket: at most [`MAX_REQUESTS_PER_WAKE`] of them and
/// [`MAX_READ_CHUNKS`] reads, and none while it is behind in taking its
/// replies ([`READ_HIGH_WATER`]; if it hangs up meanwhile, its socket
/// turns writable and the failed write closes it). Returns how many
/// requests were handled; `Err(Some(reason))` drops a misbehaving client,
/// `Err(None)` a closed one.
fn handle_readable(
    id: ConnId,
    conns: &mut BTreeMap<ConnId, Conn>,
    state: &mut State,
) -> Result<usize, Option<String>> {
    let mut chunk = [0u8; 512];
    let (mut handled, mut reads, mut drained) = (0, 0, false);
    loop {
        let Some(c) = conns.get_mut(&id) else {
            return Ok(handled);
        };
        if c.closing || c.backpressured() {
            // Its requests wait in its socket until it takes its replies.
            return Ok(handled);
        }
        if handled == MAX_REQUESTS_PER_WAKE {
            return Ok(handled);
        }
        match decode_request(&c.rbuf) {
            Ok(Some((req, used))) => {
                c.rbuf.drain(..used);
                handle_request(id, req, conns, state)?;
                handled += 1;
                continue;
            }
            Ok(None) => {}
            Err(e) => return Err(Some(format!("malformed message: {e}"))),
        }
        // Short read: the socket is (almost surely) drained; poll tells us
        // if more arrives. Saves an EAGAIN read per message.
        if drained || reads == MAX_READ_CHUNKS {
            return Ok(handled);
        }
        reads += 1;
        let n = match c.stream.read(&mut chunk) {
            Ok(0) => return Err(None),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(handled),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(None),
        };
        c.rbuf.extend_from_slice(&chunk[..n]);
        drained = n < chunk.len();
    }
}

fn handle_request(
    id: ConnId,
    req: Request,
    conns: &mut BTreeMap<ConnId, Conn>,
    state: &mut State,
) -> Result<(), Option<String>> {
    let Some(c) = conns.get_mut(&id) else {
        return Ok(());
    };
    let fresh = !state.is_app(id) && !state.is_thread(id) && !c.closing;
    match req {
        Request::HelloApp if fresh => {
            let peer = match task::peer_pidfd(c.stream.as_fd()) {
                Ok(p) => p,
                Err(e) => match e.raw_os_error() {
                    // The connecting process is gone (see `peer_pidfd`):
                    // its pid may be someone else's by now.
                    Some(libc::EINVAL | libc::ESRCH | libc::ENODATA) => {
                        return Err(Some(state::Reject::ProcessGone(c.pid).to_string()));
                    }
                    // The daemon's own limits: the client may try again.
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOMEM) => {
                        return Err(Some(format!(
                            "the daemon is out of resources ({e}); try again"
                        )));
                    }
                    // Refused by something else (a seccomp filter, say):
                    // registered without the check, as on kernels
                    // without the option.
                    _ => {
                        tracing::warn!(
                            conn = id,
                            error = %e,
                            "SO_PEERPIDFD failed; registering without the pid-reuse check"
                        );
                        None
                    }
                },
            };
            let app = state
                .add_app(id, c.pid, c.uid, peer)
                .map_err(|e| Some(e.to_string()))?;
            let bytes = encode_response(&Response::Welcome {
                app_token: app.token(),
            });
            let fds = [app.shm().fd()];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = SendAncillaryBuffer::new(&mut space);
            if !anc.push(SendAncillaryMessage::ScmRights(&fds)) {
                return Err(Some("ancillary buffer too small".into()));
            }
            // A new connection: its socket buffer is empty, so this does not
            // block; what it does not take waits in the output buffer.
            let sent = rustix::net::sendmsg(
                c.stream.as_fd(),
                &[IoSlice::new(&bytes)],
                &mut anc,
                SendFlags::NOSIGNAL,
            )
            .map_err(|e| Some(format!("sending welcome: {e}")))?;
            c.wbuf.extend_from_slice(&bytes[sent.min(bytes.len())..]);
            Ok(())
        }
        Request::AttachThread { app_token, tid } if fresh => {
            let pid = c.pid;
            state
                .attach_thread(id, app_token, tid, pid)
                .map_err(|e| Some(format!("attach refused: {e}")))
        }
        Request::StatusQuery if fresh => {
            c.closing = true;
            let entries = state.status();
            state.outbox.push((id, Response::Status { entries }));
            Ok(())
        }
        Request::SetRequestedCores { counts } if state.is_app(id) => {
            state.set_requested(id, counts);
            Ok(())
        }
        Request::ReplaceThread { tid } if state.is_thread(id) => {
            // A refusal is an answer: the connection and its core stay
            // (logged at debug level: a client may repeat it at will).
            if let Err(e) = state.replace_thread(id, tid, c.pid) {
                tracing::debug!(conn = id, pid = c.pid, tid, reason = %e, "thread replacement refused");
                state.outbox.push((
                    id,
                    Response::Error {
                        message: format!("replace refused: {e}"),
                    },
                ));
            }
            Ok(())
        }
        Request::BlockUntilCoreAvailable if state.is_thread(id) => {
            state.block(id);
            Ok(())
        }
        other => Err(Some(format!(
            "{other:?} not allowed on this connection (fd {})",
            c.stream.as_raw_fd()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn refusals_are_counted_per_reason_and_user_and_written_once_a_second() {
        let t0 = std::time::Instant::now();
        let mut log = RefusalLog::default();
        // The first refusal is written at once.
        log.unlogged.insert((Refusal::UserCap, 7), 1);
        assert_eq!(
            log.take_due(t0).into_iter().collect::<Vec<_>>(),
            vec![((Refusal::UserCap, 7), 1)]
        );
        // Then counted, per reason and user, until the interval passes.
        for _ in 0..1000 {
            *log.unlogged.entry((Refusal::UserCap, 7)).or_insert(0) += 1;
        }
        *log.unlogged.entry((Refusal::DaemonFull, 8)).or_insert(0) += 1;
        assert!(log.take_due(t0 + REFUSAL_LOG_EVERY / 2).is_empty());
        assert_eq!(log.due(), Some(t0 + REFUSAL_LOG_EVERY));
        let due: Vec<_> = log.take_due(t0 + REFUSAL_LOG_EVERY).into_iter().collect();
        assert_eq!(
            due,
            vec![((Refusal::DaemonFull, 8), 1), ((Refusal::UserCap, 7), 1000)]
        );
        assert_eq!(log.due(), None);
    }

    fn access(mode: u32) -> SocketAccess {
        SocketAccess {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            mode,
        }
    }

    /// The socket's mode is set on the socket file; a path swapped for a
    /// symlink (or any other file) is refused and its target left alone.
    #[test]
    fn socket_access_is_set_on_the_socket_never_through_a_link() {
        let dir = std::env::temp_dir().join(format!("cw-sockaccess-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("arbiter.sock");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        set_socket_access(&sock, &access(0o640)).unwrap();
        assert_eq!(
            std::fs::symlink_metadata(&sock).unwrap().mode() & 0o777,
            0o640
        );

        let victim = dir.join("victim");
        std::fs::write(&victim, "x").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("swapped.sock");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        assert!(set_socket_access(&link, &access(0o666)).is_err());
        assert!(
            set_socket_access(&victim, &access(0o666)).is_err(),
            "not a socket"
        );
        assert_eq!(std::fs::metadata(&victim).unwrap().mode() & 0o777, 0o600);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
