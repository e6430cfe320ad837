//! Sockets whose blocking calls block the user thread, not its core.
//!
//! The types mirror `std::net` (and `std::os::unix::net`): same names, same
//! methods, `std::io::Read`/`Write` for the streams and for references to
//! them. Under the hood every socket is non-blocking and each call goes
//! through the calling core's ring (or epoll set), see [`crate::io`]; on a
//! plain OS thread the same call is an ordinary system call plus `poll(2)`.
//!
//! Every blocking call honours the object's timeouts (a linked timeout on
//! the ring; the error kind is `TimedOut`) and can be cancelled from another
//! thread through a [`Canceller`](crate::io::Canceller). `shutdown` from
//! another thread wakes a blocked reader with end-of-stream, as with std.
//!
//! One type, [`Socket<K>`], stands for all six: `K` is the std socket it
//! wraps, and [`TcpStream`], [`TcpListener`], [`UdpSocket`], [`UnixStream`],
//! [`UnixListener`] and [`UnixDatagram`] are its names for each. What every socket does
//! (timeouts, cancel, the fd traits) and what every byte stream does
//! (read, write, peek, shutdown) is written once, generically; each kind
//! adds only what its protocol needs (bind, connect, accept, addresses).
//!
//! # Porting from `std::net`
//!
//! The std names, signatures and semantics hold, with these differences:
//!
//! - Adopting a socket (`From<std::net::TcpStream>` and the others,
//!   `From<OwnedFd>`, `FromRawFd`) makes it non-blocking: the back ends
//!   need that. The flag lives on the open file description, so other
//!   handles to the same socket see it too; a socket given back
//!   (`IntoRawFd`, `OwnedFd::from`) stays non-blocking. The timeouts std
//!   set on it (`SO_RCVTIMEO`, `SO_SNDTIMEO`) are carried over as the
//!   adopted socket's own, so a read that timed out under std times out
//!   here too (a listener's read timeout is its accept timeout).
//! - There is no `set_nonblocking`: a call blocks only its user thread, and
//!   [timeouts](Socket::set_read_timeout) and a
//!   [`Canceller`](crate::io::Canceller) bound the wait instead.
//! - `TcpStream::connect`, `TcpListener::bind`, `UdpSocket::bind` and
//!   `UdpSocket::connect` look names up on a syscall thread
//!   ([`crate::blocking()`]) when called from a user thread, so a slow DNS
//!   answer does not stall the core: their address argument must be `Send`
//!   (every std address form is), and each call costs one hand-off to that
//!   thread and back (about 17 µs, measured on a loaded 2-CPU machine);
//!   `TcpStream::connect_timeout`, which takes a resolved address, skips
//!   it. `UdpSocket::send_to` looks names up on the calling thread (a
//!   hand-off per datagram would cost more than the send): give it an
//!   address.
//! - The streams' `read`, `write`, `peek` and their vectored forms are also
//!   inherent methods taking `&self`, so no trait import is needed and one
//!   stream can be read and written from two threads.
//! - Listeners also have `set_timeout` (the `accept` timeout) and
//!   `canceller`.
//! - Every socket also has [`readable`](Socket::readable) and
//!   [`writable`](Socket::writable), which std lacks: they wait for input
//!   (or room for output) without taking it, under the same timeouts and
//!   canceller, and may return spuriously, as tokio's do. A server with
//!   many quiet connections waits there without a buffer.
//! - The six types are one generic type, [`Socket<K>`]: code generic over
//!   sockets can name [`SocketKind`], [`StreamKind`] or [`ListenerKind`].
//! - A read, write or accept whose timeout passes fails with
//!   `ErrorKind::TimedOut`, where std on Linux gives `WouldBlock` (the
//!   kernel's `EAGAIN` under `SO_RCVTIMEO`): code that matches on
//!   `WouldBlock` for a timeout matches on `TimedOut` here.
//! - `UnixDatagram::send_to` and `recv_from` try the call and wait for
//!   readiness when it would block (a pathname address has no ring
//!   operation of its own here), so each costs a poll when it waits; `send`
//!   and `recv` on a connected one go through the ring as the other
//!   sockets' do. Its unstable std methods (`peek`, ancillary data) are not
//!   there.

mod addr;
mod socket;
mod tcp;
mod udp;
mod unix;

pub(crate) use addr::sockaddr_to_std;
pub use socket::{Incoming, ListenerKind, Socket, SocketKind, StreamKind};
pub use tcp::{TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use unix::{UnixDatagram, UnixListener, UnixStream};
