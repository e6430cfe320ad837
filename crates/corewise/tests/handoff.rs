//! Blocking handoff: a user thread that blocks in the kernel through std
//! (sleep, file reads, a std `Mutex`, a name lookup) does not stall the
//! other threads of its core; the core goes to a spare kernel thread and
//! the runtime returns to one kernel thread per core afterwards.
//!
//! Every runtime here has one core, so the ticker and the blocker share
//! it. Each test fails with `Builder::blocking_handoff(false)`: the ticker
//! then runs once per blocking call (or never), and the `Mutex` scenario
//! deadlocks.

use corewise::io::IoBackend;
use corewise::Runtime;
use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TICK: Duration = Duration::from_millis(10);

fn one_core() -> Runtime {
    Runtime::builder().cpus([0]).build().unwrap()
}

/// Runs `f` on a std thread and fails the test if it does not finish in
/// `limit` (a stalled runtime cannot be joined; its threads are left).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}: the core stalled"))
}

/// Runs `blocker` in one user thread and a ticker in another on the same
/// core until the blocker is done; returns (ticks seen, ticks expected).
fn ticker_beside(rt: &Runtime, blocker: impl FnOnce() + Send + 'static) -> (u32, u32) {
    rt.block_on(move || {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let ticker = corewise::spawn(move || {
            let start = Instant::now();
            let mut ticks = 0u32;
            while !d.load(Ordering::Acquire) {
                corewise::sleep(TICK);
                ticks += 1;
            }
            (ticks, start.elapsed())
        })
        .unwrap();
        // Let the ticker start first, so both share the core from here on.
        corewise::sleep(Duration::from_millis(5));
        let b = corewise::spawn(blocker).unwrap();
        b.join().unwrap();
        done.store(true, Ordering::Release);
        let (ticks, elapsed) = ticker.join().unwrap();
        // Each tick is a sleep of TICK plus the loop's own time.
        let expected = (elapsed.as_micros() / TICK.as_micros()) as u32;
        (ticks, expected)
    })
    .unwrap()
}

/// Half the expected ticks: without handoff the ticker runs once per
/// blocking call or never (a few ticks of 30 or more), while a loaded
/// machine (eight test binaries at once) delays some of its sleeps past
/// the next tick, which an 80 % bound counted as a failure.
fn assert_ticked(what: &str, (ticks, expected): (u32, u32)) {
    assert!(
        ticks * 2 >= expected,
        "{what}: the ticker ran {ticks} times of about {expected}"
    );
}

#[test]
fn ticker_ticks_beside_std_sleep() {
    within(Duration::from_secs(20), || {
        let rt = one_core();
        let r = ticker_beside(&rt, || std::thread::sleep(Duration::from_millis(300)));
        assert_ticked("std::thread::sleep(300 ms)", r);
        assert!(rt.stats().handoffs >= 1, "no handoff counted");
    });
}

#[test]
fn ticker_ticks_beside_file_reads() {
    within(Duration::from_secs(30), || {
        let dir = std::env::temp_dir().join(format!("corewise-handoff-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("data");
        std::fs::write(&file, vec![7u8; 8 << 20]).unwrap();
        let rt = one_core();
        let f = file.clone();
        let r = ticker_beside(&rt, move || {
            let mut total = 0usize;
            for _ in 0..1000 {
                total += std::fs::read(&f).unwrap().len();
            }
            assert_eq!(total, 1000 << 23);
        });
        let _ = std::fs::remove_dir_all(&dir);
        assert_ticked("1 000 std::fs::read calls of 8 MiB", r);
    });
}

#[test]
fn std_mutex_held_across_a_corewise_sleep_does_not_deadlock() {
    within(Duration::from_secs(20), || {
        let rt = one_core();
        rt.block_on(|| {
            let m = Arc::new(Mutex::new(0u32));
            let m1 = m.clone();
            let holder = corewise::spawn(move || {
                let mut g = m1.lock().unwrap();
                corewise::sleep(Duration::from_millis(50));
                *g += 1;
            })
            .unwrap();
            corewise::sleep(Duration::from_millis(5));
            let m2 = m.clone();
            // Blocks the core's kernel thread in a futex until the holder,
            // which runs on this same core, gets to run again.
            let waiter = corewise::spawn(move || *m2.lock().unwrap() += 1).unwrap();
            holder.join().unwrap();
            waiter.join().unwrap();
            assert_eq!(*m.lock().unwrap(), 2);
        })
        .unwrap();
    });
}

#[test]
fn kernel_threads_return_to_one_per_core() {
    within(Duration::from_secs(30), || {
        let rt = Runtime::builder().cpus([0]).build().unwrap();
        let baseline = rt.stats().kernel_threads;
        assert_eq!(baseline, 1);
        // Several blockers at once need several spares.
        rt.block_on(|| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    corewise::spawn(|| {
                        for _ in 0..5 {
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    })
                    .unwrap()
                })
                .collect();
            for h in hs {
                h.join().unwrap();
            }
        })
        .unwrap();
        let s = rt.stats();
        assert!(s.handoffs >= 1, "no handoff counted");
        let t = Instant::now();
        while rt.stats().kernel_threads > baseline {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{} kernel threads left 10 s after the blocking ended",
                rt.stats().kernel_threads
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // And the runtime still works on its one kernel thread.
        assert_eq!(rt.block_on(|| 6 * 7).unwrap(), 42);
    });
}

/// A read submitted on the core's ring (or registered in its epoll set)
/// before the core is handed over completes while the kernel thread that
/// submitted it is still blocked in `block` (400 ms); a cancel reaches it
/// the same way.
fn io_across_handoff(backend: IoBackend, block: fn()) {
    within(Duration::from_secs(20), move || {
        let rt = Runtime::builder()
            .cpus([0])
            .io_backend(backend)
            .build()
            .unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let writer = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            // Written while the blocker still sleeps (it sleeps 400 ms).
            std::thread::sleep(Duration::from_millis(100));
            s.write_all(b"ping").unwrap();
            let mut b = [0u8; 1];
            let _ = s.read(&mut b);
        });
        rt.block_on(move || {
            let stream = corewise::net::TcpStream::connect(addr).unwrap();
            let reader = corewise::spawn(move || {
                let mut buf = [0u8; 4];
                let n = stream.read(&mut buf).unwrap();
                assert_eq!(&buf[..n], b"ping");
                // A second read, cancelled by timeout while nothing comes.
                stream
                    .set_read_timeout(Some(Duration::from_millis(50)))
                    .unwrap();
                let e = stream.read(&mut buf).unwrap_err();
                assert!(matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ));
                Instant::now()
            })
            .unwrap();
            corewise::sleep(Duration::from_millis(20));
            let blocker = corewise::spawn(move || {
                block();
                Instant::now()
            })
            .unwrap();
            let read_done = reader.join().unwrap();
            let block_done = blocker.join().unwrap();
            assert!(
                read_done < block_done,
                "the read completed only after the blocking call returned"
            );
        })
        .unwrap();
        writer.join().unwrap();
    });
}

