//! Core policies: which cores a new thread may land on, per thread class.
//!
//! Arachne separates the mechanism (slots, dispatch, core grants) from the
//! policy that decides where threads go and how many cores to ask for. A
//! policy sees the runtime's cores through [`CoreView`] and answers with a
//! [`CoreMask`]; spawn then picks among those cores by power of two choices.
//! The default policy has two classes: `Normal` threads share the cores,
//! an `Exclusive` thread gets a core of its own that no other thread lands
//! on while it lives (and that idles when it blocks).

use crate::shim::{AtomicU64, Ordering};

/// Priority levels of core requests (as in the arbiter protocol).
///
/// ```
/// use corewise::{CorePolicy, DefaultPolicy, PRIORITIES};
/// // A policy asks for cores at each of the levels, 0 the highest.
/// let wanted: [u32; PRIORITIES] = DefaultPolicy::new(4).desired_cores();
/// assert_eq!(wanted.len(), 8);
/// assert_eq!(wanted[0], 1); // the default policy asks at the highest level
/// // A runtime's own priority is one of those levels.
/// assert!(corewise::Runtime::builder().priority(PRIORITIES).build().is_err());
/// ```
pub const PRIORITIES: usize = 8;

/// A thread's class; the policy decides what each means for placement.
///
/// ```
/// use corewise::ThreadClass;
/// assert_eq!(ThreadClass::default(), ThreadClass::Normal);
/// let rt = corewise::Runtime::new().unwrap();
/// // An exclusive thread gets a core no other new thread lands on while it lives.
/// let (tx, rx) = corewise::sync::channel::<()>(1);
/// let alone = rt.spawn_with(ThreadClass::Exclusive, move || {
///     let core = corewise::current_core();
///     rx.recv().unwrap();
///     core
/// }).unwrap();
/// let normal = rt.spawn_with(ThreadClass::Normal, || 1).unwrap();
/// assert_eq!(normal.join().unwrap(), 1);
/// tx.send(()).unwrap();
/// assert!(alone.join().unwrap().is_some());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ThreadClass {
    /// Shares cores with other normal threads.
    #[default]
    Normal,
    /// Runs alone on a core of its own.
    Exclusive,
}

impl ThreadClass {
    pub(crate) fn to_u32(self) -> u32 {
        match self {
            ThreadClass::Normal => 0,
            ThreadClass::Exclusive => 1,
        }
    }

    pub(crate) fn from_u32(v: u32) -> Self {
        if v == 1 {
            ThreadClass::Exclusive
        } else {
            ThreadClass::Normal
        }
    }
}

/// A set of runtime core indices (a runtime has at most 64 cores).
///
/// ```
/// use corewise::CoreMask;
/// let m = CoreMask::single(0).with(3);
/// assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 3]);
/// assert_eq!(m.len(), 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CoreMask(pub u64);

impl CoreMask {
    /// No core.
    pub const EMPTY: CoreMask = CoreMask(0);

    /// Just `core` (cores past 63 give the empty mask).
    ///
    /// ```
    /// use corewise::CoreMask;
    /// assert_eq!(CoreMask::single(3), CoreMask(0b1000));
    /// assert!(CoreMask::single(64).is_empty()); // past the 64 cores of a runtime
    /// ```
    pub fn single(core: usize) -> Self {
        CoreMask(1u64.checked_shl(core as u32).unwrap_or(0))
    }

    /// This mask plus `core`.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// let m = CoreMask::EMPTY.with(1).with(2).with(1);
    /// assert_eq!(m, CoreMask(0b110));
    /// ```
    pub fn with(self, core: usize) -> Self {
        CoreMask(self.0 | Self::single(core).0)
    }

    /// Whether `core` is in the mask.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// let m = CoreMask::single(0).with(5);
    /// assert!(m.contains(5) && !m.contains(4));
    /// assert!(!m.contains(100));
    /// ```
    pub fn contains(self, core: usize) -> bool {
        self.0 & Self::single(core).0 != 0
    }

    /// Number of cores.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// assert_eq!(CoreMask(0b1011).len(), 3);
    /// assert_eq!(CoreMask::EMPTY.len(), 0);
    /// ```
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the mask is empty.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// assert!(CoreMask::EMPTY.is_empty());
    /// assert!(!CoreMask::single(0).is_empty());
    /// ```
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The `n`-th core of the mask in increasing order.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// let m = CoreMask::single(2).with(7);
    /// assert_eq!((m.nth(0), m.nth(1), m.nth(2)), (Some(2), Some(7), None));
    /// ```
    pub fn nth(self, n: usize) -> Option<usize> {
        self.iter().nth(n)
    }

