//! Smoke test of `corewise-bench neighbours` with tiny cells and the
//! neighbours held to one kind (`--neighbour-kind`): each cell runs beside
//! a real neighbour process of that kind, the JSON records which, and the
//! table marks a neighbour kind that differs from the pool's; the warm-up
//! cell that runs first is not among the cells. No latency
//! is asserted: how the pools compare belongs to the benchmark's figures.

mod common;

#[test]
fn neighbours_of_one_kind_beside_every_pool() {
    let png = std::env::temp_dir().join(format!("cw-neighbours-smoke-{}.png", std::process::id()));
    let png_arg = png.to_str().expect("utf-8 temp path").to_string();
    let (table, v) = common::run_with_json(&[
        "neighbours",
        "--quick",
        "--duration",
        "0.4",
        "--neighbours",
        "1",
        "--pools",
        "corewise,optimal",
        "--neighbour-kind",
        "optimal",
        "--fib-n",
        "22",
        "--on-off-cycles",
        "0",
        "--share-window-ms",
        "20",
        "--png",
        &png_arg,
    ]);
    let drawn = png.exists();
    let _ = std::fs::remove_file(&png);
    assert!(drawn, "no plot at {png_arg}");
    assert!(table.contains("window 20 ms, smoothing 0.3"), "{table}");
    // A warm-up cell ran first and is not among the cells.
    assert!(table.contains("after a discarded warm-up cell"), "{table}");
    let cells = v.as_array().expect("a list of cells");
    assert_eq!(cells.len(), 2, "{v}");
    for (cell, pool) in cells.iter().zip(["corewise", "optimal"]) {
        assert_eq!(cell["pool"], pool, "{cell}");
        assert_eq!(cell["neighbours"], 1, "{cell}");
        assert_eq!(cell["neighbour_kind"], "optimal", "{cell}");
        assert!(cell["completed"].as_u64().expect("completed") > 0, "{cell}");
    }
    assert!(table.contains("| corewise | 1 optimal |"), "{table}");
    assert!(table.contains("| optimal | 1 |"), "{table}");
}
