//! The daemon's bookkeeping: applications, kernel threads, who holds which
//! core, pending reclaims, and turning policy decisions into fence operations.
//!
//! Why separate from the socket loop: every state change funnels through
//! [`State::rebalance`], and the loop only decodes messages and delivers the
//! replies this module queues in its outbox.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use super::task::TaskIdent;

use crate::config::{Config, Limits};
use crate::fence::{Fence, FenceError};
use crate::policy::{choose_core, choose_victim, cores_spanned, whole_core_targets, Demand};
use crate::protocol::{Response, StatusEntry, PRIORITY_LEVELS};
use crate::shm::{SharedPageWriter, ShmError};
use crate::topology::{CoreId, CpuList, Topology};
use crate::warm::WarmCores;

/// Identifies a connection (applications are keyed by their control
/// connection; ids grow, so they also give the age order).
///
/// ```
/// use corewise_arbiter::daemon::state::ConnId;
/// # use corewise_arbiter::daemon::state::State;
/// # use corewise_arbiter::protocol::Response;
/// # // A backend that only records what it is asked, so no thread moves.
/// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
/// # impl corewise_arbiter::fence::Fence for Recorder {
/// #     fn name(&self) -> &'static str { "recorder" }
/// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
/// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
/// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
/// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// # }
/// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
/// # fn test_state() -> State {
/// #     State::new(
/// #         Box::new(Recorder(Default::default())),
/// #         "0-3".parse().unwrap(),
/// #         vec![2, 3],
/// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
/// #         std::time::Duration::from_millis(10),
/// #         Default::default(),
/// #     )
/// # }
/// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
/// let mut s = test_state();
/// // The daemon numbers connections in the order they arrive.
/// let (app, thread): (ConnId, ConnId) = (1, 2);
/// let token = s.add_app(app, pid, 0, None)?.token();
/// s.attach_thread(thread, token, tid, pid)?;
/// assert!(s.is_app(app) && s.is_thread(thread));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub type ConnId = u64;

/// Why a message was refused (the connection is then dropped).
///
/// ```
/// use corewise_arbiter::daemon::state::Reject;
/// # use corewise_arbiter::daemon::state::State;
/// # use corewise_arbiter::protocol::Response;
/// # // A backend that only records what it is asked, so no thread moves.
/// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
/// # impl corewise_arbiter::fence::Fence for Recorder {
/// #     fn name(&self) -> &'static str { "recorder" }
/// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
/// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
/// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
/// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// # }
/// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
/// # fn test_state() -> State {
/// #     State::new(
/// #         Box::new(Recorder(Default::default())),
/// #         "0-3".parse().unwrap(),
/// #         vec![2, 3],
/// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
/// #         std::time::Duration::from_millis(10),
/// #         Default::default(),
/// #     )
/// # }
/// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
/// let mut s = test_state();
/// let token = s.add_app(1, pid, 0, None)?.token();
/// assert!(matches!(s.attach_thread(2, token ^ 1, tid, pid), Err(Reject::BadToken)));
/// // A thread id that is no thread of the process.
/// assert!(matches!(s.attach_thread(2, token, i32::MAX as u32, pid), Err(Reject::ForeignThread { .. })));
/// s.attach_thread(2, token, tid, pid)?;
/// assert!(matches!(s.attach_thread(3, token, tid, pid), Err(Reject::Duplicate(_))));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, thiserror::Error)]
pub enum Reject {
    /// Unknown application token.
    #[error("unknown application token")]
    BadToken,
    /// The thread socket's peer is not the application's process.
    #[error("peer pid {peer} is not the application's pid {app}")]
    WrongProcess {
        /// Peer pid.
        peer: u32,
        /// Application pid.
        app: u32,
    },
    /// The thread id does not belong to the peer process.
    #[error("thread {tid} does not belong to process {pid}")]
    ForeignThread {
        /// Thread id.
        tid: u32,
        /// Process id.
        pid: u32,
    },
    /// The task does not run as the connection's user alone (it ran a
    /// set-user-ID program, or took back a saved user id, after it
    /// connected).
    #[error("task {tid} does not run as user {uid} alone (a set-user-ID program?)")]
    NotTheUsers {
        /// Thread (or process) id.
        tid: u32,
        /// The connection's user.
        uid: u32,
    },
    /// The thread id is already attached.
    #[error("thread {0} is already attached")]
    Duplicate(u32),
    /// The process that registered is gone (its pid may name another now).
    #[error("process {0} is gone")]
    ProcessGone(u32),
    /// The user has as many applications as its limits allow.
    #[error("user {uid} already has {max} applications (max_apps)")]
    TooManyApps {
        /// User.
        uid: u32,
        /// The limit.
        max: u32,
    },
    /// The user has as many kernel threads attached as its limits allow.
    #[error("user {uid} already has {max} threads attached (max_threads)")]
    TooManyThreads {
        /// User.
        uid: u32,
        /// The limit.
        max: u32,
    },
    /// The shared page could not be created.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The fence refused the thread.
    #[error(transparent)]
    Fence(#[from] FenceError),
}

/// After [`Fence::adopt`] wrote the application's pid (cgroup v2 moves a
/// whole process by pid): if the process is gone now, its pid may have
/// named another process at the write, which then moved into the unmanaged
/// set. It cannot be put back (where it was is unknown), so it is said
/// loudly for the administrator.
fn check_adopted(process: &TaskIdent) {
    if !process.alive() {
        tracing::error!(
            pid = process.pid(),
            "the application exited while its process joined the unmanaged set: \
             a process that took its pid meanwhile may have been moved there"
        );
    }
}

/// One registered application.
///
/// ```
/// use corewise_arbiter::shm::SharedPageReader;
/// # use corewise_arbiter::daemon::state::State;
/// # use corewise_arbiter::protocol::Response;
/// # // A backend that only records what it is asked, so no thread moves.
/// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
/// # impl corewise_arbiter::fence::Fence for Recorder {
/// #     fn name(&self) -> &'static str { "recorder" }
/// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
/// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
/// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
/// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// # }
/// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
/// # fn test_state() -> State {
/// #     State::new(
/// #         Box::new(Recorder(Default::default())),
/// #         "0-3".parse().unwrap(),
/// #         vec![2, 3],
/// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
/// #         std::time::Duration::from_millis(10),
/// #         Default::default(),
/// #     )
/// # }
/// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
/// let mut s = test_state();
/// let app = s.add_app(1, pid, 0, None)?;
/// // What the application gets: a token for its threads and its shared page.
/// assert_ne!(app.token(), 0);
/// let page = SharedPageReader::map(app.shm().fd())?;
/// assert!(page.granted_cores().is_empty());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct App {
    token: u64,
    /// The process as it was when it registered (its pid may be reused).
    process: TaskIdent,
    pid: u32,
    uid: u32,
    name: String,
    limits: Limits,
    requested: [u32; PRIORITY_LEVELS],
    shm: SharedPageWriter,
    /// Its kernel threads (connections).
    threads: BTreeSet<ConnId>,
    /// Those asleep waiting for a core.
    waiting: BTreeSet<ConnId>,
    /// Cores it holds, and which of its threads holds each.
    held: BTreeMap<CoreId, ConnId>,
    /// Threads holding a core or waiting for one (only they can use one).
    usable: u32,
    preempted: u32,
}

