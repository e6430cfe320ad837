//! Per-user limits from a TOML config file.
//!
//! Why: Arachne left the "anti-social application" (one that asks for every
//! core at the top priority) as future work, and the daemon is reachable by
//! every local user. The administrator names, per user, the most cores all of
//! a user's applications may hold together and the highest priority level
//! they may use (requests beyond that are clipped and the client is told),
//! and how many connections, applications and kernel threads one user may
//! register (beyond that the daemon refuses them). The `[socket]` section
//! says who may connect at all.
//!
//! ```toml
//! [defaults]
//! max_cores = 64
//! max_priority = 0      # 0 is the highest level
//! max_connections = 1200
//! max_apps = 64
//! max_threads = 1024
//!
//! [users.nobody]        # by name or by numeric uid ("65534")
//! max_cores = 1
//! max_priority = 5
//!
//! [socket]              # default: owner root, group "corewise" (root if
//! mode = 0o660          # that group does not exist), mode 0o660
//! group = "corewise"
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use thiserror::Error;

use crate::protocol::PRIORITY_LEVELS;

/// Errors loading a config file.
///
/// ```
/// use corewise_arbiter::config::{Config, ConfigError};
/// assert!(matches!(Config::parse("[defaults]\nmax_priority = 8\n"), Err(ConfigError::Invalid(_))));
/// assert!(matches!(Config::parse("[defaults\n"), Err(ConfigError::Parse(_))));
/// let missing = std::env::temp_dir().join(format!("no-such-config-{}.toml", std::process::id()));
/// assert!(matches!(Config::load(&missing), Err(ConfigError::Io { .. })));
/// ```
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

/// Limits applying to one user (all of its applications together).
///
/// ```
/// use corewise_arbiter::config::Config;
/// let c = Config::parse("[defaults]\nmax_cores = 4\nmax_priority = 2\n").unwrap();
/// let l = c.limits_for(12345);
/// assert_eq!((l.max_cores, l.max_priority), (4, 2));
/// // Fields left out keep their defaults.
/// assert_eq!(l.max_apps, corewise_arbiter::config::DEFAULT_MAX_APPS);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most cores this user's applications may hold together (and one
    /// application may request).
    #[serde(default = "default_max_cores")]
    pub max_cores: u32,
    /// Highest priority level allowed (0 = highest, 7 = lowest); requests at
    /// more important levels are moved down to this level.
    #[serde(default)]
    pub max_priority: u8,
    /// Most connections (applications, kernel threads, status queries) this
    /// user may have open at once; more are closed at once.
    #[serde(default = "default_max_connections")]
    pub max_connections: u32,
    /// Most applications this user may register at once.
    #[serde(default = "default_max_apps")]
    pub max_apps: u32,
    /// Most kernel threads this user's applications may attach at once.
    #[serde(default = "default_max_threads")]
    pub max_threads: u32,
}

/// Default of [`Limits::max_connections`]: every application and kernel
/// thread allowed by the other two defaults, plus room for status queries.
///
/// ```
/// use corewise_arbiter::config::{Limits, DEFAULT_MAX_CONNECTIONS};
/// assert_eq!(Limits::default().max_connections, DEFAULT_MAX_CONNECTIONS);
/// ```
pub const DEFAULT_MAX_CONNECTIONS: u32 = 1200;
/// Default of [`Limits::max_apps`].
///
/// ```
/// use corewise_arbiter::config::{Config, DEFAULT_MAX_APPS};
/// let c = Config::parse("[defaults]\nmax_cores = 2\n").unwrap();
/// assert_eq!(c.defaults.max_apps, DEFAULT_MAX_APPS);
/// ```
pub const DEFAULT_MAX_APPS: u32 = 64;
/// Default of [`Limits::max_threads`] (one per kernel thread that may hold
/// a core; a runtime needs at most one per managed core and application).
///
/// ```
/// use corewise_arbiter::config::{Limits, DEFAULT_MAX_THREADS};
/// assert_eq!(Limits::default().max_threads, DEFAULT_MAX_THREADS);
/// ```
pub const DEFAULT_MAX_THREADS: u32 = 1024;

fn default_max_cores() -> u32 {
    u32::MAX
}
fn default_max_connections() -> u32 {
    DEFAULT_MAX_CONNECTIONS
}
fn default_max_apps() -> u32 {
    DEFAULT_MAX_APPS
}
fn default_max_threads() -> u32 {
    DEFAULT_MAX_THREADS
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_cores: u32::MAX,
            max_priority: 0,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_apps: DEFAULT_MAX_APPS,
            max_threads: DEFAULT_MAX_THREADS,
        }
    }
}

