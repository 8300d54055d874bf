//! `kvm-riscv-sw`: KVM RISC-V without the AIA (QEMU `virt` with
//! `aia=none`): the guest's interrupt controller is a PLIC the VMM
//! emulates, so every claim (a load of the context's claim/complete
//! register) and every completion (a store to it) is an MMIO exit; KVM
//! injects the external interrupt by `hvip.VSEIP`, IPIs are SBI calls
//! that set `hvip.VSSIP`, WFI traps (VTW). The PLIC context's pending and
//! enable bits are kept in the vCPU's software file (its identities are
//! the PLIC's sources; the lower number wins, as in the IMSIC).

use super::kvm_riscv::handle_exit as kvm_handle_exit;
use super::{ExitAction, FileHome, GuestIrqchip, RiscvConfig, RiscvCx, RiscvExit, RiscvScheme};
use crate::hw::riscv::hart::irq;

/// The guest's PLIC (QEMU `virt`: 0x0c00_0000).
pub const PLIC_BASE: u64 = 0x0c00_0000;

/// The claim/complete register of PLIC context `ctx` (PLIC spec §7:
/// 0x20_0004 + 0x1000 × context); a vCPU's S-mode context is `2 × index
/// + 1` on QEMU `virt`.
pub fn plic_claim_complete(index: usize) -> u64 {
    PLIC_BASE + 0x20_0004 + 0x1000 * (2 * index as u64 + 1)
}

/// The `kvm-riscv-sw` scheme.
pub struct KvmRiscvSw {
    cfg: RiscvConfig,
}

impl KvmRiscvSw {
    /// KVM RISC-V with an emulated PLIC, with `cfg`.
    pub fn new(cfg: RiscvConfig) -> Self {
        KvmRiscvSw { cfg }
    }

    /// The vCPU whose PLIC context `gpa` is the claim/complete register of.
    fn plic_context(cx: &RiscvCx, vcpu: usize, gpa: u64) -> bool {
        gpa == plic_claim_complete(cx.vcpus[vcpu].index)
    }

    /// The PLIC's output for `vcpu`: `hvip.VSEIP` while something is
    /// pending and enabled (KVM_INTERRUPT from the VMM).
    fn update_line(cx: &mut RiscvCx, vcpu: usize) {
        if cx.vcpus[vcpu].swfile.signals() {
            cx.inject(vcpu, irq::VSEI);
        } else {
            cx.retract(vcpu, irq::VSEI);
        }
    }
}

impl RiscvScheme for KvmRiscvSw {
    fn name(&self) -> &'static str {
        "kvm-riscv-sw"
    }

    fn setup_vm(&mut self, cx: &mut RiscvCx, vm: usize, _vf: Option<usize>) {
        for v in cx.vcpus.iter_mut().filter(|v| v.vm == vm) {
            v.file = FileHome::Sw;
        }
    }

    fn vcpu_load(&mut self, cx: &mut RiscvCx, vcpu: usize, hart: usize) {
        cx.load_csrs(vcpu, hart, self.sstc(), true);
        if self.sstc() {
            cx.vcpus[vcpu].timer = None;
        }
    }

    fn vcpu_put(&mut self, cx: &mut RiscvCx, vcpu: usize, blocking: bool) {
        cx.save_csrs(vcpu);
        if blocking && self.sstc() {
            let cmp = cx.vcpus[vcpu].saved.vstimecmp;
            cx.vcpus[vcpu].timer = (cmp != u64::MAX).then_some(cmp);
        }
        cx.vcpus[vcpu].blocked = blocking;
    }

    fn handle_exit(&mut self, cx: &mut RiscvCx, vcpu: usize, exit: RiscvExit) -> ExitAction {
        match exit {
            RiscvExit::GuestPageFault { store, gpa, .. } if Self::plic_context(cx, vcpu, gpa) => {
                cx.charge(cx.costs.mmio_emulate + cx.costs.plic_emulate);
                if !store {
                    // The claim: the highest pending source, now in service.
                    let id = cx.vcpus[vcpu].swfile.claim();
                    cx.vcpus[vcpu].claimed = id;
                }
                Self::update_line(cx, vcpu);
                *cx.kicks &= !(1 << vcpu);
                ExitAction::Resume
            }
            other => kvm_handle_exit(cx, vcpu, other),
        }
    }

    fn host_irq(&mut self, cx: &mut RiscvCx, _hart: usize, _irq: u32) {
        cx.charge(cx.costs.host_irq);
    }

    fn device_msi(&mut self, cx: &mut RiscvCx, vcpu: usize, eiid: u32) {
        cx.vcpus[vcpu].swfile.setipnum(eiid);
        Self::update_line(cx, vcpu);
    }

    fn flush(&mut self, _cx: &mut RiscvCx, _vcpu: usize) {}

    fn timer_fired(&mut self, cx: &mut RiscvCx, vcpu: usize) {
        cx.vcpus[vcpu].timer = None;
        if self.sstc() {
            cx.kick(vcpu);
        } else {
            cx.inject(vcpu, irq::VSTI);
        }
    }

    fn has_pending(&self, cx: &RiscvCx, vcpu: usize) -> bool {
        cx.vcpu_runnable(vcpu, self.sstc())
    }

    fn sstc(&self) -> bool {
        !self.cfg.no_sstc
    }

    fn guest_irqchip(&self) -> GuestIrqchip {
        GuestIrqchip::Plic
    }
}
