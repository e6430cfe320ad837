//! Smoke test of `corewise-bench core-grant` with few samples, on whichever
//! cpuset hierarchy the machine has (cgroup v1 here, cgroup v2 in the
//! guest of `scripts/guest-tests.sh`): every scenario reports its figures,
//! and the benchmark's cgroup subtree and socket are gone afterwards. Needs
//! root and a cpuset hierarchy; skipped without them.

use std::process::{Command, Stdio};

use corewise_arbiter::fence::CpusetHierarchy;

#[test]
fn core_grant_runs_small_and_cleans_up() {
    let Some(h) = CpusetHierarchy::detect() else {
        eprintln!("skipping: no cpuset hierarchy");
        return;
    };
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipping: needs root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("cw-core-grant-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join("core-grant.json");
    let child = Command::new(env!("CARGO_BIN_EXE_corewise-bench"))
        .args(["core-grant", "--samples", "20", "--json"])
        .arg(&json)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run corewise-bench");
    let pid = child.id();
    let out = child.wait_with_output().expect("wait for corewise-bench");
    // Whatever happened, the subtree named after the benchmark's process
    // and its socket must be gone.
    let subtree = h.root.join(format!("corewise-bench-{pid}"));
    let socket = std::env::temp_dir().join(format!("corewise-bench-{pid}.sock"));
    let left = (subtree.exists(), socket.exists());
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        left,
        (false, false),
        "subtree {subtree:?} / socket {socket:?} left behind"
    );
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("wake_floor"), "{table}");
    let v: serde_json::Value = serde_json::from_str(&text.expect("json")).expect("parse");
    // 20 grants per scenario, a fifth of them for the cold one.
    for (scenario, samples) in [("free_core", 20), ("free_core_cold", 4), ("reclaim", 20)] {
        assert_eq!(v[scenario]["samples"], samples, "{scenario}: {v}");
        let median = v[scenario]["median_us"].as_f64().expect("median");
        assert!(median > 0.0, "{scenario}: {v}");
    }
}
