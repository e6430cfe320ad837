//! Loom models of the dispatcher's cross-core protocol: slot claim,
//! publication through the slot's generation, the wake-up word, parking,
//! and the idle gate, as the dispatcher and spawners use them together.

#[cfg(all(test, loom))]
mod loom_tests {
    use crate::sched::idle::IdleGate;
    use crate::sched::occupancy::*;
    use crate::sched::slot::Invocation;
    use crate::sched::wakeup::*;
    use crate::shim::{fence, AtomicBool, Ordering, UnsafeCell};
    use loom::sync::Arc;

    /// The dispatcher's loop, reduced to one slot: take a due thread, or
    /// announce sleep, re-check with SeqCst, and sleep.
    fn dispatch_until(
        mask: &MaskAndCount,
        w: Wakeup<'_>,
        gate: &IdleGate,
        mut run: impl FnMut() -> bool,
    ) {
        loop {
            if mask.occupied() & 1 != 0 && w.take_if_due(&mut || 0) {
                if run() {
                    return;
                }
                continue;
            }
            gate.prepare_sleep();
            if mask.occupied() & 1 != 0 && w.due_or_deadline(0).is_none() {
                gate.cancel_sleep();
                continue;
            }
            gate.sleep(None);
        }
    }

    /// A spawner on its own thread: claims slot 0, writes `value` as the
    /// thread's function, publishes it and signals the thread.
    fn spawn_into_slot_0(
        mask: &Arc<MaskAndCount>,
        inv: &Arc<Invocation>,
        gate: &Arc<IdleGate>,
        job: &Arc<UnsafeCell<u32>>,
        value: u32,
    ) -> loom::thread::JoinHandle<()> {
        let (mask, inv, gate, job) = (mask.clone(), inv.clone(), gate.clone(), job.clone());
        loom::thread::spawn(move || {
            assert_eq!(mask.claim(), Some(0));
            // SAFETY: the slot is ours until it is published.
            job.with_mut(|p| unsafe { *p = value });
            inv.publish();
            // The spawner's signal touches only the shared half.
            inv.signals.0.fetch_add(SIGNAL, Ordering::Release);
            gate.wake_after_rmw();
        })
    }