/// Who may connect to the daemon's socket (the `[socket]` section).
///
/// The default is owner root (the daemon's user), group `corewise` when that
/// group exists (else the daemon's group, root's), mode `0o660`: only root
/// and the members of `corewise` may use the arbiter until the administrator
/// decides otherwise (the per-user limits still apply to everyone who may
/// connect).
///
/// ```
/// use corewise_arbiter::config::Config;
/// let c = Config::parse("[socket]\nowner = \"0\"\ngroup = \"0\"\nmode = 0o666\n").unwrap();
/// assert_eq!(c.socket.mode, Some(0o666));
/// assert_eq!(c.socket.resolve().unwrap().mode, 0o666);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SocketConfig {
    /// Owner: a user name or numeric uid (default: the daemon's user, root).
    pub owner: Option<String>,
    /// Group: a group name or numeric gid (default `corewise` if it exists,
    /// else the daemon's group).
    pub group: Option<String>,
    /// Permission bits, e.g. `0o660` (default) or `0o666` (every local user).
    pub mode: Option<u32>,
}

/// Default group of the socket when it exists.
///
/// ```
/// use corewise_arbiter::config::{group_id, SocketConfig, DEFAULT_SOCKET_GROUP};
/// let a = SocketConfig::default().resolve().unwrap();
/// // The group `corewise` where it exists, else the daemon's own group.
/// let expected = group_id(DEFAULT_SOCKET_GROUP).unwrap_or_else(|| rustix::process::getegid().as_raw());
/// assert_eq!(a.gid, expected);
/// ```
pub const DEFAULT_SOCKET_GROUP: &str = "corewise";
/// Default mode of the socket.
///
/// ```
/// use corewise_arbiter::config::{SocketConfig, DEFAULT_SOCKET_MODE};
/// assert_eq!(SocketConfig::default().resolve().unwrap().mode, DEFAULT_SOCKET_MODE);
/// assert_eq!(DEFAULT_SOCKET_MODE & 0o007, 0); // no access for others
/// ```
pub const DEFAULT_SOCKET_MODE: u32 = 0o660;

/// The socket's owner, group and mode after defaults and name look-ups.
///
/// ```
/// use corewise_arbiter::config::{SocketAccess, SocketConfig};
/// let s = SocketConfig { owner: Some("0".into()), group: Some("0".into()), mode: None };
/// assert_eq!(s.resolve().unwrap(), SocketAccess { uid: 0, gid: 0, mode: 0o660 });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SocketAccess {
    /// Owner uid.
    pub uid: u32,
    /// Group gid.
    pub gid: u32,
    /// Permission bits.
    pub mode: u32,
}

impl SocketConfig {
    /// Resolves names and applies the defaults.
    ///
    /// ```
    /// use corewise_arbiter::config::SocketConfig;
    /// let s = SocketConfig { owner: Some("0".into()), group: Some("0".into()), mode: Some(0o600) };
    /// let a = s.resolve().unwrap();
    /// assert_eq!((a.uid, a.gid, a.mode), (0, 0, 0o600));
    /// assert!(SocketConfig { mode: Some(0o7777), ..SocketConfig::default() }.resolve().is_err());
    /// ```
    pub fn resolve(&self) -> Result<SocketAccess, ConfigError> {
        let uid = match &self.owner {
            None => rustix::process::geteuid().as_raw(),
            Some(o) => match o.parse() {
                Ok(n) => n,
                Err(_) => user_id(o).ok_or_else(|| {
                    ConfigError::Invalid(format!("socket owner {o:?}: no such user"))
                })?,
            },
        };
        let gid = match &self.group {
            None => group_id(DEFAULT_SOCKET_GROUP)
                .unwrap_or_else(|| rustix::process::getegid().as_raw()),
            Some(g) => match g.parse() {
                Ok(n) => n,
                Err(_) => group_id(g).ok_or_else(|| {
                    ConfigError::Invalid(format!("socket group {g:?}: no such group"))
                })?,
            },
        };
        let mode = self.mode.unwrap_or(DEFAULT_SOCKET_MODE);
        if mode > 0o777 {
            return Err(ConfigError::Invalid(format!(
                "socket mode {mode:#o}: only permission bits (at most 0o777)"
            )));
        }
        Ok(SocketAccess { uid, gid, mode })
    }
}

/// The whole config file.
///
/// ```
/// use corewise_arbiter::config::Config;
/// let c = Config::parse("[defaults]\nmax_cores = 8\n[users.\"1000\"]\nmax_cores = 1\n").unwrap();
/// assert_eq!(c.defaults.max_cores, 8);
/// assert_eq!(c.users["1000"].max_cores, 1);
/// assert_eq!(Config::default().users.len(), 0);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Limits for users not listed.
    #[serde(default)]
    pub defaults: Limits,
    /// Limits per user name or numeric uid.
    #[serde(default)]
    pub users: BTreeMap<String, Limits>,
    /// Owner, group and mode of the socket.
    #[serde(default)]
    pub socket: SocketConfig,
}

