//! The invariant checker. It watches every run through scheme-independent
//! observation points (a device firing, the guest's own timer programming,
//! the guest's IDT handler entry and its EOI) and records violations:
//! lost, misdelivered and out-of-priority-order interrupts, ISR/IRR
//! inconsistencies, and EOIs with nothing in service.

use crate::engine::{as_us, Time, US};
use crate::hw::x86::lapic::ApicBitmap;
use serde::Serialize;

/// Kinds of violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// Raised for a VM and never handled by it.
    Lost,
    /// Entered a VM's handler with no pending interrupt of that vector for it.
    Misdelivered,
    /// A handler started while a handler of equal or higher priority class
    /// was still running on the same vCPU (DID §2.7 Fig. 3b).
    PriorityInversion,
    /// The LAPIC state the guest depends on disagrees with what the guest has
    /// in service, or an EOI cleared another vector than the one completing.
    IsrInconsistent,
    /// An EOI reached a LAPIC whose ISR was empty (DID Fig. 3a).
    EoiWithoutInService,
    /// A GIC rule broken (ARM): a virtual interrupt left active in a list
    /// register when its vCPU was scheduled out, or a vCPU left blocked
    /// with an interrupt pending for it (a doorbell or kick that never
    /// woke it).
    GicState,
}

/// One recorded violation.
#[derive(Clone, Debug, Serialize)]
pub struct Violation {
    /// When, in µs of simulated time.
    pub time_us: f64,
    /// VM index.
    pub vm: usize,
    /// What broke.
    pub kind: ViolationKind,
    /// Vector concerned.
    pub vector: u8,
    /// Human-readable detail.
    pub detail: String,
    /// Where the trouble started, in ps: the raise (or timer deadline) of a
    /// lost interrupt, otherwise the violation's own time. Where a race
    /// explorer looks first.
    #[serde(skip)]
    pub origin: Time,
}

const STORED_MAX: usize = 64;

/// A bound for [`Checker::stranded_bound`] (`check.stranded_us = 200`):
/// far above any wake-up path the schemes have (an IPI's flight bound of
/// 2 µs, the exit that kicks, the GA-log interrupt: microseconds), and
/// below a guest tick at HZ=1000, so a wake-up that only the next tick
/// makes up for is caught. The default of `check.stranded_us`.
pub const STRANDED_BOUND: Time = 200 * US;

#[derive(Clone)]
struct VmTrack {
    pending: ApicBitmap,
    /// Whether the VM's vCPU is scheduled in (raises while it is not are
    /// timed separately).
    running: bool,
    /// Pending vectors raised while the vCPU was descheduled.
    raised_descheduled: ApicBitmap,
    first_raise: Box<[Time; 256]>,
    /// The owner's run clock at each pending vector's raise.
    clock_at_raise: Box<[Time; 256]>,
    /// Raises merged into a pending one, per vector: the hardware may
    /// still deliver them separately (a vector posted to the PIR while an
    /// earlier one waits in the vIRR, which is delivered before the PIR is
    /// synced), so a later delivery with nothing pending may consume one.
    spare: Box<[u8; 256]>,
    stack: Vec<u8>,
    /// (vector, deadline, run clock and time when it was programmed).
    timer: Option<(u8, Time, Time, Time)>,
    /// Run clock: time its owner was scheduled in (for a VM's device
    /// interrupts: time all its vCPUs were), up to `since`.
    clock: Time,
    /// Scheduled in since this time (None: out).
    since: Option<Time>,
    /// Halted, its thread asleep: it must be woken for a pending
    /// interrupt, so its clock runs.
    blocked: bool,
    /// When its vCPU was last scheduled in.
    scheduled_in: Time,
    /// Sleep clock: time its vCPU was blocked (halted, its thread asleep,
    /// not scheduled in), up to `asleep_since`.
    asleep: Time,
    /// Asleep since this time (None: awake).
    asleep_since: Option<Time>,
    /// The sleep clock at each pending vector's raise.
    asleep_at_raise: Box<[Time; 256]>,
}