    #[test]
    fn spawn_onto_a_sleeping_core_is_never_lost() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let inv = Arc::new(Invocation::new());
            let local = LocalWake::new();
            let gate = Arc::new(IdleGate::new());
            let job = Arc::new(UnsafeCell::new(0u32));
            let spawner = spawn_into_slot_0(&mask, &inv, &gate, &job, 42);
            let w = Wakeup {
                shared: &inv.signals,
                local: &local,
            };
            dispatch_until(&mask, w, &gate, || {
                // A stale signal may run the slot before it is published:
                // the slot loop runs only a new generation.
                if inv.to_run(0).is_none() {
                    return false;
                }
                // SAFETY: published with release; the spawner is done.
                assert_eq!(job.with_mut(|p| unsafe { *p }), 42);
                mask.release(0);
                true
            });
            spawner.join().unwrap();
            assert_eq!(mask.count(), 0);
        });
    }

    #[test]
    fn a_reused_slot_runs_only_its_new_function_once() {
        // The slot's first thread (generation 1) ran and ended; the core
        // kept the generation it ran and freed the slot without writing
        // the slot's line. A signal meant for that thread races the next
        // spawn into the slot: the core must never run the old function
        // again, nor the new one before its publication or twice.
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let inv = Arc::new(Invocation::new());
            let local = LocalWake::new();
            let gate = Arc::new(IdleGate::new());
            let job = Arc::new(UnsafeCell::new(1u32));
            inv.publish();
            let mut ran = 1u32;
            let w = Wakeup {
                shared: &inv.signals,
                local: &local,
            };
            w.reset();
            let stale = {
                let (inv, gate) = (inv.clone(), gate.clone());
                loom::thread::spawn(move || {
                    inv.signals.0.fetch_add(SIGNAL, Ordering::Release);
                    gate.wake_after_rmw();
                })
            };
            let spawner = spawn_into_slot_0(&mask, &inv, &gate, &job, 2);
            let mut runs = 0;
            dispatch_until(&mask, w, &gate, || {
                let Some(g) = inv.to_run(ran) else {
                    return false;
                };
                // SAFETY: published with release; the spawner is done.
                assert_eq!(job.with_mut(|p| unsafe { *p }), 2);
                runs += 1;
                ran = g;
                mask.release(0);
                true
            });
            stale.join().unwrap();
            spawner.join().unwrap();
            assert_eq!(runs, 1);
            assert_eq!(inv.to_run(ran), None);
        });
    }

    #[test]
    fn signal_racing_block_is_never_lost() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let shared = Arc::new(SignalWord::new());
            let local = LocalWake::new();
            let gate = Arc::new(IdleGate::new());
            let flag = Arc::new(AtomicBool::new(false));
            assert_eq!(mask.claim(), Some(0));
            let w = Wakeup {
                shared: &shared,
                local: &local,
            };
            w.signal();
            let signaller = {
                let (shared, gate, flag) = (shared.clone(), gate.clone(), flag.clone());
                loom::thread::spawn(move || {
                    flag.store(true, Ordering::Relaxed);
                    shared.0.fetch_add(SIGNAL, Ordering::Release);
                    gate.wake_after_rmw();
                })
            };
            // The user thread: wait for the flag with block().
            dispatch_until(&mask, w, &gate, || loop {
                if flag.load(Ordering::Relaxed) {
                    return true;
                }
                if w.block_until(BLOCKED) {
                    return false; // switched out
                }
            });
            signaller.join().unwrap();
        });
    }

    #[test]
    fn claiming_ahead_racing_a_claim_and_a_release_never_shares_a_slot() {
        // Slot 0 taken; the core frees it while one spawner claims three
        // slots ahead (a reservation) and another claims one.
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            assert_eq!(mask.claim(), Some(0));
            let m = mask.clone();
            let freer = loom::thread::spawn(move || m.release(0));
            let m = mask.clone();
            let ahead = loom::thread::spawn(move || {
                let (first, more) = m.claim_ahead(3).unwrap();
                (1u64 << first) | more
            });
            let m = mask.clone();
            let one = loom::thread::spawn(move || 1u64 << m.claim().unwrap());
            freer.join().unwrap();
            let (a, b) = (ahead.join().unwrap(), one.join().unwrap());
            assert_eq!(a & b, 0, "shared slots: {a:#b} and {b:#b}");
            assert!(a.count_ones() >= 1 && a.count_ones() <= 3);
            assert_eq!(mask.occupied(), a | b);
            mask.release_all(a | b);
            assert_eq!(mask.occupied(), 0);
        });
    }

    #[test]
    fn claims_racing_a_release_never_share_a_slot() {
        // Slots 0 and 1 taken; the core frees slot 0 while two spawners
        // claim. Each spawner must end with a slot of its own, and the
        // mask must hold exactly the slots in use.
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            assert_eq!(mask.claim(), Some(0));
            assert_eq!(mask.claim(), Some(1));
            let m = mask.clone();
            let freer = loom::thread::spawn(move || m.release(0));
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let m = mask.clone();
                    loom::thread::spawn(move || m.claim().unwrap())
                })
                .collect();
            freer.join().unwrap();
            let got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            assert_ne!(got[0], got[1], "two spawners claimed slot {}", got[0]);
            assert!(
                got.iter().all(|&s| s != 1),
                "slot 1 is still taken: {got:?}"
            );
            let expect = got.iter().fold(1u64 << 1, |m, &s| m | (1 << s));
            assert_eq!(mask.occupied(), expect);
            assert_eq!(mask.count(), 3);
        });
    }

    #[test]
    fn signals_racing_a_park_place_the_thread_exactly_once() {
        // A blocked thread's dispatcher parks it while two signallers
        // signal it. Either the park fails (a signal came first: the thread
        // stays in its slot and is due) or exactly one signaller places it.
        loom::model(|| {
            let shared = Arc::new(SignalWord::new());
            let local = LocalWake::new();
            let w = Wakeup {
                shared: &shared,
                local: &local,
            };
            assert!(w.block_until(BLOCKED));
            let signallers: Vec<_> = (0..2)
                .map(|_| {
                    let shared = shared.clone();
                    loom::thread::spawn(move || {
                        let parked = shared.0.fetch_add(SIGNAL, Ordering::AcqRel) & PARKED != 0;
                        usize::from(parked && shared.claim_unpark())
                    })
                })
                .collect();
            let parked = w.try_park();
            let placed: usize = signallers.into_iter().map(|h| h.join().unwrap()).sum();
            if parked {
                assert_eq!(placed, 1, "a parked thread is placed once");
            } else {
                assert_eq!(placed, 0);
                assert!(w.take_if_due(&mut || 0), "an unparked thread is due");
            }
            assert_eq!(shared.0.load(Ordering::Relaxed) & PARKED, 0);
        });
    }

    #[test]
    fn a_sweep_racing_a_spawn_never_strands_the_thread() {
        // The spawner publishes its thread's function in the slot it
        // claimed, then signals it. In between, the slot's dispatcher may
        // sweep (a periodic sweep, or the one before it sleeps) and take
        // the published thread, which has no signal yet, for a blocked
        // one: it parks it and frees the slot. The spawner's signal then
        // finds the thread parked and, like any signaller that clears the
        // mark, places it. (A spawner that ignored the mark, taking a
        // thread it had just put in a slot for one that cannot be parked,
        // left it parked with a signal pending and nobody to place it: a
        // thread that never ran.)
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let inv = Arc::new(Invocation::new());
            let local = LocalWake::new();
            // The spawner's claim (the sweep only looks at occupied slots).
            assert_eq!(mask.claim(), Some(0));
            let spawner = {
                let inv = inv.clone();
                loom::thread::spawn(move || {
                    inv.publish();
                    let shared = &inv.signals;
                    // `park::signal_context`: a signal that finds the
                    // thread parked places it if it clears the mark.
                    let parked = shared.0.fetch_add(SIGNAL, Ordering::AcqRel) & PARKED != 0;
                    parked && shared.claim_unpark()
                })
            };
            let w = Wakeup {
                shared: &inv.signals,
                local: &local,
            };
            // The sweep, on slot 0 (`park::park`): a published thread that
            // is not due leaves its slot if no signal came since it ran.
            let parked =
                inv.is_published(0) && w.due_or_deadline(0) == Some(BLOCKED) && w.try_park();
            if parked {
                mask.release(0);
            }
            let placed = spawner.join().unwrap();
            assert_eq!(
                placed, parked,
                "a parked new thread is placed by its spawner"
            );
            // In its slot, or wherever it is placed, the thread is due.
            assert!(w.take_if_due(&mut || 0));
            assert_eq!(inv.signals.0.load(Ordering::Relaxed) & PARKED, 0);
        });
    }

    #[test]
    fn two_spawners_claim_distinct_slots() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let hs: Vec<_> = (0..2)
                .map(|_| {
                    let m = mask.clone();
                    loom::thread::spawn(move || m.claim().unwrap())
                })
                .collect();
            let mut got: Vec<usize> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            got.sort_unstable();
            assert_eq!(got, vec![0, 1]);
            assert_eq!(mask.count(), 2);
        });
    }

    /// A core being given back, and a spawner that read it as active: the
    /// dispatcher clears `active`, fences and looks at its slots a last
    /// time (`dispatch::release`, `park::evict_all`); the spawner claims a
    /// slot, fences and reads `active` (`spawn::still_active`). Either the
    /// dispatcher sees the slot taken and stays until the thread has moved,
    /// or the spawner sees the core inactive and gives the slot back; never
    /// neither. With either fence removed, the model finds the run where
    /// both miss: a thread on a core nobody runs.
    #[test]
    fn a_spawn_never_lands_on_a_core_after_its_last_look() {
        loom::model(|| {
            let mask = Arc::new(MaskAndCount::new());
            let active = Arc::new(AtomicBool::new(true));
            let spawner = {
                let (mask, active) = (mask.clone(), active.clone());
                loom::thread::spawn(move || {
                    let slot = mask.claim().unwrap();
                    fence(Ordering::SeqCst);
                    if active.load(Ordering::Acquire) {
                        true
                    } else {
                        mask.release(slot);
                        false
                    }
                })
            };
            active.store(false, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let left = mask.occupied() == 0;
            let kept = spawner.join().unwrap();
            assert!(
                !(left && kept),
                "a thread was put on a core after its dispatcher's last look"
            );
        });
    }
}
