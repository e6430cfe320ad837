//! Files whose reads and writes block the user thread, not its core.
//!
//! On the ring, file I/O is an ordinary SQE (the kernel completes it inline
//! or on its io-wq workers). Regular files cannot be polled, so on the epoll
//! back end each call runs on a syscall thread ([`crate::blocking()`]) while
//! the user thread blocks; on a plain OS thread it is the system call.
//! Metadata calls that never wait for the disk (`fstat`, `lseek`,
//! `ftruncate`) are made directly. An open blocks as `open(2)` does (a
//! FIFO's waits for its peer): on the ring it always runs on the kernel's
//! workers, whose open blocks (the inline attempt would open as if
//! `O_NONBLOCK`), on the epoll back end on a syscall thread.
//!
//! The `std::fs` helpers have std's signatures. [`read`],
//! [`read_to_string`] and [`write()`] open and transfer through the path
//! above. [`metadata`], [`create_dir_all`] and [`read_dir`] have no ring
//! operation that fits (a `Metadata` can only come from std, the ring has
//! no `getdents`, and `create_dir_all` is a loop of `stat`s and `mkdir`s),
//! so from a user thread they run on a syscall thread
//! ([`crate::blocking()`]) and from an OS thread directly; [`ReadDir`]
//! fetches its entries that way a batch at a time.
//!
//! Differences from `std::fs`: the [`DirEntry`](std::fs::DirEntry)s
//! [`read_dir`] yields are std's, and their `metadata()` is std's call on
//! the calling thread (a `statx` that may wait for the disk, stalling the
//! core): call [`metadata`] with `entry.path()` instead. `file_type()` is
//! free on most file systems.

use crate::io::op::{self, Kind};
use crate::io::Canceller;
use crate::io::IoState;
use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// How to open a file, as `std::fs::OpenOptions`.
///
/// ```
/// let p = std::env::temp_dir().join(format!("cw-doc-opts-{}", std::process::id()));
/// let f = corewise::fs::File::options().write(true).create(true).truncate(true).open(&p).unwrap();
/// f.write_at(b"abc", 0).unwrap();
/// drop(f);
/// assert_eq!(std::fs::read(&p).unwrap(), b"abc");
/// std::fs::remove_file(&p).unwrap();
/// ```
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    read: bool,
    write: bool,
    append: bool,
    truncate: bool,
    create: bool,
    create_new: bool,
    mode: Option<u32>,
    custom_flags: i32,
}

