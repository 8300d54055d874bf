//! DID — Direct Interrupt Delivery (Tu, Ferdman, Lee, Chiueh; VEE '15).
//!
//! A running VM takes its VF's interrupts, its virtual devices' interrupts
//! and its LAPIC timer in guest mode and acknowledges them by writing the
//! real EOI register. The mechanisms, each a section of the paper:
//!
//! * §4.1 VMCS: external-interrupt exiting off, NMI exiting on; the MSR
//!   bitmap passes the x2APIC EOI and TMICT writes through.
//! * §4.2 the IRT entries of the VM's VFs aim at its core (fixed mode) while
//!   it runs and are switched to NMI mode when it is descheduled.
//! * §4.3/§4.5 every virtual interrupt is a real IPI: a fixed IPI with the
//!   VM's vector when it runs, otherwise queued and sent as a self-IPI just
//!   before VM entry, so the physical LAPIC arbitrates priority and every
//!   direct EOI matches an in-service bit.
//! * §4.2/§4.4 a fixed interrupt that lands while the core is in host mode
//!   belongs to the VM on that core: it is taken by the host, EOI'd and
//!   re-injected by self-IPI at entry (the "self-IPI bitmap" of §5.4).
//! * §4.4 a core's LAPIC timer holds only its running VM's timer; host
//!   timers run on the designated core, and a descheduled VM's timer is
//!   parked there and becomes a virtual interrupt when it fires.
//! * §4.5 host traffic to VM cores travels as NMIs, which always exit.

use super::kvm;
use super::vlapic;
use crate::engine::Time;
use crate::hv::exits::ExitInfo;
use crate::hv::host::{HostTimer, InFlightIpis, NmiMailbox};
use crate::hv::scheme::{ExitOutcome, Scheme};
use crate::hv::HvCx;
use crate::hw::x86::iommu::Irte;
use crate::hw::x86::lapic::{msr, ApicBitmap, DeliveryMode};
use crate::hw::x86::vmcs::Vmcs;

/// The `did` scheme.
#[derive(Default)]
pub struct Did {
    /// Per vCPU: virtual interrupts waiting for the next entry (the
    /// self-IPI bitmap).
    pending: Vec<ApicBitmap>,
    /// Per VM: how many of its VF's interrupts arrived as NMIs and were
    /// already turned into virtual interrupts (§4.2: the hypervisor
    /// identifies the source of an NMI).
    vf_nmis_seen: Vec<u64>,

    /// Per core: host vectors sent to it as NMIs (§7.3's mailbox).
    mailbox: NmiMailbox,
    /// Guest writes DID does not pass through but cannot serve directly
    /// either (TSC-deadline mode, not covered by the paper; §7.7).
    pub uncovered_writes: u64,
    /// The fixed IPIs DID sent for running vCPUs' virtual interrupts
    /// (docs/papers.md DID open point 1: a vector in flight when its vCPU
    /// is switched out must not enter the next VM).
    in_flight: InFlightIpis,
}

impl Did {
    /// The VF's IRT entry aimed at `core`. Only the vCPU the guest's IRQ
    /// affinity names (the entry's one destination) moves it: `vcpu` None
    /// is the VM's setup.
    fn vf_irte(
        cx: &HvCx,
        vm: usize,
        vcpu: Option<usize>,
        core: usize,
        mode: DeliveryMode,
    ) -> Option<(u16, Irte)> {
        if vcpu.is_some_and(|v| v != cx.hv.device_home(vm)) {
            return None;
        }
        let a = cx.hv.vms[vm].vf?;
        Some((
            a.irte,
            a.irte(cx.m.cores[core].apic_id, a.guest_vector, mode),
        ))
    }
}

