//! `kvm-arm`: KVM/ARM as Linux 5.x runs it on a GICv3, VHE or split mode
//! (kvm-arm-and-peers.md §2, did-arm.md §2.4–2.7).
//!
//! * Software injection (`kvm_vgic_inject_irq` → `vgic_queue_irq_unlock`):
//!   a virtual interrupt joins the vCPU's ap_list and the vCPU is kicked;
//!   `kvm_vgic_flush_hwstate` moves the ap_list into list registers before
//!   each entry; when they are all in use the rest waits and ICH_HCR_EL2.UIE
//!   asks for a maintenance interrupt once at most one LR is valid.
//! * Virtual timer with the HW bit (`kvm_timer_vcpu_load/put`): its PPI
//!   exits (IMO), `kvm_arch_timer_handler` injects vINTID 27 linked to
//!   pINTID 27, the host drops priority only (EOImode 1) and the guest's
//!   virtual EOI deactivates the physical PPI. While the vCPU blocks, its
//!   timer is a background hrtimer (`kvm_timer_blocking`).
//! * SGIs: ICC_SGI1R_EL1 traps (IMO); `vgic_v3_dispatch_sgi` injects into
//!   each target and kicks it (a running target exits on the kick SGI). On
//!   a GICv4.1 with GICv4 enabled the write still traps, and KVM sends the
//!   vSGI through GITS_SGIR instead (kvm_arm_v4.rs).
//! * WFI traps (TWI): `kvm_vcpu_wfi` → `kvm_vcpu_halt` polls, then blocks.
//! * The VF's MSIs are host LPIs (VFIO) aimed at the vCPU's core; the irqfd
//!   injects the guest's vLPI in software (one exit per interrupt).

use super::intids::{
    vf_device, DOORBELL_LPI_BASE, GUEST_RESCHEDULE_SGI, HOST_VF_LPI_BASE, KICK_SGI, NIC_SPI_BASE,
    PRIORITY, VF_VLPI,
};
use super::{vtimer_write, ApIrq, ArmCx, ArmExit, ArmScheme, EventClass, ExitAction};
use crate::engine::Time;
use crate::hw::arm::cpu_interface::{decode_sgi1r, IccReg};
use crate::hw::arm::el2::{El2Controls, HypMode};
use crate::hw::arm::intid::{MAINTENANCE_PPI, SPI_LIMIT, VTIMER_PPI};
use crate::hw::arm::its::{ItsCommand, TYPER_VMAPP};
use crate::hw::arm::params::GicParams;
use crate::hw::arm::timer::{CntReg, TimerChannel, CTL_ENABLE, CTL_IMASK};
use crate::hw::arm::vcpu_interface::{IchHcr, ListRegister, LrState};
use crate::world::event::Ev;

/// The `kvm-arm` scheme (and, with `gicv4`, `kvm-arm-v4`).
pub struct KvmArm {
    hyp: HypMode,
    /// GICv4 direct injection of the VF's MSIs (kvm_arm_v4.rs): KVM with
    /// `kvm-arm.vgic_v4_enable=1`.
    pub(super) gicv4: bool,
    /// The GIC is GICv4.1 (read from GITS_TYPER.VMAPP at VM creation, as
    /// vgic_v3_probe sets `has_gicv4_1`): v4.1 doorbells and direct vSGIs.
    pub(super) gicv4_1: bool,
}

impl KvmArm {
    /// KVM/ARM on a `hyp` host with a GICv3.
    pub fn new(hyp: HypMode) -> Self {
        KvmArm {
            hyp,
            gicv4: false,
            gicv4_1: false,
        }
    }
}

/// `kvm_vgic_inject_irq` + `vgic_queue_irq_unlock`: `irq` becomes pending
/// for `vcpu` unless it already is (an edge merges), and the vCPU is
/// kicked.
pub(super) fn vgic_inject(cx: &mut ArmCx, vcpu: usize, irq: ApIrq, why: EventClass) {
    let listed = (0..cx.m.vifs[vcpu].list_registers()).any(|n| {
        cx.m.vifs[vcpu]
            .lr(n)
            .is_ok_and(|l| l.vintid == irq.vintid && l.state == LrState::Pending)
    });
    let queued = cx.vcpus[vcpu]
        .ap_list
        .iter()
        .any(|a| a.vintid == irq.vintid);
    if !listed && !queued {
        cx.vcpus[vcpu].ap_list.push(irq);
    }
    cx.charge(cx.costs.vgic_emulate);
    cx.kick(vcpu, why);
}

