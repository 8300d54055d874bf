//! The schemes' mechanisms against the hardware, one rule each.

use super::kvm_riscv_sw::plic_claim_complete;
use super::*;
use crate::hw::riscv::gstage::GStage;
use crate::hw::riscv::hart::{VsCsr, VsOutcome};
use crate::hw::riscv::imsic::ISELECT_EIDELIVERY;
use crate::hw::riscv::params::AiaParams;

struct Rig {
    m: RiscvMachine,
    vcpus: Vec<RiscvVcpu>,
    costs: RiscvCosts,
    kicks: u64,
    now: u64,
}

impl Rig {
    /// `harts` harts with `geilen` guest files each; one VM of `n` vCPUs
    /// with a VF (IOMMU device 0).
    fn new(harts: usize, geilen: usize, n: usize) -> Rig {
        let m = RiscvMachine::new(AiaParams::new(harts, geilen), 1, &[n]).unwrap();
        let ids = m.params.ids;
        Rig {
            m,
            vcpus: (0..n).map(|i| RiscvVcpu::new(0, i, ids)).collect(),
            costs: RiscvCosts {
                vsfile_move: 1,
                ..Default::default()
            },
            kicks: 0,
            now: 0,
        }
    }

    fn cx(&mut self) -> RiscvCx<'_> {
        RiscvCx {
            now: self.now,
            m: &mut self.m,
            vcpus: &mut self.vcpus,
            costs: &self.costs,
            kicks: &mut self.kicks,
            charged: 0,
        }
    }

    /// The guest's IMSIC driver on `vcpu`: delivery on, identities 1..=8
    /// enabled (through `vsireg`, or trapped and emulated: the state is
    /// the same).
    fn guest_boot(&mut self, vcpu: usize) {
        let mut cx = self.cx();
        let f = cx.file(vcpu);
        f.write_ireg(ISELECT_EIDELIVERY, 1).unwrap();
        for id in 1..=8 {
            f.set_enabled(id, true);
        }
        // And its `sie`: external, software and timer interrupts on.
        match self.vcpus[vcpu].hart {
            Some(h) => self.m.harts[h].vsie = crate::hw::riscv::hart::VS_BITS,
            None => self.vcpus[vcpu].saved.vsie = crate::hw::riscv::hart::VS_BITS,
        }
    }

    fn hgeip(&self, hart: usize) -> u64 {
        self.m.hgeip(hart)
    }
}

fn kvm(cfg: RiscvConfig) -> Box<dyn RiscvScheme> {
    by_name("kvm-riscv", cfg).unwrap()
}

#[test]
fn kvm_riscv_gives_a_loaded_vcpu_a_guest_file_and_ipis_land_without_exits() {
    let mut r = Rig::new(2, 2, 2);
    let mut s = kvm(RiscvConfig::default());
    s.vcpu_load(&mut r.cx(), 0, 0);
    s.vcpu_load(&mut r.cx(), 1, 1);
    r.guest_boot(0);
    r.guest_boot(1);
    assert_eq!(r.vcpus[0].file, FileHome::Hw { hart: 0, g: 1 });
    assert_eq!(r.m.harts[0].vgein(), 1);
    assert_eq!(r.m.harts[0].vs_csr(VsCsr::Stopei), VsOutcome::Executes);
    assert!(r.m.harts[0].vtw(), "KVM traps WFI");
    // vCPU 1 IPIs vCPU 0: a store to vCPU 0's guest IMSIC page.
    let landed = r.cx().guest_store(0, GStage::guest_page(0), 3);
    assert_eq!(
        landed,
        Ok(Landed::File {
            hart: 0,
            file: 1,
            set: true
        })
    );
    assert_eq!(
        r.m.harts[0].vs_interrupt(r.hgeip(0), 0, true),
        Some(irq::VSEI)
    );
    assert_eq!(r.m.imsics[0].guest_mut(1).unwrap().claim(), 3);
}

