//! KVM on AMD SVM (`arch/x86/kvm/svm/svm.c` and `avic.c` in spirit,
//! docs/amd.md): the `kvm-svm` scheme (stock `kvm_amd` without AVIC:
//! INTR, HLT and every x2APIC MSR write intercepted, interrupts injected
//! through EVENTINJ at VMRUN, the interrupt window through a dummy V_IRQ
//! and the VINTR intercept) and `kvm-avic` (`kvm_amd avic=1`: the AVIC
//! backing page, the physical APIC ID table's IsRunning written at every
//! vCPU load and put, doorbells, AVIC_INCOMPLETE_IPI and
//! AVIC_UNACCELERATED_ACCESS handling, the IOMMU's GuestMode IRTE with its
//! GA log, and the inhibits that turn AVIC off for a VM). Both are one
//! KVM module: AVIC is a mode of it. The handlers KVM's x86 core shares
//! with VT-x (`kvm_lapic_reg_write`, `kvm_emulate_halt`, the I/O bus) are
//! `kvm::exit`'s.

use super::{kvm, vlapic};
use crate::hv::exits::ExitInfo;
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::avic::{AvicMode, AvicTables, BackingPage, IcrWrite, PhysicalIdEntry};
use crate::hw::x86::iommu_ga::GaIrte;
use crate::hw::x86::lapic::{msr, ApicBitmap, DeliveryMode};
use crate::hw::x86::vmcb::{EventInj, IncompleteIpiCause, SvmExit, Vmcb};

/// The host vector of the AMD IOMMU's interrupt (event and GA log): a
/// device vector below the VFs' range.
pub const AMD_IOMMU_VECTOR: u8 = 0x5F;

/// Why KVM keeps AVIC off for a VM (`enum kvm_apicv_inhibit`, the ones a
/// scenario can provoke).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inhibit {
    /// `APICV_INHIBIT_REASON_X2APIC`: the guest runs its APIC in x2APIC
    /// mode and the host has only xAVIC.
    X2apic,
    /// `APICV_INHIBIT_REASON_PHYSICAL_ID_TOO_BIG`: a vCPU's APIC ID is
    /// past the physical APIC ID table (255 entries in xAVIC mode, 512 in
    /// x2AVIC mode).
    PhysicalIdTooBig,
}

impl Inhibit {
    /// Metric key.
    pub fn key(self) -> &'static str {
        match self {
            Inhibit::X2apic => "x2apic",
            Inhibit::PhysicalIdTooBig => "physical_id_too_big",
        }
    }
}

/// `kvm-avic`'s settings (`[hv]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvicOptions {
    /// xAVIC or x2AVIC (`hv.avic_mode`).
    pub mode: AvicMode,
    /// The IOMMU posts the VF's interrupts in GuestMode (`hv.avic_iommu`,
    /// `amd_iommu intremap=` default: on).
    pub iommu: bool,
    /// IPI virtualization: KVM sets IsRunning at vCPU load (`enable_ipiv`;
    /// Linux turns it off on Zen 1/2 because of erratum 1235).
    pub ipiv: bool,
}

/// KVM on an AMD host, with or without AVIC.
pub struct KvmSvm {
    avic: Option<AvicOptions>,
    /// Per VM: the inhibit that keeps AVIC off, if any.
    inhibited: Vec<Option<Inhibit>>,
    incomplete_ipis: u64,
    ga_log_wakeups: u64,
    doorbells: u64,
}

impl KvmSvm {
    /// `kvm-svm` (None) or `kvm-avic`.
    pub fn new(avic: Option<AvicOptions>) -> Self {
        KvmSvm {
            avic,
            inhibited: Vec::new(),
            incomplete_ipis: 0,
            ga_log_wakeups: 0,
            doorbells: 0,
        }
    }

    /// Whether AVIC is on for `vm` (enabled and not inhibited).
    fn active(&self, vm: usize) -> Option<AvicOptions> {
        self.avic
            .filter(|_| self.inhibited.get(vm).copied().flatten().is_none())
    }

