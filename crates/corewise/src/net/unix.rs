//! Unix-domain streams and listeners, on top of the generic [`Socket`].

use super::socket::{Socket, BACKLOG};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::io;
use std::os::unix::net::SocketAddr;
use std::path::Path;

/// A Unix-domain stream listener.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let p = std::env::temp_dir().join(format!("cw-doc-{}.sock", std::process::id()));
///     let _ = std::fs::remove_file(&p);
///     let l = corewise::net::UnixListener::bind(&p).unwrap();
///     let p2 = p.clone();
///     let c = corewise::spawn(move || corewise::net::UnixStream::connect(&p2).unwrap()).unwrap();
///     let (_s, _addr) = l.accept().unwrap();
///     c.join().unwrap();
///     std::fs::remove_file(&p).unwrap();
/// }).unwrap();
/// ```
pub type UnixListener = Socket<std::os::unix::net::UnixListener>;

/// A Unix-domain stream connection.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let (mut a, mut b) = corewise::net::UnixStream::pair().unwrap();
///     a.write_all(b"ok").unwrap();
///     let mut buf = [0u8; 2];
///     b.read_exact(&mut buf).unwrap();
///     assert_eq!(&buf, b"ok");
/// }).unwrap();
/// ```
pub type UnixStream = Socket<std::os::unix::net::UnixStream>;

impl Socket<std::os::unix::net::UnixListener> {
    /// Binds to `path` and listens.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-bind-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let l = corewise::net::UnixListener::bind(&p).unwrap();
    /// assert_eq!(l.local_addr().unwrap().as_pathname(), Some(p.as_path()));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn bind(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = Self::open(AddressFamily::UNIX, SocketType::STREAM)?;
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        rustix::net::bind(&fd, &addr)?;
        rustix::net::listen(&fd, BACKLOG)?;
        Ok(Self::from_nonblocking(fd.into()))
    }

    /// Waits for a connection.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-acc-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let l = corewise::net::UnixListener::bind(&p).unwrap();
    /// let _c = std::os::unix::net::UnixStream::connect(&p).unwrap();
    /// let (s, _) = l.accept().unwrap();
    /// assert_eq!(s.local_addr().unwrap().as_pathname(), Some(p.as_path()));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn accept(&self) -> io::Result<(UnixStream, SocketAddr)> {
        let (fd, _) = self.accept_fd()?;
        let s = UnixStream::from_nonblocking(fd.into());
        let peer = s.peer_addr()?;
        Ok((s, peer))
    }

    /// The bound address.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-la-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let l = corewise::net::UnixListener::bind(&p).unwrap();
    /// assert!(l.local_addr().unwrap().as_pathname().is_some());
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }
}

impl Socket<std::os::unix::net::UnixStream> {
    /// Connects to the socket at `path`.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-conn-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let _l = std::os::unix::net::UnixListener::bind(&p).unwrap();
    /// let c = corewise::net::UnixStream::connect(&p).unwrap();
    /// assert_eq!(c.peer_addr().unwrap().as_pathname(), Some(p.as_path()));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn connect(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = Self::open(AddressFamily::UNIX, SocketType::STREAM)?;
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        Self::connected(fd, &addr, None)
    }

    /// A connected pair.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// a.write(b"z").unwrap();
    /// assert_eq!(b.read(&mut [0u8; 1]).unwrap(), 1);
    /// ```
    pub fn pair() -> io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((
            Self::from_nonblocking(a.into()),
            Self::from_nonblocking(b.into()),
        ))
    }

    /// The remote address.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert!(a.peer_addr().unwrap().is_unnamed());
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// The local address.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert!(a.local_addr().unwrap().is_unnamed());
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }
}