impl VmTrack {
    fn new() -> Self {
        VmTrack {
            pending: ApicBitmap::default(),
            running: true,
            raised_descheduled: ApicBitmap::default(),
            first_raise: Box::new([0; 256]),
            clock_at_raise: Box::new([0; 256]),
            spare: Box::new([0; 256]),
            stack: Vec::with_capacity(16),
            timer: None,
            clock: 0,
            since: Some(0),
            blocked: false,
            scheduled_in: 0,
            asleep: 0,
            asleep_since: None,
            asleep_at_raise: Box::new([0; 256]),
        }
    }

    fn asleep_at(&self, now: Time) -> Time {
        self.asleep + self.asleep_since.map_or(0, |t| now.saturating_sub(t))
    }

    fn set_asleep(&mut self, on: bool, now: Time) {
        match (on, self.asleep_since) {
            (true, None) => self.asleep_since = Some(now),
            (false, Some(t)) => {
                self.asleep += now.saturating_sub(t);
                self.asleep_since = None;
            }
            _ => {}
        }
    }

    fn clock_at(&self, now: Time) -> Time {
        self.clock + self.since.map_or(0, |t| now.saturating_sub(t))
    }

    fn set_clock_running(&mut self, on: bool, now: Time) {
        match (on, self.since) {
            (true, None) => self.since = Some(now),
            (false, Some(t)) => {
                self.clock += now.saturating_sub(t);
                self.since = None;
            }
            _ => {}
        }
    }
}

/// Counters and stored violations of one run.
///
/// Per-CPU state (handlers in progress, the timer, per-CPU vectors such as
/// IPIs) is tracked per vCPU; device interrupts are owned by a VM and may
/// be handled by any of its vCPUs (the guest's MSI affinity, or the
/// hypervisor's lowest-priority arbitration, picks which).
pub struct Checker {
    /// Per vCPU.
    vms: Vec<VmTrack>,
    /// Per VM: device interrupts raised and not yet handled.
    devs: Vec<VmTrack>,
    /// vCPU → its VM.
    vm_of: Vec<usize>,
    /// VM → its vCPUs (the clocks of a VM look at these, not at every
    /// vCPU).
    vcpus_of: Vec<Vec<usize>>,
    stored: Vec<Violation>,
    counts: [u64; 6],
    /// Raises that merged with one already pending (edge semantics, DID §7.8).
    pub merged: u64,
    /// Interrupts delivered to their owner.
    pub delivered: u64,
    /// Timer interrupts delivered up to this much before their programmed
    /// deadline are accepted (counter quantisation when a timer is moved).
    pub early_tolerance: Time,
    /// Raise-to-handler delay of interrupts raised while their vCPU was
    /// descheduled (they wait for its next schedule-in).
    pub descheduled_delay: crate::engine::LatencyHistogram,
    /// Raise-to-handler delay of interrupts whose delivering vCPU was
    /// scheduled in after the raise: posted or queued to a vCPU that was
    /// out (or went out), they waited for that vCPU's schedule-in, however
    /// its siblings ran.
    pub waited_schedule_in: crate::engine::LatencyHistogram,
    /// An interrupt raised for one vCPU (an IPI, its timer) that was
    /// pending while that vCPU slept for longer than this in all was
    /// stranded: whoever raised it neither delivered it nor woke the vCPU,
    /// and it was taken only when something else woke it (a tick, another
    /// interrupt) — a lost wake-up even though the run later delivers it
    /// (erratum 1235: a sender that misses IsRunning cleared).
    pub stranded_bound: Time,
}

impl Checker {
    /// A checker for `vms` VMs.
    pub fn new(vms: usize) -> Self {
        Self::with_vcpus((0..vms).collect())
    }

    /// A checker for vCPUs whose VMs are `vm_of[vcpu]`. Every method but
    /// [`Checker::raised`] names a vCPU.
    pub fn with_vcpus(vm_of: Vec<usize>) -> Self {
        // stranded_bound: off (Time::MAX) unless the scenario sets it.
        let nvm = vm_of.iter().max().map_or(0, |m| m + 1);
        let mut vcpus_of = vec![Vec::new(); nvm];
        for (c, &vm) in vm_of.iter().enumerate() {
            vcpus_of[vm].push(c);
        }
        Checker {
            vcpus_of,
            vms: vec![VmTrack::new(); vm_of.len()],
            devs: vec![VmTrack::new(); nvm],
            vm_of,
            stored: Vec::new(),
            counts: [0; 6],
            merged: 0,
            delivered: 0,
            early_tolerance: US,
            descheduled_delay: crate::engine::LatencyHistogram::new(),
            waited_schedule_in: crate::engine::LatencyHistogram::new(),
            stranded_bound: Time::MAX,
        }
    }