    /// The cores, in increasing order.
    ///
    /// ```
    /// use corewise::CoreMask;
    /// let m = CoreMask(0b1001_0010);
    /// assert_eq!(m.iter().collect::<Vec<_>>(), [1, 4, 7]);
    /// ```
    pub fn iter(self) -> impl Iterator<Item = usize> {
        let mut m = self.0;
        std::iter::from_fn(move || {
            if m == 0 {
                return None;
            }
            let i = m.trailing_zeros() as usize;
            m &= m - 1;
            Some(i)
        })
    }
}

/// What a policy may look at: the runtime's cores and their load.
///
/// ```
/// use corewise::{CoreMask, CorePolicy, CoreView, ThreadClass};
/// /// New threads go to the active core with the fewest threads.
/// struct LeastLoaded;
/// impl CorePolicy for LeastLoaded {
///     fn cores_for(&self, _class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
///         let active = view.active();
///         match active.iter().min_by_key(|&c| view.thread_count(c)) {
///             Some(c) => CoreMask::single(c),
///             None => active,
///         }
///     }
///     fn desired_cores(&self) -> [u32; corewise::PRIORITIES] {
///         [u32::MAX, 0, 0, 0, 0, 0, 0, 0]
///     }
/// }
/// let rt = corewise::Runtime::builder().policy(LeastLoaded).build().unwrap();
/// let h = rt.spawn(corewise::current_core).unwrap();
/// assert!(h.join().unwrap().is_some_and(|c| c < rt.cores()));
/// ```
pub struct CoreView<'a> {
    pub(crate) active: CoreMask,
    pub(crate) counts: &'a dyn Fn(usize) -> u32,
}

impl CoreView<'_> {
    /// Cores the runtime holds now.
    ///
    /// ```
    /// use corewise::{CoreMask, CorePolicy, CoreView, ThreadClass};
    /// /// New threads go to the highest-numbered core the runtime holds.
    /// struct Last;
    /// impl CorePolicy for Last {
    ///     fn cores_for(&self, _class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
    ///         let active = view.active();
    ///         CoreMask::single(active.nth(active.len() - 1).unwrap_or(0))
    ///     }
    ///     fn desired_cores(&self) -> [u32; corewise::PRIORITIES] {
    ///         [1, 0, 0, 0, 0, 0, 0, 0]
    ///     }
    /// }
    /// // Asking for one core, the runtime holds core 0: that is where threads go.
    /// let rt = corewise::Runtime::builder().policy(Last).build().unwrap();
    /// assert_eq!(rt.spawn(corewise::current_core).unwrap().join().unwrap(), Some(0));
    /// ```
    pub fn active(&self) -> CoreMask {
        self.active
    }

    /// User threads on `core` now (0 to 56).
    ///
    /// ```
    /// use corewise::{CoreMask, CorePolicy, CoreView, ThreadClass};
    /// use std::sync::atomic::{AtomicU32, Ordering};
    /// static SEEN: AtomicU32 = AtomicU32::new(0);
    /// /// Every thread on core 0, noting how many threads were there already.
    /// struct Core0;
    /// impl CorePolicy for Core0 {
    ///     fn cores_for(&self, _class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
    ///         SEEN.store(view.thread_count(0), Ordering::Relaxed);
    ///         CoreMask::single(0)
    ///     }
    ///     fn desired_cores(&self) -> [u32; corewise::PRIORITIES] {
    ///         [1, 0, 0, 0, 0, 0, 0, 0]
    ///     }
    /// }
    /// let rt = corewise::Runtime::builder().policy(Core0).build().unwrap();
    /// let seen = rt
    ///     .block_on(|| {
    ///         // This thread is on core 0 while it spawns another.
    ///         corewise::spawn(|| ()).unwrap().join().unwrap();
    ///         SEEN.load(Ordering::Relaxed)
    ///     })
    ///     .unwrap();
    /// assert!(seen >= 1);
    /// ```
    pub fn thread_count(&self, core: usize) -> u32 {
        (self.counts)(core)
    }
}

