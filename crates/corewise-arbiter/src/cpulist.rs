//! CPU lists: the kernel's `0-3,5,7-8` notation as a small bitset.
//!
//! Cgroup files (`cpuset.cpus`, `cpuset.effective_cpus`,
//! `cpuset.cpus.effective`) and `/sys/devices/system/cpu/online` all use this
//! notation. One implementation serves the daemon (its `--cpus` and the
//! sets it writes) and the runtime (its CPU budget, which re-exports it as
//! `corewise::budget::CpuList`). The parser is total: any input yields a list or an error, never a
//! panic, and CPU ids are bounded by [`MAX_CPU_ID`] so a hostile
//! `0-4294967295` cannot make it allocate gigabytes.

use std::fmt;
use std::str::FromStr;

use thiserror::Error;

/// CPU ids at or above this value are rejected by the parser (Linux's
/// `CONFIG_NR_CPUS` tops out at 8192; this leaves room).
///
/// ```
/// use corewise_arbiter::cpulist::{CpuList, MAX_CPU_ID};
/// let mut l = CpuList::new();
/// assert!(!l.insert(MAX_CPU_ID));
/// assert!(l.insert(MAX_CPU_ID - 1));
/// assert!(format!("0-{MAX_CPU_ID}").parse::<CpuList>().is_err());
/// ```
pub const MAX_CPU_ID: usize = 1 << 16;

/// Why a CPU list could not be parsed.
///
/// ```
/// use corewise_arbiter::cpulist::{CpuList, CpuListError};
/// assert_eq!(CpuList::parse("4-2"), Err(CpuListError::Reversed { start: 4, end: 2 }));
/// assert!(matches!(CpuList::parse("0,x"), Err(CpuListError::Invalid(_))));
/// assert!(matches!(CpuList::parse("70000"), Err(CpuListError::OutOfRange(_))));
/// ```
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CpuListError {
    /// A comma-separated item is neither a number nor a `start-end` range.
    #[error("invalid CPU list item {0:?}")]
    Invalid(String),
    /// A CPU id is at or above [`MAX_CPU_ID`].
    #[error("CPU id {0} is out of range (limit {MAX_CPU_ID})")]
    OutOfRange(String),
    /// A range whose end is below its start.
    #[error("reversed CPU range {start}-{end}")]
    Reversed {
        /// First CPU of the range.
        start: usize,
        /// Last CPU of the range.
        end: usize,
    },
}

/// A set of CPU ids, printed and parsed in the kernel's list notation.
///
/// ```
/// use corewise_arbiter::cpulist::CpuList;
///
/// let cpus: CpuList = "0-3,5,7-8".parse().unwrap();
/// assert_eq!(cpus.len(), 7);
/// assert!(cpus.contains(5) && !cpus.contains(4));
/// assert_eq!(cpus.to_string(), "0-3,5,7-8");
/// let two: CpuList = "3-5".parse().unwrap();
/// assert_eq!(cpus.intersection(&two).to_vec(), vec![3, 5]);
/// ```
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct CpuList {
    /// Bit `i % 64` of word `i / 64` is CPU `i`. No trailing zero words.
    words: Vec<u64>,
}

impl CpuList {
    /// The empty list.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let l = CpuList::new();
    /// assert!(l.is_empty());
    /// assert_eq!(l.to_string(), "");
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the kernel's list notation. Blank input (or only whitespace,
    /// as an unset cpuset reads) is the empty list; empty items between
    /// commas are skipped.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// assert!(CpuList::parse(" \n").unwrap().is_empty());
    /// assert!(CpuList::parse("3-1").is_err());
    /// assert!(CpuList::parse("max").is_err());
    /// ```
    pub fn parse(text: &str) -> Result<Self, CpuListError> {
        let mut list = CpuList::new();
        for item in text.trim().split(',') {
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (start, end) = match item.split_once('-') {
                Some((a, b)) => (parse_id(a.trim(), item)?, parse_id(b.trim(), item)?),
                None => {
                    let id = parse_id(item, item)?;
                    (id, id)
                }
            };
            if end < start {
                return Err(CpuListError::Reversed { start, end });
            }
            for cpu in start..=end {
                list.insert(cpu);
            }
        }
        Ok(list)
    }