#[test]
fn a_blocked_vcpu_is_woken_by_its_files_sgei_once() {
    let mut r = Rig::new(1, 2, 1);
    let mut s = kvm(RiscvConfig::default());
    s.vcpu_load(&mut r.cx(), 0, 0);
    r.guest_boot(0);
    s.vcpu_put(&mut r.cx(), 0, true);
    assert_eq!(r.m.harts[0].hgeie, 1 << 1, "wake on its file's SGEI");
    assert!(!s.has_pending(&r.cx(), 0));
    s.device_msi(&mut r.cx(), 0, 5);
    r.kicks = 0;
    assert_eq!(r.m.harts[0].sgei(r.hgeip(0)), 1 << 1);
    s.host_irq(&mut r.cx(), 0, irq::SGEI);
    assert_eq!(r.kicks, 1, "the owner is kicked");
    assert_eq!(r.m.harts[0].hgeie, 0, "and its SGEI disabled");
    assert!(s.has_pending(&r.cx(), 0));
    s.vcpu_load(&mut r.cx(), 0, 0);
    assert_eq!(
        r.m.harts[0].vs_interrupt(r.hgeip(0), 0, true),
        Some(irq::VSEI)
    );
}

fn migrate(drop_pending: bool) -> (Rig, Box<dyn RiscvScheme>) {
    let mut r = Rig::new(2, 1, 1);
    let mut s = kvm(RiscvConfig {
        migrate_drop_pending: drop_pending,
        ..Default::default()
    });
    s.vcpu_load(&mut r.cx(), 0, 0);
    r.guest_boot(0);
    s.vcpu_put(&mut r.cx(), 0, false);
    // An interrupt arrives while it waits for a hart.
    s.device_msi(&mut r.cx(), 0, 6);
    s.vcpu_load(&mut r.cx(), 0, 1);
    (r, s)
}

#[test]
fn migration_moves_the_file_and_ors_in_the_old_pending_bits() {
    let (mut r, s) = migrate(false);
    assert_eq!(r.vcpus[0].file, FileHome::Hw { hart: 1, g: 1 });
    assert_eq!(r.m.harts[1].vgein(), 1);
    assert!(
        r.m.imsics[0].guest(1).unwrap().topei() == 0,
        "old file clear"
    );
    assert_eq!(r.cx().free_guest_file(0), Some(1), "and free");
    assert_eq!(
        r.m.gstage.translate(0, GStage::guest_page(0)),
        Some((0, Some(r.m.params.file_address(1, 1)))),
        "the guest page follows"
    );
    assert!(s.has_pending(&r.cx(), 0));
    assert_eq!(r.m.imsics[1].guest_mut(1).unwrap().claim(), 6);
}

#[test]
fn a_migration_that_drops_pending_bits_loses_the_interrupt() {
    let (mut r, s) = migrate(true);
    assert!(
        !s.has_pending(&r.cx(), 0),
        "identity 6 is gone: the explorer's lost interrupt"
    );
}

#[test]
fn auto_mode_falls_back_to_the_software_file_when_the_hart_has_none_free() {
    let mut r = Rig::new(1, 1, 2);
    let mut s = kvm(RiscvConfig::default());
    s.vcpu_load(&mut r.cx(), 0, 0);
    r.guest_boot(0);
    s.vcpu_put(&mut r.cx(), 0, false);
    s.vcpu_load(&mut r.cx(), 1, 0);
    r.guest_boot(1);
    assert_eq!(r.vcpus[1].file, FileHome::Sw);
    assert_eq!(r.m.harts[0].vgein(), 0);
    assert_eq!(
        r.m.harts[0].vs_csr(VsCsr::Stopei),
        VsOutcome::VirtualInstruction,
        "its claims trap"
    );
    // vCPU 1 IPIs itself... no: vCPU 0 (off its hart) is IPI'd by vCPU 1
    // through the mapped page, and vCPU 1 by itself through its unmapped
    // one, which faults and is emulated.
    let fault = r.cx().guest_store(0, GStage::guest_page(1), 4).unwrap_err();
    assert_eq!(s.handle_exit(&mut r.cx(), 1, fault), ExitAction::Resume);
    assert!(r.vcpus[1].swfile.pending(4));
    s.flush(&mut r.cx(), 1);
    assert_eq!(
        r.m.harts[0].vs_interrupt(r.hgeip(0), 0, true),
        Some(irq::VSEI),
        "hvip.VSEIP from the software file"
    );
    let claim = RiscvExit::VirtualInsn(VirtInsn::StopeiClaim);
    s.handle_exit(&mut r.cx(), 1, claim);
    assert_eq!(r.vcpus[1].claimed, 4);
    assert_eq!(r.m.harts[0].vs_interrupt(r.hgeip(0), 0, true), None);
}

