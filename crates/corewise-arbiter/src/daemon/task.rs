//! The identity of a client's process and kernel threads.
//!
//! Why: a thread id is only a number, and the kernel hands it out again once
//! the thread is gone (with `pid_max` 32768 quickly). No cgroup write can
//! name a thread by pidfd, so a stored tid written into a `tasks` file could
//! move whoever holds the number now - another user's process. The daemon
//! therefore keeps `/proc/TGID/task/TID/stat` open from the moment a thread
//! attaches: that file stays bound to the task it was opened for (reads fail
//! with `ESRCH` once the task is gone, even when the number is reused by
//! another task), and it carries the task's start time (field 22), compared
//! as well. The daemon checks a thread right before and right after every
//! cgroup write that names it (see `state.rs`).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

use rustix::event::{PollFd, PollFlags};

/// A pidfd for the process that connected the socket (`SO_PEERPIDFD`,
/// Linux 6.5): `Ok(None)` where the kernel (or the architecture's
/// constant) does not have it (`ENOPROTOOPT`), an error when the kernel has
/// it but gives none. The pidfd names the connecting process itself, so it
/// tells whether the pid from the peer credentials still means that
/// process.
///
/// An error is what a peer that has exited and been reaped gets on the
/// kernels that refuse a pidfd for it (`EINVAL` or `ESRCH`, before 6.15 or
/// so; later ones give a pidfd that polls as exited): exactly the case
/// the check is for, so the daemon treats those as the process being
/// gone, not as a kernel without the option; `EMFILE`, `ENFILE` and
/// `ENOMEM` are its own limits (the client may retry).
///
/// ```
/// use corewise_arbiter::daemon::task::{peer_pidfd, pidfd_alive};
/// use std::os::fd::AsFd;
/// let (a, _b) = std::os::unix::net::UnixStream::pair()?;
/// // Linux 6.5 and later: a pidfd of the peer (this process); else None.
/// if let Some(pidfd) = peer_pidfd(a.as_fd())? {
///     assert!(pidfd_alive(&pidfd));
/// }
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<Option<OwnedFd>> {
    // The asm-generic value (x86, arm, riscv, ...); mips, sparc, parisc and
    // alpha number it differently.
    #[cfg(any(
        target_arch = "x86_64",
        target_arch = "x86",
        target_arch = "aarch64",
        target_arch = "arm",
        target_arch = "riscv64"
    ))]
    {
        const SO_PEERPIDFD: libc::c_int = 77;
        let mut fd: libc::c_int = -1;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` and `len` are valid for writes of the sizes given and
        // `len` says how much the kernel may write to `fd`.
        let r = unsafe {
            libc::getsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_PEERPIDFD,
                (&mut fd as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r == 0 && fd >= 0 {
            // SAFETY: the kernel just created this descriptor for us; nothing
            // else owns it.
            return Ok(Some(unsafe { OwnedFd::from_raw_fd(fd) }));
        }
        let e = io::Error::last_os_error();
        if r != 0 && e.raw_os_error() != Some(libc::ENOPROTOOPT) {
            return Err(e);
        }
    }
    let _ = sock;
    Ok(None)
}

/// Whether the process behind `pidfd` has not exited (a pidfd polls
/// readable once it has).
///
/// ```
/// use corewise_arbiter::daemon::task::pidfd_alive;
/// let me = rustix::process::pidfd_open(
///     rustix::process::getpid(),
///     rustix::process::PidfdFlags::empty(),
/// )?;
/// assert!(pidfd_alive(&me));
/// # Ok::<(), rustix::io::Errno>(())
/// ```
pub fn pidfd_alive(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(0))
}

