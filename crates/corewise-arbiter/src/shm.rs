//! The shared page: written only by the daemon, read by the application.
//!
//! Why shared memory: the runtime checks "must I give this core back?" on
//! every pass of its dispatcher, so that check must be a plain memory load, not
//! a system call. The daemon creates one sealed memfd per application, maps it
//! read-write itself and passes it with SCM_RIGHTS; the seal
//! `F_SEAL_FUTURE_WRITE` means the client can only ever map it read-only.
//!
//! Layout (two pages, all fields atomics, native endianness):
//! magic, version, shutdown flag, preempted count, granted count, release
//! count, a change sequence number, a bitmask of granted cores, a bitmask of
//! cores the application is asked to release (up to [`MAX_CPUS`]), and per
//! core the id of the application's kernel thread holding it. The last field
//! lets a thread whose core was taken by force notice it with a load, too.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{fcntl_add_seals, ftruncate, memfd_create, MemfdFlags, SealFlags};
use rustix::mm::{mmap, munmap, MapFlags, ProtFlags};
use thiserror::Error;

/// Largest CPU number + 1 the shared page can describe.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter, MAX_CPUS};
/// let w = SharedPageWriter::create().unwrap();
/// let r = SharedPageReader::map(w.fd()).unwrap();
/// w.set_granted(MAX_CPUS as u32 - 1, 7);
/// w.set_granted(MAX_CPUS as u32, 7); // beyond the page: ignored
/// assert_eq!(r.granted_cores(), vec![MAX_CPUS as u32 - 1]);
/// ```
pub const MAX_CPUS: usize = 1024;
const WORDS: usize = MAX_CPUS / 64;
/// Magic value in the first word of a valid page.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, ShmError, PAGE_MAGIC};
/// // A page of zeros lacks the magic: refused.
/// let f = std::fs::File::from(rustix::fs::memfd_create("blank", rustix::fs::MemfdFlags::CLOEXEC)?);
/// f.set_len(8192)?;
/// assert!(matches!(SharedPageReader::map(std::os::fd::AsFd::as_fd(&f)), Err(ShmError::BadPage)));
/// assert_eq!(&PAGE_MAGIC.to_be_bytes(), b"CWSH");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const PAGE_MAGIC: u32 = 0x4357_5348; // "CWSH"
/// Layout version of the page.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter, PAGE_MAGIC, PAGE_VERSION};
/// // The second word of a page is its layout version.
/// let w = SharedPageWriter::create().unwrap();
/// let mut head = [0u8; 8];
/// rustix::io::pread(w.fd(), &mut head, 0)?;
/// assert_eq!(head[..4], PAGE_MAGIC.to_ne_bytes());
/// assert_eq!(head[4..], PAGE_VERSION.to_ne_bytes());
/// assert!(SharedPageReader::map(w.fd()).is_ok());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub const PAGE_VERSION: u32 = 1;
const PAGE_LEN: usize = 8192;

#[repr(C)]
struct Layout {
    magic: AtomicU32,
    version: AtomicU32,
    shutdown: AtomicU32,
    preempted: AtomicU32,
    granted_count: AtomicU32,
    release_count: AtomicU32,
    seq: AtomicU64,
    granted: [AtomicU64; WORDS],
    release: [AtomicU64; WORDS],
    holder: [AtomicU32; MAX_CPUS],
}

const _: () = assert!(std::mem::size_of::<Layout>() <= PAGE_LEN);

/// Errors creating or mapping the shared page.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, ShmError};
/// // A file shorter than a page is not a shared page.
/// let path = std::env::temp_dir().join(format!("shm-doc-{}", std::process::id()));
/// let f = std::fs::File::create(&path)?;
/// let r = SharedPageReader::map(std::os::fd::AsFd::as_fd(&f));
/// assert!(matches!(r, Err(ShmError::BadPage)));
/// std::fs::remove_file(&path)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug, Error)]
pub enum ShmError {
    /// A system call failed.
    #[error("shared page: {op}: {source}")]
    Sys {
        /// What was being done.
        op: &'static str,
        /// The OS error.
        source: rustix::io::Errno,
    },
    /// The page does not carry the expected magic/version.
    #[error("shared page has wrong magic or version")]
    BadPage,
}

