//! Client library: what a thread library (the corewise runtime, or any other)
//! links to talk to the daemon.
//!
//! Why this shape (Arachne's): one control socket per application for core
//! requests, one socket per kernel thread so that a thread without a core can
//! sleep in `read` on it, and a read-only shared page so that
//! [`CoreThread::must_release_core`] is a memory load.
//!
//! ```no_run
//! use corewise_arbiter::client::Client;
//! let client = Client::connect("/run/corewise-arbiter.sock")?;
//! client.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
//! let worker = client.clone();
//! std::thread::spawn(move || -> Result<(), corewise_arbiter::client::ClientError> {
//!     let mut me = worker.thread()?; // on the kernel thread that will run
//!     loop {
//!         let core = me.block_until_core_available()?;
//!         // ... confined to `core`: run the dispatcher ...
//!         while !me.must_release_core() { std::hint::spin_loop(); }
//!         let _ = core;
//!     }
//! });
//! # Ok::<(), corewise_arbiter::client::ClientError>(())
//! ```

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
use thiserror::Error;

use crate::protocol::{
    decode_response, encode_request, DecodeError, Request, Response, StatusEntry, PRIORITY_LEVELS,
};
use crate::shm::{SharedPageReader, ShmError};
use crate::topology::CoreId;

/// Errors seen by clients.
///
/// ```
/// use corewise_arbiter::client::{Client, ClientError};
/// let nowhere = std::env::temp_dir().join(format!("no-arbiter-{}.sock", std::process::id()));
/// let err = Client::connect(&nowhere).err().unwrap();
/// assert!(matches!(err, ClientError::Connect { .. }));
/// assert!(err.to_string().starts_with("cannot connect to the core arbiter"));
/// ```
#[derive(Debug, Error)]
pub enum ClientError {
    /// Could not connect to the daemon's socket.
    #[error("cannot connect to the core arbiter at {path}: {source}")]
    Connect {
        /// Socket path.
        path: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// The daemon closed the connection: it exited, restarted, or dropped us.
    #[error("the core arbiter is gone (connection closed)")]
    DaemonGone,
    /// Socket I/O failed.
    #[error("core arbiter socket: {0}")]
    Io(#[from] io::Error),
    /// The daemon sent bytes we could not decode.
    #[error("core arbiter protocol: {0}")]
    Protocol(#[from] DecodeError),
    /// The daemon sent a valid message that makes no sense here.
    #[error("unexpected message from the core arbiter: {0}")]
    Unexpected(String),
    /// The shared page could not be used.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The daemon refused this connection and closed it (the reason it
    /// gave: a limit reached, a protocol version it does not speak, ...).
    #[error("the core arbiter refused: {0}")]
    Refused(String),
    /// The daemon accepted the connection but did not answer in time (it
    /// is stopped, or stuck): a query gives up instead of waiting forever.
    #[error("the core arbiter did not answer within {0:?}")]
    NoAnswer(Duration),
}

fn is_gone(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::UnexpectedEof
    )
}

/// A framed connection to the daemon.
struct Conn {
    stream: UnixStream,
    buf: Vec<u8>,
}

impl Conn {
    fn open(path: &Path) -> Result<Self, ClientError> {
        let stream = UnixStream::connect(path).map_err(|source| ClientError::Connect {
            path: path.to_path_buf(),
            source,
        })?;
        Ok(Self {
            stream,
            buf: Vec::new(),
        })
    }

    fn send(&mut self, req: &Request) -> Result<(), ClientError> {
        self.stream.write_all(&encode_request(req)).map_err(|e| {
            if is_gone(&e) {
                ClientError::DaemonGone
            } else {
                ClientError::Io(e)
            }
        })
    }

    fn take_frame(&mut self) -> Result<Option<Response>, ClientError> {
        match decode_response(&self.buf)? {
            Some((Response::Error { message }, used)) => {
                // Taken off: a refused `ReplaceThread` leaves the
                // connection open, and the next answer follows it.
                self.buf.drain(..used);
                Err(ClientError::Refused(message))
            }
            Some((msg, used)) => {
                self.buf.drain(..used);
                Ok(Some(msg))
            }
            None => Ok(None),
        }
    }

    fn recv(&mut self) -> Result<Response, ClientError> {
        loop {
            if let Some(m) = self.take_frame()? {
                return Ok(m);
            }
            let mut chunk = [0u8; 4096];
            let n = match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ClientError::DaemonGone),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_gone(&e) => return Err(ClientError::DaemonGone),
                Err(e) => return Err(e.into()),
            };
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Receives a frame that carries a file descriptor (the shared page).
    fn recv_with_fd(&mut self) -> Result<(Response, Option<OwnedFd>), ClientError> {
        let mut fd = None;
        loop {
            if let Some(m) = self.take_frame()? {
                return Ok((m, fd));
            }
            let mut chunk = [0u8; 256];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = RecvAncillaryBuffer::new(&mut space);
            let r = rustix::net::recvmsg(
                &self.stream,
                &mut [IoSliceMut::new(&mut chunk)],
                &mut anc,
                RecvFlags::CMSG_CLOEXEC,
            );
            let n = match r {
                Ok(r) if r.bytes == 0 => return Err(ClientError::DaemonGone),
                Ok(r) => r.bytes,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(io::Error::from(e).into()),
            };
            for msg in anc.drain() {
                if let RecvAncillaryMessage::ScmRights(fds) = msg {
                    for f in fds {
                        fd.get_or_insert(f);
                    }
                }
            }
            self.buf.extend_from_slice(&chunk[..n.min(chunk.len())]);
        }
    }
}

struct Inner {
    path: PathBuf,
    control: Mutex<Conn>,
    token: u64,
    shm: SharedPageReader,
}

/// A connection of one application to the daemon. Cheap to clone; share it
/// with every kernel thread.
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
/// use corewise_arbiter::client::Client;
/// # let Some((daemon, socket)) = test_daemon("client", |_| {})? else { return Ok(()) };
/// // `socket`: where a daemon listens (here one started in-process).
/// let app = Client::connect(&socket)?;
/// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
/// let worker = app.clone();
/// let held = std::thread::spawn(move || -> Result<Vec<u32>, corewise_arbiter::ClientError> {
///     let mut me = worker.thread()?;
///     let core = me.block_until_core_available()?;
///     assert_eq!(rustix::thread::sched_getcpu() as u32, core);
///     Ok(worker.owned_cores())
/// })
/// .join()
/// .unwrap()?;
/// assert_eq!(held.len(), 1);
/// # drop(app);
/// # daemon.stop()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// The daemon's answer to [`Client::set_requested_cores`].
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
/// use corewise_arbiter::client::{Client, RequestAck};
/// # let Some((daemon, socket)) = test_daemon("ack", |o| o.config.defaults.max_cores = 2)? else { return Ok(()) };
/// // The daemon on `socket` lets this user hold 2 cores.
/// let app = Client::connect(&socket)?;
/// let ack = app.set_requested_cores([0, 1, 0, 3, 0, 0, 0, 0])?;
/// assert_eq!(ack, RequestAck { effective: [0, 1, 0, 1, 0, 0, 0, 0], clipped: true });
/// # drop(app);
/// # daemon.stop()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestAck {
    /// The request as applied, after the user's limits.
    pub effective: [u32; PRIORITY_LEVELS],
    /// Whether the request was clipped.
    pub clipped: bool,
}

/// Connects to the daemon at `socket_path` (same as [`Client::connect`]).
///
/// ```no_run
/// let c = corewise_arbiter::connect("/run/corewise-arbiter.sock")?;
/// # Ok::<(), corewise_arbiter::client::ClientError>(())
/// ```
pub fn connect(socket_path: impl AsRef<Path>) -> Result<Client, ClientError> {
    Client::connect(socket_path)
}

impl Client {
    /// Registers a new application with the daemon.
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
    /// use corewise_arbiter::client::Client;
    /// # let Some((daemon, socket)) = test_daemon("connect", |_| {})? else { return Ok(()) };
    /// // `socket`: where a daemon listens (here one started in-process).
    /// let app = Client::connect(&socket)?;
    /// assert!(app.is_connected());
    /// assert!(app.owned_cores().is_empty());
    /// let table = corewise_arbiter::client::status(&socket)?;
    /// assert!(table.iter().any(|e| e.pid == std::process::id()));
    /// # drop(app);
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn connect(socket_path: impl AsRef<Path>) -> Result<Self, ClientError> {
        let path = socket_path.as_ref().to_path_buf();
        let mut control = Conn::open(&path)?;
        control.send(&Request::HelloApp)?;
        let (msg, fd) = control.recv_with_fd()?;
        let Response::Welcome { app_token } = msg else {
            return Err(ClientError::Unexpected(format!(
                "{msg:?} instead of Welcome"
            )));
        };
        let fd = fd.ok_or_else(|| ClientError::Unexpected("Welcome without shared page".into()))?;
        let shm = SharedPageReader::map(std::os::fd::AsFd::as_fd(&fd))?;
        Ok(Self {
            inner: Arc::new(Inner {
                path,
                control: Mutex::new(control),
                token: app_token,
                shm,
            }),
        })
    }

