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
//! One type, [`Socket<K>`], stands for all five: `K` is the std socket it
//! wraps, and [`TcpStream`], [`TcpListener`], [`UdpSocket`], [`UnixStream`]
//! and [`UnixListener`] are its names for each. What every socket does
//! (timeouts, cancel, the fd traits) and what every byte stream does
//! (read, write, peek, shutdown) is written once, generically; each kind
//! adds only what its protocol needs (bind, connect, accept, addresses).

mod addr;
mod socket;
mod tcp;
mod udp;
mod unix;

pub(crate) use addr::sockaddr_to_std;
pub use socket::{Socket, SocketKind, StreamKind};
pub use tcp::{TcpListener, TcpStream};
pub use udp::UdpSocket;
pub use unix::{UnixListener, UnixStream};