#[test]
fn without_sstc_the_timer_is_an_sbi_call_and_an_hrtimer() {
    let mut r = Rig::new(1, 1, 1);
    let mut s = kvm(RiscvConfig {
        no_sstc: true,
        ..Default::default()
    });
    s.vcpu_load(&mut r.cx(), 0, 0);
    r.guest_boot(0);
    assert_eq!(
        r.m.harts[0].vs_csr(VsCsr::Stimecmp),
        VsOutcome::VirtualInstruction
    );
    let set = RiscvExit::Sbi(SbiCall::SetTimer { stime: 100 });
    s.handle_exit(&mut r.cx(), 0, set);
    assert_eq!(r.vcpus[0].timer, Some(100));
    s.timer_fired(&mut r.cx(), 0);
    assert_eq!(r.m.harts[0].vs_interrupt(0, 0, true), Some(irq::VSTI));
    s.handle_exit(&mut r.cx(), 0, set);
    assert_eq!(r.m.harts[0].vs_interrupt(0, 0, true), None, "rearm clears");
}

#[test]
fn with_sstc_a_blocked_vcpus_vstimecmp_becomes_an_hrtimer() {
    let mut r = Rig::new(1, 1, 1);
    let mut s = kvm(RiscvConfig::default());
    s.vcpu_load(&mut r.cx(), 0, 0);
    r.guest_boot(0);
    assert_eq!(r.m.harts[0].vs_csr(VsCsr::Stimecmp), VsOutcome::Executes);
    r.m.harts[0].vstimecmp = 500;
    s.vcpu_put(&mut r.cx(), 0, true);
    assert_eq!(r.vcpus[0].timer, Some(500));
    r.now = 499;
    assert!(!s.has_pending(&r.cx(), 0));
    r.now = 500;
    assert!(s.has_pending(&r.cx(), 0));
}

#[test]
fn kvm_riscv_sw_claims_and_completes_through_mmio_exits() {
    let mut r = Rig::new(2, 1, 2);
    let mut s = by_name("kvm-riscv-sw", RiscvConfig::default()).unwrap();
    s.setup_vm(&mut r.cx(), 0, Some(0));
    s.vcpu_load(&mut r.cx(), 0, 0);
    s.vcpu_load(&mut r.cx(), 1, 1);
    r.guest_boot(0);
    r.guest_boot(1);
    assert_eq!(r.m.harts[0].vgein(), 0, "no guest file");
    s.device_msi(&mut r.cx(), 0, 2);
    assert_eq!(
        r.m.harts[0].vs_interrupt(0, 0, true),
        Some(irq::VSEI),
        "the PLIC's line, by hvip"
    );
    let claim = RiscvExit::GuestPageFault {
        store: false,
        gpa: plic_claim_complete(0),
        data: 0,
    };
    s.handle_exit(&mut r.cx(), 0, claim);
    assert_eq!(r.vcpus[0].claimed, 2);
    assert_eq!(r.m.harts[0].vs_interrupt(0, 0, true), None);
    // The IPI is an SBI call that sets the target's VSSIP.
    let ipi = RiscvExit::Sbi(SbiCall::SendIpi { mask: 1 << 1 });
    r.kicks = 0;
    s.handle_exit(&mut r.cx(), 0, ipi);
    assert_eq!(r.kicks, 1 << 1);
    assert_eq!(r.m.harts[1].vs_interrupt(0, 0, true), Some(irq::VSSI));
}

#[test]
fn did_riscv_posts_the_vfs_msi_into_the_guest_file_and_leaves_wfi_in_the_guest() {
    let mut r = Rig::new(2, 1, 2);
    let mut s = by_name("did-riscv", RiscvConfig::default()).unwrap();
    s.setup_vm(&mut r.cx(), 0, Some(0));
    s.vcpu_load(&mut r.cx(), 0, 0);
    s.vcpu_load(&mut r.cx(), 1, 1);
    r.guest_boot(1);
    assert!(!r.m.harts[1].vtw());
    assert!(r.m.harts[1].stce());
    // The VF writes vCPU 1's guest MSI address: the IOMMU's flat PTE takes
    // it to hart 1's guest file 1, with no host code.
    let (_, landed) = r.m.device_msi(0, GStage::guest_page(1), 7);
    assert_eq!(
        landed,
        Landed::File {
            hart: 1,
            file: 1,
            set: true
        }
    );
    assert_eq!(
        r.m.harts[1].vs_interrupt(r.hgeip(1), 0, true),
        Some(irq::VSEI)
    );
    assert_eq!(r.kicks, 0, "no kick, no exit");
}
