//! The daemon's bookkeeping: applications, kernel threads, who holds which
//! core, pending reclaims, and turning policy decisions into fence operations.
//!
//! Why separate from the socket loop: every state change funnels through
//! [`State::rebalance`], and the loop only decodes messages and delivers the
//! replies this module queues in its outbox.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::config::{Config, Limits};
use crate::fence::{Fence, FenceError};
use crate::policy::{choose_core, choose_victim, cores_spanned, whole_core_targets, Demand};
use crate::protocol::{Response, StatusEntry, PRIORITY_LEVELS};
use crate::shm::{SharedPageWriter, ShmError};
use crate::topology::{CoreId, CpuList, Topology};
use crate::warm::WarmCores;

/// Identifies a connection (applications are keyed by their control
/// connection; ids grow, so they also give the age order).
pub type ConnId = u64;

/// Why a message was refused (the connection is then dropped).
#[derive(Debug, thiserror::Error)]
pub enum Reject {
    /// Unknown application token.
    #[error("unknown application token")]
    BadToken,
    /// The thread socket's peer is not the application's process.
    #[error("peer pid {peer} is not the application's pid {app}")]
    WrongProcess {
        /// Peer pid.
        peer: u32,
        /// Application pid.
        app: u32,
    },
    /// The thread id does not belong to the peer process.
    #[error("thread {tid} does not belong to process {pid}")]
    ForeignThread {
        /// Thread id.
        tid: u32,
        /// Process id.
        pid: u32,
    },
    /// The thread id is already attached.
    #[error("thread {0} is already attached")]
    Duplicate(u32),
    /// The shared page could not be created.
    #[error(transparent)]
    Shm(#[from] ShmError),
    /// The fence refused the thread.
    #[error(transparent)]
    Fence(#[from] FenceError),
}

/// One registered application.
pub struct App {
    token: u64,
    pid: u32,
    uid: u32,
    name: String,
    limits: Limits,
    requested: [u32; PRIORITY_LEVELS],
    shm: SharedPageWriter,
    threads: Vec<ConnId>,
    preempted: u32,
}

impl App {
    /// The shared page.
    pub fn shm(&self) -> &SharedPageWriter {
        &self.shm
    }
    /// Token for thread sockets.
    pub fn token(&self) -> u64 {
        self.token
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Attached, not asking for a core (or running unmanaged after a forced reclaim).
    Idle,
    /// Asleep in `block_until_core_available`.
    Waiting,
    /// Holds a core; `deadline` is set while a release is pending.
    Running {
        core: CoreId,
        deadline: Option<Instant>,
    },
}

struct Thread {
    app: ConnId,
    tid: u32,
    phase: Phase,
}

/// Everything the daemon knows.
pub struct State {
    apps: BTreeMap<ConnId, App>,
    threads: BTreeMap<ConnId, Thread>,
    holder: BTreeMap<CoreId, ConnId>,
    managed: Vec<CoreId>,
    all: CpuList,
    topo: Topology,
    timeout: Duration,
    config: Config,
    fence: Box<dyn Fence>,
    next_token: u64,
    release_spin: Duration,
    spin_until: Option<Instant>,
    /// Freed cores kept polling for a moment, and who held each core when
    /// that was last looked at (to see releases and new grants).
    warm: WarmCores,
    warm_holders: BTreeMap<CoreId, ConnId>,
    /// Replies to deliver, in order.
    pub outbox: Vec<(ConnId, Response)>,
    /// Connections the daemon decided to close.
    pub to_close: Vec<ConnId>,
}

impl State {
    /// A daemon managing `managed` (a subset of `all`) through `fence`.
    pub fn new(
        fence: Box<dyn Fence>,
        all: CpuList,
        managed: Vec<CoreId>,
        topo: Topology,
        timeout: Duration,
        config: Config,
    ) -> Self {
        // Tokens only need to be unguessable enough not to collide by
        // accident; peer credentials are the real check.
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
            ^ (std::process::id() as u64) << 32;
        Self {
            apps: BTreeMap::new(),
            threads: BTreeMap::new(),
            holder: BTreeMap::new(),
            managed,
            all,
            topo,
            timeout,
            config,
            fence,
            next_token: seed | 1,
            release_spin: Duration::ZERO,
            spin_until: None,
            warm: WarmCores::disabled(),
            warm_holders: BTreeMap::new(),
            outbox: Vec::new(),
            to_close: Vec::new(),
        }
    }

    /// After asking for a release, poll without sleeping for this long: the
    /// release usually arrives within microseconds, and not sleeping saves a
    /// wake-up of the daemon on the critical path of a reclaim.
    pub fn set_release_spin(&mut self, d: Duration) {
        self.release_spin = d;
    }

    /// Keep freed cores polling through `warm` (see [`crate::warm`]).
    pub fn set_warm(&mut self, warm: WarmCores) {
        self.warm = warm;
    }

    /// When the next warm window ends.
    pub fn warm_deadline(&self) -> Option<Instant> {
        self.warm.next_deadline()
    }

    /// Opens a warm window on every core that lost its holder since the
    /// last call, closes it on every core granted to a new holder, and ends
    /// the windows that are over. Called after the replies went out.
    pub fn sync_warm(&mut self, now: Instant) {
        for &core in &self.managed {
            let before = self.warm_holders.get(&core).copied();
            let after = self.holder.get(&core).copied();
            match (before, after) {
                (Some(_), None) => self.warm.freed(core, now),
                (None, Some(_)) => self.warm.taken(core),
                (Some(a), Some(b)) if a != b => self.warm.taken(core),
                _ => {}
            }
        }
        self.warm_holders.clone_from(&self.holder);
        self.warm.expire(now);
    }

    /// Until when the daemon loop should poll without sleeping.
    pub fn spin_until(&self) -> Option<Instant> {
        let until = self.spin_until?;
        (self.next_deadline().is_some() && Instant::now() < until).then_some(until)
    }

    /// Backend name.
    pub fn fence_name(&self) -> &'static str {
        self.fence.name()
    }

    /// Registers an application on connection `conn`.
    pub fn add_app(&mut self, conn: ConnId, pid: u32, uid: u32) -> Result<&App, Reject> {
        let shm = SharedPageWriter::create()?;
        self.next_token = self
            .next_token
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let name = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "?".into());
        let limits = self.config.limits_for(uid);
        tracing::info!(conn, pid, uid, %name, ?limits, "application registered");
        let app = App {
            token: self.next_token,
            pid,
            uid,
            name,
            limits,
            requested: [0; PRIORITY_LEVELS],
            shm,
            threads: Vec::new(),
            preempted: 0,
        };
        Ok(self.apps.entry(conn).or_insert(app))
    }

    /// Applies a core request from the application on `conn`.
    pub fn set_requested(&mut self, conn: ConnId, counts: [u32; PRIORITY_LEVELS]) {
        let Some(app) = self.apps.get_mut(&conn) else {
            return;
        };
        let c = app.limits.clip(counts);
        if c.clipped {
            tracing::info!(conn, pid = app.pid, uid = app.uid, ?counts, effective = ?c.effective, "request clipped by limits");
        }
        app.requested = c.effective;
        self.rebalance(Instant::now());
        // The acknowledgement goes out after any grant it caused: waking the
        // requester first could delay the granted thread's wake-up.
        self.outbox.push((
            conn,
            Response::RequestAck {
                effective: c.effective,
                clipped: c.clipped,
            },
        ));
    }

    /// Attaches a kernel-thread connection to its application.
    pub fn attach_thread(
        &mut self,
        conn: ConnId,
        token: u64,
        tid: u32,
        peer_pid: u32,
    ) -> Result<(), Reject> {
        let (&app_conn, app) = self
            .apps
            .iter()
            .find(|(_, a)| a.token == token)
            .ok_or(Reject::BadToken)?;
        if app.pid != peer_pid {
            return Err(Reject::WrongProcess {
                peer: peer_pid,
                app: app.pid,
            });
        }
        if !std::path::Path::new(&format!("/proc/{peer_pid}/task/{tid}")).exists() {
            return Err(Reject::ForeignThread { tid, pid: peer_pid });
        }
        if self.threads.values().any(|t| t.tid == tid) {
            return Err(Reject::Duplicate(tid));
        }
        self.fence.adopt(peer_pid, tid)?;
        self.threads.insert(
            conn,
            Thread {
                app: app_conn,
                tid,
                phase: Phase::Idle,
            },
        );
        if let Some(app) = self.apps.get_mut(&app_conn) {
            app.threads.push(conn);
        }
        self.outbox.push((conn, Response::Attached));
        Ok(())
    }

    /// The thread on `conn` gives back its core (if any) and waits for one.
    pub fn block(&mut self, conn: ConnId) {
        let now = Instant::now();
        self.release_core_of(conn, true);
        if let Some(t) = self.threads.get_mut(&conn) {
            t.phase = Phase::Waiting;
        }
        self.rebalance(now);
    }

    /// Takes the core held by thread `conn` back into the free pool.
    fn release_core_of(&mut self, conn: ConnId, unconfine: bool) -> Option<CoreId> {
        let t = self.threads.get_mut(&conn)?;
        let Phase::Running { core, .. } = t.phase else {
            return None;
        };
        t.phase = Phase::Idle;
        let tid = t.tid;
        let app = t.app;
        self.holder.remove(&core);
        if let Some(a) = self.apps.get(&app) {
            a.shm.set_release(core, false);
            a.shm.set_granted(core, 0);
        }
        if unconfine {
            match self.fence.unconfine(tid) {
                Ok(()) | Err(FenceError::NoSuchThread(_)) => {}
                Err(e) => {
                    tracing::warn!(tid, error = %e, "could not move thread back to the unmanaged set")
                }
            }
        }
        Some(core)
    }

    /// Forgets connection `conn` (application or thread); a closed
    /// application socket gives back all its cores at once.
    pub fn remove_conn(&mut self, conn: ConnId) {
        if let Some(app) = self.apps.remove(&conn) {
            tracing::info!(conn, pid = app.pid, "application gone");
            // Put the app back temporarily so releases can clear its page
            // flags; simpler: release cores directly.
            for t in &app.threads {
                if let Some(th) = self.threads.remove(t) {
                    if let Phase::Running { core, .. } = th.phase {
                        self.holder.remove(&core);
                        let _ = self.fence.unconfine(th.tid);
                    }
                }
                self.to_close.push(*t);
            }
        } else if self.threads.contains_key(&conn) {
            // The thread (or its process) is gone: its tid may be reused, so
            // only move it if it still is our thread's id (best effort).
            self.release_core_of(conn, true);
            if let Some(th) = self.threads.remove(&conn) {
                if let Some(a) = self.apps.get_mut(&th.app) {
                    a.threads.retain(|&c| c != conn);
                }
            }
        } else {
            return;
        }
        self.rebalance(Instant::now());
    }

    /// Earliest pending reclaim deadline.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.threads
            .values()
            .filter_map(|t| match t.phase {
                Phase::Running { deadline, .. } => deadline,
                _ => None,
            })
            .min()
    }

