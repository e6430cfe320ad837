//! Core fencing backends: how a granted core is made exclusive.
//!
//! Why several: the arbiter's guarantee ("only this kernel thread runs on this
//! core") needs the kernel's help. cgroup v1 cpusets (Arachne's mechanism) and
//! cgroup v2 cpusets in a threaded subtree both confine *every* task: the
//! unmanaged set, holding everything else, loses the core while it is granted.
//! Where neither is writable the affinity backend only pins the client threads
//! with `sched_setaffinity`; other processes may still run on a granted core,
//! so it is weaker and documented as such.
//!
//! Every backend keeps files open for the hot path (moving a thread, changing
//! the unmanaged set) so a grant costs two `pwrite`s.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use thiserror::Error;

use crate::daemon::task::TaskIdent;
use crate::topology::{CoreId, CpuList};

/// A fencing failure.
///
/// ```
/// use corewise_arbiter::fence::{AffinityFence, CgroupFence, CgroupVersion, Fence, FenceError};
/// let all = "0-1".parse().unwrap();
/// let missing = CgroupFence::new(CgroupVersion::V1, std::path::Path::new("/nonexistent/corewise"), &all, &[1]);
/// assert!(matches!(missing, Err(FenceError::Unavailable(_))));
/// // A thread id that names no task.
/// let mut f = AffinityFence::new(&all);
/// assert!(matches!(f.confine(i32::MAX as u32, 1), Err(FenceError::NoSuchThread(_))));
/// ```
#[derive(Debug, Error)]
pub enum FenceError {
    /// A cgroup file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// OS error.
        source: io::Error,
    },
    /// The thread no longer exists.
    #[error("thread {0} is gone")]
    NoSuchThread(u32),
    /// A system call failed.
    #[error("{op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// OS error.
        source: rustix::io::Errno,
    },
    /// The backend cannot be used here.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

/// The operations the daemon needs from a backend.
///
/// ```
/// # // A stand-in for a cgroup v1 cpuset directory: the files the kernel
/// # // would create in it (and in the sets the fence makes), as plain files.
/// # fn fake_v1_root(name: &str) -> std::io::Result<std::path::PathBuf> {
/// #     let root = std::env::temp_dir().join(format!("fence-doc-{name}-{}", std::process::id()));
/// #     std::fs::create_dir_all(&root)?;
/// #     std::fs::write(root.join("cpuset.cpus"), "0-1\n")?;
/// #     std::fs::write(root.join("cpuset.mems"), "0\n")?;
/// #     std::fs::write(root.join("tasks"), "")?;
/// #     for set in [corewise_arbiter::fence::UNMANAGED_DIR, "corewise-core1"] {
/// #         std::fs::create_dir_all(root.join(set))?;
/// #         std::fs::write(root.join(set).join("tasks"), "")?;
/// #     }
/// #     Ok(root)
/// # }
/// use corewise_arbiter::fence::{read_ids, CgroupFence, CgroupVersion, Fence};
/// let root = fake_v1_root("trait")?;
/// let mut fence: Box<dyn Fence> = Box::new(CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1])?);
/// assert_eq!(fence.name(), "cgroup-v1");
/// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
/// fence.confine(tid, 1)?;
/// assert_eq!(fence.members(1), vec![tid]);
/// fence.unconfine(tid)?;
/// assert_eq!(read_ids(&root.join("corewise-unmanaged/tasks")), vec![tid]);
/// drop(fence);
/// std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait Fence: Send {
    /// Short name for logs.
    fn name(&self) -> &'static str;
    /// Called once per attached kernel thread before it is ever confined;
    /// returns whether it moved the thread's whole process by pid (cgroup
    /// v2), which the caller then checks again.
    fn adopt(&mut self, _pid: u32, _tid: u32) -> Result<bool, FenceError> {
        Ok(false)
    }
    /// Sets the CPUs of the unmanaged set.
    fn set_unmanaged(&mut self, cpus: &CpuList) -> Result<(), FenceError>;
    /// Confines `tid` to `core` (the core must already be out of the unmanaged set).
    fn confine(&mut self, tid: u32, core: CoreId) -> Result<(), FenceError>;
    /// Moves `tid` back to the unmanaged set.
    fn unconfine(&mut self, tid: u32) -> Result<(), FenceError>;
    /// Threads currently confined to `core`, as the kernel sees it.
    fn members(&self, core: CoreId) -> Vec<u32>;
    /// Moves every task in `core`'s set but `keep` to the unmanaged set and
    /// returns how many tasks are still there after (0: emptied). A
    /// confined thread's children (threads and processes) start in its set
    /// and stay there after the thread leaves, so a core must be emptied
    /// before it is granted again. A task whose process `whole` accepts
    /// (one with no thread that must stay on a core) moves with its whole
    /// process in one write, which the kernel makes atomic with the
    /// process's forks: threads that replace themselves faster than they
    /// can be moved one by one go too. Backends without sets of their own
    /// do nothing.
    fn evacuate(
        &mut self,
        _core: CoreId,
        _keep: Option<u32>,
        _whole: &dyn Fn(u32) -> bool,
    ) -> usize {
        0
    }
    /// The processes (thread groups) of the tasks in `core`'s set but
    /// `keep`: after an [`evacuate`](Self::evacuate) that left some, whose
    /// they are. Backends without sets of their own have none.
    fn processes_in(&self, _core: CoreId, _keep: Option<u32>) -> BTreeSet<u32> {
        BTreeSet::new()
    }
    /// Moves process `pid` whole to the unmanaged set, in one write the
    /// kernel makes atomic with its forks (its threads on cores move too:
    /// the caller confines them again); returns whether it moved. The
    /// process is opened before `witness` is asked whether a task known by
    /// identity to belong to it is still alive, so the write cannot move
    /// another process that took the pid. For a process that holds a core
    /// and whose threads on another core replace themselves faster than
    /// [`evacuate`](Self::evacuate) moves them one by one. Backends without
    /// sets of their own do nothing.
    fn evacuate_process(&mut self, _pid: u32, _witness: &dyn Fn() -> bool) -> bool {
        false
    }
    /// Moves everything back where it came from and removes what was created.
    fn teardown(&mut self) -> Result<(), FenceError>;
}

