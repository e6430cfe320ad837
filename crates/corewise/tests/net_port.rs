//! Porting `std::net` code: `incoming()`, adopting existing sockets (std
//! types, owned and raw fds), giving fds back, the fd traits on every
//! socket type, and name lookups that do not stall the core. Real sockets
//! on 127.0.0.1, each test once per I/O back end.

use corewise::io::IoBackend;
use corewise::net::{TcpListener, TcpStream, UdpSocket, UnixDatagram, UnixListener, UnixStream};
use corewise::Runtime;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::mpsc;
use std::time::Duration;

const BACKENDS: [IoBackend; 2] = [IoBackend::Uring, IoBackend::Epoll];

fn rt(b: IoBackend) -> Runtime {
    Runtime::builder().io_backend(b).build().unwrap()
}

/// One core only: a thread that blocked its kernel thread would stop every
/// other thread of the runtime.
fn one_core(b: IoBackend) -> Runtime {
    Runtime::builder()
        .io_backend(b)
        .max_cores(1)
        .build()
        .unwrap()
}

fn nonblocking(fd: BorrowedFd<'_>) -> bool {
    rustix::fs::fcntl_getfl(fd)
        .unwrap()
        .contains(rustix::fs::OFlags::NONBLOCK)
}

#[test]
fn incoming_yields_every_connection() {
    for b in BACKENDS {
        let rt = rt(b);
        let served = rt
            .block_on(|| {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = l.local_addr().unwrap();
                let clients: Vec<_> = (0..20u8)
                    .map(|i| {
                        corewise::spawn(move || {
                            let mut c = TcpStream::connect(addr).unwrap();
                            c.write_all(&[i]).unwrap();
                            let mut back = [0u8; 1];
                            c.read_exact(&mut back).unwrap();
                            back[0]
                        })
                        .unwrap()
                    })
                    .collect();
                let servers: Vec<_> = l
                    .incoming()
                    .take(20)
                    .map(|s| {
                        let mut s = s.unwrap();
                        corewise::spawn(move || {
                            let mut b = [0u8; 1];
                            s.read_exact(&mut b).unwrap();
                            s.write_all(&[b[0] + 100]).unwrap();
                        })
                        .unwrap()
                    })
                    .collect();
                servers.into_iter().for_each(|h| h.join().unwrap());
                let mut got: Vec<u8> = clients.into_iter().map(|h| h.join().unwrap()).collect();
                got.sort_unstable();
                got
            })
            .unwrap();
        assert_eq!(served, (100..120).collect::<Vec<u8>>(), "{b}");
    }
}

#[test]
fn incoming_reports_accept_errors_and_goes_on() {
    for b in BACKENDS {
        let rt = rt(b);
        rt.block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_timeout(Some(Duration::from_millis(10))).unwrap();
            let mut incoming = l.incoming();
            let e = incoming.next().unwrap().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut);
            let _c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            assert!(incoming.next().unwrap().is_ok());
        })
        .unwrap();
    }
}

