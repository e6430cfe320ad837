//! The one socket type: a std socket (which owns the fd) and the object's
//! [`IoState`], with every method that does not depend on the protocol
//! written once, generically, instead of once per type.

use crate::io::op::Kind;
use crate::io::{Canceller, IoState};
use rustix::net::{AddressFamily, SocketFlags, SocketType};
use std::fmt;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// Listen backlog of listeners made here (the kernel caps it at somaxconn).
pub(crate) const BACKLOG: i32 = 4096;

mod sealed {
    /// Only the std socket types listed at [`super::SocketKind`].
    pub trait Sealed {}
}

/// The std socket types a [`Socket`] wraps: `std::net::{TcpStream,
/// TcpListener, UdpSocket}` and `std::os::unix::net::{UnixStream,
/// UnixListener}`. Sealed: the list is this crate's.
///
/// ```
/// fn fd_of<K: corewise::net::SocketKind>(s: &corewise::net::Socket<K>) -> i32 {
///     use std::os::fd::AsRawFd;
///     s.as_raw_fd()
/// }
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
///     assert!(fd_of(&l) >= 0);
/// }).unwrap();
/// ```
pub trait SocketKind: sealed::Sealed + AsFd + From<OwnedFd> + Into<OwnedFd> + fmt::Debug {}

/// The byte-stream kinds (`TcpStream`, `UnixStream`): `Read`/`Write`,
/// `peek`, `shutdown`.
///
/// ```
/// fn greet<K: corewise::net::StreamKind>(s: &corewise::net::Socket<K>) -> std::io::Result<()> {
///     use std::io::Write;
///     let mut s = s;
///     s.write_all(b"hi")
/// }
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let (a, b) = corewise::net::UnixStream::pair().unwrap();
///     greet(&a).unwrap();
///     let mut buf = [0u8; 2];
///     assert_eq!(b.read(&mut buf).unwrap(), 2);
/// }).unwrap();
/// ```
pub trait StreamKind: SocketKind {}

/// The listener kinds (`TcpListener`, `UnixListener`): `accept`'s streams
/// are sockets of kind [`Stream`](Self::Stream).
///
/// ```
/// fn first<L: corewise::net::ListenerKind>(
///     l: &corewise::net::Socket<L>,
/// ) -> std::io::Result<corewise::net::Socket<L::Stream>> {
///     l.incoming().next().expect("incoming never ends")
/// }
/// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
/// assert!(first(&l).is_ok());
/// ```
pub trait ListenerKind: SocketKind {
    /// The kind of the accepted connections.
    ///
    /// ```
    /// use corewise::net::ListenerKind;
    /// let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// let s: <std::net::TcpListener as ListenerKind>::Stream =
    ///     std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
    /// assert_eq!(s.peer_addr().unwrap(), l.local_addr().unwrap());
    /// ```
    type Stream: StreamKind;
}

impl sealed::Sealed for std::net::TcpStream {}
impl sealed::Sealed for std::net::TcpListener {}
impl sealed::Sealed for std::net::UdpSocket {}
impl sealed::Sealed for std::os::unix::net::UnixStream {}
impl sealed::Sealed for std::os::unix::net::UnixListener {}
impl sealed::Sealed for std::os::unix::net::UnixDatagram {}
impl SocketKind for std::net::TcpStream {}
impl SocketKind for std::net::TcpListener {}
impl SocketKind for std::net::UdpSocket {}
impl SocketKind for std::os::unix::net::UnixStream {}
impl SocketKind for std::os::unix::net::UnixListener {}
impl SocketKind for std::os::unix::net::UnixDatagram {}
impl StreamKind for std::net::TcpStream {}
impl StreamKind for std::os::unix::net::UnixStream {}
impl ListenerKind for std::net::TcpListener {
    type Stream = std::net::TcpStream;
}
impl ListenerKind for std::os::unix::net::UnixListener {
    type Stream = std::os::unix::net::UnixStream;
}