fn sys(op: &'static str) -> impl FnOnce(rustix::io::Errno) -> ShmError {
    move |source| ShmError::Sys { op, source }
}

/// A mapping of the page; unmapped on drop.
struct Mapping {
    ptr: NonNull<Layout>,
}

// SAFETY: the mapping is only accessed through atomics, which are safe to
// share between threads; the pointer stays valid until drop.
unsafe impl Send for Mapping {}
// SAFETY: as above; all access is through `&AtomicXX`.
unsafe impl Sync for Mapping {}

impl Mapping {
    fn new(fd: BorrowedFd<'_>, prot: ProtFlags) -> Result<Self, ShmError> {
        // SAFETY: we map a fresh region chosen by the kernel (null hint), so
        // no existing Rust object is overwritten; the fd is a memfd at least
        // PAGE_LEN long (checked by the callers via ftruncate / fstat).
        let p = unsafe {
            mmap(
                std::ptr::null_mut(),
                PAGE_LEN,
                prot,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(sys("mmap"))?;
        let ptr = NonNull::new(p.cast::<Layout>()).ok_or(ShmError::BadPage)?;
        Ok(Self { ptr })
    }

    fn layout(&self) -> &Layout {
        // SAFETY: the mapping is PAGE_LEN bytes, page aligned, at least the
        // size of Layout (static assertion above), lives as long as self, and
        // every field is an atomic so shared references are sound even though
        // another process writes concurrently.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; no references into
        // the mapping outlive self (they borrow self).
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), PAGE_LEN) };
    }
}

fn set_bit(words: &[AtomicU64; WORDS], cpu: u32, on: bool) {
    let (w, b) = ((cpu as usize) / 64, cpu % 64);
    if let Some(word) = words.get(w) {
        if on {
            word.fetch_or(1 << b, Ordering::Release);
        } else {
            word.fetch_and(!(1 << b), Ordering::Release);
        }
    }
}

fn get_bit(words: &[AtomicU64; WORDS], cpu: u32) -> bool {
    let (w, b) = ((cpu as usize) / 64, cpu % 64);
    words
        .get(w)
        .is_some_and(|word| word.load(Ordering::Acquire) & (1 << b) != 0)
}

fn bits(words: &[AtomicU64; WORDS]) -> Vec<u32> {
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        let mut v = w.load(Ordering::Acquire);
        while v != 0 {
            let b = v.trailing_zeros();
            out.push(i as u32 * 64 + b);
            v &= v - 1;
        }
    }
    out
}

/// The daemon's writable view of one application's page.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
/// let w = SharedPageWriter::create().unwrap();
/// w.set_granted(3, 1234);
/// let r = SharedPageReader::map(w.fd()).unwrap();
/// assert!(!r.must_release(3, 1234));
/// w.set_release(3, true);
/// assert_eq!(r.granted_cores(), vec![3]);
/// assert!(r.must_release(3, 1234));
/// assert_eq!(r.core_to_release(), Some(3));
/// ```
pub struct SharedPageWriter {
    fd: OwnedFd,
    map: Mapping,
}