#[test]
fn unix_incoming_yields_streams() {
    for b in BACKENDS {
        let rt = rt(b);
        let dir =
            std::env::temp_dir().join(format!("corewise-net-port-unix-{}-{b}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let p = path.clone();
        let got = rt
            .block_on(move || {
                let l = UnixListener::bind(&p).unwrap();
                let c = corewise::spawn(move || {
                    for i in 0..3u8 {
                        UnixStream::connect(&p).unwrap().write_all(&[i]).unwrap();
                    }
                })
                .unwrap();
                let got: Vec<u8> = l
                    .incoming()
                    .take(3)
                    .map(|s| {
                        let mut b = [0u8; 1];
                        s.unwrap().read_exact(&mut b).unwrap();
                        b[0]
                    })
                    .collect();
                c.join().unwrap();
                got
            })
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(got, [0, 1, 2], "{b}");
    }
}

/// A std listener and a std stream, blocking, adopted by `From`: they
/// become non-blocking, and a read that waits on an adopted stream blocks
/// only its user thread: on a single core, the thread that sends the data
/// runs meanwhile. (The kernel-level receive timeout turns a regression,
/// a read blocking the core, into a failure instead of a hang.)
#[test]
fn adopted_std_sockets_block_only_their_thread() {
    for b in BACKENDS {
        let rt = one_core(b);
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = std_listener.local_addr().unwrap();
        assert!(!nonblocking(std_listener.as_fd()));
        let std_client = std::net::TcpStream::connect(addr).unwrap();
        std_client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        assert!(!nonblocking(std_client.as_fd()));
        let got = rt
            .block_on(move || {
                let l = TcpListener::from(std_listener);
                assert!(nonblocking(l.as_fd()));
                let (server, _) = l.accept().unwrap();
                let client = TcpStream::from(std_client);
                assert!(nonblocking(client.as_fd()));
                let sender = corewise::spawn(move || {
                    (&server).write_all(b"adopted").unwrap();
                    server
                })
                .unwrap();
                let mut buf = [0u8; 7];
                (&client).read_exact(&mut buf).unwrap();
                drop(sender.join().unwrap());
                buf
            })
            .unwrap();
        assert_eq!(&got, b"adopted", "{b}");
    }
}

#[test]
fn raw_and_owned_fds_round_trip() {
    for b in BACKENDS {
        let rt = rt(b);
        rt.block_on(|| {
            let (a, other) = UnixStream::pair().unwrap();
            let raw = a.into_raw_fd();
            // The fd outlived the socket it came from: still open, still
            // connected, and adopted again it carries data.
            // SAFETY: `raw` came from `into_raw_fd`: open, owned by nobody.
            let a = unsafe { UnixStream::from_raw_fd(raw) };
            assert_eq!(a.as_raw_fd(), raw);
            (&a).write_all(b"one").unwrap();
            let mut buf = [0u8; 3];
            (&other).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"one");

            // Out to std and back through `OwnedFd`.
            let std_a = std::os::unix::net::UnixStream::from(OwnedFd::from(a));
            assert_eq!(std_a.as_raw_fd(), raw);
            assert!(nonblocking(std_a.as_fd()), "given back as it was used");
            let a = UnixStream::from(OwnedFd::from(std_a));
            (&other).write_all(b"two").unwrap();
            (&a).read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"two");
            drop(a);
            // Dropping the last owner closes the connection.
            assert_eq!(other.read(&mut buf).unwrap(), 0);
        })
        .unwrap();
    }
}

/// The fd traits of std's socket types, on every socket type here.
fn fd_traits<S>(s: S) -> RawFd
where
    S: AsFd + AsRawFd + IntoRawFd + FromRawFd + From<OwnedFd> + Into<OwnedFd>,
{
    let raw = s.as_raw_fd();
    assert_eq!(s.as_fd().as_raw_fd(), raw);
    let back = s.into_raw_fd();
    assert_eq!(back, raw);
    // SAFETY: `back` came from `into_raw_fd`.
    let s = unsafe { S::from_raw_fd(back) };
    let owned: OwnedFd = s.into();
    assert_eq!(owned.as_raw_fd(), raw);
    let s = S::from(owned);
    s.as_raw_fd()
}

