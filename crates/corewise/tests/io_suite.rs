//! The I/O suite, run once per back end (io_uring and epoll): real sockets
//! on 127.0.0.1, real files in a temporary directory. Where io_uring is
//! missing or forbidden the `uring` half prints why and passes.

use corewise::io::{Batch, Completion, IoBackend};
use corewise::net::{TcpListener, TcpStream, UdpSocket, UnixDatagram, UnixListener, UnixStream};
use corewise::Runtime;
use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::time::Duration;

fn rt(b: IoBackend) -> Runtime {
    let rt = Runtime::builder().io_backend(b).build().unwrap();
    assert_eq!(rt.io_backend(), b);
    rt
}

/// A fresh path in the temporary directory, removed on drop.
struct TempPath(PathBuf);

impl TempPath {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("corewise-io-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Self(p)
    }
}

impl Drop for TempPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn pair() -> (TcpStream, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let c = corewise::spawn(move || TcpStream::connect(addr).unwrap()).unwrap();
    let (s, peer) = l.accept().unwrap();
    let c = c.join().unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    assert_eq!(s.peer_addr().unwrap(), c.local_addr().unwrap());
    assert_eq!(c.peer_addr().unwrap(), addr);
    (s, c)
}

fn tcp_echo_and_methods(b: IoBackend) {
    rt(b)
        .block_on(move || {
            assert_eq!(corewise::io::backend(), Some(b));
            let (mut s, mut c) = pair();
            c.set_nodelay(true).unwrap();
            assert!(c.nodelay().unwrap());
            let echo = corewise::spawn(move || {
                let mut buf = [0u8; 100];
                let mut total = 0;
                loop {
                    let n = s.read(&mut buf).unwrap();
                    if n == 0 {
                        break total;
                    }
                    total += n;
                    s.write_all(&buf[..n]).unwrap();
                }
            })
            .unwrap();
            let msg: Vec<u8> = (0..10_000u32).map(|i| i as u8).collect();
            let reader = c.try_clone().unwrap();
            let rd = corewise::spawn(move || {
                let mut got = vec![0u8; 10_000];
                (&reader).read_exact(&mut got).unwrap();
                got
            })
            .unwrap();
            (&c).write_all(&msg).unwrap();
            assert_eq!(rd.join().unwrap(), msg);
            // Vectored both ways.
            let n = c
                .write_vectored(&[IoSlice::new(b"ab"), IoSlice::new(b"cd")])
                .unwrap();
            assert_eq!(n, 4);
            let (mut x, mut y) = ([0u8; 1], [0u8; 3]);
            let mut got = 0;
            while got < 4 {
                let mut bufs = [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)];
                got += c.read_vectored(&mut bufs).unwrap();
                if got < 4 {
                    // Partial: read the rest plainly to keep the test simple.
                    let mut rest = vec![0u8; 4 - got];
                    c.read_exact(&mut rest).unwrap();
                    got = 4;
                }
            }
            assert_eq!(x[0], b'a');
            c.shutdown(Shutdown::Write).unwrap();
            assert_eq!(echo.join().unwrap(), 10_004);
            let mut rest = Vec::new();
            c.read_to_end(&mut rest).unwrap();
            assert!(rest.len() <= 3);
        })
        .unwrap();
}

fn peek_and_timeouts_settings(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let (s, mut c) = pair();
            assert!(s.set_read_timeout(Some(Duration::ZERO)).is_err());
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
            assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_secs(5)));
            assert_eq!(s.write_timeout().unwrap(), Some(Duration::from_secs(5)));
            c.write_all(b"xyz").unwrap();
            let mut b3 = [0u8; 3];
            let n = s.peek(&mut b3).unwrap();
            assert!(n >= 1 && b3[0] == b'x');
            (&s).read_exact(&mut b3).unwrap();
            assert_eq!(&b3, b"xyz");
            assert!(s.take_error().unwrap().is_none());
        })
        .unwrap();
}

fn peer_closes_mid_read(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let (mut s, mut c) = pair();
            let h = corewise::spawn(move || {
                let mut buf = [0u8; 10];
                let e = s.read_exact(&mut buf).unwrap_err();
                (e.kind(), s.read(&mut buf).unwrap())
            })
            .unwrap();
            c.write_all(b"half").unwrap();
            corewise::sleep(Duration::from_millis(5));
            drop(c);
            assert_eq!(h.join().unwrap(), (ErrorKind::UnexpectedEof, 0));
        })
        .unwrap();
}

fn read_times_out_then_works(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let (mut s, mut c) = pair();
            s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let mut buf = [0u8; 4];
            let e = s.read(&mut buf).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::TimedOut);
            // The buffer was not written and the stream still works.
            assert_eq!(buf, [0; 4]);
            c.write_all(b"late").unwrap();
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"late");
            // Accept times out too.
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.set_timeout(Some(Duration::from_millis(10))).unwrap();
            assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::TimedOut);
        })
        .unwrap();
}

/// After a short read (the socket was empty then) the next read waits for
/// readiness before trying: data that arrived meanwhile is found at once,
/// data that arrives later wakes it, the timeout still fires, and so does
/// end of stream.
fn reads_after_a_short_read(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let (s, mut c) = pair();
            let mut big = [0u8; 64];
            c.write_all(b"one").unwrap();
            assert_eq!(s.read(&mut big).unwrap(), 3, "a short read");
            // Already there when the next read starts.
            c.write_all(b"two").unwrap();
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(s.read(&mut big).unwrap(), 3);
            assert_eq!(&big[..3], b"two");
            // Arrives while the reader waits.
            let writer = corewise::spawn(move || {
                corewise::sleep(Duration::from_millis(5));
                c.write_all(b"three").unwrap();
                c
            })
            .unwrap();
            assert_eq!(s.read(&mut big).unwrap(), 5);
            assert_eq!(&big[..5], b"three");
            let c = writer.join().unwrap();
            // Nothing comes: the timeout fires.
            s.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
            assert_eq!(s.read(&mut big).unwrap_err().kind(), ErrorKind::TimedOut);
            s.set_read_timeout(None).unwrap();
            // A full read leaves no hint; the next read is an ordinary one.
            let mut four = [0u8; 4];
            (&c).write_all(b"fullrest").unwrap();
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(s.read(&mut four).unwrap(), 4);
            assert_eq!(s.read(&mut four).unwrap(), 4);
            assert_eq!(&four, b"rest");
            drop(c);
            assert_eq!(s.read(&mut big).unwrap(), 0, "end of stream");
        })
        .unwrap();
}

fn an_edge_while_nobody_waits(b: IoBackend) {
    // One core: its epoll set is polled only between user threads, so the
    // data below arrives (and is reported) while the reader is asleep, not
    // waiting for it; its next read, which after a short read waits for
    // readiness first, must still see it. A timeout turns a lost edge into
    // a failure instead of a hang.
    let rt = Runtime::builder().cpus([0]).io_backend(b).build().unwrap();
    rt.block_on(|| {
        let (s, c) = pair();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let reader = corewise::spawn(move || {
            let mut big = [0u8; 64];
            // Waits (the fd is registered), then reads short.
            let n = s.read(&mut big).unwrap();
            assert_eq!(&big[..n], b"one");
            corewise::sleep(Duration::from_millis(30));
            let n = s.read(&mut big).expect("the edge that came while asleep");
            assert_eq!(&big[..n], b"two");
        })
        .unwrap();
        corewise::sleep(Duration::from_millis(5));
        (&c).write_all(b"one").unwrap();
        corewise::sleep(Duration::from_millis(10));
        (&c).write_all(b"two").unwrap();
        reader.join().unwrap();
    })
    .unwrap();
}