impl OpenOptions {
    /// No access, no creation.
    ///
    /// [`open`](Self::open) validates the options as std does: it fails
    /// with [`InvalidInput`](io::ErrorKind::InvalidInput), and leaves the
    /// file alone, when no access mode is set, when `truncate`, `create`
    /// or `create_new` is set without `write` or `append`, and when
    /// `append` and `truncate` are both set (without `create_new`).
    ///
    /// ```
    /// use corewise::fs::OpenOptions;
    /// let p = std::env::temp_dir().join(format!("cw-doc-optnew-{}", std::process::id()));
    /// std::fs::write(&p, b"x").unwrap();
    /// // No access asked for: the open fails, as with std.
    /// let e = OpenOptions::new().open(&p).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// // Truncating needs write access: refused, and the data stays.
    /// let e = OpenOptions::new().read(true).truncate(true).open(&p).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// assert_eq!(std::fs::read(&p).unwrap(), b"x");
    /// assert!(OpenOptions::new().read(true).open(&p).is_ok());
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn new() -> Self {
        Self::default()
    }
    /// Open for reading.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-optread-{}", std::process::id()));
    /// std::fs::write(&p, b"data").unwrap();
    /// let f = corewise::fs::File::options().read(true).open(&p).unwrap();
    /// let mut buf = [0u8; 4];
    /// assert_eq!(f.read(&mut buf).unwrap(), 4);
    /// assert!(f.write(b"no").is_err()); // opened for reading only
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-optwrite-{}", std::process::id()));
    /// std::fs::write(&p, b"....").unwrap();
    /// let f = corewise::fs::File::options().write(true).open(&p).unwrap();
    /// f.write_all_at(b"ab", 1).unwrap(); // no truncation: the rest stays
    /// assert_eq!(std::fs::read(&p).unwrap(), b".ab.");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Every write appends.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-optappend-{}", std::process::id()));
    /// std::fs::write(&p, b"log:").unwrap();
    /// let f = corewise::fs::File::options().append(true).open(&p).unwrap();
    /// f.write(b" one").unwrap();
    /// f.write(b" two").unwrap();
    /// assert_eq!(std::fs::read_to_string(&p).unwrap(), "log: one two");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    /// Truncate to 0 bytes on open.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-opttrunc-{}", std::process::id()));
    /// std::fs::write(&p, b"old contents").unwrap();
    /// let f = corewise::fs::File::options().write(true).truncate(true).open(&p).unwrap();
    /// assert_eq!(f.metadata().unwrap().len(), 0);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// Create if missing.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-optcreate-{}", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// assert!(corewise::fs::File::options().write(true).open(&p).is_err()); // missing
    /// let f = corewise::fs::File::options().write(true).create(true).open(&p).unwrap();
    /// assert!(f.metadata().unwrap().is_file());
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create, failing if it exists.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-optnew2-{}", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let opts = || corewise::fs::File::options().write(true).create_new(true).open(&p);
    /// assert!(opts().is_ok());
    /// assert_eq!(opts().unwrap_err().kind(), std::io::ErrorKind::AlreadyExists);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Permission bits for a new file (default 0o666, less the umask).
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// let p = std::env::temp_dir().join(format!("cw-doc-optmode-{}", std::process::id()));
    /// let _ = std::fs::remove_file(&p);
    /// let f = corewise::fs::File::options().write(true).create(true).mode(0o600).open(&p).unwrap();
    /// // The umask can only take bits away: nobody but the owner gets any.
    /// assert_eq!(f.metadata().unwrap().permissions().mode() & 0o077, 0);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = Some(mode);
        self
    }

    /// Further `open(2)` flags (`O_NOFOLLOW`, `O_NOATIME`, `O_DIRECT`, ...),
    /// as std's `OpenOptionsExt::custom_flags`: they add to what the other
    /// options ask for and cannot change the access mode (its bits are
    /// ignored); a second call replaces the first.
    ///
    /// ```
    /// let dir = std::env::temp_dir();
    /// let target = dir.join(format!("cw-doc-cflags-{}", std::process::id()));
    /// let link = dir.join(format!("cw-doc-cflags-link-{}", std::process::id()));
    /// std::fs::write(&target, b"x").unwrap();
    /// let _ = std::fs::remove_file(&link);
    /// std::os::unix::fs::symlink(&target, &link).unwrap();
    /// let e = corewise::fs::File::options()
    ///     .read(true)
    ///     .custom_flags(libc::O_NOFOLLOW)
    ///     .open(&link)
    ///     .unwrap_err();
    /// assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    /// std::fs::remove_file(&link).unwrap();
    /// std::fs::remove_file(&target).unwrap();
    /// ```
    pub fn custom_flags(&mut self, flags: i32) -> &mut Self {
        self.custom_flags = flags;
        self
    }

    /// The `open` flags, checked as std checks them: an access mode is
    /// needed, and truncating or creating needs write or append access
    /// (and truncating cannot be combined with append, unless
    /// `create_new` makes the file new anyway). Anything else is `EINVAL`
    /// (kind [`InvalidInput`](io::ErrorKind::InvalidInput)), before any
    /// file is touched.
    fn flags(&self) -> io::Result<i32> {
        let einval = || io::Error::from_raw_os_error(libc::EINVAL);
        let access = match (self.read, self.write, self.append) {
            (true, false, false) => libc::O_RDONLY,
            (false, true, false) => libc::O_WRONLY,
            (true, true, false) => libc::O_RDWR,
            (false, _, true) => libc::O_WRONLY | libc::O_APPEND,
            (true, _, true) => libc::O_RDWR | libc::O_APPEND,
            (false, false, false) => return Err(einval()),
        };
        match (self.write, self.append) {
            (true, false) => {}
            (false, false) => {
                if self.truncate || self.create || self.create_new {
                    return Err(einval());
                }
            }
            (_, true) => {
                if self.truncate && !self.create_new {
                    return Err(einval());
                }
            }
        }
        let creation = match (self.create, self.truncate, self.create_new) {
            (false, false, false) => 0,
            (true, false, false) => libc::O_CREAT,
            (false, true, false) => libc::O_TRUNC,
            (true, true, false) => libc::O_CREAT | libc::O_TRUNC,
            (_, _, true) => libc::O_CREAT | libc::O_EXCL,
        };
        Ok(access | creation | libc::O_CLOEXEC | (self.custom_flags & !libc::O_ACCMODE))
    }

    /// Opens `path` (through the ring when there is one). The open blocks as
    /// std's does, but only the user thread: a FIFO opened for reading
    /// waits for a writer, one opened for writing waits for a reader, while
    /// the core runs other threads (the ring runs the open on the kernel's
    /// workers, the epoll back end on a syscall thread).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let p = std::env::temp_dir().join(format!("cw-doc-optopen-{}", std::process::id()));
    /// std::fs::write(&p, b"ring").unwrap();
    /// // From a user thread the open goes through the core's ring (or a syscall thread).
    /// let n = rt
    ///     .block_on(|| corewise::fs::File::options().read(true).open(&p).unwrap().metadata().unwrap().len())
    ///     .unwrap();
    /// assert_eq!(n, 4);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn open(&self, path: impl AsRef<Path>) -> io::Result<File> {
        let flags = self.flags()?;
        let path = CString::new(path.as_ref().as_os_str().as_bytes())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
        let kind = Kind::OpenAt {
            path: path.as_ptr(),
            flags,
            mode: self.mode.unwrap_or(0o666),
        };
        // SAFETY: `path` lives until the call returns.
        let fd = unsafe { op::run(kind, None, None) }?;
        // SAFETY: openat returned a new fd that nobody else owns.
        let file = unsafe { std::fs::File::from_raw_fd(fd as RawFd) };
        File::with_kind(file)
    }
}