/// Which cgroup flavour.
///
/// ```
/// use corewise_arbiter::fence::{CgroupVersion, CpusetHierarchy};
/// if let Some(h) = CpusetHierarchy::detect() {
///     // Each version lists a cgroup's threads in its own file.
///     assert!(h.root.join(h.version.threads_file()).exists() || h.version == CgroupVersion::V2);
/// }
/// assert_ne!(CgroupVersion::V1, CgroupVersion::V2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    /// cgroup v1 cpuset hierarchy.
    V1,
    /// cgroup v2 with a threaded subtree.
    V2,
}

impl CgroupVersion {
    /// The file that lists a cgroup's threads and moves one thread by id.
    ///
    /// ```
    /// use corewise_arbiter::fence::CgroupVersion;
    /// assert_eq!(CgroupVersion::V1.threads_file(), "tasks");
    /// assert_eq!(CgroupVersion::V2.threads_file(), "cgroup.threads");
    /// ```
    pub fn threads_file(self) -> &'static str {
        match self {
            CgroupVersion::V1 => "tasks",
            CgroupVersion::V2 => "cgroup.threads",
        }
    }
}

/// A cpuset hierarchy under whose root a cgroup of one's own gets the
/// cpuset controller: where a daemon's `--cgroup-root` can be made.
///
/// Why here: the daemon's backends and the tools that give it a subtree
/// (the benchmarks) must agree on which hierarchy a machine has.
///
/// ```
/// use corewise_arbiter::fence::{CgroupVersion, CpusetHierarchy};
/// let d = std::env::temp_dir().join(format!("hierarchy-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&d)?;
/// std::fs::write(d.join("tasks"), "")?; // a cgroup v1 hierarchy has one
/// let h = CpusetHierarchy::detect_at(&d, std::path::Path::new("/nonexistent")).unwrap();
/// assert_eq!(h, CpusetHierarchy { version: CgroupVersion::V1, root: d.clone() });
/// std::fs::remove_dir_all(&d)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpusetHierarchy {
    /// cgroup v1 or v2.
    pub version: CgroupVersion,
    /// The hierarchy's root directory.
    pub root: PathBuf,
}

impl CpusetHierarchy {
    /// The machine's, at the default mounts: a cgroup v1 cpuset hierarchy
    /// at [`crate::daemon::DEFAULT_V1_ROOT`] first (as the daemon's
    /// automatic backend prefers it), else the cgroup v2 root at
    /// [`crate::daemon::DEFAULT_V2_ROOT`] when its
    /// `cgroup.subtree_control` gives children the cpuset controller.
    ///
    /// ```
    /// use corewise_arbiter::fence::CpusetHierarchy;
    /// if let Some(h) = CpusetHierarchy::detect() {
    ///     assert!(h.root.is_dir());
    /// }
    /// ```
    pub fn detect() -> Option<Self> {
        Self::detect_at(
            Path::new(crate::daemon::DEFAULT_V1_ROOT),
            Path::new(crate::daemon::DEFAULT_V2_ROOT),
        )
    }

    /// [`CpusetHierarchy::detect`] with the two mount points given: `v1`
    /// counts when it holds a `tasks` file, `v2` when its
    /// `cgroup.subtree_control` names `cpuset`.
    ///
    /// ```
    /// use corewise_arbiter::fence::{CgroupVersion, CpusetHierarchy};
    /// let d = std::env::temp_dir().join(format!("cpuset-doc-{}", std::process::id()));
    /// let (v1, v2) = (d.join("v1"), d.join("v2"));
    /// std::fs::create_dir_all(&v1)?;
    /// std::fs::create_dir_all(&v2)?;
    /// std::fs::write(v2.join("cgroup.subtree_control"), "cpu cpuset\n")?;
    /// let h = CpusetHierarchy::detect_at(&v1, &v2).unwrap();
    /// assert_eq!((h.version, h.root.as_path()), (CgroupVersion::V2, v2.as_path()));
    /// std::fs::write(v1.join("tasks"), "")?;
    /// assert_eq!(CpusetHierarchy::detect_at(&v1, &v2).unwrap().version, CgroupVersion::V1);
    /// std::fs::remove_dir_all(&d)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn detect_at(v1: &Path, v2: &Path) -> Option<Self> {
        if v1.join("tasks").exists() {
            return Some(Self {
                version: CgroupVersion::V1,
                root: v1.to_path_buf(),
            });
        }
        std::fs::read_to_string(v2.join("cgroup.subtree_control"))
            .unwrap_or_default()
            .split_whitespace()
            .any(|c| c == "cpuset")
            .then(|| Self {
                version: CgroupVersion::V2,
                root: v2.to_path_buf(),
            })
    }
}

