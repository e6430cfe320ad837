//! TCP: the listener's `bind`/`accept` and the stream's `connect` and
//! options, on top of the generic [`Socket`].

use super::addr::{each_addr, family, sockaddr_to_std};
use super::socket::{Socket, BACKLOG};
use rustix::net::SocketType;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A TCP listener.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let addr = l.local_addr().unwrap();
///     let c = corewise::spawn(move || corewise::net::TcpStream::connect(addr).unwrap()).unwrap();
///     let (_s, peer) = l.accept().unwrap();
///     assert_eq!(peer, c.join().unwrap().local_addr().unwrap());
/// }).unwrap();
/// ```
pub type TcpListener = Socket<std::net::TcpListener>;

/// A TCP connection.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     let addr = l.local_addr().unwrap();
///     let echo = corewise::spawn(move || {
///         let (mut s, _) = l.accept().unwrap();
///         let mut b = [0u8; 5];
///         s.read_exact(&mut b).unwrap();
///         s.write_all(&b).unwrap();
///     }).unwrap();
///     let mut c = corewise::net::TcpStream::connect(addr).unwrap();
///     c.set_nodelay(true).unwrap();
///     c.write_all(b"hello").unwrap();
///     let mut b = [0u8; 5];
///     c.read_exact(&mut b).unwrap();
///     assert_eq!(&b, b"hello");
///     echo.join().unwrap();
/// }).unwrap();
/// ```
pub type TcpStream = Socket<std::net::TcpStream>;

impl Socket<std::net::TcpListener> {
    /// Binds to `addr` (the first address that works) and listens, with
    /// `SO_REUSEADDR` and a backlog of 4096.
    ///
    /// ```
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// assert!(l.local_addr().unwrap().ip().is_loopback());
    /// ```
    pub fn bind(addr: impl ToSocketAddrs + Send) -> io::Result<Self> {
        each_addr(addr, |a| {
            let fd = Self::open(family(a), SocketType::STREAM)?;
            rustix::net::sockopt::set_socket_reuseaddr(&fd, true)?;
            rustix::net::bind(&fd, a)?;
            rustix::net::listen(&fd, BACKLOG)?;
            Ok(Self::from_nonblocking(fd.into()))
        })
    }

    /// Waits for a connection; the new stream is non-blocking internally
    /// (its calls block the user thread only).
    ///
    /// ```
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// let (s, peer) = l.accept().unwrap();
    /// assert_eq!(peer, c.local_addr().unwrap());
    /// assert_eq!(s.peer_addr().unwrap(), peer);
    /// ```
    pub fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        let (fd, addr) = self.accept_fd()?;
        Ok((Socket::from_nonblocking(fd.into()), sockaddr_to_std(&addr)?))
    }

    /// The bound address.
    ///
    /// ```
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// assert_ne!(l.local_addr().unwrap().port(), 0);
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Sets the IP time-to-live of the connections' packets (`IP_TTL`),
    /// as [`std::net::TcpListener::set_ttl`].
    ///
    /// ```
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// l.set_ttl(9).unwrap();
    /// assert_eq!(l.ttl().unwrap(), 9);
    /// ```
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.sock.set_ttl(ttl)
    }

    /// The IP time-to-live.
    ///
    /// ```
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// assert!(l.ttl().unwrap() > 0);
    /// ```
    pub fn ttl(&self) -> io::Result<u32> {
        self.sock.ttl()
    }
}

impl Socket<std::net::TcpStream> {
    /// Connects to `addr` (each address it resolves to in turn, as std).
    /// On a user thread the name lookup runs on a syscall thread, so a slow
    /// DNS answer blocks only the caller, not its core; hence the `Send`
    /// bound, which every std address form meets.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let port = l.local_addr().unwrap().port();
    /// let c = rt.block_on(move || corewise::net::TcpStream::connect(("127.0.0.1", port))).unwrap();
    /// assert_eq!(c.unwrap().peer_addr().unwrap().port(), port);
    /// ```
    pub fn connect(addr: impl ToSocketAddrs + Send) -> io::Result<Self> {
        each_addr(addr, |a| Self::connect_inner(a, None))
    }

    /// Connects to `addr`, giving up after `timeout`.
    ///
    /// As in std, a zero `timeout` is an error of kind
    /// [`InvalidInput`](io::ErrorKind::InvalidInput), and one too large for
    /// the clock (`Duration::MAX`) sets no deadline.
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let addr = l.local_addr().unwrap();
    /// let c = corewise::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    /// assert_eq!(c.peer_addr().unwrap(), addr);
    /// let e = corewise::net::TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// ```
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<Self> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        Self::connect_inner(addr, crate::deadline::after(timeout))
    }

    fn connect_inner(a: &SocketAddr, deadline: Option<Instant>) -> io::Result<Self> {
        let fd = Self::open(family(a), SocketType::STREAM)?;
        Self::connected(fd, a, deadline)
    }

    /// The remote address.
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// assert_eq!(c.peer_addr().unwrap(), l.local_addr().unwrap());
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }

    /// The local address.
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// assert_eq!(l.accept().unwrap().1, c.local_addr().unwrap());
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Sets `TCP_NODELAY`.
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// c.set_nodelay(true).unwrap();
    /// assert!(c.nodelay().unwrap());
    /// ```
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.sock.set_nodelay(on)
    }

    /// Whether `TCP_NODELAY` is set.
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// assert!(!c.nodelay().unwrap());
    /// ```
    pub fn nodelay(&self) -> io::Result<bool> {
        self.sock.nodelay()
    }

    /// Sets the IP time-to-live of this connection's packets (`IP_TTL`),
    /// as [`std::net::TcpStream::set_ttl`].
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// c.set_ttl(17).unwrap();
    /// assert_eq!(c.ttl().unwrap(), 17);
    /// ```
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.sock.set_ttl(ttl)
    }

    /// The IP time-to-live of this connection's packets.
    ///
    /// ```
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let c = corewise::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// assert!(c.ttl().unwrap() > 0);
    /// ```
    pub fn ttl(&self) -> io::Result<u32> {
        self.sock.ttl()
    }
}
