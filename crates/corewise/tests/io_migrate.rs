//! A stream read that waits while its core is released continues on the
//! core it moved to, for each back end.
//!
//! A read after a short read waits for readiness before it tries the call
//! (the epoll back end's `wait_first`). If the core is released during that
//! wait, the wait ends (evacuation) and the thread migrates; the retry, and
//! the wait after its `EAGAIN`, must use the new core. They used the old
//! one: the thread armed the released core's epoll set from another kernel
//! thread, nothing polled it any more, and the data that came next never
//! woke the thread (the client saw no reply; the server socket stayed in
//! CLOSE-WAIT with the thread's slot held). The stress test at the end
//! shows the same defect the way a user met it: short connections while
//! the policy releases and re-grants a core.

use corewise::io::IoBackend;
use corewise::net::{TcpListener, TcpStream};
use corewise::thread::Builder;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a reply may take before it counts as lost (a correct run
/// answers in microseconds; a lost wake-up never answers).
const GIVE_UP: Duration = Duration::from_secs(5);

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Answers each line read with `OK\n` until end of stream; returns the
/// number of lines and the core it ended on.
fn answer_lines(s: &TcpStream) -> (usize, Option<usize>) {
    let mut buf = [0u8; 256];
    let (mut line, mut lines) = (0usize, 0usize);
    loop {
        let n = match s.read(&mut buf[line..]) {
            Ok(0) | Err(_) => return (lines, corewise::current_core()),
            Ok(n) => n,
        };
        line += n;
        while let Some(p) = buf[..line].iter().position(|&b| b == b'\n') {
            if s.write(b"OK\n").is_err() {
                return (lines, corewise::current_core());
            }
            lines += 1;
            buf.copy_within(p + 1..line, 0);
            line -= p + 1;
        }
        if line == buf.len() {
            return (lines, corewise::current_core());
        }
    }
}

/// Sends `req` and reads `OK\n` back within [`GIVE_UP`].
fn round(c: &mut std::net::TcpStream, req: &[u8]) -> bool {
    if c.write_all(req).is_err() {
        return false;
    }
    let mut got = [0u8; 3];
    c.read_exact(&mut got).is_ok() && &got == b"OK\n"
}

fn read_across_release(backend: IoBackend) {
    let rt = corewise::Runtime::builder()
        .cpus([0, 1])
        .min_cores(2)
        .io_backend(backend)
        .build()
        .unwrap();
    wait_for("two cores", Duration::from_secs(10), || {
        rt.active_cores() == 2
    });
    let listener = rt
        .block_on(|| TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Builder::new()
        .core(1)
        .spawn_in(&rt, move || {
            let (s, _) = listener.accept().unwrap();
            let start = corewise::current_core();
            let (lines, end) = answer_lines(&s);
            (start, lines, end)
        })
        .unwrap();
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(GIVE_UP)).unwrap();
    // A short read: the server's next read waits for readiness first.
    assert!(round(&mut c, b"one\n"), "first reply");
    // Let the server reach that wait, then take its core away.
    std::thread::sleep(Duration::from_millis(20));
    rt.set_max_cores(1);
    wait_for("core 1 released", Duration::from_secs(10), || {
        rt.active_cores() == 1 && !rt.core_stats()[1].active && rt.core_stats()[1].threads == 0
    });
    // The thread now runs on core 0 and must see what comes next.
    let second = round(&mut c, b"two\n");
    drop(c);
    rt.set_max_cores(usize::MAX);
    assert!(
        second,
        "{backend}: no reply after the reader's core was released (lost wake-up)"
    );
    let (start, lines, end) = server.join().unwrap();
    assert_eq!(start, Some(1), "the server thread started on core 1");
    assert_eq!(lines, 2);
    assert_eq!(end, Some(0), "the server thread moved to core 0");
}

#[test]
fn read_waiting_on_a_released_core_continues_on_epoll() {
    read_across_release(IoBackend::Epoll);
}

#[test]
fn read_waiting_on_a_released_core_continues_on_io_uring() {
    read_across_release(IoBackend::Uring);
}

/// Runs `cycles` short connections (connect, two requests, close) from
/// `clients` OS threads against a thread-per-connection server on the
/// epoll back end; each client now and then pauses, so that the policy
/// releases and re-grants the second core. Returns how many connections
/// did not get both replies.
fn short_connections(clients: usize, cycles: usize, pause: Duration) -> usize {
    let rt = corewise::Runtime::builder()
        .cpus([0, 1])
        .io_backend(IoBackend::Epoll)
        .build()
        .unwrap();
    let listener = rt
        .block_on(|| TcpListener::bind("127.0.0.1:0"))
        .unwrap()
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acceptor = {
        let stop = stop.clone();
        rt.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok((s, _)) = listener.accept() else {
                    continue;
                };
                let _ = Builder::new().wait_for_slot(true).spawn_detached(move || {
                    answer_lines(&s);
                });
            }
        })
        .unwrap()
    };
    let next = Arc::new(AtomicUsize::new(0));
    let lost = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let (next, lost) = (next.clone(), lost.clone());
            std::thread::spawn(move || loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= cycles {
                    return;
                }
                if n % 1200 == 0 {
                    std::thread::sleep(pause);
                }
                let ok = std::net::TcpStream::connect(addr).is_ok_and(|mut c| {
                    c.set_read_timeout(Some(GIVE_UP)).is_ok()
                        && round(&mut c, b"set k 0 0 1\r\n")
                        && round(&mut c, b"get k\r\n")
                });
                if !ok {
                    lost.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    // Wake the acceptor with one more connection.
    drop(std::net::TcpStream::connect(addr));
    acceptor.join().unwrap();
    lost.load(Ordering::Relaxed)
}

/// The defect as first reported (about 2 in 100 000 connections lost);
/// long, so run by hand, in release mode:
/// `timeout 120 cargo test --release -p corewise --test io_migrate -- --ignored --nocapture`.
/// Without the fix it lost 2 to 6 of the 200 000 connections in each of 6
/// runs on a 2-core machine (about 15 s a run); a failing run then hangs
/// in the runtime's shutdown, which waits for the stuck threads (hence the
/// `timeout`).
#[test]
#[ignore]
fn every_short_connection_gets_its_replies() {
    let lost = short_connections(4, 200_000, Duration::from_millis(20));
    assert_eq!(lost, 0, "connections without their reply");
}