    /// The inhibit `vm` provokes, if any.
    fn inhibit_of(cx: &HvCx, vm: usize, o: AvicOptions) -> Option<Inhibit> {
        let ids = cx.hv.vms[vm].vcpus.len() as u32;
        if ids > 0 && ids - 1 > o.mode.max_physical_id() {
            return Some(Inhibit::PhysicalIdTooBig);
        }
        (!cx.hv.vms[vm].xapic && o.mode == AvicMode::XAvic).then_some(Inhibit::X2apic)
    }

    fn vcpu_avic(&self, cx: &HvCx, vcpu: usize) -> Option<AvicOptions> {
        self.active(cx.hv.vcpus[vcpu].vm)
    }

    /// `avic_vcpu_load` / `avic_vcpu_put`: IsRunning and the host APIC ID
    /// in the physical table, IsRun and the destination in the vCPU's
    /// GuestMode IRTEs (`avic_update_iommu_vcpu_affinity`).
    fn set_running(&mut self, cx: &mut HvCx, vcpu: usize, running: bool, o: AvicOptions) {
        let v = &cx.hv.vcpus[vcpu];
        let (vm, index, core) = (v.vm, v.index as u32, v.core);
        let host = cx.m.cores[core].apic_id;
        if o.ipiv || !running {
            cx.m.avic_tables[vm].set_running(index, running, host, cx.now);
        }
        if let Some(a) = cx.hv.vms[vm].vf {
            let targets_me =
                cx.m.irt
                    .guest_mode(a.irte)
                    .is_some_and(|g| g.backing_page == vcpu);
            if targets_me {
                cx.m.irt.update_ga(a.irte, running, host);
            }
        }
        cx.charge(cx.costs.svm.avic_load_put);
    }
}

/// `svm_inject_irq` / `svm_enable_irq_window` (KVM's
/// `inject_pending_event` on SVM): the emulated LAPIC's highest
/// deliverable vector goes to EVENTINJ if the guest is interruptible;
/// otherwise a dummy V_IRQ with the VINTR intercept asks for the window.
pub fn inject_pending(cx: &mut HvCx, vcpu: usize) {
    if cx.m.vmcb[vcpu].event_inj.is_some() {
        return;
    }
    match cx.hv.vcpus[vcpu].vlapic.deliverable() {
        Some(_) if cx.guest_if(vcpu) => {
            if let Some(v) = cx.hv.vcpus[vcpu].vlapic.ack() {
                let vmcb = &mut cx.m.vmcb[vcpu];
                vmcb.event_inj = Some(EventInj { vector: v });
                vmcb.clear_interrupt_window();
            }
        }
        Some(_) => cx.m.vmcb[vcpu].request_interrupt_window(),
        None => cx.m.vmcb[vcpu].clear_interrupt_window(),
    }
}

