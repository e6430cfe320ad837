//! Moving bytes between sockets and the protocol, in two ways.
//!
//! `--mode conn` gives each connection a user thread that blocks in
//! `read` (the Fred/libfibre way): simple, and a blocked thread costs its
//! core nothing (it leaves its core's slot while it waits, and is placed
//! again, by load, when its socket is readable). A quiet connection (new,
//! or silent for over a second before its last request) waits in
//! `readable` instead and holds no buffer meanwhile (see
//! [`Connection::release_buffers`]). Connections are limited by
//! `-c`, as in memcached, and by the runtime's thread limit; a connection
//! over either is refused with memcached's "Too many open connections"
//! line.
//!
//! `--mode dispatch` is Arachne's memcached: one dispatch thread (its own
//! core when the runtime may use two or more) waits on every connection at
//! once through an epoll set, and for each connection that has input it
//! creates a short-lived user thread that reads what is there, runs the
//! requests, writes the replies and re-arms the connection. Idle
//! connections cost no thread, so the connection count is bounded only by
//! `-c` and file descriptors. The dispatch thread polls the epoll set
//! without blocking while work keeps arriving, yielding to the workers
//! between polls, and sleeps in `epoll_wait` on a corewise syscall thread
//! ([`corewise::blocking()`]) once it has been idle for a short while.
//!
//! Both modes share [`Connection`]: a read buffer that the decoder parses
//! in place, and an output buffer written once per batch of requests.
//! The output is a [`Reply`]: values of [`crate::reply::REF_MIN`] bytes or
//! more are not copied into it but referenced, and a send gathers the
//! reply's bytes and those values with one vectored write (`sendmsg`), as
//! memcached sends from its items: a large value is copied once, by the
//! kernel, instead of twice.
//!
//! Output is bounded per connection. A client can ask for far more reply
//! than it sends (a 10-byte `get` of a 1 MB value; memcached's "reply
//! amplification"), so replies are never accumulated for a whole batch:
//! once more than [`SPILL_AT`] bytes of reply wait (checked after every
//! request, and between the keys of a multi-key `get`), they are sent
//! before anything else is run or read. The send blocks only the
//! connection's user thread, and nothing more is read from a client that
//! does not read its replies, so its requests stay in the kernel's socket
//! buffer (and back up into the client) instead of in server memory:
//! a connection holds at most its read buffer plus one value plus
//! [`SPILL_AT`] of reply, in both modes and both protocols.
//!
//! Buffers follow the traffic, and large ones do not outlive it. The read
//! buffer starts at [`INITIAL_BUF`] (one page) and doubles when a read
//! fills it (a pipelining client, up to [`KEEP_BUF`]) or when one request
//! does not fit (a large value, up to the item size, or a long multi-get
//! line, up to [`GET_LINE_MAX`]); once everything in
//! it has been run, a buffer larger than [`KEEP_BUF`] goes back to
//! [`INITIAL_BUF`]. Likewise a reply buffer grown past [`KEEP_BUF`] goes
//! back to its first size after the send. Buffers up to [`KEEP_BUF`] stay,
//! so a client of values of a few KiB does not pay a reallocation per
//! request. Before, a connection kept the largest buffers it ever needed:
//! one `set` and one `get` of a 900 KiB value left about 1 MiB resident per
//! connection for its lifetime (memcached, whose buffers belong to its
//! worker threads: 17 KiB), and every connection started with 16 KiB.

use crate::config::{Mode, Protocol};
use crate::exec::{execute_conn, write_error, ConnInfo, Flow, Shared, SPILL_AT};
use crate::exec_binary::{execute_binary, too_large, write_malformed};
use crate::listen::{Listener, Stream};
use crate::protocol::binary::{BinDecoded, BinaryDecoder, REQUEST_MAGIC};
use crate::protocol::{Decoded, Decoder, Limits, GET_LINE_MAX, MAX_LINE};
use crate::reply::{Reply, Sink};
use corewise::net::TcpListener;
use corewise::sync::SpinLock;
use corewise::ThreadClass;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The reply to a connection over the limit.
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, server::{self, TOO_MANY}};
/// use std::io::{Read, Write};
/// use std::os::fd::AsRawFd;
/// use std::sync::Arc;
/// let listener = server::bind("127.0.0.1", 0)?;
/// let (addr, fd) = (listener.local_addr()?, listener.as_raw_fd());
/// // A server that takes one connection at a time.
/// let shared = Arc::new(Shared::new(Config { max_conns: 1, ..Config::default() }));
/// let rt = corewise::Runtime::builder().max_cores(1).build()?;
/// let srv = std::thread::spawn(move || server::serve(&rt, listener, shared));
/// let mut first = std::net::TcpStream::connect(addr)?;
/// first.write_all(b"version\r\n")?;
/// first.read(&mut [0; 64])?; // served: it holds the only place
/// let mut second = std::net::TcpStream::connect(addr)?;
/// let mut refused = Vec::new();
/// second.read_to_end(&mut refused)?;
/// assert_eq!(refused, TOO_MANY);
/// drop(first);
/// // SAFETY: shuts the listening socket down; the server then stops accepting.
/// unsafe { libc::shutdown(fd, libc::SHUT_RD) };
/// assert!(srv.join().unwrap().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const TOO_MANY: &[u8] = b"ERROR Too many open connections\r\n";

