//! The systemd unit shipped in the crate: its hardening score, and that it
//! needs no config file to start.

use std::process::Command;

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/corewise-arbiter.service");

#[test]
fn unit_scores_at_most_4_in_systemd_analyze_security() {
    let Ok(out) = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", UNIT])
        .output()
    else {
        eprintln!("skipping: no systemd-analyze here");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| {
            panic!(
                "no score in:\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let score: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unreadable score: {line}"));
    assert!(score <= 4.0, "{line}");
}

#[test]
fn unit_starts_without_a_config_file() {
    let unit = std::fs::read_to_string(UNIT).unwrap();
    // Every file the unit reads is optional ("-" prefix) or passed through
    // a variable that is empty without it.
    for line in unit.lines().filter(|l| !l.trim_start().starts_with('#')) {
        if let Some(f) = line.strip_prefix("EnvironmentFile=") {
            assert!(f.starts_with('-'), "{line}: must be optional");
        }
        assert!(
            !line.contains("--config /"),
            "{line}: a config file nothing installs"
        );
    }
    // The daemon's defaults need no file either: the built-in config is
    // complete (its socket access resolves on any machine).
    assert!(corewise_arbiter::config::Config::default()
        .socket
        .resolve()
        .is_ok());
}
