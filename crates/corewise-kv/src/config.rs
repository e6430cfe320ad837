//! The server's settings, read from memcached's command-line flags.
//!
//! Why memcached's flags: scripts and load generators that start memcached
//! start this server unchanged, and so do distributions' configurations
//! (`-d`, `-u`, `-P`; a flag given twice takes its last value). Flags that
//! make no sense here (UDP, SASL, slab tuning) are not accepted, so a typo
//! is not silently ignored; `-U 0` (UDP off) is accepted because it is
//! what scripts usually pass.

use clap::Parser;
use std::path::PathBuf;
use thiserror::Error;

/// How connections map to user threads.
///
/// ```
/// use clap::Parser;
/// use corewise_kv::config::{Args, Mode};
/// let c = Args::try_parse_from(["corewise-kv", "--mode", "dispatch"])?.into_config()?;
/// assert_eq!(c.mode, Mode::Dispatch);
/// assert_eq!(Mode::Conn.to_string(), "conn");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// One user thread per connection, blocked in read (Fred/libfibre).
    Conn,
    /// One dispatch thread waits on every connection and creates a
    /// short-lived user thread per ready connection (Arachne).
    Dispatch,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Conn => "conn",
            Mode::Dispatch => "dispatch",
        })
    }
}

/// The runtime's I/O back end.
///
/// ```
/// use clap::Parser;
/// use corewise_kv::config::{Args, Io};
/// let c = Args::try_parse_from(["corewise-kv", "--io", "uring"])?.into_config()?;
/// assert_eq!(c.io, Io::Uring);
/// assert_eq!(Args::try_parse_from(["corewise-kv"])?.into_config()?.io, Io::Epoll);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Io {
    /// One epoll set per core (the default: measured lower latency for
    /// connections blocked in read, see the crate README notes).
    Epoll,
    /// One io_uring per core.
    Uring,
}

/// The protocols a connection may speak (memcached's `-B`).
///
/// ```
/// use clap::Parser;
/// use corewise_kv::config::{Args, Protocol};
/// assert_eq!(Args::try_parse_from(["corewise-kv"])?.protocol, Protocol::Auto);
/// assert_eq!(Args::try_parse_from(["corewise-kv", "-B", "ascii"])?.protocol, Protocol::Ascii);
/// assert_eq!(Protocol::Auto.to_string(), "auto-negotiate"); // as `stats settings` says
/// assert!(Args::try_parse_from(["corewise-kv", "-B", "udp"]).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// Each connection's first byte decides: the binary protocol's magic
    /// byte, or text.
    Auto,
    /// Text only: binary requests are read as text lines.
    Ascii,
    /// Binary only: a request without the binary magic byte closes the
    /// connection.
    Binary,
}

impl std::fmt::Display for Protocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Protocol::Auto => "auto-negotiate",
            Protocol::Ascii => "ascii",
            Protocol::Binary => "binary",
        })
    }
}

