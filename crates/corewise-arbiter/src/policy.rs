//! Allocation policy: how many cores each application gets, and which ones.
//!
//! Why a separate, pure module: the policy is the part most worth testing
//! exhaustively (many cores, hyperthreads, sockets), and this machine only has
//! one managed core. Nothing here touches the OS.
//!
//! Counts: priority levels are served from 0 (highest) to 7; inside a level
//! the remaining cores are split equally (water-filling one core at a time),
//! never giving one user's applications together more than that user's cap;
//! when cores do not divide evenly, applications that already hold cores keep
//! them (no churn), then older applications win. On machines with
//! hyperthreads the split is of physical cores, each owned whole by one
//! application ([`whole_core_targets`]). Placement: keep what an
//! application holds, then prefer a hyperthread sibling of one of its cores,
//! then its package, then a physical core that is entirely free.

use crate::protocol::PRIORITY_LEVELS;
use crate::topology::{CoreId, Topology};

/// What one application asks for, as the policy sees it.
///
/// ```
/// use corewise_arbiter::policy::{targets, Demand};
/// // Asks for 3 cores at level 1, but has only 2 kernel threads to use them.
/// let d = Demand { requested: [0, 3, 0, 0, 0, 0, 0, 0], cap: 2, held: 0, user: 1000, user_cap: 8 };
/// assert_eq!(targets(&[d], 4), vec![2]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Demand {
    /// Requested cores per level, after limits.
    pub requested: [u32; PRIORITY_LEVELS],
    /// Most cores it can use at all (its kernel threads, its limit).
    pub cap: u32,
    /// Cores it holds now.
    pub held: u32,
    /// The user it runs as: applications of one user share `user_cap`.
    pub user: u32,
    /// Most cores all applications of `user` may get together (the same
    /// value on each of them; the smallest one counts).
    pub user_cap: u32,
}

/// Target core count per application, in the order of `demands` (which is
/// also the age order: earlier entries are older applications).
///
/// ```
/// use corewise_arbiter::policy::{targets, Demand};
/// let d = |lvl: usize, n: u32, user: u32, user_cap: u32| {
///     let mut r = [0; 8];
///     r[lvl] = n;
///     Demand { requested: r, cap: 100, held: 0, user, user_cap }
/// };
/// // 6 cores: the high-priority app takes 4, the two low ones split 2.
/// assert_eq!(targets(&[d(0, 4, 1, 99), d(3, 5, 2, 99), d(3, 5, 3, 99)], 6), vec![4, 1, 1]);
/// // User 1 may hold 3 cores in all: its two applications share them.
/// assert_eq!(targets(&[d(0, 4, 1, 3), d(0, 4, 1, 3), d(3, 5, 3, 99)], 6), vec![2, 1, 3]);
/// ```
pub fn targets(demands: &[Demand], cores: u32) -> Vec<u32> {
    let mut given = vec![0u32; demands.len()];
    let mut remaining = cores;
    // What each user may still get.
    let mut index: std::collections::BTreeMap<u32, usize> = std::collections::BTreeMap::new();
    let mut left: Vec<u32> = Vec::new();
    let user_of: Vec<usize> = demands
        .iter()
        .map(|d| {
            let i = *index.entry(d.user).or_insert_with(|| {
                left.push(d.user_cap);
                left.len() - 1
            });
            left[i] = left[i].min(d.user_cap);
            i
        })
        .collect();
    for level in 0..PRIORITY_LEVELS {
        if remaining == 0 {
            break;
        }
        // What each app still wants at this level (cumulative requests so far
        // minus what it already got, bounded by its cap).
        let mut want: Vec<u32> = demands
            .iter()
            .zip(&given)
            .map(|(d, &g)| {
                let upto: u32 = d.requested[..=level]
                    .iter()
                    .fold(0u32, |a, &b| a.saturating_add(b));
                upto.min(d.cap).saturating_sub(g)
            })
            .collect();
        while remaining > 0 {
            let mut active: Vec<usize> = (0..demands.len())
                .filter(|&i| want[i] > 0 && left[user_of[i]] > 0)
                .collect();
            if active.is_empty() {
                break;
            }
            // Fewer cores than contenders (or than a user may still get):
            // incumbents first, then age.
            active.sort_by_key(|&i| (demands[i].held <= given[i], i));
            for i in active {
                if remaining == 0 {
                    break;
                }
                let user_left = &mut left[user_of[i]];
                if *user_left == 0 {
                    continue;
                }
                *user_left -= 1;
                want[i] -= 1;
                given[i] += 1;
                remaining -= 1;
            }
        }
    }
    given
}

