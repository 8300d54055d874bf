//! The x86 virtualization extension (VT-x) on the platform: what the core
//! does in VMX non-root mode about pending interrupts (the VMCS-driven
//! decision between a VM exit, posted-interrupt processing, virtual-
//! interrupt delivery and delivery through the guest IDT), how a guest
//! instruction executes (WRMSR / APIC-page stores the VMCS virtualizes or
//! traps, OUT, MMIO to a VF), and the exit -> handler -> entry path with
//! its costs. The generic world calls these through `world::arch`; an ARM
//! EL2 sibling (HCR_EL2 traps, the GIC's virtual CPU interface, list
//! registers) would stand beside this file.

use super::arch::{ArchExit, OpResult};
use super::event::{schedule_apic_effect, Ev};
use super::{ExitState, Stage, World, EMULATED_DEVICE_PORT};
use crate::engine::{from_s, Time, SEC};
use crate::guest::{Clockevent, KernelOp};
use crate::hv::exits::{EventClass, ExitInfo};
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::idt::NP_VECTOR;
use crate::hw::x86::instr::Instr;
use crate::hw::x86::lapic::{decode_icr, msr, DeliveryMode, Ipi, IpiDest};
use crate::hw::x86::vmcs::{ApicMmioOutcome, WrmsrOutcome};
use crate::report::trace::TraceKind;

/// The guest's clockevent is the LAPIC timer in one-shot mode (the guest
/// uses TMICT, lapic=notscdeadline) at divide-by-16: a tick is 16 bus
/// periods; Linux's `min_delta` for it is 0xF ticks; its setup writes the
/// LVT timer entry, then TDCR.
pub(super) fn lapic_clockevent(apic_timer_period: Time) -> Clockevent {
    Clockevent {
        tick: apic_timer_period,
        min_delta_ticks: 0xF,
        init_steps: 2,
    }
}

/// Linux's `TSC_DIVISOR` (arch/x86/kernel/apic/apic.c): the TSC-deadline
/// clockevent counts in units of 8 TSC cycles.
const TSC_DIVISOR: u128 = 8;

/// The guest's clockevent in TSC-deadline mode (`guest.lapic_timer =
/// "tsc-deadline"`): a tick of 8 TSC cycles, `min_delta` 0xF ticks, and a
/// setup of one write (the LVT timer entry in TSC-deadline mode; no
/// divider).
pub(super) fn tsc_deadline_clockevent(tsc_hz: u64) -> Clockevent {
    Clockevent {
        tick: ((TSC_DIVISOR * SEC as u128) / u128::from(tsc_hz.max(1))).max(1) as Time,
        min_delta_ticks: 0xF,
        init_steps: 1,
    }
}

/// LVT timer mode bits 18:17 = 10b: TSC-deadline (SDM 10.5.1).
const LVTT_TSC_DEADLINE: u64 = 0b10 << 17;

/// The TSC value at `t` on a clock of `tsc_hz` (the guest's TSC: offset 0,
/// no scaling).
fn tsc_at(t: Time, tsc_hz: u64) -> u64 {
    (u128::from(t) * u128::from(tsc_hz) / SEC as u128) as u64
}

/// The x86 instruction a kernel operation is. `tsc_deadline`: the
/// guest's clockevent is the TSC-deadline timer, on a TSC of this
/// frequency (None: one-shot TMICT).
pub(super) fn lower(op: KernelOp, tsc_deadline: Option<u64>) -> Instr {
    match op {
        KernelOp::EndOfInterrupt { vector } => Instr::Eoi { vector },
        KernelOp::ProgramClockevent {
            ticks,
            deadline,
            vector,
        } => match tsc_deadline {
            // lapic_next_deadline: WRMSR IA32_TSC_DEADLINE, rdtsc() +
            // delta * TSC_DIVISOR (the deadline the guest computed).
            Some(hz) => Instr::ArmTimer {
                msr: msr::TSC_DEADLINE,
                value: deadline.map_or(0, |d| tsc_at(d, hz)),
                deadline,
                vector,
            },
            None => Instr::ArmTimer {
                msr: msr::TMICT,
                value: u64::from(ticks),
                deadline,
                vector,
            },
        },
        // LVTT: one-shot (or TSC-deadline) mode on the vector.
        KernelOp::ClockeventInit { step: 0, vector } => Instr::WrMsr {
            msr: msr::LVT_TIMER,
            value: vector as u64 | tsc_deadline.map_or(0, |_| LVTT_TSC_DEADLINE),
        },
        // TDCR: divide by 16.
        KernelOp::ClockeventInit { .. } => Instr::WrMsr {
            msr: msr::TDCR,
            value: 0b0011,
        },
        // A fixed IPI through the x2APIC ICR to the CPU's APIC ID (the
        // guest numbers them 0..n).
        KernelOp::SendIpi { cpu, vector } => Instr::WrMsr {
            msr: msr::ICR,
            value: ((cpu as u64) << 32) | vector as u64,
        },
        KernelOp::SelfIpi { vector } => Instr::WrMsr {
            msr: msr::SELF_IPI,
            value: u64::from(vector),
        },
        KernelOp::TaskPriority { value } => Instr::WrMsr {
            msr: msr::TPR,
            value: u64::from(value),
        },
        KernelOp::QueueNotify { port, value } => Instr::PioWrite { port, value },
        KernelOp::VfWrite { vf, reg } => Instr::VfWrite { vf, reg },
        KernelOp::Idle => Instr::Hlt,
        KernelOp::Hypercall { nr, arg } => Instr::Vmcall { nr, arg },
        KernelOp::PirSet { cpu, vector } => Instr::PirSet { cpu, vector },
        KernelOp::PostedIpi { cpu, vector } => Instr::PostedIpi { cpu, vector },
    }
}