/// A connection's first read buffer, and its reply buffer's: one page.
///
/// ```
/// use corewise_kv::server::{INITIAL_BUF, KEEP_BUF};
/// // A connection starts with a page of buffer, and keeps up to KEEP_BUF.
/// assert_eq!(INITIAL_BUF, 4096);
/// assert!(INITIAL_BUF < KEEP_BUF);
/// ```
pub const INITIAL_BUF: usize = 4 * 1024;
/// The largest buffer a connection keeps between requests (see the module
/// docs): reads that fill the read buffer grow it up to this size, and a
/// larger one, grown for one large request or reply, is given back after
/// it.
///
/// ```
/// use corewise_kv::protocol::MAX_LINE;
/// use corewise_kv::server::KEEP_BUF;
/// // The longest command line fits in a buffer that is kept.
/// assert!(KEEP_BUF >= MAX_LINE);
/// ```
pub const KEEP_BUF: usize = 64 * 1024;

/// One client connection: its socket, buffers and decoder.
///
/// ```
/// # // Serves one client with a Connection: `server` runs on a user thread of
/// # // a one-core runtime with the accepted connection, `client` on a std
/// # // thread with its end; returns what each returned.
/// # fn with_conn<T: Send + 'static>(
/// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
/// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
/// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
/// # ) -> std::io::Result<(T, Vec<u8>)> {
/// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
/// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
/// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
/// #     let addr = listener.local_addr()?;
/// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
/// #     let h = rt
/// #         .spawn(move || -> std::io::Result<T> {
/// #             let (stream, _) = listener.accept()?;
/// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
/// #             server(&mut conn)
/// #         })
/// #         .map_err(|e| other(&e))?;
/// #     let t = h.join().map_err(|e| other(&e))??;
/// #     Ok((t, c.join().unwrap()?))
/// # }
/// use corewise_kv::{config::Config, exec::Shared, server::Connection};
/// use std::io::{Read, Write};
/// use std::sync::Arc;
/// let shared = Arc::new(Shared::new(Config::default()));
/// // `with_conn` accepts one client on a one-core runtime and hands the
/// // server side the connection.
/// let (_, reply) = with_conn(
///     shared,
///     |mut client| {
///         client.write_all(b"set k 0 0 1\r\nv\r\nget k\r\n")?;
///         client.shutdown(std::net::Shutdown::Write)?;
///         let mut reply = Vec::new();
///         client.read_to_end(&mut reply)?;
///         Ok(reply)
///     },
///     |conn: &mut Connection| {
///         // What a connection's user thread does: read, run, reply, until EOF.
///         while conn.fill_blocking()? > 0 {
///             conn.process();
///             conn.flush()?;
///         }
///         Ok(())
///     },
/// )?;
/// assert_eq!(reply, b"STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Connection {
    stream: Stream,
    rbuf: Vec<u8>,
    pos: usize,
    filled: usize,
    max_buf: usize,
    wbuf: Reply,
    scratch: Vec<u8>,
    decoder: Decoder,
    /// The binary decoder, when the connection's first byte chose the
    /// binary protocol (memcached's negotiation; `negotiated` says whether
    /// that byte has been seen).
    binary: Option<BinaryDecoder>,
    negotiated: bool,
    /// Its entry in `stats conns`.
    info: Arc<ConnInfo>,
    shared: Arc<Shared>,
    /// New, or its last batch of requests came after more than a second
    /// without one: it then waits for the next without buffers.
    quiet: bool,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.shared.conn_table.close(self.stream.as_raw_fd());
        self.shared
            .conns
            .curr_connections
            .fetch_sub(1, Ordering::Relaxed);
    }
}

impl Connection {
    /// Wraps an accepted stream (and counts it as open).
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::sync::{atomic::Ordering::Relaxed, Arc};
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let s = Arc::clone(&shared);
    /// // `with_conn` calls Connection::new on the accepted stream.
    /// let (open, _) = with_conn(shared.clone(), |_| Ok(Vec::new()), move |_| Ok(s.conns.curr_connections.load(Relaxed)))?;
    /// assert_eq!(open, 1);
    /// assert_eq!(shared.conns.curr_connections.load(Relaxed), 0); // dropped: closed
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(stream: impl Into<Stream>, shared: Arc<Shared>) -> Self {
        let stream = stream.into();
        stream.set_nodelay();
        let item_max = shared.config.item_max;
        let open = shared
            .conns
            .curr_connections
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        shared
            .conns
            .peak_connections
            .fetch_max(open, Ordering::Relaxed);
        let peer = stream.peer();
        let info = shared
            .conn_table
            .open(stream.as_raw_fd(), peer, shared.store.clock().now());
        Self {
            stream,
            // No buffers until the first input (see `release_buffers`).
            rbuf: Vec::new(),
            pos: 0,
            filled: 0,
            // A whole value plus its command line always fits, and so
            // does the longest multi-get line (and a byte past it, so that
            // the decoder sees the line is too long).
            max_buf: item_max.max(GET_LINE_MAX) + MAX_LINE + 1024,
            wbuf: Reply::new(),
            scratch: Vec::new(),
            decoder: Decoder::new(Limits {
                item_max,
                cas: shared.config.cas_enabled,
            }),
            binary: None,
            negotiated: false,
            info,
            shared,
            quiet: true,
        }
    }