/// A socket whose blocking calls block the user thread, not its core; `K`
/// is the std socket type it stands in for. Use it through its names
/// [`TcpStream`](super::TcpStream), [`TcpListener`](super::TcpListener),
/// [`UdpSocket`](super::UdpSocket), [`UnixStream`](super::UnixStream) and
/// [`UnixListener`](super::UnixListener); the methods every kind has are
/// here, the rest on each name's page.
///
/// ```
/// use std::time::Duration;
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let (a, _b) = corewise::net::UnixStream::pair().unwrap();
///     a.set_read_timeout(Some(Duration::from_millis(5))).unwrap();
///     let mut buf = [0u8; 1];
///     let e = a.read(&mut buf).unwrap_err();
///     assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct Socket<K> {
    pub(crate) sock: K,
    pub(crate) state: IoState,
}

impl<K: SocketKind> Socket<K> {
    /// Wraps a socket that is already non-blocking.
    pub(crate) fn from_nonblocking(sock: K) -> Self {
        Self {
            sock,
            state: IoState::default(),
        }
    }

    /// A new non-blocking socket.
    pub(crate) fn open(af: AddressFamily, ty: SocketType) -> io::Result<OwnedFd> {
        Ok(rustix::net::socket_with(
            af,
            ty,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?)
    }

    /// Connects the new socket `fd` to `addr` (waiting for the handshake
    /// under `deadline`) and wraps it.
    pub(crate) fn connected(
        fd: OwnedFd,
        addr: &impl rustix::net::addr::SocketAddrArg,
        deadline: Option<Instant>,
    ) -> io::Result<Self> {
        let state = IoState::default();
        match rustix::net::connect(&fd, addr) {
            Ok(()) => {}
            Err(rustix::io::Errno::INPROGRESS) | Err(rustix::io::Errno::AGAIN) => {
                state.wait_ready(fd.as_raw_fd(), libc::POLLOUT as u32, deadline)?;
                if let Err(e) = rustix::net::sockopt::socket_error(&fd)? {
                    return Err(e.into());
                }
            }
            Err(e) => return Err(e.into()),
        }
        Ok(Self {
            sock: K::from(fd),
            state,
        })
    }

    /// A connected pair of new sockets of type `ty` (`socketpair`).
    pub(crate) fn pair_of(ty: SocketType) -> io::Result<(Self, Self)> {
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            ty,
            SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
            None,
        )?;
        Ok((
            Self::from_nonblocking(a.into()),
            Self::from_nonblocking(b.into()),
        ))
    }

    /// Receives into `buf` with `flags` (`MSG_PEEK` leaves the data in
    /// the queue): one datagram, or what a stream has.
    pub(crate) fn recv_with(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
        let kind = Kind::Recv {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            flags,
        };
        // SAFETY: `buf` is borrowed for the whole call, which returns only
        // after the kernel is done with it.
        unsafe { self.state.read(kind) }
    }

    /// Sends `buf` (some of it on a stream, one datagram otherwise).
    pub(crate) fn send_bytes(&self, buf: &[u8]) -> io::Result<usize> {
        let kind = Kind::Send {
            fd: self.as_raw_fd(),
            buf: buf.as_ptr(),
            len: buf.len(),
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.write(kind) }
    }