#[test]
fn every_socket_type_has_the_fd_traits() {
    let dir = std::env::temp_dir().join(format!("corewise-net-port-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("l.sock");
    let _ = std::fs::remove_file(&path);
    let tl = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tl.local_addr().unwrap();
    let ts = TcpStream::connect(addr).unwrap();
    let us = UdpSocket::bind("127.0.0.1:0").unwrap();
    let ul = UnixListener::bind(&path).unwrap();
    let (ua, _ub) = UnixStream::pair().unwrap();
    let ud = UnixDatagram::unbound().unwrap();
    let fds = [
        (tl.as_raw_fd(), fd_traits(tl)),
        (ts.as_raw_fd(), fd_traits(ts)),
        (us.as_raw_fd(), fd_traits(us)),
        (ul.as_raw_fd(), fd_traits(ul)),
        (ua.as_raw_fd(), fd_traits(ua)),
        (ud.as_raw_fd(), fd_traits(ud)),
    ];
    for (before, after) in fds {
        assert_eq!(before, after);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn try_clone_on_every_kind() {
    for b in BACKENDS {
        let rt = rt(b);
        rt.block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let l2 = l.try_clone().unwrap();
            assert_ne!(l2.as_raw_fd(), l.as_raw_fd());
            let addr = l.local_addr().unwrap();
            let c = corewise::spawn(move || TcpStream::connect(addr).unwrap()).unwrap();
            // The clone accepts from the same queue.
            let (s, _) = l2.accept().unwrap();
            let c = c.join().unwrap();
            (&c.try_clone().unwrap()).write_all(b"c").unwrap();
            let mut buf = [0u8; 1];
            (&s).read_exact(&mut buf).unwrap();
            let u = UdpSocket::bind("127.0.0.1:0").unwrap();
            let u2 = u.try_clone().unwrap();
            u2.send_to(b"u", u.local_addr().unwrap()).unwrap();
            assert_eq!(u.recv_from(&mut buf).unwrap().0, 1);
            let (d, e) = UnixDatagram::pair().unwrap();
            d.try_clone().unwrap().send(b"d").unwrap();
            assert_eq!(e.recv(&mut buf).unwrap(), 1);
        })
        .unwrap();
    }
}

/// A name whose lookup takes until another user thread of the same core
/// has run (as a slow DNS answer would hold `getaddrinfo`), and which
/// records whether it was looked up on a user thread.
struct SlowName {
    addr: SocketAddr,
    ran_meanwhile: mpsc::Receiver<()>,
    looked_up_on: mpsc::Sender<Option<corewise::ThreadId>>,
}

impl ToSocketAddrs for SlowName {
    type Iter = std::vec::IntoIter<SocketAddr>;
    fn to_socket_addrs(&self) -> std::io::Result<Self::Iter> {
        self.looked_up_on.send(corewise::current()).unwrap();
        // On the core, this waits in vain: the other thread cannot run.
        self.ran_meanwhile
            .recv_timeout(Duration::from_secs(10))
            .map_err(|_| std::io::Error::other("the core was stalled by the lookup"))?;
        Ok(vec![self.addr].into_iter())
    }
}

#[test]
fn connect_looks_names_up_off_the_core() {
    for b in BACKENDS {
        let rt = one_core(b);
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let (ran_tx, ran_rx) = mpsc::channel();
        let (on_tx, on_rx) = mpsc::channel();
        let name = SlowName {
            addr,
            ran_meanwhile: ran_rx,
            looked_up_on: on_tx,
        };
        let connected = rt
            .block_on(move || {
                let other = corewise::spawn(move || ran_tx.send(()).unwrap()).unwrap();
                let c = TcpStream::connect(name);
                other.join().unwrap();
                c.map(|c| c.peer_addr().unwrap())
            })
            .unwrap();
        assert_eq!(
            on_rx.recv().unwrap(),
            None,
            "{b}: looked up on a user thread"
        );
        assert_eq!(connected.unwrap(), addr, "{b}");
        drop(l);
    }
}

#[test]
fn string_and_pair_addresses_go_through_the_lookup() {
    for b in BACKENDS {
        let rt = rt(b);
        rt.block_on(|| {
            let l = TcpListener::bind(String::from("127.0.0.1:0")).unwrap();
            assert!(l.local_addr().unwrap().ip().is_loopback());
            let a = UdpSocket::bind(("127.0.0.1", 0)).unwrap();
            let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
            let port = peer.local_addr().unwrap().port();
            a.connect(format!("127.0.0.1:{port}")).unwrap();
            assert_eq!(a.peer_addr().unwrap().port(), port);
            let empty: &[SocketAddr] = &[];
            assert!(TcpStream::connect(empty).is_err());
        })
        .unwrap();
    }
}