    /// `vcpu` was scheduled in (`true`) or out.
    ///
    /// A pending interrupt is lost only once its owner has run for the
    /// grace time after its raise without taking it: a vCPU waiting in the
    /// host's run queue cannot take anything. A VM's device interrupts count
    /// only the time all its vCPUs ran (the checker does not know which
    /// vCPU a device interrupt is aimed at).
    pub fn set_running(&mut self, vcpu: usize, running: bool, now: Time) {
        if running && !self.vms[vcpu].running {
            self.vms[vcpu].scheduled_in = now;
        }
        self.vms[vcpu].running = running;
        self.update_clocks(vcpu, now);
    }

    /// `vcpu` halted and its thread sleeps (`true`), or was woken. A
    /// sleeping vCPU must be woken for an interrupt pending for it, so the
    /// time it sleeps counts against a lost interrupt; only time spent
    /// runnable in the host's run queue does not.
    pub fn set_blocked(&mut self, vcpu: usize, blocked: bool, now: Time) {
        self.vms[vcpu].blocked = blocked;
        self.update_clocks(vcpu, now);
    }

    fn update_clocks(&mut self, vcpu: usize, now: Time) {
        let t = &mut self.vms[vcpu];
        let on = t.running || t.blocked;
        t.set_clock_running(on, now);
        let asleep = t.blocked && !t.running;
        t.set_asleep(asleep, now);
        let vm = self.vm_of[vcpu];
        let mine = || self.vcpus_of[vm].iter().copied();
        let any = mine().any(|c| self.vms[c].running);
        let all = mine().all(|c| self.vms[c].running || self.vms[c].blocked);
        self.devs[vm].running = any;
        self.devs[vm].set_clock_running(all, now);
    }

    /// A GIC rule was broken on `vcpu` (`detail` says which).
    pub fn gic_violation(&mut self, vcpu: usize, vintid: u32, now: Time, detail: String) {
        let vm = self.vm_of[vcpu];
        self.violate(
            now,
            vm,
            ViolationKind::GicState,
            vintid.min(255) as u8,
            detail,
        );
    }

    /// The host scheduler holds `vcpu`'s thread asleep while the vCPU is
    /// not halted (it has work and would never run again): a lost wake-up,
    /// which loses whatever is pending for it. The interrupt clocks cannot
    /// see it (a vCPU waiting for its core does not age its interrupts), so
    /// the world checks the scheduler against the vCPUs at every tick.
    pub fn lost_wakeup(&mut self, vcpu: usize, now: Time) {
        let vm = self.vm_of[vcpu];
        self.violate(
            now,
            vm,
            ViolationKind::Lost,
            0,
            format!("vCPU {vcpu} is not halted but its thread sleeps in the host scheduler (lost wake-up)"),
        );
    }

    fn violate(&mut self, now: Time, vm: usize, kind: ViolationKind, vector: u8, detail: String) {
        self.violate_from(now, now, vm, kind, vector, detail);
    }

    fn violate_from(
        &mut self,
        now: Time,
        origin: Time,
        vm: usize,
        kind: ViolationKind,
        vector: u8,
        detail: String,
    ) {
        self.counts[kind as usize] += 1;
        if self.stored.len() < STORED_MAX {
            self.stored.push(Violation {
                time_us: as_us(now),
                vm,
                kind,
                vector,
                detail,
                origin,
            });
        }
    }

    fn raise(&mut self, vcpu: usize, vector: u8, at: Time) {
        Self::raise_in(&mut self.vms[vcpu], &mut self.merged, vector, at);
    }

    fn raise_in(t: &mut VmTrack, merged: &mut u64, vector: u8, at: Time) {
        if t.pending.test(vector) {
            *merged += 1;
            let s = &mut t.spare[vector as usize];
            *s = s.saturating_add(1);
        } else {
            t.pending.set(vector);
            t.first_raise[vector as usize] = at;
            t.clock_at_raise[vector as usize] = t.clock_at(at);
            t.asleep_at_raise[vector as usize] = t.asleep_at(at);
            if !t.running {
                t.raised_descheduled.set(vector);
            }
        }
    }

