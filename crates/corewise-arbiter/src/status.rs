//! Formatting of `corewise-arbiter status`.
//!
//! Why its own module: the table is what operators read, and it is easy to
//! test without a daemon. Application names come from `/proc/PID/comm`,
//! which every process sets as it likes: they are escaped (control
//! characters and escape sequences are shown, never sent to the terminal).

use crate::protocol::StatusEntry;
use crate::topology::CpuList;

/// A name fit for a terminal: control characters (escape sequences
/// included) and backslashes are written as Rust escapes.
///
/// ```
/// use corewise_arbiter::status::escape;
/// assert_eq!(escape("kv"), "kv");
/// assert_eq!(escape("a\x1b[2Jb"), "a\\u{1b}[2Jb");
/// ```
pub fn escape(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_control() || c == '\\' {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The status as JSON (one object per application; names are JSON strings,
/// so control characters are escaped by JSON itself).
///
/// ```
/// use corewise_arbiter::protocol::StatusEntry;
/// let j = corewise_arbiter::status::format_json(&[StatusEntry {
///     pid: 42, uid: 0, name: "k\x1bv".into(), requested: [1, 0, 0, 0, 0, 0, 0, 2],
///     granted: vec![1, 2], preempted: 3,
/// }]);
/// assert!(j.contains("\"pid\":42"));
/// assert!(j.contains("k\\u001bv"));
/// assert!(!j.contains('\x1b'));
/// ```
pub fn format_json(entries: &[StatusEntry]) -> String {
    let apps: Vec<serde_json::Value> = entries
        .iter()
        .map(|e| {
            serde_json::json!({
                "pid": e.pid,
                "uid": e.uid,
                "user": crate::config::user_name(e.uid),
                "name": e.name,
                "requested": e.requested,
                "granted": e.granted,
                "preempted": e.preempted,
            })
        })
        .collect();
    let mut out = serde_json::json!({ "applications": apps }).to_string();
    out.push('\n');
    out
}

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
            escape(&e.name),
            e.pid,
            escape(&user),
            req,
            granted,
            e.preempted
        ));
    }
    if entries.is_empty() {
        out.push_str("(no applications)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_reach_the_terminal_raw() {
        let e = StatusEntry {
            pid: 1,
            uid: 0,
            name: "\x1b[2J\x1b]0;pwned\x07\r\n".into(),
            requested: [0; 8],
            granted: vec![],
            preempted: 0,
        };
        let t = format_table(&[e]);
        assert!(!t.chars().any(|c| c.is_control() && c != '\n'), "{t:?}");
        assert_eq!(t.lines().count(), 2, "{t:?}");
        assert!(t.contains("\\u{1b}[2J"), "{t:?}");
    }
}
