//! The `go` column: goroutines, measured by a small Go program
//! (bench/go-primitives) that this runner builds with `go build` and runs.
//!
//! The Go program reads the same clock (the TSC through a tiny assembly
//! function on amd64, else CLOCK_MONOTONIC through the runtime) and prints
//! one JSON object with raw samples in ticks; they are converted to ns here
//! with this process's calibration.

use super::{Ctx, Op, RuntimeReport};
use crate::clock::Source;
use crate::error::BenchError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the Go program prints.
#[derive(Debug, Deserialize)]
struct GoOutput {
    /// "ticks" (TSC) or "ns".
    unit: String,
    /// Raw samples per op name, in `unit`.
    ops: BTreeMap<String, Vec<f64>>,
    /// Samples per op rejected because a goroutine ran on the wrong CPU.
    #[serde(default)]
    rejected: BTreeMap<String, u64>,
    creation_throughput_per_s: Option<f64>,
    idle_cpu_percent: Option<f64>,
}

/// Finds `go`: on PATH, else the usual install location.
pub(crate) fn find_go() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join("go"))
        .chain(std::iter::once(PathBuf::from("/usr/local/go/bin/go")))
        .find(|p| p.is_file())
}

fn build(go: &Path, ctx: &Ctx) -> Result<PathBuf, BenchError> {
    let out = ctx.build_dir.join("go-primitives");
    go_build(go, &ctx.go_dir, &out)?;
    Ok(out)
}

/// `go build -o OUT .` in `src` (cgo off): shared by every benchmark with
/// a Go peer.
pub(crate) fn go_build(go: &Path, src: &Path, out: &Path) -> Result<(), BenchError> {
    let status = Command::new(go)
        .arg("build")
        .arg("-o")
        .arg(out)
        .arg(".")
        .current_dir(src)
        .env("CGO_ENABLED", "0")
        .status()
        .map_err(|e| BenchError::io(format!("running {}", go.display()), e))?;
    if !status.success() {
        return Err(BenchError::Runtime {
            runtime: "go",
            message: format!("go build in {} failed ({status})", src.display()),
        });
    }
    Ok(())
}

/// Finds `go` and builds the program in bench/NAME of this repository
/// into NAME next to this executable (the temporary directory when that
/// is unknown); `Err` says why there is no program (the cell's text).
pub(crate) fn build_bench_program(name: &str) -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../bench")
        .join(name);
    let go = find_go().ok_or("no `go` on PATH or in /usr/local/go/bin")?;
    if !src.join("main.go").is_file() {
        return Err(format!("no Go sources in {}", src.display()));
    }
    let out = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| std::env::temp_dir().join(name));
    go_build(&go, &src, &out).map_err(|e| e.to_string())?;
    Ok(out)
}

/// Builds and runs the Go peer; `Err` (reported as "skipped") when Go is
/// absent or the build fails.
pub fn run(ctx: &Ctx) -> Result<RuntimeReport, BenchError> {
    let go = find_go().ok_or(BenchError::Runtime {
        runtime: "go",
        message: "no `go` on PATH".into(),
    })?;
    if !ctx.go_dir.join("main.go").is_file() {
        return Err(BenchError::Runtime {
            runtime: "go",
            message: format!("no Go sources in {}", ctx.go_dir.display()),
        });
    }
    let bin = build(&go, ctx)?;
    let clock_name = match ctx.clock.source() {
        Source::Tsc => "tsc",
        Source::Monotonic => "mono",
    };
    let mut cmd = Command::new(&bin);
    cmd.arg("-clock")
        .arg(clock_name)
        .arg("-cpu-a")
        .arg(ctx.cpu_a.to_string())
        .arg("-cpu-b")
        .arg(ctx.cpu_b.to_string())
        .arg("-settle-us")
        .arg(ctx.settle.as_micros().to_string())
        .arg("-idle-ms")
        .arg(ctx.idle_window.as_millis().to_string());
    if ctx.quick {
        cmd.arg("-quick");
    }
    let out = cmd
        .output()
        .map_err(|e| BenchError::io(format!("running {}", bin.display()), e))?;
    if !out.status.success() {
        return Err(BenchError::Runtime {
            runtime: "go",
            message: format!(
                "go-primitives failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let parsed: GoOutput = serde_json::from_slice(&out.stdout)?;
    let to_ns = |v: f64| match parsed.unit.as_str() {
        "ticks" => v / ctx.clock.ticks_per_ns(),
        _ => v,
    };
    if parsed.unit == "ticks" && ctx.clock.source() != Source::Tsc {
        return Err(BenchError::Runtime {
            runtime: "go",
            message: "Go reported TSC ticks but the harness clock is monotonic".into(),
        });
    }
    let mut r = RuntimeReport::new("go");
    for (name, samples) in &parsed.ops {
        let Some(op) = Op::from_name(name) else {
            r.note(format!("go: unknown op {name} ignored"));
            continue;
        };
        r.push(op, samples.iter().map(|&v| to_ns(v)).collect());
    }
    for (name, n) in &parsed.rejected {
        if *n > 0 {
            let kept = parsed.ops.get(name).map_or(0, Vec::len);
            r.note(format!(
                "go {name}: kept {kept} samples, rejected {n} that ran on the wrong cpu"
            ));
        }
    }
    r.creation_throughput_per_s = parsed.creation_throughput_per_s;
    r.idle_cpu_percent = parsed.idle_cpu_percent;
    r.note("go: GOMAXPROCS=2 for cross-core ops, throughput and idle; GOMAXPROCS=1 for same-core ops; parents locked to an OS thread pinned to cpu A; goroutines cannot be pinned, so cross-core samples keep only wake-ups seen (via rdtscp) on cpu B");
    Ok(r)
}
