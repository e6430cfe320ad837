//! The daemon: socket loop, startup (fence construction) and orderly exit.
//!
//! Why one thread with `poll`: every decision needs the whole state, messages
//! are rare (they only come when core needs change), and a single thread makes
//! the state machine trivially race-free. Signals arrive through a signalfd so
//! SIGINT/SIGTERM are ordinary events and teardown runs on the main path.

pub mod state;
pub mod task;

use std::collections::BTreeMap;
use std::io::{self, IoSlice, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use thiserror::Error;

use crate::config::{Config, ConfigError};
use crate::fence::{AffinityFence, CgroupFence, CgroupVersion, Fence, FenceError};
use crate::protocol::{decode_request, encode_response, Request, Response, MAX_REQUEST_PAYLOAD};
use crate::topology::{online_cpus, CoreId, CpuList, Topology};
use crate::warm::WarmCores;
use state::{ConnId, State};

/// Which fencing backend to use.
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
    /// Mode of the socket file (0o666 lets other users' applications in).
    pub socket_mode: u32,
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
            socket_mode: 0o666,
            rt_priority: None,
            release_spin: Duration::from_micros(200),
            warm_window: Duration::from_millis(1),
        }
    }
}

/// Default socket path.
pub const DEFAULT_SOCKET: &str = "/run/corewise-arbiter.sock";
/// Default cgroup v1 cpuset mount.
pub const DEFAULT_V1_ROOT: &str = "/sys/fs/cgroup/cpuset";
/// Default cgroup v2 mount.
pub const DEFAULT_V2_ROOT: &str = "/sys/fs/cgroup";

