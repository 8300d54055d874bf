//! `did-arm`: DID (VEE '15) ported to ARM. The proposal (did-arm.md §2.5,
//! §2.6) removes the device-interrupt and idle exits and leaves timer and
//! IPI delivery open (§3, §7.3); this scheme closes them the way x86 DID
//! does, with the ARM controls that correspond to its VMCS bits
//! (docs/did-arm.md argues each step and its correctness condition):
//!
//! * DID §4.1 "external-interrupt exiting off, NMI exiting on" is
//!   HCR_EL2.IMO = 0, FMO = 1 while the vCPU is loaded on its dedicated
//!   core: Group-1 physical IRQs are taken by the guest at EL1 through the
//!   core's own CPU interface (ICC_IAR1/EOIR1_EL1 are physical accesses),
//!   Group-0 ones (FIQs) still exit.
//! * Direct timer: the guest's CNTV drives PPI 27 on its core, which the
//!   guest acknowledges and ends itself: no exit, no list register, no HW
//!   link to deactivate.
//! * Direct IPIs: ICC_SGI1R_EL1 does not trap without IMO (and ICH_HCR.TC
//!   clear); VMPIDR_EL2 presents each vCPU's physical core affinity, so the
//!   guest's SGIs are real SGIs to its siblings' cores (DID §4.3 "every
//!   virtual interrupt is a real IPI"); a host-originated virtual
//!   interrupt is a physical SGI with the guest's INTID too.
//! * Device interrupts: the VF's MSI is translated by the ITS to a physical
//!   LPI (MAPTI) in the collection of its vCPU's core (DID §4.2's IRT entry
//!   aimed at the core), acknowledged by the guest directly. GICv4 vLPIs
//!   are not usable here: with IMO = 0 the virtual CPU interface signals
//!   nothing (Arm ARM, HCR_EL2.IMO), which is why kvm-arm-v4 is the vLPI
//!   scheme. A NIC on a wired SPI is routed (GICD_IROUTER) to the same
//!   core and taken the same way.
//! * Idle: HCR_EL2.TWI = 0; WFI waits in the guest until its core's IRQ.
//! * Host traffic to a guest core (DID §4.5's NMIs): the host's SGI for it
//!   is configured Group 0 and arrives as an FIQ, which exits.
//!
//! Correctness needs each vCPU alone on a dedicated core for as long as
//! it is loaded (the guest owns the core's Group-1 state), every host
//! interrupt aimed at such a core configured Group 0, and host LPIs kept
//! in collections of host cores. The build refuses shared cores.

use super::intids::{nic_spi, virtio_spi, HOST_FIQ_SGI, PRIORITY, VF_VLPI};
use super::{vtimer_write, ArmCx, ArmExit, ArmScheme, EventClass, ExitAction};
use crate::engine::Time;
use crate::hw::arm::cpu_interface::CTLR_EOIMODE;
use crate::hw::arm::distributor::Route;
use crate::hw::arm::el2::{El2Controls, HypMode};
use crate::hw::arm::params::GicParams;
use crate::hw::arm::priority::Group;
use crate::hw::arm::timer::CntReg;
use crate::world::event::Ev;

/// The `did-arm` scheme.
pub struct DidArm {
    hyp: HypMode,
    /// Per vCPU while it is off its core: the guest's ICC_IGRPEN1_EL1.
    held: Vec<Option<bool>>,
}

impl DidArm {
    /// DID on a `hyp` host.
    pub fn new(hyp: HypMode) -> Self {
        DidArm {
            hyp,
            held: Vec::new(),
        }
    }

    /// The EL2 controls of a core whose vCPU is loaded: IMO clear, FMO
    /// set, WFI untrapped.
    fn direct(&self) -> El2Controls {
        let mut c = self.el2().untrapped_wfi();
        c.hcr.imo = false;
        c
    }
}