/// A task (kernel thread, or a process through its leader) as it was when
/// it was first seen.
///
/// ```
/// use corewise_arbiter::daemon::task::TaskIdent;
/// use std::time::{Duration, Instant};
/// let (tx, rx) = std::sync::mpsc::channel();
/// let t = std::thread::spawn(move || tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32).unwrap());
/// let tid = rx.recv()?;
/// let ident = TaskIdent::thread(std::process::id(), tid);
/// t.join().unwrap();
/// // Seen while it lived (if it was still there), gone once it exits.
/// if let Ok(ident) = ident {
///     let t0 = Instant::now();
///     while ident.alive() {
///         assert!(t0.elapsed() < Duration::from_secs(10));
///         std::thread::yield_now();
///     }
/// }
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct TaskIdent {
    pid: u32,
    tid: u32,
    start: u64,
    stat: File,
}

/// The start time (field 22 of a `/proc/.../stat` line, in clock ticks since
/// boot). The command name (field 2) may hold spaces and parentheses, so the
/// fields are counted from its last `)`.
///
/// ```
/// use corewise_arbiter::daemon::task::start_time;
/// let line = "42 (a) b (c)) S 1 42 42 0 -1 4194560 100 0 0 0 0 0 0 0 20 0 1 0 987654 1000 10";
/// assert_eq!(start_time(line), Some(987654));
/// assert_eq!(start_time("42 (truncated"), None);
/// ```
pub fn start_time(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // Field 3 (state) is the first after the name; field 22 is 19 later.
    rest.split_whitespace().nth(19)?.parse().ok()
}

impl TaskIdent {
    /// Kernel thread `tid` of process `pid` (fails if `tid` is not a thread
    /// of `pid` now).
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let pid = std::process::id();
    /// let me = TaskIdent::thread(pid, rustix::thread::gettid().as_raw_nonzero().get() as u32)?;
    /// assert!(me.alive());
    /// // The calling process's main thread id is not a thread of pid 1.
    /// assert!(TaskIdent::thread(1, pid).is_err());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn thread(pid: u32, tid: u32) -> io::Result<Self> {
        Self::open(pid, tid, &format!("/proc/{pid}/task/{tid}/stat"))
    }

    /// Kernel thread `tid` of whichever process it belongs to now (for
    /// callers that know only the tid; [`Self::pid`] is then `tid`).
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    /// let me = TaskIdent::task(tid)?;
    /// assert_eq!((me.pid(), me.tid()), (tid, tid));
    /// assert!(me.alive());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn task(tid: u32) -> io::Result<Self> {
        Self::open(tid, tid, &format!("/proc/{tid}/task/{tid}/stat"))
    }

    /// Process `pid` (its thread group).
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let me = TaskIdent::process(std::process::id())?;
    /// assert_eq!(me.pid(), std::process::id());
    /// assert_eq!(me.tid(), me.pid());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn process(pid: u32) -> io::Result<Self> {
        Self::open(pid, pid, &format!("/proc/{pid}/stat"))
    }

    fn open(pid: u32, tid: u32, path: &str) -> io::Result<Self> {
        let stat = File::open(path)?;
        let start = read_start(&stat)?;
        Ok(Self {
            pid,
            tid,
            start,
            stat,
        })
    }

    /// The process id.
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    /// let me = TaskIdent::thread(std::process::id(), tid)?;
    /// assert_eq!(me.pid(), std::process::id());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The thread id.
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let tid = rustix::thread::gettid().as_raw_nonzero().get() as u32;
    /// assert_eq!(TaskIdent::thread(std::process::id(), tid)?.tid(), tid);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// The start time recorded when the task was first seen.
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::{start_time, TaskIdent};
    /// let me = TaskIdent::process(std::process::id())?;
    /// let stat = std::fs::read_to_string("/proc/self/stat")?;
    /// assert_eq!(Some(me.start()), start_time(&stat));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(&self) -> u64 {
        self.start
    }

    /// Whether the task is still the one first seen (a reused id reads as
    /// gone).
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let me = TaskIdent::process(std::process::id())?;
    /// assert!(me.alive());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn alive(&self) -> bool {
        read_start(&self.stat).is_ok_and(|s| s == self.start)
    }

    /// Whether the task runs as `uid` alone: its real, effective, saved
    /// and file-system user ids are all `uid` (always true for root, who may
    /// move anything). A process that connected as a user and then ran a
    /// set-user-ID program, or raised its effective id back to a saved
    /// one, does not: its connection's credentials no longer speak for it.
    /// A task that is gone reads as false.
    ///
    /// ```
    /// use corewise_arbiter::daemon::task::TaskIdent;
    /// let me = TaskIdent::process(std::process::id())?;
    /// let uid = rustix::process::getuid().as_raw();
    /// assert!(me.runs_as(0));
    /// if uid != 0 && uid == rustix::process::geteuid().as_raw() {
    ///     assert!(me.runs_as(uid));
    /// }
    /// if uid == 0 {
    ///     assert!(!me.runs_as(65534), "root does not run as nobody");
    /// }
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn runs_as(&self, uid: u32) -> bool {
        if uid == 0 {
            return true;
        }
        let path = format!("/proc/{}/task/{}/status", self.pid, self.tid);
        let Ok(status) = std::fs::read_to_string(path) else {
            return false;
        };
        self.alive() && status_uids(&status).is_some_and(|ids| ids.iter().all(|&u| u == uid))
    }
}