/// A core policy. Implementations must be cheap: `cores_for` runs on every
/// spawn.
///
/// ```
/// use corewise::{CoreMask, CorePolicy, CoreView, ThreadClass};
/// /// Every thread on core 0.
/// struct Core0;
/// impl CorePolicy for Core0 {
///     fn cores_for(&self, _class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
///         CoreMask(view.active().0 & 1)
///     }
///     fn desired_cores(&self) -> [u32; corewise::PRIORITIES] {
///         [1, 0, 0, 0, 0, 0, 0, 0]
///     }
/// }
/// let rt = corewise::Runtime::builder().policy(Core0).build().unwrap();
/// let h = rt.spawn(|| corewise::current_core()).unwrap();
/// assert_eq!(h.join().unwrap(), Some(0));
/// ```
pub trait CorePolicy: Send + Sync + 'static {
    /// Cores on which a new thread of `class` may be created. An empty mask
    /// makes the spawn fail with `SpawnError::NoCoreForClass`. A policy that
    /// reserves something here gets it back through `thread_exited` (or
    /// `spawn_failed`).
    fn cores_for(&self, class: ThreadClass, view: &CoreView<'_>) -> CoreMask;

    /// A thread of `class` that the policy placed has ended on `core`.
    fn thread_exited(&self, _class: ThreadClass, _core: usize) {}

    /// A spawn that `cores_for` answered failed before the thread started.
    fn spawn_failed(&self, class: ThreadClass, core_mask: CoreMask) {
        for c in core_mask.iter() {
            self.thread_exited(class, c);
        }
    }

    /// A thread of `class` moved from core `from` to core `to` because
    /// `from` was released.
    fn thread_migrated(&self, class: ThreadClass, from: usize, to: usize) {
        let _ = (class, from, to);
    }

    /// The runtime now holds `core`.
    fn core_added(&self, _core: usize) {}

    /// The runtime no longer holds `core`.
    fn core_removed(&self, _core: usize) {}

    /// Cores wanted at each priority level (index 0 is the highest).
    fn desired_cores(&self) -> [u32; PRIORITIES];

    /// Called once per estimation window by the runtime's core manager with
    /// the load of every core the runtime holds; a policy that estimates
    /// its needs updates what `desired_cores` returns. Not called while the
    /// runtime may hold only one number of cores (`min_cores` equals the
    /// CPU budget or the neighbour cap): nothing it returns could change
    /// the request then.
    fn estimate(&self, _loads: &[CoreLoad]) {}
}

/// One core's load over the last estimation window.
///
/// ```
/// use corewise::{CoreLoad, CorePolicy, DefaultPolicy};
/// let policy = DefaultPolicy::new(4);
/// assert_eq!(policy.desired_cores()[0], 1);
/// // The runtime reports each held core's load once per window; three
/// // runnable threads on average on the one core is past the 2.25 threshold.
/// let busy = CoreLoad { core: 0, utilization: 1.0, load_factor: 3.0 };
/// policy.estimate(&[busy]);
/// assert_eq!(policy.desired_cores()[0], 2);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CoreLoad {
    /// Runtime core index.
    pub core: usize,
    /// Fraction of the window spent running user threads (0 to 1).
    pub utilization: f64,
    /// Average number of runnable user threads.
    pub load_factor: f64,
}

/// Settings of the default policy's core estimation (Arachne's defaults).
///
/// ```
/// let c = corewise::PolicyConfig::default();
/// assert_eq!(c.scale_up_load_factor, 2.25);
/// assert_eq!(c.window, std::time::Duration::from_millis(50));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyConfig {
    /// Scale up by one core when the mean load factor of the cores running
    /// normal threads reaches this.
    pub scale_up_load_factor: f64,
    /// Scale down by one core when the total utilization falls this much
    /// (in cores) below the total recorded when that core was added.
    pub scale_down_hysteresis: f64,
    /// Statistics are averaged over this window.
    pub window: std::time::Duration,
    /// Never fewer cores than this (at least 1).
    pub min_cores: u32,
    /// Never more cores than this.
    pub max_cores: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        Self {
            scale_up_load_factor: 2.25,
            scale_down_hysteresis: 0.05,
            window: std::time::Duration::from_millis(50),
            min_cores: 1,
            max_cores: u32::MAX,
        }
    }
}