    /// A device interrupt owned by `vm` fired (observed at the device).
    pub fn raised(&mut self, vm: usize, vector: u8, now: Time) {
        Self::raise_in(&mut self.devs[vm], &mut self.merged, vector, now);
    }

    /// An interrupt for one vCPU (an IPI the guest sent) was raised.
    pub fn raised_on(&mut self, vcpu: usize, vector: u8, now: Time) {
        self.raise(vcpu, vector, now);
    }

    /// The guest of `vm` programmed its one-shot timer to raise `vector` at
    /// `deadline` (or stopped it with `None`). Reprogramming cancels an
    /// unexpired deadline; an expired one is already raised.
    pub fn timer_programmed(&mut self, vcpu: usize, vector: u8, deadline: Option<Time>, now: Time) {
        if let Some((v, d, _, _)) = self.vms[vcpu].timer.take() {
            if d <= now {
                self.raise(vcpu, v, d);
            }
        }
        let clock = self.vms[vcpu].clock_at(now);
        self.vms[vcpu].timer = deadline.map(|d| (vector, d, clock, now));
    }

    /// The guest of `vm` entered its IDT handler for `vector`.
    pub fn handler_entered(&mut self, vcpu: usize, vector: u8, now: Time) {
        // A due timer counts as raised.
        if let Some((v, d, _, _)) = self.vms[vcpu].timer {
            if v == vector && d <= now + self.early_tolerance {
                self.vms[vcpu].timer = None;
                self.raise(vcpu, v, d.min(now));
            }
        }
        let vm = self.vm_of[vcpu];
        // The vCPU's own interrupts first, then its VM's device interrupts,
        // then a merged raise delivered on its own.
        let spare = |t: &VmTrack| t.spare[vector as usize] > 0;
        if self.vms[vcpu].pending.test(vector) {
            self.check_stranded(vcpu, vector, now);
        }
        let t = if self.vms[vcpu].pending.test(vector) {
            &mut self.vms[vcpu]
        } else if self.devs[vm].pending.test(vector) {
            &mut self.devs[vm]
        } else if spare(&self.vms[vcpu]) {
            &mut self.vms[vcpu]
        } else {
            &mut self.devs[vm]
        };
        if !t.pending.test(vector) && t.spare[vector as usize] > 0 {
            t.spare[vector as usize] -= 1;
            self.delivered += 1;
        } else if t.pending.test(vector) {
            t.pending.clear(vector);
            self.delivered += 1;
            let raised = t.first_raise[vector as usize];
            if t.raised_descheduled.test(vector) {
                t.raised_descheduled.clear(vector);
                self.descheduled_delay.record(now.saturating_sub(raised));
            }
            if self.vms[vcpu].scheduled_in > raised {
                self.waited_schedule_in.record(now.saturating_sub(raised));
            }
        } else {
            self.violate(
                now,
                vm,
                ViolationKind::Misdelivered,
                vector,
                format!("vector {vector:#x} entered VM {vm} (vCPU {vcpu}) with no pending interrupt of that vector for it"),
            );
        }
        let t = &self.vms[vcpu];
        if let Some(&u) = t.stack.iter().find(|&&u| u >> 4 >= vector >> 4) {
            self.violate(
                now,
                vm,
                ViolationKind::PriorityInversion,
                vector,
                format!("vector {vector:#x} preempted the handler of higher-or-equal priority vector {u:#x}"),
            );
        }
        self.vms[vcpu].stack.push(vector);
    }