/// A bad flag value.
///
/// ```
/// use clap::Parser;
/// use corewise_kv::config::{Args, ConfigError};
/// let check = |argv: &[&str]| Args::try_parse_from(argv).unwrap().into_config().err();
/// assert_eq!(check(&["corewise-kv", "-m", "0"]), Some(ConfigError::Memory));
/// assert_eq!(check(&["corewise-kv", "-U", "11211"]), Some(ConfigError::Udp));
/// assert_eq!(check(&["corewise-kv", "-R", "0"]), Some(ConfigError::ReqsPerEvent));
/// assert_eq!(check(&["corewise-kv", "-a", "9"]), Some(ConfigError::UnixMask("9".into())));
/// assert_eq!(check(&["corewise-kv", "-o", "hashpower=20"]), Some(ConfigError::Extended("hashpower=20".into())));
/// assert_eq!(check(&["corewise-kv", "-o", "idle_timeout=soon"]), Some(ConfigError::Extended("idle_timeout=soon".into())));
/// assert_eq!(check(&["corewise-kv", "-m", "1", "-I", "2m"]), Some(ConfigError::ItemOverMemory { item: 2 << 20, memory_mb: 1 }));
/// // One listening address: a list, host:port or -l twice is refused.
/// assert!(matches!(check(&["corewise-kv", "-l", "127.0.0.1,::1"]), Some(ConfigError::Listen(_))));
/// assert!(matches!(check(&["corewise-kv", "-l", "127.0.0.1:11212"]), Some(ConfigError::Listen(_))));
/// assert!(matches!(check(&["corewise-kv", "-l", "127.0.0.1", "-l", "::1"]), Some(ConfigError::Listen(_))));
/// assert_eq!(check(&["corewise-kv", "-l", "::1"]), None);
/// ```
#[derive(Debug, Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `-I` is not a size, or outside 1 KiB..1 GiB.
    #[error("-I: item size limit {0:?} must be between 1k and 1024m (a number with an optional k or m suffix)")]
    ItemSize(String),
    /// `-m` is zero.
    #[error("-m: the memory limit must be at least 1 MB")]
    Memory,
    /// `-c` is zero.
    #[error("-c: the connection limit must be at least 1")]
    Connections,
    /// `-t` is zero.
    #[error("-t: the core count must be at least 1")]
    Threads,
    /// The item size limit exceeds the memory limit.
    #[error("-I {item} is larger than the memory limit -m {memory_mb} MB")]
    ItemOverMemory {
        /// `-I` in bytes.
        item: usize,
        /// `-m`.
        memory_mb: usize,
    },
    /// `--cpus` is not a CPU list.
    #[error("--cpus: {0:?} is not a CPU list like 0,2-3")]
    Cpus(String),
    /// `-U` other than 0.
    #[error("-U: UDP is not supported; only -U 0 is accepted")]
    Udp,
    /// An `-o` option this server does not have, or a bad value.
    #[error("-o {0}: not an option of this server, or a bad value (it takes idle_timeout=SECONDS, track_sizes, lru_crawler, no_lru_crawler, modern, maxconns_fast)")]
    Extended(String),
    /// `-a` is not an octal mode.
    #[error("-a: {0:?} is not a file mode in octal, like 700")]
    UnixMask(String),
    /// `-R` is zero.
    #[error("-R: the number of requests per event must be greater than 0")]
    ReqsPerEvent,
    /// `-D` with an empty delimiter.
    #[error("-D: no delimiter specified")]
    Delimiter,
    /// `-f` not above 1.
    #[error("-f: the slab growth factor must be greater than 1")]
    GrowthFactor,
    /// `-n` is zero.
    #[error("-n: the slab minimum size must be greater than 0")]
    SlabMin,
    /// `-l` given several addresses (a list, `host:port`, or `-l` twice).
    #[error("-l {0}: one address only; a list of addresses, host:port, or -l given twice is not supported")]
    Listen(String),
}

