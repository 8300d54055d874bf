//! `kvm-riscv`: KVM RISC-V with the AIA in AUTO mode (Linux 6.x
//! arch/riscv/kvm/aia.c, aia_imsic.c, vcpu_timer.c, vcpu_sbi_*.c), read
//! for what it does and said in the project's words:
//!
//! * Each vCPU gets a guest interrupt file (a VS-file) on the hart it
//!   runs on, named by `hstatus.VGEIN`; the guest's `vstopei` claims and
//!   its IMSIC stores (IPIs) run without exits, because KVM maps the
//!   vCPU's guest IMSIC page onto that file in the G-stage.
//! * A vCPU that blocks in WFI (`hstatus.VTW` = 1: the WFI traps) enables
//!   its file's SGEI (`hgeie` bit g); the SGEI handler reads
//!   `hgeip & hgeie`, clears those bits and kicks the owners.
//! * Loaded on another hart, the file moves: a free file there is
//!   allocated and cleared, the G-stage page remapped, the old file read
//!   and cleared, its state ORed into the new one.
//! * AUTO mode: a hart with no free guest file gives the vCPU KVM's
//!   software file; `vstopei` then traps (VGEIN = 0) and is emulated, the
//!   guest page is unmapped so IPIs to it fault and are emulated, and KVM
//!   drives `hvip.VSEIP` from the software file.
//! * Timer: with Sstc (`henvcfg.STCE`) the guest writes `vstimecmp`
//!   itself and KVM only arms an hrtimer at it while the vCPU blocks;
//!   without it (`hv.sstc = false`, the older baseline) every programming
//!   is the SBI set_timer call and every expiry an hrtimer that sets
//!   `hvip.VSTIP`.
//! * The VF's MSIs reach the host (no IOMMU bypass upstream) and KVM's
//!   irqfd injects them into the vCPU's file.

use super::{
    ExitAction, FileHome, RiscvConfig, RiscvCx, RiscvExit, RiscvScheme, SbiCall, VirtInsn,
};
use crate::hw::riscv::gstage::GUEST_IMSIC_BASE;
use crate::hw::riscv::hart::irq;
use crate::hw::riscv::params::FILE_PAGE;

/// The `kvm-riscv` scheme.
pub struct KvmRiscv {
    cfg: RiscvConfig,
}

impl KvmRiscv {
    /// KVM RISC-V with `cfg`.
    pub fn new(cfg: RiscvConfig) -> Self {
        KvmRiscv { cfg }
    }
}

/// `kvm_riscv_vcpu_aia_imsic_update` on `hart`: the vCPU's file follows
/// it there, to a free guest file, else (AUTO) to the software file.
pub(super) fn imsic_update(cx: &mut RiscvCx, vcpu: usize, hart: usize, drop_pending: bool) {
    match cx.vcpus[vcpu].file {
        FileHome::Hw { hart: h, .. } if h == hart => {}
        cur => {
            let to = match cx.free_guest_file(hart) {
                Some(g) => FileHome::Hw { hart, g },
                None => FileHome::Sw,
            };
            if to != cur {
                cx.move_file(vcpu, to, drop_pending);
            } else if to == FileHome::Sw {
                // First run with no file free: the guest page stays
                // unmapped (its stores fault and are emulated).
                let (vm, index) = (cx.vcpus[vcpu].vm, cx.vcpus[vcpu].index);
                cx.m.gstage.map(vm, index, None);
            }
        }
    }
}

/// Clears (`on` false) or sets `vcpu`'s SGEI enable (kvm_riscv_aia_wakeon_hgei).
pub(super) fn wakeon_hgei(cx: &mut RiscvCx, vcpu: usize, on: bool) {
    if let FileHome::Hw { hart, g } = cx.vcpus[vcpu].file {
        let h = &mut cx.m.harts[hart];
        if on {
            h.hgeie |= 1 << g;
        } else {
            h.hgeie &= !(1 << g);
        }
    }
}

/// The SGEI handler (`hgei_interrupt`): the signalling files whose SGEI
/// is enabled are disabled again and their owners kicked.
pub(super) fn sgei(cx: &mut RiscvCx, hart: usize) {
    let mask = cx.m.harts[hart].sgei(cx.m.hgeip(hart));
    cx.m.harts[hart].hgeie &= !mask;
    let mut bits = mask;
    while bits != 0 {
        let g = bits.trailing_zeros() as usize;
        bits &= bits - 1;
        if let Some(v) = cx.owner_of(hart, g) {
            cx.kick(v);
        }
    }
}

