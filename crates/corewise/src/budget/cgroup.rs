//! Finding the process's cgroups and reading their CPU limits.
//!
//! `/proc/<pid>/cgroup` says which cgroup the process is in for each
//! hierarchy; `/proc/<pid>/mountinfo` says where each hierarchy is mounted
//! (and which part of it: in a container the mount's root is often the
//! container's own cgroup). Joining the two gives a directory; the limits are
//! read there and in every parent directory up to the mount point, because a
//! parent's limit binds its children (a child with a 2-CPU quota under a
//! parent with 1 CPU gets 1). This handles cgroup v1 (one mount per
//! controller or group of controllers), v2 (one unified mount) and hybrid
//! systems (v1 controllers plus an empty v2 mount) alike: each controller is
//! looked up wherever it is mounted, and a controller that is mounted nowhere
//! simply does not limit.

use std::io;
use std::path::{Component, Path, PathBuf};

use super::{BudgetError, CpuList, QuotaLimit};

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CgroupLine {
    pub(crate) hierarchy: u32,
    pub(crate) controllers: Vec<String>,
    pub(crate) path: String,
}

/// One line of `/proc/<pid>/mountinfo`, the fields this module needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    /// The directory of the mounted file system that appears at the mount
    /// point (for cgroups: which cgroup is the mount's top).
    pub(crate) root: String,
    pub(crate) mount_point: String,
    pub(crate) fstype: String,
    pub(crate) super_options: Vec<String>,
}

/// Which cgroup version a located directory belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    V1,
    V2,
}

/// A controller's hierarchy as seen by the process: where it is mounted and
/// which directory under the mount point is the process's cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Located {
    pub(crate) version: Version,
    pub(crate) mount_point: PathBuf,
    pub(crate) leaf: PathBuf,
}

impl Located {
    /// The process's cgroup directory and each parent up to and including
    /// the mount point, top (mount point) first.
    pub(crate) fn levels_top_down(&self) -> Vec<PathBuf> {
        let mut levels: Vec<PathBuf> = self
            .leaf
            .ancestors()
            .take_while(|p| p.starts_with(&self.mount_point))
            .map(Path::to_path_buf)
            .collect();
        levels.reverse();
        levels
    }
}

/// Parses `/proc/<pid>/cgroup`. Blank lines are skipped; any other line
/// that is not `id:controllers:path` is an error naming `file`.
pub(crate) fn parse_proc_cgroup(text: &str, file: &Path) -> Result<Vec<CgroupLine>, BudgetError> {
    let mut lines = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(BudgetError::parse(
                file,
                format!("line {line:?} is not id:controllers:path"),
            ));
        };
        let hierarchy = id
            .trim()
            .parse::<u32>()
            .map_err(|_| BudgetError::parse(file, format!("bad hierarchy id in line {line:?}")))?;
        let controllers = ctrls
            .split(',')
            .filter(|c| !c.is_empty())
            .map(str::to_owned)
            .collect();
        lines.push(CgroupLine {
            hierarchy,
            controllers,
            path: path.trim_end_matches('\n').to_owned(),
        });
    }
    Ok(lines)
}

/// Parses `/proc/<pid>/mountinfo` (see proc(5)). Blank lines are skipped; a
/// line without the ` - ` separator or with too few fields is an error
/// naming `file`.
pub(crate) fn parse_mountinfo(text: &str, file: &Path) -> Result<Vec<Mount>, BudgetError> {
    let mut mounts = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let sep = fields.iter().skip(6).position(|f| *f == "-").map(|p| p + 6);
        let Some(sep) = sep else {
            return Err(BudgetError::parse(
                file,
                format!("no ' - ' separator in line {line:?}"),
            ));
        };
        if fields.len() < sep + 3 {
            return Err(BudgetError::parse(
                file,
                format!("too few fields in line {line:?}"),
            ));
        }
        mounts.push(Mount {
            root: unescape(fields[3]),
            mount_point: unescape(fields[4]),
            fstype: fields[sep + 1].to_owned(),
            super_options: fields[sep + 3].split(',').map(str::to_owned).collect(),
        });
    }
    Ok(mounts)
}