    /// Forces out every thread whose release deadline has passed.
    pub fn expire(&mut self, now: Instant) {
        let late: Vec<ConnId> = self
            .threads
            .iter()
            .filter(
                |(_, t)| matches!(t.phase, Phase::Running { deadline: Some(d), .. } if d <= now),
            )
            .map(|(&c, _)| c)
            .collect();
        if late.is_empty() {
            return;
        }
        for conn in late {
            let Some(core) = self.release_core_of(conn, true) else {
                continue;
            };
            let Some(t) = self.threads.get(&conn) else {
                continue;
            };
            if let Some(app) = self.apps.get_mut(&t.app) {
                app.preempted += 1;
                app.shm.add_preempted();
                tracing::info!(pid = app.pid, tid = t.tid, core, "core reclaimed by force");
            }
            self.outbox.push((conn, Response::Preempted { core }));
        }
        self.rebalance(now);
    }

    fn held_by(&self, app: ConnId) -> Vec<(ConnId, CoreId, bool)> {
        self.threads
            .iter()
            .filter(|(_, t)| t.app == app)
            .filter_map(|(&c, t)| match t.phase {
                Phase::Running { core, deadline } => Some((c, core, deadline.is_some())),
                _ => None,
            })
            .collect()
    }

    /// Recomputes the allocation and carries it out: asks for releases,
    /// withdraws releases no longer needed, grants free cores to waiting threads.
    pub fn rebalance(&mut self, now: Instant) {
        let app_ids: Vec<ConnId> = self.apps.keys().copied().collect();
        let demands: Vec<Demand> = app_ids
            .iter()
            .map(|id| {
                let a = &self.apps[id];
                // Only threads that hold a core or wait for one can use one;
                // counting idle ones would park cores nobody can take.
                let usable = a
                    .threads
                    .iter()
                    .filter(|c| self.threads.get(c).is_some_and(|t| t.phase != Phase::Idle))
                    .count() as u32;
                Demand {
                    requested: a.requested,
                    cap: a.limits.max_cores.min(usable),
                    held: self.held_by(*id).len() as u32,
                }
            })
            .collect();
        // Hyperthread siblings stay with one application (see the policy).
        let held_now: Vec<Vec<CoreId>> = app_ids
            .iter()
            .map(|id| self.held_by(*id).iter().map(|h| h.1).collect())
            .collect();
        let shares = whole_core_targets(&demands, &held_now, &self.managed, &self.topo);
        let target: Vec<u32> = shares.iter().map(|s| s.cpus).collect();

        // Releases: down to the share's CPUs, on at most its physical cores.
        for (i, &id) in app_ids.iter().enumerate() {
            let held = self.held_by(id);
            let releasing = held.iter().filter(|h| h.2).count() as u32;
            let keep = held.len() as u32 - releasing;
            let mut candidates: Vec<CoreId> = held.iter().filter(|h| !h.2).map(|h| h.1).collect();
            if keep > target[i] || cores_spanned(&candidates, &self.topo) > shares[i].cores {
                while candidates.len() as u32 > target[i]
                    || cores_spanned(&candidates, &self.topo) > shares[i].cores
                {
                    let Some(v) = choose_victim(&candidates, &self.topo) else {
                        break;
                    };
                    candidates.retain(|&c| c != v);
                    if let Some((tc, _, _)) = held.iter().find(|h| h.1 == v) {
                        if let Some(t) = self.threads.get_mut(tc) {
                            t.phase = Phase::Running {
                                core: v,
                                deadline: Some(now + self.timeout),
                            };
                        }
                    }
                    self.apps[&id].shm.set_release(v, true);
                    // The core is about to fall idle and be granted again:
                    // keep it polling through the hand-over.
                    self.warm.freed(v, now);
                    self.spin_until = Some(now + self.release_spin);
                    tracing::debug!(app = id, core = v, "release requested");
                }
            } else if keep < target[i] && releasing > 0 {
                for (tc, core, _) in held.iter().filter(|h| h.2) {
                    candidates.push(*core);
                    if candidates.len() as u32 > target[i]
                        || cores_spanned(&candidates, &self.topo) > shares[i].cores
                    {
                        candidates.pop();
                        continue;
                    }
                    if let Some(t) = self.threads.get_mut(tc) {
                        t.phase = Phase::Running {
                            core: *core,
                            deadline: None,
                        };
                    }
                    self.apps[&id].shm.set_release(*core, false);
                }
            }
        }

        // Grants, most important applications first.
        let mut order: Vec<usize> = (0..app_ids.len()).collect();
        order.sort_by_key(|&i| {
            let lvl = self.apps[&app_ids[i]]
                .requested
                .iter()
                .position(|&n| n > 0)
                .unwrap_or(PRIORITY_LEVELS);
            (lvl, i)
        });
        let mut free: Vec<CoreId> = self
            .managed
            .iter()
            .copied()
            .filter(|c| !self.holder.contains_key(c))
            .collect();
        let mut grants: Vec<(ConnId, ConnId, CoreId)> = Vec::new();
        // Which application each CPU belongs to, grants of this pass included.
        let mut owner: BTreeMap<CoreId, ConnId> = self
            .holder
            .iter()
            .filter_map(|(&c, tc)| self.threads.get(tc).map(|t| (c, t.app)))
            .collect();
        for i in order {
            let id = app_ids[i];
            let mut mine: Vec<CoreId> = self.held_by(id).iter().map(|h| h.1).collect();
            let mut waiting: Vec<ConnId> = self.apps[&id]
                .threads
                .iter()
                .copied()
                .filter(|c| {
                    self.threads
                        .get(c)
                        .is_some_and(|t| t.phase == Phase::Waiting)
                })
                .collect();
            while (mine.len() as u32) < target[i] && !waiting.is_empty() {
                // Free CPUs whose siblings are free or this application's,
                // within its share of physical cores.
                let open: Vec<CoreId> = free
                    .iter()
                    .copied()
                    .filter(|&c| {
                        let sibs = self.topo.siblings(c);
                        sibs.iter().all(|s| owner.get(s).is_none_or(|&a| a == id)) && {
                            let mut with = mine.clone();
                            with.push(c);
                            cores_spanned(&with, &self.topo) <= shares[i].cores
                        }
                    })
                    .collect();
                let Some(core) = choose_core(&open, &mine, &self.topo) else {
                    break;
                };
                free.retain(|&c| c != core);
                owner.insert(core, id);
                mine.push(core);
                grants.push((id, waiting.remove(0), core));
            }
        }
        if grants.is_empty() {
            self.sync_unmanaged();
            return;
        }
        // Take the cores out of the unmanaged set first, then move threads.
        for &(_, tc, core) in &grants {
            self.holder.insert(core, tc);
        }
        self.sync_unmanaged();
        let mut failed = false;
        for (app, tc, core) in grants {
            let tid = self.threads[&tc].tid;
            match self.fence.confine(tid, core) {
                Ok(()) => {
                    if let Some(t) = self.threads.get_mut(&tc) {
                        t.phase = Phase::Running {
                            core,
                            deadline: None,
                        };
                    }
                    self.apps[&app].shm.set_granted(core, tid);
                    self.outbox.push((tc, Response::Granted { core }));
                    tracing::debug!(app, tid, core, "core granted");
                }
                Err(e) => {
                    tracing::warn!(tid, core, error = %e, "could not confine thread; dropping it");
                    self.holder.remove(&core);
                    if let Some(t) = self.threads.get_mut(&tc) {
                        t.phase = Phase::Idle;
                    }
                    self.to_close.push(tc);
                    failed = true;
                }
            }
        }
        if failed {
            self.sync_unmanaged();
        }
    }

