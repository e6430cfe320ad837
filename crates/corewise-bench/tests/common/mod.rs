//! What the benchmark smoke tests share: run one subcommand of
//! `corewise-bench` with `--json` into a temporary directory and hand back
//! its table and its JSON.

use std::process::Command;

/// The benchmark binary of this package.
pub fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_corewise-bench"))
}

/// Runs `corewise-bench <args> --json <tmp>/<subcommand>.json` (the
/// subcommand is `args[0]`) and returns its
/// standard output (the table) and the parsed JSON; panics with the
/// benchmark's standard error if it fails. The temporary directory is
/// removed before returning.
pub fn run_with_json(args: &[&str]) -> (String, serde_json::Value) {
    let name = args.first().copied().unwrap_or("bench");
    let dir = std::env::temp_dir().join(format!("cw-{name}-smoke-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json = dir.join(format!("{name}.json"));
    let out = bench()
        .args(args)
        .arg("--json")
        .arg(&json)
        .output()
        .expect("run corewise-bench");
    let text = std::fs::read_to_string(&json);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_str(&text.expect("json")).expect("parse");
    (String::from_utf8_lossy(&out.stdout).into_owned(), v)
}
