//! The host kernel's part that matters to interrupt delivery: per-core
//! hrtimers on the LAPIC timer (the scheduler tick, KVM's emulated guest
//! timers, parked DID timers) and which core's LAPIC timer serves them.

use crate::engine::{CpuMask, Time};
use crate::hw::x86::lapic::ApicBitmap;

/// LOCAL_TIMER_VECTOR of the host.
pub const HOST_TIMER_VECTOR: u8 = 0xEF;
/// RESCHEDULE_VECTOR of the host (also KVM's vCPU kick).
pub const RESCHEDULE_VECTOR: u8 = 0xFD;
/// CALL_FUNCTION_SINGLE_VECTOR of the host: `smp_call_function_single`
/// (KVM's `loaded_vmcs_clear` when a vCPU moves to another core).
pub const CALL_FUNCTION_SINGLE_VECTOR: u8 = 0xFB;
/// First host vector handed to assigned devices' MSI-X (one per VF).
pub const HOST_DEVICE_VECTOR_BASE: u8 = 0x61;

/// The host's own NIC queue vector (the vCanal service host's ixgbe):
/// above the assigned devices' range, below the host's own vectors.
pub const HOST_NIC_VECTOR: u8 = 0xE0;

/// Host vectors for assigned devices: 0x61 up to 0xDF, below the host's
/// own (0xEF and up). Further VFs share them round-robin.
pub const HOST_DEVICE_VECTORS: usize = 0xE0 - HOST_DEVICE_VECTOR_BASE as usize;

/// The host vector of VF `i`'s MSI-X.
pub fn host_device_vector(i: usize) -> u8 {
    HOST_DEVICE_VECTOR_BASE + (i % HOST_DEVICE_VECTORS) as u8
}

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
    /// Per vCPU: the serving cores whose queues may hold its timers (every
    /// one that does, and maybe some that no longer do), so cancelling a
    /// vCPU's timer looks at those queues, not at every core's.
    vcpu_queues: Vec<CpuMask>,
}

impl HostKernel {
    /// Each core serves its own timers.
    pub fn new(cores: usize, tick_period: Time) -> Self {
        HostKernel {
            queues: (0..cores).map(|_| Vec::with_capacity(8)).collect(),
            serving: (0..cores).collect(),
            programmed: vec![None; cores],
            tick_period,
            vcpu_queues: Vec::new(),
        }
    }

    /// Room for the timers of `vcpus` vCPUs, so arming one never allocates.
    pub fn with_vcpus(mut self, vcpus: usize) -> Self {
        self.vcpu_queues = vec![CpuMask::EMPTY; vcpus];
        self
    }

    /// Arms `t` at `at` for `core`; returns the serving core.
    pub fn add(&mut self, core: usize, at: Time, t: HostTimer) -> usize {
        let s = self.serving[core];
        self.queues[s].push((at, t));
        if let Some(v) = vcpu_of(&t) {
            if v >= self.vcpu_queues.len() {
                self.vcpu_queues.resize(v + 1, CpuMask::EMPTY);
            }
            self.vcpu_queues[v].insert(s);
        }
        s
    }

    /// [`Self::cancel`] for a `f` that matches only timers of `vcpu`: the
    /// same timers removed, the same cores returned, looking only at the
    /// queues that may hold that vCPU's timers.
    pub fn cancel_of(&mut self, vcpu: usize, mut f: impl FnMut(&HostTimer) -> bool) -> CpuMask {
        let Some(&mask) = self.vcpu_queues.get(vcpu) else {
            return CpuMask::EMPTY;
        };
        let mut touched = CpuMask::EMPTY;
        for s in mask.iter() {
            let q = &mut self.queues[s];
            let before = q.len();
            q.retain(|(_, t)| !f(t));
            if q.len() != before {
                touched.insert(s);
            }
            if !q.iter().any(|(_, t)| vcpu_of(t) == Some(vcpu)) {
                self.vcpu_queues[vcpu].remove(s);
            }
        }
        touched
    }

    /// Removes the first timer matching `f`: (its serving core, deadline,
    /// timer).
    pub fn take_first(
        &mut self,
        mut f: impl FnMut(&HostTimer) -> bool,
    ) -> Option<(usize, Time, HostTimer)> {
        for (s, q) in self.queues.iter_mut().enumerate() {
            if let Some(i) = q.iter().position(|(_, t)| f(t)) {
                let (at, t) = q.swap_remove(i);
                return Some((s, at, t));
            }
        }
        None
    }

