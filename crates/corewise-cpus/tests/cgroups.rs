//! The CPU count from the command, from C (gcc, linked against
//! libcorewise_budget.so) and from Python (ctypes), each run inside real
//! cgroups: CFS quotas of 0.5, 1.5 and 2 CPUs (on the cgroup itself and on a
//! parent), a narrower cpuset, and both. Every case makes its own cgroup
//! subtree under the test process's cgroup; a guard removes it even when the
//! case fails. Needs root and the cgroup v1 `cpu` and `cpuset` hierarchies
//! (cgroup v2 quotas need the `cpu` controller on the unified hierarchy,
//! which hybrid hosts like the test machine keep on v1).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::Value;

const V1: &str = "/sys/fs/cgroup";

static NEXT: AtomicUsize = AtomicUsize::new(0);

/// A cgroup subtree of the test's own, removed (deepest first) on drop.
struct Subtree {
    dirs: Vec<PathBuf>,
}

impl Drop for Subtree {
    fn drop(&mut self) {
        for d in self.dirs.iter().rev() {
            let _ = fs::remove_dir(d);
        }
    }
}

impl Subtree {
    fn new() -> Self {
        Subtree { dirs: Vec::new() }
    }

    /// Makes `rel` (one or more levels) under the test process's own cgroup
    /// in hierarchy `controller` and returns the deepest directory.
    fn make(&mut self, controller: &str, rel: &str) -> PathBuf {
        let own = own_cgroup(controller);
        let mut dir = Path::new(V1)
            .join(controller)
            .join(own.trim_start_matches('/'));
        for part in rel.split('/') {
            dir = dir.join(part);
            if self.dirs.contains(&dir) {
                continue;
            }
            fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
            self.dirs.push(dir.clone());
            if controller == "cpuset" {
                // A v1 cpuset starts empty: inherit the parent's CPUs and memory nodes.
                let parent = dir.parent().unwrap();
                for f in ["cpuset.mems", "cpuset.cpus"] {
                    let v = fs::read_to_string(parent.join(f)).unwrap();
                    fs::write(dir.join(f), v.trim()).unwrap();
                }
            }
        }
        dir
    }
}

fn own_cgroup(controller: &str) -> String {
    let text = fs::read_to_string("/proc/self/cgroup").unwrap();
    text.lines()
        .find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctl, path) = (it.next()?, it.next()?, it.next()?);
            ctl.split(',')
                .any(|c| c == controller)
                .then(|| path.to_owned())
        })
        .unwrap_or_else(|| panic!("no v1 {controller} hierarchy"))
}

fn set_quota(dir: &Path, cpus: f64) {
    fs::write(dir.join("cpu.cfs_period_us"), "100000").unwrap();
    let quota = (cpus * 100_000.0).round() as u64;
    fs::write(dir.join("cpu.cfs_quota_us"), quota.to_string()).unwrap();
}

fn affinity_count() -> usize {
    let set = rustix::thread::sched_getaffinity(None).unwrap();
    (0..rustix::thread::CpuSet::MAX_CPU)
        .filter(|&c| set.is_set(c))
        .count()
}

/// Where `cargo test` puts the freshly built libcorewise_budget.so: the
/// directory of this test binary (target/<profile>/deps). The copy in
/// target/<profile> is only refreshed by `cargo build`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

/// The C program: prints the count, then the JSON (growing its buffer the
/// snprintf way).
const C_SOURCE: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "corewise_budget.h"
int main(void) {
    int cores = corewise_budget_cores();
    char small[4];
    long n = corewise_budget_json(small, sizeof small);
    if (cores < 1 || n < 0) { fprintf(stderr, "error %d %ld\n", cores, n); return 1; }
    char *buf = malloc((size_t)n + 1);
    if (corewise_budget_json(buf, (size_t)n + 1) != n) return 2;
    printf("%d\n%s\n", cores, buf);
    free(buf);
    return 0;
}
"#;

const PY_SOURCE: &str = r#"
import ctypes, sys
lib = ctypes.CDLL(sys.argv[1])
lib.corewise_budget_json.restype = ctypes.c_long
lib.corewise_budget_json.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
cores = lib.corewise_budget_cores()
n = lib.corewise_budget_json(None, 0)
assert cores >= 1 and n > 0, (cores, n)
buf = ctypes.create_string_buffer(n + 1)
assert lib.corewise_budget_json(buf, n + 1) == n
print(cores)
print(buf.value.decode())
"#;