/// The outcome of applying limits to a request.
///
/// ```
/// use corewise_arbiter::config::{Clipped, Limits};
/// let l = Limits { max_cores: 2, ..Limits::default() };
/// assert_eq!(l.clip([1, 0, 0, 0, 0, 0, 0, 0]), Clipped { effective: [1, 0, 0, 0, 0, 0, 0, 0], clipped: false });
/// assert_eq!(l.clip([0, 3, 0, 0, 0, 0, 0, 0]), Clipped { effective: [0, 2, 0, 0, 0, 0, 0, 0], clipped: true });
/// ```
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
    /// let l = Limits { max_cores: 3, max_priority: 2, ..Limits::default() };
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
        c.socket.resolve()?;
        Ok(c)
    }

    /// Reads and parses a file.
    ///
    /// ```
    /// use corewise_arbiter::config::Config;
    /// let path = std::env::temp_dir().join(format!("arbiter-config-doc-{}.toml", std::process::id()));
    /// std::fs::write(&path, "[defaults]\nmax_cores = 3\n")?;
    /// let c = Config::load(&path)?;
    /// assert_eq!(c.limits_for(4242).max_cores, 3);
    /// std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text)
    }

    /// Limits for `uid`: a numeric key first, then the user's name from
    /// /etc/passwd, then the defaults.
    ///
    /// ```
    /// use corewise_arbiter::config::Config;
    /// let c = Config::parse("[defaults]\nmax_cores = 4\n[users.root]\nmax_cores = 1\n[users.\"4242\"]\nmax_cores = 2\n").unwrap();
    /// assert_eq!(c.limits_for(0).max_cores, 1); // by name from /etc/passwd
    /// assert_eq!(c.limits_for(4242).max_cores, 2); // by number
    /// assert_eq!(c.limits_for(4243).max_cores, 4); // the defaults
    /// ```
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

/// `(name, id)` of each entry of a passwd-style file (name:pw:id:...).
fn id_entries(file: &str) -> Vec<(String, u32)> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut f = line.split(':');
            let name = f.next()?;
            let _pw = f.next()?;
            let id: u32 = f.next()?.parse().ok()?;
            Some((name.to_string(), id))
        })
        .collect()
}

/// Looks a user name up in /etc/passwd (no NSS: the daemon stays simple).
///
/// ```
/// use corewise_arbiter::config::user_name;
/// assert_eq!(user_name(0).as_deref(), Some("root"));
/// assert_eq!(user_name(u32::MAX - 7), None);
/// ```
pub fn user_name(uid: u32) -> Option<String> {
    id_entries("/etc/passwd")
        .into_iter()
        .find_map(|(name, id)| (id == uid).then_some(name))
}

/// Looks a user's uid up in /etc/passwd.
///
/// ```
/// assert_eq!(corewise_arbiter::config::user_id("root"), Some(0));
/// ```
pub fn user_id(name: &str) -> Option<u32> {
    id_entries("/etc/passwd")
        .into_iter()
        .find_map(|(n, id)| (n == name).then_some(id))
}

/// Looks a group's gid up in /etc/group.
///
/// ```
/// assert_eq!(corewise_arbiter::config::group_id("root"), Some(0));
/// ```
pub fn group_id(name: &str) -> Option<u32> {
    id_entries("/etc/group")
        .into_iter()
        .find_map(|(n, id)| (n == name).then_some(id))
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
                max_priority: 7,
                ..Limits::default()
            }
        );
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Config::parse("[defaults]\nmax_priority = 8\n").is_err());
        assert!(Config::parse("[defaults]\nbogus = 1\n").is_err());
        assert!(Config::parse("[users.x]\nmax_cores = -1\n").is_err());
        assert!(Config::parse("[socket]\nmode = 0o4777\n").is_err());
        assert!(Config::parse("[socket]\ngroup = \"no-such-group-here\"\n").is_err());
    }

    #[test]
    fn socket_defaults_are_not_world_writable() {
        let a = Config::default().socket.resolve().unwrap();
        let me = rustix::process::geteuid().as_raw();
        assert_eq!((a.uid, a.mode), (me, DEFAULT_SOCKET_MODE));
        assert_eq!(a.mode & 0o007, 0);
        let group = rustix::process::getegid().as_raw();
        assert_eq!(a.gid, group_id(DEFAULT_SOCKET_GROUP).unwrap_or(group));
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
