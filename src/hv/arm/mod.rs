//! Schemes that drive the ARM hardware (`hw::arm`): KVM/ARM with a
//! software vgic (`kvm-arm`, VHE or split), the same with GICv4 direct
//! vLPIs (`kvm-arm-v4`), and DID ported to ARM (`did-arm`). The sibling of
//! `hv::x86`: an ARM scheme implements [`ArmScheme`] and acts only through
//! [`ArmCx`] (HCR_EL2, ICH_HCR_EL2 and the list registers, the ITS tables
//! and commands, GICR residency, the generic timer's registers).
//! Specification: did-arm.md and kvm-arm-and-peers.md §2.

pub mod bare_metal;
pub mod did_arm;
pub mod kvm_arm;
pub mod kvm_arm_v4;

use crate::engine::{EventQueue, Time};
use crate::hv::HvState;
use crate::hw::arm::cpu_interface::IccReg;
use crate::hw::arm::el2::{El2Controls, HypMode};
use crate::hw::arm::machine::ArmMachine;
use crate::hw::arm::params::GicParams;
use crate::world::event::Ev;

pub use crate::hv::exits::EventClass;

/// The ARM schemes, by name.
pub const ARM_SCHEMES: [&str; 3] = ["kvm-arm", "kvm-arm-v4", "did-arm"];

/// One line each, in [`ARM_SCHEMES`] order.
pub const ARM_SCHEME_SUMMARIES: [&str; 3] = [
    "KVM/ARM (Linux 5.x, GICv3): vgic software injection through list registers, virtual timer with the HW bit, trapped SGIs, WFI trap with halt polling ([arm] hyp_mode = vhe | split)",
    "kvm-arm plus GICv4: the VF's MSIs are vLPIs (ITS VMAPTI), vPE residency follows vcpu load/put, a doorbell wakes a vCPU blocked in WFI; on a GICv4.1 ([arm] gic = \"v4.1\") SGIs are direct vSGIs (GITS_SGIR; the sender still traps)",
    "DID on ARM: dedicated cores whose guest owns the physical CPU interface (HCR_EL2.IMO = 0, FMO = 1, TWI = 0); timer, SGIs and the VF's LPIs reach the guest without exits; host traffic as Group-0 FIQs",
];

/// `bare-metal` runs on ARM too (`arch = "arm64"`): the same guest kernel
/// on the board with no hypervisor ([`bare_metal::BareMetalArm`]). The
/// name is the x86 scheme's, so it is not in [`ARM_SCHEMES`] (which lists
/// the schemes that exist only on ARM).
pub const ARM_BARE_METAL: &str = "bare-metal";

/// Whether `arch = "arm64"` runs scheme `name`.
pub fn runs_on_arm(name: &str) -> bool {
    name == ARM_BARE_METAL || ARM_SCHEMES.contains(&name)
}

/// The ARM scheme `name` for a host in `hyp` mode.
pub fn by_name(name: &str, hyp: HypMode) -> Option<Box<dyn ArmScheme>> {
    Some(match name {
        ARM_BARE_METAL => Box::new(bare_metal::BareMetalArm),
        "kvm-arm" => Box::new(kvm_arm::KvmArm::new(hyp)),
        "kvm-arm-v4" => Box::new(kvm_arm_v4::kvm_arm_v4(hyp)),
        "did-arm" => Box::new(did_arm::DidArm::new(hyp)),
        _ => return None,
    })
}

