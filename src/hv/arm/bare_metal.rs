//! `bare-metal` on ARM: the same guest kernel on the board with no
//! hypervisor (did-arm.md §4: the proposal's reference runs). Nothing is
//! loaded at EL2 that traps: HCR_EL2 has neither IMO nor FMO (the kernel
//! takes its physical IRQs and FIQs itself through its core's CPU
//! interface), nor TWI/TWE (WFI idles the core), nor stage 2 (no VM). The
//! kernel's timer is the EL1 virtual timer on PPI 27 (arm64 Linux uses it
//! whenever it is available, at EL1 or, with VHE, at EL2), its NIC's
//! interrupt is a physical LPI (a VF, MSI through the ITS) or SPI (a NIC on
//! its wire) aimed at its core, and its IPIs are real SGIs. No exit can
//! happen; a test asserts that none does.
//!
//! The platform (`world::el2`) runs the kernel exactly as it runs a guest
//! whose EL2 controls trap nothing: the same code, costs and cores, so a
//! bare-metal row against a VM row differs only by what the hypervisor
//! adds.

use super::intids::{nic_spi, VF_VLPI};
use super::{vtimer_write, ArmCx, ArmExit, ArmScheme, ExitAction};
use crate::engine::Time;
use crate::hw::arm::cpu_interface::CTLR_EOIMODE;
use crate::hw::arm::distributor::Route;
use crate::hw::arm::el2::{El2Controls, HcrEl2};
use crate::hw::arm::params::GicParams;
use crate::hw::arm::timer::CntReg;

/// The ARM `bare-metal` scheme.
pub struct BareMetalArm;

impl BareMetalArm {
    /// EL2 with nothing trapped and no VM: HCR_EL2 = E2H only (a VHE
    /// kernel's EL2 with TGE clear for the measured code's EL1 view: the
    /// model's kernel runs at EL1; E2H only says no split-mode lowvisor).
    pub fn controls() -> El2Controls {
        El2Controls {
            hcr: HcrEl2 {
                e2h: true,
                ..HcrEl2::default()
            },
            emulated_distributor: false,
        }
    }
}

impl ArmScheme for BareMetalArm {
    fn name(&self) -> &'static str {
        "bare-metal"
    }

    fn gic(&self, cores: usize, _vcpus: usize) -> GicParams {
        GicParams::gicv3(cores)
    }

    fn el2(&self) -> El2Controls {
        Self::controls()
    }

    /// The native kernel's IRQ setup: its NIC's MSI is a physical LPI in
    /// the collection of the core that runs its driver's interrupt (the
    /// ITS mapping Linux's its_irq_domain makes), a wired NIC's SPI is
    /// routed there (GICD_IROUTER), each CPU's MPIDR is its core's.
    fn setup_vm(&mut self, cx: &mut ArmCx, vm: usize) {
        for i in 0..cx.hv.vms[vm].vcpus.len() {
            let v = cx.hv.vms[vm].vcpus[i];
            cx.vcpus[v].vmpidr_core = cx.hv.vcpus[v].core;
            cx.vcpus[v].vpeid = v as u16;
        }
        super::kvm_arm::map_vf_to_lpi(cx, vm, VF_VLPI);
        let spi = nic_spi(vm);
        if cx.m.dist.bank().is_enabled(spi) {
            let core = cx.hv.vcpus[cx.hv.device_home(vm)].core;
            let aff = cx.m.params.topology.affinity(core);
            let _ = cx.m.dist.set_route(spi, Route::Affinity(aff));
        }
    }

    /// The kernel boots on its core: EOImode 0 (Linux without KVM: one
    /// EOIR write drops the priority and deactivates) and its timer.
    fn vcpu_load(&mut self, cx: &mut ArmCx, vcpu: usize) {
        cx.hv.vcpus[vcpu].loaded = true;
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.el2[core] = Self::controls();
        let ctlr = cx.m.cpus[core].read_ctlr() & !CTLR_EOIMODE;
        let _ = cx.m.cpus[core].write_ctlr(ctlr);
        let (ctl, cval) = cx.vcpus[vcpu].saved_timer;
        let now = cx.now;
        vtimer_write(cx.m, cx.q, core, CntReg::VCval, cval, now);
        vtimer_write(cx.m, cx.q, core, CntReg::VCtl, ctl, now);
    }

    /// Never called: a native kernel's thread is never scheduled out by a
    /// hypervisor (the build refuses what would ask for it).
    fn vcpu_put(&mut self, cx: &mut ArmCx, vcpu: usize, _blocking: bool) {
        cx.hv.vcpus[vcpu].loaded = false;
    }

    /// Never called: nothing traps.
    fn handle_exit(&mut self, _cx: &mut ArmCx, _vcpu: usize, _exit: ArmExit) -> ExitAction {
        ExitAction::Resume
    }

    /// Never called with a kernel on the core (it takes its own IRQs); an
    /// idle core with no kernel takes nothing it was sent.
    fn host_irq(&mut self, _cx: &mut ArmCx, _core: usize, _intid: u32) -> bool {
        false
    }

    fn flush(&mut self, _cx: &mut ArmCx, _vcpu: usize) {}

    fn has_pending(&self, _cx: &ArmCx, _vcpu: usize) -> bool {
        false
    }

    fn halt_poll(&self, _cx: &ArmCx, _vcpu: usize) -> Time {
        0
    }

    /// No host beside the kernel (the scenario warns, the build sends
    /// none).
    fn host_vipi(&mut self, _cx: &mut ArmCx, _vcpu: usize, _vintid: u32) {}

    fn bg_timer(&mut self, _cx: &mut ArmCx, _vcpu: usize) {}
}