    /// Timeout of each read, receive or accept (`None`: wait forever).
    /// Zero is an error, as with std.
    ///
    /// ```
    /// use std::time::Duration;
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert!(a.set_read_timeout(Some(Duration::ZERO)).is_err());
    /// a.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    /// assert_eq!(a.read_timeout().unwrap(), Some(Duration::from_secs(1)));
    /// ```
    pub fn set_read_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// Timeout of each write or send (`None`: wait forever). Zero is an
    /// error.
    ///
    /// ```
    /// use std::time::Duration;
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// a.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    /// assert_eq!(a.write_timeout().unwrap(), Some(Duration::from_secs(2)));
    /// ```
    pub fn set_write_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.state.set_write_timeout(d)
    }

    /// The read timeout (see [`set_read_timeout`](Self::set_read_timeout)).
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert_eq!(a.read_timeout().unwrap(), None);
    /// ```
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.state.read_timeout())
    }

    /// The write timeout (see [`set_write_timeout`](Self::set_write_timeout)).
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert_eq!(a.write_timeout().unwrap(), None);
    /// ```
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.state.write_timeout())
    }

    /// Waits until the socket has something to read (data, end of stream,
    /// an error, or on a listener a connection), without reading it. Like a
    /// read it blocks the user thread, not its core, and honours the read
    /// timeout (`TimedOut`) and the [`canceller`](Self::canceller).
    ///
    /// What it is for: a server with many mostly idle connections waits
    /// here with no buffer, and takes one only once there is input (a
    /// thread blocked in `read` holds its buffer for as long as it waits).
    ///
    /// As tokio's `readable`, it may return when there is nothing to read
    /// after all (on the epoll back end it trusts the readiness event): a
    /// non-blocking read after it (`recv` with `MSG_DONTWAIT`) can still
    /// report `WouldBlock`, and a blocking `read` then waits.
    ///
    /// ```
    /// use std::time::Duration;
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let (a, b) = corewise::net::UnixStream::pair().unwrap();
    ///     b.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    ///     let err = b.readable().unwrap_err();
    ///     assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    ///     a.write(b"x").unwrap();
    ///     b.readable().unwrap();
    ///     b.readable().unwrap(); // nothing was read: still readable
    ///     let mut buf = [0u8; 4];
    ///     assert_eq!(b.read(&mut buf).unwrap(), 1);
    /// }).unwrap();
    /// ```
    pub fn readable(&self) -> io::Result<()> {
        self.state.readable(self.as_raw_fd())
    }

    /// Waits until the socket can take more output (or reports an error),
    /// under the write timeout and the [`canceller`](Self::canceller).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    ///     a.writable().unwrap(); // an empty send buffer
    ///     assert_eq!(a.write(b"x").unwrap(), 1);
    /// }).unwrap();
    /// ```
    pub fn writable(&self) -> io::Result<()> {
        self.state.writable(self.as_raw_fd())
    }

    /// A handle that cancels this socket's blocking calls from any thread
    /// (see [`Canceller`]).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    ///     let c = a.canceller();
    ///     let t = std::thread::spawn(move || {
    ///         std::thread::sleep(std::time::Duration::from_millis(20));
    ///         c.cancel();
    ///     });
    ///     let e = a.read(&mut [0u8; 1]).unwrap_err();
    ///     assert!(corewise::io::is_cancelled(&e));
    ///     t.join().unwrap();
    /// }).unwrap();
    /// ```
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
    }

    /// The pending socket error, if any (`SO_ERROR`; reading clears it).
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert!(a.take_error().unwrap().is_none());
    /// ```
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(rustix::net::sockopt::socket_error(&self.sock)?
            .err()
            .map(io::Error::from))
    }

    /// A second handle to the same socket (a `dup` of the fd, with its own
    /// timeouts and cancel state).
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// a.try_clone().unwrap().write(b"x").unwrap();
    /// assert_eq!(b.read(&mut [0u8; 1]).unwrap(), 1);
    /// ```
    pub fn try_clone(&self) -> io::Result<Self> {
        let fd = rustix::io::fcntl_dupfd_cloexec(&self.sock, 0)?;
        Ok(Self::from_nonblocking(K::from(fd)))
    }
}