impl Scheme for Did {
    fn name(&self) -> &'static str {
        "did"
    }

    fn setup_vm(&mut self, cx: &mut HvCx, vm: usize) {
        self.vf_nmis_seen.resize(cx.hv.vms.len(), 0);
        self.pending
            .resize(cx.hv.vcpus.len(), ApicBitmap::default());
        self.mailbox.resize(cx.m.cores.len());
        self.in_flight.resize(cx.m.cores.len());
        let designated = cx.hv.designated_core;
        for &vcpu in &cx.hv.vms[vm].vcpus.clone() {
            // §4.1: EIE = 0, NMI exiting = 1, EOI and TMICT pass through.
            let mut vmcs = Vmcs::kvm_default();
            vmcs.pin.ext_int_exiting = false;
            vmcs.pin.nmi_exiting = true;
            let _ = vmcs.msr_bitmap.set_write_intercept(msr::EOI, false);
            let _ = vmcs.msr_bitmap.set_write_intercept(msr::TMICT, false);
            cx.m.vmcs[vcpu] = vmcs;
            // §4.4: the host's timers leave the VM's cores (every core its
            // vCPU may run on) for the designated core.
            let allowed = cx.hv.vcpus[vcpu].allowed;
            let ncores = cx.m.cores.len();
            for core in allowed.iter().take_while(|&c| c < ncores) {
                cx.hv.host.reassign(core, designated);
                cx.host_timer_reprogram(designated);
                cx.apic_write(core, msr::TMICT, 0);
                cx.host_timer_forget(core);
            }
        }
        // Until its first schedule-in, the VF's interrupts force exits.
        let core = cx.hv.vcpus[cx.hv.device_home(vm)].core;
        if let Some((i, e)) = Did::vf_irte(cx, vm, None, core, DeliveryMode::Nmi) {
            cx.irt_update(i, e);
        }
    }

    /// §4.2, §4.4, §4.5 schedule-in.
    fn vcpu_load(&mut self, cx: &mut HvCx, vcpu: usize) {
        let vm = cx.hv.vcpus[vcpu].vm;
        let core = cx.hv.vcpus[vcpu].core;
        // 0. From here the VF's vector can land on this core for this VM:
        // an IPI record of the previous vCPU past its bound must not claim
        // it (open point 1).
        self.in_flight
            .forget_consumed(core, cx.now, &cx.m.lapics[core].irr);
        // 1. Retarget the VF's IRT entries at this core, fixed mode.
        if let Some((i, e)) = Did::vf_irte(cx, vm, Some(vcpu), core, DeliveryMode::Fixed) {
            cx.irt_update(i, e);
        }
        // 2. Install the VM's timer on this core's LAPIC: its LVTT and
        // divider (kept by the trapped writes) and the remaining count of a
        // timer parked on the designated core.
        let now = cx.now;
        let vl = &cx.hv.vcpus[vcpu].vlapic;
        let lvtt = vl.read_msr(msr::LVT_TIMER, now).unwrap_or(1 << 16);
        let tdcr = vl.read_msr(msr::TDCR, now).unwrap_or(0);
        let vector = vl.timer_vector();
        cx.apic_write(core, msr::LVT_TIMER, lvtt);
        cx.apic_write(core, msr::TDCR, tdcr);
        let parked = cx
            .hv
            .host
            .find(|t| matches!(t, HostTimer::ParkedTimer { vcpu: v, .. } if *v == vcpu));
        if let Some(deadline) = parked {
            cx.host_timer_cancel(
                vcpu,
                |t| matches!(t, HostTimer::ParkedTimer { vcpu: v, .. } if *v == vcpu),
            );
            if deadline <= now {
                self.pending[vcpu].set(vector);
            } else {
                let period =
                    cx.m.lapics[core].clocks().bus_period_ps * cx.m.lapics[core].timer_divide();
                let count = (deadline - now).div_ceil(period.max(1)).max(1);
                cx.apic_write(core, msr::TMICT, count);
            }
        }
        cx.hv.vcpus[vcpu].loaded = true;
        // 3. Pending virtual interrupts are self-IPI'd in prepare_entry.
    }

    /// The guest EOIs the physical LAPIC, whose ISR software can neither
    /// save nor restore: a VM is scheduled out only with nothing in
    /// service there (docs/papers.md DID open point 4; the paper is silent).
    fn preemptible(&self, cx: &HvCx, vcpu: usize) -> bool {
        let core = cx.hv.vcpus[vcpu].core;
        cx.m.lapics[core].isr.is_empty()
    }

    /// §4.2, §4.4 schedule-out.
    fn vcpu_put(&mut self, cx: &mut HvCx, vcpu: usize) {
        let vm = cx.hv.vcpus[vcpu].vm;
        let core = cx.hv.vcpus[vcpu].core;
        // 1. NMI mode: later MSIs force an exit wherever they land. One
        // already in flight is remapped when it arrives, so it too comes as
        // an NMI and host_nmi finds it by the entry's NMI count.
        if let Some((i, e)) = Did::vf_irte(cx, vm, Some(vcpu), core, DeliveryMode::Nmi) {
            cx.irt_update(i, e);
        }
        // 2. Park the VM's timer on the designated core.
        let vector = cx.m.lapics[core].timer_vector();
        if let Some(deadline) = cx.m.lapics[core].timer_deadline() {
            cx.apic_write(core, msr::TMICT, 0);
            let designated = cx.hv.designated_core;
            cx.host_timer_start(
                designated,
                deadline,
                HostTimer::ParkedTimer { vcpu, vector },
            );
        }
        // 3. Vectors already latched for the VM become virtual interrupts
        // (§7.4 default); on a VM core every fixed vector is the VM's (§7.2).
        let irr = std::mem::take(&mut cx.m.lapics[core].irr);
        self.pending[vcpu].union_with(&irr);
        // The IPIs sent for it that have landed were delivered or just
        // collected; those still in flight land in host mode (no other VM
        // enters before they do: entry_quiesce) and are its.
        let now = cx.now;
        self.in_flight.forget_landed(core, vcpu, now);
        cx.hv.vcpus[vcpu].loaded = false;
    }

    fn handle_exit(&mut self, cx: &mut HvCx, vcpu: usize, info: ExitInfo) -> ExitOutcome {
        let ExitInfo::MsrWrite { msr: reg, value } = info else {
            // NMI, external-interrupt and the rest as KVM, through DID's
            // host_nmi / host_interrupt.
            return kvm::exit(self, cx, vcpu, info);
        };
        // Trapped APIC writes (LVT, TDCR, ICR, ...) are kept in the shadow
        // register file and, for the timer registers, mirrored onto the real
        // LAPIC the guest owns while it runs.
        if reg == msr::TSC_DEADLINE {
            self.uncovered_writes += 1;
        }
        if matches!(reg, msr::ICR | msr::SELF_IPI) {
            // did.md open point 9: guest IPIs trap; each target gets the
            // vector as a virtual interrupt (§4.3: a fixed IPI to its core
            // if it runs, else queued for its schedule-in). A self-IPI is
            // the case "the source shares M's core": the sender is in host
            // mode for this exit, so the vector waits in the self-IPI
            // bitmap and is self-IPI'd at entry. The x2APIC SELF IPI
            // register is the same fixed IPI to self (SDM 10.12.11) and
            // must take the same path: the shadow register file alone
            // latches nothing on the LAPIC the guest owns.
            return kvm::exit(self, cx, vcpu, info);
        }
        let out = vlapic::emulate_write(cx, vcpu, reg, value);
        if matches!(reg, msr::LVT_TIMER | msr::TDCR) && cx.hv.vcpus[vcpu].loaded {
            let core = cx.hv.vcpus[vcpu].core;
            cx.apic_write(core, reg, value);
        }
        ExitOutcome { eoi_cleared: out }
    }

    /// §4.2/§4.4: a fixed interrupt taken in host mode on a VM's core is the
    /// VM's: queue it for re-injection (the generic path EOIs it).
    /// A fixed IPI sent while the VM ran can reach its core after the
    /// schedule-out (vcpu_put collected IRR, not messages in flight): it is
    /// the VM's too (§7.2 default: every fixed vector on a VM core is the
    /// VM's).
    fn host_interrupt(&mut self, cx: &mut HvCx, core: usize, vector: u8) {
        // An IPI DID sent for a vCPU's virtual interrupt is that vCPU's,
        // whoever holds the core now.
        if let Some(vcpu) = self.in_flight.landed_for(core, vector, cx.now) {
            self.pending[vcpu].set(vector);
            cx.kick(vcpu);
            return;
        }
        match cx.hv.vcpu_owning(core) {
            Some(vcpu) if core != cx.hv.designated_core => {
                self.pending[vcpu].set(vector);
                cx.kick(vcpu);
            }
            _ => self.host_idt(cx, core, vector),
        }
    }

    /// §4.5: host IPIs to a VM's core travel as NMIs (a fixed IPI would
    /// enter the guest through its IDT); the vector goes in the target
    /// core's mailbox first. Also while the VM is descheduled: it may be
    /// back in guest mode when the IPI lands, and a fixed vector reaching
    /// a VM core is taken as the VM's (§7.2).
    fn send_host_ipi(&mut self, cx: &mut HvCx, from: usize, to: usize, vector: u8) {
        let as_nmi = cx.hv.vcpu_owning(to).is_some() && to != cx.hv.designated_core;
        self.mailbox.send(cx, from, to, vector, as_nmi);
    }

    /// §4.5: an NMI on a core: run the host handlers of the vectors in its
    /// mailbox, then find which VMs' VFs sent NMIs (their IRT entries'
    /// NMI counts moved) and raise their vectors. NMIs coalesce in one
    /// latch, so one NMI may stand for several sources; and the VM may be
    /// running again by the time its NMI is handled (schedule-in rewrote
    /// the entry to fixed mode after the NMI was sent), so loaded VMs are
    /// not skipped.
    fn host_nmi(&mut self, cx: &mut HvCx, core: usize) {
        cx.charge(cx.costs.irq_handler);
        let mb = self.mailbox.take(core);
        for &v in &mb {
            self.host_idt(cx, core, v);
        }
        self.mailbox.give_back(core, mb);
        for vm in 0..cx.hv.vms.len() {
            let Some(a) = cx.hv.vms[vm].vf else { continue };
            let nmis = cx.m.irt.nmi_deliveries(a.irte);
            if nmis != self.vf_nmis_seen[vm] {
                self.vf_nmis_seen[vm] = nmis;
                let vcpu = cx.hv.device_home(vm);
                self.virtual_interrupt(cx, vcpu, a.guest_vector);
            }
        }
    }

    /// §4.3: a running VM gets a real fixed IPI with its vector; otherwise
    /// the vector waits for the next entry.
    fn virtual_interrupt(&mut self, cx: &mut HvCx, vcpu: usize, vector: u8) {
        if cx.hv.vcpus[vcpu].loaded && cx.in_guest_mode(vcpu) {
            let core = cx.hv.vcpus[vcpu].core;
            let from = cx.hv.designated_core;
            cx.send_ipi(from, core, vector, DeliveryMode::Fixed);
            let (now, timing) = (cx.now, cx.costs.ipi_timing());
            self.in_flight.sent(core, now, timing, vector, vcpu);
        } else {
            self.pending[vcpu].set(vector);
            cx.kick(vcpu);
        }
    }

    /// did.md open point 1: another VM enters this core only once every
    /// IPI DID sent here for another vCPU has landed (in host mode, where
    /// `host_interrupt` gives it to its vCPU).
    fn entry_quiesce(&self, cx: &HvCx, vcpu: usize) -> Time {
        let core = cx.hv.vcpus[vcpu].core;
        self.in_flight.quiesce(core, vcpu, cx.now)
    }

    /// Pending virtual interrupts wait in the self-IPI bitmap; the core's
    /// IRR holds what arrived for the VM while it ran.
    fn vcpu_has_interrupt(&self, cx: &HvCx, vcpu: usize) -> bool {
        let core = cx.hv.vcpus[vcpu].core;
        !self.pending[vcpu].is_empty() || !cx.m.lapics[core].irr.is_empty()
    }

    /// §4.2 step 3: one self-IPI per pending virtual interrupt. Host
    /// interrupts are off, so they wait in IRR and are delivered through the
    /// guest IDT after entry: no interrupt-window exit is needed.
    fn prepare_entry(&mut self, cx: &mut HvCx, vcpu: usize) {
        let core = cx.hv.vcpus[vcpu].core;
        self.in_flight
            .forget_consumed(core, cx.now, &cx.m.lapics[core].irr);
        let pending = std::mem::take(&mut self.pending[vcpu]);
        for v in pending.iter() {
            cx.apic_write(core, msr::SELF_IPI, v as u64);
            cx.charge(cx.costs.self_ipi);
        }
    }

    fn guest_isr(&self, cx: &HvCx, vcpu: usize) -> ApicBitmap {
        cx.m.lapics[cx.hv.vcpus[vcpu].core].isr
    }

    fn host_timer(&mut self, cx: &mut HvCx, t: HostTimer) {
        match t {
            HostTimer::ParkedTimer { vcpu, vector } => self.virtual_interrupt(cx, vcpu, vector),
            HostTimer::Tick { core } => {
                cx.charge(cx.costs.tick_handler);
                let next = cx.now + cx.hv.host.tick_period;
                cx.hv.host.add(core, next, HostTimer::Tick { core });
            }
            HostTimer::GuestTimer { vcpu, gen } => {
                if let Some(v) = vlapic::timer_fired(cx, vcpu, gen) {
                    self.virtual_interrupt(cx, vcpu, v);
                }
            }
        }
    }
}
