//! `kvm-arm-v4`: KVM/ARM with GICv4 direct injection of the VF's MSIs
//! (kvm-arm-and-peers.md §2 "GICv4"). Everything else is `kvm-arm`.
//!
//! * Setup (`kvm_vgic_v4_set_forwarding` → `its_map_vlpi`): the VF's event
//!   is a vLPI of its vCPU's vPE (VMAPP, VMAPTI) with a GICv4.0 doorbell.
//! * Load (`vgic_v4_load`, skipped while IN_WFI): the vPE becomes resident
//!   on the core (GICR_VPENDBASER.Valid), and its pending vLPIs reach the
//!   virtual CPU interface without the hypervisor.
//! * Put (`vgic_v4_put`, at WFI and at schedule-out): non-resident, the
//!   doorbell armed; a vLPI for it then rings the doorbell, a physical LPI
//!   whose handler (`vgic_v4_doorbell_handler`) sets `pending_last` and
//!   kicks the vCPU.
//!
//! On a GICv4.1 (GITS_TYPER.VMAPP; `[arm] gic = "v4.1"`) the same KVM
//! does what Linux's vgic-v4.c does when `has_gicv4_1`:
//!
//! * Doorbells: one default doorbell per vPE (VMAPP), left enabled; the
//!   hardware rings it only for a vPE descheduled with
//!   GICR_VPENDBASER.Doorbell, which `its_vpe_4_1_deschedule` sets when
//!   KVM asks for one (`vgic_v4_put` of a vCPU in WFI), and only once.
//! * vSGIs (`vgic_v4_enable_vsgis`, once the guest's GICv3 driver sets
//!   GICD_CTLR.nASSGIreq): each vCPU's 16 SGIs become vSGIs of its vPE,
//!   configured by the VSGI command (`its_configure_sgi`: priority, group,
//!   enable). The sender's ICC_SGI1R_EL1 write still traps (no virtual
//!   SGI-generation register exists; it traps with HCR_EL2.IMO), and
//!   `vgic_v3_queue_sgi` finds the SGI `hw` and makes it pending through
//!   `irq_set_irqchip_state` → `its_sgi_set_irqchip_state`: a GITS_SGIR
//!   write (vPEID, vINTID), no ap_list and no kick. The ITS delivers it to
//!   a resident vPE with no exit; a preempted vCPU finds it in its vPE at
//!   the next load; a vCPU blocked in WFI gets its doorbell.

use super::intids::{vf_device, DOORBELL_LPI_BASE, PRIORITY, VF_VLPI};
use super::kvm_arm::KvmArm;
use super::{ArmCx, EventClass};
use crate::hw::arm::el2::HypMode;
use crate::hw::arm::its::{Its, ItsCommand};
use crate::hw::arm::priority::Group;
use crate::world::event::Ev;

/// The `kvm-arm-v4` scheme: [`KvmArm`] with GICv4.
pub fn kvm_arm_v4(hyp: HypMode) -> KvmArm {
    let mut k = KvmArm::new(hyp);
    k.gicv4 = true;
    k
}