    /// Sets how many cores the application wants at each priority level
    /// (index 0 is the highest priority). Returns the request as the daemon
    /// applies it; `clipped` says the user's limits cut it.
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
    /// # let Some((daemon, socket)) = test_daemon("request", |o| o.config.defaults.max_cores = 1)? else { return Ok(()) };
    /// // The daemon on `socket` lets this user hold 1 core.
    /// let app = corewise_arbiter::connect(&socket)?;
    /// let ack = app.set_requested_cores([0, 0, 2, 0, 0, 0, 0, 0])?;
    /// assert_eq!(ack.effective, [0, 0, 1, 0, 0, 0, 0, 0]);
    /// assert!(ack.clipped);
    /// assert!(!app.set_requested_cores([0; 8])?.clipped);
    /// # drop(app);
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_requested_cores(
        &self,
        counts: [u32; PRIORITY_LEVELS],
    ) -> Result<RequestAck, ClientError> {
        let mut c = self
            .inner
            .control
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        c.send(&Request::SetRequestedCores { counts })?;
        match c.recv()? {
            Response::RequestAck { effective, clipped } => Ok(RequestAck { effective, clipped }),
            other => Err(ClientError::Unexpected(format!("{other:?}"))),
        }
    }

    /// Opens the per-kernel-thread socket. Call it on the kernel thread that
    /// will later call [`CoreThread::block_until_core_available`]: the daemon
    /// confines the calling thread's id.
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
    /// # let Some((daemon, socket)) = test_daemon("thread", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// let me = app.thread()?; // on the kernel thread that will use the core
    /// assert_eq!(me.tid(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// assert_eq!(me.core(), None);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn thread(&self) -> Result<CoreThread, ClientError> {
        let mut conn = Conn::open(&self.inner.path)?;
        let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
        conn.send(&Request::AttachThread {
            app_token: self.inner.token,
            tid,
        })?;
        match conn.recv()? {
            Response::Attached => {}
            other => return Err(ClientError::Unexpected(format!("{other:?}"))),
        }
        Ok(CoreThread {
            client: self.clone(),
            conn,
            tid,
            core: None,
            preempted: 0,
        })
    }

