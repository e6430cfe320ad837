//! Per-user limits from a TOML config file.
//!
//! Why: Arachne left the "anti-social application" (one that asks for every
//! core at the top priority) as future work. The administrator names, per user,
//! the most cores a user's applications may hold in total per application and
//! the highest priority level they may use; requests beyond that are clipped
//! and the client is told.
//!
//! ```toml
//! [defaults]
//! max_cores = 64
//! max_priority = 0      # 0 is the highest level
//!
//! [users.nobody]        # by name or by numeric uid ("65534")
//! max_cores = 1
//! max_priority = 5
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::protocol::PRIORITY_LEVELS;

/// Errors loading a config file.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// File.
        path: String,
        /// OS error.
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema.
    #[error("parsing config: {0}")]
    Parse(#[from] toml::de::Error),
    /// A value is out of range.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// Limits applying to one user.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most cores one application of this user may request in total.
    #[serde(default = "default_max_cores")]
    pub max_cores: u32,
    /// Highest priority level allowed (0 = highest, 7 = lowest); requests at
    /// more important levels are moved down to this level.
    #[serde(default)]
    pub max_priority: u8,
}

fn default_max_cores() -> u32 {
    u32::MAX
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_cores: u32::MAX,
            max_priority: 0,
        }
    }
}

/// The whole config file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Limits for users not listed.
    #[serde(default)]
    pub defaults: Limits,
    /// Limits per user name or numeric uid.
    #[serde(default)]
    pub users: BTreeMap<String, Limits>,
}

/// The outcome of applying limits to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Clipped {
    /// The request as it will be applied.
    pub effective: [u32; PRIORITY_LEVELS],
    /// Whether it differs from what was asked.
    pub clipped: bool,
}

impl Limits {
    /// Applies these limits to a request.
    ///
    /// ```
    /// use corewise_arbiter::config::Limits;
    /// let l = Limits { max_cores: 3, max_priority: 2 };
    /// let c = l.clip([2, 0, 0, 5, 0, 0, 0, 0]);
    /// assert_eq!(c.effective, [0, 0, 2, 1, 0, 0, 0, 0]);
    /// assert!(c.clipped);
    /// ```
    pub fn clip(&self, requested: [u32; PRIORITY_LEVELS]) -> Clipped {
        let floor = (self.max_priority as usize).min(PRIORITY_LEVELS - 1);
        let mut eff = [0u32; PRIORITY_LEVELS];
        for (level, &n) in requested.iter().enumerate() {
            eff[level.max(floor)] = eff[level.max(floor)].saturating_add(n);
        }
        let mut budget = self.max_cores;
        for v in eff.iter_mut() {
            let keep = (*v).min(budget);
            budget -= keep;
            *v = keep;
        }
        Clipped {
            effective: eff,
            clipped: eff != requested,
        }
    }
}

impl Config {
    /// Parses TOML text.
    ///
    /// ```
    /// use corewise_arbiter::config::Config;
    /// let c = Config::parse("[users.\"1000\"]\nmax_cores = 2\n").unwrap();
    /// assert_eq!(c.limits_for(1000).max_cores, 2);
    /// assert_eq!(c.limits_for(1001).max_cores, u32::MAX);
    /// ```
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let c: Config = toml::from_str(text)?;
        for (who, l) in std::iter::once(("defaults", &c.defaults))
            .chain(c.users.iter().map(|(k, v)| (k.as_str(), v)))
        {
            if l.max_priority as usize >= PRIORITY_LEVELS {
                return Err(ConfigError::Invalid(format!(
                    "{who}: max_priority must be 0..={}",
                    PRIORITY_LEVELS - 1
                )));
            }
        }
        Ok(c)
    }

    /// Reads and parses a file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Limits for `uid`: a numeric key first, then the user's name from
    /// /etc/passwd, then the defaults.
    pub fn limits_for(&self, uid: u32) -> Limits {
        if let Some(l) = self.users.get(&uid.to_string()) {
            return *l;
        }
        if let Some(name) = user_name(uid) {
            if let Some(l) = self.users.get(&name) {
                return *l;
            }
        }
        self.defaults
    }
}

/// Looks a user name up in /etc/passwd (no NSS: the daemon stays simple).
pub fn user_name(uid: u32) -> Option<String> {
    let text = std::fs::read_to_string("/etc/passwd").ok()?;
    text.lines().find_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        let id: u32 = f.next()?.parse().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve() {
        let c = Config::parse("[users.root]\nmax_cores = 1\nmax_priority = 7\n").unwrap();
        assert_eq!(
            c.limits_for(0),
            Limits {
                max_cores: 1,
                max_priority: 7
            }
        );
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Config::parse("[defaults]\nmax_priority = 8\n").is_err());
        assert!(Config::parse("[defaults]\nbogus = 1\n").is_err());
        assert!(Config::parse("[users.x]\nmax_cores = -1\n").is_err());
    }

    #[test]
    fn example_file_parses() {
        let c = Config::parse(include_str!("../corewise-arbiter.example.toml")).unwrap();
        assert_eq!(c.limits_for(65534).max_priority, 7);
        assert_eq!(c.limits_for(0).max_cores, 1024);
    }

    #[test]
    fn unclipped_is_reported_as_such() {
        let c = Limits::default().clip([1, 2, 3, 4, 5, 6, 7, 8]);
        assert!(!c.clipped);
    }
}