/// Command line of `corewise-kv` (memcached's flags).
///
/// ```
/// use clap::Parser;
/// use corewise_kv::config::Args;
/// // memcached's flags.
/// let a = Args::try_parse_from(["corewise-kv", "-p", "22122", "-m", "128", "-c", "10", "-A"])?;
/// assert_eq!((a.port, a.memory_mb, a.max_conns, a.enable_shutdown), (22122, 128, 10, true));
/// // A flag given twice: the last value, as memcached takes it.
/// assert_eq!(Args::try_parse_from(["corewise-kv", "-m", "32", "-m", "48"])?.memory_mb, 48);
/// // Debian's memcached.conf flags.
/// let a = Args::try_parse_from(["corewise-kv", "-d", "-u", "memcache", "-P", "/run/kv.pid"])?;
/// assert!(a.daemon && a.user.as_deref() == Some("memcache"));
/// // Commands turned off, and connection fairness and backlog.
/// // Other slab classes.
/// let c = Args::try_parse_from(["corewise-kv", "-f", "2", "-n", "100"])?.into_config().unwrap();
/// assert_eq!((c.growth_factor, c.slab_min), (2.0, 100));
/// assert!(Args::try_parse_from(["corewise-kv", "-f", "1"])?.into_config().is_err());
/// // Prefix statistics with another delimiter, on from the start.
/// let c = Args::try_parse_from(["corewise-kv", "-D", "/"])?.into_config().unwrap();
/// assert_eq!((c.prefix_delimiter, c.detail_on_start), (b'/', true));
/// assert!(Args::try_parse_from(["corewise-kv", "-D", ""])?.into_config().is_err());
/// let c = Args::try_parse_from(["corewise-kv", "-F", "-X", "-W", "-C", "-R", "5", "-b", "64"])?
///     .into_config()
///     .unwrap();
/// assert!(!c.flush_enabled && !c.dump_enabled && !c.watch_enabled && !c.cas_enabled);
/// assert_eq!((c.reqs_per_event, c.backlog), (5, 64));
/// // A unix socket instead of the network, and its permissions.
/// let c = Args::try_parse_from(["corewise-kv", "-s", "/run/kv.sock", "-a", "770"])?
///     .into_config()
///     .unwrap();
/// assert_eq!(c.unix_socket.as_deref(), Some(std::path::Path::new("/run/kv.sock")));
/// assert_eq!(c.unix_mask, 0o770);
/// // Extended options, in one list or several.
/// let c = Args::try_parse_from(["corewise-kv", "-o", "idle_timeout=600,track_sizes", "-o", "no_lru_crawler"])?
///     .into_config()
///     .unwrap();
/// assert_eq!((c.idle_timeout, c.track_sizes, c.lru_crawler), (600, true, false));
/// assert!(Args::try_parse_from(["corewise-kv", "--no-such-flag"]).is_err());
/// # Ok::<(), clap::Error>(())
/// ```
#[derive(Debug, Clone, Parser)]
#[command(
    name = "corewise-kv",
    version,
    about = "A memcached-compatible server on corewise user threads",
    // The doc comment above is for the library's readers (it holds a
    // doctest); without this clap would print it as `--help`'s text.
    long_about = None,
    // A flag given twice takes its last value, as memcached's getopt loop
    // does (wrapper scripts append their own flags after the defaults).
    args_override_self = true
)]
pub struct Args {
    /// TCP port to listen on.
    #[arg(short = 'p', long = "port", default_value_t = 11211)]
    pub port: u16,
    /// Interface to listen on (one address: memcached's lists and
    /// `host:port` forms are refused with a clear error).
    #[arg(short = 'l', long = "listen", default_value = "127.0.0.1", action = clap::ArgAction::Append)]
    pub listen: Vec<String>,
    /// Item memory in megabytes.
    #[arg(short = 'm', long = "memory-limit", default_value_t = 64)]
    pub memory_mb: usize,
    /// Maximum simultaneous connections.
    #[arg(short = 'c', long = "conn-limit", default_value_t = 1024)]
    pub max_conns: usize,
    /// Item size limit (bytes, or with k/m suffix).
    #[arg(short = 'I', long = "max-item-size", default_value = "1m")]
    pub item_size: String,
    /// Maximum cores the runtime may use (memcached's thread count; the
    /// runtime grows and shrinks its cores with load up to this number).
    /// Default: every CPU the process may run on.
    #[arg(short = 't', long = "threads")]
    pub threads: Option<usize>,
    /// UDP port: only 0 (off) is accepted.
    #[arg(short = 'U', long = "udp-port", default_value_t = 0)]
    pub udp_port: u16,
    /// Verbose: log connections and errors to stderr.
    #[arg(short = 'v', action = clap::ArgAction::Count)]
    pub verbose: u8,
    /// Connection handling: a user thread per connection, or a dispatch
    /// thread creating a user thread per ready connection. `conn` is the
    /// default by measurement (one server CPU, 50 connections, ETC mix:
    /// lower median latency and higher closed-loop throughput than
    /// `dispatch`, whose extra hop per ready connection costs more than
    /// it saves on one core). Both take connections up to `-c`.
    #[arg(long = "mode", value_enum, default_value_t = Mode::Conn)]
    pub mode: Mode,
    /// The runtime's I/O back end. epoll is the default by measurement
    /// (`corewise-bench kv`, one server CPU, ETC mix, 31k-248k requests/s):
    /// io_uring's median is a little lower (10 vs 12 µs at 31k/s), but one
    /// run in three at low load showed a p99 of 1-2 ms, which epoll's runs
    /// did not.
    #[arg(long = "io", value_enum, default_value_t = Io::Epoll)]
    pub io: Io,
    /// CPUs the runtime may use, e.g. `0` or `2-3` (default: all allowed).
    #[arg(long = "cpus")]
    pub cpus: Option<String>,
    /// Take cores from the corewise-arbiter daemon at this socket (if it
    /// cannot be reached, the in-process arbiter is used and a warning
    /// printed).
    #[arg(long = "arbiter")]
    pub arbiter: Option<PathBuf>,
    /// How long an idle core polls for work before it sleeps in the kernel,
    /// in microseconds (the runtime's idle spin budget; the runtime's own
    /// default is 50). Measured with `corewise-bench kv` on one shared CPU
    /// (2026-11-24, AMD host): with 50 the core almost never sleeps at
    /// 89k requests/s and its p99 was 0.6-2.3 ms in all of 12 runs
    /// (memcached 0.15-0.9 ms, but for three runs in a noisy spell); with
    /// 10 it was 0.06-0.16 ms, for a median of 19-23 µs instead of 14-24
    /// (memcached 27-42). A core that never sleeps is the one the kernel
    /// makes share its CPU with any other task that wakes there; one that
    /// sleeps between bursts is woken ahead of them.
    #[arg(long = "idle-spin-us", default_value_t = 10)]
    pub idle_spin_us: u64,
    /// Allow `shutdown` (memcached's `-A`).
    #[arg(short = 'A', long = "enable-shutdown")]
    pub enable_shutdown: bool,
    /// Return an error when memory is exhausted instead of evicting items
    /// (`SERVER_ERROR out of memory storing object`).
    #[arg(short = 'M', long = "disable-evictions")]
    pub no_evictions: bool,
    /// Run as a daemon: detach from the terminal once listening (stdio to
    /// /dev/null).
    #[arg(short = 'd', long = "daemon")]
    pub daemon: bool,
    /// Write the server's process id to this file (after `-d` detaches).
    #[arg(short = 'P', long = "pidfile")]
    pub pid_file: Option<PathBuf>,
    /// Run as this user once listening (only when started as root).
    #[arg(short = 'u', long = "user")]
    pub user: Option<String>,
    /// Requests a connection runs from one read before it lets the other
    /// connections run (memcached's `-R`; `conn_yields` counts the times).
    #[arg(short = 'R', long = "max-reqs-per-event", default_value_t = 20)]
    pub reqs_per_event: u32,
    /// Connections the kernel queues before they are accepted (the listen
    /// backlog, memcached's `-b`; the kernel caps it at
    /// `net.core.somaxconn`).
    #[arg(short = 'b', long = "listen-backlog", default_value_t = 1024)]
    pub backlog: u32,
    /// Refuse `flush_all` (memcached's `-F`).
    #[arg(short = 'F', long = "disable-flush-all")]
    pub disable_flush_all: bool,
    /// Turn CAS values off (memcached's `-C`): every item shows CAS 0 and
    /// a `cas` never matches.
    #[arg(short = 'C', long = "disable-cas")]
    pub disable_cas: bool,
    /// The growth factor between slab classes' chunk sizes (memcached's
    /// `-f`; this server's items are not kept in slabs, but its `stats
    /// slabs` and `stats items` report the classes memcached would use).
    #[arg(short = 'f', long = "slab-growth-factor", default_value_t = 1.25)]
    pub growth_factor: f64,
    /// The minimum space for key, value and flags of the smallest slab
    /// class (memcached's `-n`, in bytes).
    #[arg(short = 'n', long = "slab-min-size", default_value_t = 48)]
    pub slab_min: usize,
    /// The character between a key's prefix and the rest, for `stats
    /// detail` (memcached's `-D`; its first byte counts): giving it also
    /// turns prefix statistics on from the start.
    #[arg(short = 'D', value_name = "CHAR")]
    pub prefix_delimiter: Option<std::ffi::OsString>,
    /// Raise the core file size limit as far as allowed (memcached's
    /// `-r`); the server refuses to start if core files stay off.
    #[arg(short = 'r', long = "enable-coredumps")]
    pub enable_coredumps: bool,
    /// The protocols connections may speak (memcached's `-B`): `auto`
    /// (each connection's first byte decides), `ascii` or `binary`.
    #[arg(short = 'B', long = "protocol", value_enum, default_value_t = Protocol::Auto)]
    pub protocol: Protocol,
    /// Refuse `stats cachedump` and `lru_crawler metadump` (memcached's
    /// `-X`).
    #[arg(short = 'X', long = "disable-dumping")]
    pub disable_dumping: bool,
    /// Refuse `watch` (memcached's `-W`).
    #[arg(short = 'W', long = "disable-watch")]
    pub disable_watch: bool,
    /// Listen on this unix socket file instead of the network (memcached's
    /// `-s`; a socket file left there is replaced).
    #[arg(short = 's', long = "unix-socket")]
    pub unix_socket: Option<PathBuf>,
    /// Permissions of the unix socket file, in octal (memcached's `-a`).
    #[arg(short = 'a', long = "unix-mask", default_value = "700")]
    pub unix_mask: String,
    /// memcached's extended options, comma-separated: `idle_timeout=N`
    /// (close a connection idle for more than N seconds), `track_sizes`
    /// (`stats sizes` on from the start), `no_lru_crawler` (the crawler off
    /// until `lru_crawler enable`), and `lru_crawler`, `modern` and
    /// `maxconns_fast`, which name what this server does anyway.
    #[arg(short = 'o', long = "extended", action = clap::ArgAction::Append)]
    pub extended: Vec<String>,
}