impl<L: ListenerKind> Socket<L> {
    /// Waits for a connection on a listener: the new fd (non-blocking) and
    /// the peer's kernel address.
    pub(crate) fn accept_fd(&self) -> io::Result<(OwnedFd, libc::sockaddr_storage)> {
        // SAFETY: all-zero is a valid sockaddr_storage.
        let mut addr: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of_val(&addr) as libc::socklen_t;
        let kind = Kind::Accept {
            fd: self.as_raw_fd(),
            addr: &mut addr,
            len: &mut len,
        };
        // SAFETY: `addr`/`len` live on this stack until the call returns,
        // which is after the kernel wrote them.
        let fd = unsafe { self.state.read(kind) }?;
        // SAFETY: accept returned a new fd that nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        Ok((fd, addr))
    }

    /// An endless iterator of the connections, as std's: each `next` is an
    /// [`accept`](Self::accept) without the peer address.
    ///
    /// ```
    /// use std::io::Write;
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    ///     let addr = l.local_addr().unwrap();
    ///     let c = corewise::spawn(move || {
    ///         for _ in 0..3 {
    ///             corewise::net::TcpStream::connect(addr).unwrap().write_all(b"x").unwrap();
    ///         }
    ///     }).unwrap();
    ///     for s in l.incoming().take(3) {
    ///         let mut b = [0u8; 1];
    ///         assert_eq!(s.unwrap().read(&mut b).unwrap(), 1);
    ///     }
    ///     c.join().unwrap();
    /// }).unwrap();
    /// ```
    pub fn incoming(&self) -> Incoming<'_, L> {
        Incoming { listener: self }
    }

    /// Timeout of each `accept` (`None`: wait forever); the same setting as
    /// [`set_read_timeout`](Socket::set_read_timeout).
    ///
    /// ```
    /// use std::time::Duration;
    /// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
    /// l.set_timeout(Some(Duration::from_millis(5))).unwrap();
    /// assert_eq!(l.accept().unwrap_err().kind(), std::io::ErrorKind::TimedOut);
    /// ```
    pub fn set_timeout(&self, d: Option<Duration>) -> io::Result<()> {
        self.set_read_timeout(d)
    }
}

/// The connections of a listener, as std's `Incoming`: endless, each item
/// one `accept` (from [`Socket::incoming`]).
///
/// ```
/// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
/// let mut incoming = l.incoming();
/// assert!(incoming.next().unwrap().is_ok());
/// ```
#[derive(Debug)]
pub struct Incoming<'a, L> {
    listener: &'a Socket<L>,
}

impl<L: ListenerKind> Iterator for Incoming<'_, L> {
    type Item = io::Result<Socket<L::Stream>>;
    fn next(&mut self) -> Option<Self::Item> {
        Some(
            self.listener
                .accept_fd()
                .map(|(fd, _)| Socket::from_nonblocking(fd.into())),
        )
    }
}

impl<L: ListenerKind> std::iter::FusedIterator for Incoming<'_, L> {}