/// An open file. A FIFO or socket opened as a file is made non-blocking
/// (once its open, which waits for a FIFO's peer as std's does, has
/// returned) and waited on like a socket, so its read timeout and canceller
/// hold on every back end.
///
/// ```
/// use std::io::{Read, Write};
/// let rt = corewise::Runtime::new().unwrap();
/// rt.block_on(|| {
///     let p = std::env::temp_dir().join(format!("cw-doc-file-{}", std::process::id()));
///     let mut f = corewise::fs::File::create(&p).unwrap();
///     f.write_all(b"hello world").unwrap();
///     f.sync_all().unwrap();
///     let f = corewise::fs::File::open(&p).unwrap();
///     let mut b = [0u8; 5];
///     assert_eq!(f.read_at(&mut b, 6).unwrap(), 5);
///     assert_eq!(&b, b"world");
///     assert_eq!(f.metadata().unwrap().len(), 11);
///     std::fs::remove_file(&p).unwrap();
/// }).unwrap();
/// ```
#[derive(Debug)]
pub struct File {
    file: std::fs::File,
    state: IoState,
    /// A FIFO or a socket: its reads and writes wait for readiness (the fd
    /// is non-blocking), so they honour the read timeout and the canceller
    /// on every back end. Regular files and devices run their calls as they
    /// are (through the ring, or on a syscall thread under epoll).
    pollable: bool,
}

impl File {
    /// Wraps a newly opened file; a FIFO or socket is made non-blocking and
    /// waited on for readiness.
    fn with_kind(file: std::fs::File) -> io::Result<Self> {
        let pollable = make_pollable(&file)?;
        Ok(File {
            file,
            state: IoState::default(),
            pollable,
        })
    }