/// KVM's SVM exit handlers (`svm_exit_handlers[]`) for the codes the model
/// produces; what the x86 core shares with VT-x goes to `kvm::exit`.
pub fn exit<S: Scheme + ?Sized>(
    scheme: &mut S,
    cx: &mut HvCx,
    vcpu: usize,
    exit: SvmExit,
) -> ExitOutcome {
    let common = |scheme: &mut S, cx: &mut HvCx, info| kvm::exit(scheme, cx, vcpu, info);
    match exit {
        // intr_interception: nothing; the host takes the interrupt once
        // it enables interrupts (between exit-handling steps).
        SvmExit::Intr => ExitOutcome::default(),
        SvmExit::Nmi => common(scheme, cx, ExitInfo::Nmi),
        // interrupt_window_interception: the window is open; the entry
        // path injects.
        SvmExit::Vintr => {
            cx.m.vmcb[vcpu].clear_interrupt_window();
            cx.charge(cx.costs.svm.vintr);
            ExitOutcome::default()
        }
        SvmExit::Hlt => common(scheme, cx, ExitInfo::Hlt),
        SvmExit::Ioio { port } => common(scheme, cx, ExitInfo::IoInstruction { port }),
        SvmExit::MsrWrite { msr, value } => common(scheme, cx, ExitInfo::MsrWrite { msr, value }),
        SvmExit::Vmmcall { nr, arg } => common(scheme, cx, ExitInfo::Vmcall { nr, arg }),
        // npf_interception: an xAPIC guest's store to its APIC page
        // without AVIC is MMIO KVM emulates (kvm_mmu_page_fault, then the
        // instruction emulator); other faults cost only.
        SvmExit::Npf {
            apic: Some((offset, value)),
        } => {
            cx.charge(cx.costs.apic_access_decode);
            let reg = msr::X2APIC_FIRST + u32::from(offset >> 4);
            // x2APIC SELF IPI faults (APM table 15-22): KVM emulates it on
            // its LAPIC, whose IRR with AVIC on is the backing page's
            // (kvm_apic_send_ipi -> svm_deliver_interrupt), so the vector
            // goes where the AVIC delivers from.
            if reg == msr::SELF_IPI {
                if let Some(ipi) = vlapic::emulate_icr(cx, vcpu, reg, u64::from(value)) {
                    scheme.virtual_interrupt(cx, vcpu, ipi.vector);
                }
                return ExitOutcome::default();
            }
            ExitOutcome {
                eoi_cleared: vlapic::emulate_write(cx, vcpu, reg, u64::from(value)),
            }
        }
        SvmExit::Npf { apic: None } => ExitOutcome::default(),
        // avic_incomplete_ipi_interception.
        SvmExit::AvicIncompleteIpi { icr, cause, .. } => {
            cx.charge(cx.costs.svm.avic_incomplete_ipi);
            match cause {
                // The AVIC set the IRR bits; wake the targets not running
                // (avic_kick_target_vcpus).
                IncompleteIpiCause::TargetNotRunning => kick_targets(cx, vcpu, icr),
                // Not an IPI the AVIC delivers: KVM's ICR emulation.
                IncompleteIpiCause::InvalidIntType => {
                    return common(
                        scheme,
                        cx,
                        ExitInfo::MsrWrite {
                            msr: msr::ICR,
                            value: icr,
                        },
                    );
                }
                // WARN_ONCE: the guest named a vCPU that does not exist.
                IncompleteIpiCause::InvalidTarget | IncompleteIpiCause::InvalidBackingPage => {}
            }
            ExitOutcome::default()
        }
        // avic_unaccelerated_access_interception: a trap re-runs the
        // register write on the emulated LAPIC (avic_unaccel_trap_write);
        // a fault emulates the instruction, to the same write.
        SvmExit::AvicUnacceleratedAccess {
            offset,
            write,
            value,
            trap,
        } => {
            cx.charge(if trap {
                cx.costs.svm.avic_trap
            } else {
                cx.costs.apic_access_decode
            });
            if !write {
                return ExitOutcome::default();
            }
            let reg = msr::X2APIC_FIRST + u32::from(offset >> 4);
            // x2APIC SELF IPI faults (APM table 15-22): KVM emulates it on
            // its LAPIC, whose IRR with AVIC on is the backing page's
            // (kvm_apic_send_ipi -> svm_deliver_interrupt), so the vector
            // goes where the AVIC delivers from.
            if reg == msr::SELF_IPI {
                if let Some(ipi) = vlapic::emulate_icr(cx, vcpu, reg, u64::from(value)) {
                    scheme.virtual_interrupt(cx, vcpu, ipi.vector);
                }
                return ExitOutcome::default();
            }
            ExitOutcome {
                eoi_cleared: vlapic::emulate_write(cx, vcpu, reg, u64::from(value)),
            }
        }
    }
}

/// `avic_kick_target_vcpus`: every vCPU of the sender's VM the ICR names
/// that is not running is woken (`kvm_vcpu_wake_up`).
fn kick_targets(cx: &mut HvCx, sender: usize, icr: u64) {
    let ipi = IcrWrite::decode(icr, true);
    let vm = cx.hv.vcpus[sender].vm;
    for i in 0..cx.hv.vms[vm].vcpus.len() {
        let t = cx.hv.vms[vm].vcpus[i];
        let hit = match ipi.shorthand {
            1 => t == sender,
            2 => true,
            3 => t != sender,
            _ => ipi.dest as usize == i,
        };
        if hit {
            cx.kick(t);
        }
    }
}