impl SharedPageWriter {
    /// Creates a sealed memfd, maps it read-write and initialises it.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// assert_eq!((r.granted_count(), r.release_count(), r.shutdown()), (0, 0, false));
    /// ```
    pub fn create() -> Result<Self, ShmError> {
        let fd = memfd_create(
            "corewise-arbiter",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(sys("memfd_create"))?;
        ftruncate(&fd, PAGE_LEN as u64).map_err(sys("ftruncate"))?;
        let map = Mapping::new(fd.as_fd(), ProtFlags::READ | ProtFlags::WRITE)?;
        // After this only read-only mappings can be made (our own writable
        // one stays), and the size is fixed so a client can't SIGBUS us.
        fcntl_add_seals(
            &fd,
            SealFlags::FUTURE_WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )
        .map_err(sys("fcntl(F_ADD_SEALS)"))?;
        let l = map.layout();
        l.version.store(PAGE_VERSION, Ordering::Relaxed);
        l.magic.store(PAGE_MAGIC, Ordering::Release);
        Ok(Self { fd, map })
    }

    /// The memfd, to pass to the client.
    ///
    /// ```
    /// use corewise_arbiter::shm::SharedPageWriter;
    /// let w = SharedPageWriter::create().unwrap();
    /// // A page, sealed against writable mappings by anyone else.
    /// assert_eq!(rustix::fs::fstat(w.fd()).unwrap().st_size, 8192);
    /// assert!(rustix::fs::fcntl_get_seals(w.fd()).unwrap().contains(rustix::fs::SealFlags::FUTURE_WRITE));
    /// ```
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    fn bump(&self) {
        self.map.layout().seq.fetch_add(1, Ordering::Release);
    }

    /// Marks `cpu` as granted to the application's thread `tid` (0: not granted).
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(3, 77);
    /// assert_eq!((r.granted_cores(), r.holder(3)), (vec![3], 77));
    /// w.set_granted(3, 0);
    /// assert!(r.granted_cores().is_empty());
    /// ```
    pub fn set_granted(&self, cpu: u32, tid: u32) {
        let l = self.map.layout();
        if let Some(h) = l.holder.get(cpu as usize) {
            h.store(tid, Ordering::Release);
        }
        set_bit(&l.granted, cpu, tid != 0);
        l.granted_count
            .store(bits(&l.granted).len() as u32, Ordering::Release);
        self.bump();
    }

    /// Asks the application to release `cpu` (or withdraws the request).
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_release(6, true);
    /// assert_eq!(r.core_to_release(), Some(6));
    /// w.set_release(6, false); // withdrawn
    /// assert_eq!(r.core_to_release(), None);
    /// ```
    pub fn set_release(&self, cpu: u32, on: bool) {
        let l = self.map.layout();
        set_bit(&l.release, cpu, on);
        l.release_count
            .store(bits(&l.release).len() as u32, Ordering::Release);
        self.bump();
    }

    /// Records one more forced preemption.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.add_preempted();
    /// assert_eq!(r.preempted(), 1);
    /// ```
    pub fn add_preempted(&self) {
        self.map.layout().preempted.fetch_add(1, Ordering::Release);
        self.bump();
    }

    /// Tells every kernel thread to give its core back: the daemon is exiting.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(1, 5);
    /// w.set_shutdown();
    /// // Every holder must give its core back.
    /// assert!(r.shutdown() && r.must_release(1, 5));
    /// ```
    pub fn set_shutdown(&self) {
        self.map.layout().shutdown.store(1, Ordering::Release);
        self.bump();
    }
}

/// The application's read-only view of its page.
///
/// ```
/// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
/// let w = SharedPageWriter::create().unwrap();
/// let r = SharedPageReader::map(w.fd()).unwrap();
/// w.set_granted(1, 42);
/// assert_eq!((r.granted_count(), r.holder(1)), (1, 42));
/// ```
pub struct SharedPageReader {
    map: Mapping,
}

impl SharedPageReader {
    /// Maps the page read-only and checks its magic and version.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// assert!(r.granted_cores().is_empty());
    /// assert_eq!(r.seq(), 0);
    /// ```
    pub fn map(fd: BorrowedFd<'_>) -> Result<Self, ShmError> {
        let st = rustix::fs::fstat(fd).map_err(sys("fstat"))?;
        if (st.st_size as usize) < PAGE_LEN {
            return Err(ShmError::BadPage);
        }
        let map = Mapping::new(fd, ProtFlags::READ)?;
        let l = map.layout();
        if l.magic.load(Ordering::Acquire) != PAGE_MAGIC
            || l.version.load(Ordering::Relaxed) != PAGE_VERSION
        {
            return Err(ShmError::BadPage);
        }
        Ok(Self { map })
    }

    /// Whether the thread `tid` holding `cpu` must give it back: the daemon
    /// asks for it, took it by force already, or is shutting down.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(2, 100);
    /// assert!(!r.must_release(2, 100));
    /// // Another thread of the application holds core 2 now.
    /// assert!(r.must_release(2, 101));
    /// w.set_release(2, true);
    /// assert!(r.must_release(2, 100));
    /// ```
    #[inline]
    pub fn must_release(&self, cpu: u32, tid: u32) -> bool {
        let l = self.map.layout();
        get_bit(&l.release, cpu)
            || l.holder
                .get(cpu as usize)
                .is_none_or(|h| h.load(Ordering::Acquire) != tid)
            || l.shutdown.load(Ordering::Relaxed) != 0
    }