/// Data and the peer's close reported in one readiness event: the reader
/// reads the data in two reads, the second short, and the next read must
/// still see end of stream. One core, and the writer runs on it, so both
/// arrive before the core polls again: one edge carries both. The epoll
/// back end used to give that edge wholly to the woken read, and the read
/// after the short one, which waits for readiness first, waited for an
/// edge that never came (a `read_to_end` of a short reply hung).
fn end_of_stream_in_the_same_edge_as_data(b: IoBackend) {
    let rt = Runtime::builder().cpus([0]).io_backend(b).build().unwrap();
    rt.block_on(|| {
        for close in ["drop", "shutdown"] {
            let (s, c) = pair();
            // A lost end of stream fails the test instead of hanging it.
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let writer = corewise::spawn(move || {
                corewise::sleep(Duration::from_millis(20));
                (&c).write_all(&[7u8; 100]).unwrap();
                if close == "shutdown" {
                    c.shutdown(Shutdown::Write).unwrap();
                    Some(c)
                } else {
                    drop(c);
                    None
                }
            })
            .unwrap();
            let mut buf = [0u8; 64];
            let got: Vec<usize> = (0..3).map(|_| s.read(&mut buf).expect(close)).collect();
            assert_eq!(got, [64, 36, 0], "{close}");
            let _peer = writer.join().unwrap();
            // A reply read whole at once, as `read_to_end` does.
            let (s, c) = pair();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let writer = corewise::spawn(move || {
                corewise::sleep(Duration::from_millis(20));
                (&c).write_all(b"HTTP/1.0 200 OK\r\n\r\nbody").unwrap();
            })
            .unwrap();
            let mut all = Vec::new();
            (&s).read_to_end(&mut all).expect(close);
            assert_eq!(all, b"HTTP/1.0 200 OK\r\n\r\nbody");
            writer.join().unwrap();
        }
    })
    .unwrap();
}

fn a_reused_fd_number_is_registered_afresh(b: IoBackend) {
    // Closing a socket takes it out of the epoll set; a new socket that gets
    // the same number must be registered again, or its reads would wait
    // forever (here: fail on the timeout).
    let rt = Runtime::builder().cpus([0]).io_backend(b).build().unwrap();
    rt.block_on(|| {
        let mut seen = std::collections::HashSet::new();
        let mut reused = 0;
        for i in 0..20u8 {
            let (s, c) = pair();
            if !seen.insert(s.as_raw_fd()) {
                reused += 1;
            }
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let reader = corewise::spawn(move || {
                let mut one = [0u8; 1];
                let n = s.read(&mut one).expect("a read on a reused fd number");
                (n, one[0])
            })
            .unwrap();
            corewise::sleep(Duration::from_millis(1));
            (&c).write_all(&[i]).unwrap();
            assert_eq!(reader.join().unwrap(), (1, i));
        }
        assert!(reused > 0, "fd numbers were never reused: {seen:?}");
    })
    .unwrap();
}

fn an_error_edge_is_used_once(b: IoBackend) {
    // A connected UDP socket whose peer port is closed: each datagram sent
    // comes back as an ICMP error, an EPOLLERR edge, and one recv reports
    // ECONNREFUSED. After that the socket is empty again: a recv must wait
    // (and time out), not retry forever on the old edge. The reader is on
    // core 1 and the checker on core 0, so a reader stuck in a loop fails
    // the test instead of hanging it.
    let rt = Runtime::builder()
        .cpus([0, 1])
        .min_cores(2)
        .io_backend(b)
        .build()
        .unwrap();
    if rt.cores() < 2 {
        return;
    }
    let ok = rt
        .block_on(|| {
            let a = std::sync::Arc::new(UdpSocket::bind("127.0.0.1:0").unwrap());
            let gone = UdpSocket::bind("127.0.0.1:0").unwrap();
            let dead = gone.local_addr().unwrap();
            drop(gone);
            a.connect(dead).unwrap();
            a.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (a2, d2) = (a.clone(), done.clone());
            corewise::thread::Builder::new()
                .core(1)
                .spawn_detached(move || {
                    let mut buf = [0u8; 8];
                    // The error arrives while the reader waits.
                    let sender = {
                        let a3 = a2.clone();
                        corewise::thread::Builder::new()
                            .core(1)
                            .spawn(move || {
                                corewise::sleep(Duration::from_millis(5));
                                a3.send(b"x").unwrap();
                            })
                            .unwrap()
                    };
                    let e = a2.recv(&mut buf).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                    sender.join().unwrap();
                    let e = a2.recv(&mut buf).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
                    // The error arrives while nobody waits (the reader
                    // sleeps); it is reported by the next recv directly.
                    a2.send(b"y").unwrap();
                    corewise::sleep(Duration::from_millis(5));
                    let e = a2.recv(&mut buf).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::ConnectionRefused, "{e}");
                    let e = a2.recv(&mut buf).unwrap_err();
                    assert_eq!(e.kind(), ErrorKind::TimedOut, "{e}");
                    d2.store(true, std::sync::atomic::Ordering::Release);
                })
                .unwrap();
            let t = std::time::Instant::now();
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                if t.elapsed() > Duration::from_secs(10) {
                    return false;
                }
                corewise::sleep(Duration::from_millis(1));
            }
            true
        })
        .unwrap();
    if !ok {
        // The reader's core is stuck: leave it, and fail.
        std::mem::forget(rt);
        panic!("a recv kept retrying on an error edge it had already used");
    }
}

fn cancel_from_another_thread(b: IoBackend) {
    let rt = rt(b);
    rt.block_on(|| {
        let (s, _c) = pair();
        let canceller = s.canceller();
        let h = corewise::spawn(move || {
            let mut buf = [0u8; 8];
            let r = s.read(&mut buf);
            (r.map_err(|e| corewise::io::is_cancelled(&e)), buf)
        })
        .unwrap();
        corewise::sleep(Duration::from_millis(10));
        assert!(!canceller.is_cancelled());
        canceller.cancel();
        let (r, buf) = h.join().unwrap();
        assert_eq!(r, Err(true));
        assert_eq!(buf, [0; 8]);
        // A shutdown from another thread wakes a blocked reader with EOF.
        let (s2, _c2) = pair();
        let s2 = std::sync::Arc::new(s2);
        let s3 = s2.clone();
        let h = corewise::spawn(move || s3.read(&mut [0u8; 8]).unwrap()).unwrap();
        corewise::sleep(Duration::from_millis(10));
        s2.shutdown(Shutdown::Read).unwrap();
        assert_eq!(h.join().unwrap(), 0);
    })
    .unwrap();
    // Cancel from a plain OS thread, of an accept on a user thread.
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let c = l.canceller();
    let h = rt.spawn(move || l.accept().map(|_| ())).unwrap();
    std::thread::sleep(Duration::from_millis(10));
    c.cancel();
    assert!(corewise::io::is_cancelled(&h.join().unwrap().unwrap_err()));
}