/// The four user ids (real, effective, saved, file system) of a
/// `/proc/.../status` text.
fn status_uids(status: &str) -> Option<[u32; 4]> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    let mut ids = line.split_ascii_whitespace().map(|w| w.parse::<u32>());
    let mut out = [0u32; 4];
    for slot in &mut out {
        *slot = ids.next()?.ok()?;
    }
    Some(out)
}

fn read_start(f: &File) -> io::Result<u64> {
    let mut buf = [0u8; 1024];
    let n = f.read_at(&mut buf, 0)?;
    let text = std::str::from_utf8(&buf[..n]).map_err(|_| io::ErrorKind::InvalidData)?;
    start_time(text).ok_or_else(|| io::ErrorKind::InvalidData.into())
}

/// Test support: starts a thread that reports its tid, waits for a message
/// on the returned sender, then runs `then`.
#[cfg(test)]
pub(crate) fn spawn_waiting_thread<T: Send + 'static>(
    then: impl FnOnce() -> T + Send + 'static,
) -> (u32, std::sync::mpsc::Sender<()>, std::thread::JoinHandle<T>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32)
            .unwrap();
        go_rx.recv().unwrap();
        then()
    });
    (rx.recv().unwrap(), go_tx, h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_four_user_ids_are_read_from_status() {
        let text = "Name:\tsu\nUmask:\t0022\nUid:\t65534\t0\t0\t0\nGid:\t0\t0\t0\t0\n";
        assert_eq!(status_uids(text), Some([65534, 0, 0, 0]));
        assert_eq!(status_uids("Uid:\t1\t2\n"), None);
        assert_eq!(status_uids("Gid:\t1\t1\t1\t1\n"), None);
    }

    #[test]
    fn a_finished_thread_reads_as_gone() {
        let (tid, go_tx, h) = spawn_waiting_thread(|| ());
        let ident = TaskIdent::thread(std::process::id(), tid).unwrap();
        assert!(ident.alive());
        assert_eq!(ident.tid(), tid);
        go_tx.send(()).unwrap();
        h.join().unwrap();
        // The join returns when the thread is done; the kernel reaps it
        // right after.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while ident.alive() {
            assert!(std::time::Instant::now() < deadline, "thread never went");
            std::thread::yield_now();
        }
    }

    #[test]
    fn the_peer_of_a_socket_is_known_by_pidfd_on_linux_6_5() {
        let release = rustix::system::uname()
            .release()
            .to_string_lossy()
            .into_owned();
        let mut v = release
            .split(|c: char| !c.is_ascii_digit())
            .map(|n| n.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        match peer_pidfd(a.as_fd()).expect("the peer is this process, alive") {
            Some(p) => assert!(pidfd_alive(&p), "this process is alive"),
            None => assert!((major, minor) < (6, 5), "no SO_PEERPIDFD on {release}"),
        }
    }

    #[test]
    fn processes_and_their_start_times() {
        let me = TaskIdent::process(std::process::id()).unwrap();
        assert!(me.alive());
        let init = TaskIdent::process(1).unwrap();
        assert!(init.start() <= me.start());
    }
}