/// `kvm_vgic_flush_hwstate` (`vgic_flush_lr_state`): the ap_list, in
/// order, into free list registers; what does not fit stays, with UIE set
/// so an underflow maintenance interrupt says when LRs free up.
pub(super) fn vgic_flush(cx: &mut ArmCx, vcpu: usize) {
    let vif = &mut cx.m.vifs[vcpu];
    let mut hcr: IchHcr = vif.hcr();
    let ap = &mut cx.vcpus[vcpu].ap_list;
    if ap.is_empty() {
        if hcr.uie {
            hcr.uie = false;
            vif.set_hcr(hcr);
        }
        return;
    }
    let mut moved = 0;
    for a in ap.iter() {
        let lr = match a.hw {
            Some(p) => ListRegister::hardware(a.vintid, p, a.priority),
            None => ListRegister::pending(a.vintid, a.priority),
        };
        if vif.inject(lr).is_none() {
            break;
        }
        moved += 1;
    }
    ap.drain(..moved);
    hcr.uie = !ap.is_empty();
    vif.set_hcr(hcr);
    cx.charge(cx.costs.vgic_flush_sync);
}

/// `kvm_timer_vcpu_load`: the vCPU's CNTV_CVAL/CTL back on its core; a
/// timer that should fire is injected now with the physical PPI marked
/// active, so it cannot fire again before the guest's EOI deactivates it
/// (`kvm_timer_update_irq`, then the IRQ's active state set to
/// `map_is_active || level`).
pub(super) fn timer_load(cx: &mut ArmCx, vcpu: usize) {
    let core = cx.hv.vcpus[vcpu].core;
    let (ctl, cval) = cx.vcpus[vcpu].saved_timer;
    cx.vcpus[vcpu].bg_gen += 1;
    let now = cx.now;
    vtimer_write(cx.m, cx.q, core, CntReg::VCval, cval, now);
    let level = vtimer_write(cx.m, cx.q, core, CntReg::VCtl, ctl, now);
    if level {
        let _ = cx.m.redists[core].bank_mut().set_active(VTIMER_PPI, true);
        let irq = ApIrq {
            vintid: VTIMER_PPI,
            hw: Some(VTIMER_PPI),
            priority: PRIORITY,
        };
        // A level already injected (a list register still holds vINTID 27
        // from before a preemption, or the ap_list does) stays one
        // interrupt: kvm_vgic_inject_irq finds it queued and only kicks.
        let vif = &cx.m.vifs[vcpu];
        let listed = (0..vif.list_registers()).any(|n| {
            vif.lr(n)
                .is_ok_and(|l| l.vintid == VTIMER_PPI && l.state != LrState::Invalid)
        });
        if !listed && !cx.vcpus[vcpu].ap_list.contains(&irq) {
            cx.vcpus[vcpu].ap_list.push(irq);
        }
    }
    cx.charge(cx.costs.timer_load_put);
}

/// `kvm_timer_vcpu_put` + `kvm_timer_blocking`: the timer's registers are
/// saved and the core's timer disabled; a blocked vCPU's expiry becomes a
/// background hrtimer that wakes it. A preempted vCPU (`blocking` false)
/// is runnable and gets none: `kvm_timer_vcpu_load` injects an expiry
/// that passed meanwhile when it is scheduled in again.
pub(super) fn timer_put(cx: &mut ArmCx, vcpu: usize, blocking: bool) {
    let core = cx.hv.vcpus[vcpu].core;
    let now = cx.now;
    let t = &cx.m.timers[core];
    let ctl = t.read(CntReg::VCtl, now) & (CTL_ENABLE | CTL_IMASK);
    let cval = t.read(CntReg::VCval, now);
    let due = if t.output(TimerChannel::Virtual, now) {
        Some(now)
    } else {
        t.next_fire(TimerChannel::Virtual, now)
    };
    cx.vcpus[vcpu].saved_timer = (ctl, cval);
    vtimer_write(cx.m, cx.q, core, CntReg::VCtl, 0, now);
    cx.vcpus[vcpu].bg_gen += 1;
    if let Some(at) = due.filter(|_| blocking) {
        let gen = cx.vcpus[vcpu].bg_gen;
        cx.q.schedule(
            at,
            Ev::BgTimer {
                vcpu: vcpu as u16,
                gen,
            },
        );
    }
    cx.charge(cx.costs.timer_load_put);
}

/// Whether a virtual interrupt waits for `vcpu` in its ap_list or LRs.
pub(super) fn vgic_pending(cx: &ArmCx, vcpu: usize) -> bool {
    !cx.vcpus[vcpu].ap_list.is_empty() || cx.m.vifs[vcpu].highest_pending(None).is_some()
}

