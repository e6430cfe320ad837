//! The server process's set-up as memcached does it: detaching from the
//! terminal (`-d`), the pid file (`-P`), running as another user (`-u`),
//! and core files (`-r`).
//!
//! Why: distributions start memcached with these (Debian's
//! `/etc/memcached.conf` passes `-d`, `-u memcache` and `-P`), so a server
//! meant as a drop-in must take them and do what they say. All three run
//! before the runtime starts any thread: `fork` copies only the calling
//! thread, and a user switch must cover every thread the process will
//! have.

use std::ffi::CString;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use thiserror::Error;

/// Why the process could not be set up.
///
/// ```
/// use corewise_kv::process::{switch_user, ProcessError};
/// // Not root: `-u` is ignored, as memcached ignores it.
/// // SAFETY: geteuid has no preconditions.
/// if unsafe { libc::geteuid() } != 0 {
///     assert!(switch_user("nobody").is_ok());
/// }
/// assert!(matches!(
///     ProcessError::NoSuchUser("x".into()).to_string().as_str(),
///     "can't find the user x to switch to"
/// ));
/// ```
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ProcessError {
    /// `-u` names no user.
    #[error("can't find the user {0} to switch to")]
    NoSuchUser(String),
    /// `-r`, and the core file size limit is still 0.
    #[error("failed to ensure corefile creation")]
    NoCoreFiles,
    /// A system call failed.
    #[error("{op}: {source}")]
    Os {
        /// What was being done.
        op: &'static str,
        /// The error.
        source: io::Error,
    },
}

fn os(op: &'static str) -> impl FnOnce(io::Error) -> ProcessError {
    move |source| ProcessError::Os { op, source }
}

/// Detaches from the terminal as memcached's `-d` does: forks (the parent
/// exits with status 0 at once), starts a new session, changes to `/`,
/// and points standard input, output and error at `/dev/null`.
///
/// Call it before any thread is started: only the calling thread goes on
/// in the child.
pub fn detach() -> Result<(), ProcessError> {
    // SAFETY: called while the process has one thread (see above), so the
    // child is a complete copy of it; the parent only exits.
    match unsafe { libc::fork() } {
        -1 => return Err(os("fork")(io::Error::last_os_error())),
        0 => {}
        _ => std::process::exit(0),
    }
    // SAFETY: plain system calls on this (single-threaded) process.
    if unsafe { libc::setsid() } == -1 {
        return Err(os("setsid")(io::Error::last_os_error()));
    }
    std::env::set_current_dir("/").map_err(os("chdir /"))?;
    let null = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(os("open /dev/null"))?;
    for fd in [libc::STDIN_FILENO, libc::STDOUT_FILENO, libc::STDERR_FILENO] {
        // SAFETY: `null` is open; `dup2` over a standard descriptor is how
        // it is redirected, and nothing else in this single-threaded
        // process uses it meanwhile.
        if unsafe { libc::dup2(null.as_raw_fd(), fd) } == -1 {
            return Err(os("dup2 /dev/null")(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Writes this process's id and a newline to `path` (memcached's `-P`).
///
/// ```
/// let p = std::env::temp_dir().join(format!("kv-pid-doc-{}", std::process::id()));
/// corewise_kv::process::write_pid_file(&p)?;
/// assert_eq!(std::fs::read_to_string(&p)?, format!("{}\n", std::process::id()));
/// std::fs::remove_file(&p)?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn write_pid_file(path: &Path) -> Result<(), ProcessError> {
    std::fs::write(path, format!("{}\n", std::process::id())).map_err(os("write the pid file"))
}

/// Raises the core file size limit as memcached's `-r` does: to unlimited,
/// or (when that is not allowed) to the hard limit; an error if core files
/// stay off (a limit of 0), where memcached exits.
///
/// ```
/// use corewise_kv::process::enable_coredumps;
/// // Raising a soft limit to its hard limit is always allowed, so this
/// // fails only when the hard limit is 0.
/// let mut hard = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
/// // SAFETY: `hard` is a valid rlimit to write.
/// unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut hard) };
/// assert_eq!(enable_coredumps().is_ok(), hard.rlim_max != 0);
/// ```
pub fn enable_coredumps() -> Result<(), ProcessError> {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `old` is a valid rlimit for getrlimit to write.
    if unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut old) } != 0 {
        return Err(os("getrlimit")(io::Error::last_os_error()));
    }
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the rlimit given.
    if unsafe { libc::setrlimit(libc::RLIMIT_CORE, &unlimited) } != 0 {
        let hard = libc::rlimit {
            rlim_cur: old.rlim_max,
            rlim_max: old.rlim_max,
        };
        // SAFETY: as above. A failure shows in the check below.
        unsafe { libc::setrlimit(libc::RLIMIT_CORE, &hard) };
    }
    let mut now = old;
    // SAFETY: as the first getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_CORE, &mut now) } != 0 || now.rlim_cur == 0 {
        return Err(ProcessError::NoCoreFiles);
    }
    Ok(())
}

/// Runs as `user` from now on (memcached's `-u`): its group, its
/// supplementary groups, then its user id. Only when running as root;
/// otherwise nothing happens, as with memcached.
///
/// Call it before any thread is started, so that every thread runs as
/// the user (the process's other set-up, such as the listening socket and
/// the descriptor limit, is done before, with root's rights).
pub fn switch_user(user: &str) -> Result<(), ProcessError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(());
    }
    let name = CString::new(user).map_err(|_| ProcessError::NoSuchUser(user.into()))?;
    let (uid, gid) = lookup(&name).ok_or_else(|| ProcessError::NoSuchUser(user.into()))?;
    // SAFETY: `name` is a NUL-terminated string that outlives the call.
    if unsafe { libc::initgroups(name.as_ptr(), gid) } != 0 {
        return Err(os("initgroups")(io::Error::last_os_error()));
    }
    // SAFETY: plain system calls on this process's credentials.
    if unsafe { libc::setgid(gid) } != 0 {
        return Err(os("setgid")(io::Error::last_os_error()));
    }
    // SAFETY: as above.
    if unsafe { libc::setuid(uid) } != 0 {
        return Err(os("setuid")(io::Error::last_os_error()));
    }
    Ok(())
}

/// The user and group ids of the user called `name`.
fn lookup(name: &CString) -> Option<(libc::uid_t, libc::gid_t)> {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: an all-zero `passwd` is a valid value to be overwritten.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the sizes given; `getpwnam_r`
    // writes the entry's strings into `buf` and sets `found` to `&pw` or
    // null.
    let r = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pw,
            buf.as_mut_ptr(),
            buf.len(),
            &mut found,
        )
    };
    (r == 0 && !found.is_null()).then_some((pw.pw_uid, pw.pw_gid))
}