    /// Adds `cpu`; returns false (and adds nothing) if it is at or above
    /// [`MAX_CPU_ID`].
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let mut l = CpuList::new();
    /// assert!(l.insert(2));
    /// assert!(l.insert(100));
    /// assert_eq!(l.to_string(), "2,100");
    /// ```
    pub fn insert(&mut self, cpu: usize) -> bool {
        if cpu >= MAX_CPU_ID {
            return false;
        }
        let word = cpu / 64;
        if self.words.len() <= word {
            self.words.resize(word + 1, 0);
        }
        self.words[word] |= 1 << (cpu % 64);
        true
    }

    /// Removes `cpu` (if present).
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let mut l: CpuList = "0-2".parse().unwrap();
    /// l.remove(1);
    /// l.remove(7); // not in the list: nothing happens
    /// assert_eq!(l.to_string(), "0,2");
    /// ```
    pub fn remove(&mut self, cpu: usize) {
        if let Some(w) = self.words.get_mut(cpu / 64) {
            *w &= !(1 << (cpu % 64));
        }
        while self.words.last() == Some(&0) {
            self.words.pop();
        }
    }

    /// Whether `cpu` is in the list.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let l: CpuList = "1,4-5".parse().unwrap();
    /// assert!(l.contains(4));
    /// assert!(!l.contains(2) && !l.contains(1000));
    /// ```
    pub fn contains(&self, cpu: usize) -> bool {
        self.words
            .get(cpu / 64)
            .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// Number of CPUs in the list.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// assert_eq!("0-3,8".parse::<CpuList>().unwrap().len(), 5);
    /// assert_eq!(CpuList::new().len(), 0);
    /// ```
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the list is empty.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let mut l: CpuList = "3".parse().unwrap();
    /// assert!(!l.is_empty());
    /// l.remove(3);
    /// assert!(l.is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.words.iter().all(|&w| w == 0)
    }

    /// The CPUs in both lists.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let a: CpuList = "0-5".parse().unwrap();
    /// let b: CpuList = "4-9".parse().unwrap();
    /// assert_eq!(a.intersection(&b).to_string(), "4-5");
    /// assert!(a.intersection(&CpuList::new()).is_empty());
    /// ```
    pub fn intersection(&self, other: &CpuList) -> CpuList {
        let mut words: Vec<u64> = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        while words.last() == Some(&0) {
            words.pop();
        }
        CpuList { words }
    }

    /// Whether every CPU of `self` is in `other`.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let all: CpuList = "0-7".parse().unwrap();
    /// let some: CpuList = "2,5".parse().unwrap();
    /// assert!(some.is_subset(&all));
    /// assert!(!all.is_subset(&some));
    /// assert!(CpuList::new().is_subset(&some));
    /// ```
    pub fn is_subset(&self, other: &CpuList) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, w)| w & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// The CPUs in ascending order.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let l: CpuList = "7,1-2".parse().unwrap();
    /// assert_eq!(l.iter().collect::<Vec<usize>>(), vec![1, 2, 7]);
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = usize> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &w)| {
            (0..64)
                .filter(move |b| w & (1u64 << b) != 0)
                .map(move |b| i * 64 + b)
        })
    }

    /// The CPUs in ascending order as the arbiter's protocol numbers them
    /// ([`CoreId`](crate::CoreId)).
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// let l: CpuList = "0,3".parse().unwrap();
    /// assert_eq!(l.cores().collect::<Vec<u32>>(), vec![0, 3]);
    /// ```
    pub fn cores(&self) -> impl Iterator<Item = u32> + '_ {
        self.iter().map(|c| c as u32)
    }

    /// The CPUs in ascending order, collected.
    ///
    /// ```
    /// use corewise_arbiter::cpulist::CpuList;
    /// assert_eq!("2-4".parse::<CpuList>().unwrap().to_vec(), vec![2, 3, 4]);
    /// ```
    pub fn to_vec(&self) -> Vec<usize> {
        self.iter().collect()
    }
}

