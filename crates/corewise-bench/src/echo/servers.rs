//! The four echo servers. Each runs in its own process (`corewise-bench
//! echo --serve KIND`), pinned to one CPU, so its system calls can be
//! counted for that process alone.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// Message size of the benchmark.
pub const MSG: usize = 64;

/// The corewise server (io_uring or epoll back end), on one core.
///
/// Up to [`THREADS`] connections: one user thread per connection, blocking
/// reads and writes. Beyond that (a core has 56 thread slots), each of the
/// [`THREADS`] user threads serves a group of connections through one
/// `corewise::io::Batch`: a read pending on every connection, and on each
/// completion the echo is written from the same batch.
pub fn corewise(
    cpu: usize,
    backend: corewise::IoBackend,
    port_out: impl FnOnce(u16),
    conns: usize,
) -> ! {
    let rt = corewise::Runtime::builder()
        .cpus([cpu])
        .io_backend(backend)
        .build()
        .expect("runtime");
    let l = corewise::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    port_out(l.local_addr().expect("addr").port());
    rt.block_on(move || {
        let mut accepted = Vec::with_capacity(conns);
        while accepted.len() < conns {
            let (s, _) = l.accept().expect("accept");
            s.set_nodelay(true).expect("nodelay");
            accepted.push(s);
        }
        let groups = conns.min(THREADS);
        let mut per: Vec<Vec<corewise::net::TcpStream>> = (0..groups).map(|_| Vec::new()).collect();
        for (i, s) in accepted.into_iter().enumerate() {
            per[i % groups].push(s);
        }
        let hs: Vec<_> = per
            .into_iter()
            .map(|group| {
                corewise::spawn(move || {
                    if group.len() == 1 {
                        serve_one(&group[0]);
                    } else {
                        serve_group(&group);
                    }
                })
                .expect("spawn")
            })
            .collect();
        for h in hs {
            let _ = h.join();
        }
    })
    .expect("server");
    std::process::exit(0)
}

/// User threads of the corewise server (the rest of the 56 slots stay free).
pub const THREADS: usize = 48;

fn serve_one(mut s: &corewise::net::TcpStream) {
    let mut buf = [0u8; MSG];
    loop {
        if s.read_exact(&mut buf).is_err() || s.write_all(&buf).is_err() {
            return;
        }
    }
}

fn serve_group(group: &[corewise::net::TcpStream]) {
    use corewise::io::{Batch, Completion};
    let mut batch = Batch::new();
    // Which connection each token belongs to.
    let mut owner: Vec<usize> = Vec::new();
    let set = |owner: &mut Vec<usize>, t: corewise::io::Token, c: usize| {
        if owner.len() <= t.0 {
            owner.resize(t.0 + 1, 0);
        }
        owner[t.0] = c;
    };
    for (c, s) in group.iter().enumerate() {
        let t = batch.read_into(s, vec![0u8; MSG]);
        set(&mut owner, t, c);
    }
    loop {
        let Ok(Some((t, done))) = batch.wait_any(None) else {
            return;
        };
        let c = owner[t.0];
        let s = &group[c];
        let t = match done {
            Completion::Read(Ok(n), mut buf) if n > 0 => {
                buf.truncate(n);
                batch.write(s, buf)
            }
            Completion::Written(Ok(_), mut buf) => {
                buf.resize(MSG, 0);
                batch.read_into(s, buf)
            }
            _ => continue, // closed: drop the connection
        };
        set(&mut owner, t, c);
    }
}

/// A tokio current-thread server on one CPU: a task per connection.
pub fn tokio(cpu: usize, port_out: impl FnOnce(u16)) -> ! {
    let _ = crate::affinity::pin_current(cpu);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .expect("tokio");
    rt.block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        port_out(l.local_addr().expect("addr").port());
        loop {
            let (mut s, _) = l.accept().await.expect("accept");
            s.set_nodelay(true).expect("nodelay");
            tokio::spawn(async move {
                let mut buf = [0u8; MSG];
                loop {
                    if s.read_exact(&mut buf).await.is_err() || s.write_all(&buf).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    std::process::exit(0)
}

/// A plain single-threaded epoll event loop (level-triggered), written for
/// this benchmark: on readable, read what is there and write it back.
pub fn epoll_loop(cpu: usize, port_out: impl FnOnce(u16)) -> ! {
    use rustix::event::epoll;
    let _ = crate::affinity::pin_current(cpu);
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.set_nonblocking(true).expect("nonblocking");
    port_out(l.local_addr().expect("addr").port());
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).expect("epoll");
    epoll::add(
        &ep,
        &l,
        epoll::EventData::new_u64(u64::MAX),
        epoll::EventFlags::IN,
    )
    .expect("add");
    let mut conns: std::collections::HashMap<RawFd, std::net::TcpStream> = Default::default();
    let mut events = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    loop {
        events.clear();
        let _ = epoll::wait(&ep, rustix::buffer::spare_capacity(&mut events), None);
        for ev in events.iter() {
            let ev = *ev;
            let key = ev.data.u64();
            if key == u64::MAX {
                while let Ok((s, _)) = l.accept() {
                    s.set_nonblocking(true).expect("nonblocking");
                    s.set_nodelay(true).expect("nodelay");
                    let fd = s.as_raw_fd();
                    epoll::add(
                        &ep,
                        &s,
                        epoll::EventData::new_u64(fd as u64),
                        epoll::EventFlags::IN,
                    )
                    .expect("add");
                    conns.insert(fd, s);
                }
                continue;
            }
            let fd = key as RawFd;
            let Some(s) = conns.get_mut(&fd) else {
                continue;
            };
            match s.read(&mut buf) {
                Ok(0) | Err(_) => {
                    conns.remove(&fd);
                }
                Ok(n) => {
                    // 64-byte messages into an empty socket buffer: the
                    // write completes at once.
                    if s.write_all(&buf[..n]).is_err() {
                        conns.remove(&fd);
                    }
                }
            }
        }
    }
}