/// `vgic_v3_dispatch_sgi`: the SGI1R value the guest on `vcpu` wrote,
/// resolved against the VM's virtual affinities; each target gets the SGI
/// (`vgic_v3_queue_sgi`): through its ap_list, or, when the VM's SGIs are
/// GICv4.1 vSGIs (`vsgi`), written to GITS_SGIR for the target's vPE.
pub(super) fn dispatch_sgi(cx: &mut ArmCx, vcpu: usize, value: u64, vsgi: bool) {
    let me = cx.vcpus[vcpu].vmpidr_core;
    let topo = cx.m.params.topology;
    let Ok(req) = decode_sgi1r(value, me, &topo) else {
        return;
    };
    let vm = cx.hv.vcpus[vcpu].vm;
    for i in 0..cx.hv.vms[vm].vcpus.len() {
        let t = cx.hv.vms[vm].vcpus[i];
        if req.targets.contains(cx.vcpus[t].vmpidr_core) {
            if vsgi {
                super::kvm_arm_v4::queue_vsgi(cx, t, req.intid, EventClass::VcpuIpi);
                continue;
            }
            let irq = ApIrq {
                vintid: req.intid,
                hw: None,
                priority: PRIORITY,
            };
            vgic_inject(cx, t, irq, EventClass::VcpuIpi);
        }
    }
}

/// The ITS mappings of VM `vm`'s VF as VFIO sets them without GICv4: its
/// MSI is a host LPI in the collection of the core of the vCPU its
/// affinity names.
fn map_vf_to_host_lpi(cx: &mut ArmCx, vm: usize) {
    map_vf_to_lpi(cx, vm, HOST_VF_LPI_BASE + vm as u32);
}

/// VM `vm`'s VF event 0 through the ITS to physical LPI `lpi` in the
/// collection of its device-home vCPU's core (MAPD, MAPC, MAPTI), the
/// LPI enabled at its priority.
pub(super) fn map_vf_to_lpi(cx: &mut ArmCx, vm: usize, lpi: u32) {
    let home = cx.hv.device_home(vm);
    let core = cx.hv.vcpus[home].core;
    let _ = cx.m.lpi_config.set(lpi, PRIORITY, true);
    for r in &mut cx.m.redists {
        let _ = r.invalidate_lpi(lpi, &cx.m.lpi_config);
    }
    let (its, mut t) = cx.m.its_targets();
    for c in [
        ItsCommand::Mapd {
            device: vf_device(vm),
            size: 0,
            valid: true,
        },
        ItsCommand::Mapc {
            icid: core as u16,
            target: core,
            valid: true,
        },
        ItsCommand::Mapti {
            device: vf_device(vm),
            event: 0,
            pintid: lpi,
            icid: core as u16,
        },
    ] {
        let _ = its.command(c, &mut t);
    }
}

/// The virtual MPIDRs KVM presents (`reset_mpidr`): vCPU i is affinity i.
pub(super) fn setup_vmpidr(cx: &mut ArmCx, vm: usize) {
    for i in 0..cx.hv.vms[vm].vcpus.len() {
        let v = cx.hv.vms[vm].vcpus[i];
        cx.vcpus[v].vmpidr_core = i;
        cx.vcpus[v].vpeid = v as u16;
    }
}

/// KVM/ARM's exit handling common to kvm-arm and kvm-arm-v4 (`gicv4_1`:
/// a GICv4.1, whose vSGIs carry the VM's SGIs).
pub(super) fn kvm_exit(
    cx: &mut ArmCx,
    vcpu: usize,
    exit: ArmExit,
    gicv4: bool,
    gicv4_1: bool,
) -> ExitAction {
    match exit {
        // The host takes the interrupt when it enables IRQs.
        ArmExit::Irq | ArmExit::Fiq => ExitAction::Resume,
        ArmExit::Sys64 {
            reg: IccReg::Sgi1r,
            value,
        } => {
            dispatch_sgi(cx, vcpu, value, gicv4_1);
            ExitAction::Resume
        }
        ArmExit::Sys64 { .. } => {
            cx.charge(cx.costs.vgic_emulate);
            ExitAction::Resume
        }
        // io_mem_abort → kvm_io_bus_write: the notify store's ioeventfd
        // is signalled (its decode is charged with the exit); a store
        // with none behind it would go to QEMU (not modelled: every
        // virtio-net queue has one).
        ArmExit::DataAbort { port } => {
            let vm = cx.hv.vcpus[vcpu].vm;
            if let Some(fd) = cx.hv.ioeventfd(vm, port) {
                cx.q.schedule_in(0, Ev::Eventfd { fd });
            }
            ExitAction::Resume
        }
        ArmExit::Wfx => {
            // kvm_handle_wfx → kvm_vcpu_wfi: IN_WFI, vgic_v4_put (the
            // doorbell armed), then kvm_vcpu_halt.
            cx.charge(cx.costs.wfi_emulate);
            cx.vcpus[vcpu].in_wfi = true;
            if gicv4 {
                super::kvm_arm_v4::vgic_v4_put(cx, vcpu, true, gicv4_1);
            }
            ExitAction::Halt
        }
    }
}