/// VM `vm`'s VF as a vLPI of the vPE of the vCPU its affinity names, with
/// that vCPU's doorbell; every vCPU of the VM gets its vPE (VMAPP) on its
/// core. On a GICv4.1 (`v41`) the doorbell is the vPE's default doorbell,
/// given at VMAPP and left enabled (vgic_v4_init drops IRQ_NOAUTOEN).
pub(super) fn map_vf_to_vlpi(cx: &mut ArmCx, vm: usize, v41: bool) {
    let home = cx.hv.device_home(vm);
    for i in 0..cx.hv.vms[vm].vcpus.len() {
        let v = cx.hv.vms[vm].vcpus[i];
        let db = DOORBELL_LPI_BASE + v as u32;
        let _ = cx.m.lpi_config.set(db, PRIORITY, true);
        let default_doorbell = v41.then_some(db);
        for r in &mut cx.m.redists {
            let _ = r.invalidate_lpi(db, &cx.m.lpi_config);
        }
        let vpeid = cx.vcpus[v].vpeid;
        let core = cx.hv.vcpus[v].core;
        let _ = cx.m.vlpis.set_config(vpeid, VF_VLPI, PRIORITY, true);
        let (its, mut t) = cx.m.its_targets();
        let _ = its.command(
            ItsCommand::Vmapp {
                vpeid,
                target: core,
                valid: true,
                default_doorbell,
            },
            &mut t,
        );
    }
    let vpeid = cx.vcpus[home].vpeid;
    let (its, mut t) = cx.m.its_targets();
    for c in [
        ItsCommand::Mapd {
            device: vf_device(vm),
            size: 0,
            valid: true,
        },
        ItsCommand::Vmapti {
            device: vf_device(vm),
            event: 0,
            vpeid,
            vintid: VF_VLPI,
            doorbell: Some(DOORBELL_LPI_BASE + home as u32),
        },
    ] {
        let _ = its.command(c, &mut t);
    }
}

/// `vgic_v4_load`: make the vPE resident on the vCPU's core (skipped if it
/// already is, or while the vCPU is in WFI); on GICv4.0 a doorbell rung
/// meanwhile is cleared and the doorbell disabled (`v41`: the hardware
/// manages its doorbell, KVM leaves it alone).
pub(super) fn vgic_v4_load(cx: &mut ArmCx, vcpu: usize, v41: bool) {
    if cx.vcpus[vcpu].in_wfi {
        return;
    }
    let core = cx.hv.vcpus[vcpu].core;
    let vpeid = cx.vcpus[vcpu].vpeid;
    if cx.m.redists[core].resident() == Some(vpeid) {
        return;
    }
    // irq_set_affinity on the vPE's doorbell (its_vpe_set_affinity): the
    // vCPU's thread runs on another core than the vPE table names, so the
    // ITS moves the vPE there (VMOVP, then VSYNC) before it is made
    // resident: vLPIs and the doorbell follow the thread
    // (kvm-arm-and-peers.md §2 "Load").
    let mapped = cx.m.its.vpe(vpeid).map(|e| e.core);
    if mapped.is_ok_and(|c| c != core) {
        let (its, mut t) = cx.m.its_targets();
        let _ = its.command(
            ItsCommand::Vmovp {
                vpeid,
                target: core,
            },
            &mut t,
        );
        let _ = its.command(ItsCommand::Vsync { vpeid }, &mut t);
        cx.charge(cx.costs.its_vmovp);
    }
    let _ = cx.m.redists[core].make_resident(vpeid, &mut cx.m.vlpis);
    if !v41 {
        let _ = cx.m.redists[core].clear_lpi_pending(DOORBELL_LPI_BASE + vcpu as u32);
        // GICv4.0: the doorbell is off while the vPE is resident (KVM
        // enables it only for a vCPU that blocks).
        doorbell_enable(cx, vcpu, false);
    }
    cx.vcpus[vcpu].pending_last = false;
    cx.charge(cx.costs.vpe_residency);
}

/// `vgic_v4_put(vcpu, need_db)`: the vPE non-resident; its doorbell armed
/// only if the vCPU blocks (`need_db`: at WFI and a blocking schedule-out).
/// A preempted vCPU is runnable: a vLPI for it waits in its pending table
/// until the next load makes the vPE resident again, no doorbell. GICv4.0
/// arms the doorbell by enabling its LPI; GICv4.1 (`v41`) by the Doorbell
/// bit of the deschedule (`its_vpe_4_1_deschedule`'s `req_db`).
pub(super) fn vgic_v4_put(cx: &mut ArmCx, vcpu: usize, need_db: bool, v41: bool) {
    let core = cx.hv.vcpus[vcpu].core;
    let vpeid = cx.vcpus[vcpu].vpeid;
    if cx.m.redists[core].resident() != Some(vpeid) {
        return;
    }
    if let Some((_, pending)) = cx.m.redists[core].make_non_resident(&mut cx.m.vlpis, need_db) {
        cx.vcpus[vcpu].pending_last |= pending;
    }
    if !v41 {
        doorbell_enable(cx, vcpu, need_db);
    }
    cx.charge(cx.costs.vpe_residency);
}