    /// Gives both buffers back when nothing is pending in them (every
    /// request read has been run and every reply sent); returns whether it
    /// did. A connection that waits for its next request holds no buffer
    /// then, and the next read takes new ones ([`INITIAL_BUF`] each).
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::io::{Read, Write};
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let (held, reply) = with_conn(
    ///     shared,
    ///     |mut client| {
    ///         client.write_all(b"set k 0 0 1\r\nv\r\nget k")?; // the get is cut short
    ///         std::thread::sleep(std::time::Duration::from_millis(50));
    ///         client.write_all(b"\r\n")?;
    ///         client.shutdown(std::net::Shutdown::Write)?;
    ///         let mut reply = Vec::new();
    ///         client.read_to_end(&mut reply)?;
    ///         Ok(reply)
    ///     },
    ///     |conn| {
    ///         let first = conn.release_buffers(); // nothing read yet
    ///         let mut after = Vec::new();
    ///         while conn.fill_blocking()? > 0 {
    ///             conn.process();
    ///             conn.flush()?;
    ///             after.push(conn.release_buffers()); // false while "get k" is cut short
    ///         }
    ///         Ok((first, after))
    ///     },
    /// )?;
    /// let (first, after) = held;
    /// assert_eq!(reply, b"STORED\r\nVALUE k 0 1\r\nv\r\nEND\r\n");
    /// assert!(first && after.contains(&false) && after.last() == Some(&true));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn release_buffers(&mut self) -> bool {
        if self.pos != self.filled || !self.wbuf.is_empty() {
            return false;
        }
        self.pos = 0;
        self.filled = 0;
        self.rbuf = Vec::new();
        self.wbuf = Reply::new();
        true
    }

    /// Room at the end of the read buffer: compacts or grows it, and gives
    /// a grown buffer back once everything in it has been run. A
    /// connection without buffers (new, or idle: see
    /// [`release_buffers`](Self::release_buffers)) takes them here.
    fn make_room(&mut self) -> io::Result<()> {
        if self.rbuf.is_empty() {
            self.rbuf = vec![0; INITIAL_BUF];
            if self.wbuf.capacity() == 0 {
                self.wbuf = Reply::with_capacity(INITIAL_BUF);
            }
            return Ok(());
        }
        if self.pos == self.filled {
            self.pos = 0;
            self.filled = 0;
            if self.rbuf.len() > KEEP_BUF {
                // A new allocation, not a shrink in place: the large one
                // goes back to the allocator whole.
                self.rbuf = vec![0; INITIAL_BUF];
            }
        }
        if self.filled < self.rbuf.len() {
            return Ok(());
        }
        if self.pos > 0 {
            self.rbuf.copy_within(self.pos..self.filled, 0);
            self.filled -= self.pos;
            self.pos = 0;
            return Ok(());
        }
        if self.rbuf.len() >= self.max_buf {
            return Err(io::Error::other(
                "request does not fit the connection buffer",
            ));
        }
        let n = (self.rbuf.len() * 2).min(self.max_buf);
        self.rbuf.resize(n, 0);
        Ok(())
    }

    /// Reads what the socket has, blocking the user thread (not the core)
    /// until something arrives; 0 at end of stream.
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::io::Write;
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let (reads, _) = with_conn(
    ///     shared,
    ///     |mut client| { client.write_all(b"mn\r\n")?; Ok(Vec::new()) },
    ///     |conn| {
    ///         let mut reads = vec![conn.fill_blocking()?];
    ///         while reads.last() != Some(&0) {
    ///             reads.push(conn.fill_blocking()?); // 0: the client closed
    ///         }
    ///         Ok(reads)
    ///     },
    /// )?;
    /// assert_eq!(reads.iter().sum::<usize>(), 4);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fill_blocking(&mut self) -> io::Result<usize> {
        self.make_room()?;
        let n = loop {
            match self.stream.read(&mut self.rbuf[self.filled..]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => break r?,
            }
        };
        self.note_read(n);
        Ok(n)
    }

    /// Counts a read of `n` bytes into the free end of the buffer; a read
    /// that filled it says more is pending (a pipelining client): the
    /// buffer doubles, up to [`KEEP_BUF`], so the next read takes more.
    fn note_read(&mut self, n: usize) {
        self.filled += n;
        self.shared
            .conns
            .bytes_read
            .fetch_add(n as u64, Ordering::Relaxed);
        let len = self.rbuf.len();
        if n > 0 && self.filled == len && len < KEEP_BUF && len < self.max_buf {
            self.rbuf
                .resize((len * 2).min(KEEP_BUF).min(self.max_buf), 0);
        }
    }

    /// Reads what the socket has now without waiting (`WouldBlock` if
    /// nothing); 0 at end of stream.
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::io::{Read, Write};
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let (_, reply) = with_conn(
    ///     shared,
    ///     |mut client| {
    ///         client.write_all(b"mn\r\n")?;
    ///         let mut reply = [0; 4];
    ///         client.read_exact(&mut reply)?;
    ///         Ok(reply.to_vec())
    ///     },
    ///     |conn| {
    ///         // Never waits: WouldBlock until the request is there.
    ///         loop {
    ///             match conn.fill_now() {
    ///                 Ok(n) if n > 0 => break,
    ///                 Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => corewise::yield_now(),
    ///                 other => return other.map(drop),
    ///             }
    ///         }
    ///         conn.process();
    ///         conn.flush()
    ///     },
    /// )?;
    /// assert_eq!(reply, b"MN\r\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fill_now(&mut self) -> io::Result<usize> {
        self.make_room()?;
        let buf = &mut self.rbuf[self.filled..];
        // SAFETY: `buf` is valid for writes of its length.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        self.note_read(n as usize);
        Ok(n as usize)
    }