/// The physical cores among `cpus`: groups of hyperthread siblings, in the
/// order of their first CPU.
///
/// ```
/// use corewise_arbiter::policy::physical_cores;
/// use corewise_arbiter::topology::Topology;
/// let t = Topology::synthetic(2, 2, 2);
/// assert_eq!(physical_cores(&[2, 3, 4, 6], &t), vec![vec![2, 3], vec![4], vec![6]]);
/// ```
pub fn physical_cores(cpus: &[CoreId], topo: &Topology) -> Vec<Vec<CoreId>> {
    let mut groups: Vec<Vec<CoreId>> = Vec::new();
    for &c in cpus {
        match groups.iter_mut().find(|g| topo.are_siblings(g[0], c)) {
            Some(g) => g.push(c),
            None => groups.push(vec![c]),
        }
    }
    groups
}

/// How many physical cores the CPUs `cpus` touch.
///
/// ```
/// use corewise_arbiter::policy::cores_spanned;
/// use corewise_arbiter::topology::Topology;
/// let t = Topology::synthetic(1, 2, 2); // (0,1) and (2,3) are sibling pairs
/// assert_eq!(cores_spanned(&[0, 1], &t), 1);
/// assert_eq!(cores_spanned(&[1, 2], &t), 2);
/// ```
pub fn cores_spanned(cpus: &[CoreId], topo: &Topology) -> u32 {
    physical_cores(cpus, topo).len() as u32
}

/// An application's share when physical cores are owned whole: at most
/// `cpus` CPUs, on at most `cores` physical cores.
///
/// ```
/// use corewise_arbiter::policy::{whole_core_targets, Demand, Share};
/// use corewise_arbiter::topology::Topology;
/// // Two hyperthreads per core: asking for 3 CPUs takes 2 whole cores.
/// let t = Topology::synthetic(1, 4, 2);
/// let d = Demand { requested: [3, 0, 0, 0, 0, 0, 0, 0], cap: 8, held: 0, user: 1, user_cap: 8 };
/// let s = whole_core_targets(&[d], &[vec![]], &[2, 3, 4, 5, 6, 7], &t);
/// assert_eq!(s, vec![Share { cpus: 3, cores: 2 }]);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Share {
    /// CPUs (hyperthreads) it may hold.
    pub cpus: u32,
    /// Physical cores those CPUs may span.
    pub cores: u32,
}

