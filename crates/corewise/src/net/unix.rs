//! Unix-domain streams, listeners and datagram sockets, on top of the
//! generic [`Socket`].

use super::socket::{Socket, BACKLOG};
use rustix::net::{AddressFamily, SocketType};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

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
        Self::pair_of(SocketType::STREAM)
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

/// A Unix-domain datagram socket (std's `UnixDatagram`): what a syslog or
/// journald client sends its records through.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let p = std::env::temp_dir().join(format!("cw-doc-dgram-{}.sock", std::process::id()));
///     let _ = std::fs::remove_file(&p);
///     let server = corewise::net::UnixDatagram::bind(&p).unwrap();
///     let client = corewise::net::UnixDatagram::unbound().unwrap();
///     client.send_to(b"<14>hello", &p).unwrap();
///     let mut buf = [0u8; 32];
///     let (n, from) = server.recv_from(&mut buf).unwrap();
///     assert_eq!((&buf[..n], from.is_unnamed()), (&b"<14>hello"[..], true));
///     std::fs::remove_file(&p).unwrap();
/// }).unwrap();
/// ```
pub type UnixDatagram = Socket<std::os::unix::net::UnixDatagram>;

impl Socket<std::os::unix::net::UnixDatagram> {
    /// Runs `call` (a non-blocking std call) until it does not report
    /// `WouldBlock`, waiting in between for `events` under `timeout`
    /// (counted from now) and the canceller.
    fn when_ready<R>(
        &self,
        events: libc::c_short,
        timeout: Option<Duration>,
        mut call: impl FnMut() -> io::Result<R>,
    ) -> io::Result<R> {
        let deadline = timeout.and_then(crate::deadline::after);
        loop {
            match call() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.state
                        .wait_ready(self.as_raw_fd(), events as u32, deadline)?;
                }
                r => return r,
            }
        }
    }

    /// A datagram socket bound to `path`.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-dbind-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let s = corewise::net::UnixDatagram::bind(&p).unwrap();
    /// assert_eq!(s.local_addr().unwrap().as_pathname(), Some(p.as_path()));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn bind(path: impl AsRef<Path>) -> io::Result<Self> {
        let fd = Self::open(AddressFamily::UNIX, SocketType::DGRAM)?;
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        rustix::net::bind(&fd, &addr)?;
        Ok(Self::from_nonblocking(fd.into()))
    }

    /// A datagram socket bound to no address.
    ///
    /// ```
    /// let s = corewise::net::UnixDatagram::unbound().unwrap();
    /// assert!(s.local_addr().unwrap().is_unnamed());
    /// ```
    pub fn unbound() -> io::Result<Self> {
        Ok(Self::from_nonblocking(
            Self::open(AddressFamily::UNIX, SocketType::DGRAM)?.into(),
        ))
    }

    /// A connected pair of datagram sockets.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixDatagram::pair().unwrap();
    /// a.send(b"one").unwrap();
    /// let mut buf = [0u8; 8];
    /// assert_eq!(b.recv(&mut buf).unwrap(), 3);
    /// ```
    pub fn pair() -> io::Result<(Self, Self)> {
        Self::pair_of(SocketType::DGRAM)
    }

    /// Sets the default peer to the socket at `path` (a datagram connect
    /// never waits).
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-dconn-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let server = corewise::net::UnixDatagram::bind(&p).unwrap();
    /// let c = corewise::net::UnixDatagram::unbound().unwrap();
    /// c.connect(&p).unwrap();
    /// assert_eq!(c.peer_addr().unwrap().as_pathname(), Some(p.as_path()));
    /// c.send(b"x").unwrap();
    /// assert_eq!(server.recv(&mut [0u8; 4]).unwrap(), 1);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn connect(&self, path: impl AsRef<Path>) -> io::Result<()> {
        let addr = rustix::net::SocketAddrUnix::new(path.as_ref())?;
        Ok(rustix::net::connect(&self.sock, &addr)?)
    }

    /// Sends one datagram to the connected peer; waits (blocking only the
    /// thread) while the peer's queue is full.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixDatagram::pair().unwrap();
    /// assert_eq!(a.send(b"abc").unwrap(), 3);
    /// # drop(b);
    /// ```
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_bytes(buf)
    }

    /// Receives one datagram from the connected peer (or anyone, if not
    /// connected).
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixDatagram::pair().unwrap();
    /// a.send(b"hey").unwrap();
    /// let mut buf = [0u8; 8];
    /// let n = b.recv(&mut buf).unwrap();
    /// assert_eq!(&buf[..n], b"hey");
    /// ```
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_with(buf, 0)
    }

    /// Sends one datagram to the socket at `path`. It is tried at once and,
    /// while the receiver's queue is full, retried when the socket is
    /// writable (blocking only the thread, under the write timeout).
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-dsend-{}.sock", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let server = corewise::net::UnixDatagram::bind(&p).unwrap();
    /// let c = corewise::net::UnixDatagram::unbound().unwrap();
    /// assert_eq!(c.send_to(b"rec", &p).unwrap(), 3);
    /// assert_eq!(server.recv(&mut [0u8; 4]).unwrap(), 3);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn send_to(&self, buf: &[u8], path: impl AsRef<Path>) -> io::Result<usize> {
        self.when_ready(libc::POLLOUT, self.state.write_timeout(), || {
            self.sock.send_to(buf, path.as_ref())
        })
    }

    /// Receives one datagram and the address of its sender. It waits
    /// (blocking only the thread, under the read timeout and the canceller)
    /// until one is there.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixDatagram::pair().unwrap();
    /// a.send(b"from a").unwrap();
    /// let mut buf = [0u8; 16];
    /// let (n, from) = b.recv_from(&mut buf).unwrap();
    /// assert_eq!((n, from.is_unnamed()), (6, true));
    /// ```
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.when_ready(libc::POLLIN, self.state.read_timeout(), || {
            self.sock.recv_from(buf)
        })
    }

    /// The bound address.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixDatagram::pair().unwrap();
    /// assert!(a.local_addr().unwrap().is_unnamed());
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The connected peer.
    ///
    /// ```
    /// let s = corewise::net::UnixDatagram::unbound().unwrap();
    /// assert!(s.peer_addr().is_err());
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }
}