impl ArmScheme for DidArm {
    fn name(&self) -> &'static str {
        "did-arm"
    }

    fn gic(&self, cores: usize, _vcpus: usize) -> GicParams {
        GicParams::gicv3(cores)
    }

    fn el2(&self) -> El2Controls {
        match self.hyp {
            HypMode::Vhe => El2Controls::kvm_vhe(),
            HypMode::Split => El2Controls::kvm_split(),
        }
    }

    fn setup_vm(&mut self, cx: &mut ArmCx, vm: usize) {
        self.held.resize(cx.vcpus.len(), None);
        // VMPIDR_EL2 = the dedicated core's MPIDR.
        for i in 0..cx.hv.vms[vm].vcpus.len() {
            let v = cx.hv.vms[vm].vcpus[i];
            let core = cx.hv.vcpus[v].core;
            cx.vcpus[v].vmpidr_core = core;
            cx.vcpus[v].vpeid = v as u16;
            // Host traffic to this core arrives as FIQs.
            let _ = cx.m.redists[core].configure(HOST_FIQ_SGI, 0x80, Group::G0);
            cx.m.cpus[core].write_igrpen(Group::G0, true);
        }
        super::kvm_arm::map_vf_to_lpi(cx, vm, VF_VLPI);
        // A NIC on a wired SPI (the host configured and enabled it: the
        // platform has one for this VM): GICD_IROUTER names the dedicated
        // core of the vCPU that takes its interrupts, where the guest
        // acknowledges the physical SPI itself (IMO = 0) and its EOI
        // (EOImode 0) deactivates it. Group 1, as the host set it.
        // The VM's virtio-net SPIs (RX and TX queue vectors): edge, Group
        // 1, routed to the core of the vCPU its MSIs name.
        let home = cx.hv.vcpus[cx.hv.device_home(vm)].core;
        for q in 0..2 {
            let route = Route::Affinity(cx.m.params.topology.affinity(home));
            let _ =
                cx.m.dist
                    .configure(virtio_spi(vm, q), PRIORITY, Group::G1, true, route);
        }
        let spi = nic_spi(vm);
        if cx.m.dist.bank().is_enabled(spi) {
            let core = cx.hv.vcpus[cx.hv.device_home(vm)].core;
            let aff = cx.m.params.topology.affinity(core);
            let _ = cx.m.dist.set_route(spi, Route::Affinity(aff));
        }
    }

    fn vcpu_load(&mut self, cx: &mut ArmCx, vcpu: usize) {
        cx.hv.vcpus[vcpu].loaded = true;
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.el2[core] = self.direct();
        // The guest's Linux at EL1 runs its CPU interface in EOImode 0
        // (priority drop and deactivation in one EOIR write).
        let ctlr = cx.m.cpus[core].read_ctlr() & !CTLR_EOIMODE;
        let _ = cx.m.cpus[core].write_ctlr(ctlr);
        if let Some(on) = self.held.get_mut(vcpu).and_then(Option::take) {
            // Back from a schedule-out (vcpu_put): the guest's Group-1
            // enable as it left it. Its interrupts that arrived meanwhile
            // waited in the redistributor and signal now.
            cx.m.cpus[core].write_igrpen(Group::G1, on);
            cx.charge(cx.costs.vgic_load_put);
            return;
        }
        let (ctl, cval) = cx.vcpus[vcpu].saved_timer;
        let now = cx.now;
        vtimer_write(cx.m, cx.q, core, CntReg::VCval, cval, now);
        vtimer_write(cx.m, cx.q, core, CntReg::VCtl, ctl, now);
    }

    /// A schedule-out from the dedicated core (host threads share it: a
    /// burner, a scripted preemption; WFI never blocks, it does not trap).
    /// The core stays the guest's: no other vCPU may run on it (the build
    /// refuses that), so its Group-1 state is not saved to memory but held
    /// in place. KVM's controls come back (IMO = 1) and the guest's
    /// ICC_IGRPEN1_EL1 is saved and cleared: the guest's SGIs, its VF LPI
    /// and its virtual timer's PPI 27 (CNTV keeps running: the host uses
    /// the EL2 timers) stay pending in the core's redistributor, invisible
    /// to the host, whose own interrupts to this core are Group 0. At the
    /// next load the enable comes back and they signal to the guest.
    fn vcpu_put(&mut self, cx: &mut ArmCx, vcpu: usize, _blocking: bool) {
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.el2[core] = self.el2();
        if self.held.len() <= vcpu {
            self.held.resize(vcpu + 1, None);
        }
        self.held[vcpu] = Some(cx.m.cpus[core].priority().group_enabled(Group::G1));
        cx.m.cpus[core].write_igrpen(Group::G1, false);
        cx.charge(cx.costs.vgic_load_put);
        cx.hv.vcpus[vcpu].loaded = false;
    }

    fn handle_exit(&mut self, cx: &mut ArmCx, vcpu: usize, exit: ArmExit) -> ExitAction {
        match exit {
            // A virtio queue's notify store still aborts at stage 2 (DID
            // §4 leaves device emulation's exits alone): KVM's ioeventfd.
            ArmExit::DataAbort { .. } => super::kvm_arm::kvm_exit(cx, vcpu, exit, false, false),
            // Otherwise only FIQs exit; the host takes them when it
            // enables interrupts.
            _ => ExitAction::Resume,
        }
    }

    fn host_irq(&mut self, cx: &mut ArmCx, _core: usize, _intid: u32) -> bool {
        cx.charge(cx.costs.host_irq);
        false
    }

    fn flush(&mut self, _cx: &mut ArmCx, _vcpu: usize) {}

    fn has_pending(&self, _cx: &ArmCx, _vcpu: usize) -> bool {
        false
    }

    fn halt_poll(&self, _cx: &ArmCx, _vcpu: usize) -> Time {
        0
    }

    fn host_vipi(&mut self, cx: &mut ArmCx, vcpu: usize, vintid: u32) {
        // A real SGI with the guest's INTID from the host's core.
        let core = cx.hv.vcpus[vcpu].core;
        cx.q.schedule_in_async(
            cx.costs.sgi_latency,
            Ev::ArmSgi {
                core: core as u16,
                intid: vintid as u8,
                class: EventClass::HostIpi as u8,
            },
        );
    }

    fn bg_timer(&mut self, _cx: &mut ArmCx, _vcpu: usize) {}

    /// A back end's completion (vhost's irqfd) as DID delivers a virtual
    /// device interrupt (DID §4.3: a real interrupt to the vCPU's core):
    /// the host makes the VM's virtio SPI pending at the distributor
    /// (GICD_SETSPI_NSR, a message-based SPI), routed (setup_vm) to the
    /// dedicated core, where the guest acknowledges and ends it itself.
    fn irqfd(&mut self, cx: &mut ArmCx, _vcpu: usize, intid: u32) {
        let _ = cx.m.dist.set_pending(intid);
    }
}