/// The host's handler for physical `intid` on `core` under KVM/ARM.
/// Returns whether it is forwarded to a vCPU (left active for the guest's
/// EOI to deactivate through a HW = 1 list register).
pub(super) fn kvm_host_irq(cx: &mut ArmCx, core: usize, intid: u32) -> bool {
    cx.charge(cx.costs.host_irq);
    match intid {
        VTIMER_PPI => {
            // kvm_arch_timer_handler: the vCPU loaded here.
            if let Some(v) = cx.hv.vcpu_on(core) {
                let irq = ApIrq {
                    vintid: VTIMER_PPI,
                    hw: Some(VTIMER_PPI),
                    priority: PRIORITY,
                };
                vgic_inject(cx, v, irq, EventClass::TimerExpiry);
            }
            // kvm_timer_enable mapped it (kvm_vgic_map_phys_irq).
            return true;
        }
        // The kick's reschedule IPI and the maintenance interrupt only
        // made the core exit: the flush before entry does the work.
        KICK_SGI | MAINTENANCE_PPI => {}
        i if (DOORBELL_LPI_BASE..DOORBELL_LPI_BASE + 1024).contains(&i) => {
            super::kvm_arm_v4::doorbell(cx, (i - DOORBELL_LPI_BASE) as usize);
        }
        i if (HOST_VF_LPI_BASE..HOST_VF_LPI_BASE + 1024).contains(&i) => {
            // vfio_msihandler → irqfd → vgic_its_inject_msi.
            let vm = (i - HOST_VF_LPI_BASE) as usize;
            if vm < cx.hv.vms.len() {
                let t = cx.hv.device_home(vm);
                let irq = ApIrq {
                    vintid: VF_VLPI,
                    hw: None,
                    priority: PRIORITY,
                };
                vgic_inject(cx, t, irq, EventClass::Device);
            }
        }
        i if (NIC_SPI_BASE..SPI_LIMIT).contains(&i) => {
            // A NIC on a wired, level-sensitive SPI, forwarded to the VM
            // (did-arm.md §2.6 "today, as an SPI", §4.C Fig. 6): the
            // physical SPI mapped to the virtual one as the arch timer's
            // PPI is (kvm_vgic_map_phys_irq), so the list register has
            // HW = 1 and pINTID = the SPI. The host only drops priority;
            // the SPI stays active, and its level cannot signal again,
            // until the guest's EOI deactivates it through the LR. The
            // guest's INTID is the same SPI (intids::nic_spi).
            let vm = (i - NIC_SPI_BASE) as usize;
            if vm < cx.hv.vms.len() {
                let t = cx.hv.device_home(vm);
                let irq = ApIrq {
                    vintid: i,
                    hw: Some(i),
                    priority: PRIORITY,
                };
                vgic_inject(cx, t, irq, EventClass::Device);
                return true;
            }
        }
        _ => {}
    }
    false
}

