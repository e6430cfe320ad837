//! Smoke test of `corewise-bench threads` with tiny counts: every scenario
//! runs in its child processes and the JSON holds one record per
//! (scenario, runtime), each with figures or a stated failure (the Go
//! column's cells say `skipped: ...` when `go` is absent), and the notes
//! give the vm.max_map_count in force.

mod common;

#[test]
fn threads_subcommand_runs_small() {
    let (table, v) = common::run_with_json(&[
        "threads",
        "--quick",
        "--runtimes",
        "corewise,tokio,go,std",
        "--threads",
        "20",
        "--parked",
        "20",
        "--connections",
        "8",
        "--active",
        "2",
        "--rate",
        "500",
        "--in-flight",
        "2",
    ]);
    assert!(
        table.contains("| sleepers (N = 20) | wall (ms) |"),
        "{table}"
    );
    assert_eq!(
        v["runtimes"],
        serde_json::json!(["corewise", "tokio", "go", "std"])
    );
    assert!(
        v["notes"][0]
            .as_str()
            .is_some_and(|n| n.starts_with("vm.max_map_count = ")),
        "{v}"
    );
    assert!(table.contains("- vm.max_map_count = "), "{table}");
    let recs = v["records"].as_array().expect("array");
    // sleepers and parked for four runtimes, connections for corewise,
    // tokio and go.
    assert_eq!(recs.len(), 11, "{v}");
    for r in recs {
        let ok = r["error"].is_null();
        let has_figure = ["wall_ms", "create_ms", "p99_us"]
            .iter()
            .any(|k| r[k].as_f64().is_some_and(|x| x > 0.0));
        assert!(ok == has_figure, "record {r}");
        if r["runtime"] == "go" && !ok {
            let e = r["error"].as_str().expect("error text");
            assert!(e.starts_with("skipped: "), "{r}");
        }
        if r["scenario"] == "sleepers" && r["runtime"] == "tokio" {
            // 20 tasks sleeping 10 ms each: at least the sleep.
            assert!(r["wall_ms"].as_f64().expect("wall") >= 10.0, "{r}");
        }
    }
}