fn std_sleep() {
    std::thread::sleep(Duration::from_millis(400));
}

/// Computes for 400 ms without a system call (the core is handed over
/// after 10 ms of it).
fn compute() {
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(400) {
        std::hint::spin_loop();
    }
}

#[test]
fn io_across_handoff_uring() {
    io_across_handoff(IoBackend::Uring, std_sleep);
}

#[test]
fn io_across_handoff_epoll() {
    io_across_handoff(IoBackend::Epoll, std_sleep);
}

/// The ring runs the kernel's task work cooperatively (`COOP_TASKRUN`: no
/// interrupt of a submitter that runs user code): the read's completion
/// waits for the computing submitter's next entry into the kernel, at the
/// latest its next timer tick, not for the end of its computation.
#[test]
fn io_across_handoff_to_a_computing_thread_uring() {
    io_across_handoff(IoBackend::Uring, compute);
}

#[test]
fn io_across_handoff_to_a_computing_thread_epoll() {
    io_across_handoff(IoBackend::Epoll, compute);
}

/// Name lookups through std block in the resolver; this one waits for a
/// DNS server on 127.0.0.1:53 that never answers (a resolv.conf bind-mounted
/// in a private mount namespace by the parent test, so the host's resolver
/// settings are untouched). Run by `ticker_ticks_beside_a_dns_lookup`.
#[test]
#[ignore = "run inside a private mount namespace by ticker_ticks_beside_a_dns_lookup"]
fn dns_lookup_child() {
    if std::env::var_os("COREWISE_DNS_CHILD").is_none() {
        return;
    }
    // The silent server: it takes the queries and never answers.
    let server = std::net::UdpSocket::bind("127.0.0.1:53").unwrap();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while server.recv_from(&mut buf).is_ok() {}
    });
    let rt = one_core();
    let r = ticker_beside(&rt, || {
        use std::net::ToSocketAddrs;
        let t = Instant::now();
        let r = ("corewise-handoff-test.invalid", 80).to_socket_addrs();
        assert!(r.is_err(), "the silent server cannot resolve anything");
        assert!(
            t.elapsed() >= Duration::from_millis(300),
            "the lookup did not block ({:?}): the test needs a resolver that waits",
            t.elapsed()
        );
    });
    assert_ticked("a blocking DNS lookup", r);
    println!("dns child ok");
}

#[test]
fn ticker_ticks_beside_a_dns_lookup() {
    let root = rustix::process::geteuid().is_root();
    let unshare = std::path::Path::new("/usr/bin/unshare").exists();
    if !root || !unshare {
        eprintln!("skipped: needs root and unshare(1) for a private mount namespace");
        return;
    }
    let dir = std::env::temp_dir().join(format!("corewise-dns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("resolv.conf");
    std::fs::write(
        &conf,
        "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n",
    )
    .unwrap();
    let exe = std::env::current_exe().unwrap();
    let script = format!(
        "mount --bind '{}' /etc/resolv.conf && exec '{}' dns_lookup_child --exact --ignored --nocapture --test-threads 1",
        conf.display(),
        exe.display()
    );
    let out = std::process::Command::new("/usr/bin/unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("COREWISE_DNS_CHILD", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("dns child ok"),
        "child failed: {}\n{}\n{}",
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
}
