//! UDP: datagrams to and from any peer, or a connected one, on top of the
//! generic [`Socket`].

use super::addr::{each_addr, family, resolve, sockaddr_to_std, std_to_sockaddr};
use super::socket::Socket;
use crate::io::op::Kind;
use rustix::net::SocketType;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;

/// A UDP socket.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
///     let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
///     a.send_to(b"ping", b.local_addr().unwrap()).unwrap();
///     let mut buf = [0u8; 16];
///     let (n, from) = b.recv_from(&mut buf).unwrap();
///     assert_eq!((&buf[..n], from), (&b"ping"[..], a.local_addr().unwrap()));
/// }).unwrap();
/// ```
pub type UdpSocket = Socket<std::net::UdpSocket>;

impl Socket<std::net::UdpSocket> {
    /// Binds to `addr` (a name is looked up as in
    /// [`TcpStream::connect`](super::TcpStream::connect)).
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert_ne!(s.local_addr().unwrap().port(), 0);
    /// ```
    pub fn bind(addr: impl ToSocketAddrs + Send) -> io::Result<Self> {
        each_addr(addr, |a| {
            let fd = Self::open(family(a), SocketType::DGRAM)?;
            rustix::net::bind(&fd, a)?;
            Ok(Self::from_nonblocking(fd.into()))
        })
    }

    /// Sets the default peer (no system call blocks here; a name is looked
    /// up as in [`TcpStream::connect`](super::TcpStream::connect)).
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// a.connect(b.local_addr().unwrap()).unwrap();
    /// assert_eq!(a.peer_addr().unwrap(), b.local_addr().unwrap());
    /// ```
    pub fn connect(&self, addr: impl ToSocketAddrs + Send) -> io::Result<()> {
        self.sock.connect(&resolve(addr)?[..])
    }

    /// Sends to the connected peer.
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// a.connect(b.local_addr().unwrap()).unwrap();
    /// b.connect(a.local_addr().unwrap()).unwrap();
    /// assert_eq!(a.send(b"hi").unwrap(), 2);
    /// let mut buf = [0u8; 8];
    /// assert_eq!(b.recv(&mut buf).unwrap(), 2);
    /// ```
    pub fn send(&self, buf: &[u8]) -> io::Result<usize> {
        let kind = Kind::Send {
            fd: self.as_raw_fd(),
            buf: buf.as_ptr(),
            len: buf.len(),
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.write(kind) }
    }

    /// Receives from the connected peer.
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// b.connect(a.local_addr().unwrap()).unwrap();
    /// a.send_to(b"yo", b.local_addr().unwrap()).unwrap();
    /// let mut buf = [0u8; 8];
    /// let n = b.recv(&mut buf).unwrap();
    /// assert_eq!(&buf[..n], b"yo");
    /// ```
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let kind = Kind::Recv {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            flags: 0,
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.read(kind) }
    }

    /// Sends one datagram to `addr`. Unlike `connect`, a name is looked up
    /// on the calling thread (a syscall thread per datagram would cost more
    /// than most sends): on a user thread give it an address, not a name.
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert_eq!(a.send_to(b"one", b.local_addr().unwrap()).unwrap(), 3);
    /// ```
    pub fn send_to(&self, buf: &[u8], addr: impl ToSocketAddrs) -> io::Result<usize> {
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to send to"))?;
        let (mut name, namelen) = std_to_sockaddr(&addr);
        let mut iov = libc::iovec {
            iov_base: buf.as_ptr() as *mut _,
            iov_len: buf.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = namelen;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let kind = Kind::SendMsg {
            fd: self.as_raw_fd(),
            msg: &msg,
        };
        // SAFETY: msg, name, iov and buf live until the call returns.
        unsafe { self.state.write(kind) }
    }

    /// Receives one datagram and its sender.
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// a.send_to(b"two", b.local_addr().unwrap()).unwrap();
    /// let mut buf = [0u8; 8];
    /// let (n, from) = b.recv_from(&mut buf).unwrap();
    /// assert_eq!((n, from), (3, a.local_addr().unwrap()));
    /// ```
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        // SAFETY: all-zero is a valid sockaddr_storage and msghdr.
        let mut name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: as above.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_name = (&mut name as *mut libc::sockaddr_storage).cast();
        msg.msg_namelen = std::mem::size_of_val(&name) as libc::socklen_t;
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        let kind = Kind::RecvMsg {
            fd: self.as_raw_fd(),
            msg: &mut msg,
        };
        // SAFETY: msg, name, iov and buf live until the call returns.
        let n = unsafe { self.state.read(kind) }?;
        Ok((n, sockaddr_to_std(&name)?))
    }

    /// The bound address.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(s.local_addr().unwrap().ip().is_loopback());
    /// ```
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// The connected peer.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(s.peer_addr().is_err());
    /// ```
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.sock.peer_addr()
    }
}