impl App {
    /// The shared page.
    ///
    /// ```
    /// use corewise_arbiter::shm::SharedPageReader;
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let app = s.add_app(1, pid, 0, None)?;
    /// let (token, page) = (app.token(), SharedPageReader::map(app.shm().fd())?);
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// // The grant shows in the application's page.
    /// assert_eq!(page.granted_count(), 1);
    /// assert_eq!(page.holder(page.granted_cores()[0]), tid);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shm(&self) -> &SharedPageWriter {
        &self.shm
    }
    /// Token for thread sockets.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// // A kernel thread's connection presents it to join the application.
    /// s.attach_thread(2, token, tid, pid)?;
    /// assert!(s.is_thread(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn token(&self) -> u64 {
        self.token
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Attached, not asking for a core (or running unmanaged after a forced reclaim).
    Idle,
    /// Asleep in `block_until_core_available`.
    Waiting,
    /// Holds a core; `deadline` is set while a release is pending.
    Running {
        core: CoreId,
        deadline: Option<Instant>,
    },
}

struct Thread {
    app: ConnId,
    uid: u32,
    task: TaskIdent,
    phase: Phase,
    /// The task is gone (or its id taken by another task): never named in
    /// a cgroup write again; the connection is being closed.
    gone: bool,
}

/// What one user has registered.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    apps: u32,
    threads: u32,
}

/// Everything the daemon knows.
///
/// Every per-request operation touches only the applications that hold or
/// want cores (`active`), and indexes replace scans: tokens, tids, release
/// deadlines, and per application its waiting threads and held cores.
///
/// ```
/// # use corewise_arbiter::daemon::state::State;
/// # use corewise_arbiter::protocol::Response;
/// # // A backend that only records what it is asked, so no thread moves.
/// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
/// # impl corewise_arbiter::fence::Fence for Recorder {
/// #     fn name(&self) -> &'static str { "recorder" }
/// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
/// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
/// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
/// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
/// # }
/// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
/// # fn test_state() -> State {
/// #     State::new(
/// #         Box::new(Recorder(Default::default())),
/// #         "0-3".parse().unwrap(),
/// #         vec![2, 3],
/// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
/// #         std::time::Duration::from_millis(10),
/// #         Default::default(),
/// #     )
/// # }
/// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
/// // `test_state()`: CPUs 0-3 of which 2 and 3 are managed, through a
/// // backend that only records what it is asked.
/// let mut s = test_state();
/// let token = s.add_app(1, pid, 0, None)?.token();
/// s.attach_thread(2, token, tid, pid)?;
/// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
/// s.block(2);
/// let replies: Vec<_> = s.outbox.drain(..).collect();
/// assert!(replies.iter().any(|r| matches!(r, (2, Response::Granted { core: 2 | 3 }))));
/// assert_eq!(s.status()[0].granted.len(), 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct State {
    apps: BTreeMap<ConnId, App>,
    threads: BTreeMap<ConnId, Thread>,
    holder: BTreeMap<CoreId, ConnId>,
    /// Managed cores whose set may hold tasks a previous holder left:
    /// marked whenever a holder leaves (and all of them at start), emptied
    /// by [`State::tidy`] once the replies are out, and kept marked while
    /// something is left.
    dirty: BTreeSet<CoreId>,
    tokens: BTreeMap<u64, ConnId>,
    tids: BTreeMap<u32, ConnId>,
    deadlines: BTreeSet<(Instant, ConnId)>,
    /// Applications that hold a core, or want one and have a thread to use it.
    active: BTreeSet<ConnId>,
    usage: BTreeMap<u32, Usage>,
    limits_cache: BTreeMap<u32, Limits>,
    managed: Vec<CoreId>,
    all: CpuList,
    topo: Topology,
    timeout: Duration,
    config: Config,
    fence: Box<dyn Fence>,
    next_token: u64,
    release_spin: Duration,
    spin_until: Option<Instant>,
    /// Freed cores kept polling for a moment, and who held each core when
    /// that was last looked at (to see releases and new grants).
    warm: WarmCores,
    warm_holders: BTreeMap<CoreId, ConnId>,
    /// Replies to deliver, in order.
    pub outbox: Vec<(ConnId, Response)>,
    /// Connections the daemon decided to close.
    pub to_close: Vec<ConnId>,
}

impl State {
    /// A daemon managing `managed` (a subset of `all`) through `fence`.
    ///
    /// ```
    /// use corewise_arbiter::daemon::state::State;
    /// use corewise_arbiter::fence::AffinityFence;
    /// use corewise_arbiter::topology::{CpuList, Topology};
    /// use std::time::Duration;
    /// let all: CpuList = "0-3".parse().unwrap();
    /// let s = State::new(
    ///     Box::new(AffinityFence::new(&all)),
    ///     all,
    ///     vec![2, 3],
    ///     Topology::synthetic(1, 4, 1),
    ///     Duration::from_millis(10),
    ///     Default::default(),
    /// );
    /// assert_eq!(s.fence_name(), "affinity");
    /// assert!(s.status().is_empty());
    /// ```
    pub fn new(
        fence: Box<dyn Fence>,
        all: CpuList,
        managed: Vec<CoreId>,
        topo: Topology,
        timeout: Duration,
        config: Config,
    ) -> Self {
        // Tokens only need to be unguessable enough not to collide by
        // accident; peer credentials are the real check.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64) << 32;
        Self {
            apps: BTreeMap::new(),
            threads: BTreeMap::new(),
            holder: BTreeMap::new(),
            // A crashed daemon's sets were emptied once at start; forking
            // leftovers are chased from the first pass on.
            dirty: managed.iter().copied().collect(),
            tokens: BTreeMap::new(),
            tids: BTreeMap::new(),
            deadlines: BTreeSet::new(),
            active: BTreeSet::new(),
            usage: BTreeMap::new(),
            limits_cache: BTreeMap::new(),
            managed,
            all,
            topo,
            timeout,
            config,
            fence,
            next_token: seed | 1,
            release_spin: Duration::ZERO,
            spin_until: None,
            warm: WarmCores::disabled(),
            warm_holders: BTreeMap::new(),
            outbox: Vec::new(),
            to_close: Vec::new(),
        }
    }