    /// Opens `path` read-only.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-open-{}", std::process::id()));
    /// std::fs::write(&p, b"abc").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// let mut buf = [0u8; 3];
    /// f.read_exact_at(&mut buf, 0).unwrap();
    /// assert_eq!(&buf, b"abc");
    /// assert_eq!(corewise::fs::File::open(p.with_extension("missing")).unwrap_err().kind(), std::io::ErrorKind::NotFound);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        OpenOptions::new().read(true).open(path)
    }

    /// Creates (or truncates) `path` for writing.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-create-{}", std::process::id()));
    /// std::fs::write(&p, b"previous").unwrap();
    /// let f = corewise::fs::File::create(&p).unwrap(); // truncates
    /// assert_eq!(f.metadata().unwrap().len(), 0);
    /// f.write(b"new").unwrap();
    /// assert_eq!(std::fs::read(&p).unwrap(), b"new");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }

    /// Options for opening a file.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-options-{}", std::process::id()));
    /// let f = corewise::fs::File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    /// f.write_all_at(b"rw", 0).unwrap();
    /// let mut buf = [0u8; 2];
    /// f.read_exact_at(&mut buf, 0).unwrap();
    /// assert_eq!(&buf, b"rw");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    /// Reads at the file position, advancing it.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let p = std::env::temp_dir().join(format!("cw-doc-fread-{}", std::process::id()));
    /// std::fs::write(&p, b"abcdef").unwrap();
    /// let parts = rt
    ///     .block_on(|| {
    ///         let f = corewise::fs::File::open(&p).unwrap();
    ///         let mut buf = [0u8; 4];
    ///         let first = f.read(&mut buf).unwrap(); // advances the position
    ///         let second = f.read(&mut buf).unwrap();
    ///         (first, second, buf[..second].to_vec())
    ///     })
    ///     .unwrap();
    /// assert_eq!(parts, (4, 2, b"ef".to_vec()));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pollable {
            return self.read_vectored(&mut [IoSliceMut::new(buf)]);
        }
        let kind = Kind::Read {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            off: None,
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.read(kind) }
    }

    /// Writes at the file position (the end, in append mode). On a FIFO
    /// (non-blocking, see [`File`]) it may write part of `buf` when the
    /// pipe is nearly full: `write_all` writes the rest.
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let p = std::env::temp_dir().join(format!("cw-doc-fwrite-{}", std::process::id()));
    /// rt.block_on(|| {
    ///     let f = corewise::fs::File::create(&p).unwrap();
    ///     assert_eq!(f.write(b"abc").unwrap(), 3);
    ///     assert_eq!(f.write(b"def").unwrap(), 3); // after the first
    /// })
    /// .unwrap();
    /// assert_eq!(std::fs::read(&p).unwrap(), b"abcdef");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if self.pollable {
            return self.write_vectored(&[IoSlice::new(buf)]);
        }
        let kind = Kind::Write {
            fd: self.as_raw_fd(),
            buf: buf.as_ptr(),
            len: buf.len(),
            off: None,
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.write(kind) }
    }

    /// Reads at `offset` without moving the file position.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-readat-{}", std::process::id()));
    /// std::fs::write(&p, b"0123456789").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// let mut buf = [0u8; 3];
    /// assert_eq!(f.read_at(&mut buf, 7).unwrap(), 3);
    /// assert_eq!(&buf, b"789");
    /// assert_eq!(f.read_at(&mut buf, 10).unwrap(), 0); // at the end
    /// assert_eq!(f.read(&mut buf).unwrap(), 3); // the position did not move
    /// assert_eq!(&buf, b"012");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let kind = Kind::Read {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            off: Some(offset),
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.read(kind) }
    }

    /// Writes at `offset` without moving the file position.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-writeat-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// assert_eq!(f.write_at(b"world", 6).unwrap(), 5);
    /// assert_eq!(f.write_at(b"hello ", 0).unwrap(), 6);
    /// assert_eq!(std::fs::read(&p).unwrap(), b"hello world");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<usize> {
        let kind = Kind::Write {
            fd: self.as_raw_fd(),
            buf: buf.as_ptr(),
            len: buf.len(),
            off: Some(offset),
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.write(kind) }
    }

    /// Reads exactly `buf.len()` bytes at `offset`.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-readexact-{}", std::process::id()));
    /// std::fs::write(&p, b"header:body").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// let mut body = [0u8; 4];
    /// f.read_exact_at(&mut body, 7).unwrap();
    /// assert_eq!(&body, b"body");
    /// let err = f.read_exact_at(&mut body, 9).unwrap_err(); // only 2 bytes there
    /// assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn read_exact_at(&self, mut buf: &mut [u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.read_at(buf, offset)? {
                0 => return Err(io::ErrorKind::UnexpectedEof.into()),
                n => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Writes all of `buf` at `offset`.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-writeall-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// let block = vec![7u8; 100_000];
    /// f.write_all_at(&block, 4096).unwrap();
    /// assert_eq!(f.metadata().unwrap().len(), 4096 + 100_000);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn write_all_at(&self, mut buf: &[u8], mut offset: u64) -> io::Result<()> {
        while !buf.is_empty() {
            match self.write_at(buf, offset)? {
                0 => return Err(io::ErrorKind::WriteZero.into()),
                n => {
                    buf = &buf[n..];
                    offset += n as u64;
                }
            }
        }
        Ok(())
    }

    /// Scatter read at the file position.
    ///
    /// ```
    /// use std::io::IoSliceMut;
    /// let p = std::env::temp_dir().join(format!("cw-doc-readv-{}", std::process::id()));
    /// std::fs::write(&p, b"headbody").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// let (mut head, mut body) = ([0u8; 4], [0u8; 4]);
    /// let n = f.read_vectored(&mut [IoSliceMut::new(&mut head), IoSliceMut::new(&mut body)]).unwrap();
    /// assert_eq!((n, &head, &body), (8, b"head", b"body"));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.state
            .read_vectored(self.as_raw_fd(), bufs, self.pollable)
    }

    /// Gather write at the file position.
    ///
    /// ```
    /// use std::io::IoSlice;
    /// let p = std::env::temp_dir().join(format!("cw-doc-writev-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// let n = f.write_vectored(&[IoSlice::new(b"key="), IoSlice::new(b"value")]).unwrap();
    /// assert_eq!(n, 9);
    /// assert_eq!(std::fs::read(&p).unwrap(), b"key=value");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.state
            .write_vectored(self.as_raw_fd(), bufs, self.pollable)
    }

    /// Flushes data and metadata to the device (`fsync`).
    ///
    /// ```
    /// let rt = corewise::Runtime::new().unwrap();
    /// let p = std::env::temp_dir().join(format!("cw-doc-syncall-{}", std::process::id()));
    /// rt.block_on(|| {
    ///     let f = corewise::fs::File::create(&p).unwrap();
    ///     f.write(b"durable").unwrap();
    ///     f.sync_all().unwrap(); // data and metadata on the device
    /// })
    /// .unwrap();
    /// assert_eq!(std::fs::read(&p).unwrap(), b"durable");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn sync_all(&self) -> io::Result<()> {
        let kind = Kind::Fsync {
            fd: self.as_raw_fd(),
            data_only: false,
        };
        // SAFETY: no pointers.
        unsafe { self.state.write(kind) }.map(drop)
    }

    /// Flushes data to the device (`fdatasync`).
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-syncdata-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// f.write_all_at(b"record", 0).unwrap();
    /// f.sync_data().unwrap(); // the data, without metadata such as the mtime
    /// assert_eq!(std::fs::read(&p).unwrap(), b"record");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn sync_data(&self) -> io::Result<()> {
        let kind = Kind::Fsync {
            fd: self.as_raw_fd(),
            data_only: true,
        };
        // SAFETY: no pointers.
        unsafe { self.state.write(kind) }.map(drop)
    }

    /// The file's metadata (`fstat`).
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-fmeta-{}", std::process::id()));
    /// std::fs::write(&p, b"12345").unwrap();
    /// let m = corewise::fs::File::open(&p).unwrap().metadata().unwrap();
    /// assert!(m.is_file());
    /// assert_eq!(m.len(), 5);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }

    /// Truncates or extends the file (`ftruncate`).
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-setlen-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// f.write(b"0123456789").unwrap();
    /// f.set_len(4).unwrap();
    /// assert_eq!(std::fs::read(&p).unwrap(), b"0123");
    /// f.set_len(6).unwrap(); // extended with zeros
    /// assert_eq!(std::fs::read(&p).unwrap(), b"0123\0\0");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        self.file.set_len(size)
    }

    /// Timeout of each read (applies where the kernel can wait: a FIFO or a
    /// socket opened as a file, on every back end and on OS threads; a
    /// regular file's data is there, so its reads do not wait).
    ///
    /// ```
    /// use std::time::Duration;
    /// let p = std::env::temp_dir().join(format!("cw-doc-timeout-{}", std::process::id()));
    /// std::fs::write(&p, b"data").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// f.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    /// // A regular file's data is there: the read does not wait for it.
    /// assert_eq!(f.read(&mut [0u8; 4]).unwrap(), 4);
    /// let zero = f.set_read_timeout(Some(Duration::ZERO)).unwrap_err();
    /// assert_eq!(zero.kind(), std::io::ErrorKind::InvalidInput);
    /// f.set_read_timeout(None).unwrap(); // no timeout
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn set_read_timeout(&self, d: Option<std::time::Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// A handle that cancels this file's blocking calls.
    ///
    /// ```
    /// let p = std::env::temp_dir().join(format!("cw-doc-fcancel-{}", std::process::id()));
    /// std::fs::write(&p, b"data").unwrap();
    /// let f = corewise::fs::File::open(&p).unwrap();
    /// let c = f.canceller();
    /// assert_eq!(f.read(&mut [0u8; 2]).unwrap(), 2);
    /// c.cancel(); // from any thread; later calls fail too
    /// let err = f.read(&mut [0u8; 2]).unwrap_err();
    /// assert!(corewise::io::is_cancelled(&err));
    /// let err = f.read_at(&mut [0u8; 2], 0).unwrap_err();
    /// assert!(corewise::io::is_cancelled(&err));
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
    }

    /// A second handle to the same open file (a `dup`, as
    /// [`std::fs::File::try_clone`]): it shares the file position and
    /// flags, and has its own read timeout and canceller.
    ///
    /// ```
    /// use std::io::{Read, Seek, SeekFrom, Write};
    /// let p = std::env::temp_dir().join(format!("cw-doc-fclone-{}", std::process::id()));
    /// let mut f = corewise::fs::File::options().read(true).write(true).create(true).truncate(true).open(&p).unwrap();
    /// let mut g = f.try_clone().unwrap();
    /// f.write_all(b"shared").unwrap();
    /// g.seek(SeekFrom::Start(0)).unwrap(); // one position for both
    /// let mut s = String::new();
    /// f.read_to_string(&mut s).unwrap();
    /// assert_eq!(s, "shared");
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn try_clone(&self) -> io::Result<File> {
        Ok(File {
            file: self.file.try_clone()?,
            state: IoState::default(),
            pollable: self.pollable,
        })
    }

    /// Changes the file's permissions (`fchmod`), as
    /// [`std::fs::File::set_permissions`].
    ///
    /// ```
    /// use std::os::unix::fs::PermissionsExt;
    /// let p = std::env::temp_dir().join(format!("cw-doc-fperm-{}", std::process::id()));
    /// let f = corewise::fs::File::create(&p).unwrap();
    /// f.set_permissions(std::fs::Permissions::from_mode(0o600)).unwrap();
    /// assert_eq!(f.metadata().unwrap().permissions().mode() & 0o777, 0o600);
    /// std::fs::remove_file(&p).unwrap();
    /// ```
    pub fn set_permissions(&self, perm: std::fs::Permissions) -> io::Result<()> {
        self.file.set_permissions(perm)
    }
}