/// The default policy: `Normal` threads share every core not held by an
/// `Exclusive` thread; an `Exclusive` thread takes an empty core. It asks
/// for one core per exclusive thread plus as many cores as the normal
/// threads' load needs (Arachne's estimation: scale up by one when the mean
/// load factor reaches the threshold, record the total utilization at that
/// moment, scale down by one when utilization falls below the figure
/// recorded for that core count minus the hysteresis).
///
/// ```
/// use corewise::{Runtime, ThreadClass};
/// let rt = Runtime::builder().build().unwrap();
/// let h = rt.spawn_with(ThreadClass::Exclusive, || corewise::current_core()).unwrap();
/// assert!(h.join().unwrap().is_some());
/// ```
#[derive(Debug)]
pub struct DefaultPolicy {
    exclusive: AtomicU64,
    config: PolicyConfig,
    state: std::sync::Mutex<Estimation>,
}

#[derive(Debug, Default)]
struct Estimation {
    /// Cores wanted for normal threads.
    normal: u32,
    /// `scale_down_at[n]`: total utilization recorded when going from n to
    /// n + 1 normal cores.
    scale_down_at: Vec<Option<f64>>,
}

impl DefaultPolicy {
    /// A policy that asks for up to `max_cores` cores, starting with one.
    ///
    /// ```
    /// use corewise::{CorePolicy, DefaultPolicy};
    /// let p = DefaultPolicy::new(3);
    /// assert_eq!(p.config().max_cores, 3);
    /// assert_eq!(p.desired_cores()[0], 1); // starts with one core
    /// ```
    pub fn new(max_cores: u32) -> Self {
        Self::with_config(PolicyConfig {
            max_cores,
            ..PolicyConfig::default()
        })
    }

    /// A policy with these estimation settings.
    ///
    /// ```
    /// use corewise::{CorePolicy, DefaultPolicy, PolicyConfig};
    /// let config = PolicyConfig { min_cores: 2, max_cores: 4, ..PolicyConfig::default() };
    /// let p = DefaultPolicy::with_config(config);
    /// assert_eq!(p.desired_cores()[0], 2); // starts at its minimum
    /// let rt = corewise::Runtime::builder().policy(p).build().unwrap();
    /// assert_eq!(rt.block_on(|| 1).unwrap(), 1);
    /// ```
    pub fn with_config(config: PolicyConfig) -> Self {
        let normal = config.min_cores.max(1).min(config.max_cores.max(1));
        Self {
            exclusive: AtomicU64::new(0),
            config,
            state: std::sync::Mutex::new(Estimation {
                normal,
                scale_down_at: Vec::new(),
            }),
        }
    }

    /// The estimation settings.
    ///
    /// ```
    /// use corewise::{DefaultPolicy, PolicyConfig};
    /// let p = DefaultPolicy::new(2);
    /// assert_eq!(p.config(), &PolicyConfig { max_cores: 2, ..PolicyConfig::default() });
    /// ```
    pub fn config(&self) -> &PolicyConfig {
        &self.config
    }

    fn exclusive_count(&self) -> u32 {
        self.exclusive.load(Ordering::Relaxed).count_ones()
    }
}

impl CorePolicy for DefaultPolicy {
    #[inline]
    fn cores_for(&self, class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
        let taken = self.exclusive.load(Ordering::Acquire);
        let free = view.active().0 & !taken;
        match class {
            // Normal threads avoid exclusive cores, but share them rather
            // than fail while the runtime holds no other core (the extra
            // core asked for may be capped by the budget or the neighbours).
            ThreadClass::Normal if free == 0 => view.active(),
            ThreadClass::Normal => CoreMask(free),
            ThreadClass::Exclusive => {
                for c in CoreMask(free).iter() {
                    if view.thread_count(c) != 0 {
                        continue;
                    }
                    let bit = 1u64 << c;
                    if self.exclusive.fetch_or(bit, Ordering::AcqRel) & bit == 0 {
                        return CoreMask(bit);
                    }
                }
                CoreMask::EMPTY
            }
        }
    }

    #[inline]
    fn thread_exited(&self, class: ThreadClass, core: usize) {
        if class == ThreadClass::Exclusive {
            self.exclusive
                .fetch_and(!CoreMask::single(core).0, Ordering::AcqRel);
        }
    }

    fn thread_migrated(&self, class: ThreadClass, from: usize, to: usize) {
        if class == ThreadClass::Exclusive {
            self.exclusive
                .fetch_and(!CoreMask::single(from).0, Ordering::AcqRel);
            self.exclusive
                .fetch_or(CoreMask::single(to).0, Ordering::AcqRel);
        }
    }

