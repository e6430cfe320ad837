//! The server's listening socket and the connections it accepts: TCP, or a
//! unix socket file (memcached's `-s`, which then replaces the network).
//!
//! Why an enum and not generics: everything past `accept` (the decoder,
//! replies, `stats conns`) is the same for both kinds, and a connection
//! type generic over its socket would carry the parameter through every
//! function of the server for two cases known in advance.

use corewise::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A listening socket: TCP or a unix socket file.
///
/// ```
/// use corewise_kv::listen::Listener;
/// let l = Listener::from(corewise_kv::server::bind("127.0.0.1", 0)?);
/// assert!(l.address().starts_with("tcp:127.0.0.1:"));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub enum Listener {
    /// TCP (`-l`, `-p`).
    Tcp(TcpListener),
    /// A unix socket at `path` (`-s`).
    Unix {
        /// The socket.
        sock: UnixListener,
        /// Its file.
        path: PathBuf,
    },
}

impl From<TcpListener> for Listener {
    fn from(l: TcpListener) -> Self {
        Listener::Tcp(l)
    }
}

impl Listener {
    /// Listens on a unix socket at `path` whose file gets the permissions
    /// `mask` (memcached's `-a`, e.g. `0o700`). A socket file already
    /// there (left by a server that was killed) is replaced, as memcached
    /// replaces it; any other kind of file is an error, never removed.
    ///
    /// ```
    /// use corewise_kv::listen::Listener;
    /// use std::os::unix::fs::PermissionsExt;
    /// let path = std::env::temp_dir().join(format!("kv-doc-{}.sock", std::process::id()));
    /// let l = Listener::unix(&path, 0o760)?;
    /// assert_eq!(std::fs::metadata(&path)?.permissions().mode() & 0o777, 0o760);
    /// assert_eq!(l.address(), format!("unix:{}", path.display()));
    /// drop(l);
    /// // A socket file left behind is taken over.
    /// let again = Listener::unix(&path, 0o700)?;
    /// std::fs::remove_file(&path)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn unix(path: &Path, mask: u32) -> io::Result<Self> {
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)?,
            Ok(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    "a file that is not a socket is in the way",
                ))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // The file's mode is what the umask leaves of 0777: the umask
        // is the process's, so it is set only around the bind, before the
        // runtime starts any thread.
        // SAFETY: `umask` only swaps the process's file creation mask.
        let old = unsafe { libc::umask(!(mask & 0o777) & 0o777) };
        let bound = UnixListener::bind(path);
        // SAFETY: as above, putting the previous mask back.
        unsafe { libc::umask(old) };
        Ok(Listener::Unix {
            sock: bound?,
            path: path.to_path_buf(),
        })
    }

    /// Waits for a connection.
    ///
    /// ```
    /// use corewise_kv::listen::Listener;
    /// let l = Listener::from(corewise_kv::server::bind("127.0.0.1", 0)?);
    /// let port = match &l { Listener::Tcp(t) => t.local_addr()?.port(), _ => unreachable!() };
    /// let _c = std::net::TcpStream::connect(("127.0.0.1", port))?;
    /// let s = l.accept()?;
    /// assert!(s.peer().starts_with("tcp:127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn accept(&self) -> io::Result<Stream> {
        Ok(match self {
            Listener::Tcp(l) => Stream::Tcp(l.accept()?.0),
            Listener::Unix { sock, .. } => Stream::Unix(sock.accept()?.0),
        })
    }

    /// The address as `stats conns` shows it: `tcp:host:port` or
    /// `unix:path`.
    ///
    /// ```
    /// use corewise_kv::listen::Listener;
    /// let l = Listener::from(corewise_kv::server::bind("127.0.0.1", 0)?);
    /// assert!(l.address().starts_with("tcp:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn address(&self) -> String {
        match self {
            Listener::Tcp(l) => l
                .local_addr()
                .map_or_else(|_| "tcp:?".into(), |a| format!("tcp:{a}")),
            Listener::Unix { path, .. } => format!("unix:{}", path.display()),
        }
    }

    /// Sets the listen backlog (memcached's `-b`): Linux takes `listen`
    /// on a socket that already listens as its new backlog (capped by the
    /// kernel at `net.core.somaxconn`).
    ///
    /// ```
    /// use corewise_kv::listen::Listener;
    /// let l = Listener::from(corewise_kv::server::bind("127.0.0.1", 0)?);
    /// l.set_backlog(16)?;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn set_backlog(&self, backlog: u32) -> io::Result<()> {
        let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
        // SAFETY: `listen` takes a descriptor the listener owns and an int.
        if unsafe { libc::listen(self.as_raw_fd(), backlog) } == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Makes `accept` give up after `d` (`None`: wait for ever).
    pub(crate) fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        match self {
            Listener::Tcp(l) => l.set_timeout(d),
            Listener::Unix { sock, .. } => sock.set_timeout(d),
        }
    }
}

impl AsRawFd for Listener {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Listener::Tcp(l) => l.as_raw_fd(),
            Listener::Unix { sock, .. } => sock.as_raw_fd(),
        }
    }
}

/// An accepted connection: TCP or unix.
///
/// ```
/// use corewise_kv::listen::Stream;
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let (a, b) = corewise::net::UnixStream::pair()?;
///     let (mut a, mut b) = (Stream::from(a), Stream::from(b));
///     a.write_all(b"ping")?;
///     let mut got = [0u8; 4];
///     b.read_exact(&mut got)?;
///     assert_eq!(&got, b"ping");
///     Ok::<(), std::io::Error>(())
/// }).unwrap()?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub enum Stream {
    /// A TCP connection.
    Tcp(TcpStream),
    /// A unix socket connection.
    Unix(UnixStream),
}

impl From<TcpStream> for Stream {
    fn from(s: TcpStream) -> Self {
        Stream::Tcp(s)
    }
}

impl From<UnixStream> for Stream {
    fn from(s: UnixStream) -> Self {
        Stream::Unix(s)
    }
}

impl Stream {
    /// The peer as `stats conns` shows it: `tcp:host:port`, or for a unix
    /// client memcached's own text, `?:<AF 0>` (it keeps no address for
    /// them), so that tools reading `stats conns` see what they know.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let (a, _b) = rt.block_on(corewise::net::UnixStream::pair).unwrap().unwrap();
    /// assert_eq!(corewise_kv::listen::Stream::from(a).peer(), "?:<AF 0>");
    /// ```
    pub fn peer(&self) -> String {
        match self {
            Stream::Tcp(s) => s
                .peer_addr()
                .map_or_else(|_| "tcp:unknown".into(), |a| format!("tcp:{a}")),
            Stream::Unix(_) => "?:<AF 0>".into(),
        }
    }

    /// Turns Nagle's algorithm off on TCP (replies go out at once); a unix
    /// socket has nothing to turn off.
    pub(crate) fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }

    /// Waits until the socket is readable (or closed), blocking only the
    /// calling user thread.
    pub(crate) fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable(),
            Stream::Unix(s) => s.readable(),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