/// Whether `-l`'s value names one address and no port: not a list
/// (`a,b`), not `host:port` (one colon) nor `[v6]:port`; an IPv6 address
/// alone has two colons or more.
fn is_one_address(s: &str) -> bool {
    !s.contains(',') && s.matches(':').count() != 1 && !s.contains("]:")
}

/// Validated settings.
///
/// ```
/// use corewise_kv::config::{Config, Mode};
/// let c = Config::default(); // memcached's defaults
/// assert_eq!((c.port, c.memory_mb, c.max_conns, c.item_max), (11211, 64, 1024, 1 << 20));
/// assert_eq!(c.mode, Mode::Conn);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// TCP port.
    pub port: u16,
    /// Listen address.
    pub listen: String,
    /// Memory limit in MB.
    pub memory_mb: usize,
    /// Connection limit.
    pub max_conns: usize,
    /// Item size limit in bytes.
    pub item_max: usize,
    /// Maximum cores.
    pub threads: usize,
    /// Connection handling.
    pub mode: Mode,
    /// I/O back end.
    pub io: Io,
    /// CPUs for the runtime.
    pub cpus: Option<Vec<usize>>,
    /// Arbiter daemon socket.
    pub arbiter: Option<PathBuf>,
    /// Idle spin budget of each core, µs.
    pub idle_spin_us: u64,
    /// Verbosity.
    pub verbose: u8,
    /// `shutdown` allowed (`-A`).
    pub enable_shutdown: bool,
    /// No evictions (`-M`).
    pub no_evictions: bool,
    /// Detach from the terminal (`-d`).
    pub daemon: bool,
    /// Pid file (`-P`).
    pub pid_file: Option<PathBuf>,
    /// User to run as (`-u`).
    pub user: Option<String>,
    /// Requests run from one read before yielding (`-R`).
    pub reqs_per_event: u32,
    /// Listen backlog (`-b`).
    pub backlog: u32,
    /// `flush_all` allowed (no `-F`).
    pub flush_enabled: bool,
    /// Items carry CAS values (no `-C`).
    pub cas_enabled: bool,
    /// The protocols connections may speak (`-B`).
    pub protocol: Protocol,
    /// The key prefix delimiter of `stats detail` (`-D`, `:` by default).
    pub prefix_delimiter: u8,
    /// The slab classes' growth factor (`-f`).
    pub growth_factor: f64,
    /// The smallest slab class's minimum for key, value and flags (`-n`).
    pub slab_min: usize,
    /// Prefix statistics on from the start (`-D` given).
    pub detail_on_start: bool,
    /// Raise the core file size limit (`-r`).
    pub enable_coredumps: bool,
    /// `stats cachedump` and `lru_crawler metadump` allowed (no `-X`).
    pub dump_enabled: bool,
    /// `watch` allowed (no `-W`).
    pub watch_enabled: bool,
    /// Unix socket file to listen on instead of TCP (`-s`).
    pub unix_socket: Option<PathBuf>,
    /// Permissions of the unix socket file (`-a`).
    pub unix_mask: u32,
    /// Seconds after which an idle connection is closed, 0 for never
    /// (`-o idle_timeout`).
    pub idle_timeout: u32,
    /// `stats sizes` on from the start (`-o track_sizes`).
    pub track_sizes: bool,
    /// The LRU crawler on at start (`-o no_lru_crawler` turns it off).
    pub lru_crawler: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            port: 11211,
            listen: "127.0.0.1".into(),
            memory_mb: 64,
            max_conns: 1024,
            item_max: 1024 * 1024,
            threads: 1,
            mode: Mode::Conn,
            io: Io::Epoll,
            cpus: None,
            arbiter: None,
            idle_spin_us: 10,
            verbose: 0,
            enable_shutdown: false,
            no_evictions: false,
            daemon: false,
            pid_file: None,
            user: None,
            reqs_per_event: 20,
            backlog: 1024,
            flush_enabled: true,
            cas_enabled: true,
            protocol: Protocol::Auto,
            prefix_delimiter: b':',
            growth_factor: 1.25,
            slab_min: 48,
            detail_on_start: false,
            enable_coredumps: false,
            dump_enabled: true,
            watch_enabled: true,
            unix_socket: None,
            unix_mask: 0o700,
            idle_timeout: 0,
            track_sizes: false,
            lru_crawler: true,
        }
    }
}