/// The INTIDs the host and the guests use (Linux's numbering).
pub mod intids {
    /// The guest's IPI_RESCHEDULE (arch/arm64/kernel/smp.c numbers its IPIs
    /// from SGI 0).
    pub const GUEST_RESCHEDULE_SGI: u32 = 0;
    /// The guest's IPI_CALL_FUNC.
    pub const GUEST_CALL_FUNC_SGI: u32 = 1;
    /// The host's kick (kvm_vcpu_kick → smp_send_reschedule: its
    /// IPI_RESCHEDULE).
    pub const KICK_SGI: u32 = 0;
    /// A host IPI to a core whose guest owns the CPU interface (did-arm):
    /// an SGI the host configured Group 0, so it arrives as an FIQ.
    pub const HOST_FIQ_SGI: u32 = 8;
    /// The vINTID of the guest's VF MSI (its first LPI).
    pub const VF_VLPI: u32 = 8192;
    /// The host's LPI for VM `vm`'s VF MSI (kvm-arm): this plus `vm`.
    pub const HOST_VF_LPI_BASE: u32 = 8192 + 1024;
    /// vCPU `v`'s GICv4.0 doorbell: this plus `v`.
    pub const DOORBELL_LPI_BASE: u32 = 8192 + 2048;
    /// Linux's default GIC priority (GICD_INT_DEF_PRI).
    pub const PRIORITY: u8 = 0xA0;
    /// The VF's ITS DeviceID for VM `vm`: `vm` (one VF per VM, EventID 0).
    pub const fn vf_device(vm: usize) -> u32 {
        vm as u32
    }
    /// The SPI of VM `vm`'s virtio-net interrupt: QEMU `virt`'s GICv2m
    /// frame starts at SPI 48 (INTID 80, `VIRT_GIC_V2M` irq base in
    /// hw/arm/virt.c); virtio-pci's MSI-X vector lands on it.
    pub const VIRTIO_SPI_BASE: u32 = 80;
    /// VM `vm`'s virtio-net SPI for queue vector `q` (0: RX, 1: TX):
    /// consecutive SPIs, as the GICv2m frame hands them out.
    pub const fn virtio_spi(vm: usize, q: usize) -> u32 {
        VIRTIO_SPI_BASE + 2 * vm as u32 + q as u32
    }
    /// The SPI of VM `vm`'s NIC on a wired line (`net.device =
    /// "spi-nic"`): this plus `vm`. The guest's device tree names the
    /// same INTID (KVM forwards virtual SPI n to physical SPI n).
    pub const NIC_SPI_BASE: u32 = 64;
    /// VM `vm`'s NIC SPI.
    pub const fn nic_spi(vm: usize) -> u32 {
        NIC_SPI_BASE + vm as u32
    }
}

/// The exception class of an exit (ESR_EL2.EC), named as `perf kvm stat`
/// on arm64 names them (kvm_arm_exception_class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmExit {
    /// A physical IRQ with HCR_EL2.IMO set.
    Irq,
    /// A physical FIQ with HCR_EL2.FMO set.
    Fiq,
    /// A trapped WFI (HCR_EL2.TWI).
    Wfx,
    /// A trapped system-register access (EC 0x18).
    Sys64 {
        /// The register.
        reg: IccReg,
        /// The value written.
        value: u64,
    },
    /// A stage-2 data abort from the guest (EC 0x24, DABT_LOW): a store
    /// to MMIO the VM's stage 2 does not map (a virtio-pci notify
    /// register). `port` names the queue notify the store stands for (the
    /// key the device's ioeventfd is registered under).
    DataAbort {
        /// The notify address's key.
        port: u16,
    },
}

/// [`ArmExit`] without its data: the per-reason accounting key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmExitReason {
    /// IRQ.
    Irq,
    /// FIQ.
    Fiq,
    /// WFx.
    Wfx,
    /// SYS64.
    Sys64,
    /// DABT_LOW.
    DataAbort,
}

impl ArmExitReason {
    /// Every reason, in report order.
    pub const ALL: [ArmExitReason; 5] = [
        ArmExitReason::Irq,
        ArmExitReason::Fiq,
        ArmExitReason::Wfx,
        ArmExitReason::Sys64,
        ArmExitReason::DataAbort,
    ];

    /// perf kvm stat's name.
    pub fn name(self) -> &'static str {
        match self {
            ArmExitReason::Irq => "IRQ",
            ArmExitReason::Fiq => "FIQ",
            ArmExitReason::Wfx => "WFx",
            ArmExitReason::Sys64 => "SYS64",
            ArmExitReason::DataAbort => "DABT_LOW",
        }
    }
}

impl ArmExit {
    /// Its reason.
    pub fn reason(self) -> ArmExitReason {
        match self {
            ArmExit::Irq => ArmExitReason::Irq,
            ArmExit::Fiq => ArmExitReason::Fiq,
            ArmExit::Wfx => ArmExitReason::Wfx,
            ArmExit::Sys64 { .. } => ArmExitReason::Sys64,
            ArmExit::DataAbort { .. } => ArmExitReason::DataAbort,
        }
    }
}