/// Daemon failures.
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
                Err(e2) => {
                    tracing::warn!(v1 = %e1, v2 = %e2, "no writable cpuset hierarchy; using the weaker affinity-only backend");
                    Box::new(AffinityFence::new(all))
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
pub const MAX_CONNECTIONS: usize = 16384;

struct Conn {
    stream: UnixStream,
    rbuf: Vec<u8>,
    pid: u32,
    uid: u32,
    /// A status connection is closed once its reply is written.
    close_after_reply: bool,
}

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
    let listener = bind(&opts.socket, opts.socket_mode)?;
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
pub fn run(opts: Options) -> Result<(), DaemonError> {
    let sig = signal_fd()?;
    raise_fd_limit();
    let (mut state, listener) = setup(&opts)?;
    let result = serve(&listener, &mut state, &sig);
    finish(&opts, state, result)
}

/// A daemon running on a thread of the calling process (benchmarks, tools).
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
            let result = serve(&listener, &mut state, &r);
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

fn bind(path: &Path, mode: u32) -> Result<UnixListener, DaemonError> {
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
    let l = UnixListener::bind(path).map_err(io_op("bind"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_op("chmod socket"))?;
    l.set_nonblocking(true).map_err(io_op("set_nonblocking"))?;
    Ok(l)
}

fn serve(listener: &UnixListener, state: &mut State, sig: &OwnedFd) -> Result<(), DaemonError> {
    let mut conns: BTreeMap<ConnId, Conn> = BTreeMap::new();
    let mut next_id: ConnId = 1;
    loop {
        let wake_at = if state.spin_until().is_some() {
            Some(Instant::now())
        } else {
            match (state.next_deadline(), state.warm_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        let timeout = wake_at.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            rustix::time::Timespec {
                tv_sec: left.as_secs() as i64,
                tv_nsec: i64::from(left.subsec_nanos()),
            }
        });
        let ids: Vec<ConnId> = conns.keys().copied().collect();
        let mut ready: Vec<ConnId> = Vec::new();
        let (sig_ready, accept_ready) = {
            let mut fds = Vec::with_capacity(2 + conns.len());
            fds.push(PollFd::new(sig, PollFlags::IN));
            fds.push(PollFd::new(listener, PollFlags::IN));
            for c in conns.values() {
                fds.push(PollFd::new(&c.stream, PollFlags::IN));
            }
            match rustix::event::poll(&mut fds, timeout.as_ref()) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(io_op("poll")(e.into())),
            }
            for (i, id) in ids.iter().enumerate() {
                if !fds[i + 2].revents().is_empty() {
                    ready.push(*id);
                }
            }
            (!fds[0].revents().is_empty(), !fds[1].revents().is_empty())
        };
        if sig_ready {
            tracing::info!("stop requested (signal), shutting down");
            return Ok(());
        }
        if accept_ready {
            loop {
                match listener.accept() {
                    Ok((stream, _)) => {
                        if conns.len() >= MAX_CONNECTIONS {
                            tracing::warn!("too many connections; refusing one");
                            continue;
                        }
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
                        let id = next_id;
                        next_id += 1;
                        conns.insert(
                            id,
                            Conn {
                                stream,
                                rbuf: Vec::new(),
                                pid: cred.pid.as_raw_nonzero().get() as u32,
                                uid: cred.uid.as_raw(),
                                close_after_reply: false,
                            },
                        );
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        // EMFILE and friends: the listener stays readable, so
                        // pause briefly instead of spinning on it.
                        tracing::warn!(error = %e, "accept failed");
                        std::thread::sleep(Duration::from_millis(1));
                        break;
                    }
                }
            }
        }
        for id in ready {
            if let Err(why) = handle_readable(id, &mut conns, state) {
                if let Some(why) = why {
                    tracing::warn!(conn = id, reason = %why, "dropping client");
                }
                state.to_close.push(id);
            }
        }
        state.expire(Instant::now());
        flush(&mut conns, state);
        // After the replies: a grant's wake-up is not delayed by these writes.
        state.sync_warm(Instant::now());
    }
}

/// Delivers queued replies and closes what must be closed, until stable.
fn flush(conns: &mut BTreeMap<ConnId, Conn>, state: &mut State) {
    loop {
        let out = std::mem::take(&mut state.outbox);
        for (id, resp) in out {
            let Some(c) = conns.get_mut(&id) else {
                continue;
            };
            let bytes = encode_response(&resp);
            // Replies are tiny and the client reads them promptly; a client
            // whose buffer is full is not following the protocol.
            if let Err(e) = write_all_nonblocking(&mut c.stream, &bytes) {
                tracing::warn!(conn = id, error = %e, "write failed; dropping client");
                state.to_close.push(id);
            } else if c.close_after_reply {
                state.to_close.push(id);
            }
        }
        let close = std::mem::take(&mut state.to_close);
        if close.is_empty() && state.outbox.is_empty() {
            break;
        }
        for id in close {
            if conns.remove(&id).is_some() {
                state.remove_conn(id);
            }
        }
    }
}

fn write_all_nonblocking(s: &mut UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(100);
    while !bytes.is_empty() {
        match s.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_micros(200));
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads and handles everything available on `id`. `Err(Some(reason))`
/// drops a misbehaving client, `Err(None)` a closed one.
fn handle_readable(
    id: ConnId,
    conns: &mut BTreeMap<ConnId, Conn>,
    state: &mut State,
) -> Result<(), Option<String>> {
    let Some(c) = conns.get_mut(&id) else {
        return Ok(());
    };
    let mut chunk = [0u8; 512];
    loop {
        match c.stream.read(&mut chunk) {
            Ok(0) => return Err(None),
            Ok(n) => {
                c.rbuf.extend_from_slice(&chunk[..n]);
                if c.rbuf.len() > 16 * (MAX_REQUEST_PAYLOAD + 6) {
                    return Err(Some("flooding".into()));
                }
                if n < chunk.len() {
                    // Short read: the socket is (almost surely) drained; poll
                    // tells us if more arrives. Saves an EAGAIN read per message.
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(None),
        }
    }
    loop {
        let Some(c) = conns.get_mut(&id) else {
            return Ok(());
        };
        let (req, used) = match decode_request(&c.rbuf) {
            Ok(Some(x)) => x,
            Ok(None) => return Ok(()),
            Err(e) => return Err(Some(format!("malformed message: {e}"))),
        };
        c.rbuf.drain(..used);
        handle_request(id, req, conns, state)?;
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
    let fresh = !state.is_app(id) && !state.is_thread(id) && !c.close_after_reply;
    match req {
        Request::HelloApp if fresh => {
            let app = state
                .add_app(id, c.pid, c.uid)
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
            let sent = rustix::net::sendmsg(
                c.stream.as_fd(),
                &[IoSlice::new(&bytes)],
                &mut anc,
                SendFlags::NOSIGNAL,
            )
            .map_err(|e| Some(format!("sending welcome: {e}")))?;
            if sent < bytes.len() {
                write_all_nonblocking(&mut c.stream, &bytes[sent..]).map_err(|_| None)?;
            }
            Ok(())
        }
        Request::AttachThread { app_token, tid } if fresh => {
            let pid = c.pid;
            state
                .attach_thread(id, app_token, tid, pid)
                .map_err(|e| Some(format!("attach refused: {e}")))
        }
        Request::StatusQuery if fresh => {
            c.close_after_reply = true;
            let entries = state.status();
            state.outbox.push((id, Response::Status { entries }));
            Ok(())
        }
        Request::SetRequestedCores { counts } if state.is_app(id) => {
            state.set_requested(id, counts);
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