/// Targets when hyperthread siblings stay with one application: the
/// equal split and the priorities of [`targets`] are applied to physical
/// cores (a request of `n` CPUs asks for `n / threads per core` cores,
/// rounded up), and each application may then use that many cores' CPUs,
/// up to what it asked for. `held[i]` are the CPUs application `i` holds.
/// Without hyperthreads this is [`targets`] exactly.
///
/// Why whole cores: two applications on the two hyperthreads of one core
/// share its execution units and caches, so neither gets a core's worth of
/// work done and each disturbs the other's latency; a core's siblings are
/// also the cheapest CPUs for one application's threads to share data
/// between. The price: an application asking for an odd number of CPUs
/// leaves a hyperthread of its last core idle.
///
/// ```
/// use corewise_arbiter::policy::{whole_core_targets, Demand, Share};
/// use corewise_arbiter::topology::Topology;
/// let t = Topology::synthetic(2, 2, 2);
/// let d = |n: u32| Demand {
///     requested: [n, 0, 0, 0, 0, 0, 0, 0],
///     cap: 100,
///     held: 0,
///     user: 1000,
///     user_cap: 100,
/// };
/// // 6 managed CPUs (3 physical cores), 3 applications asking for 3 CPUs
/// // each: one core, two CPUs, each.
/// let shares = whole_core_targets(&[d(3), d(3), d(3)], &[vec![], vec![], vec![]], &[2, 3, 4, 5, 6, 7], &t);
/// assert!(shares.iter().all(|s| *s == Share { cpus: 2, cores: 1 }));
/// // One CPU wanted: a core of its own, one CPU used.
/// let one = whole_core_targets(&[d(1)], &[vec![]], &[2, 3, 4, 5, 6, 7], &t);
/// assert_eq!(one, vec![Share { cpus: 1, cores: 1 }]);
/// ```
pub fn whole_core_targets(
    demands: &[Demand],
    held: &[Vec<CoreId>],
    managed: &[CoreId],
    topo: &Topology,
) -> Vec<Share> {
    let groups = physical_cores(managed, topo);
    let per_core = groups
        .iter()
        .map(|g| g.len() as u32)
        .min()
        .unwrap_or(1)
        .max(1);
    let in_cores = |cpus: u32| cpus.div_ceil(per_core);
    let core_demands: Vec<Demand> = demands
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let mut requested = [0u32; PRIORITY_LEVELS];
            let (mut cpus, mut cores) = (0u32, 0u32);
            for (level, &n) in d.requested.iter().enumerate() {
                cpus = cpus.saturating_add(n);
                let upto = in_cores(cpus);
                requested[level] = upto - cores;
                cores = upto;
            }
            Demand {
                requested,
                cap: in_cores(d.cap),
                held: held.get(i).map_or(0, |h| cores_spanned(h, topo)),
                user: d.user,
                // Rounded down, so that a user's cores never hold more
                // CPUs than its limit (one core for a limit of one CPU:
                // each application's own cap then keeps it to one).
                user_cap: (d.user_cap / per_core).max(d.user_cap.min(1)),
            }
        })
        .collect();
    targets(&core_demands, groups.len() as u32)
        .into_iter()
        .zip(demands)
        .map(|(cores, d)| {
            let wanted = d
                .requested
                .iter()
                .fold(0u32, |a, &b| a.saturating_add(b))
                .min(d.cap);
            Share {
                cpus: wanted.min(cores.saturating_mul(per_core)),
                cores,
            }
        })
        .collect()
}

/// Picks the best free core for an application holding `mine`.
///
/// ```
/// use corewise_arbiter::policy::choose_core;
/// use corewise_arbiter::topology::Topology;
/// let t = Topology::synthetic(2, 2, 2); // cpus 0-3 on package 0, 4-7 on 1
/// // Holding cpu 4, the sibling 5 wins over anything else.
/// assert_eq!(choose_core(&[0, 2, 5, 6], &[4], &t), Some(5));
/// // Holding nothing, a whole free physical core wins over a half-used one.
/// assert_eq!(choose_core(&[1, 2, 3], &[], &t), Some(2));
/// ```
pub fn choose_core(free: &[CoreId], mine: &[CoreId], topo: &Topology) -> Option<CoreId> {
    let score = |c: CoreId| -> u32 {
        let mut s = 0;
        if mine.iter().any(|&m| topo.are_siblings(m, c)) {
            s += 8;
        }
        let pkg = topo.package_of(c);
        if pkg.is_some() && mine.iter().any(|&m| topo.package_of(m) == pkg) {
            s += 4;
        }
        if topo
            .siblings(c)
            .iter()
            .all(|sib| *sib == c || free.contains(sib))
        {
            s += 2;
        }
        if mine.is_empty() {
            // Start on the package with the most free CPUs.
            let free_on_pkg = free.iter().filter(|&&f| topo.package_of(f) == pkg).count() as u32;
            s += free_on_pkg.min(1 << 20) * 16;
        }
        s
    };
    free.iter()
        .copied()
        .max_by_key(|&c| (score(c), std::cmp::Reverse(c)))
}