/// Adopts a std file: a FIFO or socket becomes non-blocking and is waited
/// on like one opened here, so a read blocks only the calling thread.
///
/// ```
/// let p = std::env::temp_dir().join(format!("cw-doc-fadopt-{}", std::process::id()));
/// std::fs::write(&p, b"adopted").unwrap();
/// let f: corewise::fs::File = std::fs::File::open(&p).unwrap().into();
/// let mut buf = [0u8; 7];
/// f.read_exact_at(&mut buf, 0).unwrap();
/// assert_eq!(&buf, b"adopted");
/// std::fs::remove_file(&p).unwrap();
/// ```
impl From<std::fs::File> for File {
    fn from(file: std::fs::File) -> Self {
        // A FIFO whose flags cannot be read or set is run as a regular
        // file's calls are (they then block as std's would).
        let pollable = make_pollable(&file).unwrap_or(false);
        File {
            file,
            state: IoState::default(),
            pollable,
        }
    }
}

/// Whether `file` is a FIFO or a socket, made non-blocking if so.
fn make_pollable(file: &std::fs::File) -> io::Result<bool> {
    let mode = rustix::fs::fstat(file)?.st_mode;
    let pollable = matches!(
        rustix::fs::FileType::from_raw_mode(mode),
        rustix::fs::FileType::Fifo | rustix::fs::FileType::Socket
    );
    if pollable {
        let flags = rustix::fs::fcntl_getfl(file)?;
        rustix::fs::fcntl_setfl(file, flags | rustix::fs::OFlags::NONBLOCK)?;
    }
    Ok(pollable)
}