/// Parses a size like `1m`, `512k`, `2048`.
///
/// ```
/// assert_eq!(corewise_kv::config::parse_size("1m"), Some(1 << 20));
/// assert_eq!(corewise_kv::config::parse_size("512K"), Some(512 << 10));
/// assert_eq!(corewise_kv::config::parse_size("x"), None);
/// ```
pub fn parse_size(s: &str) -> Option<usize> {
    let s = s.trim();
    let (digits, mult) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1024),
        b'm' | b'M' => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(mult)
}

/// Parses a CPU list like `0,2-3`.
///
/// ```
/// assert_eq!(corewise_kv::config::parse_cpus("0,2-3"), Some(vec![0, 2, 3]));
/// assert_eq!(corewise_kv::config::parse_cpus("3-1"), None);
/// ```
pub fn parse_cpus(s: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                if a > b || b >= 1024 {
                    return None;
                }
                v.extend(a..=b);
            }
            None => v.push(part.trim().parse().ok()?),
        }
    }
    (!v.is_empty()).then_some(v)
}

impl Args {
    /// Checks the flags and turns them into a [`Config`].
    ///
    /// ```
    /// use clap::Parser;
    /// use corewise_kv::config::Args;
    /// let c = Args::try_parse_from(["corewise-kv", "-I", "2m", "-t", "3", "--cpus", "0,2-3"])?.into_config()?;
    /// assert_eq!((c.item_max, c.threads), (2 << 20, 3));
    /// assert_eq!(c.cpus, Some(vec![0, 2, 3]));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let item_max = parse_size(&self.item_size)
            .filter(|&n| (1024..=1024 * 1024 * 1024).contains(&n))
            .ok_or_else(|| ConfigError::ItemSize(self.item_size.clone()))?;
        if self.memory_mb == 0 {
            return Err(ConfigError::Memory);
        }
        if self.max_conns == 0 {
            return Err(ConfigError::Connections);
        }
        if self.udp_port != 0 {
            return Err(ConfigError::Udp);
        }
        if self.reqs_per_event == 0 {
            return Err(ConfigError::ReqsPerEvent);
        }
        // Not above 1, NaN included.
        if self.growth_factor.partial_cmp(&1.0) != Some(std::cmp::Ordering::Greater) {
            return Err(ConfigError::GrowthFactor);
        }
        if self.slab_min == 0 {
            return Err(ConfigError::SlabMin);
        }
        let prefix_delimiter = match &self.prefix_delimiter {
            Some(d) => {
                use std::os::unix::ffi::OsStrExt;
                *d.as_bytes().first().ok_or(ConfigError::Delimiter)?
            }
            None => b':',
        };
        let (mut idle_timeout, mut track_sizes, mut lru_crawler) = (0, false, true);
        for opt in self.extended.iter().flat_map(|o| o.split(',')) {
            match opt.split_once('=') {
                Some(("idle_timeout", n)) => {
                    idle_timeout = n
                        .parse()
                        .map_err(|_| ConfigError::Extended(opt.to_string()))?;
                }
                None if opt == "track_sizes" => track_sizes = true,
                None if opt == "lru_crawler" => lru_crawler = true,
                None if opt == "no_lru_crawler" => lru_crawler = false,
                // memcached 1.6.18's `modern` sets nothing, and
                // `maxconns_fast` (refuse at once over `-c`) is its default
                // and this server's only way.
                None if matches!(opt, "modern" | "maxconns_fast" | "") => {}
                _ => return Err(ConfigError::Extended(opt.to_string())),
            }
        }
        let unix_mask = u32::from_str_radix(&self.unix_mask, 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| ConfigError::UnixMask(self.unix_mask.clone()))?;
        if item_max > self.memory_mb.saturating_mul(1024 * 1024) {
            return Err(ConfigError::ItemOverMemory {
                item: item_max,
                memory_mb: self.memory_mb,
            });
        }
        // memcached listens on every address of a list (`a,b`, or `-l`
        // repeated) and on `host:port`; this server has one listener, so
        // those are refused rather than reduced to one address. An IPv6
        // address has colons of its own; only its bracketed `[a]:port`
        // form names a port.
        let listen = match self.listen.as_slice() {
            [one] if is_one_address(one) => one.clone(),
            many => return Err(ConfigError::Listen(many.join(" -l "))),
        };
        let cpus = match &self.cpus {
            Some(s) => Some(parse_cpus(s).ok_or_else(|| ConfigError::Cpus(s.clone()))?),
            None => None,
        };
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = match self.threads {
            Some(0) => return Err(ConfigError::Threads),
            Some(n) => n,
            None => cpus.as_ref().map_or(available, Vec::len),
        };
        Ok(Config {
            port: self.port,
            listen,
            memory_mb: self.memory_mb,
            max_conns: self.max_conns,
            item_max,
            threads,
            mode: self.mode,
            io: self.io,
            cpus,
            arbiter: self.arbiter,
            idle_spin_us: self.idle_spin_us,
            verbose: self.verbose,
            enable_shutdown: self.enable_shutdown,
            no_evictions: self.no_evictions,
            daemon: self.daemon,
            pid_file: self.pid_file,
            user: self.user,
            reqs_per_event: self.reqs_per_event,
            backlog: self.backlog,
            flush_enabled: !self.disable_flush_all,
            cas_enabled: !self.disable_cas,
            protocol: self.protocol,
            prefix_delimiter,
            growth_factor: self.growth_factor,
            slab_min: self.slab_min,
            detail_on_start: self.prefix_delimiter.is_some(),
            enable_coredumps: self.enable_coredumps,
            dump_enabled: !self.disable_dumping,
            watch_enabled: !self.disable_watch,
            unix_socket: self.unix_socket,
            unix_mask,
            idle_timeout,
            track_sizes,
            lru_crawler,
        })
    }
}