/// Picks which of an application's cores to give back: the one whose loss
/// splits the fewest sibling pairs and packages.
///
/// ```
/// use corewise_arbiter::policy::choose_victim;
/// use corewise_arbiter::topology::Topology;
/// let t = Topology::synthetic(1, 2, 2); // (0,1) and (2,3) are sibling pairs
/// // Holding 0, 1 and 2: releasing 2 keeps the pair (0,1) whole.
/// assert_eq!(choose_victim(&[0, 1, 2], &t), Some(2));
/// ```
pub fn choose_victim(held: &[CoreId], topo: &Topology) -> Option<CoreId> {
    let score = |c: CoreId| -> u32 {
        let sibs = held.iter().filter(|&&h| topo.are_siblings(h, c)).count() as u32;
        let pkg = topo.package_of(c);
        let same_pkg = held
            .iter()
            .filter(|&&h| h != c && topo.package_of(h) == pkg)
            .count() as u32;
        sibs * 1024 + same_pkg.min(1023)
    };
    held.iter()
        .copied()
        .min_by_key(|&c| (score(c), std::cmp::Reverse(c)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(req: [u32; 8], held: u32) -> Demand {
        Demand {
            requested: req,
            cap: 1000,
            held,
            // Each its own user, unlimited.
            user: rand_user(),
            user_cap: u32::MAX,
        }
    }

    fn rand_user() -> u32 {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(1 << 20);
        N.fetch_add(1, Ordering::Relaxed)
    }

    #[test]
    fn user_cap_spans_applications() {
        let r = [4, 0, 0, 0, 0, 0, 0, 0];
        let mut a = d(r, 0);
        let mut b = d(r, 0);
        let c = d(r, 0);
        a.user = 7;
        b.user = 7;
        a.user_cap = 3;
        b.user_cap = 3;
        // Without the shared cap it would be 2, 2, 2 (then 3 with 7 cores).
        assert_eq!(
            targets(&[a.clone(), b.clone(), c.clone()], 6),
            vec![2, 1, 3]
        );
        assert_eq!(
            targets(&[a.clone(), b.clone(), c.clone()], 3),
            vec![1, 1, 1]
        );
        // Inside the user's share the incumbent keeps the odd core.
        b.held = 3;
        assert_eq!(targets(&[a, b, c], 6), vec![1, 2, 3]);
    }

    #[test]
    fn priority_first() {
        let t = targets(
            &[
                d([0, 0, 0, 0, 0, 0, 0, 3], 3),
                d([2, 0, 0, 0, 0, 0, 0, 0], 0),
            ],
            3,
        );
        assert_eq!(t, vec![1, 2]);
        // Low priority gets nothing when the high one wants everything.
        let t = targets(
            &[
                d([0, 0, 0, 0, 0, 0, 0, 1], 1),
                d([5, 0, 0, 0, 0, 0, 0, 0], 0),
            ],
            4,
        );
        assert_eq!(t, vec![0, 4]);
    }

    #[test]
    fn equal_split_and_remainders() {
        let r = [4, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(targets(&[d(r, 0), d(r, 0), d(r, 0)], 6), vec![2, 2, 2]);
        assert_eq!(targets(&[d(r, 0), d(r, 0), d(r, 0)], 7), vec![3, 2, 2]);
        // Incumbent keeps the odd core.
        assert_eq!(targets(&[d(r, 0), d(r, 0), d(r, 3)], 7), vec![2, 2, 3]);
        // One core, two equal apps: the holder keeps it.
        let one = [1, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(targets(&[d(one, 0), d(one, 1)], 1), vec![0, 1]);
        assert_eq!(targets(&[d(one, 0), d(one, 0)], 1), vec![1, 0]);
        // Small demands are satisfied, the rest goes to the big one.
        assert_eq!(
            targets(
                &[
                    d([1, 0, 0, 0, 0, 0, 0, 0], 0),
                    d([9, 0, 0, 0, 0, 0, 0, 0], 0)
                ],
                6
            ),
            vec![1, 5]
        );
    }

    #[test]
    fn lower_level_adds_to_higher() {
        // An app asking 1 at level 0 and 2 more at level 3 can get 3.
        let t = targets(
            &[
                d([1, 0, 0, 2, 0, 0, 0, 0], 0),
                d([0, 0, 0, 0, 0, 0, 0, 9], 0),
            ],
            5,
        );
        assert_eq!(t, vec![3, 2]);
    }

    #[test]
    fn cap_limits() {
        let mut x = d([10, 0, 0, 0, 0, 0, 0, 0], 0);
        x.cap = 2;
        assert_eq!(
            targets(&[x, d([10, 0, 0, 0, 0, 0, 0, 0], 0)], 8),
            vec![2, 6]
        );
        assert_eq!(targets(&[], 8), Vec::<u32>::new());
        assert_eq!(targets(&[d([10; 8], 0)], 0), vec![0]);
    }

    #[test]
    fn never_more_than_available() {
        for cores in 0..10 {
            for a in 0..5 {
                for b in 0..5 {
                    let t = targets(
                        &[
                            d([a, 0, b, 0, 0, 0, 0, 0], 0),
                            d([b, a, 0, 0, 0, 0, 0, 1], 0),
                        ],
                        cores,
                    );
                    assert!(t.iter().sum::<u32>() <= cores);
                    assert!(t[0] <= a + b);
                }
            }
        }
    }

    #[test]
    fn placement_keeps_siblings_and_packages() {
        let t = Topology::synthetic(2, 2, 2);
        // Building an app up core by core from nothing keeps it on one package
        // and in sibling pairs.
        let mut free: Vec<CoreId> = (0..8).collect();
        let mut mine = Vec::new();
        for _ in 0..4 {
            let c = choose_core(&free, &mine, &t).unwrap();
            free.retain(|&f| f != c);
            mine.push(c);
        }
        mine.sort();
        let pkgs: Vec<_> = mine.iter().map(|&c| t.package_of(c)).collect();
        assert!(pkgs.windows(2).all(|w| w[0] == w[1]), "{mine:?}");
        assert_eq!(choose_core(&[], &mine, &t), None);
        // Whole cores: three applications asking more than their share of
        // three physical cores get one each; priorities still count.
        let d0 = |lvl: usize, n: u32| {
            let mut r = [0; 8];
            r[lvl] = n;
            d(r, 0)
        };
        let managed: Vec<CoreId> = (2..8).collect();
        let none = vec![vec![]; 3];
        let s = whole_core_targets(&[d0(2, 5), d0(2, 5), d0(2, 5)], &none, &managed, &t);
        assert_eq!(s, vec![Share { cpus: 2, cores: 1 }; 3]);
        let s = whole_core_targets(&[d0(7, 6), d0(0, 3), d0(2, 1)], &none, &managed, &t);
        assert_eq!(
            s,
            vec![
                Share { cpus: 0, cores: 0 },
                Share { cpus: 3, cores: 2 },
                Share { cpus: 1, cores: 1 }
            ]
        );
        // An incumbent spread over two cores counts as holding two.
        let held = vec![vec![2, 4], vec![]];
        let s = whole_core_targets(&[d0(2, 2), d0(2, 4)], &held, &[2, 3, 4, 5], &t);
        assert_eq!(s[0].cores + s[1].cores, 2);
        assert_eq!(
            physical_cores(&[7, 2, 6, 3], &t),
            vec![vec![7, 6], vec![2, 3]]
        );
        // Without hyperthreads nothing breaks.
        let flat = Topology::synthetic(1, 4, 1);
        assert_eq!(choose_core(&[3, 1], &[0], &flat), Some(1));
        assert_eq!(choose_victim(&[0, 2], &flat), Some(2));
        let r = [3, 1, 0, 0, 0, 0, 0, 2];
        assert_eq!(
            whole_core_targets(&[d(r, 0), d(r, 0)], &[vec![], vec![]], &[1, 2, 3], &flat)
                .iter()
                .map(|s| s.cpus)
                .collect::<Vec<_>>(),
            targets(&[d(r, 0), d(r, 0)], 3)
        );
    }
}