    /// Runs every complete request in the read buffer, appending replies.
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::{Flow, Shared}};
    /// use std::io::Write;
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let (flows, _) = with_conn(
    ///     shared,
    ///     |mut client| { client.write_all(b"set k 0 0 1\r\nv\r\nquit\r\n")?; Ok(Vec::new()) },
    ///     |conn| {
    ///         let mut flows = Vec::new();
    ///         while flows.last() != Some(&Flow::Close) && conn.fill_blocking()? > 0 {
    ///             flows.push(conn.process()); // every whole request buffered
    ///         }
    ///         Ok(flows)
    ///     },
    /// )?;
    /// assert_eq!(flows.last(), Some(&Flow::Close));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn process(&mut self) -> Flow {
        if self.pos == self.filled {
            return Flow::Continue;
        }
        let info = Arc::clone(&self.info);
        info.spoke.store(true, Ordering::Relaxed);
        info.busy.store(true, Ordering::Relaxed);
        let flow = self.process_buffered();
        if self.shared.config.idle_timeout > 0 {
            // For the idle sweeper only: what is left is the start of a
            // request; past its head (a whole command line, or a binary
            // header) the rest is a value on its way.
            let left = &self.rbuf[self.pos..self.filled];
            let head_in = if self.binary.is_some() {
                left.len() >= 24
            } else {
                left.contains(&b'\n')
            };
            info.mid_request.store(head_in, Ordering::Relaxed);
        }
        let now = self.shared.store.clock().now();
        // Whole server seconds: a difference of two is more than a second.
        self.quiet = now.saturating_sub(info.last_cmd.swap(now, Ordering::Relaxed)) >= 2;
        info.busy.store(false, Ordering::Relaxed);
        flow
    }

    fn process_buffered(&mut self) -> Flow {
        if !self.negotiated {
            let Some(&first) = self.rbuf[self.pos..self.filled].first() else {
                return Flow::Continue;
            };
            self.negotiated = true;
            let binary = match self.shared.config.protocol {
                Protocol::Auto => first == REQUEST_MAGIC,
                Protocol::Ascii => false,
                Protocol::Binary => true,
            };
            if binary {
                self.binary = Some(BinaryDecoder::new(Limits {
                    item_max: self.shared.config.item_max,
                    cas: self.shared.config.cas_enabled,
                }));
            }
        }
        if self.binary.is_some() {
            return self.process_binary();
        }
        let mut ran = 0;
        loop {
            let buf = &self.rbuf[self.pos..self.filled];
            let (used, d) = self.decoder.decode(buf);
            let done = matches!(d, Decoded::Incomplete);
            let flow = match d {
                Decoded::Incomplete => Flow::Continue,
                Decoded::Request(r) => {
                    let (stream, shared) = (&mut self.stream, &*self.shared);
                    let cfd = stream.as_raw_fd();
                    let mut spill = |o: &mut Reply| send_all(stream, o, shared);
                    let (out, scratch) = (&mut self.wbuf, &mut self.scratch);
                    execute_conn(shared, &r, out, scratch, &mut spill, cfd)
                }
                Decoded::Error(e) => {
                    write_error(e, self.wbuf.bytes());
                    Flow::Continue
                }
            };
            self.pos += used;
            if let Flow::Watch(_) = flow {
                // As memcached: `watch` must be the last request buffered.
                if self.pos < self.filled {
                    self.wbuf.bytes().extend_from_slice(
                        b"ERROR cannot pipeline other commands before watch\r\n",
                    );
                    continue;
                }
                self.wbuf.bytes().extend_from_slice(b"OK\r\n");
                return flow;
            }
            if flow == Flow::Close || self.spill_if_full().is_err() {
                return Flow::Close;
            }
            if done {
                return Flow::Continue;
            }
            if self.pace(&mut ran).is_err() {
                return Flow::Close;
            }
        }
    }

    /// [`process`](Self::process) for a binary-protocol connection.
    fn process_binary(&mut self) -> Flow {
        let mut ran = 0;
        loop {
            let Some(dec) = self.binary.as_mut() else {
                return Flow::Continue;
            };
            let (used, d) = dec.decode(&self.rbuf[self.pos..self.filled]);
            let flow = match d {
                BinDecoded::Incomplete => Flow::Continue,
                BinDecoded::Frame(f) => execute_binary(&self.shared, &f, &mut self.wbuf),
                BinDecoded::TooLarge(h, key) => {
                    too_large(&self.shared, &h, key, self.wbuf.bytes());
                    Flow::Continue
                }
                BinDecoded::Malformed(h) => {
                    write_malformed(&h, self.wbuf.bytes());
                    Flow::Close
                }
                // Not a request: the stream cannot be followed (memcached
                // closes such a connection too).
                BinDecoded::BadMagic => Flow::Close,
            };
            self.pos += used;
            if flow == Flow::Close
                || (self.wbuf.pending() > SPILL_AT
                    && send_all(&mut self.stream, &mut self.wbuf, &self.shared).is_err())
            {
                return Flow::Close;
            }
            if matches!(d, BinDecoded::Incomplete) {
                if used == 0 || self.pos == self.filled {
                    return Flow::Continue;
                }
            } else if self.pace(&mut ran).is_err() {
                return Flow::Close;
            }
        }
    }

    /// Counts a request run from this read; after `-R` of them with more
    /// bytes waiting, sends the replies so far and lets the core's other
    /// user threads run first, as memcached lets its other connections run
    /// (`conn_yields` counts the times). A thread per connection would
    /// otherwise keep its core for as long as one client pipelines.
    fn pace(&mut self, ran: &mut u32) -> io::Result<()> {
        *ran += 1;
        if *ran >= self.shared.config.reqs_per_event && self.pos < self.filled {
            *ran = 0;
            self.shared
                .conns
                .conn_yields
                .fetch_add(1, Ordering::Relaxed);
            self.flush()?;
            corewise::yield_now();
        }
        Ok(())
    }

    /// Writes the replies: straight to the socket while it takes them,
    /// then through corewise's blocking write (the user thread waits).
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared};
    /// use std::io::{Read, Write};
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let (_, reply) = with_conn(
    ///     shared,
    ///     |mut client| {
    ///         client.write_all(b"get a b\r\n")?;
    ///         let mut reply = [0; 5];
    ///         client.read_exact(&mut reply)?;
    ///         Ok(reply.to_vec())
    ///     },
    ///     |conn| {
    ///         conn.fill_blocking()?;
    ///         conn.process(); // the replies wait in the connection ...
    ///         conn.flush() // ... until they are written
    ///     },
    /// )?;
    /// assert_eq!(reply, b"END\r\n");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn flush(&mut self) -> io::Result<()> {
        send_all(&mut self.stream, &mut self.wbuf, &self.shared)
    }

    /// Sends the replies now when more than [`SPILL_AT`] bytes wait: the
    /// connection reads and runs nothing more until the client has taken
    /// them, so its unsent output stays bounded (see the module docs).
    fn spill_if_full(&mut self) -> io::Result<()> {
        if self.wbuf.pending() > SPILL_AT {
            send_all(&mut self.stream, &mut self.wbuf, &self.shared)?;
        }
        Ok(())
    }

    fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Streams the `watch` log of the `mask` events until the client
    /// closes (what it sends meanwhile is read and ignored, as memcached
    /// ignores it). The lines are picked up every 10 ms.
    ///
    /// ```
    /// # // Serves one client with a Connection: `server` runs on a user thread of
    /// # // a one-core runtime with the accepted connection, `client` on a std
    /// # // thread with its end; returns what each returned.
    /// # fn with_conn<T: Send + 'static>(
    /// #     shared: std::sync::Arc<corewise_kv::exec::Shared>,
    /// #     client: impl FnOnce(std::net::TcpStream) -> std::io::Result<Vec<u8>> + Send + 'static,
    /// #     server: impl FnOnce(&mut corewise_kv::server::Connection) -> std::io::Result<T> + Send + 'static,
    /// # ) -> std::io::Result<(T, Vec<u8>)> {
    /// #     let other = |e: &dyn std::fmt::Display| std::io::Error::other(e.to_string());
    /// #     let rt = corewise::Runtime::builder().max_cores(1).build().map_err(|e| other(&e))?;
    /// #     let listener = corewise_kv::server::bind("127.0.0.1", 0)?;
    /// #     let addr = listener.local_addr()?;
    /// #     let c = std::thread::spawn(move || client(std::net::TcpStream::connect(addr)?));
    /// #     let h = rt
    /// #         .spawn(move || -> std::io::Result<T> {
    /// #             let (stream, _) = listener.accept()?;
    /// #             let mut conn = corewise_kv::server::Connection::new(stream, shared);
    /// #             server(&mut conn)
    /// #         })
    /// #         .map_err(|e| other(&e))?;
    /// #     let t = h.join().map_err(|e| other(&e))??;
    /// #     Ok((t, c.join().unwrap()?))
    /// # }
    /// use corewise_kv::{config::Config, exec::Shared, watch::MUTATIONS};
    /// use std::io::Read;
    /// use std::sync::Arc;
    /// let shared = Arc::new(Shared::new(Config::default()));
    /// let log = Arc::clone(&shared.store.watch);
    /// let (_, line) = with_conn(
    ///     shared,
    ///     move |mut client| {
    ///         while log.watchers() == 0 {
    ///             std::thread::sleep(std::time::Duration::from_millis(1));
    ///         }
    ///         log.emit(MUTATIONS, |l| l.push_str("key=k"));
    ///         let mut line = Vec::new();
    ///         let mut b = [0; 1];
    ///         while line.last() != Some(&b'\n') {
    ///             client.read_exact(&mut b)?;
    ///             line.push(b[0]);
    ///         }
    ///         Ok(line) // and the client leaves: the stream ends
    ///     },
    ///     |conn| conn.watch(MUTATIONS),
    /// )?;
    /// assert!(line.ends_with(b" key=k\n"));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn watch(&mut self, mask: u8) -> io::Result<()> {
        self.info.watching.store(true, Ordering::Relaxed);
        let log = Arc::clone(&self.shared.store.watch);
        let me = log.subscribe(mask);
        let r = loop {
            let lines = me.drain();
            for l in &lines {
                self.wbuf.bytes().extend_from_slice(l.as_bytes());
            }
            if let Err(e) = self.flush() {
                break Err(e);
            }
            self.pos = 0;
            self.filled = 0;
            match self.fill_now() {
                Ok(0) => break Ok(()),
                Err(e) if e.kind() != io::ErrorKind::WouldBlock => break Err(e),
                _ => {}
            }
            corewise::sleep(Duration::from_millis(10));
        };
        log.unsubscribe(&me);
        r
    }
}