/// The primitive costs of the ARM host (calibration/arm-kvm-host.toml).
#[derive(Clone, Copy, Debug, Default)]
pub struct ArmCosts {
    /// One world switch.
    pub world_switch: Time,
    /// Decoding a trapped system-register access.
    pub sysreg_decode: Time,
    /// In-kernel vgic emulation of one access.
    pub vgic_emulate: Time,
    /// The host's IRQ entry and handler.
    pub host_irq: Time,
    /// vgic flush + sync around an entry with work in the ap_list.
    pub vgic_flush_sync: Time,
    /// WFI trap emulation up to kvm_vcpu_halt.
    pub wfi_emulate: Time,
    /// kvm_timer_vcpu_load / put.
    pub timer_load_put: Time,
    /// vgic_v3_load / vgic_v3_put (ICH_VMCR_EL2 and the APRs).
    pub vgic_load_put: Time,
    /// A VMOVP (and its VSYNC) through the ITS command queue.
    pub its_vmovp: Time,
    /// Making a GICv4.1 vSGI pending from KVM (vgic_v3_queue_sgi's `hw`
    /// branch: irq_set_irqchip_state and the GITS_SGIR store).
    pub vsgi_send: Time,
    /// A vPE residency change.
    pub vpe_residency: Time,
    /// The doorbell's handler.
    pub doorbell_handler: Time,
    /// Waking a blocked vCPU thread.
    pub vcpu_wakeup: Time,
    /// kvm_vcpu_halt's polling window.
    pub halt_poll: Time,
    /// ITS translation latency.
    pub its_translate: Time,
    /// Physical SGI latency.
    pub sgi_latency: Time,
    /// A wired device line to its SPI signalled at the CPU interface.
    pub spi_line: Time,
    /// KVM's halt polling grows and shrinks a per-vCPU window (Linux
    /// 4.9's kvm_vcpu_block, a board preset) instead of polling
    /// `halt_poll` at every WFI.
    pub halt_poll_dynamic: bool,
    /// The dynamic window's cap (`halt_poll_ns`).
    pub halt_poll_max: Time,
    /// The dynamic window's first value after a short halt.
    pub halt_poll_grow_start: Time,
    /// Decoding a stage-2 data abort and finding its ioeventfd
    /// (io_mem_abort -> kvm_io_bus_write).
    pub mmio_decode: Time,
}

/// A virtual interrupt KVM holds for a vCPU that is not in a list
/// register yet (an entry of `vgic_cpu.ap_list_head`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ApIrq {
    /// vINTID.
    pub vintid: u32,
    /// pINTID if it is mapped to a physical interrupt (the LR's HW bit).
    pub hw: Option<u32>,
    /// Priority.
    pub priority: u8,
}

/// KVM/ARM's per-vCPU state.
#[derive(Clone, Debug)]
pub struct ArmVcpu {
    /// Pending virtual interrupts not yet in a list register. Bounded by
    /// the distinct vINTIDs a VM uses (injection merges duplicates).
    pub ap_list: Vec<ApIrq>,
    /// Its vPE (GICv4).
    pub vpeid: u16,
    /// The core whose affinity its VMPIDR_EL2 presents to the guest (the
    /// guest's SGI1R target lists name it).
    pub vmpidr_core: usize,
    /// The virtual timer's CNTV_CTL / CNTV_CVAL while it is not loaded on
    /// a core.
    pub saved_timer: (u64, u64),
    /// Generation of its background hrtimer (`bg_timer`).
    pub bg_gen: u64,
    /// In kvm_vcpu_wfi (KVM's IN_WFI flag).
    pub in_wfi: bool,
    /// The doorbell rang while it was blocked (`vpe.pending_last`).
    pub pending_last: bool,
    /// What the last kick asked of it (for exit attribution).
    pub kick_class: EventClass,
    /// Its dynamic halt-polling window (`vcpu->halt_poll_ns`).
    pub poll_window: Time,
}

/// `kvm_vcpu_block`'s window update after a halt of `block` (Linux 4.9,
/// virt/kvm/kvm_main.c): a halt that ended within the window keeps it; a
/// longer one than the cap resets it to 0 (`halt_poll_ns_shrink` = 0); a
/// shorter one grows it (from `grow_start`, then x2, up to the cap).
pub fn halt_poll_update(window: Time, block: Time, max: Time, grow_start: Time) -> Time {
    if block <= window {
        window
    } else if window > 0 && block > max {
        0
    } else if window < max && block < max {
        if window == 0 {
            grow_start.min(max)
        } else {
            (window * 2).min(max)
        }
    } else {
        window
    }
}

/// ARM per-exit result of a scheme's handler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitAction {
    /// Enter the guest again.
    Resume,
    /// The vCPU halts (WFI): poll, then block until an interrupt for it.
    Halt,
}

/// The state a scheme drives, with the time and a work meter.
pub struct ArmCx<'a> {
    /// Now.
    pub now: Time,
    /// The ARM interrupt hardware.
    pub m: &'a mut ArmMachine,
    /// VMs and vCPUs (cores, halted, loaded).
    pub hv: &'a mut HvState,
    /// KVM/ARM's per-vCPU state.
    pub vcpus: &'a mut [ArmVcpu],
    /// The event queue (host hrtimers).
    pub q: &'a mut EventQueue<Ev>,
    /// Costs.
    pub costs: &'a ArmCosts,
    /// vCPUs to kick (bit v), with why.
    pub kicks: &'a mut u64,
    /// Work charged so far by this call.
    pub charged: Time,
}