/// The three ways of asking, each a command line that prints the count on
/// its first line and the JSON on its second.
fn askers(work: &Path) -> Vec<(&'static str, Vec<String>)> {
    let target = target_dir();
    let so = target.join("libcorewise_budget.so");
    assert!(so.exists(), "{} not built", so.display());
    let c_src = work.join("ask.c");
    let c_bin = work.join("ask");
    fs::write(&c_src, C_SOURCE).unwrap();
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("include");
    let status = Command::new("gcc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&c_bin)
        .arg(&c_src)
        .arg(format!("-I{}", include.display()))
        .arg(format!("-L{}", target.display()))
        .arg(format!("-Wl,-rpath,{}", target.display()))
        .arg("-lcorewise_budget")
        .status()
        .expect("gcc");
    assert!(status.success(), "gcc failed");
    let py = work.join("ask.py");
    fs::write(&py, PY_SOURCE).unwrap();
    let cli = env!("CARGO_BIN_EXE_corewise-cpus");
    vec![
        (
            "command",
            vec!["sh".into(), "-c".into(), format!("{cli} && {cli} --json")],
        ),
        ("C", vec![c_bin.display().to_string()]),
        (
            "python",
            vec![
                "python3".into(),
                py.display().to_string(),
                so.display().to_string(),
            ],
        ),
    ]
}

/// Runs `argv` inside every cgroup of `dirs` and returns (count, JSON).
fn ask_inside(dirs: &[&Path], argv: &[String]) -> (usize, Value) {
    let mut script = String::new();
    for d in dirs {
        script.push_str(&format!("echo $$ > '{}/cgroup.procs' && ", d.display()));
    }
    script.push_str("exec \"$@\"");
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(argv)
        .env_remove("COREWISE_MAX_CORES")
        // cargo's library path may name target/<profile>, whose copy of the
        // library is stale; the C program finds the fresh one by its rpath.
        .env_remove("LD_LIBRARY_PATH")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{argv:?}: {}\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines = stdout.lines();
    let cores = lines.next().unwrap().trim().parse().unwrap();
    let json = serde_json::from_str(lines.next().unwrap()).unwrap();
    (cores, json)
}

struct Case {
    name: &'static str,
    /// Quota in CPUs on the cgroup the process joins.
    quota: Option<f64>,
    /// Quota in CPUs on its parent (the child has none).
    parent_quota: Option<f64>,
    /// A cpuset of one CPU (the last of the affinity mask).
    narrow_cpuset: bool,
}

fn run_case(case: &Case) {
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = format!("corewise-cpus-test-{}-{n}", std::process::id());
    let work = std::env::temp_dir().join(&name);
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    struct RmWork(PathBuf);
    impl Drop for RmWork {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }
    let _rm = RmWork(work.clone());
    let askers = askers(&work);

    let mut tree = Subtree::new();
    let cpu_parent = tree.make("cpu", &name);
    let cpu_leaf = tree.make("cpu", &format!("{name}/leaf"));
    if let Some(q) = case.parent_quota {
        set_quota(&cpu_parent, q);
    }
    if let Some(q) = case.quota {
        set_quota(&cpu_leaf, q);
    }
    let mut dirs = vec![cpu_leaf.as_path()];
    let cpuset_leaf;
    let affinity = affinity_count();
    let mut expected_cpus = affinity;
    let mut last_cpu = None;
    if case.narrow_cpuset {
        cpuset_leaf = tree.make("cpuset", &name);
        let set = rustix::thread::sched_getaffinity(None).unwrap();
        let last = (0..rustix::thread::CpuSet::MAX_CPU)
            .rev()
            .find(|&c| set.is_set(c))
            .unwrap();
        fs::write(cpuset_leaf.join("cpuset.cpus"), last.to_string()).unwrap();
        dirs.push(cpuset_leaf.as_path());
        expected_cpus = 1;
        last_cpu = Some(last);
    }
    let quota = case
        .quota
        .into_iter()
        .chain(case.parent_quota)
        .fold(f64::INFINITY, f64::min);
    let quota_cores = (quota.is_finite()).then(|| (quota.ceil() as usize).max(1));
    let expected = quota_cores.map_or(expected_cpus, |q| q.min(expected_cpus));

    for (who, argv) in &askers {
        let (cores, json) = ask_inside(&dirs, argv);
        let ctx = format!("{} via {who}: {json}", case.name);
        assert_eq!(cores, expected, "{ctx}");
        assert_eq!(json["cores"].as_u64(), Some(expected as u64), "{ctx}");
        assert_eq!(
            json["cpus"]["count"].as_u64(),
            Some(expected_cpus as u64),
            "{ctx}"
        );
        if let Some(last) = last_cpu {
            assert_eq!(
                json["cpus"]["cpus"].as_str(),
                Some(last.to_string().as_str()),
                "{ctx}"
            );
        }
        match quota_cores {
            Some(q) => {
                let quota_us = (quota * 100_000.0).round() as u64;
                assert_eq!(json["quota"]["quota_us"].as_u64(), Some(quota_us), "{ctx}");
                assert_eq!(json["quota"]["period_us"].as_u64(), Some(100_000), "{ctx}");
                let at = json["quota"]["path"].as_str().unwrap();
                let want = if case.quota == Some(quota) {
                    &cpu_leaf
                } else {
                    &cpu_parent
                };
                assert_eq!(Path::new(at), want.as_path(), "{ctx}");
                if q < expected_cpus {
                    assert_eq!(json["winner"], "quota", "{ctx}");
                }
            }
            None => assert!(json["quota"].is_null(), "{ctx}"),
        }
        if case.narrow_cpuset
            && expected_cpus < affinity
            && quota_cores.is_none_or(|q| q > expected_cpus)
        {
            assert_eq!(json["winner"], "cpuset", "{ctx}");
        }
        if quota_cores.is_none() && !case.narrow_cpuset {
            assert_eq!(json["winner"], "affinity", "{ctx}");
        }
    }
}

fn have_v1() -> bool {
    let ok = ["cpu", "cpuset"].iter().all(|c| {
        Path::new(V1).join(c).join("cgroup.procs").exists()
            && fs::read_to_string("/proc/self/cgroup")
                .map(|t| {
                    t.lines().any(|l| {
                        l.split(':')
                            .nth(1)
                            .is_some_and(|s| s.split(',').any(|x| x == *c))
                    })
                })
                .unwrap_or(false)
    });
    if !ok {
        eprintln!("skipped: needs the cgroup v1 cpu and cpuset hierarchies (and root)");
    }
    ok
}

#[test]
fn no_limit_is_the_affinity() {
    if have_v1() {
        run_case(&Case {
            name: "none",
            quota: None,
            parent_quota: None,
            narrow_cpuset: false,
        });
    }
}

#[test]
fn quota_half_a_cpu() {
    if have_v1() {
        run_case(&Case {
            name: "0.5",
            quota: Some(0.5),
            parent_quota: None,
            narrow_cpuset: false,
        });
    }
}

#[test]
fn quota_one_and_a_half_cpus() {
    if have_v1() {
        run_case(&Case {
            name: "1.5",
            quota: Some(1.5),
            parent_quota: None,
            narrow_cpuset: false,
        });
    }
}

#[test]
fn quota_two_cpus() {
    if have_v1() {
        run_case(&Case {
            name: "2",
            quota: Some(2.0),
            parent_quota: None,
            narrow_cpuset: false,
        });
    }
}

#[test]
fn a_parent_quota_binds() {
    if have_v1() {
        run_case(&Case {
            name: "parent 0.5",
            quota: None,
            parent_quota: Some(0.5),
            narrow_cpuset: false,
        });
    }
}

#[test]
fn narrower_cpuset() {
    if have_v1() {
        run_case(&Case {
            name: "cpuset",
            quota: None,
            parent_quota: None,
            narrow_cpuset: true,
        });
    }
}

#[test]
fn narrower_cpuset_and_quota() {
    if have_v1() {
        run_case(&Case {
            name: "cpuset+1.5",
            quota: Some(1.5),
            parent_quota: None,
            narrow_cpuset: true,
        });
    }
}