    /// Cores currently granted to this application (read from shared memory).
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
    /// # let Some((daemon, socket)) = test_daemon("owned", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// let core = me.block_until_core_available()?;
    /// assert_eq!(app.owned_cores(), vec![core]);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn owned_cores(&self) -> Vec<CoreId> {
        self.inner.shm.granted_cores()
    }

    /// A core the daemon wants back, if any.
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
    /// # let Some((daemon, socket)) = test_daemon("to-release", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// let core = me.block_until_core_available()?;
    /// assert_eq!(app.core_to_release(), None);
    /// app.set_requested_cores([0; 8])?; // wants no core any more
    /// assert_eq!(app.core_to_release(), Some(core));
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn core_to_release(&self) -> Option<CoreId> {
        self.inner.shm.core_to_release()
    }

    /// Number of cores the daemon wants back.
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
    /// # let Some((daemon, socket)) = test_daemon("release-count", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// me.block_until_core_available()?;
    /// assert_eq!(app.release_count(), 0);
    /// app.set_requested_cores([0; 8])?;
    /// assert_eq!(app.release_count(), 1);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release_count(&self) -> u32 {
        self.inner.shm.release_count()
    }

    /// How many times a core was taken from this application by force.
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
    /// use std::time::{Duration, Instant};
    /// # let Some((daemon, socket)) = test_daemon("preempted-count", |o| o.reclaim_timeout = Duration::from_millis(1))? else { return Ok(()) };
    /// // The daemon on `socket` takes a core by force 1 ms after asking for it.
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// me.block_until_core_available()?;
    /// app.set_requested_cores([0; 8])?; // ... and the thread does not release it
    /// let t0 = Instant::now();
    /// while app.preempted_count() == 0 {
    ///     assert!(t0.elapsed() < Duration::from_secs(10), "never preempted");
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert_eq!(app.preempted_count(), 1);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn preempted_count(&self) -> u32 {
        self.inner.shm.preempted()
    }

    /// Whether the application's connection is still open: a zero-timeout
    /// `poll` of its socket, on which the daemon only ever answers
    /// requests, so anything to read there outside a request is the end of
    /// the connection (the daemon exited or was killed). One system call;
    /// a runtime checks it now and then to notice a daemon that died while
    /// none of its threads was waiting on a socket.
    ///
    /// ```no_run
    /// let c = corewise_arbiter::connect("/run/corewise-arbiter.sock")?;
    /// assert!(c.is_connected());
    /// # Ok::<(), corewise_arbiter::client::ClientError>(())
    /// ```
    pub fn is_connected(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        // A request in progress holds the lock and will see the end itself.
        let Ok(c) = self.inner.control.try_lock() else {
            return true;
        };
        let mut fds = [PollFd::new(&c.stream, PollFlags::IN)];
        let zero = rustix::time::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&zero)) {
            Ok(0) | Err(_) => true,
            Ok(_) => {
                let ev = fds[0].revents();
                if ev.intersects(PollFlags::HUP | PollFlags::ERR | PollFlags::RDHUP) {
                    return false;
                }
                // Readable: end of file unless the daemon sent something.
                let mut b = [0u8; 1];
                !matches!(
                    rustix::net::recv(&c.stream, &mut b, RecvFlags::PEEK | RecvFlags::DONTWAIT),
                    Ok((0, _))
                )
            }
        }
    }

    /// Whether the daemon announced it is exiting.
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
    /// # let Some((daemon, socket)) = test_daemon("shutting-down", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// assert!(!app.daemon_shutting_down());
    /// daemon.stop()?;
    /// assert!(app.daemon_shutting_down());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn daemon_shutting_down(&self) -> bool {
        self.inner.shm.shutdown()
    }
}