    /// `vector`, pending for `vcpu` and now taken: a violation if the vCPU
    /// slept longer than `stranded_bound` with it pending. A correct
    /// scheme wakes a blocked vCPU as soon as an interrupt is pending for
    /// it (kvm_vcpu_kick, the AVIC incomplete-IPI exit, the GA log, a GIC
    /// doorbell), so its sleep with the interrupt pending is the raise's
    /// flight and the wake-up path: microseconds.
    fn check_stranded(&mut self, vcpu: usize, vector: u8, now: Time) {
        let t = &self.vms[vcpu];
        let slept = t
            .asleep_at(now)
            .saturating_sub(t.asleep_at_raise[vector as usize]);
        if slept > self.stranded_bound {
            let raised = t.first_raise[vector as usize];
            let vm = self.vm_of[vcpu];
            self.violate_from(
                now,
                raised,
                vm,
                ViolationKind::Lost,
                vector,
                format!(
                    "raised for vCPU {vcpu} at {:.3} us and delivered only at {:.3} us: it slept {:.3} us with it pending and nobody woke it (stranded)",
                    as_us(raised),
                    as_us(now),
                    as_us(slept)
                ),
            );
        }
    }

    /// The handler for `vector` returned (iret).
    pub fn handler_returned(&mut self, vcpu: usize, vector: u8) {
        let s = &mut self.vms[vcpu].stack;
        if let Some(i) = s.iter().rposition(|&u| u == vector) {
            s.remove(i);
        }
    }

    /// The guest of `vm` wrote EOI to complete `expected`; the LAPIC that
    /// received the write (physical or emulated) cleared `cleared`.
    pub fn eoi(&mut self, vcpu: usize, expected: u8, cleared: Option<u8>, now: Time) {
        let vm = self.vm_of[vcpu];
        match cleared {
            None => self.violate(
                now,
                vm,
                ViolationKind::EoiWithoutInService,
                expected,
                format!("EOI for vector {expected:#x} reached a LAPIC with nothing in service"),
            ),
            Some(c) if c != expected => self.violate(
                now,
                vm,
                ViolationKind::IsrInconsistent,
                expected,
                format!("EOI completing vector {expected:#x} cleared in-service vector {c:#x}"),
            ),
            _ => {}
        }
    }

    /// At VM entry: the in-service set the guest believes in (delivered, not
    /// yet EOI'd) against the LAPIC state that will receive its EOIs.
    pub fn isr_at_entry(
        &mut self,
        vcpu: usize,
        guest_in_service: ApicBitmap,
        lapic_isr: ApicBitmap,
        now: Time,
    ) {
        let vm = self.vm_of[vcpu];
        if guest_in_service != lapic_isr {
            let v = lapic_isr
                .highest()
                .or(guest_in_service.highest())
                .unwrap_or(0);
            self.violate(
                now,
                vm,
                ViolationKind::IsrInconsistent,
                v,
                format!(
                    "at VM entry the guest has {:?} in service but its LAPIC ISR holds {:?}",
                    vectors(guest_in_service),
                    vectors(lapic_isr)
                ),
            );
        }
    }

    /// End of run: whatever was raised more than `grace` ago and never
    /// delivered is lost.
    pub fn finish(&mut self, now: Time, grace: Time) {
        for vcpu in 0..self.vms.len() {
            let vm = self.vm_of[vcpu];
            if let Some((v, d, clock0, t0)) = self.vms[vcpu].timer {
                // It ran at most d - t0 of the time between programming
                // and the deadline: what it ran after the deadline is at
                // least the rest.
                let ran_after = self.vms[vcpu]
                    .clock_at(now)
                    .saturating_sub(clock0 + d.saturating_sub(t0));
                if d + grace < now && ran_after > grace {
                    self.violate_from(
                        now,
                        d,
                        vm,
                        ViolationKind::Lost,
                        v,
                        format!(
                            "timer due at {:.3} us never delivered ({:.3} us of run time since)",
                            as_us(d),
                            as_us(ran_after)
                        ),
                    );
                }
            }
            self.lost_pending(vcpu, false, vm, now, grace);
        }
        for vm in 0..self.devs.len() {
            self.lost_pending(vm, true, vm, now, grace);
        }
    }

    fn lost_pending(&mut self, i: usize, dev: bool, vm: usize, now: Time, grace: Time) {
        let t = if dev { &self.devs[i] } else { &self.vms[i] };
        for v in vectors(t.pending) {
            let t = if dev { &self.devs[i] } else { &self.vms[i] };
            let r = t.first_raise[v as usize];
            let ran = t.clock_at(now).saturating_sub(t.clock_at_raise[v as usize]);
            if r + grace < now && ran > grace {
                self.violate_from(
                    now,
                    r,
                    vm,
                    ViolationKind::Lost,
                    v,
                    format!(
                        "raised at {:.3} us, never delivered ({:.3} us of run time since)",
                        as_us(r),
                        as_us(ran)
                    ),
                );
            }
        }
    }