/// Sends all of `wbuf` and empties it: straight to the socket while it
/// takes the bytes (one `sendmsg` of the reply's byte runs and referenced
/// values), then through corewise's blocking write (the user thread waits,
/// its core runs others). A write that stops in the middle of a segment
/// resumes there ([`Reply::write_with`]).
fn send_all(stream: &mut Stream, wbuf: &mut Reply, shared: &Shared) -> io::Result<()> {
    let total = wbuf.pending();
    let fd = stream.as_raw_fd();
    let mut blocked = false;
    while !wbuf.is_empty() {
        let r = wbuf.write_with(|iov| {
            if blocked {
                // A socket that was full: wait (the user thread, not the
                // core) for room for the first segment, then try the rest
                // again without waiting. `send`, not `writev`: a peer that
                // has gone raises no SIGPIPE.
                blocked = false;
                return stream.write(&iov[0]);
            }
            // SAFETY: an all-zero `msghdr` is valid (no name, no control
            // data); it points at `iov`, whose `IoSlice`s are
            // ABI-compatible with `iovec` and borrow buffers that outlive
            // the call, which only reads them.
            let n = unsafe {
                let mut msg: libc::msghdr = std::mem::zeroed();
                msg.msg_iov = iov.as_ptr().cast_mut().cast();
                msg.msg_iovlen = iov.len() as _;
                libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            };
            if n < 0 {
                Err(io::Error::last_os_error())
            } else {
                Ok(n as usize)
            }
        });
        match r {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && !blocked => blocked = true,
            Err(e) => return Err(e),
        }
    }
    shared
        .conns
        .bytes_written
        .fetch_add(total as u64, Ordering::Relaxed);
    wbuf.reset(KEEP_BUF, INITIAL_BUF);
    Ok(())
}

