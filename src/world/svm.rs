//! x86 with AMD SVM on the platform (docs/amd.md): the sibling of
//! `world::vmx`. What a core in guest mode does about pending interrupts
//! (the INTR and NMI intercepts, the AVIC backing page's IRR above PPR,
//! V_IRQ taken or exiting as VINTR), how the guest kernel's operations
//! execute (a WRMSR the MSR permission map intercepts, or that the AVIC
//! accelerates, traps or faults; an xAPIC page store as NPF or through the
//! AVIC; HLT and I/O intercepts), the #VMEXIT with AMD's exit codes and
//! costs, EVENTINJ at VMRUN, the AVIC doorbell and the IOMMU's GuestMode
//! delivery. The host side of an exit (its stages, host interrupts between
//! them, entry, blocking) is the x86 path `world::vmx` shares.

use super::arch::{ArchExit, OpResult};
use super::event::Ev;
use super::{ExitState, Stage, World};
use crate::engine::Time;
use crate::guest::KernelOp;
use crate::hv::exits::{EventClass, ExitInfo};
use crate::hw::x86::avic::{access_kind, reg, AccessKind, IcrWrite};
use crate::hw::x86::core::CoreMode;
use crate::hw::x86::instr::Instr;
use crate::hw::x86::iommu_ga::{self, GaDelivery, GaIrte};
use crate::hw::x86::lapic::{msr, DeliveryMode};
use crate::hw::x86::vmcb::{SvmExit, SvmExitCode};
use crate::report::trace::TraceKind;

impl World {
    /// The handler the guest's IDT runs for `vector` on `vcpu`.
    fn svm_gate(&self, vcpu: usize, vector: u8) -> u8 {
        self.m.idt_gate(vcpu, vector).unwrap_or(vector)
    }

