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
//! x86 with VT-x is [`Arch::X86Vmx`], implemented in `world::vmx`; ARM
//! with EL2 (HCR_EL2 traps, the GIC's virtual CPU interface and list
//! registers, the generic timer) is [`Arch::ArmEl2`], implemented in the
//! sibling file `world::el2`.

use super::World;
use crate::guest::KernelOp;
use crate::hv::arm::ArmExit;
use crate::hv::exits::ExitInfo;

/// The virtualization extension the platform runs guests with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Arch {
    /// x86-64 with VT-x, x2APIC/xAPIC LAPICs and VT-d (`world::vmx`).
    X86Vmx,
    /// AArch64 with EL2 and a GICv3/v4 (`world::el2`).
    ArmEl2,
}

/// What caused an exit, in the architecture's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ArchExit {
    /// A VM exit with its VT-x exit information.
    Vmx(ExitInfo),
    /// An exception to EL2 with its class.
    El2(ArmExit),
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
            Arch::ArmEl2 => self.el2_pending(core),
        }
    }

    /// Executes the kernel operation `op` of `vcpu` on `core`.
    #[inline]
    pub(super) fn arch_op(&mut self, core: usize, vcpu: usize, op: KernelOp) -> OpResult {
        match self.arch {
            Arch::X86Vmx => self.vmx_op(core, vcpu, op),
            Arch::ArmEl2 => self.el2_op(core, vcpu, op),
        }
    }

    /// The guest on `core` exits (with the vector an exiting EOI
    /// completes).
    pub(super) fn arch_exit(&mut self, core: usize, exit: ArchExit, eoi: Option<u8>) {
        match exit {
            ArchExit::Vmx(info) => self.vm_exit(core, info, eoi),
            ArchExit::El2(e) => self.el2_exit(core, e),
        }
    }

    /// A host-mode work segment on `core` ended: the exit path goes on.
    pub(super) fn arch_stage_done(&mut self, core: usize) {
        match self.arch {
            Arch::X86Vmx => self.exit_stage_done(core),
            Arch::ArmEl2 => self.el2_stage_done(core),
        }
    }
}