/// `readable` waits without reading: a thousand threads on one core each
/// wait on their own connection and then read exactly what was sent (a
/// lost wake-up hangs the test); it honours the read timeout, the
/// canceller and end of stream, and a read after it does not wait again;
/// a listener is readable with a connection to accept, a datagram socket
/// with a datagram. `writable` waits for room in a full send buffer.
fn readable_and_writable(b: IoBackend) {
    const N: usize = 1000;
    let rt = Runtime::builder()
        .io_backend(b)
        .max_cores(1)
        .build()
        .unwrap();
    rt.block_on(|| {
        let mut clients = Vec::new();
        let mut waiters = Vec::new();
        for i in 0..N {
            let (s, c) = pair();
            clients.push(c);
            waiters.push(
                corewise::spawn(move || {
                    s.readable().unwrap();
                    let mut buf = [0u8; 8];
                    let n = s.read(&mut buf).unwrap();
                    assert_eq!(&buf[..n], format!("{i}").as_bytes());
                })
                .unwrap(),
            );
        }
        corewise::sleep(Duration::from_millis(20));
        for (i, c) in clients.iter_mut().enumerate().rev() {
            c.write_all(format!("{i}").as_bytes()).unwrap();
        }
        for w in waiters {
            w.join().unwrap();
        }

        let (s, mut c) = pair();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(s.readable().unwrap_err().kind(), ErrorKind::TimedOut);
        // A short read, then data: readable returns, and so does the read.
        c.write_all(b"a").unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read(&mut buf).unwrap(), 1);
        c.write_all(b"bc").unwrap();
        s.readable().unwrap();
        s.readable().unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], b"bc");
        // End of stream is readable.
        c.shutdown(Shutdown::Write).unwrap();
        s.readable().unwrap();
        assert_eq!(s.read(&mut buf).unwrap(), 0);

        // Cancelled from another thread while it waits.
        let (s, _c2) = pair();
        let canceller = s.canceller();
        let h = corewise::spawn(move || s.readable().map_err(|e| corewise::io::is_cancelled(&e)))
            .unwrap();
        corewise::sleep(Duration::from_millis(10));
        canceller.cancel();
        assert_eq!(h.join().unwrap(), Err(true));

        // A listener is readable once a connection waits to be accepted,
        // a datagram socket once a datagram has arrived.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let l = std::sync::Arc::new(l);
        let waiter = {
            let l = l.clone();
            corewise::spawn(move || l.readable().map(|()| l.accept().map(|_| ())))
        }
        .unwrap();
        corewise::sleep(Duration::from_millis(10));
        let _c3 = TcpStream::connect(addr).unwrap();
        waiter.join().unwrap().unwrap().unwrap();
        let u = UdpSocket::bind("127.0.0.1:0").unwrap();
        u.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        assert_eq!(u.readable().unwrap_err().kind(), ErrorKind::TimedOut);
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.send_to(b"d", u.local_addr().unwrap()).unwrap();
        u.readable().unwrap();
        assert_eq!(u.recv(&mut [0u8; 4]).unwrap(), 1);

        // Writable: fill the send buffer, then wait for room.
        let (mut s, c) = pair();
        s.set_write_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        s.writable().unwrap();
        let chunk = vec![7u8; 1 << 16];
        let mut sent = 0usize;
        loop {
            match s.write(&chunk) {
                Ok(n) => sent += n,
                Err(e) if e.kind() == ErrorKind::TimedOut => break,
                Err(e) => panic!("write: {e}"),
            }
        }
        assert_eq!(s.writable().unwrap_err().kind(), ErrorKind::TimedOut);
        let drain = corewise::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            let mut got = 0usize;
            while got < sent {
                got += c.read(&mut buf).unwrap();
            }
            got
        })
        .unwrap();
        s.set_write_timeout(None).unwrap();
        s.writable().unwrap();
        s.write_all(b"more").unwrap();
        assert!(drain.join().unwrap() >= sent);
    })
    .unwrap();
}

fn udp(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let bsock = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (aa, ba) = (a.local_addr().unwrap(), bsock.local_addr().unwrap());
            assert_eq!(a.send_to(b"one", ba).unwrap(), 3);
            let mut buf = [0u8; 16];
            let (n, from) = bsock.recv_from(&mut buf).unwrap();
            assert_eq!((&buf[..n], from), (&b"one"[..], aa));
            a.connect(ba).unwrap();
            bsock.connect(aa).unwrap();
            assert_eq!(a.peer_addr().unwrap(), ba);
            a.send(b"two").unwrap();
            assert_eq!(bsock.recv(&mut buf).unwrap(), 3);
            bsock
                .set_read_timeout(Some(Duration::from_millis(10)))
                .unwrap();
            assert_eq!(
                bsock.recv(&mut buf).unwrap_err().kind(),
                ErrorKind::TimedOut
            );
            a.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
            let c = bsock.canceller();
            c.cancel();
            assert!(corewise::io::is_cancelled(
                &bsock.recv(&mut buf).unwrap_err()
            ));
        })
        .unwrap();
}

/// `peek` and `peek_from` leave the datagram queued: a reader blocked in
/// `peek_from` is woken by a datagram sent later, and the `recv_from`
/// after it gets the same datagram; a short buffer cuts the peeked copy
/// only; the socket options read back what was set.
fn udp_peek_and_options(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let r = UdpSocket::bind("127.0.0.1:0").unwrap();
            let (aa, ra) = (a.local_addr().unwrap(), r.local_addr().unwrap());
            // Nothing peeked or received waits forever if a peek consumed.
            r.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let sender = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
                s.send_to(b"later", ra).unwrap();
                s.local_addr().unwrap()
            });
            let mut buf = [0u8; 16];
            let (n, from) = r.peek_from(&mut buf).unwrap();
            let sent_from = sender.join().unwrap();
            assert_eq!((&buf[..n], from), (&b"later"[..], sent_from));
            let mut again = [0u8; 16];
            assert_eq!(r.recv_from(&mut again).unwrap(), (5, sent_from));
            assert_eq!(&again[..5], b"later");

            a.send_to(b"abcdef", ra).unwrap();
            let mut short = [0u8; 3];
            assert_eq!(r.peek_from(&mut short).unwrap(), (3, aa));
            assert_eq!(&short, b"abc");
            r.connect(aa).unwrap();
            assert_eq!(r.peek(&mut buf).unwrap(), 6);
            assert_eq!(r.recv(&mut buf).unwrap(), 6);
            assert_eq!(&buf[..6], b"abcdef");
            r.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
            assert_eq!(r.peek(&mut buf).unwrap_err().kind(), ErrorKind::TimedOut);

            r.set_ttl(3).unwrap();
            assert_eq!(r.ttl().unwrap(), 3);
            r.set_broadcast(true).unwrap();
            assert!(r.broadcast().unwrap());
            r.set_multicast_loop_v4(false).unwrap();
            assert!(!r.multicast_loop_v4().unwrap());
            r.set_multicast_ttl_v4(2).unwrap();
            assert_eq!(r.multicast_ttl_v4().unwrap(), 2);
        })
        .unwrap();
}