impl ArmScheme for KvmArm {
    fn name(&self) -> &'static str {
        if self.gicv4 {
            "kvm-arm-v4"
        } else {
            "kvm-arm"
        }
    }

    fn gic(&self, cores: usize, vcpus: usize) -> GicParams {
        // The least GIC the scheme needs; `[arm] gic` may give it a newer
        // one (a GICv4.1 for kvm-arm-v4's vSGIs).
        if self.gicv4 {
            GicParams::gicv4(cores, vcpus.max(1) as u16)
        } else {
            GicParams::gicv3(cores)
        }
    }

    fn el2(&self) -> El2Controls {
        match self.hyp {
            HypMode::Vhe => El2Controls::kvm_vhe(),
            HypMode::Split => El2Controls::kvm_split(),
        }
    }

    fn setup_vm(&mut self, cx: &mut ArmCx, vm: usize) {
        setup_vmpidr(cx, vm);
        if self.gicv4 {
            self.gicv4_1 = cx.m.its.typer() & TYPER_VMAPP != 0;
            super::kvm_arm_v4::map_vf_to_vlpi(cx, vm, self.gicv4_1);
            if self.gicv4_1 {
                super::kvm_arm_v4::configure_vsgis(cx, vm);
            }
        } else {
            map_vf_to_host_lpi(cx, vm);
        }
    }

    fn vcpu_load(&mut self, cx: &mut ArmCx, vcpu: usize) {
        cx.hv.vcpus[vcpu].loaded = true;
        // kvm_vgic_load -> vgic_v3_load: ICH_VMCR_EL2 and the active
        // priorities (ICH_AP0R/AP1R) back from the vCPU's save area.
        cx.charge(cx.costs.vgic_load_put);
        timer_load(cx, vcpu);
        if self.gicv4 {
            super::kvm_arm_v4::vgic_v4_load(cx, vcpu, self.gicv4_1);
        }
    }

    fn vcpu_put(&mut self, cx: &mut ArmCx, vcpu: usize, blocking: bool) {
        // kvm_vgic_put -> vgic_v3_put: VMCR and APRs saved.
        cx.charge(cx.costs.vgic_load_put);
        timer_put(cx, vcpu, blocking);
        if self.gicv4 {
            super::kvm_arm_v4::vgic_v4_put(cx, vcpu, blocking, self.gicv4_1);
        }
        cx.hv.vcpus[vcpu].loaded = false;
    }

    fn handle_exit(&mut self, cx: &mut ArmCx, vcpu: usize, exit: ArmExit) -> ExitAction {
        kvm_exit(cx, vcpu, exit, self.gicv4, self.gicv4_1)
    }

    fn host_irq(&mut self, cx: &mut ArmCx, core: usize, intid: u32) -> bool {
        kvm_host_irq(cx, core, intid)
    }

    fn flush(&mut self, cx: &mut ArmCx, vcpu: usize) {
        if std::mem::take(&mut cx.vcpus[vcpu].in_wfi) && self.gicv4 {
            super::kvm_arm_v4::vgic_v4_load(cx, vcpu, self.gicv4_1);
        }
        vgic_flush(cx, vcpu);
    }

    fn has_pending(&self, cx: &ArmCx, vcpu: usize) -> bool {
        vgic_pending(cx, vcpu) || (self.gicv4 && super::kvm_arm_v4::vpe_pending(cx, vcpu))
    }

    fn halt_poll(&self, cx: &ArmCx, vcpu: usize) -> Time {
        if cx.costs.halt_poll_dynamic {
            cx.vcpus[vcpu].poll_window
        } else {
            cx.costs.halt_poll
        }
    }

    fn halt_ended(&mut self, cx: &mut ArmCx, vcpu: usize, block: Time) {
        if cx.costs.halt_poll_dynamic {
            let v = &mut cx.vcpus[vcpu];
            v.poll_window = super::halt_poll_update(
                v.poll_window,
                block,
                cx.costs.halt_poll_max,
                cx.costs.halt_poll_grow_start,
            );
        }
    }

    /// vhost's irqfd (irqfd_wakeup → kvm_set_irq → kvm_vgic_inject_irq):
    /// the virtio SPI joins the ap_list as an edge with no physical
    /// interrupt behind it (HW = 0), and the vCPU is kicked: a running
    /// one exits on the kick SGI, a blocked one wakes. GICv4 changes
    /// nothing here: only VFIO's MSIs are forwarded as vLPIs.
    fn irqfd(&mut self, cx: &mut ArmCx, vcpu: usize, intid: u32) {
        let irq = ApIrq {
            vintid: intid,
            hw: None,
            priority: PRIORITY,
        };
        vgic_inject(cx, vcpu, irq, EventClass::Device);
    }

    fn host_vipi(&mut self, cx: &mut ArmCx, vcpu: usize, vintid: u32) {
        // A virtual SGI made pending by the host takes the same path as a
        // guest's (vgic_v3_queue_sgi): with GICv4.1 vSGIs, GITS_SGIR.
        if self.gicv4_1 && vintid < 16 {
            super::kvm_arm_v4::queue_vsgi(cx, vcpu, vintid, EventClass::HostIpi);
            return;
        }
        let irq = ApIrq {
            vintid,
            hw: None,
            priority: PRIORITY,
        };
        vgic_inject(cx, vcpu, irq, EventClass::HostIpi);
    }

    fn bg_timer(&mut self, cx: &mut ArmCx, vcpu: usize) {
        // kvm_bg_timer_expire → kvm_vcpu_wake_up; the load injects.
        cx.kick(vcpu, EventClass::TimerExpiry);
    }
}

/// The guest's reschedule SGI, which the host's virtual IPIs use.
pub const HOST_VIPI_VINTID: u32 = GUEST_RESCHEDULE_SGI;