impl ArmCx<'_> {
    /// Charges `t` of host work.
    pub fn charge(&mut self, t: Time) {
        self.charged += t;
    }

    /// kvm_vcpu_kick: the platform makes `vcpu` look at its interrupts
    /// (an SGI if it runs in guest mode elsewhere, a wake-up if it sleeps).
    pub fn kick(&mut self, vcpu: usize, why: EventClass) {
        *self.kicks |= 1 << vcpu;
        self.vcpus[vcpu].kick_class = why;
    }
}

/// The hooks of an ARM interrupt-delivery scheme.
pub trait ArmScheme {
    /// Its name.
    fn name(&self) -> &'static str;
    /// The GIC it needs for `cores` cores and `vcpus` vCPUs.
    fn gic(&self, cores: usize, vcpus: usize) -> GicParams;
    /// The EL2 controls a core boots with (before any vCPU is loaded).
    fn el2(&self) -> El2Controls;
    /// Creates VM `vm`: its interrupts' configuration, ITS mappings.
    fn setup_vm(&mut self, cx: &mut ArmCx, vm: usize);
    /// kvm_arch_vcpu_load on `cx.hv.vcpus[vcpu].core`.
    fn vcpu_load(&mut self, cx: &mut ArmCx, vcpu: usize);
    /// kvm_arch_vcpu_put: `vcpu` leaves its core, because it blocks in
    /// WFI (`blocking`) or because the host scheduler preempts it.
    fn vcpu_put(&mut self, cx: &mut ArmCx, vcpu: usize, blocking: bool);
    /// handle_exit.
    fn handle_exit(&mut self, cx: &mut ArmCx, vcpu: usize, exit: ArmExit) -> ExitAction;
    /// The host took physical `intid` on `core` (acknowledged; the
    /// platform writes EOIR after). Returns whether the interrupt is
    /// forwarded to a vCPU (Linux's `irqd_is_forwarded_to_vcpu`): the host
    /// then only drops its priority (EOImode 1, `gic_eoimode1_eoi_irq`)
    /// and the guest's EOI through a HW = 1 list register deactivates it;
    /// any other the platform deactivates at once (ICC_DIR_EL1).
    fn host_irq(&mut self, cx: &mut ArmCx, core: usize, intid: u32) -> bool;
    /// kvm_vgic_flush_hwstate (and the timer's) before entering `vcpu`.
    fn flush(&mut self, cx: &mut ArmCx, vcpu: usize);
    /// kvm_arch_vcpu_runnable: something is pending for a halted `vcpu`.
    fn has_pending(&self, cx: &ArmCx, vcpu: usize) -> bool;
    /// The halt-polling window of `vcpu`'s WFI.
    fn halt_poll(&self, cx: &ArmCx, vcpu: usize) -> Time;
    /// `vcpu`'s halt ended after `block` (from the WFI trap to the
    /// vCPU runnable again): KVM's halt-poll bookkeeping.
    fn halt_ended(&mut self, _cx: &mut ArmCx, _vcpu: usize, _block: Time) {}
    /// A back end's irqfd for VM `vm`'s paravirtual device fired (vhost's
    /// completion signal): virtual interrupt `intid` (an edge SPI, the
    /// device's MSI through QEMU virt's GICv2m frame) for `vcpu`.
    fn irqfd(&mut self, _cx: &mut ArmCx, _vcpu: usize, _intid: u32) {}
    /// The host, on another core, makes virtual SGI `vintid` pending for
    /// `vcpu` (did-arm.md §2.7 "pCPU0 → vCPU1").
    fn host_vipi(&mut self, cx: &mut ArmCx, vcpu: usize, vintid: u32);
    /// KVM's background timer for blocked `vcpu` fired.
    fn bg_timer(&mut self, cx: &mut ArmCx, vcpu: usize);
}

/// A guest or KVM write of the virtual timer register `reg` on `core`: the
/// timer updates, its next firing is scheduled (`Ev::VtimerFire`, stale
/// once the channel is written again) and its output drives PPI 27 on that
/// core's redistributor. Returns the output level.
pub fn vtimer_write(
    m: &mut ArmMachine,
    q: &mut EventQueue<Ev>,
    core: usize,
    reg: crate::hw::arm::timer::CntReg,
    value: u64,
    now: Time,
) -> bool {
    let Ok(u) = m.timers[core].write(reg, value, now) else {
        return false;
    };
    if let Some((at, gen)) = u.arm {
        q.schedule(
            at,
            Ev::VtimerFire {
                core: core as u16,
                gen,
            },
        );
    }
    let _ = m.redists[core].set_ppi_line(crate::hw::arm::intid::VTIMER_PPI, u.level);
    u.level
}