/// Unix datagrams on one core: 200 records sent with `send_to` to a bound
/// socket whose queue fills (so the sender waits for room) and read with
/// `recv_from` by another user thread of the same core (a kernel thread
/// blocked in either call would stop the other for good). Then a receive times out, a blocked one is cancelled from
/// an OS thread, and a connected pair goes through send and recv.
fn unix_datagrams(b: IoBackend) {
    let path = TempPath::new("dgram");
    let p = path.0.clone();
    let rt = Runtime::builder()
        .cpus([0])
        .max_cores(1)
        .io_backend(b)
        .build()
        .unwrap();
    rt.block_on(move || {
        let server = UnixDatagram::bind(&p).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let client = UnixDatagram::unbound().unwrap();
        client
            .set_write_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let sender = corewise::spawn(move || {
            let record = [7u8; 1024];
            for _ in 0..200 {
                assert_eq!(client.send_to(&record, &p).unwrap(), 1024);
            }
        })
        .unwrap();
        let mut buf = [0u8; 2048];
        for _ in 0..200 {
            let (n, from) = server.recv_from(&mut buf).unwrap();
            assert_eq!((n, from.is_unnamed()), (1024, true));
        }
        sender.join().unwrap();

        server
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        assert_eq!(
            server.recv_from(&mut buf).unwrap_err().kind(),
            ErrorKind::TimedOut
        );
        server.set_read_timeout(None).unwrap();
        let c = server.canceller();
        let canceller = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            c.cancel();
        });
        assert!(corewise::io::is_cancelled(
            &server.recv_from(&mut buf).unwrap_err()
        ));
        canceller.join().unwrap();

        let (x, y) = UnixDatagram::pair().unwrap();
        x.send(b"pair").unwrap();
        assert_eq!(y.recv(&mut buf).unwrap(), 4);
        assert_eq!(&buf[..4], b"pair");
    })
    .unwrap();
    drop(path);
}

fn unix(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let path = TempPath::new("sock");
            let l = UnixListener::bind(&path.0).unwrap();
            assert_eq!(
                l.local_addr().unwrap().as_pathname(),
                Some(path.0.as_path())
            );
            let p = path.0.clone();
            let h = corewise::spawn(move || {
                let mut c = UnixStream::connect(&p).unwrap();
                c.write_all(b"unix!").unwrap();
                let mut b = [0u8; 2];
                c.read_exact(&mut b).unwrap();
                b
            })
            .unwrap();
            let (mut s, _) = l.accept().unwrap();
            assert!(s.peer_addr().is_ok() && s.local_addr().is_ok());
            let mut b5 = [0u8; 5];
            s.read_exact(&mut b5).unwrap();
            assert_eq!(&b5, b"unix!");
            s.write_all(b"ok").unwrap();
            assert_eq!(&h.join().unwrap(), b"ok");
            let (x, y) = UnixStream::pair().unwrap();
            y.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
            assert_eq!(
                y.read(&mut [0u8; 1]).unwrap_err().kind(),
                ErrorKind::TimedOut
            );
            x.shutdown(Shutdown::Both).unwrap();
            assert_eq!(y.read(&mut [0u8; 1]).unwrap(), 0);
            l.set_timeout(Some(Duration::from_millis(5))).unwrap();
            assert_eq!(l.accept().unwrap_err().kind(), ErrorKind::TimedOut);
        })
        .unwrap();
}

fn files(b: IoBackend) {
    rt(b)
        .block_on(|| {
            use corewise::fs::File;
            use std::io::{Seek, SeekFrom};
            let p = TempPath::new("file");
            assert_eq!(File::open(&p.0).unwrap_err().kind(), ErrorKind::NotFound);
            let mut f = File::create(&p.0).unwrap();
            f.write_all(b"hello ").unwrap();
            f.write_vectored(&[IoSlice::new(b"wor"), IoSlice::new(b"ld")])
                .unwrap();
            f.write_at(b"W", 6).unwrap();
            f.sync_all().unwrap();
            f.sync_data().unwrap();
            assert_eq!(f.metadata().unwrap().len(), 11);
            drop(f);
            assert_eq!(std::fs::read(&p.0).unwrap(), b"hello World");
            let mut f = File::open(&p.0).unwrap();
            let mut five = [0u8; 5];
            f.read_exact(&mut five).unwrap();
            assert_eq!(&five, b"hello");
            let (mut a, mut c) = ([0u8; 1], [0u8; 5]);
            let n = f
                .read_vectored(&mut [IoSliceMut::new(&mut a), IoSliceMut::new(&mut c)])
                .unwrap();
            assert_eq!((n, a[0], &c), (6, b' ', b"World"));
            assert_eq!(f.read(&mut a).unwrap(), 0);
            let mut w = [0u8; 5];
            f.read_exact_at(&mut w, 6).unwrap();
            assert_eq!(&w, b"World");
            f.seek(SeekFrom::Start(0)).unwrap();
            let mut all = String::new();
            (&f).read_to_string(&mut all).unwrap();
            assert_eq!(all, "hello World");
            assert!(f.write(b"x").is_err(), "read-only file");
            let g = File::options().append(true).open(&p.0).unwrap();
            g.write(b"!").unwrap();
            g.set_len(12).unwrap();
            assert_eq!(std::fs::read(&p.0).unwrap(), b"hello World!");
            assert_eq!(
                File::options()
                    .write(true)
                    .create_new(true)
                    .open(&p.0)
                    .unwrap_err()
                    .kind(),
                ErrorKind::AlreadyExists
            );
            assert_eq!(
                File::options().open(&p.0).unwrap_err().kind(),
                ErrorKind::InvalidInput
            );
        })
        .unwrap();
}

/// `OpenOptions` checks its flags as std does: every combination of the
/// six flags, on an existing file and on a missing path, gives the same
/// result (success or error kind) as `std::fs::OpenOptions`, and leaves
/// the file or path as std does. In particular truncating or creating
/// without write access, append with truncate, and no access at all are
/// `InvalidInput`, and the file keeps its data.
fn open_options_checked_as_std(b: IoBackend) {
    rt(b)
        .block_on(|| {
            // What an open did: its result, and the file afterwards.
            fn outcome(r: std::io::Result<()>, p: &std::path::Path) -> String {
                let r = r.map_err(|e| e.kind());
                format!("{r:?} -> {:?}", std::fs::read(p).ok())
            }
            let p = TempPath::new("flags");
            for bits in 0u32..64 {
                let on = |i: u32| bits & (1 << i) != 0;
                let std_opts = {
                    let mut o = std::fs::OpenOptions::new();
                    o.read(on(0)).write(on(1)).append(on(2));
                    o.truncate(on(3)).create(on(4)).create_new(on(5));
                    o
                };
                let mut cw_opts = corewise::fs::File::options();
                cw_opts.read(on(0)).write(on(1)).append(on(2));
                cw_opts.truncate(on(3)).create(on(4)).create_new(on(5));
                for existing in [true, false] {
                    let reset = || {
                        let _ = std::fs::remove_file(&p.0);
                        if existing {
                            std::fs::write(&p.0, b"data").unwrap();
                        }
                    };
                    reset();
                    let want = outcome(std_opts.open(&p.0).map(drop), &p.0);
                    reset();
                    let got = outcome(cw_opts.open(&p.0).map(drop), &p.0);
                    assert_eq!(got, want, "flags {bits:06b}, existing: {existing}");
                }
            }
            // The cases std refuses, spelled out.
            std::fs::write(&p.0, b"data").unwrap();
            let o = || corewise::fs::File::options();
            for (what, r) in [
                ("no access", o().open(&p.0)),
                ("read+truncate", o().read(true).truncate(true).open(&p.0)),
                (
                    "append+truncate",
                    o().append(true).truncate(true).open(&p.0),
                ),
                ("read+create", o().read(true).create(true).open(&p.0)),
                (
                    "read+create_new",
                    o().read(true).create_new(true).open(&p.0),
                ),
            ] {
                assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidInput, "{what}");
            }
            assert_eq!(std::fs::read(&p.0).unwrap(), b"data");
            // Custom flags add (O_NOFOLLOW refuses a symlink, as std's)
            // but cannot widen the access mode: a read-only open stays one.
            let link = TempPath::new("flags-link");
            std::os::unix::fs::symlink(&p.0, &link.0).unwrap();
            let nofollow = |o: &mut corewise::fs::OpenOptions| {
                o.read(true)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&link.0)
                    .map(drop)
            };
            let mut std_o = std::fs::OpenOptions::new();
            std::os::unix::fs::OpenOptionsExt::custom_flags(&mut std_o, libc::O_NOFOLLOW);
            let want = std_o.read(true).open(&link.0).map(drop).unwrap_err();
            let got = nofollow(&mut o()).unwrap_err();
            assert_eq!(got.raw_os_error(), want.raw_os_error());
            assert_eq!(got.raw_os_error(), Some(libc::ELOOP));
            let ro = o()
                .read(true)
                .custom_flags(libc::O_RDWR)
                .open(&p.0)
                .unwrap();
            assert_eq!(
                ro.write(b"no").unwrap_err().raw_os_error(),
                Some(libc::EBADF)
            );
            assert_eq!(std::fs::read(&p.0).unwrap(), b"data");
        })
        .unwrap();
}