/// One kernel thread's connection: it sleeps here while it has no core.
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
/// # let Some((daemon, socket)) = test_daemon("core-thread", |_| {})? else { return Ok(()) };
/// let app = corewise_arbiter::connect(&socket)?;
/// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
/// let mut me = app.thread()?;
/// let core = me.block_until_core_available()?;
/// // Run on `core` until the daemon wants it back.
/// assert!(!me.must_release_core());
/// app.set_requested_cores([0; 8])?;
/// assert!(me.must_release_core());
/// drop(me); // gives the core back
/// # let _ = core;
/// # drop(app);
/// # daemon.stop()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CoreThread {
    client: Client,
    conn: Conn,
    tid: u32,
    core: Option<CoreId>,
    preempted: u32,
}

impl CoreThread {
    /// Gives back the core this thread holds (if any) and sleeps until the
    /// daemon grants one; returns with the thread confined to that core.
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
    /// # let Some((daemon, socket)) = test_daemon("block", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// let core = me.block_until_core_available()?;
    /// // The calling thread now runs on the granted core only.
    /// assert_eq!(rustix::thread::sched_getcpu() as u32, core);
    /// assert_eq!(me.core(), Some(core));
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block_until_core_available(&mut self) -> Result<CoreId, ClientError> {
        self.core = None;
        self.conn.send(&Request::BlockUntilCoreAvailable)?;
        loop {
            match self.conn.recv()? {
                Response::Granted { core } => {
                    self.core = Some(core);
                    return Ok(core);
                }
                // A forced reclaim that happened while we ran: note it and
                // keep waiting for the answer to our request.
                Response::Preempted { .. } => self.preempted += 1,
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    /// Hands this connection to another kernel thread of the process, `tid`
    /// (the one attached is blocked in the kernel and a spare runs its
    /// core): if a core is held, `tid` is confined to it and the thread it
    /// replaces goes back to the unmanaged set; from then on every grant
    /// confines `tid`. Call it while no other call on this connection is
    /// in progress. A refusal ([`ClientError::Refused`]: `tid` is not a
    /// live thread of this process, or is attached elsewhere) changes
    /// nothing and the connection stays usable.
    ///
    /// ```no_run
    /// let app = corewise_arbiter::connect("/run/corewise-arbiter.sock")?;
    /// let mut me = app.thread()?;
    /// me.block_until_core_available()?;
    /// // This kernel thread is about to block: a spare takes its core.
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// std::thread::spawn(move || {
    ///     tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32).unwrap();
    ///     // ... run the core ...
    /// });
    /// me.replace_thread(rx.recv()?)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_thread(&mut self, tid: u32) -> Result<(), ClientError> {
        self.conn.send(&Request::ReplaceThread { tid })?;
        loop {
            match self.conn.recv()? {
                Response::Replaced => {
                    self.tid = tid;
                    return Ok(());
                }
                // A forced reclaim that happened meanwhile: noted, as in
                // `block_until_core_available`.
                Response::Preempted { .. } => self.preempted += 1,
                other => return Err(ClientError::Unexpected(format!("{other:?}"))),
            }
        }
    }

    /// Whether this thread must give its core back (shared-memory reads, no
    /// system call): the daemon asks for it, has already taken it by force
    /// (the thread then runs in the unmanaged set), or is shutting down.
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
    /// # let Some((daemon, socket)) = test_daemon("must-release", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// assert!(!me.must_release_core()); // holds nothing yet
    /// me.block_until_core_available()?;
    /// assert!(!me.must_release_core());
    /// app.set_requested_cores([0; 8])?;
    /// assert!(me.must_release_core());
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn must_release_core(&self) -> bool {
        match self.core {
            Some(c) => self.client.inner.shm.must_release(c, self.tid),
            None => false,
        }
    }

    /// Whether the core granted last was taken by force (a shared-memory read).
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
    /// use std::time::{Duration, Instant};
    /// # let Some((daemon, socket)) = test_daemon("was-preempted", |o| o.reclaim_timeout = Duration::from_millis(1))? else { return Ok(()) };
    /// // The daemon on `socket` takes a core by force 1 ms after asking for it.
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// me.block_until_core_available()?;
    /// assert!(!me.was_preempted());
    /// app.set_requested_cores([0; 8])?; // the thread keeps running: taken by force
    /// let t0 = Instant::now();
    /// while !me.was_preempted() {
    ///     assert!(t0.elapsed() < Duration::from_secs(10), "never preempted");
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn was_preempted(&self) -> bool {
        self.core
            .is_some_and(|c| self.client.inner.shm.holder(c) != self.tid)
    }

    /// Core held since the last grant, as far as this thread knows (see
    /// [`Self::was_preempted`] for a forced reclaim).
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
    /// # let Some((daemon, socket)) = test_daemon("core", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// assert_eq!(me.core(), None);
    /// let granted = me.block_until_core_available()?;
    /// assert_eq!(me.core(), Some(granted));
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn core(&self) -> Option<CoreId> {
        self.core
    }

    /// Linux thread id registered with the daemon.
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
    /// # let Some((daemon, socket)) = test_daemon("tid", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// let me = app.thread()?;
    /// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    /// assert_eq!(me.tid(), tid);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Forced reclaims this thread has been told about.
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
    /// use std::time::{Duration, Instant};
    /// # let Some((daemon, socket)) = test_daemon("preempted", |o| o.reclaim_timeout = Duration::from_millis(1))? else { return Ok(()) };
    /// // The daemon on `socket` takes a core by force 1 ms after asking for it.
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// me.block_until_core_available()?;
    /// app.set_requested_cores([0; 8])?; // the thread keeps running: taken by force
    /// let t0 = Instant::now();
    /// while !me.was_preempted() {
    ///     assert!(t0.elapsed() < Duration::from_secs(10), "never preempted");
    ///     std::thread::sleep(Duration::from_millis(1));
    /// }
    /// assert_eq!(me.preempted(), 0); // not told yet
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// me.block_until_core_available()?; // reads the notice, then the new grant
    /// assert_eq!(me.preempted(), 1);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn preempted(&self) -> u32 {
        self.preempted
    }

    /// The application this thread belongs to.
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
    /// # let Some((daemon, socket)) = test_daemon("thread-client", |_| {})? else { return Ok(()) };
    /// let app = corewise_arbiter::connect(&socket)?;
    /// app.set_requested_cores([1, 0, 0, 0, 0, 0, 0, 0])?;
    /// let mut me = app.thread()?;
    /// let core = me.block_until_core_available()?;
    /// assert_eq!(me.client().owned_cores(), vec![core]);
    /// # drop((me, app));
    /// # daemon.stop()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// The thread's socket, so that another thread can interrupt a
/// [`CoreThread::block_until_core_available`] in progress: `shutdown(2)` on a
/// duplicate of it makes the blocked read return [`ClientError::DaemonGone`]
/// (and the daemon sees the thread leave). The corewise runtime does this
/// when it stops.
///
/// ```no_run
/// use std::os::fd::AsFd;
/// let app = corewise_arbiter::connect("/run/corewise-arbiter.sock")?;
/// let me = app.thread()?;
/// let interrupt = me.as_fd().try_clone_to_owned()?;
/// // later, from any thread:
/// rustix::net::shutdown(&interrupt, rustix::net::Shutdown::Both)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
impl std::os::fd::AsFd for CoreThread {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.conn.stream.as_fd()
    }
}

/// How long [`status`] waits for the daemon's answer.
///
/// ```
/// assert_eq!(corewise_arbiter::client::STATUS_TIMEOUT.as_secs(), 10);
/// ```
pub const STATUS_TIMEOUT: Duration = Duration::from_secs(10);

/// Asks the daemon for its status table, waiting at most
/// [`STATUS_TIMEOUT`] for the answer.
///
/// ```no_run
/// for e in corewise_arbiter::client::status("/run/corewise-arbiter.sock")? {
///     println!("{} {:?}", e.pid, e.granted);
/// }
/// # Ok::<(), corewise_arbiter::client::ClientError>(())
/// ```
pub fn status(socket_path: impl AsRef<Path>) -> Result<Vec<StatusEntry>, ClientError> {
    status_within(socket_path, STATUS_TIMEOUT)
}

/// Asks the daemon for its status table; a daemon that accepts the
/// connection (the kernel does that for it while it is stopped or stuck)
/// but does not answer within `timeout` is [`ClientError::NoAnswer`].
///
/// ```
/// use corewise_arbiter::client::{status_within, ClientError};
/// use std::time::Duration;
/// // A socket whose owner never answers.
/// let path = std::env::temp_dir().join(format!("mute-arbiter-{}.sock", std::process::id()));
/// let _ = std::fs::remove_file(&path);
/// let _mute = std::os::unix::net::UnixListener::bind(&path)?;
/// let err = status_within(&path, Duration::from_millis(50)).unwrap_err();
/// assert!(matches!(err, ClientError::NoAnswer(_)));
/// std::fs::remove_file(&path)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn status_within(
    socket_path: impl AsRef<Path>,
    timeout: Duration,
) -> Result<Vec<StatusEntry>, ClientError> {
    let mut c = Conn::open(socket_path.as_ref())?;
    // A zero timeout would mean "no timeout" to the socket: take the least.
    let timeout = timeout.max(Duration::from_millis(1));
    c.stream.set_read_timeout(Some(timeout))?;
    c.stream.set_write_timeout(Some(timeout))?;
    let no_answer = |e: ClientError| match e {
        ClientError::Io(io)
            if matches!(
                io.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) =>
        {
            ClientError::NoAnswer(timeout)
        }
        other => other,
    };
    c.send(&Request::StatusQuery).map_err(no_answer)?;
    match c.recv().map_err(no_answer)? {
        Response::Status { entries } => Ok(entries),
        other => Err(ClientError::Unexpected(format!("{other:?}"))),
    }
}