impl<K: StreamKind> Socket<K> {
    /// Reads into `buf`; `Ok(0)` at end of stream.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// rt.block_on(|| {
    ///     let (a, b) = corewise::net::UnixStream::pair().unwrap();
    ///     a.write(b"x").unwrap();
    ///     drop(a);
    ///     let mut buf = [0u8; 4];
    ///     assert_eq!(b.read(&mut buf).unwrap(), 1);
    ///     assert_eq!(b.read(&mut buf).unwrap(), 0);
    /// }).unwrap();
    /// ```
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let kind = Kind::Recv {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            flags: 0,
        };
        // SAFETY: `buf` is borrowed for the whole call, which returns only
        // after the kernel is done with it.
        unsafe { self.state.read_stream(kind, buf.len()) }
    }

    /// Reads without removing the data from the queue.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// a.write(b"ab").unwrap();
    /// let mut buf = [0u8; 2];
    /// assert_eq!(b.peek(&mut buf).unwrap(), 2);
    /// assert_eq!(b.read(&mut buf).unwrap(), 2);
    /// ```
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_with(buf, libc::MSG_PEEK)
    }

    /// Writes some of `buf`; returns how much.
    ///
    /// ```
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert_eq!(a.write(b"abc").unwrap(), 3);
    /// ```
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        self.send_bytes(buf)
    }

    /// Scatter read (`readv`).
    ///
    /// ```
    /// use std::io::IoSliceMut;
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// a.write(b"abcd").unwrap();
    /// let (mut x, mut y) = ([0u8; 2], [0u8; 2]);
    /// let n = b.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]).unwrap();
    /// assert_eq!((n, &x, &y), (4, b"ab", b"cd"));
    /// ```
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.state.read_vectored(self.as_raw_fd(), bufs, true)
    }

    /// Gather write (`writev`).
    ///
    /// ```
    /// use std::io::IoSlice;
    /// let (a, _b) = corewise::net::UnixStream::pair().unwrap();
    /// assert_eq!(a.write_vectored(&[IoSlice::new(b"ab"), IoSlice::new(b"c")]).unwrap(), 3);
    /// ```
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.state.write_vectored(self.as_raw_fd(), bufs, true)
    }

    /// Shuts down the read, write, or both halves. From another thread it
    /// wakes a blocked reader with end-of-stream.
    ///
    /// ```
    /// let (a, b) = corewise::net::UnixStream::pair().unwrap();
    /// a.shutdown(std::net::Shutdown::Write).unwrap();
    /// assert_eq!(b.read(&mut [0u8; 1]).unwrap(), 0);
    /// ```
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let how = match how {
            Shutdown::Read => rustix::net::Shutdown::Read,
            Shutdown::Write => rustix::net::Shutdown::Write,
            Shutdown::Both => rustix::net::Shutdown::Both,
        };
        Ok(rustix::net::shutdown(&self.sock, how)?)
    }
}

impl<K: StreamKind> Read for &Socket<K> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Socket::read(self, buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        Socket::read_vectored(self, bufs)
    }
}

impl<K: StreamKind> Read for Socket<K> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (*self).read(buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        (*self).read_vectored(bufs)
    }
}