fn file_larger_than_any_buffer(b: IoBackend) {
    rt(b)
        .block_on(|| {
            use corewise::fs::File;
            let p = TempPath::new("big");
            let size = 6 * 1024 * 1024 + 123;
            let data: Vec<u8> = (0..size).map(|i| (i * 7 % 251) as u8).collect();
            let f = File::create(&p.0).unwrap();
            f.write_all_at(&data, 0).unwrap();
            drop(f);
            // Read it through a 64 KiB buffer, many reads at the file position.
            let f = File::open(&p.0).unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            let mut got = Vec::with_capacity(size);
            loop {
                let n = f.read(&mut buf).unwrap();
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            assert!(got == data, "file contents differ");
            // And in one read_exact_at into a buffer the size of the file.
            let mut whole = vec![0u8; size];
            f.read_exact_at(&mut whole, 0).unwrap();
            assert!(whole == data);
        })
        .unwrap();
}

/// Timeouts at the extremes, as std: `connect_timeout` with zero is
/// `InvalidInput` and makes no connection; a timeout too large for the
/// clock (`Duration::MAX`) is no deadline, so a connect with it ends
/// normally when the listener answers (no panic).
fn zero_and_huge_timeouts(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let e = TcpStream::connect_timeout(&addr, Duration::ZERO).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            l.set_timeout(Some(Duration::from_millis(10))).unwrap();
            assert_eq!(
                l.accept().unwrap_err().kind(),
                ErrorKind::TimedOut,
                "a zero timeout must not connect"
            );
            l.set_timeout(None).unwrap();

            let mut c = TcpStream::connect_timeout(&addr, Duration::MAX).unwrap();
            let (mut s, peer) = l.accept().unwrap();
            assert_eq!(peer, c.local_addr().unwrap());

            c.write_all(b"ping").unwrap();
            let mut buf = [0u8; 4];
            s.read_exact(&mut buf).unwrap();
            assert_eq!(&buf, b"ping");
        })
        .unwrap();
}

/// A batch read that waits for data which a user thread on the same core
/// writes a little later: `wait_any` returns it (or times out).
fn batch_read_of_data_that_comes_later(b: IoBackend) {
    for (cores, os_writer) in [(1, false), (2, false), (2, true), (1, true)] {
        batch_read_later(b, cores, os_writer);
    }
}

fn batch_read_later(b: IoBackend, cores: usize, os_writer: bool) {
    let rt = Runtime::builder()
        .cpus(0..cores)
        .min_cores(cores)
        .io_backend(b)
        .build()
        .unwrap();
    rt.block_on(move || {
        let (s, c) = pair();
        let write = move || {
            std::thread::sleep(Duration::from_millis(10));
            (&c).write_all(b"later").unwrap();
            c
        };
        let writer: Box<dyn FnOnce() -> TcpStream> = if os_writer {
            let h = std::thread::spawn(write);
            Box::new(move || h.join().unwrap())
        } else {
            let h = corewise::spawn(write).unwrap();
            Box::new(move || h.join().unwrap())
        };
        let mut batch = Batch::new();
        let t = batch.read(&s, 16);
        let (tok, comp) = batch
            .wait_any(Some(Duration::from_secs(5)))
            .expect("the read completes before the timeout")
            .unwrap();
        assert_eq!(tok, t);
        let Completion::Read(Ok(n), buf) = comp else {
            panic!("read failed")
        };
        assert_eq!(&buf[..n], b"later");
        drop(writer());
    })
    .unwrap();
}

fn batch_accepts_and_writes(b: IoBackend) {
    rt(b)
        .block_on(|| {
            let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
            let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
            let (a1, a2) = (l1.local_addr().unwrap(), l2.local_addr().unwrap());
            let mut batch = Batch::new();
            let t1 = batch.accept(&l1);
            let t2 = batch.accept(&l2);
            assert_eq!(batch.len(), 2);
            assert_eq!(
                batch
                    .wait_any(Some(Duration::from_millis(5)))
                    .unwrap_err()
                    .kind(),
                ErrorKind::TimedOut
            );
            let c2 = TcpStream::connect(a2).unwrap();
            let (tok, comp) = batch.wait_any(None).unwrap().unwrap();
            assert_eq!(tok, t2);
            let Completion::Accepted(Ok((s2, peer))) = comp else {
                panic!("accept failed")
            };
            assert_eq!(peer, c2.local_addr().unwrap());
            let c1 = TcpStream::connect(a1).unwrap();
            let all = batch.wait_all();
            assert_eq!(all.len(), 1);
            assert_eq!(all[0].0, t1);
            let Completion::Accepted(Ok((s1, _))) = &all[0].1 else {
                panic!("accept failed")
            };
            assert!(batch.is_empty());
            assert!(batch.wait_any(None).unwrap().is_none());
            // Writes to many, reads from many.
            let mut w = Batch::new();
            w.write(s1, b"to-1".to_vec());
            w.write(&s2, b"to-2".to_vec());
            for (_, c) in w.wait_all() {
                let Completion::Written(Ok(4), buf) = c else {
                    panic!("write failed")
                };
                assert_eq!(buf.len(), 4);
            }
            let mut r = Batch::new();
            let r1 = r.read(&c1, 16);
            let r2 = r.read(&c2, 16);
            for (t, c) in r.wait_all() {
                let Completion::Read(Ok(n), buf) = c else {
                    panic!("read failed")
                };
                let want: &[u8] = if t == r1 {
                    b"to-1"
                } else {
                    assert_eq!(t, r2);
                    b"to-2"
                };
                assert_eq!(&buf[..n], want);
            }
            // Dropping a batch with pending operations cancels them.
            let mut pending = Batch::new();
            pending.read(&c1, 16);
            pending.accept(&l1);
            drop(pending);
            // c1 still works afterwards.
            (&*s1).write_all(b"after").unwrap();
            let mut five = [0u8; 5];
            (&c1).read_exact(&mut five).unwrap();
            assert_eq!(&five, b"after");
        })
        .unwrap();
}

