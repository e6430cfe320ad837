//! The four echo servers. Each runs in its own process (`corewise-bench
//! echo --serve KIND`), pinned to one CPU, so its system calls can be
//! counted for that process alone.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// Message size of the benchmark.
pub const MSG: usize = 64;

/// The corewise server (io_uring or epoll back end), on one core: one
/// user thread per connection, blocking reads and writes, as a user
/// writes it. (Until threads stopped being slots, a core held 56 threads,
/// and beyond 48 connections each thread served a group through
/// `corewise::io::Batch`.)
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
        let hs: Vec<_> = accepted
            .into_iter()
            .map(|s| corewise::spawn(move || serve_one(&s)).expect("spawn"))
            .collect();
        for h in hs {
            let _ = h.join();
        }
    })
    .expect("server");
    std::process::exit(0)
}

fn serve_one(mut s: &corewise::net::TcpStream) {
    let mut buf = [0u8; MSG];
    loop {
        if s.read_exact(&mut buf).is_err() || s.write_all(&buf).is_err() {
            return;
        }
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