/// Refuses a connection over the limit: the error line, then close.
fn refuse(stream: Stream, shared: &Shared) {
    shared
        .conns
        .rejected_connections
        .fetch_add(1, Ordering::Relaxed);
    // SAFETY: TOO_MANY is valid for reads of its length.
    unsafe {
        libc::send(
            stream.as_raw_fd(),
            TOO_MANY.as_ptr().cast(),
            TOO_MANY.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
}

/// Accepts one connection within the limit, or refuses it.
fn admit(stream: Stream, shared: &Arc<Shared>) -> Option<Connection> {
    if shared.conns.curr_connections.load(Ordering::Relaxed) as usize >= shared.config.max_conns {
        refuse(stream, shared);
        return None;
    }
    shared
        .conns
        .total_connections
        .fetch_add(1, Ordering::Relaxed);
    Some(Connection::new(stream, Arc::clone(shared)))
}

/// Runs the server on `listener` until an unrecoverable accept error.
/// Call it on a user thread of `rt`; `rt` is used to create the dispatch
/// thread in dispatch mode.
///
/// ```
/// use corewise_kv::{config::Config, exec::Shared, server};
/// use std::io::{Read, Write};
/// use std::os::fd::AsRawFd;
/// use std::sync::Arc;
/// let listener = server::bind("127.0.0.1", 0)?; // any free port
/// let (addr, fd) = (listener.local_addr()?, listener.as_raw_fd());
/// let shared = Arc::new(Shared::new(Config::default()));
/// let rt = corewise::Runtime::builder().max_cores(1).build()?;
/// let srv = std::thread::spawn(move || server::serve(&rt, listener, shared));
/// let mut c = std::net::TcpStream::connect(addr)?;
/// c.write_all(b"set k 0 0 2\r\nhi\r\nget k\r\n")?;
/// let mut reply = [0; 30];
/// c.read_exact(&mut reply)?;
/// assert_eq!(&reply, b"STORED\r\nVALUE k 0 2\r\nhi\r\nEND\r\n");
/// drop(c);
/// // Stopping it: an accept error (here the listening socket shut down).
/// // SAFETY: shutdown(2) on a socket this process owns.
/// unsafe { libc::shutdown(fd, libc::SHUT_RD) };
/// assert!(srv.join().unwrap().is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn serve(
    rt: &corewise::Runtime,
    listener: impl Into<Listener>,
    shared: Arc<Shared>,
) -> io::Result<()> {
    let listener = listener.into();
    shared
        .conn_table
        .set_listener(listener.as_raw_fd(), listener.address());
    // memcached counts its listening connection in total_connections.
    shared
        .conns
        .total_connections
        .fetch_add(1, Ordering::Relaxed);
    let _sweeper = IdleSweeper::start(rt, &shared)?;
    match shared.config.mode {
        Mode::Conn => {
            let h = rt
                .spawn(move || serve_conn(listener, shared))
                .map_err(io::Error::other)?;
            h.join().map_err(|e| io::Error::other(e.to_string()))?
        }
        Mode::Dispatch => {
            // An exclusive core for the dispatcher only when there is
            // another core for the workers.
            let exclusive = rt.cores() >= 2 && shared.config.threads >= 2;
            let class = if exclusive {
                ThreadClass::Exclusive
            } else {
                ThreadClass::Normal
            };
            let l = Arc::new(listener);
            let s = Arc::clone(&shared);
            let h = match rt.spawn_with(class, {
                let l = Arc::clone(&l);
                move || serve_dispatch(&l, s)
            }) {
                Ok(h) => h,
                Err(_) => rt
                    .spawn(move || serve_dispatch(&l, shared))
                    .map_err(io::Error::other)?,
            };
            h.join().map_err(|e| io::Error::other(e.to_string()))?
        }
    }
}

/// With `-o idle_timeout`, a user thread that closes idle connections
/// once a second, as memcached's connection timeout thread does; it stops
/// when the server does (this guard's drop).
struct IdleSweeper(Option<Arc<std::sync::atomic::AtomicBool>>);

impl IdleSweeper {
    fn start(rt: &corewise::Runtime, shared: &Arc<Shared>) -> io::Result<IdleSweeper> {
        let timeout = shared.config.idle_timeout;
        if timeout == 0 {
            return Ok(IdleSweeper(None));
        }
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, quit) = (Arc::clone(shared), Arc::clone(&stop));
        rt.spawn(move || {
            while !quit.load(Ordering::Relaxed) {
                corewise::sleep(Duration::from_secs(1));
                let kicked = s.conn_table.kick_idle(s.store.clock().now(), timeout);
                s.conns.idle_kicks.fetch_add(kicked, Ordering::Relaxed);
            }
        })
        .map_err(io::Error::other)?;
        Ok(IdleSweeper(Some(stop)))
    }
}