fn blocking_under_load(b: IoBackend) {
    // One core: if `blocking` blocked the core, the releasing thread could
    // never run and the jobs would fail their receive timeout.
    let rt = Runtime::builder().cpus([0]).io_backend(b).build().unwrap();
    rt.block_on(|| {
        let (tx, rx) = std::sync::mpsc::channel::<u32>();
        let rx = std::sync::Arc::new(std::sync::Mutex::new(rx));
        let waiters: Vec<_> = (0..40u32)
            .map(|i| {
                let rx = rx.clone();
                corewise::spawn(move || {
                    corewise::blocking(move || {
                        let v = rx.lock().unwrap().recv_timeout(Duration::from_secs(20));
                        v.map(|v| v + i)
                    })
                })
                .unwrap()
            })
            .collect();
        let sender = corewise::spawn(move || {
            for _ in 0..40 {
                tx.send(1000).unwrap();
                corewise::yield_now();
            }
        })
        .unwrap();
        sender.join().unwrap();
        let mut sum = 0;
        for h in waiters {
            sum += h
                .join()
                .unwrap()
                .expect("the core kept running other threads");
        }
        assert_eq!(sum, 40 * 1000 + (0..40).sum::<u32>());
        assert!(corewise::blocking::threads() <= corewise::blocking::MAX_THREADS);
        // Many short jobs from many threads, results intact; panics propagate.
        let hs: Vec<_> = (0..50u64)
            .map(|i| {
                corewise::spawn(move || {
                    (0..20)
                        .map(|j| corewise::blocking(move || i * j))
                        .sum::<u64>()
                })
                .unwrap()
            })
            .collect();
        let total: u64 = hs.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(total, (0..50u64).sum::<u64>() * (0..20u64).sum::<u64>());
        let p = corewise::spawn(|| corewise::blocking(|| -> u32 { panic!("in pool") })).unwrap();
        assert!(p.join().is_err());
    })
    .unwrap();
}

fn sleeping_core_wakes_for_io(b: IoBackend) {
    // The core sleeps in the ring/epoll wait; a completion, a cross-core
    // signal and a timer must each wake it.
    let rt = Runtime::builder()
        .cpus([0])
        .idle_spin(Duration::from_micros(1))
        .io_backend(b)
        .build()
        .unwrap();
    rt.block_on(|| {
        let (s, c) = pair();
        let h = corewise::spawn(move || {
            let mut b = [0u8; 3];
            (&s).read_exact(&mut b).unwrap();
            b
        })
        .unwrap();
        // From an OS thread while the core sleeps.
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            (&c).write_all(b"zzz").unwrap();
            c
        });
        assert_eq!(&h.join().unwrap(), b"zzz");
        drop(t.join().unwrap());
    })
    .unwrap();
    // A signal from an OS thread to a thread on a core that sleeps in I/O.
    let h = rt.spawn(corewise::block).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    corewise::signal(h.thread());
    h.join().unwrap();
}

fn os_thread_fallback(_b: IoBackend) {
    // No runtime involved: the same types make plain system calls.
    assert_eq!(corewise::io::backend(), None);
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.write_all(b"os").unwrap();
        s
    });
    let mut c = TcpStream::connect(addr).unwrap();
    let mut b = [0u8; 2];
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"os");
    c.set_read_timeout(Some(Duration::from_millis(10))).unwrap();
    assert_eq!(c.read(&mut b).unwrap_err().kind(), ErrorKind::TimedOut);
    c.set_read_timeout(None).unwrap();
    let cancel = c.canceller();
    let reader = std::thread::spawn(move || {
        c.read(&mut [0u8; 1])
            .map_err(|e| corewise::io::is_cancelled(&e))
    });
    std::thread::sleep(Duration::from_millis(20));
    cancel.cancel();
    assert_eq!(reader.join().unwrap(), Err(true));
    drop(t.join().unwrap());
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut batch = Batch::new();
    batch.accept(&l);
    let _c = TcpStream::connect(addr).unwrap();
    assert!(matches!(batch.wait_all()[0].1, Completion::Accepted(Ok(_))));
    let p = TempPath::new("os");
    let f = corewise::fs::File::create(&p.0).unwrap();
    f.write_all_at(b"plain", 0).unwrap();
    let mut five = [0u8; 5];
    f.read_exact_at(&mut five, 0).unwrap_err(); // write-only
    drop(f);
    corewise::fs::File::open(&p.0)
        .unwrap()
        .read_exact_at(&mut five, 0)
        .unwrap();
    assert_eq!(&five, b"plain");
    assert_eq!(corewise::blocking(|| 5), 5);
}

/// A FIFO opened as a `corewise::fs::File` waits for data as a socket
/// does, on both back ends: a read with a timeout times out (under epoll it
/// used to block on a syscall thread until the writer closed), a cancel
/// wakes a blocked read, data written meanwhile is read, and the end of the
/// stream is seen once the writer is gone. On an OS thread it blocks as std.
fn fifo_files(b: IoBackend) {
    let path = TempPath::new("fifo");
    let c = std::ffi::CString::new(path.0.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let (to_writer, writes) = std::sync::mpsc::channel::<&'static [u8]>();
    let p = path.0.clone();
    // The writer holds the FIFO open until told to close (an empty slice),
    // so a read waits rather than seeing the end of the stream. If the
    // first read does not time out, the writer writes "late" after 2 s, so
    // the test fails instead of waiting forever.
    let writer = std::thread::spawn(move || {
        let mut w = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let first = match writes.recv_timeout(Duration::from_secs(2)) {
            Ok(chunk) => chunk,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => b"late",
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => return,
        };
        w.write_all(first).unwrap();
        for chunk in writes {
            if chunk.is_empty() {
                return;
            }
            w.write_all(chunk).unwrap();
        }
    });
    let rt = rt(b);
    let p = path.0.clone();
    let tx = to_writer.clone();
    let got = rt
        .block_on(move || {
            let f = corewise::fs::File::open(&p).unwrap();
            f.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let mut buf = [0u8; 8];
            let timed_out = f.read(&mut buf).map_err(|e| e.kind());
            tx.send(b"data").unwrap();
            f.set_read_timeout(None).unwrap();
            let n = f.read(&mut buf).unwrap();
            let data = buf[..n].to_vec();
            // A read blocked with no timeout is woken by the canceller (if
            // it is not within 2 s, the writer unblocks it with "stuck").
            let cancel = f.canceller();
            let returned = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let done = returned.clone();
            let canceller = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                cancel.cancel();
                let until = std::time::Instant::now() + Duration::from_secs(2);
                while !done.load(std::sync::atomic::Ordering::Acquire) {
                    if std::time::Instant::now() > until {
                        tx.send(b"stuck").unwrap();
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
            });
            let cancelled = f.read(&mut buf);
            returned.store(true, std::sync::atomic::Ordering::Release);
            canceller.join().unwrap();
            let cancelled = cancelled.expect_err("a cancelled read returned data");
            (timed_out, data, corewise::io::is_cancelled(&cancelled))
        })
        .unwrap();
    assert_eq!(
        got.0,
        Err(ErrorKind::TimedOut),
        "{b:?}: a read past its timeout"
    );
    assert_eq!(got.1, b"data", "{b:?}");
    assert!(got.2, "{b:?}: the cancelled read");
    // A new File of the FIFO, then the writer goes: the end of the stream.
    let p = path.0.clone();
    let tx = to_writer.clone();
    let eof = rt
        .block_on(move || {
            let f = corewise::fs::File::open(&p).unwrap();
            tx.send(b"").unwrap();
            f.read(&mut [0u8; 4]).unwrap()
        })
        .unwrap();
    writer.join().unwrap();
    assert_eq!(eof, 0, "{b:?}: end of stream");
}

/// An adopted std file of a FIFO is waited on like one opened here: its
/// read timeout holds (a blocking fd would wait for data instead; a
/// writer 2 s later ends that wait, so a wrong adoption fails rather than
/// hangs), and its data arrives. A clone shares the position and has its
/// own canceller.
fn adopted_and_cloned_files(b: IoBackend) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let path = TempPath::new("adopt-fifo");
    mkfifo(&path);
    // Read-write: the open returns at once, and the FIFO never ends.
    let std_file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path.0)
        .unwrap();
    let writer = std_file.try_clone().unwrap();
    let late = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        (&writer).write_all(b"late").unwrap();
        writer
    });
    let f: corewise::fs::File = std_file.into();
    let (timed_out, writer) = rt(b)
        .block_on(move || {
            f.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            let r = f.read(&mut [0u8; 8]).map_err(|e| e.kind());
            let writer = late.join().unwrap();
            if r.is_ok() {
                // The read waited for the late data: nothing more to check.
                return (r, writer);
            }
            (&writer).write_all(b"now").unwrap();
            let mut got = [0u8; 16];
            let mut n = 0;
            while n < 7 {
                n += f.read(&mut got[n..]).unwrap();
            }
            assert_eq!(&got[..n], b"latenow");
            (r, writer)
        })
        .unwrap();
    drop(writer);
    assert_eq!(timed_out, Err(ErrorKind::TimedOut), "{b:?}");

    let file = TempPath::new("clone");
    rt(b)
        .block_on(move || {
            let mut f = corewise::fs::File::options()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&file.0)
                .unwrap();
            let mut g = f.try_clone().unwrap();
            f.write_all(b"both").unwrap();
            assert_eq!(g.stream_position().unwrap(), 4);
            (&g).seek(SeekFrom::Start(1)).unwrap();
            f.canceller().cancel();
            assert!(corewise::io::is_cancelled(
                &f.read(&mut [0u8; 1]).unwrap_err()
            ));
            let mut rest = String::new();
            g.read_to_string(&mut rest).unwrap();
            assert_eq!(rest, "oth");
        })
        .unwrap();
}

