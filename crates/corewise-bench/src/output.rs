//! Markdown table and JSON output of `primitives`.

use crate::error::BenchError;
use crate::primitives::{Op, RuntimeReport};
use crate::stats::Summary;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// One summarised (op, runtime) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Op name.
    pub op: &'static str,
    /// Runtime name.
    pub runtime: &'static str,
    /// Median, ns.
    pub median_ns: f64,
    /// 99th percentile, ns.
    pub p99_ns: f64,
}

/// The JSON object written by `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// Median cache-line round trip between the two CPUs, ns.
    pub round_trip_ns: f64,
    /// The round trip around each runtime's own run, ns: the figure its
    /// cross-core ratios use.
    pub round_trip_ns_by_runtime: BTreeMap<&'static str, f64>,
    /// Median bare one-way wake with no runtime (a locked add on one CPU
    /// seen by a thread polling on the other, timed like the cross-core
    /// ops), ns: the single cross-core event the ops time, by the simplest
    /// code.
    pub bare_wake_ns: f64,
    /// The bare wake around each runtime's own run (median and p99), ns.
    pub bare_wake_ns_by_runtime: BTreeMap<&'static str, (f64, f64)>,
    /// One entry per (op, runtime) that has samples.
    pub results: Vec<Row>,
    /// Children created per second, per runtime.
    pub creation_throughput_per_s: BTreeMap<&'static str, f64>,
    /// Idle CPU, % of one core, per runtime.
    pub idle_cpu_percent: BTreeMap<&'static str, f64>,
}

impl Results {
    /// Summarises the runners' reports.
    pub fn new(round_trip_ns: f64, bare_wake_ns: f64, reports: &[RuntimeReport]) -> Self {
        let mut results = Vec::new();
        for op in Op::ALL {
            for r in reports {
                for s in r.ops.iter().filter(|s| s.op == op) {
                    if let Some(sum) = Summary::of(&s.samples_ns) {
                        results.push(Row {
                            op: op.name(),
                            runtime: r.runtime,
                            median_ns: round1(sum.median),
                            p99_ns: round1(sum.p99),
                        });
                    }
                }
            }
        }
        let pick = |f: fn(&RuntimeReport) -> Option<f64>| {
            reports
                .iter()
                .filter_map(|r| {
                    f(r).filter(|v| v.is_finite())
                        .map(|v| (r.runtime, (v * 1000.0).round() / 1000.0))
                })
                .collect()
        };
        Results {
            round_trip_ns: round1(round_trip_ns),
            round_trip_ns_by_runtime: pick(|r| r.round_trip_ns),
            bare_wake_ns: round1(bare_wake_ns),
            bare_wake_ns_by_runtime: reports
                .iter()
                .filter_map(|r| {
                    r.bare_wake_ns
                        .map(|(m, p)| (r.runtime, (round1(m), round1(p))))
                })
                .collect(),
            results,
            creation_throughput_per_s: pick(|r| r.creation_throughput_per_s),
            idle_cpu_percent: pick(|r| r.idle_cpu_percent),
        }
    }

    fn cell(&self, op: Op, runtime: &str) -> Option<&Row> {
        self.results
            .iter()
            .find(|r| r.op == op.name() && r.runtime == runtime)
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn fmt_ns(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

fn fmt_rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2} M/s", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1} k/s", x / 1e3)
    } else {
        format!("{x:.0} /s")
    }
}

/// One table row of a per-runtime figure (`–` where a runtime has none).
fn per_runtime_row(
    s: &mut String,
    label: &str,
    names: &[&str],
    cell: impl Fn(&str) -> Option<String>,
) {
    let _ = write!(s, "| {label} |");
    for n in names {
        match cell(n) {
            Some(v) => {
                let _ = write!(s, " {v} |");
            }
            None => s.push_str(" – |"),
        }
    }
    s.push('\n');
}

/// The markdown table (plus notes) for stdout.
pub fn markdown(res: &Results, reports: &[RuntimeReport]) -> String {
    let names: Vec<&str> = reports.iter().map(|r| r.runtime).collect();
    let rt = res.round_trip_ns;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "cache-line round trip between the two cores: {} ns (median of the run); \
         each column's RT ratios use the round trip around that runtime's run\n",
        fmt_ns(rt)
    );
    if res.bare_wake_ns.is_finite() {
        let _ = writeln!(
            s,
            "bare one-way wake, no runtime (a locked add on one cpu seen by a thread \
             polling on the other, timed like the cross-core ops): {} ns ({:.1} RT); \
             the round trip is streamed (64 back to back), a wake is alone\n",
            fmt_ns(res.bare_wake_ns),
            res.bare_wake_ns / rt
        );
    }
    let _ = write!(s, "| op |");
    for n in &names {
        let _ = write!(s, " {n} |");
    }
    let _ = write!(s, "\n|---|");
    for _ in &names {
        let _ = write!(s, "---|");
    }
    s.push('\n');
    per_runtime_row(&mut s, "RT around the run (ns)", &names, |n| {
        res.round_trip_ns_by_runtime.get(n).map(|v| fmt_ns(*v))
    });
    per_runtime_row(
        &mut s,
        "bare wake around the run (median / p99 ns)",
        &names,
        |n| {
            let rt = res.round_trip_ns_by_runtime.get(n).copied().unwrap_or(rt);
            res.bare_wake_ns_by_runtime.get(n).map(|&(m, p)| {
                format!(
                    "{} / {} ({:.1} / {:.1} RT)",
                    fmt_ns(m),
                    fmt_ns(p),
                    m / rt,
                    p / rt
                )
            })
        },
    );
    for op in Op::ALL {
        let _ = write!(s, "| {} (median / p99 ns) |", op.name());
        for n in &names {
            let rt = res.round_trip_ns_by_runtime.get(n).copied().unwrap_or(rt);
            match res.cell(op, n) {
                Some(c) => {
                    let _ = write!(s, " {} / {}", fmt_ns(c.median_ns), fmt_ns(c.p99_ns));
                    if op.cross_core() && rt > 0.0 {
                        let _ = write!(s, " ({:.1} / {:.1} RT)", c.median_ns / rt, c.p99_ns / rt);
                    }
                    s.push_str(" |");
                }
                None => s.push_str(" – |"),
            }
        }
        s.push('\n');
    }
    per_runtime_row(&mut s, "creation throughput", &names, |n| {
        res.creation_throughput_per_s.get(n).map(|v| fmt_rate(*v))
    });
    per_runtime_row(&mut s, "idle CPU (% of one core, 2 s)", &names, |n| {
        res.idle_cpu_percent.get(n).map(|v| format!("{v:.3} %"))
    });
    let notes: Vec<&String> = reports.iter().flat_map(|r| r.notes.iter()).collect();
    if !notes.is_empty() {
        s.push_str("\nNotes:\n");
        for n in notes {
            let _ = writeln!(s, "- {n}");
        }
    }
    s
}

/// Writes `res` as one JSON object to `path`.
pub fn write_json(res: &Results, path: &Path) -> Result<(), BenchError> {
    let text = serde_json::to_string_pretty(res)?;
    std::fs::write(path, text + "\n")
        .map_err(|e| BenchError::io(format!("writing {}", path.display()), e))
}