/// KVM's exit handling shared by the AIA schemes (`kvm_riscv_vcpu_exit`):
/// WFI halts; a software file's claim is emulated; SBI timer and IPI
/// calls; a store to an unmapped guest IMSIC page is an emulated
/// `seteipnum`.
pub(super) fn handle_exit(cx: &mut RiscvCx, vcpu: usize, exit: RiscvExit) -> ExitAction {
    match exit {
        RiscvExit::VirtualInsn(VirtInsn::Wfi) => {
            cx.charge(cx.costs.insn_decode);
            return ExitAction::Halt;
        }
        RiscvExit::VirtualInsn(VirtInsn::StopeiClaim) => {
            cx.charge(cx.costs.insn_decode + cx.costs.swfile_emulate);
            let id = cx.file(vcpu).claim();
            cx.vcpus[vcpu].claimed = id;
            let on = cx.file_signals(vcpu);
            if !on {
                cx.retract(vcpu, irq::VSEI);
            }
        }
        RiscvExit::VirtualInsn(VirtInsn::Stimecmp { value }) => {
            cx.charge(cx.costs.insn_decode);
            set_timer(cx, vcpu, value);
        }
        RiscvExit::Sbi(SbiCall::SetTimer { stime }) => {
            cx.charge(cx.costs.sbi_call);
            set_timer(cx, vcpu, stime);
        }
        RiscvExit::Sbi(SbiCall::SendIpi { mask }) => {
            cx.charge(cx.costs.sbi_call);
            let vm = cx.vcpus[vcpu].vm;
            let mut m = mask;
            while m != 0 {
                let i = m.trailing_zeros() as usize;
                m &= m - 1;
                if let Some(t) = cx.vcpu_of(vm, i) {
                    cx.inject(t, irq::VSSI);
                }
            }
        }
        RiscvExit::GuestPageFault { store, gpa, data } => {
            cx.charge(cx.costs.mmio_emulate);
            let vm = cx.vcpus[vcpu].vm;
            if let Some(off) = gpa.checked_sub(GUEST_IMSIC_BASE) {
                let index = (off / FILE_PAGE) as usize;
                if let (true, Some(t)) = (store, cx.vcpu_of(vm, index)) {
                    cx.charge(cx.costs.swfile_emulate);
                    cx.imsic_inject(t, data);
                }
            }
        }
        RiscvExit::Interrupt { .. } => {}
    }
    ExitAction::Resume
}

/// The SBI timer (kvm_riscv_vcpu_timer_next_event): VSTIP cleared, the
/// hrtimer armed at `stime`.
fn set_timer(cx: &mut RiscvCx, vcpu: usize, stime: u64) {
    cx.retract(vcpu, irq::VSTI);
    cx.vcpus[vcpu].timer = (stime != u64::MAX).then_some(stime);
}

/// Before entry: a software file's signal becomes `hvip.VSEIP`
/// (imsic_swfile_extirq_update).
pub(super) fn flush_swfile(cx: &mut RiscvCx, vcpu: usize) {
    if cx.vcpus[vcpu].file == FileHome::Sw && cx.vcpus[vcpu].hart.is_some() {
        let on = cx.file_signals(vcpu);
        if on {
            cx.inject(vcpu, irq::VSEI);
            *cx.kicks &= !(1 << vcpu);
        } else {
            cx.retract(vcpu, irq::VSEI);
        }
    }
}

impl RiscvScheme for KvmRiscv {
    fn name(&self) -> &'static str {
        "kvm-riscv"
    }

    fn setup_vm(&mut self, _cx: &mut RiscvCx, _vm: usize, _vf: Option<usize>) {
        // The VF's MSI translation stays off: its MSIs are the host's.
    }

    fn vcpu_load(&mut self, cx: &mut RiscvCx, vcpu: usize, hart: usize) {
        imsic_update(cx, vcpu, hart, self.cfg.migrate_drop_pending);
        wakeon_hgei(cx, vcpu, false);
        cx.load_csrs(vcpu, hart, self.sstc(), true);
        if self.sstc() {
            // kvm_riscv_vcpu_timer_unblocking: the hardware compares again.
            cx.vcpus[vcpu].timer = None;
        }
    }

    fn vcpu_put(&mut self, cx: &mut RiscvCx, vcpu: usize, blocking: bool) {
        cx.save_csrs(vcpu);
        if blocking {
            wakeon_hgei(cx, vcpu, true);
            if self.sstc() {
                // kvm_riscv_vcpu_timer_blocking: an hrtimer at vstimecmp.
                let cmp = cx.vcpus[vcpu].saved.vstimecmp;
                cx.vcpus[vcpu].timer = (cmp != u64::MAX).then_some(cmp);
            }
        }
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

    fn flush(&mut self, cx: &mut RiscvCx, vcpu: usize) {
        flush_swfile(cx, vcpu);
    }

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
}
