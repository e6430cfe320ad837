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
pub const PRIORITIES: usize = 8;

/// A thread's class; the policy decides what each means for placement.
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
    pub fn single(core: usize) -> Self {
        CoreMask(1u64.checked_shl(core as u32).unwrap_or(0))
    }

    /// This mask plus `core`.
    pub fn with(self, core: usize) -> Self {
        CoreMask(self.0 | Self::single(core).0)
    }

    /// Whether `core` is in the mask.
    pub fn contains(self, core: usize) -> bool {
        self.0 & Self::single(core).0 != 0
    }

    /// Number of cores.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// Whether the mask is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The `n`-th core of the mask in increasing order.
    pub fn nth(self, n: usize) -> Option<usize> {
        self.iter().nth(n)
    }

    /// The cores, in increasing order.
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
pub struct CoreView<'a> {
    pub(crate) active: CoreMask,
    pub(crate) counts: &'a dyn Fn(usize) -> u32,
}

impl CoreView<'_> {
    /// Cores the runtime holds now.
    pub fn active(&self) -> CoreMask {
        self.active
    }

    /// User threads on `core` now (0 to 56).
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

    /// The runtime now holds `core`.
    fn core_added(&self, _core: usize) {}

    /// The runtime no longer holds `core`.
    fn core_removed(&self, _core: usize) {}

    /// Cores wanted at each priority level (index 0 is the highest).
    fn desired_cores(&self) -> [u32; PRIORITIES];
}

/// The default policy: `Normal` threads share every core not held by an
/// `Exclusive` thread; an `Exclusive` thread takes an empty core.
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
    max_cores: u32,
}

impl DefaultPolicy {
    /// A policy that asks for up to `max_cores` cores.
    pub fn new(max_cores: u32) -> Self {
        Self {
            exclusive: AtomicU64::new(0),
            max_cores,
        }
    }
}

impl CorePolicy for DefaultPolicy {
    fn cores_for(&self, class: ThreadClass, view: &CoreView<'_>) -> CoreMask {
        let taken = self.exclusive.load(Ordering::Acquire);
        let free = view.active().0 & !taken;
        match class {
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

    fn thread_exited(&self, class: ThreadClass, core: usize) {
        if class == ThreadClass::Exclusive {
            self.exclusive
                .fetch_and(!CoreMask::single(core).0, Ordering::AcqRel);
        }
    }

    fn desired_cores(&self) -> [u32; PRIORITIES] {
        let mut d = [0; PRIORITIES];
        d[0] = self.max_cores;
        d
    }
}