    fn desired_cores(&self) -> [u32; PRIORITIES] {
        let normal = self.state.lock().map(|s| s.normal).unwrap_or(1);
        let mut d = [0; PRIORITIES];
        d[0] = (normal + self.exclusive_count()).min(self.config.max_cores.max(1));
        d
    }

    fn estimate(&self, loads: &[CoreLoad]) {
        let taken = self.exclusive.load(Ordering::Relaxed);
        let normal: Vec<&CoreLoad> = loads
            .iter()
            .filter(|l| !CoreMask(taken).contains(l.core))
            .collect();
        if normal.is_empty() {
            return;
        }
        let n = normal.len() as f64;
        let mean_load = normal.iter().map(|l| l.load_factor).sum::<f64>() / n;
        let total_util: f64 = normal.iter().map(|l| l.utilization).sum();
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let max_normal = self
            .config
            .max_cores
            .saturating_sub(self.exclusive_count())
            .max(1);
        let held = normal.len() as u32;
        if mean_load >= self.config.scale_up_load_factor
            && st.normal < max_normal
            && held >= st.normal
        {
            let at = st.normal as usize;
            if st.scale_down_at.len() <= at {
                st.scale_down_at.resize(at + 1, None);
            }
            st.scale_down_at[at] = Some(total_util);
            st.normal += 1;
        } else if st.normal > self.config.min_cores.max(1) {
            let below = st.normal as usize - 1;
            let threshold = st.scale_down_at.get(below).copied().flatten();
            let idle = threshold.is_none() && total_util < 0.5 * (st.normal - 1) as f64;
            if idle || threshold.is_some_and(|u| total_util < u - self.config.scale_down_hysteresis)
            {
                st.normal -= 1;
            }
        }
    }
}

/// The runtime's policy: the built-in one called directly, any other
/// through its trait object.
///
/// `cores_for` runs on every spawn and `thread_exited` at every thread's
/// end. Through a trait object each is an indirect call the compiler cannot
/// see into, with the [`CoreView`] built for it; called directly, the
/// default policy's answer for a normal thread inlines to a load, a mask
/// and a branch, and its `thread_exited` to a compare of the class (and
/// the enum's own branch). A thread's life on one core
/// (`examples/spawn_cost.rs` under callgrind) took 476.3 instructions
/// through the trait object and takes 455.5 this way.
pub(crate) enum RuntimePolicy {
    /// [`DefaultPolicy`], made by the runtime from its `PolicyConfig`.
    Default(DefaultPolicy),
    /// A policy given to `Builder::policy`.
    Custom(Box<dyn CorePolicy>),
}

impl CorePolicy for RuntimePolicy {
    #[inline]
    fn cores_for(&self, class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
        match self {
            RuntimePolicy::Default(p) => p.cores_for(class, view),
            RuntimePolicy::Custom(p) => p.cores_for(class, view),
        }
    }

    #[inline]
    fn thread_exited(&self, class: ThreadClass, core: usize) {
        match self {
            RuntimePolicy::Default(p) => p.thread_exited(class, core),
            RuntimePolicy::Custom(p) => p.thread_exited(class, core),
        }
    }

    fn spawn_failed(&self, class: ThreadClass, core_mask: CoreMask) {
        match self {
            RuntimePolicy::Default(p) => p.spawn_failed(class, core_mask),
            RuntimePolicy::Custom(p) => p.spawn_failed(class, core_mask),
        }
    }

    fn thread_migrated(&self, class: ThreadClass, from: usize, to: usize) {
        match self {
            RuntimePolicy::Default(p) => p.thread_migrated(class, from, to),
            RuntimePolicy::Custom(p) => p.thread_migrated(class, from, to),
        }
    }

    fn core_added(&self, core: usize) {
        match self {
            RuntimePolicy::Default(p) => p.core_added(core),
            RuntimePolicy::Custom(p) => p.core_added(core),
        }
    }

    fn core_removed(&self, core: usize) {
        match self {
            RuntimePolicy::Default(p) => p.core_removed(core),
            RuntimePolicy::Custom(p) => p.core_removed(core),
        }
    }

    fn desired_cores(&self) -> [u32; PRIORITIES] {
        match self {
            RuntimePolicy::Default(p) => p.desired_cores(),
            RuntimePolicy::Custom(p) => p.desired_cores(),
        }
    }

    fn estimate(&self, loads: &[CoreLoad]) {
        match self {
            RuntimePolicy::Default(p) => p.estimate(loads),
            RuntimePolicy::Custom(p) => p.estimate(loads),
        }
    }
}
