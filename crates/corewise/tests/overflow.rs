//! A user thread that overflows its stack is named in a clear message (and
//! the process aborts, as std does for OS threads), not a bare SIGSEGV.

use std::process::Command;

/// Recurses until the stack overflows (on purpose).
#[inline(never)]
#[allow(unconditional_recursion)]
fn recurse(depth: u64, buf: &mut [u8; 1024]) -> u64 {
    let mut local = [0u8; 1024];
    local[depth as usize % 1024] = buf[0].wrapping_add(1);
    std::hint::black_box(&mut local);
    recurse(depth + 1, &mut local) + local[3] as u64
}

#[test]
fn overflow_child() {
    if std::env::var_os("COREWISE_OVERFLOW_CHILD").is_none() {
        return;
    }
    let rt = corewise::Runtime::builder()
        .stack_size(64 * 1024)
        .build()
        .unwrap();
    let h = corewise::thread::Builder::new()
        .name("deep-recursion")
        .spawn_in(&rt, || recurse(0, &mut [0; 1024]))
        .unwrap();
    let _ = h.join();
}

#[test]
fn stack_overflow_names_the_user_thread() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "overflow_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COREWISE_OVERFLOW_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("user thread 'deep-recursion'")
            && stderr.contains("overflowed its stack of 64 KiB"),
        "stderr was: {stderr}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}", out.status);
}

/// Overflows a named thread while 10 000 others are parked, so its stack is
/// far beyond the first few thousand (a fixed table used to name only
/// 8 192 stacks).
#[test]
fn overflow_among_many_child() {
    if std::env::var_os("COREWISE_OVERFLOW_MANY_CHILD").is_none() {
        return;
    }
    let rt = corewise::Runtime::builder()
        .stack_size(64 * 1024)
        .build()
        .unwrap();
    let gate = std::sync::Arc::new((
        corewise::sync::Mutex::new(false),
        corewise::sync::Condvar::new(),
    ));
    let parked = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let _waiters: Vec<_> = (0..10_000)
        .map(|_| {
            let (gate, parked) = (gate.clone(), parked.clone());
            rt.spawn(move || {
                let mut open = gate.0.lock();
                parked.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                while !*open {
                    open = gate.1.wait(open);
                }
            })
            .unwrap()
        })
        .collect();
    while parked.load(std::sync::atomic::Ordering::Relaxed) < 10_000 {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let h = corewise::thread::Builder::new()
        .name("deep-recursion-10001")
        .spawn_in(&rt, || recurse(0, &mut [0; 1024]))
        .unwrap();
    let _ = h.join();
}

#[test]
fn stack_overflow_beyond_ten_thousand_threads_names_the_thread() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "overflow_among_many_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COREWISE_OVERFLOW_MANY_CHILD", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("user thread 'deep-recursion-10001'")
            && stderr.contains("overflowed its stack of 64 KiB"),
        "stderr was: {stderr}"
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGABRT), "{:?}", out.status);
}

#[test]
fn panic_child() {
    if std::env::var_os("COREWISE_PANIC_CHILD").is_none() {
        return;
    }
    let rt = corewise::Runtime::new().unwrap();
    let h = corewise::thread::Builder::new()
        .name("worker-7")
        .spawn_in(&rt, || -> u32 { panic!("boom in a user thread") })
        .unwrap();
    assert!(h.join().is_err());
}

#[test]
fn a_panic_names_the_user_thread() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--exact", "panic_child", "--nocapture", "--test-threads=1"])
        .env("COREWISE_PANIC_CHILD", "1")
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stderr was: {stderr}");
    assert!(
        stderr.contains("thread 'worker-7' (corewise user thread")
            && stderr.contains("boom in a user thread")
            && !stderr.contains("thread 'corewise-core-"),
        "stderr was: {stderr}"
    );
}

#[test]
fn limited_address_space_child() {
    if std::env::var_os("COREWISE_ULIMIT_CHILD").is_none() {
        return;
    }
    // 1 GiB of address space in all: a whole stack chunk does not fit.
    let limit = libc::rlimit {
        rlim_cur: 1 << 30,
        rlim_max: 1 << 30,
    };
    // SAFETY: setrlimit with a valid struct; lowering a limit is allowed.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &limit) }, 0);
    let rt = corewise::Runtime::builder()
        .min_cores(1)
        .max_cores(1)
        .neighbour_awareness(None)
        .build()
        .unwrap();
    let hs: Vec<_> = (0..200).map(|i| rt.spawn(move || i).unwrap()).collect();
    let sum: usize = hs.into_iter().map(|h| h.join().unwrap()).sum();
    assert_eq!(sum, 199 * 200 / 2);
    // Far beyond what fits: a clear error, not a crash.
    let mut failed = None;
    let mut held = Vec::new();
    let gate = std::sync::Arc::new(corewise::sync::Semaphore::new(0));
    for _ in 0..100_000 {
        let g = gate.clone();
        match rt.spawn(move || g.acquire()) {
            Ok(h) => held.push(h),
            Err(e) => {
                failed = Some(e.to_string());
                break;
            }
        }
    }
    for _ in 0..held.len() {
        gate.release();
    }
    for h in held {
        h.join().unwrap();
    }
    println!("RESULT {}", failed.unwrap_or_default());
}

#[test]
fn stacks_fit_a_limited_address_space_and_say_so_when_they_do_not() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args([
            "--exact",
            "limited_address_space_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("COREWISE_ULIMIT_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("RESULT") && stdout.contains("stack"),
        "a spawn beyond the address space must fail with a stack error: {stdout}"
    );
}