impl Drop for IdleSweeper {
    fn drop(&mut self) {
        if let Some(stop) = &self.0 {
            stop.store(true, Ordering::Relaxed);
        }
    }
}

/// Conn mode: a user thread per connection.
fn serve_conn(listener: Listener, shared: Arc<Shared>) -> io::Result<()> {
    loop {
        let stream = match listener.accept() {
            Ok(a) => a,
            Err(e) if transient(&e) => {
                corewise::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => return Err(e),
        };
        let Some(conn) = admit(stream, &shared) else {
            continue;
        };
        let verbose = shared.config.verbose;
        // The connection waits in a cell the new thread empties, so a
        // failed spawn (every slot taken) leaves it here to be refused
        // with memcached's message instead of silently closed.
        let cell = Arc::new(SpinLock::new(Some(conn)));
        let spawn = || {
            let theirs = Arc::clone(&cell);
            corewise::thread::Builder::new().spawn_detached(move || {
                let Some(mut conn) = theirs.lock().take() else {
                    return;
                };
                if let Err(e) = run_conn(&mut conn) {
                    if verbose > 0 {
                        eprintln!("corewise-kv: connection: {e}");
                    }
                }
            })
        };
        // A spawn fails only at the runtime's thread limit (never for want
        // of a free slot on a core): then the connection is refused.
        let spawned = spawn();
        if let Err(e) = spawned {
            if let Some(conn) = cell.lock().take() {
                refuse_conn(conn);
            }
            if verbose > 0 {
                eprintln!("corewise-kv: cannot create a connection thread: {e}");
            }
        }
    }
}

/// Refuses an admitted connection (no thread for it).
fn refuse_conn(conn: Connection) {
    // SAFETY: TOO_MANY is valid for reads of its length.
    unsafe {
        libc::send(
            conn.fd(),
            TOO_MANY.as_ptr().cast(),
            TOO_MANY.len(),
            libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
        )
    };
    conn.shared
        .conns
        .rejected_connections
        .fetch_add(1, Ordering::Relaxed);
}

fn run_conn(conn: &mut Connection) -> io::Result<()> {
    // A busy connection's thread waits for its next request in a read,
    // with its buffers (one operation per request). A new connection, and
    // one whose last request came after more than a second of silence,
    // gives them back and waits for input without them (`readable`, then
    // a read that does not wait: two allocations more per request, and on
    // io_uring a system call, which busy connections do not pay). No timer
    // is needed to tell them apart: `process` already reads the clock.
    loop {
        let n = if conn.quiet && conn.release_buffers() {
            conn.stream.readable()?;
            match conn.fill_now() {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            }
        } else {
            conn.fill_blocking()?
        };
        if n == 0 {
            return Ok(());
        }
        let flow = conn.process();
        conn.flush()?;
        match flow {
            Flow::Close => return Ok(()),
            Flow::Watch(mask) => return conn.watch(mask),
            Flow::Continue => {}
        }
    }
}

/// Errors after which accepting goes on (a client that left, fd limits).
fn transient(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(
            libc::ECONNABORTED
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOBUFS
                | libc::ENOMEM
                | libc::EPROTO
                | libc::EPERM
                | libc::EINTR
        )
    ) || e.kind() == io::ErrorKind::TimedOut
}

/// The connections the dispatcher watches, by epoll token.
#[derive(Debug, Default)]
struct Table {
    slots: Vec<Option<Connection>>,
    free: Vec<usize>,
}

impl Table {
    fn insert(&mut self, c: Connection) -> usize {
        match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(c);
                i
            }
            None => {
                self.slots.push(Some(c));
                self.slots.len() - 1
            }
        }
    }
}

struct Epoll {
    fd: OwnedFd,
}

const LISTENER: u64 = u64::MAX;

impl Epoll {
    fn new() -> io::Result<Self> {
        // SAFETY: plain system call.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: epoll_create1 returned a new fd that nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd })
    }

