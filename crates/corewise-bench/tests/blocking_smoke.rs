//! Smoke test of `corewise-bench blocking` with a tiny duration: every
//! (peer, kind) pair runs in its child process and the JSON holds one
//! record per pair that parses, with its expected tick count and either
//! observed ticks or a stated error. No timing is asserted: how late the
//! ticker is belongs to the benchmark's figures, not to this test.

mod common;

#[test]
fn blocking_subcommand_runs_small() {
    let (table, v) = common::run_with_json(&[
        "blocking",
        "--quick",
        "--peers",
        "corewise,tokio,std",
        "--duration-ms",
        "200",
        "--interval-ms",
        "10",
        "--grace-ms",
        "500",
    ]);
    assert!(
        table.starts_with("| peer | kind | ticks expected / observed |"),
        "{table}"
    );
    assert_eq!(v["interval_ms"], 10, "{v}");
    assert_eq!(v["duration_ms"], 200, "{v}");
    let cpus = v["cpus"].as_array().expect("cpus").len() as u64;
    assert_eq!(v["blockers"].as_u64(), Some(cpus), "{v}");
    let recs = v["records"].as_array().expect("records");
    // Three peers by three kinds, in the order asked for.
    assert_eq!(recs.len(), 9, "{v}");
    for (i, r) in recs.iter().enumerate() {
        assert_eq!(r["peer"], ["corewise", "tokio", "std"][i % 3], "{r}");
        assert_eq!(r["kind"], ["sleep", "fs", "compute"][i / 3], "{r}");
        assert_eq!(r["expected"], 20, "{r}");
        let observed = r["observed"].as_u64().expect("observed");
        if r["error"].is_null() {
            // A run that finished saw its last tick at least, and its
            // blockers ran.
            assert!(observed >= 1, "{r}");
            assert!(r["blocker_calls"].as_u64().expect("calls") >= 1, "{r}");
            let (p50, p99, max) = (
                r["p50_ms"].as_f64().expect("p50"),
                r["p99_ms"].as_f64().expect("p99"),
                r["max_ms"].as_f64().expect("max"),
            );
            assert!(0.0 <= p50 && p50 <= p99 && p99 <= max, "{r}");
        }
        let row = format!(
            "| {} | {} | 20 / {observed} |",
            r["peer"].as_str().unwrap_or(""),
            r["kind"].as_str().unwrap_or("")
        );
        assert!(table.contains(&row), "{row} not in\n{table}");
    }
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    for args in [
        &["blocking", "--peers", "nope"][..],
        &["blocking", "--kind", "sleep,nope"][..],
        &["blocking", "--cpus", "100000"][..],
        &["blocking", "--child", "corewise"][..],
    ] {
        let out = common::bench()
            .args(args)
            .output()
            .expect("run corewise-bench");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains("corewise-bench: error: "), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}
