//! UDP: datagrams to and from any peer, or a connected one, on top of the
//! generic [`Socket`].

use super::addr::{each_addr, family, resolve, sockaddr_to_std, std_to_sockaddr};
use super::socket::Socket;
use crate::io::op::Kind;
use rustix::net::SocketType;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
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
        self.send_bytes(buf)
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
        self.recv_with(buf, 0)
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
        self.recv_msg(buf, 0)
    }

    /// Receives the next datagram from the connected peer without taking
    /// it from the queue: the next `recv` or `peek` sees it again. As in
    /// std, a datagram longer than `buf` is cut to its length.
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// b.connect(a.local_addr().unwrap()).unwrap();
    /// a.send_to(b"ab", b.local_addr().unwrap()).unwrap();
    /// let mut buf = [0u8; 8];
    /// assert_eq!(b.peek(&mut buf).unwrap(), 2);
    /// assert_eq!(b.recv(&mut buf).unwrap(), 2);
    /// ```
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_with(buf, libc::MSG_PEEK)
    }

    /// Receives the next datagram and its sender without taking it from
    /// the queue (see [`peek`](Self::peek)).
    ///
    /// ```
    /// let a = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// let b = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// a.send_to(b"xyz", b.local_addr().unwrap()).unwrap();
    /// let mut buf = [0u8; 8];
    /// let peeked = b.peek_from(&mut buf).unwrap();
    /// assert_eq!(peeked, (3, a.local_addr().unwrap()));
    /// assert_eq!(b.recv_from(&mut buf).unwrap(), peeked);
    /// ```
    pub fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_msg(buf, libc::MSG_PEEK)
    }

    /// `recvmsg` of one datagram into `buf` with `flags`, and its sender.
    fn recv_msg(&self, buf: &mut [u8], flags: libc::c_int) -> io::Result<(usize, SocketAddr)> {
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
            flags,
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

    /// Sets the IP time-to-live of outgoing datagrams (`IP_TTL`), as
    /// [`std::net::UdpSocket::set_ttl`].
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// s.set_ttl(7).unwrap();
    /// assert_eq!(s.ttl().unwrap(), 7);
    /// ```
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.sock.set_ttl(ttl)
    }

    /// The IP time-to-live of outgoing datagrams.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(s.ttl().unwrap() > 0);
    /// ```
    pub fn ttl(&self) -> io::Result<u32> {
        self.sock.ttl()
    }

    /// Allows or forbids sending to broadcast addresses (`SO_BROADCAST`).
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// s.set_broadcast(true).unwrap();
    /// assert!(s.broadcast().unwrap());
    /// ```
    pub fn set_broadcast(&self, on: bool) -> io::Result<()> {
        self.sock.set_broadcast(on)
    }

    /// Whether sending to broadcast addresses is allowed.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(!s.broadcast().unwrap());
    /// ```
    pub fn broadcast(&self) -> io::Result<bool> {
        self.sock.broadcast()
    }

    /// Whether this socket's IPv4 multicast datagrams loop back to the
    /// host's own members (`IP_MULTICAST_LOOP`).
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// s.set_multicast_loop_v4(false).unwrap();
    /// assert!(!s.multicast_loop_v4().unwrap());
    /// ```
    pub fn set_multicast_loop_v4(&self, on: bool) -> io::Result<()> {
        self.sock.set_multicast_loop_v4(on)
    }

    /// Whether IPv4 multicast datagrams loop back.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert!(s.multicast_loop_v4().unwrap()); // the kernel's default
    /// ```
    pub fn multicast_loop_v4(&self) -> io::Result<bool> {
        self.sock.multicast_loop_v4()
    }

    /// The time-to-live of outgoing IPv4 multicast datagrams
    /// (`IP_MULTICAST_TTL`; 1 by default: the local network only).
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// s.set_multicast_ttl_v4(4).unwrap();
    /// assert_eq!(s.multicast_ttl_v4().unwrap(), 4);
    /// ```
    pub fn set_multicast_ttl_v4(&self, ttl: u32) -> io::Result<()> {
        self.sock.set_multicast_ttl_v4(ttl)
    }

    /// The time-to-live of outgoing IPv4 multicast datagrams.
    ///
    /// ```
    /// let s = corewise::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    /// assert_eq!(s.multicast_ttl_v4().unwrap(), 1);
    /// ```
    pub fn multicast_ttl_v4(&self) -> io::Result<u32> {
        self.sock.multicast_ttl_v4()
    }

    /// Whether this socket's IPv6 multicast datagrams loop back
    /// (`IPV6_MULTICAST_LOOP`).
    ///
    /// ```
    /// # if let Ok(s) = corewise::net::UdpSocket::bind("[::1]:0") {
    /// s.set_multicast_loop_v6(false).unwrap();
    /// assert!(!s.multicast_loop_v6().unwrap());
    /// # }
    /// ```
    pub fn set_multicast_loop_v6(&self, on: bool) -> io::Result<()> {
        self.sock.set_multicast_loop_v6(on)
    }

    /// Whether IPv6 multicast datagrams loop back.
    ///
    /// ```
    /// # if let Ok(s) = corewise::net::UdpSocket::bind("[::1]:0") {
    /// assert!(s.multicast_loop_v6().unwrap());
    /// # }
    /// ```
    pub fn multicast_loop_v6(&self) -> io::Result<bool> {
        self.sock.multicast_loop_v6()
    }

    /// Joins the IPv4 multicast group `group` on the interface with address
    /// `interface` (`UNSPECIFIED`: the kernel's choice), as
    /// [`std::net::UdpSocket::join_multicast_v4`]. Fails (for example
    /// `EADDRNOTAVAIL`, `ENODEV`) where no interface can carry multicast.
    ///
    /// ```
    /// use std::net::Ipv4Addr;
    /// let s = corewise::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    /// let group = Ipv4Addr::new(239, 255, 0, 1);
    /// if s.join_multicast_v4(&group, &Ipv4Addr::UNSPECIFIED).is_ok() {
    ///     s.leave_multicast_v4(&group, &Ipv4Addr::UNSPECIFIED).unwrap();
    /// }
    /// ```
    pub fn join_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.sock.join_multicast_v4(group, interface)
    }

    /// Leaves an IPv4 multicast group joined with
    /// [`join_multicast_v4`](Self::join_multicast_v4).
    ///
    /// ```
    /// use std::net::Ipv4Addr;
    /// let s = corewise::net::UdpSocket::bind("0.0.0.0:0").unwrap();
    /// let group = Ipv4Addr::new(239, 255, 0, 2);
    /// // Never joined: the kernel says so.
    /// assert!(s.leave_multicast_v4(&group, &Ipv4Addr::UNSPECIFIED).is_err());
    /// ```
    pub fn leave_multicast_v4(&self, group: &Ipv4Addr, interface: &Ipv4Addr) -> io::Result<()> {
        self.sock.leave_multicast_v4(group, interface)
    }

    /// Joins the IPv6 multicast group `group` on interface index
    /// `interface` (0: the kernel's choice).
    ///
    /// ```
    /// use std::net::Ipv6Addr;
    /// if let Ok(s) = corewise::net::UdpSocket::bind("[::]:0") {
    ///     let group: Ipv6Addr = "ff02::1:3".parse().unwrap();
    ///     if s.join_multicast_v6(&group, 0).is_ok() {
    ///         s.leave_multicast_v6(&group, 0).unwrap();
    ///     }
    /// }
    /// ```
    pub fn join_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.sock.join_multicast_v6(group, interface)
    }

    /// Leaves an IPv6 multicast group joined with
    /// [`join_multicast_v6`](Self::join_multicast_v6).
    ///
    /// ```
    /// use std::net::Ipv6Addr;
    /// if let Ok(s) = corewise::net::UdpSocket::bind("[::]:0") {
    ///     let group: Ipv6Addr = "ff02::1:4".parse().unwrap();
    ///     assert!(s.leave_multicast_v6(&group, 0).is_err());
    /// }
    /// ```
    pub fn leave_multicast_v6(&self, group: &Ipv6Addr, interface: u32) -> io::Result<()> {
        self.sock.leave_multicast_v6(group, interface)
    }
}