    /// Removes the first timer matching `f` from serving core `s`'s queue:
    /// (deadline, timer).
    pub fn take_first_on(
        &mut self,
        s: usize,
        mut f: impl FnMut(&HostTimer) -> bool,
    ) -> Option<(Time, HostTimer)> {
        let q = &mut self.queues[s];
        let i = q.iter().position(|(_, t)| f(t))?;
        Some(q.swap_remove(i))
    }

    /// Removes every timer matching `f`; returns the serving cores touched.
    pub fn cancel(&mut self, mut f: impl FnMut(&HostTimer) -> bool) -> CpuMask {
        let mut touched = CpuMask::EMPTY;
        for (s, q) in self.queues.iter_mut().enumerate() {
            let before = q.len();
            q.retain(|(_, t)| !f(t));
            if q.len() != before {
                touched.insert(s);
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

/// The vCPU a timer belongs to (none for a scheduler tick).
fn vcpu_of(t: &HostTimer) -> Option<usize> {
    match *t {
        HostTimer::Tick { .. } => None,
        HostTimer::GuestTimer { vcpu, .. } | HostTimer::ParkedTimer { vcpu, .. } => Some(vcpu),
    }
}

fn owned_by(t: &HostTimer, core: usize) -> bool {
    matches!(t, HostTimer::Tick { core: c } if *c == core)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelling_a_vcpus_timers_looks_only_where_they_may_be_and_matches_a_full_search() {
        let build = || {
            let mut h = HostKernel::new(4, 1_000).with_vcpus(3);
            for c in 0..4 {
                h.add(c, 10 + c as Time, HostTimer::Tick { core: c });
            }
            h.add(1, 50, HostTimer::GuestTimer { vcpu: 1, gen: 1 });
            h.add(
                3,
                60,
                HostTimer::ParkedTimer {
                    vcpu: 1,
                    vector: 0xef,
                },
            );
            h.add(2, 70, HostTimer::GuestTimer { vcpu: 2, gen: 1 });
            // Core 1's timers now go to core 0: vCPU 1's next one too.
            h.reassign(1, 0);
            h.add(1, 80, HostTimer::GuestTimer { vcpu: 1, gen: 2 });
            h
        };
        let guest1 = |t: &HostTimer| matches!(t, HostTimer::GuestTimer { vcpu: 1, .. });
        let (mut a, mut b) = (build(), build());
        assert_eq!(a.cancel_of(1, guest1), b.cancel(guest1));
        assert_eq!(a.cancel_of(1, guest1), CpuMask::EMPTY);
        for s in 0..4 {
            assert_eq!(a.next(s), b.next(s));
        }
        // The parked timer stayed, and is still cancelled where it is.
        let parked1 = |t: &HostTimer| matches!(t, HostTimer::ParkedTimer { vcpu: 1, .. });
        assert_eq!(a.find(parked1), Some(60));
        assert_eq!(a.cancel_of(1, parked1), CpuMask::single(3));
        assert_eq!(a.find(parked1), None);
    }

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
            CpuMask::single(1)
        );
        assert_eq!(h.find(|_| true), None);
    }
}

/// Host vectors sent to cores as NMIs. An NMI carries no vector (it is
/// always vector 2), so the sender leaves the vector in the target core's
/// mailbox first (DID §4.5 with docs/papers.md DID open point 3's default; ELI's protection 3
/// with docs/papers.md ELI open point 5's). NMIs coalesce in one latch: the handler runs every
/// vector it finds.
#[derive(Clone, Debug, Default)]
pub struct NmiMailbox {
    per_core: Vec<Vec<u8>>,
    /// NMIs sent.
    pub sent: u64,
}

impl NmiMailbox {
    /// Room for `cores` cores.
    pub fn resize(&mut self, cores: usize) {
        self.per_core.resize(cores, Vec::new());
    }

    /// Leaves `vector` for core `to` and sends it an NMI from `from`.
    pub fn post(&mut self, cx: &mut super::HvCx, from: usize, to: usize, vector: u8) {
        self.sent += 1;
        self.per_core[to].push(vector);
        cx.send_ipi(from, to, 2, crate::hw::x86::lapic::DeliveryMode::Nmi);
    }

    /// A host IPI: through the mailbox as an NMI when `as_nmi`, else a
    /// fixed IPI with its vector.
    pub fn send(&mut self, cx: &mut super::HvCx, from: usize, to: usize, vector: u8, as_nmi: bool) {
        if as_nmi {
            self.post(cx, from, to, vector);
        } else {
            cx.send_ipi(from, to, vector, crate::hw::x86::lapic::DeliveryMode::Fixed);
        }
    }

    /// Takes core `core`'s vectors for its NMI handler; give the buffer
    /// back with [`give_back`](Self::give_back) so it is reused.
    pub fn take(&mut self, core: usize) -> Vec<u8> {
        std::mem::take(&mut self.per_core[core])
    }

    /// Returns a taken buffer, emptied.
    pub fn give_back(&mut self, core: usize, mut v: Vec<u8>) {
        v.clear();
        self.per_core[core] = v;
    }
}

/// Fixed IPIs a scheme sent to a core to deliver a running vCPU's virtual
/// interrupt directly (DID §4.3, ELVIS's PV interrupts), per core, newest
/// last. Guest vectors are not unique across VMs, so a vector still in
/// flight when its vCPU is switched out must not enter the next VM on that
/// core (docs/papers.md DID open point 1): that VM's entry waits until the
/// IPI has surely landed ([`InFlightIpis::quiesce`]), in host mode, where
/// the scheme hands it to its vCPU ([`InFlightIpis::landed_for`]).
///
/// "Surely landed" is the hardware's delivery bound
/// (`host.ipi_latency_max_us`): x2APIC gives the sender no acknowledgement
/// to observe, so the quiesce rests on that bound, and the race explorer
/// perturbs IPIs within it (docs/correctness.md).
#[derive(Clone, Debug, Default)]
pub struct InFlightIpis {
    per_core: Vec<Vec<InFlight>>,
}

#[derive(Clone, Copy, Debug)]
struct InFlight {
    /// The earliest it can land (the nominal latency after its send).
    earliest: Time,
    /// The latest it can land (the delivery bound after its send).
    latest: Time,
    vector: u8,
    vcpu: usize,
}

/// How long a sent IPI is remembered: far longer than any stretch a core
/// spends with host interrupts off, so an IPI that landed in host mode is
/// still known when the host takes it.
const IN_FLIGHT_MEMORY: Time = crate::engine::MS;

impl InFlightIpis {
    /// Room for `cores` cores.
    pub fn resize(&mut self, cores: usize) {
        self.per_core.resize_with(cores, || Vec::with_capacity(32));
    }

    /// An IPI with `vector` for `vcpu` was sent to `core` now, with the
    /// platform's IPI `timing`.
    pub fn sent(
        &mut self,
        core: usize,
        now: Time,
        timing: super::IpiTiming,
        vector: u8,
        vcpu: usize,
    ) {
        let list = &mut self.per_core[core];
        list.retain(|f| f.latest + IN_FLIGHT_MEMORY > now);
        list.push(InFlight {
            earliest: now + timing.latency,
            latest: now + timing.max,
            vector,
            vcpu,
        });
    }

    /// The vCPU an IPI sent to `core` with `vector`, which could have
    /// landed by `now`, was for (the newest such, forgotten once asked).
    /// Newest first is unambiguous: another vCPU's IPIs to this core are
    /// sent only while it runs here, which is after every older one's
    /// bound (the quiesce).
    pub fn landed_for(&mut self, core: usize, vector: u8, now: Time) -> Option<usize> {
        let list = self.per_core.get_mut(core)?;
        let i = list
            .iter()
            .rposition(|f| f.vector == vector && f.earliest <= now)?;
        Some(list.remove(i).vcpu)
    }

    /// `vcpu` leaves `core`: the IPIs for it past their bound have landed,
    /// and were delivered or collected; those that may still be in flight
    /// stay its.
    pub fn forget_landed(&mut self, core: usize, vcpu: usize, now: Time) {
        if let Some(list) = self.per_core.get_mut(core) {
            list.retain(|f| !(f.vcpu == vcpu && f.latest < now));
        }
    }

    /// The IPIs to `core` past their bound whose vector is not latched in
    /// the core's `irr` have landed and been consumed: delivered in guest
    /// mode, or taken in host mode (which forgot them already). The host
    /// can tell only by the bound, so it drops them at points where the
    /// core is in host mode with its IRR in hand (a schedule-in, an
    /// entry). Kept, such a record would claim a later interrupt with the
    /// same vector for another VM (vectors are per VM).
    pub fn forget_consumed(&mut self, core: usize, now: Time, irr: &ApicBitmap) {
        if let Some(list) = self.per_core.get_mut(core) {
            list.retain(|f| f.latest >= now || irr.test(f.vector));
        }
    }

    /// How much longer `vcpu`'s entry on `core` must wait for IPIs that
    /// may still be in flight there for other vCPUs to land: until just
    /// after the latest bound (an IPI landing exactly at its bound and the
    /// entry at the same instant would be a race).
    pub fn quiesce(&self, core: usize, vcpu: usize, now: Time) -> Time {
        self.per_core
            .get(core)
            .into_iter()
            .flatten()
            .filter(|f| f.vcpu != vcpu && f.latest >= now)
            .map(|f| f.latest - now + 1)
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod in_flight_tests {
    use super::InFlightIpis;
    use crate::hv::IpiTiming;

    #[test]
    fn a_record_past_its_bound_is_consumed_unless_irr_holds_it() {
        let timing = IpiTiming {
            latency: 500,
            max: 3_500,
        };
        let mut f = InFlightIpis::default();
        f.resize(2);
        f.sent(1, 0, timing, 0x51, 7);
        f.sent(1, 0, timing, 0x52, 7);
        let mut irr = crate::hw::x86::lapic::ApicBitmap::default();
        irr.set(0x52);
        // Within the bound both may still be in flight.
        f.forget_consumed(1, 3_500, &irr);
        assert_eq!(f.landed_for(1, 0x51, 3_500), Some(7));
        f.sent(1, 0, timing, 0x51, 7);
        // Past it: 0x51 landed and was consumed; 0x52 is latched in IRR
        // and still the vCPU's when the host takes it.
        f.forget_consumed(1, 3_501, &irr);
        assert_eq!(f.landed_for(1, 0x51, 3_501), None);
        assert_eq!(f.landed_for(1, 0x52, 3_501), Some(7));
    }

    #[test]
    fn another_vcpu_enters_only_after_the_delivery_bound() {
        let timing = IpiTiming {
            latency: 500,
            max: 3_500,
        };
        let mut f = InFlightIpis::default();
        f.resize(2);
        // An IPI for vCPU 0 sent to core 1 at t=100.
        f.sent(1, 100, timing, 0xfd, 0);
        // vCPU 0 leaves at 700 (its nominal landing passed): the IPI may
        // still be in flight, so it stays vCPU 0's ...
        f.forget_landed(1, 0, 700);
        // ... and vCPU 1 waits until just past the bound (3,600), not the
        // nominal landing (600): an IPI arriving at its bound and an entry
        // at the same instant would race.
        assert_eq!(f.quiesce(1, 1, 700), 3_600 - 700 + 1);
        assert_eq!(f.quiesce(1, 1, 3_600), 1);
        assert_eq!(f.quiesce(1, 1, 3_601), 0);
        // vCPU 0 itself never waits for its own IPIs.
        assert_eq!(f.quiesce(1, 0, 700), 0);
        // Landing in host mode at 2,000 (late, within the bound): it is
        // found for vCPU 0; before its earliest landing it could not be.
        assert_eq!(f.landed_for(1, 0xfd, 550), None);
        assert_eq!(f.landed_for(1, 0xfd, 2_000), Some(0));
        assert_eq!(f.quiesce(1, 1, 2_000), 0);
    }
}

#[cfg(test)]
mod mailbox_tests {
    use super::NmiMailbox;

    #[test]
    fn taken_vectors_come_out_in_order_and_the_buffer_is_reused() {
        let mut m = NmiMailbox::default();
        m.resize(2);
        m.per_core[1].extend([0xFD, 0xEF]);
        let v = m.take(1);
        assert_eq!(v, [0xFD, 0xEF]);
        assert!(m.take(1).is_empty());
        let cap = v.capacity();
        m.give_back(1, v);
        let again = m.take(1);
        assert!(again.is_empty());
        assert_eq!(again.capacity(), cap);
    }
}