impl<K: StreamKind> Write for &Socket<K> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Socket::write(self, buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        Socket::write_vectored(self, bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<K: StreamKind> Write for Socket<K> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (*self).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (*self).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<K: SocketKind> AsFd for Socket<K> {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl<K: SocketKind> AsRawFd for Socket<K> {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_fd().as_raw_fd()
    }
}

/// Makes an adopted socket non-blocking, as the back ends need. The flag
/// belongs to the open file description: other handles to the same socket
/// (a `dup`, a `try_clone`) see it too.
fn adopt(fd: BorrowedFd<'_>) {
    // `FIONBIO` fails only on a closed fd, which a borrowed one is not; if
    // it ever did, the socket's calls would block the core, as std's
    // blocking calls do, but still complete.
    let _ = rustix::io::ioctl_fionbio(fd, true);
}

/// The timeouts a socket carries in the kernel (`SO_RCVTIMEO`,
/// `SO_SNDTIMEO`), which std's `set_read_timeout`/`set_write_timeout`
/// set: an adopted socket keeps them as its own, as std's socket had them.
/// A timeout that cannot be read (never on a socket) counts as none.
fn adopted_timeouts(sock: &impl AsFd, state: &IoState) {
    use rustix::net::sockopt::{socket_timeout, Timeout};
    let read = socket_timeout(sock, Timeout::Recv).unwrap_or(None);
    let write = socket_timeout(sock, Timeout::Send).unwrap_or(None);
    // Neither fails: the kernel reports no timeout as `None`, never zero.
    let _ = state.set_read_timeout(read.filter(|d| !d.is_zero()));
    let _ = state.set_write_timeout(write.filter(|d| !d.is_zero()));
}

/// Adopts a std socket (as `tokio`'s `from_std`, but infallible): sets it
/// non-blocking (see the module docs) and carries over its read and write
/// timeouts (`SO_RCVTIMEO`/`SO_SNDTIMEO`, what std's `set_read_timeout`
/// and `set_write_timeout` set), which then fail a call with
/// [`TimedOut`](std::io::ErrorKind::TimedOut) like any timeout set here.
/// A listener's read timeout becomes its accept timeout.
///
/// ```
/// use std::time::Duration;
/// let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let l = corewise::net::TcpListener::from(std_listener);
/// let std_stream = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
/// let (_server, _) = l.accept().unwrap(); // kept open: no end of stream
/// std_stream.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
/// let set = std_stream.read_timeout().unwrap(); // as the kernel keeps it
/// let s = corewise::net::TcpStream::from(std_stream);
/// assert_eq!(s.read_timeout().unwrap(), set);
/// assert_eq!(s.write_timeout().unwrap(), None);
/// let e = s.read(&mut [0u8; 1]).unwrap_err(); // nothing sent: it times out
/// assert_eq!(e.kind(), std::io::ErrorKind::TimedOut);
/// ```
impl<K: SocketKind> From<K> for Socket<K> {
    fn from(sock: K) -> Self {
        adopt(sock.as_fd());
        let s = Self::from_nonblocking(sock);
        adopted_timeouts(&s.sock, &s.state);
        s
    }
}

/// Adopts an owned socket fd, setting it non-blocking and carrying over
/// its timeouts (as `From<K>` does).
///
/// ```
/// use std::os::fd::OwnedFd;
/// let fd = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
/// let s = corewise::net::UdpSocket::from(fd);
/// assert!(s.local_addr().unwrap().ip().is_loopback());
/// ```
impl<K: SocketKind> From<OwnedFd> for Socket<K> {
    fn from(fd: OwnedFd) -> Self {
        Self::from(K::from(fd))
    }
}

/// Gives the fd up (it stays non-blocking).
///
/// ```
/// use std::os::fd::OwnedFd;
/// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
/// let addr = s.local_addr().unwrap();
/// let back = std::net::UdpSocket::from(OwnedFd::from(s));
/// assert_eq!(back.local_addr().unwrap(), addr);
/// ```
impl<K: SocketKind> From<Socket<K>> for OwnedFd {
    fn from(s: Socket<K>) -> Self {
        s.sock.into()
    }
}

/// Adopts a raw socket fd, setting it non-blocking and carrying over its
/// timeouts (as `From<K>` does).
///
/// ```
/// use std::os::fd::{FromRawFd, IntoRawFd};
/// let raw = std::net::TcpListener::bind("127.0.0.1:0").unwrap().into_raw_fd();
/// // SAFETY: `raw` is an open socket that nothing else owns.
/// let l = unsafe { corewise::net::TcpListener::from_raw_fd(raw) };
/// assert!(l.local_addr().is_ok());
/// ```
impl<K: SocketKind> FromRawFd for Socket<K> {
    /// # Safety
    /// As `std`'s: `fd` is an open socket of kind `K` that nothing else
    /// owns (it is closed when the socket drops).
    unsafe fn from_raw_fd(fd: RawFd) -> Self {
        // SAFETY: per our contract, `fd` is open and ours to own.
        Self::from(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

/// Gives the raw fd up without closing it (it stays non-blocking).
///
/// ```
/// use std::os::fd::{FromRawFd, IntoRawFd};
/// let l = corewise::net::TcpListener::bind("127.0.0.1:0").unwrap();
/// let addr = l.local_addr().unwrap();
/// let raw = l.into_raw_fd();
/// // SAFETY: `raw` came from `into_raw_fd`, so it is open and unowned.
/// let back = unsafe { std::net::TcpListener::from_raw_fd(raw) };
/// assert_eq!(back.local_addr().unwrap(), addr);
/// ```
impl<K: SocketKind> IntoRawFd for Socket<K> {
    fn into_raw_fd(self) -> RawFd {
        OwnedFd::from(self).into_raw_fd()
    }
}
