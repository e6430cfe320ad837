//! Where cores come from.
//!
//! The runtime starts one kernel thread per CPU it may ever use. Each one
//! loops: [`CoreArbiter::block_until_core_available`] (sleep until granted a
//! core; return confined to it), run the dispatcher while it holds the core,
//! and give the core back when [`CoreArbiter::must_release_core`] says so.
//! This is Arachne's arbiter protocol, with two implementations:
//!
//! - [`Local`] (the default) implements it in process from the CPU budget,
//!   so no daemon is needed;
//! - [`Daemon`] is a client of the `corewise-arbiter` daemon, which owns the
//!   machine's cores and shares them out between applications by priority.
//!
//! Which one a runtime uses is [`ArbiterChoice`]: set it with
//! [`Builder::arbiter`](crate::Builder::arbiter) or
//! [`Builder::arbiter_socket`](crate::Builder::arbiter_socket), or leave it
//! at [`ArbiterChoice::Auto`] and set the environment variable
//! [`ARBITER_ENV`] (`COREWISE_ARBITER=/run/corewise-arbiter.sock`).
//!
//! A daemon the program asked for by name ([`ArbiterChoice::Daemon`],
//! `Builder::arbiter_socket`) that cannot be reached at start fails the
//! build with [`BuildError::ArbiterUnreachable`](crate::BuildError): the
//! caller said where its cores must come from, and silently taking them
//! from elsewhere would defeat the daemon's sharing between applications.
//! A fallback is a choice the caller makes explicitly
//! ([`ArbiterChoice::DaemonOrLocal`], `Builder::arbiter_socket_or_local`),
//! and so is the environment variable: a deployment setting for an
//! optional system service, so an unreachable daemon there logs one
//! warning and the runtime runs with [`Local`].

mod daemon;
mod escape;
mod local;

pub use daemon::{Daemon, DEFAULT_RELEASE_POLL};
pub(crate) use escape::is_daemon_set;
pub use local::Local;

use crate::policy::PRIORITIES;
use std::path::PathBuf;
use std::time::Duration;
use thiserror::Error;

/// The environment variable naming the daemon's socket; it selects the
/// [`Daemon`] arbiter when the builder's choice is [`ArbiterChoice::Auto`].
/// Unset or empty means [`Local`].
///
/// ```
/// use corewise::arbiter::{ArbiterKind, ARBITER_ENV};
/// assert_eq!(ARBITER_ENV, "COREWISE_ARBITER");
/// // Set by a deployment to a daemon that is not running: one warning, and the
/// // runtime takes its cores in process.
/// std::env::set_var(ARBITER_ENV, "/nonexistent/corewise-arbiter.sock");
/// let rt = corewise::Runtime::new().unwrap();
/// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
/// ```
pub const ARBITER_ENV: &str = "COREWISE_ARBITER";

/// An arbiter failure.
///
/// ```
/// use corewise::arbiter::{ArbiterError, CoreArbiter, Daemon, Local};
/// let err = Local::new(vec![]).block_until_core_available(0).unwrap_err();
/// assert!(matches!(err, ArbiterError::NoSuchThread(0)));
/// let Err(err) = Daemon::connect("/nonexistent/corewise-arbiter.sock", 1, 0) else {
///     panic!("no daemon listens there")
/// };
/// assert!(matches!(err, ArbiterError::Daemon(_)));
/// assert!(err.to_string().contains("/nonexistent/corewise-arbiter.sock"));
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ArbiterError {
    /// The kernel thread could not be confined to its core.
    #[error("cannot pin kernel thread to CPU {cpu}: {source}")]
    Pin {
        /// The CPU.
        cpu: usize,
        /// The OS error.
        source: std::io::Error,
    },
    /// The kernel thread index is not one the arbiter knows.
    #[error("no kernel thread {0}")]
    NoSuchThread(usize),
    /// Talking to the core arbiter daemon failed.
    #[error(transparent)]
    Daemon(#[from] corewise_arbiter::ClientError),
}

/// Which implementation an arbiter is.
///
/// ```
/// use corewise::{ArbiterChoice, ArbiterKind};
/// let rt = corewise::Runtime::builder()
///     .arbiter(ArbiterChoice::DaemonOrLocal("/nonexistent/corewise-arbiter.sock".into()))
///     .build()
///     .unwrap();
/// // No daemon there: the cores come from the in-process arbiter.
/// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
/// assert_eq!(rt.stats().arbiter, ArbiterKind::Local);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ArbiterKind {
    /// [`Local`]: in process, from the CPU budget.
    Local,
    /// [`Daemon`]: a client of the `corewise-arbiter` daemon.
    Daemon,
}