    /// What `core` must do now about pending events in SVM guest mode.
    pub(super) fn svm_pending(
        &mut self,
        core: usize,
        k: usize,
        c: usize,
    ) -> Option<Result<ArchExit, u8>> {
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return self
                .interrupt_decision(core, k, c)
                .map(|r| r.map(ArchExit::Vmx));
        };
        if self.bg_pending[vcpu] != 0 {
            let kind = self.bg_pending[vcpu].trailing_zeros();
            self.bg_pending[vcpu] &= !(1 << kind);
            return Some(Ok(ArchExit::Svm(if kind == 0 {
                SvmExit::Ioio {
                    port: super::EMULATED_DEVICE_PORT,
                }
            } else {
                SvmExit::Npf { apic: None }
            })));
        }
        let if_on = self.guests[k].interrupts_enabled(c);
        let vmcb = &self.m.vmcb[vcpu];
        let (intr, nmi, avic) = (vmcb.intercept.intr, vmcb.intercept.nmi, vmcb.avic_enable);
        let lapic = &mut self.m.lapics[core];
        if nmi && lapic.nmi_pending() {
            lapic.take_nmi();
            return Some(Ok(ArchExit::Svm(SvmExit::Nmi)));
        }
        if lapic.deliverable().is_some() {
            // APM 15.21.1: with the INTR intercept a physical interrupt
            // exits and stays pending in the LAPIC.
            if intr {
                return Some(Ok(ArchExit::Svm(SvmExit::Intr)));
            }
            if if_on {
                let v = lapic.ack()?;
                return Some(Err(self.svm_gate(vcpu, v)));
            }
        }
        if avic && if_on {
            // APM 15.29.2.2: the highest backing-page IRR vector above PPR
            // is delivered through the guest IDT.
            if let Some(v) = self.m.avic_pages[vcpu].deliver() {
                return Some(Err(self.svm_gate(vcpu, v)));
            }
        }
        match self.m.vmcb[vcpu].virtual_interrupt(if_on) {
            Some(Ok(v)) => {
                self.m.vmcb[vcpu].take_virtual_interrupt();
                Some(Err(self.svm_gate(vcpu, v)))
            }
            Some(Err(())) => Some(Ok(ArchExit::Svm(SvmExit::Vintr))),
            None => None,
        }
    }

    /// The guest on `core` (kernel CPU of `vcpu`) asks for `op`.
    pub(super) fn svm_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        let tsc_deadline = (self.scenario.guest.lapic_timer
            == crate::scenario::LapicTimer::TscDeadline)
            .then_some(self.tsc_hz);
        match super::vmx::lower(op, tsc_deadline) {
            Instr::Hlt => match self.m.cores[core].mode {
                CoreMode::Guest { vcpu } if self.m.vmcb[vcpu].intercept.hlt => {
                    OpResult::Exit(ArchExit::Svm(SvmExit::Hlt), None)
                }
                _ => OpResult::Wait,
            },
            i => match self.svm_execute(core, vcpu, i) {
                Some((e, eoi)) => OpResult::Exit(e, eoi),
                None => OpResult::Continue,
            },
        }
    }

    /// Executes a guest instruction in SVM guest mode: the exit it causes
    /// (with the vector an exiting EOI completes), if any.
    fn svm_execute(&mut self, core: usize, k: usize, i: Instr) -> Option<(ArchExit, Option<u8>)> {
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return self
                .execute(core, k, i)
                .map(|(info, eoi)| (ArchExit::Vmx(info), eoi));
        };
        let now = self.q.now();
        let svm = |e: SvmExit, eoi| Some((ArchExit::Svm(e), eoi));
        let (reg, value, eoi) = match i {
            Instr::Eoi { vector } => {
                self.trace_event(TraceKind::Eoi { vector }, core, k, now, now);
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
                (r, value, None)
            }
            // VMMCALL is intercepted by every KVM.
            Instr::Vmcall { nr, arg } => return svm(SvmExit::Vmmcall { nr, arg }, None),
            // The DID guest module's stores (posted descriptors) are
            // VT-x's; no SVM scheme has the guest load it.
            Instr::PirSet { .. } | Instr::PostedIpi { .. } | Instr::Hlt => return None,
            Instr::PioWrite { port, .. } => {
                return if self.m.vmcb[vcpu].intercept.ioio_prot {
                    svm(SvmExit::Ioio { port }, None)
                } else {
                    None
                };
            }
            Instr::VfWrite { vf, reg } => {
                self.vf_store(vf, reg, now);
                return None;
            }
        };
        let apic_reg = (msr::X2APIC_FIRST..=msr::X2APIC_LAST).contains(&reg);
        let vmcb = &self.m.vmcb[vcpu];
        if apic_reg && self.guest_xapic(k) {
            // A store to the APIC page: the AVIC's (xAVIC or x2AVIC), or
            // without AVIC a nested page fault KVM emulates as MMIO.
            if vmcb.avic_enable {
                return self.avic_write(core, k, vcpu, reg, value, eoi, now);
            }
            let offset = ((reg - msr::X2APIC_FIRST) << 4) as u16;
            return svm(
                SvmExit::Npf {
                    apic: Some((offset, value as u32)),
                },
                eoi,
            );
        }
        if vmcb.wrmsr_exits(reg) {
            return svm(SvmExit::MsrWrite { msr: reg, value }, eoi);
        }
        if apic_reg && vmcb.x2avic_enable {
            return self.avic_write(core, k, vcpu, reg, value, eoi, now);
        }
        // An MSR neither intercepted nor virtualized reaches the hardware
        // register (never for the LAPIC in the schemes here).
        if let Ok(eff) = self.m.lapics[core].write_msr(reg, value, now) {
            let _ = super::event::schedule_apic_effect(
                &mut self.q,
                &self.m,
                core,
                eff,
                self.costs.ipi_timing(),
            );
        }
        None
    }

    /// A guest write of the APIC register x2APIC names `reg` with the
    /// AVIC on: accelerated in the backing page, or trapped or faulted as
    /// AVIC_UNACCELERATED_ACCESS (APM table 15-22).
    #[allow(clippy::too_many_arguments)]
    fn avic_write(
        &mut self,
        core: usize,
        k: usize,
        vcpu: usize,
        r: u32,
        value: u64,
        eoi: Option<u8>,
        now: Time,
    ) -> Option<(ArchExit, Option<u8>)> {
        let offset = ((r - msr::X2APIC_FIRST) << 4) as u16;
        let kind = access_kind(offset, true, false);
        if kind != AccessKind::Accelerated {
            return Some((
                ArchExit::Svm(SvmExit::AvicUnacceleratedAccess {
                    offset,
                    write: true,
                    value: value as u32,
                    trap: kind == AccessKind::Trap,
                }),
                eoi,
            ));
        }
        match offset {
            reg::EOI => {
                let cleared = self.m.avic_pages[vcpu].eoi();
                if let Some(expected) = eoi {
                    self.checker.eoi(k, expected, cleared, now);
                }
                None
            }
            reg::TPR => {
                self.m.avic_pages[vcpu].tpr = value as u8;
                None
            }
            reg::ICR => self.avic_icr(core, vcpu, value, now),
            _ => None,
        }
    }

    /// The AVIC's handling of the guest's ICR write on `core`: IRR bits in
    /// the targets' backing pages, doorbells to running targets' cores,
    /// AVIC_INCOMPLETE_IPI otherwise.
    fn avic_icr(
        &mut self,
        core: usize,
        vcpu: usize,
        icr: u64,
        now: Time,
    ) -> Option<(ArchExit, Option<u8>)> {
        let vm = self.hv.vcpus[vcpu].vm;
        let sender = self.hv.vcpus[vcpu].index as u32;
        let ipi = IcrWrite::decode(icr, !self.hv.vms[vm].xapic);
        let latency = self.costs.svm.doorbell_latency;
        let max = latency.max(self.costs.ipi_latency_max);
        let super::Machine {
            cores,
            avic_tables,
            avic_pages,
            avic_erratum,
            ..
        } = &mut self.m;
        let q = &mut self.q;
        let r = avic_tables[vm].icr_write(avic_pages, sender, ipi, now, *avic_erratum, |id| {
            // WRMSR to the doorbell MSR with the target's host APIC ID.
            if let Some(to) = cores.iter().position(|c| c.apic_id == id) {
                if to != core {
                    q.schedule_in_async_within(latency, max, Ev::Doorbell { core: to as u16 });
                }
            }
        });
        match r {
            Ok(()) => None,
            Err(inc) => Some((
                ArchExit::Svm(SvmExit::AvicIncompleteIpi {
                    icr,
                    cause: inc.cause,
                    index: inc.index,
                }),
                None,
            )),
        }
    }

    /// A doorbell reached `core`: a guest running there with the AVIC on
    /// looks at its backing page again; elsewhere it is dropped (VMRUN
    /// looks at the page anyway).
    pub(super) fn svm_doorbell(&mut self, core: usize) {
        if let CoreMode::Guest { vcpu } = self.m.cores[core].mode {
            if self.m.vmcb[vcpu].avic_enable {
                self.poke(core);
            }
        }
    }

    /// An MSI through a GuestMode IRTE: the IOMMU's guest virtual APIC.
    pub(super) fn svm_guest_mode_msi(&mut self, ga: GaIrte) {
        let now = self.q.now();
        match iommu_ga::deliver(&ga, &mut self.m.avic_pages, &mut self.m.ga_log) {
            GaDelivery::Doorbell(id) => {
                if let Some(to) = self.m.core_of_apic(id) {
                    self.q.schedule_in_async_within(
                        self.costs.svm.doorbell_latency,
                        self.costs
                            .svm
                            .doorbell_latency
                            .max(self.costs.ipi_latency_max),
                        Ev::Doorbell { core: to as u16 },
                    );
                }
            }
            GaDelivery::Logged => {
                // The GA-log interrupt: the IOMMU's MSI to the host.
                let to = self.hv.designated_core;
                let id = self.m.cores[to].apic_id;
                self.deliver_msi(
                    id,
                    crate::hv::svm::AMD_IOMMU_VECTOR,
                    DeliveryMode::Fixed,
                    now,
                );
            }
            GaDelivery::Silent => {}
        }
    }

    /// The service time of an SVM exit besides what its handler charges:
    /// the VMRUN/#VMEXIT round trip plus the handler work KVM's x86 core
    /// shares with VT-x (the VT-x exit's cost without its round trip).
    fn svm_exit_cost(&mut self, vm: usize, e: SvmExit) -> Time {
        let rt = self.costs.svm.roundtrip;
        let shared = |w: &mut World, info: ExitInfo| {
            let vrt = w.costs.roundtrip;
            w.exit_cost(vm, info).saturating_sub(vrt) + rt
        };
        match e {
            SvmExit::Intr => rt + self.costs.svm.intr,
            SvmExit::Nmi => shared(self, ExitInfo::Nmi),
            SvmExit::Vintr | SvmExit::Vmmcall { .. } | SvmExit::AvicIncompleteIpi { .. } => rt,
            SvmExit::Hlt => shared(self, ExitInfo::Hlt),
            SvmExit::Ioio { port } => shared(self, ExitInfo::IoInstruction { port }),
            SvmExit::MsrWrite { msr, value } => shared(self, ExitInfo::MsrWrite { msr, value }),
            SvmExit::Npf { apic: None } => shared(self, ExitInfo::EptViolation),
            SvmExit::Npf {
                apic: Some((offset, _)),
            }
            | SvmExit::AvicUnacceleratedAccess { offset, .. } => {
                let m = msr::X2APIC_FIRST + u32::from(offset >> 4);
                shared(self, ExitInfo::MsrWrite { msr: m, value: 0 })
            }
        }
    }

    /// The guest event an SVM exit is charged to (the exits-per-event
    /// table's rows).
    fn svm_exit_class(&self, core: usize, vcpu: usize, e: SvmExit, now: Time) -> EventClass {
        let of_msr = |m: u32| match m {
            msr::TMICT | msr::TSC_DEADLINE => EventClass::TimerProgram,
            msr::EOI => EventClass::Eoi,
            msr::ICR => EventClass::VcpuIpi,
            _ => EventClass::Other,
        };
        match e {
            SvmExit::MsrWrite { msr, .. } => of_msr(msr),
            SvmExit::AvicUnacceleratedAccess { offset, .. }
            | SvmExit::Npf {
                apic: Some((offset, _)),
            } => of_msr(msr::X2APIC_FIRST + u32::from(offset >> 4)),
            SvmExit::AvicIncompleteIpi { .. } => EventClass::VcpuIpi,
            SvmExit::Hlt => EventClass::Idle,
            SvmExit::Intr => {
                // Not acknowledged on exit: what the LAPIC holds is why.
                let v = self.m.lapics[core].deliverable();
                let timer_due = self.timer_due[vcpu].is_some_and(|d| d <= now);
                match v {
                    Some(v) if self.hv.vf_by_host_vector(core, v).is_some() => EventClass::Device,
                    Some(crate::hv::host::RESCHEDULE_VECTOR) => self
                        .event_exits
                        .as_ref()
                        .map_or(EventClass::Other, |x| x.kick[core]),
                    Some(crate::hv::host::HOST_TIMER_VECTOR) if timer_due => {
                        EventClass::TimerExpiry
                    }
                    _ => EventClass::Other,
                }
            }
            _ => EventClass::Other,
        }
    }

    /// #VMEXIT on `core` (with the vector an exiting EOI completes).
    pub(super) fn svm_exit(&mut self, core: usize, e: SvmExit, eoi_expect: Option<u8>) {
        let now = self.q.now();
        self.pause_guest(core);
        let CoreMode::Guest { vcpu } = self.m.cores[core].mode else {
            return;
        };
        self.account_guest_time(core, vcpu, now);
        self.m.cores[core].mode = CoreMode::Host { vcpu };
        self.exits[core] = Some(ExitState {
            vcpu,
            info: ArchExit::Svm(e),
            start: now,
            stage: Stage::Handler,
            timer_landed: false,
            record: true,
        });
        let vm = self.hv.vcpus[vcpu].vm;
        if self.event_exits.is_some() {
            let class = self.svm_exit_class(core, vcpu, e, now);
            if let Some(x) = &mut self.event_exits {
                x.exit(vm, class);
            }
        }
        let base = self.svm_exit_cost(vm, e);
        let (mut cx, scheme) = self.cx();
        let out = scheme.handle_svm_exit(&mut cx, vcpu, e);
        let charged = cx.charged;
        if let (Some(expected), Some(cleared)) = (eoi_expect, out.eoi_cleared) {
            self.checker.eoi(vcpu, expected, cleared, now);
        }
        if let SvmExit::Vmmcall { nr, arg } = e {
            self.canal_hypercall(vm, nr, arg);
        }
        self.start_segment(core, base + charged);
    }

    /// An SVM exit's accounting at the next VMRUN, by exit code.
    pub(super) fn svm_record_exit(&mut self, vcpu: usize, e: SvmExit, service: Time) {
        let v = &self.hv.vcpus[vcpu];
        let (vm, index) = (v.vm, v.index);
        let code = e.code().index();
        let st = &mut self.hv.vms[vm].svm_stats;
        st[0][code].record(service);
        if let Some(s) = st.get_mut(1 + index) {
            s[code].record(service);
        }
    }

    /// VMRUN with EVENTINJ valid: the event goes through the guest IDT.
    pub(super) fn svm_entry_event(&mut self, vcpu: usize) -> Option<u8> {
        let e = self.m.vmcb[vcpu].event_inj.take()?;
        Some(self.svm_gate(vcpu, e.vector))
    }

    /// Each VM's exits by SVM exit code.
    pub(super) fn svm_exit_tables(&self) -> crate::report::ExitTables {
        crate::report::ExitTables {
            names: SvmExitCode::ALL.iter().map(|c| c.name()).collect(),
            vms: self
                .hv
                .vms
                .iter()
                .map(|vm| vm.svm_stats[0].to_vec())
                .collect(),
            vcpus: self
                .hv
                .vms
                .iter()
                .map(|vm| vm.svm_stats[1..].iter().map(|s| s.to_vec()).collect())
                .collect(),
        }
    }
}
