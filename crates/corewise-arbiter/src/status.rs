//! Formatting of `corewise-arbiter status`.
//!
//! Why its own module: the table is what operators read, and it is easy to
//! test without a daemon.

use crate::protocol::StatusEntry;
use crate::topology::CpuList;

/// Renders the status table.
///
/// ```
/// use corewise_arbiter::protocol::StatusEntry;
/// let t = corewise_arbiter::status::format_table(&[StatusEntry {
///     pid: 42, uid: 0, name: "kv".into(), requested: [1, 0, 0, 0, 0, 0, 0, 2],
///     granted: vec![1, 2], preempted: 3,
/// }]);
/// assert!(t.contains("kv"));
/// assert!(t.contains("1-2"));
/// ```
pub fn format_table(entries: &[StatusEntry]) -> String {
    let mut out = format!(
        "{:<16} {:>8} {:<10} {:<24} {:<12} {:>9}\n",
        "APPLICATION", "PID", "USER", "REQUESTED (P0..P7)", "GRANTED", "PREEMPTED"
    );
    for e in entries {
        let user = crate::config::user_name(e.uid).unwrap_or_else(|| e.uid.to_string());
        let req = e
            .requested
            .iter()
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(",");
        let granted: CpuList = e.granted.iter().copied().collect();
        let granted = if granted.is_empty() {
            "-".to_string()
        } else {
            granted.to_string()
        };
        out.push_str(&format!(
            "{:<16} {:>8} {:<10} {:<24} {:<12} {:>9}\n",
            e.name, e.pid, user, req, granted, e.preempted
        ));
    }
    if entries.is_empty() {
        out.push_str("(no applications)\n");
    }
    out
}
