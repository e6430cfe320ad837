//! The runtime's error types.

use thiserror::Error;

/// Why a user thread could not be created.
///
/// ```
/// use corewise::SpawnError;
/// assert_eq!(corewise::spawn(|| ()).unwrap_err(), SpawnError::NotInRuntime);
/// let rt = corewise::Runtime::new().unwrap();
/// let err = corewise::thread::Builder::new().core(64).spawn_in(&rt, || ()).unwrap_err();
/// assert_eq!(err, SpawnError::CoreUnavailable(64));
/// assert_eq!(err.to_string(), "core 64 is not an active core of this runtime");
/// ```
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpawnError {
    /// The runtime's limit on live threads (`Builder::max_threads`, which
    /// counts the threads beyond those its cores' slots hold) is reached:
    /// a thread must end first (`spawn_wait` waits for that).
    #[error("the runtime's limit of {limit} user threads is reached (Builder::max_threads)")]
    ThreadLimit {
        /// The limit.
        limit: usize,
    },
    /// The core policy names no core for this thread class right now (for
    /// example every core is already held by an exclusive thread). Not
    /// returned when no core runs at all (the runtime between cores): the
    /// thread then waits for the next core.
    #[error("the core policy has no core for a {0:?} thread")]
    NoCoreForClass(crate::policy::ThreadClass),
    /// The requested core does not exist or is not held by the runtime now.
    #[error("core {0} is not an active core of this runtime")]
    CoreUnavailable(usize),
    /// Called outside a user thread with no runtime to spawn into.
    #[error("not inside a corewise user thread: run the program's work in a runtime with corewise::run(|| ..), or build one with corewise::Runtime::new() and use Runtime::spawn / Runtime::block_on")]
    NotInRuntime,
    /// The runtime is shutting down.
    #[error("the runtime is shutting down")]
    ShuttingDown,
    /// The slot's stack could not be allocated.
    #[error("cannot allocate a thread stack: {0}")]
    Stack(String),
}

/// Why a runtime could not be built.
///
/// ```
/// use corewise::BuildError;
/// let err = corewise::Runtime::builder().stack_size(1024).build().err().unwrap();
/// assert!(matches!(&err, BuildError::Invalid(why) if why.contains("stack size")));
/// let err = corewise::Runtime::builder().cpus([100_000]).build().err().unwrap();
/// let BuildError::NoCpus { requested, allowed } = err else { panic!("{err}") };
/// assert_eq!(requested, [100_000]);
/// assert!(!allowed.is_empty());
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BuildError {
    /// No CPU is left after intersecting the requested CPUs with the
    /// process's affinity.
    #[error("no usable CPU: requested {requested:?}, allowed {allowed:?}")]
    NoCpus {
        /// CPUs asked for in the builder (empty: all).
        requested: Vec<usize>,
        /// CPUs in the process's affinity mask.
        allowed: Vec<usize>,
    },
    /// More CPUs than one runtime supports.
    #[error("{0} CPUs requested; a runtime supports at most 64")]
    TooManyCpus(usize),
    /// A setting is out of range.
    #[error("invalid setting: {0}")]
    Invalid(String),
    /// The core arbiter daemon named with `Builder::arbiter_socket` (or
    /// [`ArbiterChoice::Daemon`](crate::ArbiterChoice::Daemon)) cannot be
    /// reached. Start `corewise-arbiter`, fix the path, or ask for a
    /// fallback with `Builder::arbiter_socket_or_local`.
    #[cfg(not(loom))]
    #[error("core arbiter daemon at {} unreachable ({source}); start corewise-arbiter there, or use Builder::arbiter_socket_or_local to fall back to the in-process arbiter", socket.display())]
    ArbiterUnreachable {
        /// The socket asked for.
        socket: std::path::PathBuf,
        /// Why connecting failed.
        source: crate::arbiter::ArbiterError,
    },
    /// A kernel thread or other OS resource could not be created.
    #[error("system error: {0}")]
    Os(#[from] std::io::Error),
}

/// A user thread ended by panicking; `join` returns its payload.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let err = rt.spawn(|| -> () { panic!("disk {} full", 3) }).unwrap().join().unwrap_err();
/// assert_eq!(err.message, "disk 3 full");
/// assert_eq!(err.to_string(), "user thread panicked: disk 3 full");
/// // Re-raise it in the joiner, as std's `resume_unwind` does.
/// let raise = std::panic::AssertUnwindSafe(move || std::panic::resume_unwind(err.payload.0));
/// let again = std::panic::catch_unwind(raise);
/// assert!(again.is_err());
/// ```
#[derive(Debug, Error)]
#[error("user thread panicked: {message}")]
pub struct JoinError {
    /// The panic message, when it was a string.
    pub message: String,
    /// The panic payload, for `std::panic::resume_unwind`.
    pub payload: PanicPayload,
}

/// A panic payload (wrapped so `JoinError` can be `Debug`).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let h = rt.spawn(|| std::panic::panic_any(42u32)).unwrap();
/// let err = h.join().unwrap_err();
/// assert_eq!(err.message, "<non-string panic payload>");
/// assert_eq!(*err.payload.0.downcast::<u32>().unwrap(), 42);
/// ```
pub struct PanicPayload(pub Box<dyn std::any::Any + Send + 'static>);

impl std::fmt::Debug for PanicPayload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PanicPayload(..)")
    }
}

impl JoinError {
    pub(crate) fn from_panic(payload: Box<dyn std::any::Any + Send + 'static>) -> Self {
        let message = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_owned()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "<non-string panic payload>".to_owned()
        };
        Self {
            message,
            payload: PanicPayload(payload),
        }
    }
}
