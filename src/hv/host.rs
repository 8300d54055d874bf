//! The host kernel's part that matters to interrupt delivery: per-core
//! hrtimers on the LAPIC timer (the scheduler tick, KVM's emulated guest
//! timers, parked DID timers) and which core's LAPIC timer serves them.

use crate::engine::Time;

/// LOCAL_TIMER_VECTOR of the host.
pub const HOST_TIMER_VECTOR: u8 = 0xEF;
/// RESCHEDULE_VECTOR of the host (also KVM's vCPU kick).
pub const RESCHEDULE_VECTOR: u8 = 0xFD;
/// First host vector handed to assigned devices' MSI-X (one per VF).
pub const HOST_DEVICE_VECTOR_BASE: u8 = 0x61;

/// What a host hrtimer does when it expires.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HostTimer {
    /// Scheduler tick of `core`.
    Tick {
        /// The core the tick accounts for.
        core: usize,
    },
    /// KVM's emulation of a guest's LAPIC timer (`apic_timer_fn`), or a DID
    /// timer parked on the designated core.
    GuestTimer {
        /// vCPU.
        vcpu: usize,
        /// Generation of the guest timer it emulates.
        gen: u64,
    },
    /// A guest timer parked on the designated core while its vCPU is not
    /// loaded (DID §4.4): at expiry it becomes a virtual interrupt.
    ParkedTimer {
        /// vCPU.
        vcpu: usize,
        /// The guest's timer vector.
        vector: u8,
    },
}

/// Host hrtimer queues, one per core whose LAPIC timer serves them.
pub struct HostKernel {
    queues: Vec<Vec<(Time, HostTimer)>>,
    /// `serving[c]`: the core whose LAPIC timer carries core c's timers.
    pub serving: Vec<usize>,
    /// Deadline currently programmed on each core's LAPIC timer by the host.
    pub programmed: Vec<Option<Time>>,
    /// Scheduler tick period.
    pub tick_period: Time,
}

impl HostKernel {
    /// Each core serves its own timers.
    pub fn new(cores: usize, tick_period: Time) -> Self {
        HostKernel {
            queues: (0..cores).map(|_| Vec::with_capacity(8)).collect(),
            serving: (0..cores).collect(),
            programmed: vec![None; cores],
            tick_period,
        }
    }

    /// Arms `t` at `at` for `core`; returns the serving core.
    pub fn add(&mut self, core: usize, at: Time, t: HostTimer) -> usize {
        let s = self.serving[core];
        self.queues[s].push((at, t));
        s
    }

    /// Removes every timer matching `f`; returns the serving cores touched
    /// (as a bitmask of up to 64 cores).
    pub fn cancel(&mut self, mut f: impl FnMut(&HostTimer) -> bool) -> u64 {
        let mut touched = 0u64;
        for (s, q) in self.queues.iter_mut().enumerate() {
            let before = q.len();
            q.retain(|(_, t)| !f(t));
            if q.len() != before {
                touched |= 1 << s;
            }
        }
        touched
    }

    /// The deadline of the first timer matching `f`.
    pub fn find(&self, mut f: impl FnMut(&HostTimer) -> bool) -> Option<Time> {
        self.queues
            .iter()
            .flatten()
            .find(|(_, t)| f(t))
            .map(|x| x.0)
    }

    /// Moves core `from`'s timers to be served by `to`'s LAPIC timer.
    pub fn reassign(&mut self, from: usize, to: usize) {
        self.serving[from] = to;
        let moved: Vec<(Time, HostTimer)> = {
            let q = &mut self.queues[from];
            let (keep, mv): (Vec<_>, Vec<_>) = q.drain(..).partition(|(_, t)| !owned_by(t, from));
            *q = keep;
            mv
        };
        self.queues[to].extend(moved);
    }

    /// Pops one timer of serving core `s` due at `now`.
    pub fn pop_expired(&mut self, s: usize, now: Time) -> Option<HostTimer> {
        let q = &mut self.queues[s];
        let i = q.iter().position(|(at, _)| *at <= now)?;
        Some(q.swap_remove(i).1)
    }

    /// Earliest deadline on serving core `s`.
    pub fn next(&self, s: usize) -> Option<Time> {
        self.queues[s].iter().map(|x| x.0).min()
    }
}

fn owned_by(t: &HostTimer, core: usize) -> bool {
    matches!(t, HostTimer::Tick { core: c } if *c == core)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_expire_in_place_and_move_with_their_core() {
        let mut h = HostKernel::new(2, 1_000);
        h.add(1, 50, HostTimer::Tick { core: 1 });
        h.add(1, 80, HostTimer::GuestTimer { vcpu: 0, gen: 3 });
        assert_eq!(h.next(1), Some(50));
        h.reassign(1, 0);
        assert_eq!(h.next(0), Some(50), "the tick moved to the designated core");
        assert_eq!(h.next(1), Some(80), "a guest timer stays");
        assert_eq!(h.add(1, 10, HostTimer::Tick { core: 1 }), 0);
        assert_eq!(h.pop_expired(0, 60), Some(HostTimer::Tick { core: 1 }));
        assert_eq!(h.pop_expired(0, 60), Some(HostTimer::Tick { core: 1 }));
        assert_eq!(h.pop_expired(0, 60), None);
        assert_eq!(
            h.cancel(|t| matches!(t, HostTimer::GuestTimer { vcpu: 0, .. })),
            0b10
        );
        assert_eq!(h.find(|_| true), None);
    }
}