/// Undoes mountinfo's octal escapes (`\040` is a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let oct = &bytes[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = oct
                    .iter()
                    .fold(0u32, |acc, b| acc * 8 + u32::from(b - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the v1 hierarchy holding `controller` puts the process, if that
/// controller is mounted.
pub(crate) fn locate_v1(
    lines: &[CgroupLine],
    mounts: &[Mount],
    controller: &str,
    root: &Path,
) -> Option<Located> {
    let line = lines
        .iter()
        .find(|l| l.hierarchy != 0 && l.controllers.iter().any(|c| c == controller))?;
    let candidates = mounts
        .iter()
        .filter(|m| m.fstype == "cgroup" && m.super_options.iter().any(|o| o == controller));
    locate(candidates, &line.path, Version::V1, root)
}

/// Where the unified (v2) hierarchy puts the process, if it is mounted.
pub(crate) fn locate_v2(lines: &[CgroupLine], mounts: &[Mount], root: &Path) -> Option<Located> {
    let line = lines
        .iter()
        .find(|l| l.hierarchy == 0 && l.controllers.is_empty())?;
    let candidates = mounts.iter().filter(|m| m.fstype == "cgroup2");
    locate(candidates, &line.path, Version::V2, root)
}

fn locate<'a>(
    candidates: impl Iterator<Item = &'a Mount>,
    cgroup_path: &str,
    version: Version,
    root: &Path,
) -> Option<Located> {
    let cgroup_path = Path::new(cgroup_path);
    // Prefer a mount whose root contains the process's cgroup (the longest
    // such root); otherwise the first mount, which in a cgroup namespace or
    // container is the process's own view of the hierarchy.
    let mut best: Option<(&Mount, Option<PathBuf>)> = None;
    for m in candidates {
        let rel = cgroup_path
            .strip_prefix(&m.root)
            .ok()
            .filter(|r| r.components().all(|c| matches!(c, Component::Normal(_))))
            .map(Path::to_path_buf);
        let better = match (&best, &rel) {
            (None, _) => true,
            (Some((_, None)), Some(_)) => true,
            (Some((b, Some(_))), Some(_)) => m.root.len() > b.root.len(),
            _ => false,
        };
        if better {
            best = Some((m, rel));
        }
    }
    let (mount, rel) = best?;
    let mount_point = under_root(root, Path::new(&mount.mount_point));
    let leaf = match rel {
        Some(rel) => mount_point.join(rel),
        None => mount_point.clone(),
    };
    Some(Located {
        version,
        mount_point,
        leaf,
    })
}

/// `path` (absolute, as the kernel prints it) inside the file-system root
/// `root` (normally `/`; tests point it at a fake tree).
pub(crate) fn under_root(root: &Path, path: &Path) -> PathBuf {
    let rel = path.strip_prefix("/").unwrap_or(path);
    if rel.as_os_str().is_empty() {
        root.to_path_buf()
    } else {
        root.join(rel)
    }
}

/// Reads a file; `Ok(None)` if it does not exist.
pub(crate) fn read_optional(path: &Path) -> Result<Option<String>, BudgetError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(BudgetError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// Reads a file that must exist.
pub(crate) fn read_required(path: &Path) -> Result<String, BudgetError> {
    std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            BudgetError::Missing {
                path: path.to_path_buf(),
            }
        } else {
            BudgetError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

/// Fails with [`BudgetError::Missing`] if the process's cgroup directory is
/// gone (the process moved or the cgroup was removed while we looked):
/// otherwise a missing directory would read as "no limit".
pub(crate) fn require_dir(dir: &Path) -> Result<(), BudgetError> {
    if dir.is_dir() {
        Ok(())
    } else {
        Err(BudgetError::Missing {
            path: dir.to_path_buf(),
        })
    }
}

/// The CPU bandwidth limit set directly on one cgroup directory, if any.
///
/// v1: `cpu.cfs_quota_us` (`-1` is unlimited) over `cpu.cfs_period_us`; a
/// kernel without CFS bandwidth control has neither file, which is no limit.
/// v2: `cpu.max` (`max 100000` or `150000 100000`); absent when the cpu
/// controller is not enabled for this cgroup, which is no limit.
pub(crate) fn read_quota(dir: &Path, version: Version) -> Result<Option<QuotaLimit>, BudgetError> {
    match version {
        Version::V1 => {
            let quota_path = dir.join("cpu.cfs_quota_us");
            let Some(text) = read_optional(&quota_path)? else {
                return Ok(None);
            };
            let quota: i64 = text.trim().parse().map_err(|_| {
                BudgetError::parse(&quota_path, format!("not an integer: {:?}", text.trim()))
            })?;
            if quota < 0 {
                return Ok(None);
            }
            let period_path = dir.join("cpu.cfs_period_us");
            let text = read_required(&period_path)?;
            let period = parse_period(text.trim(), &period_path)?;
            Ok(Some(QuotaLimit {
                path: dir.to_path_buf(),
                quota_us: quota.unsigned_abs(),
                period_us: period,
            }))
        }
        Version::V2 => {
            let path = dir.join("cpu.max");
            let Some(text) = read_optional(&path)? else {
                return Ok(None);
            };
            parse_cpu_max(&text, &path).map(|q| {
                q.map(|(quota_us, period_us)| QuotaLimit {
                    path: dir.to_path_buf(),
                    quota_us,
                    period_us,
                })
            })
        }
    }
}

/// Parses v2 `cpu.max`: `$MAX $PERIOD`, `$MAX` is `max` or microseconds;
/// the period is optional (default 100000, as the kernel's). `None` is
/// unlimited.
pub(crate) fn parse_cpu_max(text: &str, path: &Path) -> Result<Option<(u64, u64)>, BudgetError> {
    let mut fields = text.split_whitespace();
    let Some(max) = fields.next() else {
        return Err(BudgetError::parse(path, "empty".to_owned()));
    };
    let period = match fields.next() {
        Some(p) => parse_period(p, path)?,
        None => 100_000,
    };
    if fields.next().is_some() {
        return Err(BudgetError::parse(
            path,
            format!("more than two fields: {:?}", text.trim()),
        ));
    }
    if max == "max" {
        return Ok(None);
    }
    let quota = max.parse::<u64>().map_err(|_| {
        BudgetError::parse(
            path,
            format!("quota is neither 'max' nor an integer: {max:?}"),
        )
    })?;
    Ok(Some((quota, period)))
}

fn parse_period(text: &str, path: &Path) -> Result<u64, BudgetError> {
    match text.parse::<u64>() {
        Ok(0) => Err(BudgetError::parse(path, "period is zero".to_owned())),
        Ok(p) => Ok(p),
        Err(_) => Err(BudgetError::parse(
            path,
            format!("period is not an integer: {text:?}"),
        )),
    }
}

/// The CPUs one cgroup directory allows, if it has a cpuset.
///
/// v1: `cpuset.effective_cpus`, else `cpuset.cpus` (and the same names
/// without the `cpuset.` prefix, for hierarchies mounted with `noprefix`);
/// every directory of a cpuset hierarchy has one, so none is an error.
/// v2: `cpuset.cpus.effective`; absent when the cpuset controller is not
/// enabled there, which is no limit.
pub(crate) fn read_cpuset(dir: &Path, version: Version) -> Result<Option<CpuList>, BudgetError> {
    let names: &[&str] = match version {
        Version::V1 => &[
            "cpuset.effective_cpus",
            "cpuset.cpus",
            "effective_cpus",
            "cpus",
        ],
        Version::V2 => &["cpuset.cpus.effective"],
    };
    for name in names {
        let path = dir.join(name);
        if let Some(text) = read_optional(&path)? {
            let list =
                CpuList::parse(&text).map_err(|e| BudgetError::parse(&path, e.to_string()))?;
            return Ok(Some(list));
        }
    }
    match version {
        Version::V1 => Err(BudgetError::Missing {
            path: dir.join(names[1]),
        }),
        Version::V2 => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime shared:5 - cgroup2 cgroup2 rw
";

    #[test]
    fn parses_proc_cgroup() {
        let text = "9:name=systemd:/\n3:cpuset:/a\n2:cpu,cpuacct:/b/c\n0::/d\n\n";
        let lines = parse_proc_cgroup(text, Path::new("x")).unwrap();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[2].controllers, vec!["cpu", "cpuacct"]);
        assert_eq!(lines[2].path, "/b/c");
        assert_eq!(lines[3].hierarchy, 0);
        assert!(lines[3].controllers.is_empty());
        // A colon in the path is kept.
        let odd = parse_proc_cgroup("0::/a:b", Path::new("x")).unwrap();
        assert_eq!(odd[0].path, "/a:b");
        let err = parse_proc_cgroup("garbage", Path::new("/proc/1/cgroup")).unwrap_err();
        assert!(err.to_string().contains("/proc/1/cgroup"), "{err}");
        assert!(parse_proc_cgroup("x:cpu:/", Path::new("x")).is_err());
    }

    #[test]
    fn parses_mountinfo_and_escapes() {
        let m = parse_mountinfo(HYBRID, Path::new("x")).unwrap();
        assert_eq!(m.len(), 6);
        assert_eq!(m[5].fstype, "cgroup2");
        assert_eq!(m[1].super_options, vec!["rw", "cpu"]);
        let esc = parse_mountinfo(
            "1 0 0:1 /a\\040b /mnt/x\\134y rw - cgroup2 none rw",
            Path::new("x"),
        )
        .unwrap();
        assert_eq!(esc[0].root, "/a b");
        assert_eq!(esc[0].mount_point, "/mnt/x\\y");
        assert_eq!(unescape("\\0"), "\\0");
        assert_eq!(unescape("tail\\"), "tail\\");
        assert_eq!(unescape("\\777"), "\\777");
        let err = parse_mountinfo("1 2 3", Path::new("/proc/self/mountinfo")).unwrap_err();
        assert!(err.to_string().contains("mountinfo"));
    }

    #[test]
    fn locates_hybrid() {
        let mounts = parse_mountinfo(HYBRID, Path::new("x")).unwrap();
        let lines = parse_proc_cgroup(
            "4:cpu:/a/b\n3:cpuset:/\n2:cpuacct:/a/b\n0::/u\n",
            Path::new("x"),
        )
        .unwrap();
        let root = Path::new("/");
        let cpu = locate_v1(&lines, &mounts, "cpu", root).unwrap();
        assert_eq!(cpu.leaf, Path::new("/sys/fs/cgroup/cpu/a/b"));
        assert_eq!(
            cpu.levels_top_down(),
            vec![
                PathBuf::from("/sys/fs/cgroup/cpu"),
                PathBuf::from("/sys/fs/cgroup/cpu/a"),
                PathBuf::from("/sys/fs/cgroup/cpu/a/b"),
            ]
        );
        // "cpu" must not match the cpuacct or cpuset mounts.
        let cpuset = locate_v1(&lines, &mounts, "cpuset", root).unwrap();
        assert_eq!(
            cpuset.levels_top_down(),
            vec![PathBuf::from("/sys/fs/cgroup/cpuset")]
        );
        let v2 = locate_v2(&lines, &mounts, root).unwrap();
        assert_eq!(v2.version, Version::V2);
        assert_eq!(v2.leaf, Path::new("/sys/fs/cgroup/unified/u"));
        assert!(locate_v1(&lines, &mounts, "memory", root).is_none());
    }

    #[test]
    fn locates_container_mount_root() {
        // Without a cgroup namespace a container sees the host path in
        // /proc/self/cgroup and its own cgroup as the mount's root.
        let mounts = parse_mountinfo(
            "1 0 0:1 /docker/abc /sys/fs/cgroup/cpu,cpuacct ro - cgroup cgroup rw,cpu,cpuacct\n\
             2 0 0:2 /kubepods/x /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n",
            Path::new("x"),
        )
        .unwrap();
        let lines = parse_proc_cgroup(
            "5:cpu,cpuacct:/docker/abc/sub\n0::/elsewhere\n",
            Path::new("x"),
        )
        .unwrap();
        let cpu = locate_v1(&lines, &mounts, "cpu", Path::new("/r")).unwrap();
        assert_eq!(cpu.mount_point, Path::new("/r/sys/fs/cgroup/cpu,cpuacct"));
        assert_eq!(cpu.leaf, Path::new("/r/sys/fs/cgroup/cpu,cpuacct/sub"));
        // Not under the mount's root: fall back to the mount point.
        let v2 = locate_v2(&lines, &mounts, Path::new("/")).unwrap();
        assert_eq!(v2.leaf, Path::new("/sys/fs/cgroup"));
    }

    #[test]
    fn parses_cpu_max() {
        let p = Path::new("cpu.max");
        assert_eq!(parse_cpu_max("max 100000\n", p).unwrap(), None);
        assert_eq!(parse_cpu_max("max", p).unwrap(), None);
        assert_eq!(
            parse_cpu_max("150000 100000", p).unwrap(),
            Some((150_000, 100_000))
        );
        assert_eq!(
            parse_cpu_max(" 50000 ", p).unwrap(),
            Some((50_000, 100_000))
        );
        for bad in [
            "",
            "  \n",
            "x 100000",
            "100 0",
            "100 -5",
            "1 2 3",
            "-1 100000",
        ] {
            let err = parse_cpu_max(bad, p).unwrap_err();
            assert!(err.to_string().contains("cpu.max"), "{bad:?}: {err}");
        }
    }
}