impl Scheme for KvmSvm {
    fn name(&self) -> &'static str {
        if self.avic.is_some() {
            "kvm-avic"
        } else {
            "kvm-svm"
        }
    }

    fn svm(&self) -> bool {
        true
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        // The VF's MSI-X as a host IRQ (stock KVM's IRTE), unless the
        // IOMMU posts it (below).
        kvm::setup(cx, vm);
        if self.inhibited.len() <= vm {
            self.inhibited.resize(vm + 1, None);
        }
        if cx.m.avic_tables.len() <= vm {
            cx.m.avic_tables
                .resize_with(vm + 1, || AvicTables::new(AvicMode::X2Avic));
        }
        if let Some(o) = self.avic {
            self.inhibited[vm] = Self::inhibit_of(cx, vm, o);
        }
        let xapic = cx.hv.vms[vm].xapic;
        let avic = self.active(vm);
        let vcpus = cx.hv.vms[vm].vcpus.clone();
        let mut tables = AvicTables::new(avic.map_or(AvicMode::X2Avic, |o| o.mode));
        for &vcpu in &vcpus {
            let mut vmcb = Vmcb::kvm_default();
            if let Some(o) = avic {
                // avic_init_vmcb and avic_init_backing_page.
                vmcb.avic_enable = true;
                vmcb.x2avic_enable = o.mode == AvicMode::X2Avic && !xapic;
                if vmcb.x2avic_enable {
                    // svm_set_x2apic_msr_interception(false): the
                    // AVIC takes every x2APIC register write.
                    for m in msr::X2APIC_FIRST..=msr::X2APIC_LAST {
                        vmcb.msrpm.set_write_intercept(m, false);
                    }
                }
                let index = cx.hv.vcpus[vcpu].index;
                tables.physical[index] = PhysicalIdEntry {
                    valid: true,
                    backing_page: Some(vcpu),
                    ..Default::default()
                };
                cx.m.avic_pages[vcpu] = BackingPage::default();
            }
            cx.m.vmcb[vcpu] = vmcb;
        }
        cx.m.avic_tables[vm] = tables;
        if let (Some(o), Some(a)) = (avic, cx.hv.vms[vm].vf) {
            // avic_pi_update_irte: a GuestMode IRTE for a single-vCPU
            // destination; KVM leaves a multi-vCPU lowest-priority MSI in
            // remapped mode (kvm_intr_is_single_vcpu fails).
            let v = &cx.hv.vms[vm];
            let single = !(v.msi_lowest_priority && v.irq_affinity.len() > 1);
            if o.iommu && single {
                let vcpu = cx.hv.device_home(vm);
                let index = cx.hv.vcpus[vcpu].index as u32;
                let core = cx.hv.vcpus[vcpu].core;
                let ga = GaIrte {
                    // AVIC_GATAG(vm_id, vcpu_id).
                    ga_tag: ((vm as u32 + 1) << 8) | index,
                    vector: a.guest_vector,
                    destination: cx.m.cores[core].apic_id,
                    is_run: false,
                    ga_log_intr: true,
                    backing_page: vcpu,
                };
                let irte = a.irte(0, a.guest_vector, DeliveryMode::Fixed);
                if cx.m.irt.write_guest_mode(a.irte, irte, ga).is_ok() {
                    cx.m.irt.invalidate(a.irte);
                }
                cx.charge(cx.costs.irt_update);
            }
        }
    }

    fn vcpu_load(&mut self, cx: &mut HvCx, vcpu: usize) {
        if let Some(o) = self.vcpu_avic(cx, vcpu) {
            self.set_running(cx, vcpu, true, o);
        }
        cx.hv.vcpus[vcpu].loaded = true;
    }

    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        // avic_vcpu_put (also avic_vcpu_blocking's, which comes first for
        // a halting vCPU: IsRunning is clear before it sleeps).
        if let Some(o) = self.vcpu_avic(cx, vcpu) {
            self.set_running(cx, vcpu, false, o);
        }
        cx.hv.vcpus[vcpu].loaded = false;
    }

    fn vcpu_blocking(&mut self, cx: &mut HvCx, vcpu: usize) {
        // avic_vcpu_blocking: IsRunning cleared before
        // kvm_vcpu_check_block's last look, so an IPI sent from here on
        // exits as not running and wakes it.
        if let Some(o) = self.vcpu_avic(cx, vcpu) {
            if cx.hv.vcpus[vcpu].loaded {
                self.set_running(cx, vcpu, false, o);
            }
        }
    }

    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        let core = cx.hv.vcpus[vcpu].core;
        let page = self
            .vcpu_avic(cx, vcpu)
            .is_some_and(|_| cx.m.avic_pages[vcpu].deliverable().is_some());
        page || cx.hv.vcpus[vcpu].vlapic.deliverable().is_some()
            || !cx.m.lapics[core].irr.is_empty()
    }

    fn handle_svm_exit(&mut self, cx: &mut HvCx, vcpu: usize, e: SvmExit) -> ExitOutcome {
        if matches!(e, SvmExit::AvicIncompleteIpi { .. }) {
            self.incomplete_ipis += 1;
        }
        exit(self, cx, vcpu, e)
    }

    /// `svm_deliver_interrupt`: with AVIC, the vector goes into the
    /// backing page's IRR (`kvm_lapic_set_irr`), then a doorbell if the
    /// vCPU is in guest mode (`avic_ring_doorbell`), else a wake-up;
    /// without it, KVM's emulated LAPIC and a kick.
    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        if self.vcpu_avic(cx, vcpu).is_none() {
            return kvm::raise(cx, vcpu, vector);
        }
        // The emulated timer latched it in the emulated IRR: the backing
        // page is the guest's IRR with AVIC.
        cx.hv.vcpus[vcpu].vlapic.irr.clear(vector);
        cx.m.avic_pages[vcpu].irr.set(vector);
        if cx.in_guest_mode(vcpu) {
            let core = cx.hv.vcpus[vcpu].core;
            self.doorbells += 1;
            cx.q.schedule_in_async(
                cx.costs.svm.doorbell_latency,
                crate::world::event::Ev::Doorbell { core: core as u16 },
            );
        }
        cx.kick(vcpu);
    }

    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        // With AVIC the processor evaluates the backing page at VMRUN.
        if self.vcpu_avic(cx, vcpu).is_none() {
            inject_pending(cx, vcpu);
        }
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        match self.vcpu_avic(cx, vcpu) {
            Some(_) => cx.m.avic_pages[vcpu].isr,
            None => cx.hv.vcpus[vcpu].vlapic.isr,
        }
    }

    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        if vector != AMD_IOMMU_VECTOR {
            return self.host_idt(cx, core, vector);
        }
        // amd_iommu_int_thread -> iommu_poll_ga_log -> avic_ga_log_notifier:
        // each entry's GATag names a vCPU to wake (the IOMMU already set
        // its backing page's IRR).
        cx.charge(cx.costs.svm.ga_log);
        while let Some(tag) = cx.m.ga_log.pop() {
            let vm = ((tag >> 8) as usize).wrapping_sub(1);
            let index = (tag & 0xFF) as usize;
            if let Some(&t) = cx.hv.vms.get(vm).and_then(|v| v.vcpus.get(index)) {
                self.ga_log_wakeups += 1;
                cx.kick(t);
            }
        }
    }

    fn reset_metrics(&mut self) {
        self.incomplete_ipis = 0;
        self.ga_log_wakeups = 0;
        self.doorbells = 0;
    }

    fn metrics(&self, out: &mut crate::guest::app::Metrics) {
        if self.avic.is_none() {
            return;
        }
        let n = self.name();
        out.insert(format!("{n}.incomplete_ipis"), self.incomplete_ipis as f64);
        out.insert(format!("{n}.ga_log_wakeups"), self.ga_log_wakeups as f64);
        out.insert(format!("{n}.kvm_doorbells"), self.doorbells as f64);
        let inhibited = self.inhibited.iter().filter(|i| i.is_some()).count();
        out.insert(format!("{n}.inhibited_vms"), inhibited as f64);
        for i in [Inhibit::X2apic, Inhibit::PhysicalIdTooBig] {
            let c = self.inhibited.iter().filter(|&&x| x == Some(i)).count();
            if c > 0 {
                out.insert(format!("{n}.inhibit.{}", i.key()), c as f64);
            }
        }
    }
}