    /// Total violations of each kind.
    pub fn count(&self, kind: ViolationKind) -> u64 {
        self.counts[kind as usize]
    }

    /// Total violations.
    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The first violations (up to 64).
    pub fn violations(&self) -> &[Violation] {
        &self.stored
    }
}

fn vectors(b: ApicBitmap) -> Vec<u8> {
    (0..=255u8).filter(|&v| b.test(v)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_sequence_has_no_violation() {
        let mut c = Checker::new(1);
        c.raised(0, 0x41, 10);
        c.handler_entered(0, 0x41, 20);
        c.eoi(0, 0x41, Some(0x41), 30);
        c.handler_returned(0, 0x41);
        c.finish(100 * crate::engine::MS, crate::engine::MS);
        assert_eq!(c.total(), 0);
        assert_eq!(c.delivered, 1);
    }

    #[test]
    fn an_ipi_left_pending_while_its_vcpu_sleeps_is_stranded() {
        let us = crate::engine::US;
        let mut c = Checker::with_vcpus(vec![0, 0]);
        c.stranded_bound = STRANDED_BOUND;
        // vCPU 1 halts and is put; an IPI raised for it wakes it at once.
        c.set_running(1, false, 0);
        c.set_blocked(1, true, 0);
        c.raised_on(1, 0xfd, 10 * us);
        c.set_blocked(1, false, 12 * us);
        c.set_running(1, true, 15 * us);
        c.handler_entered(1, 0xfd, 16 * us);
        assert_eq!(c.total(), 0);
        // Asleep again; this IPI wakes nobody and is taken only after the
        // tick woke it 900 us later.
        c.handler_returned(1, 0xfd);
        c.set_running(1, false, 20 * us);
        c.set_blocked(1, true, 20 * us);
        c.raised_on(1, 0xfd, 100 * us);
        c.set_blocked(1, false, 1000 * us);
        c.set_running(1, true, 1000 * us);
        c.handler_entered(1, 0xfd, 1001 * us);
        assert_eq!(c.count(ViolationKind::Lost), 1);
        assert!(c.violations()[0].detail.contains("stranded"));
        // Time runnable in the run queue is not sleep: no violation.
        c.handler_returned(1, 0xfd);
        c.set_running(1, false, 1100 * us);
        c.raised_on(1, 0xfd, 1100 * us);
        c.set_running(1, true, 3000 * us);
        c.handler_entered(1, 0xfd, 3001 * us);
        assert_eq!(c.count(ViolationKind::Lost), 1);
    }

    #[test]
    fn detects_each_kind() {
        let mut c = Checker::new(2);
        // misdelivery: VM 1 gets a vector only VM 0 owns
        c.raised(0, 0x41, 0);
        c.handler_entered(1, 0x41, 5);
        assert_eq!(c.count(ViolationKind::Misdelivered), 1);
        // EOI with nothing in service, and wrong vector cleared
        c.eoi(1, 0x41, None, 6);
        c.eoi(1, 0x41, Some(0x51), 7);
        assert_eq!(c.count(ViolationKind::EoiWithoutInService), 1);
        assert_eq!(c.count(ViolationKind::IsrInconsistent), 1);
        // priority inversion: 0x31 starts inside 0x51's handler
        c.raised(1, 0x51, 8);
        c.raised(1, 0x31, 8);
        c.handler_entered(1, 0x51, 9);
        c.handler_entered(1, 0x31, 10);
        assert_eq!(c.count(ViolationKind::PriorityInversion), 1);
        // lost: VM 0's 0x41 was never delivered to it
        c.finish(10 * crate::engine::MS, crate::engine::MS);
        assert_eq!(c.count(ViolationKind::Lost), 1);
    }

    #[test]
    fn an_interrupt_waiting_for_a_descheduled_vcpu_is_not_lost_until_it_runs() {
        use crate::engine::MS;
        let mut c = Checker::with_vcpus(vec![0, 0]);
        // vCPU 1 is descheduled at 1 ms; its IPI is raised at 2 ms.
        c.set_running(1, false, MS);
        c.raised_on(1, 0xfd, 2 * MS);
        c.finish(30 * MS, 10 * MS);
        assert_eq!(c.total(), 0, "it never ran: waiting, not lost");
        // Back in at 30 ms and runs 11 ms without taking it: lost.
        c.set_running(1, true, 30 * MS);
        c.finish(41 * MS, 10 * MS);
        assert_eq!(c.count(ViolationKind::Lost), 1);
    }

    /// A device interrupt of a VM taken by a vCPU that was out when it was
    /// raised waited for that vCPU's schedule-in, even while a sibling ran
    /// (the per-VM `descheduled_delay` does not see it); one taken by a
    /// vCPU that ran all along did not wait.
    #[test]
    fn an_interrupt_taken_after_its_vcpus_schedule_in_counts_as_waiting_for_it() {
        use crate::engine::MS;
        let mut c = Checker::with_vcpus(vec![0, 0]);
        c.set_running(1, false, MS);
        c.raised(0, 0x51, 2 * MS);
        c.set_running(1, true, 5 * MS);
        c.handler_entered(1, 0x51, 5 * MS + 1);
        c.handler_returned(1, 0x51);
        assert_eq!(c.waited_schedule_in.count(), 1);
        assert_eq!(c.waited_schedule_in.max(), 3 * MS + 1);
        assert_eq!(
            c.descheduled_delay.count(),
            0,
            "vCPU 0 ran: the VM was never all out"
        );
        c.raised(0, 0x51, 6 * MS);
        c.handler_entered(0, 0x51, 6 * MS + 5);
        c.handler_returned(0, 0x51);
        assert_eq!(c.waited_schedule_in.count(), 1, "vCPU 0 never left");
        assert_eq!(c.total(), 0);
    }

    #[test]
    fn an_interrupt_for_a_halted_vcpu_that_is_never_woken_is_lost() {
        use crate::engine::MS;
        let mut c = Checker::new(1);
        c.set_running(0, false, MS);
        c.set_blocked(0, true, MS);
        c.timer_programmed(0, 0xef, Some(2 * MS), MS);
        c.finish(30 * MS, 10 * MS);
        assert_eq!(c.count(ViolationKind::Lost), 1);
    }

    #[test]
    fn a_merged_raise_may_still_be_delivered_on_its_own_but_only_once() {
        let mut c = Checker::new(1);
        c.raised_on(0, 0xfd, 0);
        c.raised_on(0, 0xfd, 1); // merged: the checker keeps one pending
        c.handler_entered(0, 0xfd, 2);
        c.handler_returned(0, 0xfd);
        // The hardware kept them apart (PIR vs vIRR): a second delivery.
        c.handler_entered(0, 0xfd, 3);
        c.handler_returned(0, 0xfd);
        assert_eq!(c.total(), 0);
        // A third, never raised, is misdelivered.
        c.handler_entered(0, 0xfd, 4);
        assert_eq!(c.count(ViolationKind::Misdelivered), 1);
    }

    #[test]
    fn per_cpu_vectors_must_enter_their_own_vcpu() {
        let mut c = Checker::with_vcpus(vec![0, 0]);
        c.raised_on(0, 0xfd, 0);
        c.handler_entered(1, 0xfd, 5);
        assert_eq!(c.count(ViolationKind::Misdelivered), 1);
        // A device interrupt of the VM may enter any of its vCPUs.
        c.raised(0, 0x41, 6);
        c.handler_entered(1, 0x41, 7);
        assert_eq!(c.count(ViolationKind::Misdelivered), 1);
    }

    #[test]
    fn timer_deadlines_raise_and_reprogramming_cancels() {
        let mut c = Checker::new(1);
        c.timer_programmed(0, 0xef, Some(100 * US), 0);
        c.timer_programmed(0, 0xef, Some(200 * US), 50 * US); // cancelled before due
        c.handler_entered(0, 0xef, 200 * US);
        assert_eq!(c.total(), 0);
        c.timer_programmed(0, 0xef, Some(300 * US), 250 * US);
        c.finish(400 * US, 10 * US);
        assert_eq!(c.count(ViolationKind::Lost), 1);
    }
}