/// Gives the std file back (a FIFO or socket stays non-blocking, as a
/// socket given back does).
///
/// ```
/// let p = std::env::temp_dir().join(format!("cw-doc-fback-{}", std::process::id()));
/// let f = corewise::fs::File::create(&p).unwrap();
/// let std_file: std::fs::File = f.into();
/// assert!(std_file.metadata().unwrap().is_file());
/// std::fs::remove_file(&p).unwrap();
/// ```
impl From<File> for std::fs::File {
    fn from(f: File) -> Self {
        f.file
    }
}

impl Read for File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf)
    }
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        File::read_vectored(self, bufs)
    }
}

impl Read for &File {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        File::read(self, buf)
    }
}

impl Write for File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        File::write_vectored(self, bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for &File {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        File::write(self, buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Seek for File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        self.file.seek(pos)
    }
}

impl Seek for &File {
    fn seek(&mut self, pos: SeekFrom) -> io::Result<u64> {
        (&self.file).seek(pos)
    }
}

impl AsRawFd for File {
    fn as_raw_fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }
}

impl AsFd for File {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// The whole file at `path`, as `std::fs::read`.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let p = std::env::temp_dir().join(format!("cw-doc-read-{}", std::process::id()));
/// std::fs::write(&p, b"bytes").unwrap();
/// let got = rt.block_on({
///     let p = p.clone();
///     move || corewise::fs::read(&p)
/// }).unwrap();
/// assert_eq!(got.unwrap(), b"bytes");
/// std::fs::remove_file(&p).unwrap();
/// ```
pub fn read(path: impl AsRef<Path>) -> io::Result<Vec<u8>> {
    /// The first read's size when the file reports none (procfs, pipes).
    const FIRST: usize = 8 << 10;
    let file = File::open(path)?;
    let hint = file.metadata().map(|m| m.len() as usize).unwrap_or(0);
    // One more than the size, so the end shows in the first read's result
    // when the size was right; the next read (0 bytes) confirms it.
    let mut buf = vec![0u8; if hint == 0 { FIRST } else { hint + 1 }];
    let mut len = 0;
    loop {
        if len == buf.len() {
            buf.resize(2 * buf.len(), 0);
        }
        match file.read(&mut buf[len..]) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(len);
    Ok(buf)
}

/// The whole file at `path` as a string, as `std::fs::read_to_string`
/// (`InvalidData` if it is not UTF-8).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let p = std::env::temp_dir().join(format!("cw-doc-rts-{}", std::process::id()));
/// std::fs::write(&p, "text").unwrap();
/// let got = rt.block_on({
///     let p = p.clone();
///     move || corewise::fs::read_to_string(&p)
/// }).unwrap();
/// assert_eq!(got.unwrap(), "text");
/// std::fs::remove_file(&p).unwrap();
/// ```
pub fn read_to_string(path: impl AsRef<Path>) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

/// Writes `contents` as the whole file at `path`, creating or truncating
/// it, as `std::fs::write`.
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let p = std::env::temp_dir().join(format!("cw-doc-write-{}", std::process::id()));
/// rt.block_on({
///     let p = p.clone();
///     move || corewise::fs::write(&p, "written")
/// }).unwrap().unwrap();
/// assert_eq!(std::fs::read_to_string(&p).unwrap(), "written");
/// std::fs::remove_file(&p).unwrap();
/// ```
pub fn write(path: impl AsRef<Path>, contents: impl AsRef<[u8]>) -> io::Result<()> {
    File::create(path)?.write_all(contents.as_ref())
}

/// The metadata of `path`, following symbolic links, as
/// `std::fs::metadata` (on a syscall thread from a user thread; see the
/// module docs).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let dir = std::env::temp_dir();
/// let m = rt.block_on(move || corewise::fs::metadata(dir)).unwrap().unwrap();
/// assert!(m.is_dir());
/// ```
pub fn metadata(path: impl AsRef<Path>) -> io::Result<std::fs::Metadata> {
    let path = path.as_ref();
    crate::blocking::off_core(move || std::fs::metadata(path))
}

/// Creates `path` and every missing parent, as `std::fs::create_dir_all`
/// (on a syscall thread from a user thread).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let top = std::env::temp_dir().join(format!("cw-doc-mkdir-{}", std::process::id()));
/// let deep = top.join("a/b/c");
/// rt.block_on({
///     let deep = deep.clone();
///     move || corewise::fs::create_dir_all(&deep)
/// }).unwrap().unwrap();
/// assert!(deep.is_dir());
/// std::fs::remove_dir_all(&top).unwrap();
/// ```
pub fn create_dir_all(path: impl AsRef<Path>) -> io::Result<()> {
    let path = path.as_ref();
    crate::blocking::off_core(move || std::fs::create_dir_all(path))
}

/// The entries of the directory at `path`, as `std::fs::read_dir`
/// (without `.` and `..`, in no particular order).
///
/// ```
/// let rt = corewise::Runtime::new().unwrap();
/// let dir = std::env::temp_dir().join(format!("cw-doc-readdir-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// std::fs::write(dir.join("x"), b"").unwrap();
/// let names = rt.block_on({
///     let dir = dir.clone();
///     move || -> std::io::Result<Vec<_>> {
///         corewise::fs::read_dir(&dir)?.map(|e| Ok(e?.file_name())).collect()
///     }
/// }).unwrap().unwrap();
/// assert_eq!(names, ["x"]);
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn read_dir(path: impl AsRef<Path>) -> io::Result<ReadDir> {
    let path = path.as_ref();
    let dir = crate::blocking::off_core(move || std::fs::read_dir(path))?;
    Ok(ReadDir {
        dir: Some(dir),
        batch: Vec::new().into_iter(),
    })
}

/// The iterator [`read_dir`] returns: std's entries, fetched
/// [`ReadDir::BATCH`] at a time on a syscall thread (from a user thread).
///
/// ```
/// let dir = std::env::temp_dir().join(format!("cw-doc-rd-{}", std::process::id()));
/// std::fs::create_dir_all(dir.join("sub")).unwrap();
/// let mut entries = corewise::fs::read_dir(&dir).unwrap();
/// let e = entries.next().unwrap().unwrap();
/// assert_eq!(e.path(), dir.join("sub"));
/// assert!(entries.next().is_none());
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
#[derive(Debug)]
pub struct ReadDir {
    /// `None` once std's iterator has ended.
    dir: Option<std::fs::ReadDir>,
    batch: std::vec::IntoIter<io::Result<std::fs::DirEntry>>,
}

impl ReadDir {
    /// Entries fetched per hand-off to a syscall thread.
    ///
    /// ```
    /// assert!(corewise::fs::ReadDir::BATCH > 1);
    /// ```
    pub const BATCH: usize = 64;
}

impl Iterator for ReadDir {
    type Item = io::Result<std::fs::DirEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.batch.next() {
            return Some(e);
        }
        let dir = self.dir.as_mut()?;
        let batch: Vec<_> =
            crate::blocking::off_core(move || dir.by_ref().take(Self::BATCH).collect());
        if batch.len() < Self::BATCH {
            self.dir = None;
        }
        self.batch = batch.into_iter();
        self.batch.next()
    }
}

impl std::iter::FusedIterator for ReadDir {}