/// Name of the unmanaged cgroup under the root.
///
/// ```
/// # // A stand-in for a cgroup v1 cpuset directory: the files the kernel
/// # // would create in it (and in the sets the fence makes), as plain files.
/// # fn fake_v1_root(name: &str) -> std::io::Result<std::path::PathBuf> {
/// #     let root = std::env::temp_dir().join(format!("fence-doc-{name}-{}", std::process::id()));
/// #     std::fs::create_dir_all(&root)?;
/// #     std::fs::write(root.join("cpuset.cpus"), "0-1\n")?;
/// #     std::fs::write(root.join("cpuset.mems"), "0\n")?;
/// #     std::fs::write(root.join("tasks"), "")?;
/// #     for set in [corewise_arbiter::fence::UNMANAGED_DIR, "corewise-core1"] {
/// #         std::fs::create_dir_all(root.join(set))?;
/// #         std::fs::write(root.join(set).join("tasks"), "")?;
/// #     }
/// #     Ok(root)
/// # }
/// use corewise_arbiter::fence::{CgroupFence, CgroupVersion, UNMANAGED_DIR};
/// let root = fake_v1_root("unmanaged-dir")?;
/// let f = CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1])?;
/// assert_eq!(f.unmanaged_dir(), root.join(UNMANAGED_DIR));
/// drop(f);
/// std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const UNMANAGED_DIR: &str = "corewise-unmanaged";

/// Name of the cgroup for one managed core.
///
/// ```
/// assert_eq!(corewise_arbiter::fence::core_dir_name(3), "corewise-core3");
/// ```
pub fn core_dir_name(core: CoreId) -> String {
    format!("corewise-core{core}")
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> FenceError + 'a {
    move |source| FenceError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), FenceError> {
    std::fs::write(path, text).map_err(io_err("write", path))
}

fn read_file(path: &Path) -> Result<String, FenceError> {
    std::fs::read_to_string(path).map_err(io_err("read", path))
}

fn open_w(path: &Path) -> Result<File, FenceError> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_err("open", path))
}

