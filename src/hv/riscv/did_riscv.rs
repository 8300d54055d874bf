//! `did-riscv`: DID (VEE '15) on RISC-V with the AIA. Each step is the
//! RISC-V control that corresponds to x86 DID's (docs/riscv.md argues
//! each and its correctness condition):
//!
//! * Dedicated harts: each vCPU runs alone on its hart, and its guest
//!   interrupt file there is allocated once and never moves (the build
//!   refuses shared or floating harts), so `hstatus.VGEIN` always names
//!   it while the vCPU runs.
//! * Direct device interrupts: the VF's MSI page table entry in the RISC-V
//!   IOMMU translates (flat mode) the guest's MSI address for vCPU `i` to
//!   that vCPU's guest file, as the RFC "iommu/riscv: Add guest file
//!   irqbypass support" (2024–25) proposes; the guest claims through
//!   `vstopei`: no exit, no EOI (the IMSIC has none).
//! * Direct timer: Sstc (`henvcfg.STCE`): the guest's `vstimecmp` raises
//!   VSTIP in VS mode.
//! * Direct IPIs: every sibling's guest IMSIC page is mapped in the
//!   G-stage onto its guest file, so an IPI is a store that lands in the
//!   target's file (DID §4.3's "every virtual interrupt is a real IPI").
//! * Idle: `hstatus.VTW` = 0: WFI waits in VS mode until any interrupt for
//!   the hart; the guest file's signal wakes it.
//! * Host traffic to a guest hart arrives in the S file (SEI) or as the
//!   host's timer (STI), which trap to HS mode whatever the guest does:
//!   the only exits left.

use super::kvm_riscv::{handle_exit, imsic_update, sgei, wakeon_hgei};
use super::{ExitAction, FileHome, RiscvCx, RiscvExit, RiscvScheme};
use crate::hw::riscv::gstage::GUEST_IMSIC_BASE;
use crate::hw::riscv::hart::irq;
use crate::hw::riscv::iommu::{MsiContext, MsiPte};

/// The `did-riscv` scheme.
#[derive(Default)]
pub struct DidRiscv {
    /// Per VM: its VF's IOMMU device context.
    vf: Vec<Option<usize>>,
}

impl DidRiscv {
    /// DID on RISC-V.
    pub fn new() -> Self {
        DidRiscv::default()
    }
}

impl RiscvScheme for DidRiscv {
    fn name(&self) -> &'static str {
        "did-riscv"
    }

    fn setup_vm(&mut self, cx: &mut RiscvCx, vm: usize, vf: Option<usize>) {
        if self.vf.len() <= vm {
            self.vf.resize(vm + 1, None);
        }
        self.vf[vm] = vf;
        let Some(dev) = vf else { return };
        let n = cx.vcpus.iter().filter(|v| v.vm == vm).count().max(1);
        // The guest's IMSIC window: vCPU i at page i; the mask selects
        // the index bits (a power of two of pages).
        let bits = usize::BITS - (n - 1).leading_zeros();
        if let Some(c) = cx.m.iommu.contexts.get_mut(dev) {
            *c = MsiContext {
                enabled: true,
                mask: (1u64 << bits) - 1,
                pattern: GUEST_IMSIC_BASE >> 12,
                table: vec![MsiPte::Invalid; 1 << bits],
            };
        }
    }

    fn vcpu_load(&mut self, cx: &mut RiscvCx, vcpu: usize, hart: usize) {
        imsic_update(cx, vcpu, hart, false);
        wakeon_hgei(cx, vcpu, false);
        cx.load_csrs(vcpu, hart, true, false);
        cx.vcpus[vcpu].timer = None;
        // The VF's MSI PTE follows the file (the RFC's irqbypass update).
        let (vm, index) = (cx.vcpus[vcpu].vm, cx.vcpus[vcpu].index);
        let pte = match cx.vcpus[vcpu].file {
            FileHome::Hw { hart, g } => MsiPte::Flat {
                addr: cx.m.params.file_address(hart, g),
            },
            FileHome::Sw => MsiPte::Invalid,
        };
        if let Some(dev) = self.vf.get(vm).copied().flatten() {
            if let Some(e) = cx.m.iommu.contexts[dev].table.get_mut(index) {
                *e = pte;
            }
        }
    }

    fn vcpu_put(&mut self, cx: &mut RiscvCx, vcpu: usize, blocking: bool) {
        // A host thread took the hart for a while: the file stays, its
        // SGEI brings the vCPU back; its timer becomes an hrtimer.
        cx.save_csrs(vcpu);
        wakeon_hgei(cx, vcpu, true);
        let cmp = cx.vcpus[vcpu].saved.vstimecmp;
        cx.vcpus[vcpu].timer = (cmp != u64::MAX).then_some(cmp);
        cx.vcpus[vcpu].blocked = blocking;
    }

    fn handle_exit(&mut self, cx: &mut RiscvCx, vcpu: usize, exit: RiscvExit) -> ExitAction {
        handle_exit(cx, vcpu, exit)
    }

    fn host_irq(&mut self, cx: &mut RiscvCx, hart: usize, irq_no: u32) {
        cx.charge(cx.costs.host_irq);
        if irq_no == irq::SGEI {
            sgei(cx, hart);
        }
    }

    fn device_msi(&mut self, cx: &mut RiscvCx, vcpu: usize, eiid: u32) {
        cx.imsic_inject(vcpu, eiid);
        cx.kick(vcpu);
    }

    fn flush(&mut self, _cx: &mut RiscvCx, _vcpu: usize) {}

    fn timer_fired(&mut self, cx: &mut RiscvCx, vcpu: usize) {
        cx.vcpus[vcpu].timer = None;
        cx.kick(vcpu);
    }

    fn has_pending(&self, cx: &RiscvCx, vcpu: usize) -> bool {
        cx.vcpu_runnable(vcpu, true)
    }

    fn sstc(&self) -> bool {
        true
    }
}
