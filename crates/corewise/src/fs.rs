//! Files whose reads and writes block the user thread, not its core.
//!
//! On the ring, file I/O is an ordinary SQE (the kernel completes it inline
//! or on its io-wq workers). Regular files cannot be polled, so on the epoll
//! back end each call runs on a syscall thread ([`crate::blocking()`]) while
//! the user thread blocks; on a plain OS thread it is the system call.
//! Metadata calls that never wait for the disk (`fstat`, `lseek`,
//! `ftruncate`) are made directly.

use crate::io::op::{self, Kind};
use crate::io::Canceller;
use crate::io::IoState;
use std::ffi::CString;
use std::io::{self, IoSlice, IoSliceMut, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

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
}

impl OpenOptions {
    /// No access, no creation.
    pub fn new() -> Self {
        Self::default()
    }
    /// Open for reading.
    pub fn read(&mut self, on: bool) -> &mut Self {
        self.read = on;
        self
    }
    /// Open for writing.
    pub fn write(&mut self, on: bool) -> &mut Self {
        self.write = on;
        self
    }
    /// Every write appends.
    pub fn append(&mut self, on: bool) -> &mut Self {
        self.append = on;
        self
    }
    /// Truncate to 0 bytes on open.
    pub fn truncate(&mut self, on: bool) -> &mut Self {
        self.truncate = on;
        self
    }
    /// Create if missing.
    pub fn create(&mut self, on: bool) -> &mut Self {
        self.create = on;
        self
    }
    /// Create, failing if it exists.
    pub fn create_new(&mut self, on: bool) -> &mut Self {
        self.create_new = on;
        self
    }
    /// Permission bits for a new file (default 0o666, less the umask).
    pub fn mode(&mut self, mode: u32) -> &mut Self {
        self.mode = Some(mode);
        self
    }

    fn flags(&self) -> io::Result<i32> {
        let access = match (self.read, self.write || self.append) {
            (true, false) => libc::O_RDONLY,
            (false, true) => libc::O_WRONLY,
            (true, true) => libc::O_RDWR,
            (false, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "open needs read, write or append access",
                ))
            }
        };
        let mut f = access | libc::O_CLOEXEC;
        if self.append {
            f |= libc::O_APPEND;
        }
        if self.truncate {
            f |= libc::O_TRUNC;
        }
        if self.create_new {
            f |= libc::O_CREAT | libc::O_EXCL;
        } else if self.create {
            f |= libc::O_CREAT;
        }
        Ok(f)
    }

    /// Opens `path` (through the ring when there is one).
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
        Ok(File {
            file,
            state: IoState::default(),
        })
    }
}

/// An open file.
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
}

impl File {
    /// Opens `path` read-only.
    pub fn open(path: impl AsRef<Path>) -> io::Result<Self> {
        OpenOptions::new().read(true).open(path)
    }

    /// Creates (or truncates) `path` for writing.
    pub fn create(path: impl AsRef<Path>) -> io::Result<Self> {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }

    /// Options for opening a file.
    pub fn options() -> OpenOptions {
        OpenOptions::new()
    }

    fn run_read(&self, kind: Kind) -> io::Result<usize> {
        let deadline = self.state.read_timeout().map(|d| Instant::now() + d);
        // SAFETY: every caller passes buffers borrowed for the whole call.
        unsafe { op::run(kind, deadline, None) }
    }

    /// Reads at the file position, advancing it.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let kind = Kind::Read {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            off: None,
        };
        // SAFETY: `buf` is borrowed for the whole call.
        unsafe { self.state.read(kind) }
    }

    /// Writes at the file position (the end, in append mode).
    pub fn write(&self, buf: &[u8]) -> io::Result<usize> {
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
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let kind = Kind::Read {
            fd: self.as_raw_fd(),
            buf: buf.as_mut_ptr(),
            len: buf.len(),
            off: Some(offset),
        };
        self.run_read(kind)
    }

    /// Writes at `offset` without moving the file position.
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
    pub fn read_vectored(&self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.state.read_vectored(self.as_raw_fd(), bufs, false)
    }

    /// Gather write at the file position.
    pub fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.state.write_vectored(self.as_raw_fd(), bufs, false)
    }

    /// Flushes data and metadata to the device (`fsync`).
    pub fn sync_all(&self) -> io::Result<()> {
        let kind = Kind::Fsync {
            fd: self.as_raw_fd(),
            data_only: false,
        };
        // SAFETY: no pointers.
        unsafe { self.state.write(kind) }.map(drop)
    }

    /// Flushes data to the device (`fdatasync`).
    pub fn sync_data(&self) -> io::Result<()> {
        let kind = Kind::Fsync {
            fd: self.as_raw_fd(),
            data_only: true,
        };
        // SAFETY: no pointers.
        unsafe { self.state.write(kind) }.map(drop)
    }

    /// The file's metadata (`fstat`).
    pub fn metadata(&self) -> io::Result<std::fs::Metadata> {
        self.file.metadata()
    }

    /// Truncates or extends the file (`ftruncate`).
    pub fn set_len(&self, size: u64) -> io::Result<()> {
        self.file.set_len(size)
    }

    /// Timeout of each read (applies where the kernel can wait, e.g. pipes).
    pub fn set_read_timeout(&self, d: Option<std::time::Duration>) -> io::Result<()> {
        self.state.set_read_timeout(d)
    }

    /// A handle that cancels this file's blocking calls.
    pub fn canceller(&self) -> Canceller {
        self.state.canceller()
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