/// Parses a tasks/threads/procs file into ids.
///
/// ```
/// use corewise_arbiter::fence::read_ids;
/// let p = std::env::temp_dir().join(format!("read-ids-doc-{}", std::process::id()));
/// std::fs::write(&p, "12\n345\n\nnot-a-number\n")?;
/// assert_eq!(read_ids(&p), vec![12, 345]);
/// std::fs::remove_file(&p)?;
/// // A missing file lists nobody.
/// assert!(read_ids(&p).is_empty());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn read_ids(path: &Path) -> Vec<u32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The process (thread group) of thread `tid`, from its `status`.
fn thread_group(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/task/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Writes process `pid` into `procs` (a `cgroup.procs` file: every thread
/// of it moves, atomically with its forks), checked by identity: the
/// process is opened first, then `witness` must hold (a task known by
/// identity to belong to the process is still alive, so the pid still
/// names that process and the opened one is it); a warning says so if the
/// process exited by the end of the write. Returns whether the write
/// succeeded.
fn move_process(procs: &Path, pid: u32, witness: &dyn Fn() -> bool) -> bool {
    let Ok(p) = TaskIdent::process(pid) else {
        return false;
    };
    if !witness() || std::fs::write(procs, pid.to_string()).is_err() {
        return false;
    }
    if !p.alive() {
        tracing::warn!(
            pid,
            "a process left on a core exited while it was moved out"
        );
    }
    true
}

fn write_tid(f: &File, path: &Path, tid: u32) -> Result<(), FenceError> {
    match f.write_at(tid.to_string().as_bytes(), 0) {
        Ok(_) => Ok(()),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Err(FenceError::NoSuchThread(tid)),
        Err(source) => Err(FenceError::Io {
            op: "move thread",
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Removes a cgroup directory, retrying while exiting tasks drain out.
///
/// ```
/// use corewise_arbiter::fence::rmdir_retry;
/// let d = std::env::temp_dir().join(format!("rmdir-doc-{}", std::process::id()));
/// std::fs::create_dir(&d)?;
/// rmdir_retry(&d)?;
/// assert!(!d.exists());
/// rmdir_retry(&d)?; // already gone: fine
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn rmdir_retry(path: &Path) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match std::fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if Instant::now() < deadline && e.raw_os_error() == Some(libc::EBUSY) => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Takes an exclusive `flock` on the cgroup root directory itself (cgroupfs
/// holds no regular files to lock), so that a second daemon on the same root
/// refuses to start instead of adopting and then deleting the first one's
/// sets. The lock goes with the descriptor, also when the daemon is killed.
fn lock_root(root: &Path) -> Result<OwnedFd, FenceError> {
    use rustix::fs::{flock, open, FlockOperation, Mode, OFlags};
    let fd = open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FenceError::Io {
        op: "open",
        path: root.to_path_buf(),
        source: e.into(),
    })?;
    match flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(fd),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(FenceError::Unavailable(format!(
            "another corewise-arbiter daemon manages {} (it holds the lock on it)",
            root.display()
        ))),
        Err(e) => Err(FenceError::Sys {
            op: "flock cgroup root",
            source: e,
        }),
    }
}

/// Passes over a core's set when emptying it: children forked meanwhile by
/// tasks not yet moved show up in the next pass.
const EVACUATE_PASSES: usize = 4;
/// Tasks whose identity is held open at once while emptying a set.
const EVACUATE_BATCH: usize = 256;

struct CoreSet {
    core: CoreId,
    dir: PathBuf,
    threads_path: PathBuf,
    threads: File,
}

/// cgroup (v1 or v2) cpuset backend.
///
/// ```
/// # // A stand-in for a cgroup v1 cpuset directory: the files the kernel
/// # // would create in it (and in the sets the fence makes), as plain files.
/// # fn fake_v1_root(name: &str) -> std::io::Result<std::path::PathBuf> {
/// #     let root = std::env::temp_dir().join(format!("fence-doc-{name}-{}", std::process::id()));
/// #     std::fs::create_dir_all(&root)?;
/// #     std::fs::write(root.join("cpuset.cpus"), "0-1\n")?;
/// #     std::fs::write(root.join("cpuset.mems"), "0\n")?;
/// #     std::fs::write(root.join("tasks"), "")?;
/// #     for set in [corewise_arbiter::fence::UNMANAGED_DIR, "corewise-core1"] {
/// #         std::fs::create_dir_all(root.join(set))?;
/// #         std::fs::write(root.join(set).join("tasks"), "")?;
/// #     }
/// #     Ok(root)
/// # }
/// use corewise_arbiter::fence::{CgroupFence, CgroupVersion, Fence};
/// // `fake_v1_root`: a directory laid out like a v1 cpuset with CPUs 0-1.
/// let root = fake_v1_root("struct")?;
/// let mut f = CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1])?;
/// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
/// f.confine(tid, 1)?;
/// assert_eq!(std::fs::read_to_string(root.join("corewise-core1/tasks"))?, tid.to_string());
/// drop(f);
/// std::fs::remove_dir_all(&root)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct CgroupFence {
    version: CgroupVersion,
    root: PathBuf,
    unmanaged: PathBuf,
    unmanaged_cpus_file: File,
    unmanaged_threads: File,
    unmanaged_threads_path: PathBuf,
    cores: Vec<CoreSet>,
    current_unmanaged: String,
    /// The root's lock, held while this daemon manages it.
    _lock: OwnedFd,
}

impl CgroupFence {
    /// Builds the unmanaged set (with every CPU in `all`) and one set per
    /// managed core under `root`, and moves `root`'s tasks into the unmanaged
    /// set. Leftovers of a previous daemon that died are adopted.
    ///
    /// ```
    /// # // A stand-in for a cgroup v1 cpuset directory: the files the kernel
    /// # // would create in it (and in the sets the fence makes), as plain files.
    /// # fn fake_v1_root(name: &str) -> std::io::Result<std::path::PathBuf> {
    /// #     let root = std::env::temp_dir().join(format!("fence-doc-{name}-{}", std::process::id()));
    /// #     std::fs::create_dir_all(&root)?;
    /// #     std::fs::write(root.join("cpuset.cpus"), "0-1\n")?;
    /// #     std::fs::write(root.join("cpuset.mems"), "0\n")?;
    /// #     std::fs::write(root.join("tasks"), "")?;
    /// #     for set in [corewise_arbiter::fence::UNMANAGED_DIR, "corewise-core1"] {
    /// #         std::fs::create_dir_all(root.join(set))?;
    /// #         std::fs::write(root.join(set).join("tasks"), "")?;
    /// #     }
    /// #     Ok(root)
    /// # }
    /// use corewise_arbiter::fence::{CgroupFence, CgroupVersion};
    /// let root = fake_v1_root("new")?;
    /// let f = CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1])?;
    /// // The unmanaged set has every CPU, the managed core's set only its own.
    /// assert_eq!(std::fs::read_to_string(root.join("corewise-unmanaged/cpuset.cpus"))?, "0-1");
    /// assert_eq!(std::fs::read_to_string(root.join("corewise-core1/cpuset.cpus"))?, "1");
    /// // A second daemon on the same root is refused while the first holds it.
    /// assert!(CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1]).is_err());
    /// drop(f);
    /// std::fs::remove_dir_all(&root)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(
        version: CgroupVersion,
        root: &Path,
        all: &CpuList,
        managed: &[CoreId],
    ) -> Result<Self, FenceError> {
        let root = root.to_path_buf();
        let check = match version {
            CgroupVersion::V1 => root.join("cpuset.cpus"),
            CgroupVersion::V2 => root.join("cgroup.controllers"),
        };
        if !check.exists() {
            return Err(FenceError::Unavailable(format!(
                "{} does not exist",
                check.display()
            )));
        }
        let lock = lock_root(&root)?;
        if version == CgroupVersion::V2 {
            // Checked before anything is created: without the controller the
            // daemon would turn the root threaded and then fail.
            let controllers = read_file(&check)?;
            if !controllers.split_whitespace().any(|c| c == "cpuset") {
                return Err(FenceError::Unavailable(format!(
                    "the cpuset controller is not available in {} (cgroup.controllers: {:?}); \
                     it may be bound to a cgroup v1 hierarchy, or not enabled in the parent's \
                     cgroup.subtree_control",
                    root.display(),
                    controllers.trim()
                )));
            }
        }
        if version == CgroupVersion::V1 {
            // A cpuset made with mkdir starts with no CPUs and no memory
            // nodes; every set under it would fail with a bare EACCES.
            let cpus = read_file(&root.join("cpuset.cpus"))?;
            let mems = read_file(&root.join("cpuset.mems"))?;
            for (file, what, text) in [
                ("cpuset.cpus", "CPUs", &cpus),
                ("cpuset.mems", "memory nodes", &mems),
            ] {
                if text.trim().is_empty() {
                    return Err(FenceError::Unavailable(format!(
                        "{} is empty: a new cgroup v1 cpuset has no {what} until they are \
                         written; give {} the {what} to manage first (for example its \
                         parent's cpuset.cpus and cpuset.mems)",
                        root.join(file).display(),
                        root.display()
                    )));
                }
            }
            let cpus: CpuList = cpus
                .trim()
                .parse()
                .map_err(|e| FenceError::Unavailable(format!("{}: {e}", root.display())))?;
            let missing: Vec<u32> = all
                .cores()
                .filter(|&c| !cpus.contains(c as usize))
                .collect();
            if !missing.is_empty() {
                return Err(FenceError::Unavailable(format!(
                    "{} holds CPUs {cpus}; the daemon's CPUs {missing:?} are not among them",
                    root.display()
                )));
            }
        }
        let created = Self::build(version, &root, all, managed, lock);
        if created.is_err() {
            // Leave the root as it was: tasks back, sets removed.
            let dirs = std::iter::once(root.join(UNMANAGED_DIR))
                .chain(managed.iter().map(|&c| root.join(core_dir_name(c))));
            for dir in dirs {
                let back = match version {
                    CgroupVersion::V1 => (dir.join("tasks"), root.join("tasks")),
                    CgroupVersion::V2 => (dir.join("cgroup.procs"), root.join("cgroup.procs")),
                };
                for id in read_ids(&back.0) {
                    let _ = std::fs::write(&back.1, id.to_string());
                }
                let _ = std::fs::remove_dir(&dir);
            }
        }
        created
    }

    fn build(
        version: CgroupVersion,
        root: &Path,
        all: &CpuList,
        managed: &[CoreId],
        lock: OwnedFd,
    ) -> Result<Self, FenceError> {
        let root = root.to_path_buf();
        let unmanaged = root.join(UNMANAGED_DIR);
        let mk = |dir: &Path| -> Result<(), FenceError> {
            match std::fs::create_dir(dir) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(FenceError::Io {
                    op: "mkdir",
                    path: dir.to_path_buf(),
                    source: e,
                }),
            }
        };
        let all_text = all.to_string();
        match version {
            CgroupVersion::V1 => {
                let mems = read_file(&root.join("cpuset.mems"))?;
                let init = |dir: &Path, cpus: &str| -> Result<(), FenceError> {
                    mk(dir)?;
                    write_file(&dir.join("cpuset.mems"), mems.trim())?;
                    // Widen before narrowing: a leftover set may hold other CPUs.
                    write_file(&dir.join("cpuset.cpus"), cpus)?;
                    // Load balancing is decided by the root's flag; turning it
                    // off here avoids a sched-domain rebuild on every change.
                    let _ = std::fs::write(dir.join("cpuset.sched_load_balance"), "0");
                    Ok(())
                };
                init(&unmanaged, &all_text)?;
                for &c in managed {
                    init(&root.join(core_dir_name(c)), &c.to_string())?;
                }
            }
            CgroupVersion::V2 => {
                mk(&unmanaged)?;
                write_file(&unmanaged.join("cgroup.type"), "threaded")?;
                // The root becomes a threaded domain; its processes move to
                // the unmanaged set before controllers are enabled.
                for pid in read_ids(&root.join("cgroup.procs")) {
                    let _ = std::fs::write(unmanaged.join("cgroup.procs"), pid.to_string());
                }
                write_file(&root.join("cgroup.subtree_control"), "+cpuset")?;
                write_file(&unmanaged.join("cpuset.cpus"), &all_text)?;
                for &c in managed {
                    let dir = root.join(core_dir_name(c));
                    mk(&dir)?;
                    write_file(&dir.join("cgroup.type"), "threaded")?;
                    write_file(&dir.join("cpuset.cpus"), &c.to_string())?;
                }
            }
        }
        let tf = version.threads_file();
        let unmanaged_threads_path = unmanaged.join(tf);
        let unmanaged_threads = open_w(&unmanaged_threads_path)?;
        let mut cores = Vec::new();
        for &c in managed {
            let dir = root.join(core_dir_name(c));
            let threads_path = dir.join(tf);
            let threads = open_w(&threads_path)?;
            // Adopt leftovers of a crashed daemon: nobody holds cores yet.
            for tid in read_ids(&threads_path) {
                let _ = write_tid(&unmanaged_threads, &unmanaged_threads_path, tid);
            }
            cores.push(CoreSet {
                core: c,
                dir,
                threads_path,
                threads,
            });
        }
        // Sets of a crashed daemon that managed other cores (another
        // --cpus or --unmanaged): their threads join the unmanaged set and
        // the sets go, so no task stays fenced on a CPU nobody manages.
        let ours: Vec<PathBuf> = cores.iter().map(|c| c.dir.clone()).collect();
        for stale in std::fs::read_dir(&root)
            .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default()
        {
            let name = stale.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.starts_with("corewise-core") || ours.contains(&stale) || !stale.is_dir() {
                continue;
            }
            for tid in read_ids(&stale.join(tf)) {
                let _ = write_tid(&unmanaged_threads, &unmanaged_threads_path, tid);
            }
            match rmdir_retry(&stale) {
                Ok(()) => tracing::info!(dir = %stale.display(), "removed a stale core set"),
                Err(e) => {
                    tracing::warn!(dir = %stale.display(), error = %e, "could not remove a stale core set")
                }
            }
        }
        if version == CgroupVersion::V1 {
            // Existing tasks of the root move to the unmanaged set. Some
            // (per-CPU kernel threads) cannot move; that is expected.
            for tid in read_ids(&root.join("tasks")) {
                if let Err(e) = write_tid(&unmanaged_threads, &unmanaged_threads_path, tid) {
                    tracing::debug!(tid, error = %e, "could not move task to unmanaged set");
                }
            }
        }
        let cpus_path = unmanaged.join("cpuset.cpus");
        let unmanaged_cpus_file = open_w(&cpus_path)?;
        Ok(Self {
            version,
            root,
            unmanaged,
            unmanaged_cpus_file,
            unmanaged_threads,
            unmanaged_threads_path,
            cores,
            current_unmanaged: all_text,
            _lock: lock,
        })
    }

    /// The unmanaged cgroup directory.
    ///
    /// ```
    /// # // A stand-in for a cgroup v1 cpuset directory: the files the kernel
    /// # // would create in it (and in the sets the fence makes), as plain files.
    /// # fn fake_v1_root(name: &str) -> std::io::Result<std::path::PathBuf> {
    /// #     let root = std::env::temp_dir().join(format!("fence-doc-{name}-{}", std::process::id()));
    /// #     std::fs::create_dir_all(&root)?;
    /// #     std::fs::write(root.join("cpuset.cpus"), "0-1\n")?;
    /// #     std::fs::write(root.join("cpuset.mems"), "0\n")?;
    /// #     std::fs::write(root.join("tasks"), "")?;
    /// #     for set in [corewise_arbiter::fence::UNMANAGED_DIR, "corewise-core1"] {
    /// #         std::fs::create_dir_all(root.join(set))?;
    /// #         std::fs::write(root.join(set).join("tasks"), "")?;
    /// #     }
    /// #     Ok(root)
    /// # }
    /// use corewise_arbiter::fence::{CgroupFence, CgroupVersion};
    /// let root = fake_v1_root("dir")?;
    /// let f = CgroupFence::new(CgroupVersion::V1, &root, &"0-1".parse()?, &[1])?;
    /// assert!(f.unmanaged_dir().starts_with(&root));
    /// assert!(f.unmanaged_dir().join("cpuset.cpus").exists());
    /// drop(f);
    /// std::fs::remove_dir_all(&root)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn unmanaged_dir(&self) -> &Path {
        &self.unmanaged
    }

    fn core(&self, core: CoreId) -> Option<&CoreSet> {
        self.cores.iter().find(|c| c.core == core)
    }
}

impl Fence for CgroupFence {
    fn name(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "cgroup-v1",
            CgroupVersion::V2 => "cgroup-v2",
        }
    }

    fn adopt(&mut self, pid: u32, tid: u32) -> Result<bool, FenceError> {
        if self.version == CgroupVersion::V2 {
            // Threads can only move within their process's threaded domain,
            // so the whole process joins the unmanaged set first - unless it
            // is inside already: a `cgroup.procs` write moves *all* its
            // threads and would pull granted ones off their cores.
            let inside = std::iter::once(&self.unmanaged_threads_path)
                .chain(self.cores.iter().map(|c| &c.threads_path))
                .any(|p| read_ids(p).contains(&tid));
            if !inside {
                write_file(&self.unmanaged.join("cgroup.procs"), &pid.to_string())?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    fn set_unmanaged(&mut self, cpus: &CpuList) -> Result<(), FenceError> {
        let text = cpus.to_string();
        if text == self.current_unmanaged {
            return Ok(());
        }
        self.unmanaged_cpus_file
            .write_at(text.as_bytes(), 0)
            .map_err(io_err("write", &self.unmanaged.join("cpuset.cpus")))?;
        self.current_unmanaged = text;
        Ok(())
    }

    fn confine(&mut self, tid: u32, core: CoreId) -> Result<(), FenceError> {
        let set = self
            .core(core)
            .ok_or_else(|| FenceError::Unavailable(format!("core {core} is not managed")))?;
        write_tid(&set.threads, &set.threads_path, tid)
    }

    fn unconfine(&mut self, tid: u32) -> Result<(), FenceError> {
        write_tid(&self.unmanaged_threads, &self.unmanaged_threads_path, tid)
    }

    fn members(&self, core: CoreId) -> Vec<u32> {
        self.core(core)
            .map(|c| read_ids(&c.threads_path))
            .unwrap_or_default()
    }

    fn evacuate(&mut self, core: CoreId, keep: Option<u32>, whole: &dyn Fn(u32) -> bool) -> usize {
        let Some(set) = self.core(core) else {
            return 0;
        };
        let procs = self.unmanaged.join("cgroup.procs");
        let mut moved = 0;
        for _ in 0..EVACUATE_PASSES {
            // A fresh open each time: cgroup v1 caches the list of an open
            // `tasks` file.
            let listed: Vec<u32> = read_ids(&set.threads_path)
                .into_iter()
                .filter(|&t| Some(t) != keep)
                .collect();
            if listed.is_empty() {
                break;
            }
            for chunk in listed.chunks(EVACUATE_BATCH) {
                // Identity first, then membership: a task alive from before
                // the second read until after it is the one the read listed
                // (its id cannot have named another task in between), so
                // no task outside the set is ever moved for a reused id.
                let idents: Vec<TaskIdent> = chunk
                    .iter()
                    .filter_map(|&t| TaskIdent::task(t).ok())
                    .collect();
                if idents.is_empty() {
                    continue;
                }
                let now: std::collections::BTreeSet<u32> =
                    read_ids(&set.threads_path).into_iter().collect();
                for t in idents {
                    if !now.contains(&t.tid()) || !t.alive() {
                        continue;
                    }
                    // Its whole process, when nothing of it must stay on a
                    // core: checked by identity as the thread is.
                    if let Some(tgid) = thread_group(t.tid()).filter(|&g| whole(g)) {
                        if move_process(&procs, tgid, &|| t.alive()) {
                            moved += 1;
                            continue;
                        }
                    }
                    if write_tid(
                        &self.unmanaged_threads,
                        &self.unmanaged_threads_path,
                        t.tid(),
                    )
                    .is_ok()
                    {
                        moved += 1;
                        if !t.alive() {
                            tracing::warn!(
                                tid = t.tid(),
                                "a task left on a core exited while it was moved out"
                            );
                        }
                    }
                }
            }
        }
        if moved > 0 {
            tracing::info!(
                core,
                moved,
                "moved tasks a previous holder left on the core to the unmanaged set"
            );
        }
        read_ids(&set.threads_path)
            .into_iter()
            .filter(|&t| Some(t) != keep)
            .count()
    }

    fn processes_in(&self, core: CoreId, keep: Option<u32>) -> BTreeSet<u32> {
        self.core(core)
            .map(|set| read_ids(&set.threads_path))
            .unwrap_or_default()
            .into_iter()
            .filter(|&t| Some(t) != keep)
            .filter_map(thread_group)
            .collect()
    }

    fn evacuate_process(&mut self, pid: u32, witness: &dyn Fn() -> bool) -> bool {
        move_process(&self.unmanaged.join("cgroup.procs"), pid, witness)
    }

    fn teardown(&mut self) -> Result<(), FenceError> {
        let mut first_err = None;
        let dirs: Vec<PathBuf> = self
            .cores
            .iter()
            .map(|c| c.dir.clone())
            .chain(std::iter::once(self.unmanaged.clone()))
            .collect();
        // Give the unmanaged set every CPU back before emptying it.
        let _ = std::fs::write(
            self.unmanaged.join("cpuset.cpus"),
            read_file(&self.root.join("cpuset.cpus"))
                .unwrap_or_default()
                .trim(),
        );
        for dir in &dirs {
            match self.version {
                CgroupVersion::V1 => {
                    if let Ok(dst) = open_w(&self.root.join("tasks")) {
                        for tid in read_ids(&dir.join("tasks")) {
                            let _ = write_tid(&dst, &self.root.join("tasks"), tid);
                        }
                    }
                }
                CgroupVersion::V2 => {
                    // Inside a threaded subtree only thread moves are allowed
                    // (cgroup.procs is not readable there); the root is the
                    // threaded domain, so its cgroup.threads takes them.
                    if let Ok(dst) = open_w(&self.root.join("cgroup.threads")) {
                        for tid in read_ids(&dir.join("cgroup.threads")) {
                            let _ = write_tid(&dst, &self.root.join("cgroup.threads"), tid);
                        }
                    }
                }
            }
        }
        for dir in &dirs {
            if let Err(e) = rmdir_retry(dir) {
                tracing::warn!(dir = %dir.display(), error = %e, "could not remove cgroup");
                first_err.get_or_insert(FenceError::Io {
                    op: "rmdir",
                    path: dir.clone(),
                    source: e,
                });
            }
        }
        first_err.map_or(Ok(()), Err)
    }
}

/// Affinity-only backend (weaker: only client threads are pinned).
///
/// A granted thread is pinned to its core with `sched_setaffinity`, and
/// threads returned to the unmanaged set are pinned to the unmanaged CPUs;
/// other processes on the machine are not kept off granted cores. The
/// backend re-pins threads on its own (when the unmanaged set changes, and
/// at teardown), so it remembers each thread by identity, taken right
/// before its first pin (see [`crate::daemon::task`]): a thread that is
/// gone, or whose id another task has now, is forgotten, never pinned.
///
/// ```
/// use corewise_arbiter::fence::{AffinityFence, Fence};
/// use corewise_arbiter::topology::online_cpus;
/// let mut f = AffinityFence::new(&online_cpus());
/// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
/// let cpu = rustix::thread::sched_getcpu() as u32;
/// f.confine(tid, cpu)?; // this thread now runs on `cpu` only
/// assert_eq!(rustix::thread::sched_getaffinity(None)?.count(), 1);
/// assert_eq!(f.members(cpu), vec![tid]);
/// f.teardown()?; // and on every CPU again
/// assert_eq!(rustix::thread::sched_getaffinity(None)?.count() as usize, online_cpus().len());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct AffinityFence {
    unmanaged: CpuList,
    all: CpuList,
    /// Threads we pinned to the unmanaged CPUs (re-pinned when the set changes).
    parked: Vec<TaskIdent>,
    confined: Vec<(TaskIdent, CoreId)>,
}

impl AffinityFence {
    /// A backend managing `all` CPUs.
    ///
    /// ```
    /// use corewise_arbiter::fence::{AffinityFence, Fence};
    /// let f = AffinityFence::new(&"0-1".parse().unwrap());
    /// assert_eq!(f.name(), "affinity");
    /// assert!(f.members(1).is_empty());
    /// ```
    pub fn new(all: &CpuList) -> Self {
        Self {
            unmanaged: all.clone(),
            all: all.clone(),
            parked: Vec::new(),
            confined: Vec::new(),
        }
    }

    fn pin(tid: u32, cpus: impl Iterator<Item = CoreId>) -> Result<(), FenceError> {
        let mut set = rustix::thread::CpuSet::new();
        for c in cpus {
            set.set(c as usize);
        }
        let pid =
            rustix::process::Pid::from_raw(tid as i32).ok_or(FenceError::NoSuchThread(tid))?;
        rustix::thread::sched_setaffinity(Some(pid), &set).map_err(|e| {
            if e == rustix::io::Errno::SRCH {
                FenceError::NoSuchThread(tid)
            } else {
                FenceError::Sys {
                    op: "sched_setaffinity",
                    source: e,
                }
            }
        })
    }

    /// Pins a remembered thread, if it still is the one remembered.
    fn repin(t: &TaskIdent, cpus: impl Iterator<Item = CoreId>) -> bool {
        t.alive() && Self::pin(t.tid(), cpus).is_ok() && t.alive()
    }

    /// The identity of `tid` (known good: the daemon checked it just now),
    /// kept from an earlier pin or taken now.
    fn ident(&mut self, tid: u32) -> Result<TaskIdent, FenceError> {
        if let Some(i) = self.parked.iter().position(|t| t.tid() == tid) {
            return Ok(self.parked.swap_remove(i));
        }
        if let Some(i) = self.confined.iter().position(|t| t.0.tid() == tid) {
            return Ok(self.confined.swap_remove(i).0);
        }
        TaskIdent::task(tid).map_err(|_| FenceError::NoSuchThread(tid))
    }
}

impl Fence for AffinityFence {
    fn name(&self) -> &'static str {
        "affinity"
    }

    fn set_unmanaged(&mut self, cpus: &CpuList) -> Result<(), FenceError> {
        if *cpus == self.unmanaged {
            return Ok(());
        }
        self.unmanaged = cpus.clone();
        let unmanaged = &self.unmanaged;
        self.parked.retain(|t| Self::repin(t, unmanaged.cores()));
        Ok(())
    }

    fn confine(&mut self, tid: u32, core: CoreId) -> Result<(), FenceError> {
        let t = self.ident(tid)?;
        Self::pin(tid, std::iter::once(core))?;
        self.confined.push((t, core));
        Ok(())
    }

    fn unconfine(&mut self, tid: u32) -> Result<(), FenceError> {
        let t = self.ident(tid)?;
        Self::pin(tid, self.unmanaged.cores())?;
        self.parked.push(t);
        Ok(())
    }

    fn members(&self, core: CoreId) -> Vec<u32> {
        self.confined
            .iter()
            .filter(|(t, c)| *c == core && t.alive())
            .map(|(t, _)| t.tid())
            .collect()
    }

    fn teardown(&mut self) -> Result<(), FenceError> {
        let all = self.all.clone();
        for t in self
            .parked
            .drain(..)
            .chain(self.confined.drain(..).map(|(t, _)| t))
        {
            Self::repin(&t, all.cores());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_hierarchies_are_unavailable() {
        let all: CpuList = "0-1".parse().unwrap();
        for v in [CgroupVersion::V1, CgroupVersion::V2] {
            let r = CgroupFence::new(v, Path::new("/nonexistent/corewise"), &all, &[1]);
            assert!(matches!(r, Err(FenceError::Unavailable(_))));
        }
    }

    #[test]
    fn affinity_pins_and_unpins_a_real_thread() {
        let all = crate::topology::online_cpus();
        let Some(core) = all.cores().last() else {
            return;
        };
        let mut f = AffinityFence::new(&all);
        let (tid, go_tx, h) =
            crate::daemon::task::spawn_waiting_thread(|| rustix::thread::sched_getcpu() as u32);
        f.confine(tid, core).unwrap();
        assert_eq!(f.members(core), vec![tid]);
        go_tx.send(()).unwrap();
        assert_eq!(h.join().unwrap(), core);
        assert!(matches!(
            f.unconfine(tid),
            Err(FenceError::NoSuchThread(_)) | Ok(())
        ));
        f.teardown().unwrap();
    }

    #[test]
    fn affinity_forgets_a_parked_thread_once_it_is_gone() {
        let all = crate::topology::online_cpus();
        let Some(core) = all.cores().last() else {
            return;
        };
        let mut f = AffinityFence::new(&all);
        let (tid, go_tx, h) = crate::daemon::task::spawn_waiting_thread(|| ());
        f.unconfine(tid).unwrap();
        assert_eq!(f.parked.len(), 1);
        // Still there: re-pinned when the unmanaged set changes.
        let fewer: CpuList = all.cores().filter(|&c| c != core).collect();
        f.set_unmanaged(&fewer).unwrap();
        assert_eq!(f.parked.len(), 1);
        go_tx.send(()).unwrap();
        h.join().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while f.parked[0].alive() {
            assert!(Instant::now() < deadline, "thread never went");
            std::thread::yield_now();
        }
        // Gone: its id is never pinned again (whoever has it now).
        f.set_unmanaged(&all).unwrap();
        assert!(f.parked.is_empty());
        f.teardown().unwrap();
    }
}
