//! The architecture seam. The generic world (event loop, cores and their
//! work segments, the host scheduler, devices' back ends) asks the
//! architecture's virtualization extension three things, here and nowhere
//! else:
//!
//! - what a core in guest mode must do about pending interrupts now
//!   ([`World::arch_pending`]): exit, deliver a vector through the guest's
//!   handlers, or nothing;
//! - how one of the guest kernel's arch-neutral operations executes
//!   ([`World::arch_op`]): the instruction it becomes and whether that
//!   traps;
//! - the exit -> handler -> entry path (`vm_exit`, `exit_stage_done`,
//!   `vm_entry`), whose stages the generic loop advances as segments end.
//!
//! x86 with VT-x is [`Arch::X86Vmx`], implemented in `world::vmx`; x86
//! with AMD SVM (the VMCB's intercepts, V_IRQ and EVENTINJ, AVIC and the
//! IOMMU's guest virtual APIC) is [`Arch::X86Svm`], in `world::svm`, which
//! shares the x86 host path (exit stages, entry, the LAPIC, the IOMMU);
//! ARM with EL2 (HCR_EL2 traps, the GIC's virtual CPU interface and list
//! registers, the generic timer) is [`Arch::ArmEl2`], implemented in the
//! sibling file `world::el2`. RISC-V with the H extension and the AIA
//! (IMSIC guest interrupt files, Sstc, the IOMMU's MSI page tables) is
//! [`Arch::RiscvHs`], in `world::hs`. Each architecture's own events and
//! paths (schedule-in and -out, a device's MSI, the end of a run) go
//! through the `arch_*` methods here, so the generic loop names none.

use super::World;
use crate::engine::Time;
use crate::guest::KernelOp;
use crate::hv::arm::ArmExit;
use crate::hv::exits::ExitInfo;
use crate::hv::riscv::RiscvExit;
use crate::hw::x86::iommu::Remapped;
use crate::hw::x86::vmcb::SvmExit;
use crate::report::trace::TraceKind;

/// The virtualization extension the platform runs guests with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arch {
    /// x86-64 with VT-x, x2APIC/xAPIC LAPICs and VT-d (`world::vmx`).
    X86Vmx,
    /// x86-64 with AMD SVM, AVIC and the AMD IOMMU (`world::svm`).
    X86Svm,
    /// AArch64 with EL2 and a GICv3/v4 (`world::el2`).
    ArmEl2,
    /// RV64 with the H extension, the AIA and a RISC-V IOMMU
    /// (`world::hs`).
    RiscvHs,
}

impl Arch {
    /// The x86 extension a scheme drives: AMD SVM or VT-x.
    pub(crate) fn x86(svm: bool) -> Arch {
        if svm {
            Arch::X86Svm
        } else {
            Arch::X86Vmx
        }
    }
}

/// What caused an exit, in the architecture's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArchExit {
    /// A VM exit with its VT-x exit information.
    Vmx(ExitInfo),
    /// An exception to EL2 with its class.
    El2(ArmExit),
    /// A #VMEXIT with its EXITCODE and EXITINFO.
    Svm(SvmExit),
    /// A trap from VS mode to HS mode, as `scause` reports it.
    Hs(RiscvExit),
}

impl ArchExit {
    /// The trace slice of the exit.
    pub(super) fn trace_kind(self) -> TraceKind {
        match self {
            ArchExit::Vmx(i) => TraceKind::Exit(i),
            ArchExit::Svm(e) => TraceKind::SvmExit(e),
            ArchExit::El2(e) => TraceKind::El2Exit(e),
            ArchExit::Hs(e) => TraceKind::HsExit(e),
        }
    }
}

/// What executing a kernel operation did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OpResult {
    /// It completed in guest mode: the guest goes on.
    Continue,
    /// The core idles in guest mode until an interrupt.
    Wait,
    /// It exits, with the vector an exiting EOI completes.
    Exit(ArchExit, Option<u8>),
}

impl World {
    /// What `core` must do now about pending events in guest mode: an exit
    /// (`Ok`), a delivery through the guest's handlers (`Err(vector)`), or
    /// nothing. `(k, c)` is the kernel and CPU the core runs
    /// ([`World::kcpu`] of [`World::kernel_of`]), which the caller has.
    #[inline(always)]
    pub(super) fn arch_pending(
        &mut self,
        core: usize,
        k: usize,
        c: usize,
    ) -> Option<Result<ArchExit, u8>> {
        match self.arch {
            Arch::X86Vmx => self
                .interrupt_decision(core, k, c)
                .map(|r| r.map(ArchExit::Vmx)),
            Arch::X86Svm => self.svm_pending(core, k, c),
            Arch::ArmEl2 => self.el2_pending(core),
            Arch::RiscvHs => self.hs_pending(core),
        }
    }