/// Sends raw bytes on a new connection (diagnostics and tests of the daemon's
/// validation); returns whether the daemon closed the connection afterwards.
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
/// use corewise_arbiter::client::send_raw;
/// # let Some((daemon, socket)) = test_daemon("send-raw", |_| {})? else { return Ok(()) };
/// // The daemon on `socket` drops a client that sends garbage.
/// assert!(send_raw(&socket, b"GET / HTTP/1.1\r\n\r\n")?);
/// // ... and still serves the others.
/// assert!(corewise_arbiter::client::status(&socket).is_ok());
/// # daemon.stop()?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn send_raw(socket_path: impl AsRef<Path>, bytes: &[u8]) -> Result<bool, ClientError> {
    let mut c = Conn::open(socket_path.as_ref())?;
    let _ = c.stream.write_vectored(&[IoSlice::new(bytes)]);
    let mut b = [0u8; 64];
    loop {
        match c.stream.read(&mut b) {
            Ok(0) => return Ok(true),
            Ok(_) => continue,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if is_gone(&e) => return Ok(true),
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_daemon_is_a_connect_error() {
        let p = std::env::temp_dir().join(format!("corewise-nodaemon-{}.sock", std::process::id()));
        assert!(matches!(
            Client::connect(&p),
            Err(ClientError::Connect { .. })
        ));
        assert!(matches!(status(&p), Err(ClientError::Connect { .. })));
    }

    #[test]
    fn a_closed_control_connection_is_seen() {
        let p = std::env::temp_dir().join(format!("corewise-hangup-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // A daemon that welcomes the application, then dies.
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 6];
            s.read_exact(&mut b).unwrap();
            let page = crate::shm::SharedPageWriter::create().unwrap();
            let bytes = crate::protocol::encode_response(&Response::Welcome { app_token: 7 });
            let fds = [page.fd()];
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
            let mut anc = rustix::net::SendAncillaryBuffer::new(&mut space);
            assert!(anc.push(rustix::net::SendAncillaryMessage::ScmRights(&fds)));
            rustix::net::sendmsg(
                &s,
                &[IoSlice::new(&bytes)],
                &mut anc,
                rustix::net::SendFlags::empty(),
            )
            .unwrap();
            rx.recv().unwrap();
            drop(s);
        });
        let c = Client::connect(&p).unwrap();
        assert!(c.is_connected());
        tx.send(()).unwrap();
        t.join().unwrap();
        assert!(!c.is_connected());
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn closed_connection_is_daemon_gone() {
        let p = std::env::temp_dir().join(format!("corewise-closing-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let t = std::thread::spawn(move || {
            // Read the hello, then hang up like a dying daemon.
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 6];
            let _ = s.read_exact(&mut b);
        });
        assert!(matches!(Client::connect(&p), Err(ClientError::DaemonGone)));
        t.join().unwrap();
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn garbage_from_daemon_is_a_protocol_error() {
        let p = std::env::temp_dir().join(format!("corewise-garbage-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&p);
        let l = std::os::unix::net::UnixListener::bind(&p).unwrap();
        let t = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n");
            let mut b = [0u8; 64];
            let _ = s.read(&mut b);
        });
        assert!(matches!(status(&p), Err(ClientError::Protocol(_))));
        t.join().unwrap();
        let _ = std::fs::remove_file(&p);
    }
}