/// Makes a FIFO at `path`.
fn mkfifo(path: &TempPath) {
    let c = std::ffi::CString::new(path.0.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Waits up to 2 s for `fd` to be ready for `events`; whether it was.
fn poll_2s(fd: &impl AsRawFd, events: i16) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    unsafe { libc::poll(&mut p, 1, 2000) > 0 }
}

/// A user thread that sleeps five times 5 ms on the runtime's core, then
/// says when it was done: finished before a blocking call returned, it ran
/// while the call waited.
fn ticker() -> corewise::JoinHandle<std::time::Instant> {
    corewise::spawn(|| {
        for _ in 0..5 {
            corewise::sleep(Duration::from_millis(5));
        }
        std::time::Instant::now()
    })
    .unwrap()
}

/// Opening a FIFO waits for the other end, as std's open does, but blocks
/// only the user thread: on a one-core runtime another user thread keeps
/// running meanwhile. A reader's open returns once a writer opened (its
/// data is then read whole, not an early end of stream); a writer's open
/// returns once a reader opened (not `ENXIO`). The peers here are OS
/// threads that open non-blocking and give up after 2 s, so a wrong open
/// fails the test instead of hanging it.
fn fifo_open_waits_for_peer(b: IoBackend) {
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Instant;
    const DELAY: Duration = Duration::from_millis(150);
    let rt = Runtime::builder()
        .io_backend(b)
        .max_cores(1)
        .build()
        .unwrap();
    assert_eq!(rt.io_backend(), b);

    // A reader first: the writer comes after DELAY.
    let path = TempPath::new("fifo-rd");
    mkfifo(&path);
    let p = path.0.clone();
    let writer = std::thread::spawn(move || {
        std::thread::sleep(DELAY);
        let until = Instant::now() + Duration::from_secs(2);
        loop {
            // Succeeds once a reader has the FIFO open (ENXIO before).
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&p)
            {
                Ok(mut w) => return w.write_all(b"from the writer").is_ok(),
                Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
                Err(_) => return false,
            }
        }
    });
    let p = path.0.clone();
    let (waited, ticked_during_open, data) = rt
        .block_on(move || {
            let start = Instant::now();
            let ticker = ticker();
            let mut f = corewise::fs::File::open(&p).unwrap();
            let opened = Instant::now();
            let ticked = ticker.join().unwrap();
            let mut data = Vec::new();
            f.read_to_end(&mut data).unwrap();
            (opened - start, ticked < opened, data)
        })
        .unwrap();
    let writer_found_reader = writer.join().unwrap();
    assert_eq!(
        data, b"from the writer",
        "{b:?}: a FIFO's reader reads what the writer wrote"
    );
    assert!(writer_found_reader, "{b:?}: the writer found no reader");
    assert!(
        waited >= DELAY - Duration::from_millis(20),
        "{b:?}: the reader's open returned after {waited:?}, before any writer"
    );
    assert!(ticked_during_open, "{b:?}: the open stalled the core");

    // A writer first: the reader comes after DELAY.
    let path = TempPath::new("fifo-wr");
    mkfifo(&path);
    let p = path.0.clone();
    let reader = std::thread::spawn(move || {
        std::thread::sleep(DELAY);
        let mut r = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&p)
            .unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 64];
        // Until the writer closes (POLLHUP after its data) or 2 s pass.
        while poll_2s(&r, libc::POLLIN) {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
        got
    });
    let p = path.0.clone();
    let (waited, ticked_during_open) = rt
        .block_on(move || {
            let start = Instant::now();
            let ticker = ticker();
            let opened = corewise::fs::File::options().write(true).open(&p);
            let at = Instant::now();
            let ticked = ticker.join().unwrap();
            let mut f = opened.expect("a FIFO's writer opens once a reader comes");
            f.write_all(b"from the corewise writer").unwrap();
            (at - start, ticked < at)
        })
        .unwrap();
    assert_eq!(reader.join().unwrap(), b"from the corewise writer", "{b:?}");
    assert!(
        waited >= DELAY - Duration::from_millis(20),
        "{b:?}: the writer's open returned after {waited:?}, before any reader"
    );
    assert!(ticked_during_open, "{b:?}: the open stalled the core");
}