    /// The unmanaged set: every CPU but the physical cores that hold a
    /// grant (a granted CPU's idle sibling stays fenced too: it belongs to
    /// the same application).
    fn sync_unmanaged(&mut self) {
        let set: CpuList =
            self.all
                .cores()
                .filter(|&c| {
                    !self.holder.keys().any(|&h| {
                        h == c || (self.managed.contains(&c) && self.topo.are_siblings(h, c))
                    })
                })
                .collect();
        if let Err(e) = self.fence.set_unmanaged(&set) {
            tracing::error!(error = %e, "could not update the unmanaged set");
        }
    }

    /// The status table.
    pub fn status(&self) -> Vec<StatusEntry> {
        self.apps
            .iter()
            .map(|(&id, a)| {
                let mut granted: Vec<u32> = self.held_by(id).iter().map(|h| h.1).collect();
                granted.sort();
                StatusEntry {
                    pid: a.pid,
                    uid: a.uid,
                    name: a.name.clone(),
                    requested: a.requested,
                    granted,
                    preempted: a.preempted,
                }
            })
            .collect()
    }

    /// Tells every application the daemon is leaving and dismantles the fence.
    pub fn shutdown(&mut self) -> Result<(), FenceError> {
        for a in self.apps.values() {
            a.shm.set_shutdown();
        }
        self.warm.restore_all();
        self.fence.teardown()
    }

    /// Whether `conn` is a registered application.
    pub fn is_app(&self, conn: ConnId) -> bool {
        self.apps.contains_key(&conn)
    }

    /// Whether `conn` is an attached kernel thread.
    pub fn is_thread(&self, conn: ConnId) -> bool {
        self.threads.contains_key(&conn)
    }
}