impl FromIterator<usize> for CpuList {
    /// Collects CPU ids; ids at or above [`MAX_CPU_ID`] are dropped.
    fn from_iter<I: IntoIterator<Item = usize>>(iter: I) -> Self {
        let mut list = CpuList::new();
        for cpu in iter {
            list.insert(cpu);
        }
        list
    }
}

impl FromIterator<u32> for CpuList {
    /// Collects CPU numbers as the arbiter's protocol carries them
    /// ([`CoreId`](crate::CoreId)); ids at or above [`MAX_CPU_ID`] are dropped.
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        iter.into_iter().map(|c| c as usize).collect()
    }
}

impl FromStr for CpuList {
    type Err = CpuListError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CpuList::parse(s)
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.iter().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CpuList({self})")
    }
}

fn parse_id(digits: &str, item: &str) -> Result<usize, CpuListError> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(CpuListError::Invalid(item.to_owned()));
    }
    match digits.parse::<usize>() {
        Ok(id) if id < MAX_CPU_ID => Ok(id),
        _ => Err(CpuListError::OutOfRange(digits.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_kernel_notation() {
        let l = CpuList::parse("0-3,5,7-8\n").unwrap();
        assert_eq!(l.to_vec(), vec![0, 1, 2, 3, 5, 7, 8]);
        assert_eq!(l.to_string(), "0-3,5,7-8");
        assert_eq!(CpuList::parse("1").unwrap().to_vec(), vec![1]);
        assert_eq!(
            CpuList::parse(" 2 - 3 , ,64").unwrap().to_vec(),
            vec![2, 3, 64]
        );
        assert_eq!(CpuList::parse("0-0").unwrap().to_vec(), vec![0]);
    }

    #[test]
    fn blank_is_empty() {
        for s in ["", " ", "\n", "\t \n", ","] {
            assert!(CpuList::parse(s).unwrap().is_empty(), "{s:?}");
        }
        assert_eq!(CpuList::new().to_string(), "");
    }

    #[test]
    fn rejects_garbage() {
        for s in [
            "max", "-1", "1-", "-", "a-b", "1-2-3", "+1", "0x3", "1 2", "3-1",
        ] {
            assert!(CpuList::parse(s).is_err(), "{s:?}");
        }
        assert!(matches!(
            CpuList::parse("0-4294967295"),
            Err(CpuListError::OutOfRange(_))
        ));
        assert!(matches!(
            CpuList::parse("99999999999999999999999"),
            Err(CpuListError::OutOfRange(_))
        ));
    }

    #[test]
    fn set_operations() {
        let a = CpuList::parse("0-1,70").unwrap();
        let b = CpuList::parse("1-2").unwrap();
        assert_eq!(a.intersection(&b).to_vec(), vec![1]);
        assert_eq!(b.intersection(&a).to_vec(), vec![1]);
        assert!(CpuList::parse("1").unwrap().is_subset(&a));
        assert!(!a.is_subset(&b));
        assert!(CpuList::new().is_subset(&b));
        // Trailing zero words are trimmed, so equal sets compare equal.
        assert_eq!(a.intersection(&b), CpuList::parse("1").unwrap());
        assert!(!CpuList::new().insert(MAX_CPU_ID));
        let mut c = CpuList::parse("1,70").unwrap();
        c.remove(70);
        assert_eq!(c, CpuList::parse("1").unwrap(), "trimmed after a remove");
        c.remove(5);
        assert_eq!(c.to_vec(), vec![1]);
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_strings(s in any::<String>()) {
            let _ = CpuList::parse(&s);
        }

        #[test]
        fn never_panics_on_listlike_strings(s in "[0-9, \\-\n]{0,40}") {
            if let Ok(list) = CpuList::parse(&s) {
                // Whatever parses prints back to something that parses to the
                // same set.
                prop_assert_eq!(CpuList::parse(&list.to_string()).unwrap(), list);
            }
        }

        #[test]
        fn round_trips(cpus in proptest::collection::btree_set(0usize..300, 0..40)) {
            let list: CpuList = cpus.iter().copied().collect();
            let text = list.to_string();
            let back = CpuList::parse(&text).unwrap();
            prop_assert_eq!(back.to_vec(), cpus.into_iter().collect::<Vec<_>>());
        }
    }
}