/// Where a runtime gets its cores (see the [module docs](self)).
///
/// ```
/// use corewise::arbiter::{ArbiterChoice, ArbiterKind};
/// let rt = corewise::Runtime::builder()
///     .arbiter(ArbiterChoice::Local)
///     .build()
///     .unwrap();
/// assert_eq!(rt.arbiter_kind(), ArbiterKind::Local);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArbiterChoice {
    /// The daemon named by [`ARBITER_ENV`] if it is set, else [`Local`].
    #[default]
    Auto,
    /// Always the in-process arbiter.
    Local,
    /// The daemon listening on this socket; building fails with
    /// [`BuildError::ArbiterUnreachable`](crate::BuildError::ArbiterUnreachable)
    /// if it cannot be reached at start.
    Daemon(PathBuf),
    /// The daemon listening on this socket, or [`Local`] (with one warning
    /// logged through `tracing`) if it cannot be reached at start.
    DaemonOrLocal(PathBuf),
}

/// The arbiter protocol, as the runtime's kernel threads use it.
///
/// ```
/// use corewise::arbiter::{ArbiterKind, CoreArbiter, Local};
/// use std::sync::Arc;
/// let cpu = corewise::cpu_budget().unwrap().cpus().iter().next().unwrap();
/// let arbiter: Arc<dyn CoreArbiter> = Arc::new(Local::new(vec![cpu]));
/// assert_eq!(arbiter.kind(), ArbiterKind::Local);
/// arbiter.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
/// assert_eq!(arbiter.granted(), 1);
/// // A kernel thread's loop: wait for a core, run while it may, give it back.
/// let (a, (tx, rx)) = (arbiter.clone(), std::sync::mpsc::channel());
/// let kthread = std::thread::spawn(move || {
///     let got = a.block_until_core_available(0).unwrap();
///     tx.send(()).unwrap();
///     while !a.must_release_core(0) {
///         std::thread::yield_now(); // the dispatcher would run threads here
///     }
///     a.core_released(0);
///     got
/// });
/// rx.recv().unwrap(); // it holds the core
/// arbiter.set_requested_cores([0; corewise::PRIORITIES]); // and is asked to give it back
/// assert_eq!(kthread.join().unwrap(), Some(cpu));
/// arbiter.shutdown();
/// assert_eq!(arbiter.block_until_core_available(0).unwrap(), None);
/// ```
pub trait CoreArbiter: Send + Sync + 'static {
    /// The application wants `per_priority[i]` cores at priority `i`.
    fn set_requested_cores(&self, per_priority: [u32; PRIORITIES]);

    /// Kernel thread `kthread` sleeps until it is granted a core and returns
    /// the core's CPU, or `None` once the arbiter is shut down. (Under a
    /// partial [`Local`] grant the thread may run on any of the runtime's
    /// CPUs; the CPU returned is the one it is pinned to under a full grant.)
    fn block_until_core_available(&self, kthread: usize) -> Result<Option<usize>, ArbiterError>;

    /// Whether kernel thread `kthread` must give its core back.
    fn must_release_core(&self, kthread: usize) -> bool;

    /// Kernel thread `kthread` has stopped using its core.
    fn core_released(&self, kthread: usize);

    /// Cores granted now.
    fn granted(&self) -> usize;

    /// Ends the protocol: every kernel thread is told to release and
    /// `block_until_core_available` returns `None`.
    fn shutdown(&self);

    /// Which implementation this is.
    fn kind(&self) -> ArbiterKind;

    /// Whether [`core_handed_over`](Self::core_handed_over) can place a
    /// spare kernel thread on a granted core (default: no, and the runtime
    /// then runs without blocking handoff).
    ///
    /// ```
    /// use corewise::arbiter::{CoreArbiter, Local};
    /// assert!(Local::new(vec![0]).supports_handoff());
    /// ```
    fn supports_handoff(&self) -> bool {
        false
    }

    /// The runtime handed kernel thread `kthread`'s core to another kernel
    /// thread, `tid` (its first one is blocked in the kernel): place `tid`
    /// where `kthread` ran, and treat it as `kthread` from now on.
    ///
    /// ```
    /// use corewise::arbiter::{CoreArbiter, Local};
    /// let a = Local::new(vec![0]);
    /// a.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0]);
    /// let tid = rustix::thread::gettid().as_raw_nonzero().get();
    /// assert!(a.core_handed_over(0, tid).is_ok());
    /// ```
    fn core_handed_over(&self, kthread: usize, tid: i32) -> Result<(), ArbiterError> {
        let _ = (kthread, tid);
        Ok(())
    }

    /// How long an idle dispatcher may sleep before it looks at
    /// [`must_release_core`](Self::must_release_core) again. `None` (the
    /// default): the arbiter's changes come through
    /// [`set_requested_cores`](Self::set_requested_cores), after which the
    /// runtime wakes its sleeping cores itself; an arbiter whose release
    /// requests arrive from elsewhere (a daemon writing shared memory) needs
    /// a bound.
    fn release_poll(&self) -> Option<Duration> {
        None
    }

    /// Whether the arbiter counts on a
    /// [`set_requested_cores`](Self::set_requested_cores) every estimation
    /// window even when the request does not change (the default: yes; the
    /// daemon's client notices a lost daemon and reconnects on those calls).
    /// An arbiter that answers no lets the runtime's core manager sleep
    /// while the runtime may hold only one number of cores.
    ///
    /// ```
    /// use corewise::arbiter::{CoreArbiter, Local};
    /// assert!(!Local::new(vec![0]).needs_periodic_requests());
    /// ```
    fn needs_periodic_requests(&self) -> bool {
        true
    }
}