/// `vgic_v4_configure_vsgis` → `vgic_v4_enable_vsgis` for every vCPU of VM
/// `vm`: its SGIs 0-15 become vSGIs of its vPE, configured as the guest
/// set them (Linux's GICv3 driver enables every SGI at the default
/// priority, Group 1: gic_cpu_config), one VSGI command each
/// (`its_configure_sgi`). ICH_HCR_EL2.vSGIEOICount is set: no SGI of the
/// vCPU is ever in its ap_list again (vgic_v3_configure_hcr), so the
/// guest's EOIs of direct vSGIs do not count as EOIs without an LR.
pub(super) fn configure_vsgis(cx: &mut ArmCx, vm: usize) {
    for i in 0..cx.hv.vms[vm].vcpus.len() {
        let v = cx.hv.vms[vm].vcpus[i];
        let vpeid = cx.vcpus[v].vpeid;
        let (its, mut t) = cx.m.its_targets();
        for sgi in 0..16u8 {
            let _ = its.command(
                ItsCommand::Vsgi {
                    vpeid,
                    sgi,
                    priority: PRIORITY,
                    group: Group::G1,
                    enable: true,
                    clear: false,
                },
                &mut t,
            );
        }
        let mut hcr = cx.m.vifs[v].hcr();
        hcr.vsgi_eoicount = true;
        cx.m.vifs[v].set_hcr(hcr);
    }
}

/// `vgic_v3_queue_sgi` for an SGI that is a GICv4.1 vSGI (`irq->hw`):
/// `its_sgi_set_irqchip_state` writes GITS_SGIR with `vcpu`'s vPEID and
/// the vINTID. No ap_list entry and no kick: the ITS delivers it (the
/// platform's `Ev::ItsSgir`, after the ITS's latency), and rings the
/// vPE's doorbell if its vCPU blocks. `why` is the guest event it serves.
pub(super) fn queue_vsgi(cx: &mut ArmCx, vcpu: usize, sgi: u32, why: EventClass) {
    let vpeid = cx.vcpus[vcpu].vpeid;
    let value = Its::sgir_value(vpeid, sgi);
    cx.charge(cx.costs.vsgi_send);
    cx.q.schedule_in_async(
        cx.costs.its_translate,
        Ev::ItsSgir {
            value,
            class: why as u8,
        },
    );
}

/// The GICv4.0 doorbell LPI of `vcpu` enabled or not: its LPI
/// configuration entry, then INV at the redistributors (what
/// `enable_irq` / `disable_irq_nosync` on the doorbell do).
fn doorbell_enable(cx: &mut ArmCx, vcpu: usize, on: bool) {
    let db = DOORBELL_LPI_BASE + vcpu as u32;
    if cx.m.lpi_config.get(db).is_some_and(|p| (p & 1 == 1) == on) {
        return;
    }
    let _ = cx.m.lpi_config.set(db, PRIORITY, on);
    for r in &mut cx.m.redists {
        let _ = r.invalidate_lpi(db, &cx.m.lpi_config);
    }
}

/// `vgic_v4_doorbell_handler`: `pending_last`, then kick.
pub(super) fn doorbell(cx: &mut ArmCx, vcpu: usize) {
    if vcpu >= cx.vcpus.len() {
        return;
    }
    cx.charge(cx.costs.doorbell_handler);
    cx.vcpus[vcpu].pending_last = true;
    cx.kick(vcpu, EventClass::Device);
}

/// `kvm_vgic_vcpu_pending_irq`'s GICv4 part: the doorbell rang, or the
/// vPE's pending table holds a vLPI.
pub(super) fn vpe_pending(cx: &ArmCx, vcpu: usize) -> bool {
    cx.vcpus[vcpu].pending_last || cx.m.vlpis.any_pending(cx.vcpus[vcpu].vpeid)
}