    /// Executes the kernel operation `op` of `vcpu` on `core`.
    #[inline]
    pub(super) fn arch_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        match self.arch {
            Arch::X86Vmx => self.vmx_op(core, vcpu, op),
            Arch::X86Svm => self.svm_op(core, vcpu, op),
            Arch::ArmEl2 => self.el2_op(core, vcpu, op),
            Arch::RiscvHs => self.hs_op(core, vcpu, op),
        }
    }

    /// The guest on `core` exits (with the vector an exiting EOI
    /// completes).
    pub(super) fn arch_exit(&mut self, core: usize, exit: ArchExit, eoi: Option<u8>) {
        match exit {
            ArchExit::Vmx(info) => self.vm_exit(core, info, eoi),
            ArchExit::Svm(e) => self.svm_exit(core, e, eoi),
            ArchExit::El2(e) => self.el2_exit(core, e),
            ArchExit::Hs(e) => self.hs_exit(core, e),
        }
    }

    /// A host-mode work segment on `core` ended: the exit path goes on.
    pub(super) fn arch_stage_done(&mut self, core: usize) {
        match self.arch {
            Arch::X86Vmx | Arch::X86Svm => self.exit_stage_done(core),
            Arch::ArmEl2 => self.el2_stage_done(core),
            Arch::RiscvHs => self.hs_stage_done(core),
        }
    }

    /// The x86 exit path is done: VM entry (VMRUN) on `core`.
    pub(super) fn arch_entry(&mut self, core: usize) {
        self.vm_entry(core);
    }

    /// An x86 exit's accounting when its vCPU enters again.
    pub(super) fn arch_record_exit(
        &mut self,
        vcpu: usize,
        exit: ArchExit,
        service: Time,
        timer_landed: bool,
    ) {
        match exit {
            ArchExit::Vmx(info) => self.vmx_record_exit(vcpu, info, service, timer_landed),
            ArchExit::Svm(e) => self.svm_record_exit(vcpu, e, service),
            ArchExit::El2(_) | ArchExit::Hs(_) => {}
        }
    }

    /// At x86 VM entry of `vcpu` on `core`: the event the entry injects,
    /// delivered through the guest's handlers (`Err(vector)`) or exiting
    /// again (`Ok`).
    pub(super) fn arch_entry_event(
        &mut self,
        core: usize,
        vcpu: usize,
    ) -> Option<Result<ArchExit, u8>> {
        match self.arch {
            Arch::X86Svm => self.svm_entry_event(vcpu).map(Err),
            Arch::ArmEl2 | Arch::RiscvHs => None,
            Arch::X86Vmx => self
                .vmx_entry_event(core, vcpu)
                .map(|r| r.map(ArchExit::Vmx)),
        }
    }

    /// A doorbell reached `core`.
    pub(super) fn arch_doorbell(&mut self, core: usize) {
        if self.arch == Arch::X86Svm {
            self.svm_doorbell(core);
        }
    }

    /// An MSI remapped through an entry format only one IOMMU has (the
    /// AMD IOMMU's GuestMode).
    pub(super) fn arch_remapped(&mut self, r: Remapped) {
        if let Remapped::GuestMode(ga) = r {
            self.svm_guest_mode_msi(ga);
        }
    }

    /// Each VM's exits by the architecture's own reasons.
    pub(super) fn arch_exit_tables(&self) -> crate::report::ExitTables {
        match self.arch {
            Arch::ArmEl2 => match &self.el2 {
                Some(a) => a.exit_tables(&self.hv.vms),
                None => crate::report::ExitTables::vmx(&self.hv.vms),
            },
            Arch::X86Svm => self.svm_exit_tables(),
            Arch::X86Vmx => crate::report::ExitTables::vmx(&self.hv.vms),
            Arch::RiscvHs => self.hs_exit_tables(),
        }
    }

    /// The end of a run: the architecture's own checks.
    pub(super) fn arch_finish(&mut self) {
        match self.arch {
            Arch::ArmEl2 => self.el2_finish(),
            Arch::RiscvHs => self.hs_finish(),
            Arch::X86Vmx | Arch::X86Svm => {}
        }
    }

    /// The host sends the vCPU on `core` a virtual interrupt (`host.ipi_per_s`)
    /// on ARM and RISC-V; x86's host IPI path is the scheme's. Returns
    /// whether the architecture took it.
    pub(super) fn arch_host_vipi(&mut self, core: usize) -> bool {
        match self.arch {
            Arch::ArmEl2 => self.el2_host_vipi(core),
            Arch::RiscvHs => self.hs_host_ipi(core),
            Arch::X86Vmx | Arch::X86Svm => return false,
        }
        true
    }

    /// Schedule-out of `vcpu`, in guest mode on `core` until now.
    pub(super) fn arch_put(&mut self, core: usize, vcpu: usize) {
        match self.arch {
            Arch::ArmEl2 => self.el2_put(core, vcpu),
            Arch::RiscvHs => self.hs_put(core, vcpu),
            Arch::X86Vmx | Arch::X86Svm => self.put(core, vcpu),
        }
    }

    /// Schedule-in of `vcpu` on ARM or RISC-V (true), or not the
    /// architecture's own (false: the x86 path).
    pub(super) fn arch_reschedule(&mut self, vcpu: usize) -> bool {
        match self.arch {
            Arch::ArmEl2 => self.el2_reschedule(vcpu),
            Arch::RiscvHs => self.hs_reschedule(vcpu),
            Arch::X86Vmx | Arch::X86Svm => return false,
        }
        true
    }

    /// VF `vf` fired its MSI-X `vector` on ARM (the ITS) or RISC-V (the
    /// IOMMU's MSI translation): true; false on x86 (the caller's
    /// interrupt-remapping path).
    pub(super) fn arch_device_msi(&mut self, vf: u16, vector: u8) -> bool {
        match self.arch {
            Arch::ArmEl2 => self.el2_device_msi(vf, vector),
            Arch::RiscvHs => self.hs_device_msi(vf, vector),
            Arch::X86Vmx | Arch::X86Svm => return false,
        }
        true
    }
}
