//! Smoke test of `corewise-bench primitives --quick --only corewise`: the
//! run ends, and its table and JSON hold every op of the corewise column,
//! the streamed round trip and the bare one-way wake measured around it.

mod common;

#[test]
fn primitives_subcommand_reports_every_op_and_both_yardsticks() {
    let (table, v) = common::run_with_json(&["primitives", "--quick", "--only", "corewise"]);
    assert!(
        table.contains("| bare wake around the run (median / p99 ns) |"),
        "{table}"
    );
    assert!(table.contains("bare one-way wake, no runtime"), "{table}");
    let positive = |x: &serde_json::Value| x.as_f64().is_some_and(|x| x > 0.0);
    assert!(positive(&v["round_trip_ns"]), "{v}");
    assert!(positive(&v["bare_wake_ns"]), "{v}");
    let (median, p99) = (
        &v["bare_wake_ns_by_runtime"]["corewise"][0],
        &v["bare_wake_ns_by_runtime"]["corewise"][1],
    );
    assert!(positive(median) && positive(p99), "{v}");
    assert!(median.as_f64() <= p99.as_f64(), "{v}");
    let rows = v["results"].as_array().expect("results");
    for op in [
        "create_cross_core",
        "spawn_join_same_core",
        "null_yield",
        "one_way_yield",
        "condvar_notify_cross_core",
        "signal_cross_core",
    ] {
        let row = rows
            .iter()
            .find(|r| r["op"] == op && r["runtime"] == "corewise")
            .unwrap_or_else(|| panic!("no {op} row: {v}"));
        assert!(positive(&row["median_ns"]), "{row}");
    }
    assert!(positive(&v["creation_throughput_per_s"]["corewise"]), "{v}");
}