impl World {
    /// The guest on `core` (kernel CPU of `vcpu`) asks for `op`: its x86
    /// instruction executes.
    pub(super) fn vmx_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        let tsc_deadline = (self.scenario.guest.lapic_timer
            == crate::scenario::LapicTimer::TscDeadline)
            .then_some(self.tsc_hz);
        match lower(op, tsc_deadline) {
            // sti; hlt: in guest mode with HLT exiting it exits; otherwise
            // the core waits for an interrupt.
            Instr::Hlt => match self.m.cores[core].mode {
                CoreMode::Guest { vcpu } if self.m.vmcs[vcpu].proc.hlt_exiting => {
                    OpResult::Exit(ArchExit::Vmx(ExitInfo::Hlt), None)
                }
                _ => OpResult::Wait,
            },
            i => match self.execute(core, vcpu, i) {
                Some((info, eoi)) => OpResult::Exit(ArchExit::Vmx(info), eoi),
                None => OpResult::Continue,
            },
        }
    }

    /// VM entry with the "activate VMX-preemption timer" control set: the
    /// timer starts from the VMCS value and counts down at TSC >> rate.
    pub(super) fn arm_preemption_timer(&mut self, core: usize, vcpu: usize) {
        let vmcs = &self.m.vmcs[vcpu];
        if !vmcs.pin.preemption_timer {
            return;
        }
        let ticks =
            (vmcs.preemption_timer_value as u128) << crate::hw::x86::vmcs::PREEMPTION_TIMER_RATE;
        let ps = (ticks * SEC as u128 / self.tsc_hz.max(1) as u128) as Time;
        self.ptimer_gen[core] += 1;
        let gen = self.ptimer_gen[core];
        self.q.schedule_in(
            ps,
            Ev::PreemptionTimer {
                core: core as u16,
                gen,
            },
        );
    }

    /// What the core must do now about pending events, in guest mode: an
    /// exit, a delivery through the guest IDT, or nothing.
    /// `(k, c)`: the kernel and CPU `core` runs ([`World::kcpu`] of
    /// [`World::kernel_of`]).
    ///
    /// It runs before every guest step, and mostly finds nothing: a guest
    /// core with no emulated-device work, no NMI latched and an empty IRR
    /// (so nothing deliverable) only has virtual-interrupt delivery and
    /// interrupt-window exiting left to look at, which this does here in
    /// the order [`Self::interrupt_decision_full`] does; anything else
    /// goes there. Always inlined into the guest's step loop, where its
    /// lookups join the loop's own.
    #[inline(always)]
    pub(super) fn interrupt_decision(
        &mut self,
        core: usize,
        k: usize,
        c: usize,
    ) -> Option<Result<ExitInfo, u8>> {
        if let CoreMode::Guest { vcpu } = self.m.cores[core].mode {
            let lapic = &self.m.lapics[core];
            if self.bg_pending[vcpu] == 0 && !lapic.nmi_pending() && lapic.irr.is_empty() {
                let vmcs = &self.m.vmcs[vcpu];
                let vid = vmcs.proc2.virtual_interrupt_delivery;
                let window = vmcs.proc.interrupt_window_exiting;
                if !(vid || window) || !self.guests[k].interrupts_enabled(c) {
                    return None;
                }
                if vid {
                    // Virtual-interrupt delivery (SDM 29.2): RVI above VPPR.
                    if let Some(v) = self.m.vapic[vcpu].deliver() {
                        return Some(self.through_idt(vcpu, v));
                    }
                }
                return window.then_some(Ok(ExitInfo::PendingInterrupt));
            }
        }
        self.interrupt_decision_full(core, k, c)
    }

    /// [`Self::interrupt_decision`] in full.
    #[inline(never)]
    fn interrupt_decision_full(
        &mut self,
        core: usize,
        k: usize,
        c: usize,
    ) -> Option<Result<ExitInfo, u8>> {
        let mode = self.m.cores[core].mode;
        debug_assert_eq!((k, c), self.kcpu(self.kernel_of(core)));
        let if_on = self.guests[k].interrupts_enabled(c);
        let lapic = &mut self.m.lapics[core];
        match mode {
            CoreMode::Native { .. } => {
                if lapic.deliverable().is_some() && if_on {
                    return lapic.ack().map(Err);
                }
                None
            }
            CoreMode::Guest { vcpu } => {
                if self.bg_pending[vcpu] != 0 {
                    let kind = self.bg_pending[vcpu].trailing_zeros();
                    self.bg_pending[vcpu] &= !(1 << kind);
                    return Some(Ok(if kind == 0 {
                        ExitInfo::IoInstruction {
                            port: EMULATED_DEVICE_PORT,
                        }
                    } else {
                        ExitInfo::EptViolation
                    }));
                }
                let vmcs = &self.m.vmcs[vcpu];
                if lapic.nmi_pending() && vmcs.nmi_exits() {
                    lapic.take_nmi();
                    return Some(Ok(ExitInfo::Nmi));
                }
                if let Some(v) = lapic.deliverable() {
                    if vmcs.posted_notification_absorbed(v) {
                        // Posted-interrupt processing (SDM 29.6): the CPU
                        // acknowledges and EOIs the notification, moves PIR
                        // into the virtual IRR and clears ON; no exit.
                        lapic.ack();
                        lapic.eoi();
                        let pir = self.m.pi_desc[vcpu].take();
                        self.m.vapic[vcpu].sync_pir(pir);
                        return self.interrupt_decision(core, k, c);
                    }
                    if vmcs.external_interrupt_exits() {
                        // SDM 27.2.2: with "acknowledge interrupt on exit" the
                        // processor acknowledges the LAPIC and saves the
                        // vector; without it the interrupt stays in the IRR.
                        let vector = if vmcs.exit.ack_interrupt_on_exit {
                            Some(lapic.ack()?)
                        } else {
                            None
                        };
                        return Some(Ok(ExitInfo::ExternalInterrupt { vector }));
                    }
                    if if_on {
                        let v = lapic.ack()?;
                        return Some(self.through_idt(vcpu, v));
                    }
                }
                if vmcs.proc2.virtual_interrupt_delivery && if_on {
                    // Virtual-interrupt delivery (SDM 29.2): RVI above VPPR.
                    if let Some(v) = self.m.vapic[vcpu].deliver() {
                        return Some(self.through_idt(vcpu, v));
                    }
                }
                let vmcs = &self.m.vmcs[vcpu];
                if vmcs.proc.interrupt_window_exiting && if_on {
                    return Some(Ok(ExitInfo::PendingInterrupt));
                }
                None
            }
            _ => None,
        }
    }

    /// Event delivery through the IDT the guest-state IDTR points at: the
    /// gate's handler runs, or a not-present gate raises #NP, which exits if
    /// the exception bitmap says so (ELI's bounce of host vectors).
    pub(super) fn through_idt(&self, vcpu: usize, vector: u8) -> Result<ExitInfo, u8> {
        match self.m.idt_gate(vcpu, vector) {
            Some(g) => Err(g),
            None if self.m.vmcs[vcpu].exception_exits(NP_VECTOR) => Ok(ExitInfo::Exception {
                vector: NP_VECTOR,
                idt_vectoring: Some(vector),
            }),
            // The guest's own #NP handler would run: the interrupt never
            // reaches a handler for it, which the checker reports as lost.
            None => Err(vector),
        }
    }

    /// EOI virtualization (SDM 29.1.4): the virtual-APIC page takes the
    /// EOI; an EOI-exit-bitmap vector then exits.
    pub(super) fn virtualized_eoi(
        &mut self,
        k: usize,
        vcpu: usize,
        eoi: Option<u8>,
        now: Time,
    ) -> Option<(ExitInfo, Option<u8>)> {
        let cleared = self.m.vapic[vcpu].eoi();
        if let Some(expected) = eoi {
            self.checker.eoi(k, expected, cleared, now);
        }
        match cleared {
            Some(v) if self.m.vmcs[vcpu].eoi_exit_bitmap.test(v) => {
                Some((ExitInfo::EoiInduced { vector: v }, None))
            }
            _ => None,
        }
    }

    /// Whether vCPU `k`'s guest drives its LAPIC in xAPIC mode.
    pub(super) fn guest_xapic(&self, k: usize) -> bool {
        self.hv.vms[self.hv.vcpus[k].vm].xapic
    }

    /// An xAPIC guest's store of `value` to the LAPIC register that x2APIC
    /// names `reg`, at offset `(reg - 0x800) << 4` of its APIC page, as the
    /// VMCS's APIC-access controls take it (SDM 29.4.3).
    pub(super) fn xapic_store(
        &mut self,
        k: usize,
        vcpu: usize,
        reg: u32,
        value: u64,
        eoi: Option<u8>,
        now: Time,
    ) -> Option<(ExitInfo, Option<u8>)> {
        let offset = ((reg - msr::X2APIC_FIRST) << 4) as u16;
        let value = value as u32;
        match self.m.vmcs[vcpu].apic_mmio_write_outcome(offset) {
            ApicMmioOutcome::ApicAccessExit => Some((ExitInfo::ApicAccess { offset, value }, eoi)),
            ApicMmioOutcome::ApicWriteExit => Some((ExitInfo::ApicWrite { offset, value }, eoi)),
            ApicMmioOutcome::EoiVirtualization => self.virtualized_eoi(k, vcpu, eoi, now),
            ApicMmioOutcome::TprVirtualization => {
                let _ = self.m.vapic[vcpu].write_tpr(u64::from(value));
                None
            }
            // Refused at build (SMP xAPIC guests are not modelled); the
            // write exits as KVM's fallback would.
            ApicMmioOutcome::IpiVirtualization => {
                Some((ExitInfo::ApicWrite { offset, value }, None))
            }
        }
    }

    /// Executes a guest instruction. Returns the exit it causes, if any
    /// (with the vector an exiting EOI completes).
    pub(super) fn execute(
        &mut self,
        core: usize,
        k: usize,
        i: Instr,
    ) -> Option<(ExitInfo, Option<u8>)> {
        let now = self.q.now();
        let vmcs = match self.m.cores[core].mode {
            CoreMode::Guest { vcpu } => Some(vcpu),
            _ => None,
        };
        let (reg, value, eoi) = match i {
            Instr::Eoi { vector } => {
                let vcpu = self.kernel_of(core);
                self.trace_event(TraceKind::Eoi { vector }, core, vcpu, now, now);
                (msr::EOI, 0, Some(vector))
            }
            Instr::ArmTimer {
                msr: r,
                value,
                deadline,
                vector,
            } => {
                self.checker.timer_programmed(k, vector, deadline, now);
                self.timer_due[k] = deadline;
                (r, value, None)
            }
            Instr::WrMsr { msr: r, value } => {
                self.guest_lapic_write_sent(k, r, value, now);
                // A native kernel knows its CPUs' APIC IDs (the MADT's):
                // CPU n's is the core's own, not n as in a VM's virtual
                // x2APIC.
                let value = match vmcs {
                    None if r == msr::ICR => {
                        let vm = self.hv.vcpus[k].vm;
                        match self.hv.vcpu_by_apic_id(vm, (value >> 32) as u32) {
                            Some(t) => {
                                let id = self.m.cores[self.hv.vcpus[t].core].apic_id;
                                (u64::from(id) << 32) | (value & 0xFFFF_FFFF)
                            }
                            None => value,
                        }
                    }
                    _ => value,
                };
                (r, value, None)
            }
            // VMCALL exits unconditionally in non-root mode (SDM 25.1.2);
            // on bare metal there is no hypervisor to answer (#UD, ignored).
            Instr::Vmcall { nr, arg } => {
                return vmcs.map(|_| (ExitInfo::Vmcall { nr, arg }, None));
            }
            Instr::PirSet { cpu, vector } => {
                self.guest_pir_set(k, cpu, vector, now);
                return None;
            }
            Instr::PostedIpi { cpu, vector } => {
                let id = self.guest_pir_set(k, cpu, vector, now)?;
                // Linux 4.10's POSTED_INTR_VECTOR, hard-coded in the
                // module's did.h (did-implementation.md §3).
                let nv = crate::hw::x86::vmcs::KVM_POSTED_INTR_VECTOR;
                (msr::ICR, (u64::from(id) << 32) | u64::from(nv), None)
            }
            // Handled by vmx_op before it gets here.
            Instr::Hlt => return None,
            Instr::PioWrite { port, .. } => {
                // KVM exits on every IN/OUT; on bare metal there is no
                // virtio device behind the port.
                let exits = vmcs.is_some_and(|v| self.m.vmcs[v].proc.unconditional_io_exiting);
                return exits.then_some((ExitInfo::IoInstruction { port }, None));
            }
            Instr::VfWrite { vf, reg } => {
                self.vf_store(vf, reg, now);
                return None;
            }
        };
        // An xAPIC guest stores to its LAPIC page instead: in guest mode
        // the VMCS's APIC-access controls decide (SDM 29.4); on bare metal
        // the store reaches the LAPIC as the MSR write would.
        if let (Some(vcpu), true) = (vmcs, self.guest_xapic(k)) {
            if (msr::X2APIC_FIRST..=msr::X2APIC_LAST).contains(&reg) {
                return self.xapic_store(k, vcpu, reg, value, eoi, now);
            }
        }
        // In guest mode the VMCS decides where the write goes (SDM 25.1.3,
        // 29.5); a faulting virtualized write (#GP) changes nothing, as a
        // faulting physical one.
        let outcome = vmcs.map(|v| (v, self.m.vmcs[v].wrmsr_outcome(reg)));
        match outcome {
            Some((_, WrmsrOutcome::VmExit)) => {
                return Some((ExitInfo::MsrWrite { msr: reg, value }, eoi));
            }
            Some((vcpu, WrmsrOutcome::EoiVirtualization)) => {
                return self.virtualized_eoi(k, vcpu, eoi, now);
            }
            Some((vcpu, WrmsrOutcome::TprVirtualization)) => {
                let _ = self.m.vapic[vcpu].write_tpr(value);
                return None;
            }
            Some((vcpu, WrmsrOutcome::SelfIpiVirtualization)) => {
                let _ = self.m.vapic[vcpu].self_ipi(value);
                return None;
            }
            Some((vcpu, WrmsrOutcome::IpiVirtualization)) => {
                if self.ipi_virtualization(vcpu, value) {
                    return None;
                }
                // Anything else is an APIC-write VM exit, handled as KVM
                // handles an ICR write.
                return Some((ExitInfo::MsrWrite { msr: reg, value }, None));
            }
            Some((vcpu, WrmsrOutcome::TscDeadlineVirtualization)) => {
                self.m.vmcs[vcpu].write_guest_deadline(value);
                self.guest_deadline_track(core, vcpu);
                return None;
            }
            Some((_, WrmsrOutcome::Msr)) | None => {}
        }
        let eff = self.m.lapics[core].write_msr(reg, value, now);
        if let Ok(eff) = eff {
            let r = schedule_apic_effect(&mut self.q, &self.m, core, eff, self.costs.ipi_timing());
            if let (Some(expected), Some(cleared)) = (eoi, r) {
                // The guest completes the handler the IDT ran for the
                // physical vector (they differ under a remapping shadow IDT).
                let cleared = match vmcs {
                    Some(v) => cleared.map(|c| self.m.idt_gate(v, c).unwrap_or(c)),
                    None => cleared,
                };
                self.checker.eoi(k, expected, cleared, now);
            }
        }
        None
    }

    /// APIC-timer virtualization in non-root operation on `core`, running
    /// `vcpu` (ISE 319433-059 §8.3): an expired guest deadline raises the
    /// virtual timer vector in the virtual-APIC page now; an armed one is
    /// watched (an event at its time, unless one is already due then).
    /// Called after a virtualized TSC-deadline write, at VM entry and when
    /// the watched deadline comes.
    pub(super) fn guest_deadline_track(&mut self, core: usize, vcpu: usize) {
        let tsc = tsc_at(self.q.now(), self.tsc_hz);
        if let Some(v) = self.m.vmcs[vcpu].guest_deadline_expired(tsc) {
            self.m.vapic[vcpu].timer_fire(v);
            self.poke(core);
            return;
        }
        let d = self.m.vmcs[vcpu].guest_deadline;
        if d == 0 || !self.m.vmcs[vcpu].proc2.apic_timer_virtualization {
            return;
        }
        if self.guest_deadline_watch[vcpu] != d {
            self.guest_deadline_watch[vcpu] = d;
            // The first picosecond at which the TSC reads at least d.
            let at = (u128::from(d) * SEC as u128).div_ceil(u128::from(self.tsc_hz.max(1)));
            self.q.schedule(
                at.min(u128::from(u64::MAX)) as Time,
                Ev::GuestDeadline { vcpu: vcpu as u16 },
            );
        }
    }

    /// The watched guest deadline of `vcpu` came: it fires if the vCPU is
    /// in non-root operation and the deadline is still armed as watched;
    /// otherwise the next VM entry looks again.
    pub(super) fn guest_deadline_due(&mut self, vcpu: usize) {
        self.guest_deadline_watch[vcpu] = 0;
        let core = self.hv.vcpus[vcpu].core;
        if self.m.cores[core].mode == (CoreMode::Guest { vcpu }) {
            let tsc = tsc_at(self.q.now(), self.tsc_hz);
            if let Some(v) = self.m.vmcs[vcpu].guest_deadline_expired(tsc) {
                self.m.vapic[vcpu].timer_fire(v);
                self.poke(core);
            } else {
                self.guest_deadline_track(core, vcpu);
            }
        }
    }

    /// The guest on `vcpu` wrote its ICR: the checker notes the IPI as
    /// raised for its target (unicast fixed IPIs to a sibling; the model's
    /// guests send no other kind).
    pub(super) fn guest_ipi_sent(&mut self, vcpu: usize, icr: u64, now: Time) {
        let Ok(Ipi {
            dest: IpiDest::Physical(id),
            vector,
            mode: DeliveryMode::Fixed,
        }) = decode_icr(icr)
        else {
            return;
        };
        let vm = self.hv.vcpus[vcpu].vm;
        if let Some(t) = self.hv.vcpu_by_apic_id(vm, id) {
            self.checker.raised_on(t, vector, now);
            // KVM kicks a running target with a reschedule IPI.
            let core = self.hv.vcpus[t].core;
            if let Some(e) = &mut self.event_exits {
                e.kick[core] = EventClass::VcpuIpi;
            }
        }
    }

    /// The guest on vCPU `k` set `vector` in the PIR of its VM's CPU
    /// `cpu`'s descriptor page (a store to guest memory the hypervisor
    /// mapped the descriptor onto, did-implementation.md §2 `osnet_map_pid`):
    /// for the checker that raises `vector` for that vCPU. Returns the
    /// target's x2APIC ID as the guest reads it (its virtual x2APIC ID
    /// register), or None if the VM has no such CPU.
    pub(super) fn guest_pir_set(
        &mut self,
        k: usize,
        cpu: u32,
        vector: u8,
        now: Time,
    ) -> Option<u32> {
        let vm = self.hv.vcpus[k].vm;
        let t = self.hv.vcpu_by_apic_id(vm, cpu)?;
        self.m.pi_desc[t].pir.set(vector);
        self.checker.raised_on(t, vector, now);
        Some(self.m.vapic[t].x2apic_id.unwrap_or(cpu))
    }

    /// IPI virtualization (SDM 30.1.6, "virtualizing ICR writes"): a
    /// unicast fixed physical-mode IPI is posted by the processor to the
    /// descriptor the VM's PID-pointer table gives for the destination's
    /// virtual APIC ID, with a notification if ON was clear and SN is not
    /// set. No VM exit.
    pub(super) fn ipi_virtualization(&mut self, vcpu: usize, icr: u64) -> bool {
        // Physical destination mode (bit 11 clear), which decode_icr does
        // not look at, and a legal vector.
        let physical = (icr >> 11) & 1 == 0;
        let Ok(Ipi {
            dest: IpiDest::Physical(dest),
            vector,
            mode: DeliveryMode::Fixed,
        }) = decode_icr(icr)
        else {
            return false;
        };
        if !physical || vector < 0x10 {
            return false;
        }
        let Some(&pid) = self.m.vmcs[vcpu].pid_table.get(dest as usize) else {
            return false;
        };
        let Some(pi) = self.m.pi_desc.get_mut(pid as usize) else {
            return false;
        };
        if pi.post(vector) {
            let (nv, ndst) = (pi.nv, pi.ndst);
            if let Some(to) = self.m.core_of_apic(ndst) {
                // The notification is an ordinary IPI from the sender's core.
                self.q.schedule_in_async_within(
                    self.costs.ipi_latency,
                    self.costs.ipi_latency_max,
                    Ev::ApicArrive {
                        core: to as u16,
                        vector: nv,
                        mode: DeliveryMode::Fixed,
                    },
                );
            }
        }
        true
    }

    pub(super) fn exit_cost(&mut self, vm: usize, info: ExitInfo) -> Time {
        let c = &self.costs;
        let rt = c.roundtrip;
        let mut sample = |mean: Time| {
            rt + from_s(
                self.rng_exit
                    .exponential(mean.saturating_sub(rt) as f64 / SEC as f64),
            )
        };
        match info {
            // The measured 1.97 µs covers the host IRQ handler, charged apart.
            ExitInfo::ExternalInterrupt { .. } => {
                c.external_interrupt.saturating_sub(c.irq_handler)
            }
            ExitInfo::EoiInduced { .. } => c.msr_write_eoi,
            ExitInfo::MsrWrite { msr, .. } => c.apic_register_write(msr),
            ExitInfo::IoInstruction { port } => match self.hv.ioeventfd(vm, port) {
                Some(_) => c.io_instruction_ioeventfd,
                None => {
                    // QEMU emulates the port in user space, holding the
                    // global mutex (kvm_cpu_exec) after waiting for it.
                    let h = sample(self.costs.io_instruction_mean);
                    let rt = self.costs.roundtrip;
                    h + self.blk_vcpu_lock(vm, h.saturating_sub(rt))
                }
            },
            ExitInfo::EptViolation => sample(self.costs.ept_violation_mean),
            ExitInfo::PendingInterrupt | ExitInfo::PreemptionTimer => c.pending_interrupt,
            ExitInfo::Hlt => c.hlt,
            // Hypercalls: the bare exit round trip; the handler's work is
            // what the scheme charges.
            ExitInfo::Vmcall { .. } => rt,
            // The same register's MSR-write exit, plus decoding the store
            // for the fault-like APIC access.
            ExitInfo::ApicAccess { .. } | ExitInfo::ApicWrite { .. } => {
                let base = c.apic_register_write(info.apic_msr().map_or(0, |(m, _)| m));
                if matches!(info, ExitInfo::ApicAccess { .. }) {
                    base + c.apic_access_decode
                } else {
                    base
                }
            }
            ExitInfo::Nmi => c.nmi,
            // Like EXTERNAL_INTERRUPT, the host handler is charged apart.
            ExitInfo::Exception { .. } => c.exception_np.saturating_sub(c.irq_handler),
        }
    }

    /// The guest event an exit is charged to (did-arm.md §3's rows): the
    /// register a trapped write names, or for an external interrupt the
    /// guest timer it delivers, the VF's host vector, or why the
    /// reschedule IPI that caused it was sent.
    fn vmx_exit_class(&self, core: usize, vcpu: usize, info: ExitInfo, now: Time) -> EventClass {
        let of_msr = |m: u32| match m {
            msr::TMICT | msr::TSC_DEADLINE => EventClass::TimerProgram,
            msr::EOI => EventClass::Eoi,
            msr::ICR => EventClass::VcpuIpi,
            _ => EventClass::Other,
        };
        match info {
            ExitInfo::MsrWrite { msr, .. } => of_msr(msr),
            ExitInfo::ApicAccess { .. } | ExitInfo::ApicWrite { .. } => info
                .apic_msr()
                .map_or(EventClass::Other, |(m, _)| of_msr(m)),
            ExitInfo::EoiInduced { .. } => EventClass::Eoi,
            ExitInfo::Hlt => EventClass::Idle,
            ExitInfo::ExternalInterrupt { vector } => {
                let timer_due = self.timer_due[vcpu].is_some_and(|d| d <= now);
                match vector {
                    Some(v) if self.hv.vf_by_host_vector(core, v).is_some() => EventClass::Device,
                    Some(crate::hv::host::RESCHEDULE_VECTOR) => self
                        .event_exits
                        .as_ref()
                        .map_or(EventClass::Other, |e| e.kick[core]),
                    // The host's hrtimer interrupt: KVM's emulated guest
                    // timer if it is due, else a host timer (the tick).
                    Some(crate::hv::host::HOST_TIMER_VECTOR) | None if timer_due => {
                        EventClass::TimerExpiry
                    }
                    _ => EventClass::Other,
                }
            }
            _ => EventClass::Other,
        }
    }

    pub(super) fn vm_exit(&mut self, core: usize, info: ExitInfo, eoi_expect: Option<u8>) {
        let now = self.q.now();
        self.pause_guest(core);
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return;
        };
        self.account_guest_time(core, vcpu, now);
        // The preemption timer counts only in guest mode.
        self.ptimer_gen[core] += 1;
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.exits[core] = Some(ExitState {
            vcpu,
            info: ArchExit::Vmx(info),
            start: now,
            stage: Stage::Handler,
            timer_landed: false,
            record: true,
        });
        if self.event_exits.is_some() {
            let class = self.vmx_exit_class(core, vcpu, info, now);
            let vm = self.hv.vcpus[vcpu].vm;
            if let Some(e) = &mut self.event_exits {
                e.exit(vm, class);
            }
        }
        let base = self.exit_cost(self.hv.vcpus[vcpu].vm, info);
        let (mut cx, scheme) = self.cx();
        let out = scheme.handle_exit(&mut cx, vcpu, info);
        if matches!(info, ExitInfo::ExternalInterrupt { vector: Some(_) }) {
            // The host's handler EOIs the vector acknowledged on exit.
            cx.m.lapics[core].eoi();
        }
        let charged = cx.charged;
        if let (Some(expected), Some(cleared)) = (eoi_expect, out.eoi_cleared) {
            self.checker.eoi(vcpu, expected, cleared, now);
        }
        if let ExitInfo::Vmcall { nr, arg } = info {
            // A hypercall to a host service behind the hypervisor (the
            // vCanal service's channel announcement).
            let vm = self.hv.vcpus[vcpu].vm;
            self.canal_hypercall(vm, nr, arg);
        }
        let charged = charged
            + match info {
                // The host's own NIC (vCanal w/o Affinity): its driver's
                // interrupt and NAPI poll run in this exit.
                ExitInfo::ExternalInterrupt {
                    vector: Some(crate::hv::host::HOST_NIC_VECTOR),
                } => self.host_nic_irq(core),
                _ => 0,
            };
        self.start_segment(core, base + charged);
    }

    pub(super) fn exit_stage_done(&mut self, core: usize) {
        let Some(mut e) = self.exits[core] else {
            return;
        };
        if e.stage != Stage::Entering {
            // Host interrupts are enabled between handler steps.
            let (mut cx, scheme) = self.cx();
            let mut took = false;
            let mut nic = false;
            if cx.m.lapics[core].take_nmi() {
                scheme.host_nmi(&mut cx, core);
                took = true;
            } else if let Some(v) = cx.m.lapics[core].ack() {
                scheme.host_interrupt(&mut cx, core, v);
                cx.m.lapics[core].eoi();
                took = true;
                nic = v == crate::hv::host::HOST_NIC_VECTOR;
            }
            if took {
                let charged = cx.charged;
                let charged = (charged + if nic { self.host_nic_irq(core) } else { 0 }).max(1);
                e.stage = Stage::HostIrq;
                self.exits[core] = Some(e);
                self.start_segment(core, charged);
                return;
            }
            let wait = scheme.entry_quiesce(&cx, e.vcpu);
            if wait > 0 {
                e.stage = Stage::HostIrq;
                self.exits[core] = Some(e);
                self.start_segment(core, wait);
                return;
            }
            scheme.prepare_entry(&mut cx, e.vcpu);
            let charged = cx.charged;
            e.stage = Stage::Entering;
            self.exits[core] = Some(e);
            if charged > 0 {
                self.start_segment(core, charged);
                return;
            }
        }
        self.arch_entry(core);
    }

    /// VM entry on `core` once the exit path is done (VMRUN on an AMD
    /// host: `arch_entry` sends both vendors here, and the vendor's own
    /// steps, the exit's accounting and the event injected at entry, go
    /// through `world::arch`).
    pub(super) fn vm_entry(&mut self, core: usize) {
        let Some(e) = self.exits[core].take() else {
            return;
        };
        let now = self.q.now();
        let vcpu = e.vcpu;
        let service = now - e.start;
        let kind = if e.record {
            e.info.trace_kind()
        } else {
            TraceKind::ScheduleIn
        };
        self.trace_event(kind, core, vcpu, e.start, now);
        let deschedule = std::mem::take(&mut self.deschedule_pending[vcpu]);
        if deschedule && !self.hv.vcpus[vcpu].halted {
            self.put(core, vcpu);
            return;
        }
        if e.record && e.start >= self.measure_start {
            self.arch_record_exit(vcpu, e.info, service, e.timer_landed);
        }
        if self.hv.vcpus[vcpu].halted {
            // kvm_vcpu_block: the vCPU thread sleeps instead of entering,
            // unless an interrupt came in since the HLT exit began
            // (kvm_vcpu_check_block looks again right before sleeping).
            let runnable = {
                let (cx, scheme) = self.cx();
                scheme.vcpu_has_interrupt(&cx, vcpu)
            };
            if !runnable {
                // A schedule-out that came during the HLT exit is moot:
                // the thread blocks (pi_pre_block and all), and the
                // kick that makes an interrupt pending wakes it.
                return self.halt(core, vcpu);
            }
            self.hv.vcpus[vcpu].halted = false;
        }
        if deschedule {
            self.put(core, vcpu);
            return;
        }
        self.m.cores[core].mode = CoreMode::Guest { vcpu };
        self.m.cores[core].guest_since = now;
        if let Some(r) = self.arch_entry_event(core, vcpu) {
            match r {
                Err(g) => self.deliver(core, g),
                Ok(exit) => return self.arch_exit(core, exit, None),
            }
        }
        let guest_isr = {
            let (cx, scheme) = self.cx();
            scheme.guest_isr(&cx, vcpu)
        };
        let (k, c) = self.kcpu(vcpu);
        let in_service = self.guests[k].in_service(c);
        self.checker.isr_at_entry(vcpu, in_service, guest_isr, now);
        self.guest_run(core);
    }

    /// A VT-x exit's accounting at the next entry: by basic exit reason,
    /// per VM and per vCPU, and the exits the guest's timer landed in.
    pub(super) fn vmx_record_exit(
        &mut self,
        vcpu: usize,
        info: ExitInfo,
        service: Time,
        timer_landed: bool,
    ) {
        let vm = self.hv.vcpus[vcpu].vm;
        self.hv.vms[vm].stats.record_info(&info, service);
        let index = self.hv.vcpus[vcpu].index;
        self.hv.vms[vm].vcpu_stats[index].record_info(&info, service);
        if timer_landed {
            self.timer_exits[info.reason().index()].record(service);
        }
    }

    /// What a guest's x2APIC write sends, told to the checker before any
    /// architecture takes it: an ICR write's IPI, and a SELF IPI write's
    /// fixed IPI to the writer (VT-x and SVM alike).
    pub(super) fn guest_lapic_write_sent(&mut self, k: usize, r: u32, value: u64, now: Time) {
        if r == msr::ICR {
            self.guest_ipi_sent(k, value, now);
        }
        if r == msr::SELF_IPI {
            self.checker.raised_on(k, value as u8, now);
        }
    }

    /// VM entry with the VMX-preemption timer armed and the VM-entry
    /// interruption-information field's event delivered through the IDT
    /// (or the exit its delivery causes).
    pub(super) fn vmx_entry_event(
        &mut self,
        core: usize,
        vcpu: usize,
    ) -> Option<Result<ExitInfo, u8>> {
        self.arm_preemption_timer(core, vcpu);
        if self.m.vmcs[vcpu].proc2.apic_timer_virtualization {
            self.guest_deadline_track(core, vcpu);
        }
        match self.m.vmcs[vcpu].entry_event.take() {
            Some(crate::hw::x86::vmcs::EntryEvent::ExternalInterrupt(v)) => {
                Some(self.through_idt(vcpu, v))
            }
            // Taken and dropped, as before: no scheme injects an NMI.
            Some(crate::hw::x86::vmcs::EntryEvent::Nmi) | None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_ops_lower_to_the_x2apic_writes_linux_makes() {
        assert_eq!(
            lower(
                KernelOp::SendIpi {
                    cpu: 3,
                    vector: 0xfd
                },
                None
            ),
            Instr::WrMsr {
                msr: msr::ICR,
                value: (3 << 32) | 0xfd
            }
        );
        let init: Vec<Instr> = (0..lapic_clockevent(1).init_steps)
            .map(|step| lower(KernelOp::ClockeventInit { step, vector: 0xef }, None))
            .collect();
        assert_eq!(
            init,
            [
                Instr::WrMsr {
                    msr: msr::LVT_TIMER,
                    value: 0xef
                },
                Instr::WrMsr {
                    msr: msr::TDCR,
                    value: 0b0011
                }
            ]
        );
        assert_eq!(
            lower(
                KernelOp::ProgramClockevent {
                    ticks: 20,
                    deadline: Some(5),
                    vector: 0xef
                },
                None
            ),
            Instr::ArmTimer {
                msr: msr::TMICT,
                value: 20,
                deadline: Some(5),
                vector: 0xef
            }
        );
        // TSC-deadline mode (2 GHz TSC): the LVTT write carries mode 10b,
        // no divider, and the deadline is the TSC at the expected expiry.
        let ce = tsc_deadline_clockevent(2_000_000_000);
        assert_eq!((ce.tick, ce.init_steps), (4_000, 1), "8 TSC cycles");
        assert_eq!(
            lower(
                KernelOp::ClockeventInit {
                    step: 0,
                    vector: 0xef
                },
                Some(2_000_000_000)
            ),
            Instr::WrMsr {
                msr: msr::LVT_TIMER,
                value: 0xef | (2 << 17)
            }
        );
        assert_eq!(
            lower(
                KernelOp::ProgramClockevent {
                    ticks: 20,
                    deadline: Some(3 * crate::engine::US),
                    vector: 0xef
                },
                Some(2_000_000_000)
            ),
            Instr::ArmTimer {
                msr: msr::TSC_DEADLINE,
                value: 6_000,
                deadline: Some(3 * crate::engine::US),
                vector: 0xef
            }
        );
        assert_eq!(lower(KernelOp::Idle, None), Instr::Hlt);
        assert_eq!(
            lower(KernelOp::EndOfInterrupt { vector: 0x41 }, None),
            Instr::Eoi { vector: 0x41 }
        );
    }
}

/// APIC-timer virtualization under `kvm-2026` (`hv.apic_timer_virt`): the
/// hardware takes a TSC-deadline guest's timer, and KVM's fallbacks put it
/// back on the software hrtimer.
#[cfg(test)]
mod apic_timer_virt {
    use super::*;
    use crate::calibration::Calibration;
    use crate::engine::MS;
    use crate::hv::exits::ExitReason;
    use crate::scenario::Scenario;

    const LVTT_MASKED: u64 = 1 << 16;
    const LVTT_PERIODIC: u64 = 0b01 << 17;

    /// A 1-vCPU kvm-2026 VM with APIC-timer virtualization on and a
    /// 100 µs hrtimer module, its guest timer in `lapic_timer` mode, run
    /// for `ms`.
    fn world(lapic_timer: &str, idle: &str, ms: u64) -> World {
        let text = format!(
            "scheme = \"kvm-2026\"\nduration_s = 0.05\nwarmup_s = 0.0\n\
             [hv]\napic_timer_virt = true\n\
             [background]\nenabled = false\n\
             [guest]\nlapic_timer = \"{lapic_timer}\"\nidle = \"{idle}\"\n\
             [workload.hrtimer_latency]\ninterval_us = 100\n"
        );
        let s = Scenario::parse(&text, &[]).expect("scenario parses");
        let mut w = World::build(&s, &Calibration::default_host()).expect("world builds");
        w.end = ms * MS;
        w.run(|_| {});
        w
    }

    fn msr_write_exits(w: &World) -> u64 {
        w.hv.vms[0].stats.by_reason[ExitReason::MSR_WRITE.index()].count
    }

    /// The LVTT write that exits: what KVM's handler sees.
    fn lvtt_write(w: &mut World, value: u64) {
        let (mut cx, scheme) = w.cx();
        scheme.handle_exit(
            &mut cx,
            0,
            ExitInfo::MsrWrite {
                msr: msr::LVT_TIMER,
                value,
            },
        );
    }

    fn virt_on(w: &World) -> bool {
        let v = &w.m.vmcs[0];
        v.proc2.apic_timer_virtualization && !v.msr_write_exits(msr::TSC_DEADLINE)
    }

    /// TSC-deadline mode, unmasked, running: the guest's deadline writes
    /// and the expiries take no exit, and every expiry reaches the module.
    #[test]
    fn tsc_deadline_writes_and_expiries_take_no_exit() {
        let w = world("tsc-deadline", "poll", 20);
        assert!(virt_on(&w));
        assert_eq!(
            w.m.vmcs[0].virtual_timer_vector,
            w.scenario.guest.timer_vector
        );
        assert_eq!(msr_write_exits(&w), 1, "only the LVTT write at boot");
        assert!(w.guests[0].counters.timer_irqs > 150);
        assert_eq!(w.checker.total(), 0);
    }

    /// One-shot mode: the hardware supports TSC-deadline mode only; KVM
    /// keeps its software timer and every TMICT write exits.
    #[test]
    fn one_shot_mode_falls_back_to_the_software_timer() {
        let w = world("oneshot", "poll", 20);
        assert!(!w.m.vmcs[0].proc2.apic_timer_virtualization);
        assert!(msr_write_exits(&w) > 150);
        assert_eq!(w.checker.total(), 0);
    }

    /// A masked or periodic LVTT turns it off, moving an armed deadline to
    /// the software hrtimer; unmasking in TSC-deadline mode moves it back.
    #[test]
    fn masked_and_periodic_lvtt_fall_back_and_the_deadline_moves() {
        let mut w = world("tsc-deadline", "poll", 5);
        let vector = u64::from(w.scenario.guest.timer_vector);
        let armed = w.m.vmcs[0].guest_deadline;
        assert!(virt_on(&w) && armed != 0, "a deadline is armed in the VMCS");
        lvtt_write(&mut w, vector | LVTT_TSC_DEADLINE | LVTT_MASKED);
        assert!(!virt_on(&w) && w.m.vmcs[0].guest_deadline == 0);
        assert!(w.m.vmcs[0].msr_write_exits(msr::TSC_DEADLINE));
        let sw = &w.hv.vcpus[0].vlapic;
        assert_eq!(
            sw.read_msr(msr::TSC_DEADLINE, 0),
            Ok(armed),
            "moved to the emulated LAPIC"
        );
        assert!(sw.timer_deadline().is_some());
        lvtt_write(&mut w, vector | LVTT_TSC_DEADLINE);
        assert!(virt_on(&w));
        assert_eq!(w.m.vmcs[0].guest_deadline, armed, "and back to the VMCS");
        assert!(
            w.hv.vcpus[0].vlapic.timer_deadline().is_none(),
            "hrtimer cancelled"
        );
        lvtt_write(&mut w, vector | LVTT_PERIODIC);
        assert!(!virt_on(&w), "periodic mode");
    }

    /// A blocked vCPU: the hardware fires only in non-root operation, so
    /// KVM moves the deadline to its hrtimer before the thread sleeps and
    /// back after it wakes; no expiry is lost.
    #[test]
    fn a_blocked_vcpu_sleeps_on_the_software_timer() {
        let mut w = world("tsc-deadline", "poll", 5);
        let armed = w.m.vmcs[0].guest_deadline;
        {
            let (mut cx, scheme) = w.cx();
            scheme.vcpu_blocking(&mut cx, 0);
        }
        assert!(!virt_on(&w));
        assert_eq!(
            w.hv.vcpus[0].vlapic.read_msr(msr::TSC_DEADLINE, 0),
            Ok(armed)
        );
        {
            let (mut cx, scheme) = w.cx();
            scheme.vcpu_unblocking(&mut cx, 0);
        }
        assert!(virt_on(&w) && w.m.vmcs[0].guest_deadline == armed);
        // A halting guest: every idle period blocks and unblocks, yet every
        // expiry is delivered.
        let h = world("tsc-deadline", "halt", 20);
        let mut m = crate::guest::app::Metrics::new();
        h.scheme.metrics(&mut m);
        assert!(m["kvm2026.virt_timer_off"] > 50.0, "{m:?}");
        assert!(h.guests[0].counters.timer_irqs > 150);
        assert_eq!(h.checker.total(), 0);
    }
}