    /// After asking for a release, poll without sleeping for this long: the
    /// release usually arrives within microseconds, and not sleeping saves a
    /// wake-up of the daemon on the critical path of a reclaim.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// use std::time::Duration;
    /// let mut s = test_state();
    /// s.set_release_spin(Duration::from_millis(50));
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.set_requested(1, [0; 8]); // asks for the core back
    /// // The loop now polls without sleeping for a while.
    /// assert!(s.spin_until().is_some());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_release_spin(&mut self, d: Duration) {
        self.release_spin = d;
    }

    /// Keep freed cores polling through `warm` (see [`crate::warm`]).
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// // A sysfs-like directory with CPU 2's resume-latency limit.
    /// let dir = std::env::temp_dir().join(format!("state-warm-doc-{}", std::process::id()));
    /// std::fs::create_dir_all(dir.join("cpu2/power"))?;
    /// std::fs::write(dir.join("cpu2/power/pm_qos_resume_latency_us"), "0")?;
    /// let mut s = test_state();
    /// s.set_warm(WarmCores::new(&dir, &[2], Duration::from_millis(5), None));
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.sync_warm(Instant::now());
    /// s.remove_conn(2); // the thread leaves: its core is free
    /// s.sync_warm(Instant::now());
    /// assert!(s.warm_deadline().is_some());
    /// assert_eq!(std::fs::read_to_string(dir.join("cpu2/power/pm_qos_resume_latency_us"))?, "n/a");
    /// s.set_warm(WarmCores::disabled()); // the old one restores the limit as it goes
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_warm(&mut self, warm: WarmCores) {
        self.warm = warm;
    }

    /// When the next warm window ends.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let dir = std::env::temp_dir().join(format!("state-deadline-doc-{}", std::process::id()));
    /// for cpu in [2, 3] {
    ///     std::fs::create_dir_all(dir.join(format!("cpu{cpu}/power")))?;
    ///     std::fs::write(dir.join(format!("cpu{cpu}/power/pm_qos_resume_latency_us")), "0")?;
    /// }
    /// let mut s = test_state();
    /// s.set_warm(WarmCores::new(&dir, &[2, 3], Duration::from_millis(5), None));
    /// assert_eq!(s.warm_deadline(), None);
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.sync_warm(Instant::now());
    /// s.remove_conn(2);
    /// let now = Instant::now();
    /// s.sync_warm(now);
    /// assert_eq!(s.warm_deadline(), Some(now + Duration::from_millis(5)));
    /// drop(s);
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn warm_deadline(&self) -> Option<Instant> {
        self.warm.next_deadline()
    }

    /// Opens a warm window on every core that lost its holder since the
    /// last call, closes it on every core granted to a new holder, and ends
    /// the windows that are over. Called after the replies went out.
    ///
    /// ```
    /// use corewise_arbiter::warm::WarmCores;
    /// use std::time::{Duration, Instant};
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let dir = std::env::temp_dir().join(format!("state-sync-doc-{}", std::process::id()));
    /// for cpu in [2, 3] {
    ///     std::fs::create_dir_all(dir.join(format!("cpu{cpu}/power")))?;
    ///     std::fs::write(dir.join(format!("cpu{cpu}/power/pm_qos_resume_latency_us")), "0")?;
    /// }
    /// let mut s = test_state();
    /// s.set_warm(WarmCores::new(&dir, &[2, 3], Duration::from_millis(5), None));
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// let t0 = Instant::now();
    /// s.sync_warm(t0); // a grant: nothing to keep warm
    /// assert_eq!(s.warm_deadline(), None);
    /// s.remove_conn(2);
    /// s.sync_warm(t0); // a release: its core polls for 5 ms
    /// assert!(s.warm_deadline().is_some());
    /// s.sync_warm(t0 + Duration::from_millis(5)); // and the window ends
    /// assert_eq!(s.warm_deadline(), None);
    /// drop(s);
    /// std::fs::remove_dir_all(&dir)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn sync_warm(&mut self, now: Instant) {
        for &core in &self.managed {
            let before = self.warm_holders.get(&core).copied();
            let after = self.holder.get(&core).copied();
            match (before, after) {
                (Some(_), None) => self.warm.freed(core, now),
                (None, Some(_)) => self.warm.taken(core),
                (Some(a), Some(b)) if a != b => self.warm.taken(core),
                _ => {}
            }
        }
        self.warm_holders.clone_from(&self.holder);
        self.warm.expire(now);
    }

    /// Until when the daemon loop should poll without sleeping.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// use std::time::Duration;
    /// let mut s = test_state();
    /// assert_eq!(s.spin_until(), None);
    /// s.set_release_spin(Duration::from_millis(50));
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.set_requested(1, [0; 8]);
    /// let until = s.spin_until().unwrap();
    /// assert!(until <= s.next_deadline().unwrap() + Duration::from_millis(50));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn spin_until(&self) -> Option<Instant> {
        let until = self.spin_until?;
        (self.next_deadline().is_some() && Instant::now() < until).then_some(until)
    }

    /// Backend name.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// assert_eq!(test_state().fence_name(), "recorder");
    /// ```
    pub fn fence_name(&self) -> &'static str {
        self.fence.name()
    }

    /// The limits of `uid` (looked up once per user).
    ///
    /// ```
    /// use corewise_arbiter::config::Limits;
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// // `test_state` has the default config: no user has limits of its own.
    /// assert_eq!(s.limits_for(1000), Limits::default());
    /// ```
    pub fn limits_for(&mut self, uid: u32) -> Limits {
        if let Some(l) = self.limits_cache.get(&uid) {
            return *l;
        }
        let l = self.config.limits_for(uid);
        self.limits_cache.insert(uid, l);
        l
    }

    /// Registers an application on connection `conn`, whose peer
    /// credentials say `pid` and `uid`; `peer` is a pidfd of the connecting
    /// process where the kernel gives one (see [`super::task::peer_pidfd`]).
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// // The peer credentials of connection 1 say this process and root.
    /// let app = s.add_app(1, pid, 0, None)?;
    /// assert_ne!(app.token(), 0);
    /// assert!(s.is_app(1));
    /// assert_eq!(s.status()[0].pid, pid);
    /// // A process that does not exist cannot register.
    /// assert!(s.add_app(3, i32::MAX as u32, 0, None).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn add_app(
        &mut self,
        conn: ConnId,
        pid: u32,
        uid: u32,
        peer: Option<std::os::fd::OwnedFd>,
    ) -> Result<&App, Reject> {
        let limits = self.limits_for(uid);
        let used = self.usage.get(&uid).map_or(0, |u| u.apps);
        if used >= limits.max_apps {
            return Err(Reject::TooManyApps {
                uid,
                max: limits.max_apps,
            });
        }
        let process = TaskIdent::process(pid).map_err(|_| Reject::ProcessGone(pid))?;
        // The process that connected may have exited, its socket kept by
        // another, and its pid be someone else's now: `process` would then
        // name that someone. Alive after the open, it is the one that
        // connected.
        if peer.as_ref().is_some_and(|p| !super::task::pidfd_alive(p)) {
            return Err(Reject::ProcessGone(pid));
        }
        let shm = SharedPageWriter::create()?;
        self.next_token = self
            .next_token
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        if !process.alive() {
            return Err(Reject::ProcessGone(pid));
        }
        if !process.runs_as(uid) {
            return Err(Reject::NotTheUsers { tid: pid, uid });
        }
        tracing::info!(conn, pid, uid, name = %name.escape_debug(), ?limits, "application registered");
        let app = App {
            token: self.next_token,
            process,
            pid,
            uid,
            name,
            limits,
            requested: [0; PRIORITY_LEVELS],
            shm,
            threads: BTreeSet::new(),
            waiting: BTreeSet::new(),
            held: BTreeMap::new(),
            usable: 0,
            preempted: 0,
        };
        self.tokens.insert(app.token, conn);
        self.usage.entry(uid).or_default().apps += 1;
        Ok(self.apps.entry(conn).or_insert(app))
    }

    /// Applies a core request from the application on `conn`.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// s.add_app(1, pid, 0, None)?;
    /// s.set_requested(1, [0, 2, 0, 0, 0, 0, 0, 0]);
    /// assert_eq!(s.outbox.pop(), Some((1, Response::RequestAck { effective: [0, 2, 0, 0, 0, 0, 0, 0], clipped: false })));
    /// assert_eq!(s.status()[0].requested, [0, 2, 0, 0, 0, 0, 0, 0]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn set_requested(&mut self, conn: ConnId, counts: [u32; PRIORITY_LEVELS]) {
        let Some(app) = self.apps.get_mut(&conn) else {
            return;
        };
        let c = app.limits.clip(counts);
        if c.clipped {
            tracing::info!(conn, pid = app.pid, uid = app.uid, ?counts, effective = ?c.effective, "request clipped by limits");
        }
        app.requested = c.effective;
        self.touch(conn);
        self.rebalance(Instant::now());
        // The acknowledgement goes out after any grant it caused: waking the
        // requester first could delay the granted thread's wake-up.
        self.outbox.push((
            conn,
            Response::RequestAck {
                effective: c.effective,
                clipped: c.clipped,
            },
        ));
    }

    /// Attaches a kernel-thread connection to its application.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// // Connection 2's peer (this process) attaches its thread `tid`.
    /// s.attach_thread(2, token, tid, pid)?;
    /// assert_eq!(s.outbox.pop(), Some((2, Response::Attached)));
    /// // Only the registered process may attach threads to it.
    /// assert!(s.attach_thread(3, token, tid, pid + 1).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn attach_thread(
        &mut self,
        conn: ConnId,
        token: u64,
        tid: u32,
        peer_pid: u32,
    ) -> Result<(), Reject> {
        let app_conn = *self.tokens.get(&token).ok_or(Reject::BadToken)?;
        let app = self.apps.get(&app_conn).ok_or(Reject::BadToken)?;
        if app.pid != peer_pid {
            return Err(Reject::WrongProcess {
                peer: peer_pid,
                app: app.pid,
            });
        }
        if self.tids.contains_key(&tid) {
            return Err(Reject::Duplicate(tid));
        }
        let uid = app.uid;
        let max = app.limits.max_threads;
        if self.usage.get(&uid).map_or(0, |u| u.threads) >= max {
            return Err(Reject::TooManyThreads { uid, max });
        }
        // Opened through the pid, then the process checked again: the
        // thread belongs to the process that registered, not to a later
        // holder of its pid.
        let task = TaskIdent::thread(peer_pid, tid)
            .map_err(|_| Reject::ForeignThread { tid, pid: peer_pid })?;
        if !app.process.alive() {
            return Err(Reject::ProcessGone(peer_pid));
        }
        if !task.runs_as(uid) {
            return Err(Reject::NotTheUsers { tid, uid });
        }
        if self.fence.adopt(peer_pid, tid)? {
            check_adopted(&app.process);
        }
        if !task.alive() {
            return Err(Reject::ForeignThread { tid, pid: peer_pid });
        }
        self.threads.insert(
            conn,
            Thread {
                app: app_conn,
                uid,
                task,
                phase: Phase::Idle,
                gone: false,
            },
        );
        self.tids.insert(tid, conn);
        self.usage.entry(uid).or_default().threads += 1;
        if let Some(app) = self.apps.get_mut(&app_conn) {
            app.threads.insert(conn);
        }
        self.outbox.push((conn, Response::Attached));
        Ok(())
    }

    /// The kernel thread of connection `conn` (peer process `peer_pid`) is
    /// `tid` from now on: the application handed its core to a spare
    /// kernel thread. `tid` must be a live thread of the application's
    /// process that no connection has attached. If the connection holds a
    /// core, `tid` joins its cpuset first (checked before and after the
    /// write, as every move is) and the thread it replaces goes back to the
    /// unmanaged set if it is still the thread that attached. It replaces
    /// a thread, so the user's thread count does not change. A refusal
    /// changes nothing; the reply ([`Response::Replaced`]) is queued on
    /// success.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// // A spare kernel thread of this process takes over connection 2.
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    /// let spare = std::thread::spawn(move || {
    ///     tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32).unwrap();
    ///     let _ = stop_rx.recv();
    /// });
    /// let other = rx.recv()?;
    /// s.replace_thread(2, other, pid)?;
    /// assert_eq!(s.outbox.pop(), Some((2, Response::Replaced)));
    /// // Its old thread id is free to attach again.
    /// s.attach_thread(3, token, tid, pid)?;
    /// stop_tx.send(())?;
    /// spare.join().unwrap();
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn replace_thread(&mut self, conn: ConnId, tid: u32, peer_pid: u32) -> Result<(), Reject> {
        let t = self.threads.get(&conn).ok_or(Reject::BadToken)?;
        if t.gone {
            return Err(Reject::ProcessGone(peer_pid));
        }
        let (app_conn, old_tid, phase) = (t.app, t.task.tid(), t.phase);
        if tid == old_tid {
            self.outbox.push((conn, Response::Replaced));
            return Ok(());
        }
        if self.tids.contains_key(&tid) {
            return Err(Reject::Duplicate(tid));
        }
        let app = self.apps.get(&app_conn).ok_or(Reject::BadToken)?;
        let pid = app.pid;
        if pid != peer_pid {
            return Err(Reject::WrongProcess {
                peer: peer_pid,
                app: pid,
            });
        }
        // `/proc/PID/task/TID` exists only for a thread of PID: the same
        // thread group, opened through the registered process's pid and
        // that process checked again after the open.
        let task = TaskIdent::thread(pid, tid).map_err(|_| Reject::ForeignThread { tid, pid })?;
        if !app.process.alive() {
            return Err(Reject::ProcessGone(pid));
        }
        if !task.runs_as(app.uid) {
            return Err(Reject::NotTheUsers { tid, uid: app.uid });
        }
        if self.fence.adopt(pid, tid)? {
            check_adopted(&app.process);
        }
        if let Phase::Running { core, .. } = phase {
            self.fence.confine(tid, core)?;
            // Checked again after the write, as `move_thread` does: the id
            // may have gone to another task, or the thread run a
            // set-user-ID program, in between.
            let gone = !task.alive();
            if gone || !task.runs_as(app.uid) {
                // Put it back out of the managed core.
                match self.fence.unconfine(tid) {
                    Ok(()) | Err(FenceError::NoSuchThread(_)) => {}
                    Err(e) => {
                        tracing::error!(tid, error = %e, "could not undo a move of a reused thread id")
                    }
                }
                return Err(if gone {
                    Reject::ForeignThread { tid, pid }
                } else {
                    Reject::NotTheUsers { tid, uid: app.uid }
                });
            }
        } else if !task.alive() {
            return Err(Reject::ForeignThread { tid, pid });
        }
        let Some(t) = self.threads.get_mut(&conn) else {
            return Err(Reject::BadToken);
        };
        let old = std::mem::replace(&mut t.task, task);
        self.tids.remove(&old_tid);
        self.tids.insert(tid, conn);
        if let Phase::Running { core, .. } = phase {
            if let Some(a) = self.apps.get(&app_conn) {
                a.shm.set_granted(core, tid);
            }
            // The replaced thread leaves the core, unless its id now names
            // another task (checked right before the write).
            if old.alive() {
                match self.fence.unconfine(old_tid) {
                    Ok(()) | Err(FenceError::NoSuchThread(_)) => {}
                    Err(e) => {
                        tracing::warn!(conn, tid = old_tid, error = %e, "could not move a replaced thread back to the unmanaged set")
                    }
                }
            }
        }
        tracing::debug!(conn, pid, old_tid, tid, ?phase, "kernel thread replaced");
        self.outbox.push((conn, Response::Replaced));
        Ok(())
    }

    /// The thread on `conn` gives back its core (if any) and waits for one.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.block(2); // the application wants no core yet: the thread waits
    /// assert!(s.status()[0].granted.is_empty());
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// assert!(s.outbox.iter().any(|r| matches!(r, (2, Response::Granted { .. }))));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn block(&mut self, conn: ConnId) {
        if self.threads.get(&conn).is_none_or(|t| t.gone) {
            return;
        }
        let now = Instant::now();
        self.release_core_of(conn, true);
        if self.threads.get(&conn).is_some_and(|t| !t.gone) {
            self.set_phase(conn, Phase::Waiting);
        }
        self.rebalance(now);
    }

    /// Moves thread `conn` into a phase, keeping every index in step.
    fn set_phase(&mut self, conn: ConnId, new: Phase) {
        let Some(t) = self.threads.get_mut(&conn) else {
            return;
        };
        let old = std::mem::replace(&mut t.phase, new);
        let app_id = t.app;
        if let Phase::Running { core, deadline } = old {
            if let Some(d) = deadline {
                self.deadlines.remove(&(d, conn));
            }
            if self.holder.get(&core) == Some(&conn) {
                self.holder.remove(&core);
                self.dirty.insert(core);
            }
        }
        if let Phase::Running { core, deadline } = new {
            if let Some(d) = deadline {
                self.deadlines.insert((d, conn));
            }
            self.holder.insert(core, conn);
        }
        if let Some(a) = self.apps.get_mut(&app_id) {
            match old {
                Phase::Idle => {}
                Phase::Waiting => {
                    a.waiting.remove(&conn);
                }
                Phase::Running { core, .. } => {
                    a.held.remove(&core);
                }
            }
            match new {
                Phase::Idle => {}
                Phase::Waiting => {
                    a.waiting.insert(conn);
                }
                Phase::Running { core, .. } => {
                    a.held.insert(core, conn);
                }
            }
            a.usable = (a.usable + u32::from(new != Phase::Idle))
                .saturating_sub(u32::from(old != Phase::Idle));
        }
        self.touch(app_id);
    }

    /// Files application `id` as active or not.
    fn touch(&mut self, id: ConnId) {
        let active = self.apps.get(&id).is_some_and(|a| {
            !a.held.is_empty() || (a.usable > 0 && a.requested.iter().any(|&n| n > 0))
        });
        if active {
            self.active.insert(id);
        } else {
            self.active.remove(&id);
        }
    }

    /// Moves thread `conn` to `core` (or back to the unmanaged set), checking
    /// right before and right after the write that its id still names the
    /// thread that attached. A thread found gone is dropped; if its id was
    /// taken by another task while the write happened, that task is put
    /// back out of the managed core (into the unmanaged set, where the tasks
    /// of the daemon's root live).
    fn move_thread(&mut self, conn: ConnId, to: Option<CoreId>) -> Result<(), FenceError> {
        let Some(t) = self.threads.get(&conn) else {
            return Err(FenceError::NoSuchThread(0));
        };
        let tid = t.task.tid();
        if t.gone || !t.task.alive() {
            tracing::info!(conn, tid, "thread gone (or its id reused); dropping it");
            self.forget(conn);
            return Err(FenceError::NoSuchThread(tid));
        }
        if to.is_some() && !t.task.runs_as(t.uid) {
            // Its process ran a set-user-ID program (or took back a saved
            // id) since it attached: the user's grant does not move it.
            tracing::warn!(
                conn,
                tid,
                uid = t.uid,
                "thread no longer runs as its connection's user; dropping it"
            );
            self.forget(conn);
            return Err(FenceError::NoSuchThread(tid));
        }
        let r = match to {
            Some(core) => self.fence.confine(tid, core),
            None => self.fence.unconfine(tid),
        };
        // Checked again after the write: the thread may have run a
        // set-user-ID program (an exec keeps the task) in between.
        let still_ok = |t: &Thread| t.task.alive() && (to.is_none() || t.task.runs_as(t.uid));
        if self.threads.get(&conn).is_some_and(still_ok) {
            return r;
        }
        if to.is_some() && r.is_ok() {
            match self.fence.unconfine(tid) {
                Ok(()) | Err(FenceError::NoSuchThread(_)) => {}
                Err(e) => {
                    tracing::error!(tid, error = %e, "could not undo a move of a reused thread id")
                }
            }
        }
        tracing::warn!(
            conn,
            tid,
            "thread went away (or changed user) during a move; undone and dropped"
        );
        self.forget(conn);
        Err(FenceError::NoSuchThread(tid))
    }

    /// Marks thread `conn` gone: it gives up its core (without any cgroup
    /// write naming it) and its connection is closed.
    fn forget(&mut self, conn: ConnId) {
        let Some(t) = self.threads.get_mut(&conn) else {
            return;
        };
        t.gone = true;
        let (app, phase) = (t.app, t.phase);
        if let Phase::Running { core, .. } = phase {
            if let Some(a) = self.apps.get(&app) {
                a.shm.set_release(core, false);
                a.shm.set_granted(core, 0);
            }
        }
        self.set_phase(conn, Phase::Idle);
        self.to_close.push(conn);
    }

    /// Takes the core held by thread `conn` back into the free pool.
    fn release_core_of(&mut self, conn: ConnId, unconfine: bool) -> Option<CoreId> {
        let t = self.threads.get(&conn)?;
        let Phase::Running { core, .. } = t.phase else {
            return None;
        };
        let app = t.app;
        self.set_phase(conn, Phase::Idle);
        if let Some(a) = self.apps.get(&app) {
            a.shm.set_release(core, false);
            a.shm.set_granted(core, 0);
        }
        if unconfine {
            match self.move_thread(conn, None) {
                Ok(()) | Err(FenceError::NoSuchThread(_)) => {}
                Err(e) => {
                    tracing::warn!(conn, error = %e, "could not move thread back to the unmanaged set")
                }
            }
        }
        Some(core)
    }

    /// Removes thread `conn` from every index (its core is already given back).
    fn drop_thread(&mut self, conn: ConnId) {
        self.set_phase(conn, Phase::Idle);
        let Some(th) = self.threads.remove(&conn) else {
            return;
        };
        if self.tids.get(&th.task.tid()) == Some(&conn) {
            self.tids.remove(&th.task.tid());
        }
        if let Some(u) = self.usage.get_mut(&th.uid) {
            u.threads = u.threads.saturating_sub(1);
        }
        if let Some(a) = self.apps.get_mut(&th.app) {
            a.threads.remove(&conn);
        }
        self.touch(th.app);
    }

    /// Forgets connection `conn` (application or thread); a closed
    /// application socket gives back all its cores at once.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// // The application's control socket closed: its threads go too.
    /// s.remove_conn(1);
    /// assert!(!s.is_app(1) && !s.is_thread(2));
    /// assert!(s.to_close.contains(&2));
    /// assert!(s.status().is_empty());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn remove_conn(&mut self, conn: ConnId) {
        if let Some(threads) = self.apps.get(&conn).map(|a| a.threads.clone()) {
            // Its threads first (their cores back, checked moves), then the
            // application.
            for t in threads {
                self.release_core_of(t, true);
                self.drop_thread(t);
                self.to_close.push(t);
            }
            if let Some(app) = self.apps.remove(&conn) {
                tracing::info!(conn, pid = app.pid, "application gone");
                self.tokens.remove(&app.token);
                if let Some(u) = self.usage.get_mut(&app.uid) {
                    u.apps = u.apps.saturating_sub(1);
                }
            }
            self.active.remove(&conn);
        } else if self.threads.contains_key(&conn) {
            self.release_core_of(conn, true);
            self.drop_thread(conn);
        } else {
            return;
        }
        self.rebalance(Instant::now());
    }

    /// Earliest pending reclaim deadline.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// use std::time::{Duration, Instant};
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// assert_eq!(s.next_deadline(), None);
    /// let asked = Instant::now();
    /// s.set_requested(1, [0; 8]); // asks for the core back, 10 ms to comply
    /// let d = s.next_deadline().unwrap();
    /// assert!(d >= asked + Duration::from_millis(10));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_deadline(&self) -> Option<Instant> {
        self.deadlines.first().map(|d| d.0)
    }

    /// Forces out every thread whose release deadline has passed.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// use std::time::Duration;
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.set_requested(1, [0; 8]);
    /// let late = s.next_deadline().unwrap() + Duration::from_millis(1);
    /// s.outbox.clear();
    /// s.expire(late); // the thread did not give its core back in time
    /// assert!(matches!(s.outbox[..], [(2, Response::Preempted { .. })]));
    /// assert_eq!(s.status()[0].preempted, 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn expire(&mut self, now: Instant) {
        let late: Vec<ConnId> = self
            .deadlines
            .iter()
            .take_while(|d| d.0 <= now)
            .map(|d| d.1)
            .collect();
        if late.is_empty() {
            return;
        }
        for conn in late {
            let Some(core) = self.release_core_of(conn, true) else {
                continue;
            };
            let Some(t) = self.threads.get(&conn) else {
                continue;
            };
            if let Some(app) = self.apps.get_mut(&t.app) {
                app.preempted += 1;
                app.shm.add_preempted();
                tracing::info!(
                    pid = app.pid,
                    tid = t.task.tid(),
                    core,
                    "core reclaimed by force"
                );
            }
            if !t.gone {
                self.outbox.push((conn, Response::Preempted { core }));
            }
        }
        self.rebalance(now);
    }

    /// Cores held by application `id`: (thread, core, release pending).
    fn held_by(&self, id: ConnId) -> Vec<(ConnId, CoreId, bool)> {
        let Some(a) = self.apps.get(&id) else {
            return Vec::new();
        };
        a.held
            .iter()
            .map(|(&core, &tc)| {
                let releasing = self.threads.get(&tc).is_some_and(|t| {
                    matches!(
                        t.phase,
                        Phase::Running {
                            deadline: Some(_),
                            ..
                        }
                    )
                });
                (tc, core, releasing)
            })
            .collect()
    }

    /// Recomputes the allocation and carries it out: asks for releases,
    /// withdraws releases no longer needed, grants free cores to waiting
    /// threads. Costs O(active applications), whatever the number of idle
    /// applications and threads.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// use std::time::Instant;
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [1, 0, 0, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// s.outbox.clear();
    /// // Nothing changed: the allocation stays as it is, no new messages.
    /// s.rebalance(Instant::now());
    /// assert!(s.outbox.is_empty());
    /// assert_eq!(s.status()[0].granted.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn rebalance(&mut self, now: Instant) {
        let app_ids: Vec<ConnId> = self
            .active
            .iter()
            .copied()
            .filter(|id| self.apps.contains_key(id))
            .collect();
        let demands: Vec<Demand> = app_ids
            .iter()
            .filter_map(|id| self.apps.get(id))
            .map(|a| Demand {
                requested: a.requested,
                cap: a.limits.max_cores.min(a.usable),
                held: a.held.len() as u32,
                user: a.uid,
                user_cap: a.limits.max_cores,
            })
            .collect();
        // Hyperthread siblings stay with one application (see the policy).
        let held_now: Vec<Vec<CoreId>> = app_ids
            .iter()
            .map(|id| {
                self.apps
                    .get(id)
                    .map_or_else(Vec::new, |a| a.held.keys().copied().collect())
            })
            .collect();
        let shares = whole_core_targets(&demands, &held_now, &self.managed, &self.topo);
        let target: Vec<u32> = shares.iter().map(|s| s.cpus).collect();

        // Releases (only applications holding cores can give any back):
        // down to the share's CPUs, on at most its physical cores.
        for (i, &id) in app_ids.iter().enumerate() {
            if self.apps.get(&id).is_none_or(|a| a.held.is_empty()) {
                continue;
            }
            let held = self.held_by(id);
            let releasing = held.iter().filter(|h| h.2).count() as u32;
            let keep = held.len() as u32 - releasing;
            let mut candidates: Vec<CoreId> = held.iter().filter(|h| !h.2).map(|h| h.1).collect();
            if keep > target[i] || cores_spanned(&candidates, &self.topo) > shares[i].cores {
                while candidates.len() as u32 > target[i]
                    || cores_spanned(&candidates, &self.topo) > shares[i].cores
                {
                    let Some(v) = choose_victim(&candidates, &self.topo) else {
                        break;
                    };
                    candidates.retain(|&c| c != v);
                    if let Some((tc, _, _)) = held.iter().find(|h| h.1 == v) {
                        self.set_phase(
                            *tc,
                            Phase::Running {
                                core: v,
                                deadline: Some(now + self.timeout),
                            },
                        );
                    }
                    if let Some(a) = self.apps.get(&id) {
                        a.shm.set_release(v, true);
                    }
                    // The core is about to fall idle and be granted again:
                    // keep it polling through the hand-over.
                    self.warm.freed(v, now);
                    self.spin_until = Some(now + self.release_spin);
                    tracing::debug!(app = id, core = v, "release requested");
                }
            } else if keep < target[i] && releasing > 0 {
                for (tc, core, _) in held.iter().filter(|h| h.2) {
                    candidates.push(*core);
                    if candidates.len() as u32 > target[i]
                        || cores_spanned(&candidates, &self.topo) > shares[i].cores
                    {
                        candidates.pop();
                        continue;
                    }
                    self.set_phase(
                        *tc,
                        Phase::Running {
                            core: *core,
                            deadline: None,
                        },
                    );
                    if let Some(a) = self.apps.get(&id) {
                        a.shm.set_release(*core, false);
                    }
                }
            }
        }

        // Grants, most important applications first.
        let level_of = |a: &App| {
            a.requested
                .iter()
                .position(|&n| n > 0)
                .unwrap_or(PRIORITY_LEVELS)
        };
        // Only applications below their target with a thread waiting.
        let mut order: Vec<usize> = (0..app_ids.len())
            .filter(|&i| {
                self.apps
                    .get(&app_ids[i])
                    .is_some_and(|a| (a.held.len() as u32) < target[i] && !a.waiting.is_empty())
            })
            .collect();
        order.sort_by_key(|&i| {
            (
                self.apps.get(&app_ids[i]).map_or(PRIORITY_LEVELS, level_of),
                i,
            )
        });
        let mut free: Vec<CoreId> = self
            .managed
            .iter()
            .copied()
            .filter(|c| !self.holder.contains_key(c))
            .collect();
        let mut grants: Vec<(ConnId, ConnId, CoreId)> = Vec::new();
        // Which application each CPU belongs to, grants of this pass included.
        let mut owner: BTreeMap<CoreId, ConnId> = self
            .holder
            .iter()
            .filter_map(|(&c, tc)| self.threads.get(tc).map(|t| (c, t.app)))
            .collect();
        for i in order {
            let id = app_ids[i];
            let Some(a) = self.apps.get(&id) else {
                continue;
            };
            let mut mine: Vec<CoreId> = a.held.keys().copied().collect();
            let mut waiting = a.waiting.iter().copied();
            while (mine.len() as u32) < target[i] && !free.is_empty() {
                let Some(tc) = waiting.next() else {
                    break;
                };
                // Free CPUs whose siblings are free or this application's,
                // within its share of physical cores.
                let open: Vec<CoreId> = free
                    .iter()
                    .copied()
                    .filter(|&c| {
                        let sibs = self.topo.siblings(c);
                        sibs.iter().all(|s| owner.get(s).is_none_or(|&a| a == id)) && {
                            let mut with = mine.clone();
                            with.push(c);
                            cores_spanned(&with, &self.topo) <= shares[i].cores
                        }
                    })
                    .collect();
                let Some(core) = choose_core(&open, &mine, &self.topo) else {
                    break;
                };
                free.retain(|&c| c != core);
                owner.insert(core, id);
                mine.push(core);
                grants.push((id, tc, core));
            }
        }
        if grants.is_empty() {
            self.sync_unmanaged();
            return;
        }
        // Take the cores out of the unmanaged set first, then move threads.
        for &(_, tc, core) in &grants {
            self.holder.insert(core, tc);
        }
        self.sync_unmanaged();
        let mut failed = false;
        for (app, tc, core) in grants {
            // What a previous holder left in the set was moved out by `tidy`
            // when it left (a set that could not be emptied stays marked and
            // is tried again), so nothing is read on the grant's path.
            match self.move_thread(tc, Some(core)) {
                Ok(()) => {
                    self.set_phase(
                        tc,
                        Phase::Running {
                            core,
                            deadline: None,
                        },
                    );
                    let tid = self.threads.get(&tc).map_or(0, |t| t.task.tid());
                    if let Some(a) = self.apps.get(&app) {
                        a.shm.set_granted(core, tid);
                    }
                    self.outbox.push((tc, Response::Granted { core }));
                    tracing::debug!(app, tid, core, "core granted");
                }
                Err(e) => {
                    tracing::warn!(conn = tc, core, error = %e, "could not confine thread; dropping it");
                    if self.holder.get(&core) == Some(&tc) {
                        self.holder.remove(&core);
                    }
                    self.forget(tc);
                    failed = true;
                }
            }
        }
        if failed {
            self.sync_unmanaged();
        }
    }

    /// Empties the set of every core marked since it was last emptied of
    /// everything but its holder: threads and processes start in their
    /// parent's cpuset, so a thread that held a core may have left children
    /// there, which would share the core with its next holder (also one of
    /// another user) and keep running there after their own application's
    /// grant ended. The daemon calls it when it has answered everything,
    /// before it waits, so the `tasks` file it reads (some microseconds)
    /// stays off a grant's path; a holder's own children stay with it while
    /// it holds the core. A process with no thread on a core moves whole
    /// (atomic with its forks); a holding process's threads move one by
    /// one, and a set they keep repopulating stays marked, tried again
    /// every millisecond. Returns how many sets were read.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # struct Recorder;
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, _: u32, _: u32) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn unconfine(&mut self, _: u32) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// let mut s = State::new(
    ///     Box::new(Recorder),
    ///     "0-3".parse().unwrap(),
    ///     vec![2, 3],
    ///     corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    ///     std::time::Duration::from_millis(10),
    ///     Default::default(),
    /// );
    /// // The first pass reads both managed sets (a crashed daemon's
    /// // leftovers); then nothing was granted, so nothing is read.
    /// assert_eq!(s.tidy(), 2);
    /// assert_eq!(s.tidy(), 0);
    /// ```
    pub fn tidy(&mut self) -> usize {
        let marked = std::mem::take(&mut self.dirty);
        if marked.is_empty() {
            return 0;
        }
        // Processes with a thread on a core move thread by thread; any
        // other process found in a set moves whole.
        let holding: BTreeSet<u32> = self
            .holder
            .values()
            .filter_map(|tc| self.threads.get(tc))
            .filter_map(|t| self.apps.get(&t.app))
            .map(|a| a.pid)
            .collect();
        let whole = |tgid: u32| !holding.contains(&tgid);
        for &c in &marked {
            let keep = self
                .holder
                .get(&c)
                .and_then(|tc| self.threads.get(tc))
                .map(|t| t.task.tid());
            let mut left = self.fence.evacuate(c, keep, &whole);
            if left > 0 {
                left = self.evacuate_holders(c, keep, &holding);
            }
            if left > 0 {
                // Tried again at once.
                tracing::warn!(
                    core = c,
                    left,
                    "tasks left on a core could not all be moved out yet"
                );
                self.dirty.insert(c);
            }
        }
        marked.len()
    }

    /// What [`tidy`](Self::tidy)'s thread-by-thread moves left on `core`
    /// (but `keep`) that belongs to a process holding another core: its
    /// threads there replace themselves faster than they can be moved one
    /// by one, which would keep them on a core granted to someone else for
    /// as long as the process liked. Each such process moves out whole
    /// (one write, atomic with its forks), and its threads that hold cores
    /// are confined to them again at once. Returns the tasks still left.
    fn evacuate_holders(
        &mut self,
        core: CoreId,
        keep: Option<u32>,
        holding: &BTreeSet<u32>,
    ) -> usize {
        for pid in self.fence.processes_in(core, keep) {
            if !holding.contains(&pid) {
                continue;
            }
            // The registered process, known by identity: alive after the
            // fence opened `pid`, it is the one the write moves.
            let Some(app) = self.apps.values().find(|a| a.pid == pid) else {
                continue;
            };
            let process = &app.process;
            if !self.fence.evacuate_process(pid, &|| process.alive()) {
                continue;
            }
            let holders: Vec<(ConnId, CoreId)> = self
                .holder
                .iter()
                .filter(|(_, tc)| {
                    self.threads
                        .get(tc)
                        .and_then(|t| self.apps.get(&t.app))
                        .is_some_and(|a| a.pid == pid)
                })
                .map(|(&c, &tc)| (tc, c))
                .collect();
            tracing::warn!(
                pid,
                core,
                holders = holders.len(),
                "a process holding cores kept threads on a core it gave up; \
                 moved it out whole and its core threads back"
            );
            for (tc, c) in holders {
                if let Err(e) = self.move_thread(tc, Some(c)) {
                    tracing::warn!(conn = tc, core = c, error = %e, "could not confine a holder again");
                }
            }
        }
        self.fence
            .members(core)
            .into_iter()
            .filter(|&t| Some(t) != keep)
            .count()
    }

    /// Whether [`State::tidy`] has sets left to empty (the daemon then
    /// does not wait before its next pass).
    pub fn untidy(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// The unmanaged set: every CPU but the physical cores that hold a
    /// grant (a granted CPU's idle sibling stays fenced too: it belongs to
    /// the same application).
    fn sync_unmanaged(&mut self) {
        let set: CpuList =
            self.all
                .cores()
                .filter(|&c| {
                    !self.holder.keys().any(|&h| {
                        h == c || (self.managed.contains(&c) && self.topo.are_siblings(h, c))
                    })
                })
                .collect();
        if let Err(e) = self.fence.set_unmanaged(&set) {
            tracing::error!(error = %e, "could not update the unmanaged set");
        }
    }

    /// The status table.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// s.set_requested(1, [0, 0, 1, 0, 0, 0, 0, 0]);
    /// s.block(2);
    /// let table = s.status();
    /// assert_eq!((table[0].pid, table[0].uid), (pid, 0));
    /// assert_eq!(table[0].requested, [0, 0, 1, 0, 0, 0, 0, 0]);
    /// assert_eq!(table[0].granted.len(), 1);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn status(&self) -> Vec<StatusEntry> {
        self.apps
            .iter()
            .map(|(&id, a)| {
                let granted: Vec<u32> = self.held_by(id).iter().map(|h| h.1).collect();
                StatusEntry {
                    pid: a.pid,
                    uid: a.uid,
                    name: a.name.clone(),
                    requested: a.requested,
                    granted,
                    preempted: a.preempted,
                }
            })
            .collect()
    }

    /// Tells every application the daemon is leaving and dismantles the fence.
    ///
    /// ```
    /// use corewise_arbiter::shm::SharedPageReader;
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let page = SharedPageReader::map(s.add_app(1, pid, 0, None)?.shm().fd())?;
    /// s.shutdown()?;
    /// assert!(page.shutdown());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn shutdown(&mut self) -> Result<(), FenceError> {
        for a in self.apps.values() {
            a.shm.set_shutdown();
        }
        self.warm.restore_all();
        self.fence.teardown()
    }

    /// Whether `conn` is a registered application.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// assert!(s.is_app(1));
    /// assert!(!s.is_app(2)); // a thread's connection
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_app(&self, conn: ConnId) -> bool {
        self.apps.contains_key(&conn)
    }

    /// Whether `conn` is an attached kernel thread.
    ///
    /// ```
    /// # use corewise_arbiter::daemon::state::State;
    /// # use corewise_arbiter::protocol::Response;
    /// # // A backend that only records what it is asked, so no thread moves.
    /// # struct Recorder(std::sync::Arc<std::sync::Mutex<Vec<(u32, Option<u32>)>>>);
    /// # impl corewise_arbiter::fence::Fence for Recorder {
    /// #     fn name(&self) -> &'static str { "recorder" }
    /// #     fn set_unmanaged(&mut self, _: &corewise_arbiter::topology::CpuList) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// #     fn confine(&mut self, tid: u32, core: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, Some(core))); Ok(()) }
    /// #     fn unconfine(&mut self, tid: u32) -> Result<(), corewise_arbiter::fence::FenceError> { self.0.lock().unwrap().push((tid, None)); Ok(()) }
    /// #     fn members(&self, _: u32) -> Vec<u32> { Vec::new() }
    /// #     fn teardown(&mut self) -> Result<(), corewise_arbiter::fence::FenceError> { Ok(()) }
    /// # }
    /// # // CPUs 0-3, 2 and 3 managed, with a 10 ms release timeout.
    /// # fn test_state() -> State {
    /// #     State::new(
    /// #         Box::new(Recorder(Default::default())),
    /// #         "0-3".parse().unwrap(),
    /// #         vec![2, 3],
    /// #         corewise_arbiter::topology::Topology::synthetic(1, 4, 1),
    /// #         std::time::Duration::from_millis(10),
    /// #         Default::default(),
    /// #     )
    /// # }
    /// # let (pid, tid) = (std::process::id(), rustix::thread::gettid().as_raw_nonzero().get() as u32);
    /// let mut s = test_state();
    /// let token = s.add_app(1, pid, 0, None)?.token();
    /// s.attach_thread(2, token, tid, pid)?;
    /// assert!(s.is_thread(2));
    /// s.remove_conn(2);
    /// assert!(!s.is_thread(2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_thread(&self, conn: ConnId) -> bool {
        self.threads.contains_key(&conn)
    }
}
