//! The corewise runtime's figures in the real server's `stats` reply.

mod common;

use common::Server;

fn check(mode: &str) {
    let s = Server::start(&["--mode", mode, "-t", "2"]);
    let mut c = s.client();
    assert_eq!(c.set("k", b"v"), "STORED");
    let stats = c.stats("");
    let get = |name: &str| -> Option<String> {
        stats
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let cores: usize = get("corewise_cores")
        .expect("corewise_cores")
        .parse()
        .unwrap();
    assert!(cores >= 1, "{stats:?}");
    let active: usize = get("corewise_active_cores").unwrap().parse().unwrap();
    assert!((1..=cores).contains(&active), "{stats:?}");
    assert!(get("corewise_cores_added").unwrap().parse::<u64>().unwrap() >= active as u64);
    for k in 0..cores {
        for field in [
            "active",
            "threads",
            "queued",
            "utilization",
            "load_factor",
            "dispatches",
            "sleeps",
        ] {
            let name = format!("corewise_core{k}_{field}");
            assert!(get(&name).is_some(), "missing {name}: {stats:?}");
        }
    }
    // The connection's own thread is in some core's slots, and it ran.
    let sum = |field: &str| -> u64 {
        (0..cores)
            .map(|k| get(&format!("corewise_core{k}_{field}")).unwrap())
            .map(|v| v.parse::<u64>().unwrap())
            .sum()
    };
    assert!(sum("threads") >= 1, "{stats:?}");
    assert!(sum("dispatches") >= 1, "{stats:?}");
    // Only the general group carries them.
    assert!(c
        .stats("settings")
        .iter()
        .all(|(n, _)| !n.starts_with("corewise_core")));
}

#[test]
fn stats_carries_the_runtime_figures_conn_mode() {
    check("conn");
}

#[test]
fn stats_carries_the_runtime_figures_dispatch_mode() {
    check("dispatch");
}