    fn ctl(&self, op: i32, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a valid event for the call's duration.
        if unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout_ms` (0: just looks) into `evs`.
    fn wait(epfd: RawFd, evs: &mut [libc::epoll_event], timeout_ms: i32) -> io::Result<usize> {
        // SAFETY: `evs` is valid for writes of its length.
        let n = unsafe { libc::epoll_wait(epfd, evs.as_mut_ptr(), evs.len() as i32, timeout_ms) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize)
    }
}

const CONN_EVENTS: u32 = (libc::EPOLLIN | libc::EPOLLRDHUP | libc::EPOLLONESHOT) as u32;

/// How long the dispatcher keeps polling after the last event before it
/// sleeps in the kernel.
const DISPATCH_SPIN: Duration = Duration::from_micros(50);

struct Dispatch {
    ep: Epoll,
    table: SpinLock<Table>,
    shared: Arc<Shared>,
}

/// Dispatch mode: the Arachne way.
fn serve_dispatch(listener: &Listener, shared: Arc<Shared>) -> io::Result<()> {
    let ep = Epoll::new()?;
    ep.ctl(
        libc::EPOLL_CTL_ADD,
        listener.as_raw_fd(),
        libc::EPOLLIN as u32,
        LISTENER,
    )?;
    listener.set_timeout(Some(Duration::from_millis(10)))?;
    let d = Arc::new(Dispatch {
        ep,
        table: SpinLock::new(Table::default()),
        shared,
    });
    let epfd = d.ep.fd.as_raw_fd();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    let mut last_event = Instant::now();
    loop {
        let mut n = Epoll::wait(epfd, &mut evs, 0)?;
        if n == 0 {
            if last_event.elapsed() < DISPATCH_SPIN {
                corewise::yield_now();
                continue;
            }
            // Sleep in the kernel on a syscall thread; this user thread
            // blocks, its core runs the workers or sleeps.
            let (r, back) = corewise::blocking(move || {
                let mut evs = evs;
                let r = Epoll::wait(epfd, &mut evs, 1000);
                (r, evs)
            });
            evs = back;
            n = r?;
            if n == 0 {
                continue;
            }
        }
        last_event = Instant::now();
        for ev in &evs[..n] {
            let token = ev.u64;
            if token == LISTENER {
                accept_one(listener, &d);
                continue;
            }
            // The worker takes the connection out of the table itself, so
            // a failed spawn leaves it here to be served inline.
            let dd = Arc::clone(&d);
            let token = token as usize;
            let r = corewise::thread::Builder::new()
                .wait_for_slot(true)
                .spawn_detached(move || serve_token(&dd, token));
            if let Err(e) = r {
                if d.shared.config.verbose > 1 {
                    eprintln!("corewise-kv: serving inline: {e}");
                }
                serve_token(&d, token);
            }
        }
    }
}

/// Takes connection `token` out of the table and serves it.
fn serve_token(d: &Dispatch, token: usize) {
    let conn = d.table.lock().slots.get_mut(token).and_then(Option::take);
    if let Some(conn) = conn {
        serve_ready(d, token, conn);
    }
}

fn accept_one(listener: &Listener, d: &Arc<Dispatch>) {
    let stream = match listener.accept() {
        Ok(s) => s,
        Err(e) => {
            if d.shared.config.verbose > 0 && !transient(&e) {
                eprintln!("corewise-kv: accept: {e}");
            }
            return;
        }
    };
    let Some(conn) = admit(stream, &d.shared) else {
        return;
    };
    let fd = conn.fd();
    let token = d.table.lock().insert(conn);
    if d.ep
        .ctl(libc::EPOLL_CTL_ADD, fd, CONN_EVENTS, token as u64)
        .is_err()
    {
        let mut t = d.table.lock();
        t.slots[token] = None;
        t.free.push(token);
    }
}

/// A worker: serves what a ready connection has sent, then hands the
/// connection back to the dispatcher (or closes it).
fn serve_ready(d: &Dispatch, token: usize, mut conn: Connection) {
    let keep = loop {
        match conn.fill_now() {
            Ok(0) => break false,
            Ok(_) => {
                let flow = conn.process();
                if conn.flush().is_err() || flow == Flow::Close {
                    break false;
                }
                if let Flow::Watch(mask) = flow {
                    // The worker stays with the connection until it closes.
                    let _ = conn.watch(mask);
                    break false;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break false,
        }
    };
    let fd = conn.fd();
    if keep {
        // As in conn mode: a quiet connection waits without buffers.
        if conn.quiet {
            conn.release_buffers();
        }
        d.table.lock().slots[token] = Some(conn);
        if d.ep
            .ctl(libc::EPOLL_CTL_MOD, fd, CONN_EVENTS, token as u64)
            .is_ok()
        {
            return;
        }
        conn = match d.table.lock().slots[token].take() {
            Some(c) => c,
            None => return,
        };
    }
    let _ = d.ep.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0);
    drop(conn);
    d.table.lock().free.push(token);
}

/// Raises the open-file limit to its hard limit (memcached does the same
/// for `-c`); returns the new soft limit.
///
/// ```
/// use corewise_kv::server::raise_fd_limit;
/// let soft = raise_fd_limit();
/// // SAFETY: getrlimit writes the struct it is given.
/// let mut rl: libc::rlimit = unsafe { std::mem::zeroed() };
/// assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) }, 0);
/// assert_eq!((soft, rl.rlim_cur), (rl.rlim_max as u64, rl.rlim_max));
/// ```
pub fn raise_fd_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit with a valid struct.
    unsafe {
        let mut rl: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) != 0 {
            return 0;
        }
        if rl.rlim_cur < rl.rlim_max {
            rl.rlim_cur = rl.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &rl);
        }
        rl.rlim_cur as u64
    }
}

/// Binds the listening socket.
///
/// ```
/// use corewise_kv::server::bind;
/// let l = bind("127.0.0.1", 0)?; // port 0: any free port
/// let addr = l.local_addr()?;
/// assert!(addr.ip().is_loopback() && addr.port() != 0);
/// // Taken: a second bind on it fails.
/// assert!(bind("127.0.0.1", addr.port()).is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn bind(listen: &str, port: u16) -> io::Result<TcpListener> {
    TcpListener::bind((listen, port))
}

#[allow(dead_code)]
fn _assert_send() {
    fn s<T: Send>() {}
    s::<Connection>();
}
