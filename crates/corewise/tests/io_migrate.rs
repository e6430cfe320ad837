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

/// A FIFO's open that waits for a writer while its core is released
/// continues on the core it moved to: the release cancels the open (on the
/// ring it runs on a kernel worker), the thread opens again there and
/// returns once the writer comes, with the writer's data; not an
/// interrupted-call error, and the release does not wait for the writer.
fn fifo_open_across_release(backend: IoBackend) {
    use std::os::unix::fs::OpenOptionsExt;
    let rt = corewise::Runtime::builder()
        .cpus([0, 1])
        .min_cores(2)
        .io_backend(backend)
        .build()
        .unwrap();
    wait_for("two cores", Duration::from_secs(10), || {
        rt.active_cores() == 2
    });
    let path = std::env::temp_dir().join(format!(
        "corewise-migrate-fifo-{}-{backend}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    let p = path.clone();
    let reader = Builder::new()
        .core(1)
        .spawn_in(&rt, move || {
            let start = corewise::current_core();
            let opened = corewise::fs::File::open(&p).map_err(|e| e.to_string());
            let end = corewise::current_core();
            let mut data = Vec::new();
            if let Ok(mut f) = opened.as_ref() {
                f.read_to_end(&mut data).unwrap();
            }
            (start, opened.map(drop), end, data)
        })
        .unwrap();
    // Let the reader's open start waiting, then take its core away.
    std::thread::sleep(Duration::from_millis(50));
    rt.set_max_cores(1);
    let released = {
        let start = Instant::now();
        loop {
            if rt.active_cores() == 1 && !rt.core_stats()[1].active {
                break true;
            }
            if start.elapsed() > GIVE_UP {
                break false;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    // The writer comes (non-blocking, so a reader that is gone fails the
    // test instead of hanging it).
    let until = Instant::now() + GIVE_UP;
    let wrote = loop {
        match std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(&path)
        {
            Ok(mut w) => break w.write_all(b"after the release").is_ok(),
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            Err(_) => break false,
        }
    };
    let (start, opened, end, data) = reader.join().unwrap();
    rt.set_max_cores(usize::MAX);
    let _ = std::fs::remove_file(&path);
    assert!(
        released,
        "{backend}: core 1 was not released while the open waited"
    );
    assert_eq!(opened, Ok(()), "{backend}: the open across the release");
    assert!(wrote, "{backend}: the writer found no reader");
    assert_eq!(data, b"after the release", "{backend}");
    assert_eq!(start, Some(1), "the reader started on core 1");
    assert_eq!(end, Some(0), "the reader moved to core 0");
}

#[test]
fn fifo_open_waiting_on_a_released_core_continues_on_epoll() {
    fifo_open_across_release(IoBackend::Epoll);
}

#[test]
fn fifo_open_waiting_on_a_released_core_continues_on_io_uring() {
    fifo_open_across_release(IoBackend::Uring);
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