/// A std socket adopted with `From` keeps the timeouts std set on it: the
/// getters report them and a read with nothing to read fails with
/// `TimedOut` after about that long, instead of waiting forever. Likewise
/// a datagram socket's receive, a Unix stream's read and a listener's
/// accept.
fn adopted_sockets_keep_timeouts(b: IoBackend) {
    use std::time::Instant;
    const T: Duration = Duration::from_millis(100);
    /// Runs `f` (a call expected to time out) and checks it did, after
    /// about `T`.
    fn times_out<R: std::fmt::Debug>(what: &str, f: impl FnOnce() -> std::io::Result<R>) {
        let start = Instant::now();
        let e = f().expect_err(what);
        let took = start.elapsed();
        assert_eq!(e.kind(), ErrorKind::TimedOut, "{what}");
        assert!(
            took >= T - Duration::from_millis(10) && took < T * 10,
            "{what}: timed out after {took:?}"
        );
    }
    rt(b)
        .block_on(|| {
            // TCP: a stream with a read and a write timeout.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (_server, _) = l.accept().unwrap();
            c.set_read_timeout(Some(T)).unwrap();
            c.set_write_timeout(Some(2 * T)).unwrap();
            let (rd, wr) = (c.read_timeout().unwrap(), c.write_timeout().unwrap());
            assert!(rd.is_some() && wr.is_some());
            let c: TcpStream = c.into();
            assert_eq!(c.read_timeout().unwrap(), rd);
            assert_eq!(c.write_timeout().unwrap(), wr);
            times_out("an adopted TCP stream's read", || c.read(&mut [0u8; 4]));
            // One without timeouts stays without.
            let plain: TcpStream = std::net::TcpStream::connect(l.local_addr().unwrap())
                .unwrap()
                .into();
            assert_eq!(plain.read_timeout().unwrap(), None);
            assert_eq!(plain.write_timeout().unwrap(), None);

            // A listener (std has no setter for it): its `SO_RCVTIMEO` is
            // the accept timeout.
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let tv = libc::timeval {
                tv_sec: 0,
                tv_usec: T.as_micros() as libc::suseconds_t,
            };
            // SAFETY: a valid socket and a timeval of the size passed.
            let r = unsafe {
                libc::setsockopt(
                    l.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVTIMEO,
                    (&tv as *const libc::timeval).cast(),
                    std::mem::size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0, "SO_RCVTIMEO");
            let l: TcpListener = l.into();
            assert!(l.read_timeout().unwrap().is_some());
            times_out("an adopted listener's accept", || l.accept());

            // UDP.
            let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            u.set_read_timeout(Some(T)).unwrap();
            let rd = u.read_timeout().unwrap();
            let u: UdpSocket = u.into();
            assert_eq!(u.read_timeout().unwrap(), rd);
            times_out("an adopted UDP socket's recv", || u.recv(&mut [0u8; 4]));

            // A Unix stream, through `From<OwnedFd>`.
            let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
            a.set_read_timeout(Some(T)).unwrap();
            let rd = a.read_timeout().unwrap();
            let a = UnixStream::from(std::os::fd::OwnedFd::from(a));
            assert_eq!(a.read_timeout().unwrap(), rd);
            times_out("an adopted Unix stream's read", || a.read(&mut [0u8; 4]));
        })
        .unwrap();
}

/// Whether io_uring works here: a runtime asked for it falls back to epoll
/// where the kernel has none or forbids it (`kernel.io_uring_disabled`, a
/// seccomp filter). The `uring` tests are skipped there, with a note,
/// instead of failing on the fallback they did not ask for.
fn uring_available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *AVAILABLE.get_or_init(|| {
        Runtime::builder()
            .io_backend(IoBackend::Uring)
            .build()
            .is_ok_and(|rt| rt.io_backend() == IoBackend::Uring)
    });
    if !ok {
        eprintln!("skipping: no io_uring here (a runtime asking for it fell back to epoll)");
    }
    ok
}

macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {
        mod uring {
            $(#[test] fn $name() {
                if super::uring_available() {
                    super::$name(corewise::io::IoBackend::Uring)
                }
            })*
        }
        mod epoll {
            $(#[test] fn $name() { super::$name(corewise::io::IoBackend::Epoll) })*
        }
    };
}

both_backends!(
    tcp_echo_and_methods,
    peek_and_timeouts_settings,
    peer_closes_mid_read,
    read_times_out_then_works,
    reads_after_a_short_read,
    an_edge_while_nobody_waits,
    end_of_stream_in_the_same_edge_as_data,
    a_reused_fd_number_is_registered_afresh,
    an_error_edge_is_used_once,
    cancel_from_another_thread,
    readable_and_writable,
    udp,
    udp_peek_and_options,
    adopted_and_cloned_files,
    unix_datagrams,
    unix,
    files,
    open_options_checked_as_std,
    file_larger_than_any_buffer,
    zero_and_huge_timeouts,
    batch_accepts_and_writes,
    batch_read_of_data_that_comes_later,
    blocking_under_load,
    sleeping_core_wakes_for_io,
    os_thread_fallback,
    fifo_files,
    fifo_open_waits_for_peer,
    adopted_sockets_keep_timeouts,
);

/// On io_uring, a send that has no batch to join (nothing else queued in
/// the core's ring) is made at once: the sending thread does not switch out
/// to wait for its core's next pass. Each of 200 sends through the ring
/// costs the thread a switch out and a dispatch; made at once, none. (200
/// one-byte sends fit in a Unix socket's send buffer, which counts each
/// send's whole buffer: about 270 do.) A send that finds the buffer full
/// still waits in the ring, until the reader below drains it.
#[test]
fn a_lone_send_on_io_uring_is_made_at_once() {
    if !uring_available() {
        return;
    }
    let rt = Runtime::builder()
        .max_cores(1)
        .io_backend(IoBackend::Uring)
        .build()
        .unwrap();
    let dispatches = |rt: &Runtime| rt.core_stats().iter().map(|c| c.dispatches).sum::<u64>();
    let (a, b) = UnixStream::pair().unwrap();
    let before = dispatches(&rt);
    let sent = rt
        .block_on(move || {
            for i in 0..200u32 {
                assert_eq!(a.write(&[i as u8]).unwrap(), 1);
            }
            a
        })
        .unwrap();
    let runs = dispatches(&rt) - before;
    assert!(runs < 50, "200 sends took {runs} dispatches");
    // Every byte arrived, in order; then a send larger than the buffer
    // (it waits in the ring for room) while a reader drains it.
    let mut buf = vec![0u8; 200];
    (&b).read_exact(&mut buf).unwrap();
    assert!(buf.iter().enumerate().all(|(i, &x)| x == i as u8));
    let big = vec![7u8; 4 << 20];
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; 4 << 20];
        (&b).read_exact(&mut got).unwrap();
        got.iter().all(|&x| x == 7)
    });
    rt.block_on(move || (&sent).write_all(&big).unwrap())
        .unwrap();
    assert!(reader.join().unwrap());
}

/// SQPOLL (the FlexSC syscall core): the rings' submission pollers run on a
/// CPU outside the runtime's; sockets still carry bytes both ways, a read
/// that waits (the core idle in its ring) is woken by the peer's write, and
/// a timeout still fires.
#[test]
fn sqpoll_rings_carry_bytes() {
    let allowed: Vec<usize> = (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| rustix::thread::sched_getaffinity(None).is_ok_and(|s| s.is_set(c)))
        .collect();
    let [poller, .., core] = allowed[..] else {
        eprintln!("skipping: SQPOLL needs a CPU outside the runtime's");
        return;
    };
    let rt = Runtime::builder()
        .cpus([core])
        .io_backend(IoBackend::Uring)
        .sqpoll(Some(poller))
        .build()
        .unwrap();
    if rt.io_backend() != IoBackend::Uring {
        eprintln!("skipping: no io_uring here");
        return;
    }
    rt.block_on(|| {
        let (s, c) = pair();
        let echo = corewise::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..100 {
                (&s).read_exact(&mut buf).unwrap();
                (&s).write_all(&buf).unwrap();
            }
            s
        })
        .unwrap();
        let mut buf = [0u8; 64];
        for i in 0..100u8 {
            (&c).write_all(&[i; 64]).unwrap();
            (&c).read_exact(&mut buf).unwrap();
            assert_eq!(buf, [i; 64]);
            if i % 10 == 0 {
                // Let the core fall idle in its ring between messages.
                corewise::sleep(Duration::from_millis(2));
            }
        }
        // Kept open: the read below must time out, not see EOF.
        let _s = echo.join().unwrap();
        c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let e = c.read(&mut buf).unwrap_err();
        assert!(
            matches!(e.kind(), ErrorKind::TimedOut | ErrorKind::WouldBlock),
            "{e}"
        );
    })
    .unwrap();
}