    /// The application's thread holding `cpu` (0 if none).
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(5, 900);
    /// assert_eq!(r.holder(5), 900);
    /// assert_eq!(r.holder(6), 0);
    /// ```
    pub fn holder(&self, cpu: u32) -> u32 {
        self.map
            .layout()
            .holder
            .get(cpu as usize)
            .map_or(0, |h| h.load(Ordering::Acquire))
    }

    /// Whether the daemon announced it is shutting down.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// assert!(!r.shutdown());
    /// w.set_shutdown();
    /// assert!(r.shutdown());
    /// ```
    pub fn shutdown(&self) -> bool {
        self.map.layout().shutdown.load(Ordering::Acquire) != 0
    }

    /// One core the application is asked to release, if any.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// assert_eq!(r.core_to_release(), None);
    /// w.set_release(4, true);
    /// assert_eq!(r.core_to_release(), Some(4));
    /// ```
    pub fn core_to_release(&self) -> Option<u32> {
        bits(&self.map.layout().release).first().copied()
    }

    /// Cores currently granted to the application.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(9, 1);
    /// w.set_granted(3, 2);
    /// assert_eq!(r.granted_cores(), vec![3, 9]);
    /// ```
    pub fn granted_cores(&self) -> Vec<u32> {
        bits(&self.map.layout().granted)
    }

    /// Number of cores granted.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_granted(1, 10);
    /// w.set_granted(2, 11);
    /// w.set_granted(1, 0); // core 1 taken back
    /// assert_eq!(r.granted_count(), 1);
    /// ```
    pub fn granted_count(&self) -> u32 {
        self.map.layout().granted_count.load(Ordering::Acquire)
    }

    /// Number of cores the application is asked to release.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.set_release(1, true);
    /// w.set_release(2, true);
    /// assert_eq!(r.release_count(), 2);
    /// w.set_release(1, false);
    /// assert_eq!(r.release_count(), 1);
    /// ```
    pub fn release_count(&self) -> u32 {
        self.map.layout().release_count.load(Ordering::Acquire)
    }

    /// Number of forced preemptions so far.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// w.add_preempted();
    /// w.add_preempted();
    /// assert_eq!(r.preempted(), 2);
    /// ```
    pub fn preempted(&self) -> u32 {
        self.map.layout().preempted.load(Ordering::Acquire)
    }

    /// Change counter, incremented on every daemon update.
    ///
    /// ```
    /// use corewise_arbiter::shm::{SharedPageReader, SharedPageWriter};
    /// let w = SharedPageWriter::create().unwrap();
    /// let r = SharedPageReader::map(w.fd()).unwrap();
    /// let before = r.seq();
    /// w.set_granted(0, 1);
    /// assert!(r.seq() > before);
    /// ```
    pub fn seq(&self) -> u64 {
        self.map.layout().seq.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_cannot_map_writable() {
        let w = SharedPageWriter::create().unwrap();
        // SAFETY: fresh kernel-chosen address; we only check the error.
        let r = unsafe {
            mmap(
                std::ptr::null_mut(),
                PAGE_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                w.fd(),
                0,
            )
        };
        assert!(r.is_err(), "sealed page must not be mappable for writing");
    }

    #[test]
    fn counts_follow_bits() {
        let w = SharedPageWriter::create().unwrap();
        let r = SharedPageReader::map(w.fd()).unwrap();
        w.set_granted(1, 10);
        w.set_granted(700, 11);
        assert_eq!(r.granted_count(), 2);
        assert_eq!(r.granted_cores(), vec![1, 700]);
        w.set_granted(1, 0);
        assert_eq!(r.granted_cores(), vec![700]);
        assert!(!r.must_release(700, 11));
        // Another thread of the app now holds it: the old holder must go.
        w.set_granted(700, 12);
        assert!(r.must_release(700, 11));
        assert_eq!(r.holder(700), 12);
        w.set_shutdown();
        assert!(r.must_release(700, 12));
        w.add_preempted();
        assert_eq!(r.preempted(), 1);
        // Out-of-range CPUs are ignored, not a panic.
        w.set_granted(5000, 1);
        assert!(r.must_release(5000, 1));
    }
}