/// Connects to the daemon `choice` names, if it names one, for requests at
/// priority `priority` (0 highest). `Ok(None)`: use [`Local`]. A daemon
/// that cannot be reached is an error for [`ArbiterChoice::Daemon`]; for
/// [`ArbiterChoice::DaemonOrLocal`] and [`ARBITER_ENV`] it is logged once,
/// as a warning, and gives `Ok(None)`.
pub(crate) fn choose(
    choice: &ArbiterChoice,
    priority: usize,
) -> Result<Option<Daemon>, crate::BuildError> {
    let (socket, required) = match choice {
        ArbiterChoice::Local => return Ok(None),
        ArbiterChoice::Daemon(p) => (p.clone(), true),
        ArbiterChoice::DaemonOrLocal(p) => (p.clone(), false),
        ArbiterChoice::Auto => match std::env::var_os(ARBITER_ENV).filter(|v| !v.is_empty()) {
            Some(v) => (PathBuf::from(v), false),
            None => return Ok(None),
        },
    };
    match Daemon::connect(&socket, 1, priority) {
        Ok(d) => {
            tracing::debug!(socket = %socket.display(), priority, "cores come from the core arbiter daemon");
            Ok(Some(d))
        }
        Err(source) if required => Err(crate::BuildError::ArbiterUnreachable { socket, source }),
        Err(e) => {
            tracing::warn!(
                socket = %socket.display(),
                error = %e,
                "core arbiter daemon unreachable; using the in-process arbiter"
            );
            Ok(None)
        }
    }
}

/// The machine's online CPUs (`/sys/devices/system/cpu/online`).
pub(crate) fn online_cpus() -> Option<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").ok()?;
    let list = crate::budget::CpuList::parse(text.trim()).ok()?;
    let v = list.to_vec();
    (!v.is_empty()).then_some(v)
}
