//! The `std::fs` helpers of `corewise::fs` on real files in a temporary
//! directory (and a FIFO, whose size says nothing), from user threads on
//! each I/O back end and from an OS thread.

use corewise::io::IoBackend;
use corewise::Runtime;
use std::collections::BTreeSet;
use std::io::ErrorKind;
use std::path::{Path, PathBuf};

const BACKENDS: [IoBackend; 2] = [IoBackend::Uring, IoBackend::Epoll];

fn rt(b: IoBackend) -> Runtime {
    Runtime::builder().io_backend(b).build().unwrap()
}

/// A fresh directory, removed (with everything in it) on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("corewise-fs-{}-{tag}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir(&p).unwrap();
        Self(p)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `f` on a user thread of a runtime with back end `b`.
fn on_user_thread<T: Send + 'static>(b: IoBackend, f: impl FnOnce() -> T + Send + 'static) -> T {
    let rt = rt(b);
    rt.block_on(move || {
        assert!(corewise::current().is_some());
        f()
    })
    .unwrap()
}

/// Contents whose every byte depends on its position.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn write_then_read_any_size() {
    for b in BACKENDS {
        let dir = TempDir::new("rw");
        let p = dir.path().to_path_buf();
        on_user_thread(b, move || {
            for len in [0, 1, 8191, 8192, 8193, (1 << 20) + 3] {
                let f = p.join(format!("f{len}"));
                let data = pattern(len);
                corewise::fs::write(&f, &data).unwrap();
                assert_eq!(std::fs::read(&f).unwrap(), data, "write, {len} bytes");
                assert_eq!(corewise::fs::read(&f).unwrap(), data, "read, {len} bytes");
            }
            // `write` truncates what was there.
            let f = p.join("f8193");
            corewise::fs::write(&f, "short").unwrap();
            assert_eq!(corewise::fs::read_to_string(&f).unwrap(), "short");
        });
    }
}

#[test]
fn read_to_string_wants_utf8() {
    for b in BACKENDS {
        let dir = TempDir::new("utf8");
        let p = dir.path().join("bad");
        std::fs::write(&p, [b'o', b'k', 0xff, 0xfe]).unwrap();
        let e = on_user_thread(b, move || corewise::fs::read_to_string(&p).unwrap_err());
        assert_eq!(e.kind(), ErrorKind::InvalidData, "{b}");
    }
}

/// A FIFO reports size 0 and is filled while it is read: `read` grows its
/// buffer until the writer closes.
#[test]
fn read_a_fifo_to_its_end() {
    for b in BACKENDS {
        let dir = TempDir::new("fifo");
        let p = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &p, rustix::fs::Mode::from_raw_mode(0o600)).unwrap();
        let data = pattern(100_000);
        let writer = {
            let (p, data) = (p.clone(), data.clone());
            std::thread::spawn(move || std::fs::write(&p, &data).unwrap())
        };
        let got = on_user_thread(b, move || corewise::fs::read(&p).unwrap());
        writer.join().unwrap();
        assert_eq!(got.len(), data.len(), "{b}");
        assert!(got == data, "{b}: contents differ");
    }
}

#[test]
fn missing_paths_are_not_found() {
    for b in BACKENDS {
        let dir = TempDir::new("missing");
        let p = dir.path().join("nothing");
        let kinds = on_user_thread(b, move || {
            [
                corewise::fs::read(&p).unwrap_err().kind(),
                corewise::fs::read_to_string(&p).unwrap_err().kind(),
                corewise::fs::metadata(&p).unwrap_err().kind(),
                corewise::fs::read_dir(&p).unwrap_err().kind(),
                corewise::fs::write(p.join("below"), "x")
                    .unwrap_err()
                    .kind(),
            ]
        });
        assert_eq!(kinds, [ErrorKind::NotFound; 5], "{b}");
    }
}

#[test]
fn metadata_and_create_dir_all() {
    for b in BACKENDS {
        let dir = TempDir::new("meta");
        let top = dir.path().to_path_buf();
        on_user_thread(b, move || {
            let deep = top.join("a").join("b").join("c");
            corewise::fs::create_dir_all(&deep).unwrap();
            assert!(corewise::fs::metadata(&deep).unwrap().is_dir());
            // Again: nothing to do, no error.
            corewise::fs::create_dir_all(&deep).unwrap();
            let f = deep.join("file");
            corewise::fs::write(&f, pattern(4242)).unwrap();
            let m = corewise::fs::metadata(&f).unwrap();
            assert!(m.is_file());
            assert_eq!(m.len(), 4242);
            // A file in the way.
            let e = corewise::fs::create_dir_all(f.join("sub")).unwrap_err();
            assert_ne!(e.kind(), ErrorKind::NotFound);
        });
    }
}

/// More entries than one batch, twice over: every name once, then the
/// end, which stays the end.
#[test]
fn read_dir_lists_every_entry() {
    let n = 2 * corewise::fs::ReadDir::BATCH + 7;
    for b in BACKENDS {
        let dir = TempDir::new("list");
        let want: BTreeSet<String> = (0..n).map(|i| format!("e{i}")).collect();
        for name in &want {
            std::fs::write(dir.path().join(name), name).unwrap();
        }
        std::fs::create_dir(dir.path().join("subdir")).unwrap();
        let p = dir.path().to_path_buf();
        let (names, dirs, after_end) = on_user_thread(b, move || {
            let mut it = corewise::fs::read_dir(&p).unwrap();
            let mut names = BTreeSet::new();
            let mut dirs = 0;
            for e in it.by_ref() {
                let e = e.unwrap();
                assert_eq!(e.path(), p.join(e.file_name()));
                if e.file_type().unwrap().is_dir() {
                    dirs += 1;
                } else {
                    assert!(names.insert(e.file_name().into_string().unwrap()));
                }
            }
            (names, dirs, it.next().is_none())
        });
        assert_eq!(names, want, "{b}");
        assert_eq!(dirs, 1, "{b}");
        assert!(after_end, "{b}");
    }
}

/// Outside a runtime the helpers are plain std calls.
#[test]
fn helpers_work_on_os_threads() {
    assert!(corewise::current().is_none());
    let dir = TempDir::new("os");
    let sub = dir.path().join("x").join("y");
    corewise::fs::create_dir_all(&sub).unwrap();
    corewise::fs::write(sub.join("f"), "os").unwrap();
    assert_eq!(corewise::fs::read_to_string(sub.join("f")).unwrap(), "os");
    assert_eq!(corewise::fs::metadata(sub.join("f")).unwrap().len(), 2);
    let names: Vec<_> = corewise::fs::read_dir(&sub)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["f"]);
}
